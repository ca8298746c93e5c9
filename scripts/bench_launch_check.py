"""What the check of each TRT-LLM decode launch costs, as a ratio to the launch made directly: the
vLLM plugin's seam (``checked_launch``) around FlashInfer's XQA entry point, with vLLM 0.34's
keyword arguments, against the same entry point called as vLLM calls it.

    python scripts/bench_launch_check.py                  # CPU rows; GPU rows where they can run
    python scripts/bench_launch_check.py --device cpu --rounds 3

The launches: 32/8 heads of 128 on 16-token pages, a 4,096-token page table, batch 64 with one
token a request and with 1 + 2 speculative tokens. On the CPU the entry point does nothing, which
leaves the check's own cost; on a GPU (with FlashInfer) it is FlashInfer's
``xqa_batch_decode_with_kv_cache`` on the GPU's SMs, each timed call a launch and its kernel (the
stream synchronized after it), so the ratio is what the check adds to a decode launch. Each round
times ``--calls`` calls directly and through the seam in turn, the pair's order swapped every time
(ABBA), and takes the median over pairs; the table gives the medians over rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import Any

from _args import count, refuse, run_main

HEADS, KV_HEADS, HEAD_DIM, PAGE, TABLE_TOKENS, BATCH = 32, 8, 128, 16, 4096, 64


def launch_arguments(q_len: int, device: str) -> dict[str, Any]:
    """vLLM 0.34's keyword arguments to ``flashinfer_xqa_batch_decode_with_kv_cache``."""
    import torch

    pages = BATCH * TABLE_TOKENS // PAGE
    gen = torch.Generator(device=device).manual_seed(q_len)
    shape = (pages, PAGE, KV_HEADS, HEAD_DIM)
    k, v = (torch.randn(shape, device=device, generator=gen).to(torch.bfloat16) for _ in "kv")
    table = torch.randperm(pages, device=device, generator=gen).to(torch.int32)
    words = -(-q_len // 32) * 2
    return {
        "query": torch.randn(BATCH * q_len, HEADS, HEAD_DIM, device=device).to(torch.bfloat16),
        "kv_cache": (k, v),
        "block_tables": table.view(BATCH, TABLE_TOKENS // PAGE),
        "seq_lens": torch.full((BATCH,), TABLE_TOKENS, dtype=torch.int32, device=device),
        "max_seq_len": TABLE_TOKENS,
        "bmm1_scale": HEAD_DIM**-0.5,
        "bmm2_scale": 1.0,
        "window_left": -1,
        "sinks": None,
        "kv_layout": "NHD",
        "q_len_per_req": q_len,
        "mask": (
            torch.full((BATCH, q_len, words), -1, dtype=torch.int16, device=device)
            .view(torch.uint16) if q_len > 1 else None
        ),
        "q_cu_seq_lens": None,
    }  # fmt: skip


def paired(
    direct: Callable[[], None], checked: Callable[[], None], calls: int
) -> tuple[float, float]:
    """Microseconds a call, each way: the median over ABBA pairs of ``calls`` calls each."""
    times: dict[str, list[float]] = {"direct": [], "checked": []}
    order = [("direct", direct), ("checked", checked)]
    for pair in range(8):
        for name, call in order if pair % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            for _ in range(calls):
                call()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times["direct"]), statistics.median(times["checked"])


def rows(device: str, calls: int, rounds: int) -> list[tuple[str, float, float]]:
    import torch

    from mstar_resources.attn.trtllm_workspace import TrtllmLaunchCheck, xqa_workspace_bytes
    from mstar_resources.attn.workspace import Workspace
    from mstar_resources.integrations.vllm import checked_launch

    if device == "cuda":
        from flashinfer.decode import xqa_batch_decode_with_kv_cache as kernel

        sms = torch.cuda.get_device_properties(0).multi_processor_count

        def sync() -> None:
            torch.cuda.synchronize()
    else:
        sms = 132

        def sync() -> None:
            return None

        def kernel(**kwargs: Any) -> None:
            return None

    found = []
    for q_len in (1, 3):
        nbytes = xqa_workspace_bytes(batch=BATCH, num_qo_heads=HEADS, num_kv_heads=KV_HEADS,
                                     head_dim=HEAD_DIM, max_seq_len=TABLE_TOKENS, sm_count=sms,
                                     q_len_per_req=q_len)  # fmt: skip
        held = Workspace(torch.zeros(nbytes, dtype=torch.uint8, device=device), "attn.trtllm",
                         floor="resources.attn.trtllm.declared_mb")  # fmt: skip
        state: Any = types.SimpleNamespace(trtllm_check=TrtllmLaunchCheck(held, sms))
        seam = checked_launch("xqa")(state, kernel, None)
        kwargs = {**launch_arguments(q_len, device), "workspace_buffer": held.tensor}

        def direct(kwargs: dict[str, Any] = kwargs) -> None:
            kernel(**kwargs)
            sync()

        def checked(kwargs: dict[str, Any] = kwargs, seam: Any = seam) -> None:
            seam(**kwargs)
            sync()

        direct()  # the kernel built and the launch's need computed, once
        checked()
        pairs = [paired(direct, checked, calls) for _ in range(rounds)]
        found.append((
            f"{device}: batch {BATCH} x {q_len} token{'s' if q_len > 1 else ''}",
            statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs),
        ))  # fmt: skip
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), help="one device's rows alone")
    parser.add_argument("--rounds", type=count(1000), default=5, help="rounds (default 5)")
    parser.add_argument("--calls", type=count(1_000_000), default=200,
                        help="calls timed together, each way, in a pair (default 200)")  # fmt: skip
    args = parser.parse_args()
    gpu = importlib.util.find_spec("flashinfer") is not None
    if gpu:
        import torch

        gpu = torch.cuda.is_available()
    if args.device == "cuda" and not gpu:
        refuse(parser, "--device", "cuda", "it needs a CUDA GPU and FlashInfer, and finds none")
    devices = [args.device] if args.device else ["cpu", *(["cuda"] if gpu else [])]
    if not gpu and args.device is None:
        print("bench_launch_check.py: no CUDA GPU with FlashInfer here: CPU rows only",
              file=sys.stderr)  # fmt: skip
    table = [row for device in devices for row in rows(device, args.calls, args.rounds)]
    print(f"{'launch':<28} {'direct us':>10} {'checked us':>11} {'added us':>9} {'ratio':>6}")
    for case, direct, checked in table:
        print(f"{case:<28} {direct:>10.2f} {checked:>11.2f} {checked - direct:>9.2f} "
              f"{checked / direct:>6.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_main(main)
