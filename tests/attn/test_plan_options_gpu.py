"""The plan options engines use grow a workspace from a small floor and then run exactly as on a
large buffer: tensor-core decode (eager and under a CUDA graph), several query tokens a request,
a fixed KV split, no KV split, and paged prefill planned for a CUDA graph.

Heads as test_wrapper_kinds_gpu.py's (bf16, 32 query and 8 KV heads, head dim 128, page 16):
tensor-core decode and paged prefill share FlashInfer's prefill module, one kernel build. Runs on
FlashInfer 0.6.6 and newer; the option that needs 0.7.2 skips on older versions, saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from mstar_resources import Workspace
from mstar_resources.calibration.versions import (
    MULTI_TOKEN_DECODE_SINCE,
    installed_flashinfer,
    release,
)
from mstar_resources.units import MIB

pytestmark = pytest.mark.gpu

QO_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16
SMALL_FLOOR = 64 << 10
DTYPES = {"q_data_type": DTYPE, "kv_data_type": DTYPE}


def _randn(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(DTYPE)


def _indptr(batch: int, step: int) -> torch.Tensor:
    return torch.arange(batch + 1, dtype=torch.int32, device="cuda") * step


def _paged(batch: int, kv_len: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    pages = -(-kv_len // PAGE)
    last = torch.full((batch,), kv_len - (pages - 1) * PAGE, dtype=torch.int32, device="cuda")
    indices = torch.arange(batch * pages, dtype=torch.int32, device="cuda")
    cache = _randn(batch * pages, 2, PAGE, KV_HEADS, HEAD_DIM, seed=kv_len)
    return (_indptr(batch, pages), indices, last), cache


@dataclass
class Case:
    build: Callable[[torch.Tensor], Any]
    plan_args: tuple
    plan_kwargs: dict
    run: Callable[[Any], Any]
    grows: bool
    """Whether the plan splits KV, and so must grow a 64 KiB workspace."""


def decode(batch: int, kv_len: int, *, graph: bool = False, q_len: int = 1, **split: Any) -> Case:
    import flashinfer

    paged, cache = _paged(batch, kv_len)
    q = _randn(batch * q_len, QO_HEADS, HEAD_DIM, seed=q_len)
    graph_buffers: dict[str, Any] = {}
    if graph:
        graph_buffers = {
            "use_cuda_graph": True,
            "paged_kv_indptr_buffer": paged[0],
            "paged_kv_indices_buffer": paged[1],
            "paged_kv_last_page_len_buffer": paged[2],
        }
    kwargs = {**DTYPES, **split, **({"q_len_per_req": q_len} if q_len > 1 else {})}
    return Case(
        lambda buf: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            buf, "NHD", use_tensor_cores=True, backend="auto", **graph_buffers
        ),
        (*paged, QO_HEADS, KV_HEADS, HEAD_DIM, PAGE),
        kwargs,
        lambda wrapper: wrapper.run(q, cache),
        grows=not split.get("disable_split_kv", False),
    )


def prefill(batch: int, q_len: int, kv_len: int, *, graph: bool = False, **split: Any) -> Case:
    import flashinfer

    paged, cache = _paged(batch, kv_len)
    qo = _indptr(batch, q_len)
    q = _randn(batch * q_len, QO_HEADS, HEAD_DIM, seed=q_len)
    graph_buffers: dict[str, Any] = {}
    if graph:
        graph_buffers = {
            "use_cuda_graph": True,
            "qo_indptr_buf": qo,
            "paged_kv_indptr_buf": paged[0],
            "paged_kv_indices_buf": paged[1],
            "paged_kv_last_page_len_buf": paged[2],
        }
    return Case(
        lambda buf: flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            buf, "NHD", backend="fa2", **graph_buffers
        ),
        (qo, *paged, QO_HEADS, KV_HEADS, HEAD_DIM, PAGE),
        {"causal": True, **DTYPES, **split},
        lambda wrapper: wrapper.run(q, cache),
        grows=not split.get("disable_split_kv", False),
    )


def _needs_multi_token_decode() -> None:
    version = installed_flashinfer() or "none"
    if release(version) < MULTI_TOKEN_DECODE_SINCE:
        pytest.skip(f"q_len_per_req in plan() needs FlashInfer 0.7.2 or newer; this is {version}")


CASES: dict[str, Callable[[], Case]] = {
    "tensor-core-decode": lambda: decode(4, 65_536),
    "tensor-core-decode-graph": lambda: decode(16, 4096, graph=True),  # within the grid: splits
    "tensor-core-decode-q3": lambda: decode(4, 65_536, q_len=3),
    "tensor-core-decode-fixed-split": lambda: decode(8, 16_384, fixed_split_size=64),
    "tensor-core-decode-graph-no-split": lambda: decode(
        8, 16_384, graph=True, fixed_split_size=2048, disable_split_kv=True
    ),
    "prefill-fixed-split": lambda: prefill(2, 32, 65_536, fixed_split_size=256),
    "prefill-no-split": lambda: prefill(1, 32, 65_536, disable_split_kv=True),
    "prefill-graph": lambda: prefill(4, 16, 8192, graph=True),
}


def _outputs(result: Any) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, tuple | list) else (result,)


@pytest.mark.parametrize("name", list(CASES))
def test_a_plan_option_grown_from_a_small_floor_runs_as_on_a_large_buffer(name):
    if name.endswith("-q3"):
        _needs_multi_token_decode()
    case = CASES[name]()
    workspace = Workspace(torch.zeros(SMALL_FLOOR, dtype=torch.uint8, device="cuda"), name)
    wrapper = case.build(workspace.tensor)

    workspace.plan(wrapper.plan, *case.plan_args, **case.plan_kwargs)
    grown = workspace.tensor.numel()
    reference = case.build(torch.zeros(512 * MIB, dtype=torch.uint8, device="cuda"))
    reference.plan(*case.plan_args, **case.plan_kwargs)
    outputs, expected = _outputs(case.run(wrapper)), _outputs(case.run(reference))
    torch.cuda.synchronize()

    stats = workspace.stats()
    print(f"{name} (FlashInfer {installed_flashinfer()}): {SMALL_FLOOR:,} -> {grown:,} bytes, "
          f"{stats.times_grown} growths")  # fmt: skip
    assert all(torch.equal(o, e) for o, e in zip(outputs, expected, strict=True))
    assert (stats.times_grown > 0) == case.grows
