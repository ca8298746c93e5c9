"""Every wrapper kind and plan option an engine uses grows its workspace from a small floor and then
runs exactly as on a large buffer: paged and ragged prefill (fa2, fa3; a fixed KV split, no KV
split, planned for a CUDA graph), tensor-core decode (eager and under a CUDA graph, several query
tokens a request, a fixed KV split, no KV split), MLA (fa2, fa3, auto) and POD.

The dense kinds use bf16, 32 query and 8 KV heads, head dim 128, page 16 (tensor-core decode and
paged prefill share FlashInfer's prefill module, one kernel build); MLA uses DeepSeek-V3's rank of
TP8 (16 heads, compressed KV 512, rotary 64, page 64). Runs on FlashInfer 0.6.6 and newer; the
option that needs 0.7.2 skips on older versions, saying so. Each case prints what its workspace
did, for the record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from mstar_resources import Workspace
from mstar_resources.calibration.profile import (
    MULTI_TOKEN_DECODE_SINCE,
    installed_flashinfer,
    release,
)
from mstar_resources.units import MIB

from ..calibration.bounds import mla_bytes

pytestmark = pytest.mark.gpu

QO_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
MLA_HEADS, CKV, KPE, MLA_PAGE = 16, 512, 64, 64
DTYPE = torch.bfloat16
DTYPES = {"q_data_type": DTYPE, "kv_data_type": DTYPE}
SMALL_FLOOR = 64 << 10


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
    """One wrapper kind and its options: how to build it on a buffer, its plan's arguments, its
    run, and whether its plan must grow a 64 KiB workspace (None: it may or may not)."""

    build: Callable[[torch.Tensor], Any]
    plan_args: tuple
    plan_kwargs: dict
    run: Callable[[Any], Any]
    grows: bool | None


def paged_prefill(
    batch: int, q_len: int, kv_len: int, *, backend: str = "fa2", graph: bool = False, **split: Any
) -> Case:
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
    # fa3 prefill may plan without the float workspace: it then need not grow.
    grows = None if backend == "fa3" else not split.get("disable_split_kv", False)
    return Case(
        lambda buf: flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            buf, "NHD", backend=backend, **graph_buffers
        ),
        (qo, *paged, QO_HEADS, KV_HEADS, HEAD_DIM, PAGE),
        {"causal": True, **DTYPES, **split},
        lambda wrapper: wrapper.run(q, cache),
        grows,
    )


def ragged_prefill(backend: str) -> Case:
    import flashinfer

    # A new chunk attending to a long prefix held in ragged form, as a prefix-caching engine does.
    batch, q_len, kv_len = 1, 32, 65_536
    q = _randn(batch * q_len, QO_HEADS, HEAD_DIM, seed=2)
    k = _randn(batch * kv_len, KV_HEADS, HEAD_DIM, seed=3)
    v = _randn(batch * kv_len, KV_HEADS, HEAD_DIM, seed=4)
    return Case(
        lambda buf: flashinfer.BatchPrefillWithRaggedKVCacheWrapper(buf, "NHD", backend=backend),
        (_indptr(batch, q_len), _indptr(batch, kv_len), QO_HEADS, KV_HEADS, HEAD_DIM),
        {"causal": True, **DTYPES},
        lambda wrapper: wrapper.run(q, k, v),
        None if backend == "fa3" else True,
    )


def decode(batch: int, kv_len: int, *, graph: bool = False, q_len: int = 1, **split: Any) -> Case:
    """Tensor-core decode, as vLLM plans it."""
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
        not split.get("disable_split_kv", False),
    )


def mla(backend: str, q_len: int) -> Case:
    """MLA always needs its grid's partials: it must grow."""
    from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata

    batch, kv_len = (32, 4096) if q_len == 1 else (2, 8192)
    pages = -(-kv_len // MLA_PAGE)
    tokens = batch * q_len
    metadata = MLAPlanMetadata.csr(
        _indptr(batch, q_len),
        _indptr(batch, pages),
        torch.arange(batch * pages, dtype=torch.int32, device="cuda"),
        torch.full((batch,), kv_len, dtype=torch.int32, device="cuda"),
    )
    query = (_randn(tokens, MLA_HEADS, CKV, seed=5), _randn(tokens, MLA_HEADS, KPE, seed=6))
    cache = (
        _randn(batch * pages, MLA_PAGE, CKV, seed=7),
        _randn(batch * pages, MLA_PAGE, KPE, seed=8),
    )
    kwargs = {
        "metadata": metadata,
        "num_heads": MLA_HEADS,
        "head_dim_ckv": CKV,
        "head_dim_kpe": KPE,
        "page_size": MLA_PAGE,
        "causal": q_len > 1,
        "sm_scale": (128 + KPE) ** -0.5,  # DeepSeek-V3's query-key head dimension, 192
        "query_layout": "split",
        "kv_cache_layout": "split",
        **DTYPES,
    }
    return Case(
        lambda buf: BatchMLAPagedAttentionWrapper(buf, backend=backend),
        (),
        kwargs,
        lambda wrapper: wrapper.run(query=query, kv_cache=cache),
        True,
    )


def pod() -> Case:
    """POD plans its decode with fa2 on this workspace: it must grow."""
    import flashinfer

    # One prompt (its own kernel half, on FlashInfer's private scratch) beside a decode batch
    # over long contexts (planned on this workspace).
    batch, kv_len, prompt = 4, 65_536, 512
    paged, cache = _paged(batch, kv_len)
    q_d = _randn(batch, QO_HEADS, HEAD_DIM, seed=9)
    q_p = _randn(prompt, QO_HEADS, HEAD_DIM, seed=10)
    k_p = _randn(prompt, KV_HEADS, HEAD_DIM, seed=11)
    v_p = _randn(prompt, KV_HEADS, HEAD_DIM, seed=12)
    return Case(
        lambda buf: flashinfer.PODWithPagedKVCacheWrapper(buf, "NHD"),
        (*paged, QO_HEADS, KV_HEADS, HEAD_DIM, PAGE),
        DTYPES,
        lambda wrapper: wrapper.run(q_p, k_p, v_p, q_d, cache, causal_p=True),
        True,
    )


CASES: dict[str, Callable[[], Case]] = {
    # A chunked-prefill tail: a few query rows over a long context split KV across the grid.
    "paged-fa2": lambda: paged_prefill(1, 32, 65_536),
    "paged-fa3": lambda: paged_prefill(1, 32, 65_536, backend="fa3"),
    "paged-fixed-split": lambda: paged_prefill(2, 32, 65_536, fixed_split_size=256),
    "paged-no-split": lambda: paged_prefill(1, 32, 65_536, disable_split_kv=True),
    "paged-graph": lambda: paged_prefill(4, 16, 8192, graph=True),
    "ragged-fa2": lambda: ragged_prefill("fa2"),
    "ragged-fa3": lambda: ragged_prefill("fa3"),
    "tensor-core-decode": lambda: decode(4, 65_536),
    "tensor-core-decode-graph": lambda: decode(16, 4096, graph=True),  # within the grid: splits
    "tensor-core-decode-q3": lambda: decode(4, 65_536, q_len=3),
    "tensor-core-decode-fixed-split": lambda: decode(8, 16_384, fixed_split_size=64),
    "tensor-core-decode-graph-no-split": lambda: decode(
        8, 16_384, graph=True, fixed_split_size=2048, disable_split_kv=True
    ),
    "mla-decode-fa2": lambda: mla("fa2", 1),
    "mla-decode-fa3": lambda: mla("fa3", 1),
    "mla-decode-auto": lambda: mla("auto", 1),
    "mla-prefill-fa2": lambda: mla("fa2", 64),
    "mla-prefill-fa3": lambda: mla("fa3", 64),
    "pod": pod,
}


def _outputs(result: Any) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, tuple | list) else (result,)


@pytest.mark.parametrize("name", list(CASES))
def test_a_plan_grown_from_a_small_floor_runs_as_on_a_large_buffer(name):
    if name.endswith("-q3"):
        version = installed_flashinfer() or "none"
        if release(version) < release(MULTI_TOKEN_DECODE_SINCE):
            pytest.skip(
                f"q_len_per_req in plan() needs FlashInfer 0.7.2 or newer; this is {version}"
            )
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
    if case.grows is not None:
        assert (stats.times_grown > 0) == case.grows
    if name.startswith("mla"):
        # One growth, to what bounds.py says every MLA plan on this GPU needs.
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert (stats.times_grown, grown) == (1, mla_bytes(CKV, sms))
    if name.startswith("paged-fa"):
        # The wrapper recorded 64 KiB when it was built; it now knows the grown size.
        assert wrapper._workspace_size == grown
