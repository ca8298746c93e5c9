"""Every wrapper kind an engine plans grows its workspace from a small floor and then runs exactly
as on a large buffer: paged and ragged prefill (fa2, fa3), MLA (fa2, fa3, auto) and POD.

The dense kinds use test_workspace_gpu.py's heads (bf16, 32 query and 8 KV heads, head dim 128,
page 16); MLA uses DeepSeek-V3's rank of TP8 (16 heads, compressed KV 512, rotary 64, page 64).
Each case prints what its workspace did, for the record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from mstar_resources import Workspace
from mstar_resources.calibration.bounds import mla_bytes
from mstar_resources.units import MIB

pytestmark = pytest.mark.gpu

KIB = 1 << 10
QO_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
MLA_HEADS, CKV, KPE, MLA_PAGE = 16, 512, 64, 64
DTYPE = torch.bfloat16
SMALL_FLOOR = 64 * KIB


def _randn(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(DTYPE)


def _indptr(batch: int, step: int) -> torch.Tensor:
    return torch.arange(batch + 1, dtype=torch.int32, device="cuda") * step


@dataclass
class Case:
    """One wrapper kind: how to build it on a buffer, its plan's arguments, and its run."""

    build: Callable[[torch.Tensor], Any]
    plan_args: tuple
    plan_kwargs: dict
    run: Callable[[Any], Any]


def _paged(batch: int, q_len: int, kv_len: int) -> tuple[tuple, torch.Tensor]:
    pages = -(-kv_len // PAGE)
    last = torch.full((batch,), kv_len - (pages - 1) * PAGE, dtype=torch.int32, device="cuda")
    indices = torch.arange(batch * pages, dtype=torch.int32, device="cuda")
    cache = _randn(batch * pages, 2, PAGE, KV_HEADS, HEAD_DIM, seed=kv_len)
    return (_indptr(batch, pages), indices, last, QO_HEADS, KV_HEADS, HEAD_DIM, PAGE), cache


def paged_prefill(backend: str) -> Case:
    import flashinfer

    # A chunked-prefill tail: a few query rows over a long context split KV across the grid.
    batch, q_len, kv_len = 1, 32, 65_536
    paged, cache = _paged(batch, q_len, kv_len)
    q = _randn(batch * q_len, QO_HEADS, HEAD_DIM, seed=1)
    return Case(
        lambda buf: flashinfer.BatchPrefillWithPagedKVCacheWrapper(buf, "NHD", backend=backend),
        (_indptr(batch, q_len), *paged),
        {"causal": True, "q_data_type": DTYPE, "kv_data_type": DTYPE},
        lambda wrapper: wrapper.run(q, cache),
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
        {"causal": True, "q_data_type": DTYPE, "kv_data_type": DTYPE},
        lambda wrapper: wrapper.run(q, k, v),
    )


def mla(backend: str, q_len: int) -> Case:
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
        "q_data_type": DTYPE,
        "kv_data_type": DTYPE,
        "query_layout": "split",
        "kv_cache_layout": "split",
    }
    return Case(
        lambda buf: BatchMLAPagedAttentionWrapper(buf, backend=backend),
        (),
        kwargs,
        lambda wrapper: wrapper.run(query=query, kv_cache=cache),
    )


def pod() -> Case:
    import flashinfer

    # One prompt (its own kernel half, on FlashInfer's private scratch) beside a decode batch
    # over long contexts (planned on this workspace).
    batch, kv_len, prompt = 4, 65_536, 512
    paged, cache = _paged(batch, 1, kv_len)
    q_d = _randn(batch, QO_HEADS, HEAD_DIM, seed=9)
    q_p = _randn(prompt, QO_HEADS, HEAD_DIM, seed=10)
    k_p = _randn(prompt, KV_HEADS, HEAD_DIM, seed=11)
    v_p = _randn(prompt, KV_HEADS, HEAD_DIM, seed=12)
    return Case(
        lambda buf: flashinfer.PODWithPagedKVCacheWrapper(buf, "NHD"),
        paged,
        {"q_data_type": DTYPE, "kv_data_type": DTYPE},
        lambda wrapper: wrapper.run(q_p, k_p, v_p, q_d, cache, causal_p=True),
    )


CASES = {
    "paged-fa2": lambda: paged_prefill("fa2"),
    "paged-fa3": lambda: paged_prefill("fa3"),
    "ragged-fa2": lambda: ragged_prefill("fa2"),
    "ragged-fa3": lambda: ragged_prefill("fa3"),
    "mla-decode-fa2": lambda: mla("fa2", 1),
    "mla-decode-fa3": lambda: mla("fa3", 1),
    "mla-decode-auto": lambda: mla("auto", 1),
    "mla-prefill-fa2": lambda: mla("fa2", 64),
    "mla-prefill-fa3": lambda: mla("fa3", 64),
    "pod": pod,
}
# fa2 splits these shapes' KV, MLA always needs its grid's partials, POD plans its decode with
# fa2: all must grow. fa3 prefill may plan without the float workspace; it must then not grow.
MUST_GROW = {name for name in CASES if "fa3" not in name or name.startswith("mla")}


def _outputs(result: Any) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, tuple | list) else (result,)


@pytest.mark.parametrize("name", list(CASES))
def test_a_plan_grown_from_a_small_floor_runs_as_on_a_large_buffer(name):
    case = CASES[name]()
    workspace = Workspace(torch.zeros(SMALL_FLOOR, dtype=torch.uint8, device="cuda"), name)
    wrapper = case.build(workspace.tensor)

    workspace.plan(wrapper.plan, *case.plan_args, **case.plan_kwargs)
    grown = workspace.tensor.numel()
    reference = case.build(torch.zeros(256 * MIB, dtype=torch.uint8, device="cuda"))
    reference.plan(*case.plan_args, **case.plan_kwargs)
    outputs, expected = _outputs(case.run(wrapper)), _outputs(case.run(reference))
    torch.cuda.synchronize()

    stats = workspace.stats()
    print(f"{name}: {SMALL_FLOOR:,} -> {grown:,} bytes, {stats.times_grown} growths")
    assert all(torch.equal(o, e) for o, e in zip(outputs, expected, strict=True))
    if name in MUST_GROW:
        assert stats.times_grown > 0
    if name.startswith("mla"):
        # One growth, to what bounds.py says every MLA plan on this GPU needs.
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert (stats.times_grown, grown) == (1, mla_bytes(CKV, sms))
    if name.startswith("paged"):
        # The wrapper recorded 64 KiB when it was built; it now knows the grown size.
        assert wrapper._workspace_size == grown
