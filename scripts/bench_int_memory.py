"""GPU and pinned host memory of the int workspaces of an engine's decode wrappers, one per
CUDA-graph batch size: FlashInfer's own (8 MiB and 8 MiB pinned each) against one shared int
workspace (its host mirror pageable).

    python scripts/bench_int_memory.py       # vLLM 0.33's 51 graph sizes at max_num_seqs 512
    python scripts/bench_int_memory.py --int-mb 1 --batch-sizes 1 2 4 8 16

On a CUDA GPU with FlashInfer. Each way builds the wrappers (the fa2 decode wrapper, under CUDA
graphs, bf16, head dim 128, 32 query and 8 KV heads, page 16) on one float workspace, plans each
once at its batch size, and reports what torch's allocators then hold more than before: the
device allocator's ``memory_allocated``, and the distinct pinned host buffers the wrappers plan
through (their bytes: each wrapper's own; none for the shared int workspace's pageable mirror).
Then both ways replay each graph size once more after a plan and compare the outputs bit for bit.
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Any

import torch

from mstar_resources import WorkspacePool
from mstar_resources.units import MIB

from _args import count, run_main

QO, KV, HEAD_DIM, PAGE, CONTEXT = 32, 8, 128, 16, 1024
VLLM_GRAPH_SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
"""vLLM 0.33's decode graph sizes at max_num_seqs 512 (``config/vllm.py``: captured up to
min(2 x max_num_seqs, 512) tokens, decode graphs up to max_num_seqs): 51 of them."""


def build(batch: int, float_buffer: torch.Tensor, pool: WorkspacePool | None) -> Any:
    import flashinfer

    pages = -(-CONTEXT // PAGE)
    graph = {
        "use_cuda_graph": True,
        "paged_kv_indptr_buffer": torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
        "paged_kv_indices_buffer": torch.zeros(batch * pages, dtype=torch.int32, device="cuda"),
        "paged_kv_last_page_len_buffer": torch.zeros(batch, dtype=torch.int32, device="cuda"),
        "backend": "fa2",
    }
    cls = flashinfer.BatchDecodeWithPagedKVCacheWrapper
    if pool is None:
        return cls(float_buffer, "NHD", **graph)
    return pool.build(cls, "NHD", label="decode", cg_slot=0, **graph)


def plan_args(batch: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    pages = -(-CONTEXT // PAGE)
    indptr = (torch.arange(batch + 1, dtype=torch.int32) * pages).pin_memory()
    indices = torch.arange(batch * pages, dtype=torch.int32).pin_memory()
    last = torch.full((batch,), PAGE, dtype=torch.int32).pin_memory()
    return (indptr, indices, last, QO, KV, HEAD_DIM, PAGE), {
        "q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16,
    }  # fmt: skip


def one_way(sizes: list[int], int_mb: int | None) -> tuple[int, int, list[torch.Tensor]]:
    """(device bytes, pinned host bytes, outputs) of the wrappers built one way: their own int
    workspaces (``int_mb`` None) or a pool's shared one (whose host mirror is pageable)."""
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    pool = None if int_mb is None else WorkspacePool("cuda", size_mb=64, int_size_mb=int_mb)
    float_buffer = (
        pool.get("decode", 0).tensor
        if pool
        else torch.zeros(64 * MIB, dtype=torch.uint8, device="cuda")
    )
    wrappers = [build(b, float_buffer, pool) for b in sizes]
    cache = torch.randn(
        max(sizes) * CONTEXT // PAGE,
        2,
        PAGE,
        KV,
        HEAD_DIM,
        device="cuda",
        generator=torch.Generator("cuda").manual_seed(0),
    ).to(torch.bfloat16)
    outputs = []
    for batch, wrapper in zip(sizes, wrappers, strict=True):
        args, kwargs = plan_args(batch)
        if pool is None:
            wrapper.plan(*args, **kwargs)
        else:
            pool.get("decode", 0).plan(wrapper.plan, *args, **kwargs)
        q = torch.randn(
            batch, QO, HEAD_DIM, device="cuda", generator=torch.Generator("cuda").manual_seed(batch)
        ).to(torch.bfloat16)
        outputs.append(wrapper.run(q, cache))
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before - cache.numel() * cache.element_size()
    held -= sum(o.numel() * o.element_size() for o in outputs)
    mirrors = {
        mirror.data_ptr(): mirror.numel()
        for mirror in (w._pin_memory_int_workspace_buffer for w in wrappers)
        if mirror.is_pinned()
    }
    return held, sum(mirrors.values()), outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--batch-sizes",
        type=count(1 << 16),
        nargs="+",
        default=VLLM_GRAPH_SIZES,
        help="the decode wrappers' CUDA-graph batch sizes (default: vLLM 0.33's 51)",
    )
    parser.add_argument("--int-mb", type=count(1 << 10), default=1, help="the shared int floor")
    options = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_int_memory: needs a CUDA GPU with FlashInfer", file=sys.stderr)
        return 2
    sizes = list(options.batch_sizes)
    own_gpu, own_pinned, own_out = one_way(sizes, None)
    shared_gpu, shared_pinned, shared_out = one_way(sizes, options.int_mb)
    identical = all(torch.equal(a, b) for a, b in zip(own_out, shared_out, strict=True))
    print(
        f"{len(sizes)} decode wrappers (graph batch sizes {sizes[0]}..{sizes[-1]}), "
        f"{torch.cuda.get_device_name()}:"
    )
    print(f"{'':<34} {'GPU bytes':>14} {'pinned bytes':>14}")
    print(f"{'each wrapper its own int workspace':<34} {own_gpu:>14,} {own_pinned:>14,}")
    print(
        f"{'one shared, int_declared_mb=' + str(options.int_mb):<34} {shared_gpu:>14,} "
        f"{shared_pinned:>14,}"
    )
    print(
        f"saved: {own_gpu - shared_gpu:+,} GPU bytes ({own_gpu / max(1, shared_gpu):.1f}x), "
        f"{own_pinned - shared_pinned:+,} pinned bytes"
    )
    print(f"outputs bit-identical: {'yes' if identical else 'NO'}")
    return 0 if identical else 1


if __name__ == "__main__":
    run_main(main)
