"""Int workspaces and their host mirror against real FlashInfer decode wrappers on a CUDA GPU:
growth on an int overflow, the sealed refusal, graph wrappers of several batch sizes sharing one
int workspace bit for bit, and the race a pinned mirror runs, which the pageable one does not.

One kernel configuration throughout, test_workspace_gpu's (bf16, head dim 128, 32 query and 8 KV
heads, page 16, fa2 CUDA-core decode), so FlashInfer builds it once per run.
"""

from __future__ import annotations

import time

import pytest
import torch

from mstar_resources import (
    IntWorkspace,
    Workspace,
    WorkspacePlanError,
    WorkspacePool,
    WorkspaceSealedError,
)
from mstar_resources.attn.workspace import install_int_workspace
from mstar_resources.units import MIB

from ..sealing import assert_sealed
from .test_workspace_gpu import DTYPE, HEAD_DIM, KV_HEADS, PAGE, QO_HEADS, capture

pytestmark = pytest.mark.gpu

MAX_PAGES = 64 * 4096 // PAGE


@pytest.fixture(scope="module")
def kv_cache() -> torch.Tensor:
    """One paged KV cache every batch below reads from (pages 0..MAX_PAGES-1)."""
    gen = torch.Generator(device="cuda").manual_seed(17)
    return torch.randn(MAX_PAGES, 2, PAGE, KV_HEADS, HEAD_DIM, device="cuda", generator=gen).to(
        DTYPE
    )


def pages_of(batch: int, kv_len: int, *, device: str = "cuda", offset: int = 0) -> tuple:
    """(indptr, page indices, last page lengths) of ``batch`` requests of ``kv_len`` tokens, on
    ``device`` (pinned where it is the host, as engines keep them)."""
    pages = -(-kv_len // PAGE)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    indices = (torch.arange(batch * pages, dtype=torch.int32) + offset) % MAX_PAGES
    last = torch.full((batch,), kv_len - (pages - 1) * PAGE, dtype=torch.int32)
    tensors = (indptr, indices, last)
    if device == "cpu":
        return tuple(t.pin_memory() for t in tensors)
    return tuple(t.to(device) for t in tensors)


def plan_args(batch: int, kv_len: int, **kwargs) -> tuple[tuple, dict]:
    return (*pages_of(batch, kv_len, **kwargs), QO_HEADS, KV_HEADS, HEAD_DIM), {
        "page_size": PAGE, "q_data_type": DTYPE, "kv_data_type": DTYPE,
    }  # fmt: skip


def decode_wrapper(buffer: torch.Tensor, graph_batch: int | None = None):
    import flashinfer

    if graph_batch is None:
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(buffer, "NHD", backend="fa2")
    indptr, _, last = pages_of(graph_batch, 4096)
    return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        buffer, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=torch.zeros(MAX_PAGES, dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buffer=last, backend="fa2",
    )  # fmt: skip


def query(batch: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(batch, QO_HEADS, HEAD_DIM, device="cuda", generator=gen).to(DTYPE)


def growing(int_bytes: int = 0) -> Workspace:
    """A float workspace of 64 MiB over an int workspace of ``int_bytes`` that plans grow."""
    empty = torch.zeros(int_bytes, dtype=torch.uint8, device="cuda")
    int_workspace = IntWorkspace(empty, "test:int", floor="test.int_declared_mb")
    float_buffer = torch.zeros(64 * MIB, dtype=torch.uint8, device="cuda")
    return Workspace(float_buffer, "test", int_workspace=int_workspace)


def test_an_int_workspace_grows_from_empty_and_the_output_is_bit_identical(kv_cache):
    workspace = growing()
    int_workspace = workspace.int_workspace
    wrapper = decode_wrapper(workspace.tensor)
    assert install_int_workspace(wrapper, workspace)
    args, kwargs = plan_args(64, 4096)

    workspace.plan(wrapper.plan, *args, **kwargs)

    grown = int_workspace.tensor.numel()
    mirror = int_workspace.mirror
    assert grown > 0 and mirror.numel() == grown and not mirror.is_pinned()
    assert wrapper._int_workspace_buffer is int_workspace.tensor
    if hasattr(wrapper, "workspace_size"):  # FlashInfer 0.7: its own figure, exactly
        assert grown == wrapper.workspace_size(*args, **kwargs)[1]
    reference = decode_wrapper(torch.zeros(64 * MIB, dtype=torch.uint8, device="cuda"))
    reference.plan(*args, **kwargs)
    q = query(64)
    assert torch.equal(wrapper.run(q, kv_cache), reference.run(q, kv_cache))
    assert grown < reference._int_workspace_buffer.numel()  # FlashInfer's own: 8 MiB
    print(f"\nint need of decode bs=64 kv=4096: {grown:,} bytes")


def test_a_sealed_int_workspace_refuses_naming_its_setting_and_never_moves():
    workspace = growing()
    wrapper = decode_wrapper(workspace.tensor)
    install_int_workspace(wrapper, workspace)
    workspace.plan(wrapper.plan, *plan_args(1, 128)[0], **plan_args(1, 128)[1])
    int_workspace = workspace.int_workspace
    held, address = int_workspace.tensor.numel(), int_workspace.tensor.data_ptr()
    workspace.seal()
    args, kwargs = plan_args(64, 4096)
    with pytest.raises(WorkspaceSealedError) as raised:
        workspace.plan(wrapper.plan, *args, **kwargs)
    error = raised.value
    assert (error.workspace, error.setting, error.held_bytes) == (
        "test:int", "test.int_declared_mb", held,
    )  # fmt: skip
    assert error.needed_bytes > held
    assert (int_workspace.tensor.numel(), int_workspace.tensor.data_ptr()) == (held, address)


def test_graph_wrappers_of_several_batch_sizes_share_one_int_workspace_bit_for_bit(kv_cache):
    """Each wrapper planned right before its graph replays, in an order that jumps between batch
    sizes and contexts: the shared int workspace gives what each wrapper's own gives."""
    batches = (1, 8, 32, 64)
    pool = WorkspacePool("cuda", size_mb=1, int_size_mb=1, owner="llama")
    workspace = pool.get("decode", 0)
    shared = {b: pool.build(decode_wrapper, b, label="decode", cg_slot=0) for b in batches}
    own_buffer = torch.zeros(64 * MIB, dtype=torch.uint8, device="cuda")
    own = {b: decode_wrapper(own_buffer, b) for b in batches}
    assert len({id(w._int_workspace_buffer) for w in shared.values()}) == 1
    assert len({id(w._int_workspace_buffer) for w in own.values()}) == len(batches)
    queries = {b: query(b, seed=b) for b in batches}
    for b in batches:  # warm-up: the largest context each graph holds
        args, kwargs = plan_args(b, 4096)
        workspace.plan(shared[b].plan, *args, **kwargs)
        own[b].plan(*args, **kwargs)
    # The int workspace holds the last plan (batch 64's): batch 1's wrapper may not run on it.
    with pytest.raises(WorkspacePlanError, match="must each be planned right before they run"):
        shared[1].run(queries[1], kv_cache)
    pool.seal()
    graphs = {}
    for b in batches:  # each planned right before its graph is captured
        args, kwargs = plan_args(b, 4096)
        workspace.plan(shared[b].plan, *args, **kwargs)
        graphs["shared", b] = capture(lambda w=shared[b], q=queries[b]: w.run(q, kv_cache))
        own[b].plan(*args, **kwargs)
        graphs["own", b] = capture(lambda w=own[b], q=queries[b]: w.run(q, kv_cache))
    steps = [(64, 4096), (1, 100), (32, 3000), (8, 17), (64, 900), (1, 4096), (32, 128)]
    for step, (b, kv_len) in enumerate(steps):
        args, kwargs = plan_args(b, kv_len, device="cpu", offset=step * 101)
        workspace.plan(shared[b].plan, *args, **kwargs)
        graph, shared_out = graphs["shared", b]
        graph.replay()
        own[b].plan(*args, **kwargs)
        graph, own_out = graphs["own", b]
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(shared_out, own_out), (b, kv_len)
    assert_sealed(workspace)
    # 4 wrappers' 8 MiB pairs against one pair of 1 MiB.
    print(f"\nint workspaces: shared {pool.int_held_bytes:,} bytes, own "
          f"{sum(w._int_workspace_buffer.numel() for w in own.values()):,} bytes")  # fmt: skip


def _sleep_gpu(ms: float) -> None:
    """Keep the current stream busy for about ``ms`` milliseconds (so the host runs ahead)."""
    rate = torch.cuda.get_device_properties(0).clock_rate  # kHz
    torch.cuda._sleep(int(ms * rate))


def test_a_pinned_mirror_races_and_the_int_workspaces_pageable_one_holds_without_a_wait():
    """Two wrappers on one int workspace, planned from pinned host indices while the GPU is busy:
    the first plans, the copy its run would read is queued, then the second plans and the first
    plans again (other indices), as a host a step ahead of its GPU does. On one pinned mirror the
    queued copy reads it when the stream reaches it, by then rewritten: the first run would read
    another plan's indices. Through Workspace.plan, on the int workspace's pageable mirror, it
    reads its own, and no plan waited for the GPU."""
    pool = WorkspacePool("cuda", size_mb=64, int_size_mb=1)
    workspace = pool.get("decode")
    first, second = (pool.build(decode_wrapper, label="decode") for _ in range(2))
    first_args, second_args = plan_args(64, 4096, device="cpu"), plan_args(8, 1000, device="cpu")
    again_args = plan_args(30, 2000, device="cpu", offset=5)
    int_buffer = workspace.int_workspace.tensor
    assert not workspace.int_workspace.mirror.is_pinned()

    expected = decode_wrapper(torch.zeros(64 * MIB, dtype=torch.uint8, device="cuda"))
    expected.plan(*first_args[0], **first_args[1])
    torch.cuda.synchronize()
    nbytes = 64 * 4  # the head of the int workspace: the first plan's 64+ request indices
    its_own = expected._int_workspace_buffer[:nbytes].clone()

    def what_the_first_run_reads(plan) -> tuple[torch.Tensor, float]:
        _sleep_gpu(200)
        begin = time.perf_counter()
        plan(first.plan, *first_args[0], **first_args[1])
        seen = int_buffer[:nbytes].clone()  # queued where the first wrapper's run would be
        plan(second.plan, *second_args[0], **second_args[1])
        plan(first.plan, *again_args[0], **again_args[1])
        planned_s = time.perf_counter() - begin
        torch.cuda.synchronize()
        return seen, planned_s

    pinned = torch.zeros(MIB, dtype=torch.uint8).pin_memory()
    for wrapper in (first, second):
        wrapper._pin_memory_int_workspace_buffer = pinned
    raced, _ = what_the_first_run_reads(lambda plan, *a, **k: plan(*a, **k))
    assert not torch.equal(raced, its_own), "the race was not reproduced"
    seen, planned_s = what_the_first_run_reads(workspace.plan)
    assert torch.equal(seen, its_own)
    assert first._pin_memory_int_workspace_buffer is workspace.int_workspace.mirror
    assert planned_s < 0.1  # the GPU is busy for 0.2 s: no plan waited for it


def test_calibration_measures_the_int_need_the_plans_take():
    """The int need calibration writes: FlashInfer's workspace_size() where it answers (0.7),
    growth from an empty int workspace where it does not (0.6), and the two agree."""
    from mstar_resources.calibration.measure import Planner, shapes_for
    from mstar_resources.calibration.profile import load_profile

    profile = load_profile({
        "model": {"num_qo_heads": QO_HEADS, "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                  "page_size": PAGE},
        "limits": {"max_num_seqs": 64, "max_num_batched_tokens": 512, "max_model_len": 8192},
        "cuda_graph_batch_sizes": [1, 8, 64],
        "plans": {"decode": {"kind": "decode"}, "prefill": {"kind": "paged_prefill"}},
    })  # fmt: skip
    planner = Planner(profile, torch.device("cuda"))
    for label, graph in (("decode", True), ("decode", False), ("prefill", False)):
        plan = profile.plans[label]
        shapes = shapes_for(plan, profile, graph)
        need = planner.need(plan, shapes)
        grown = planner.need_by_growth(plan, shapes, None)
        assert need.int_bytes == grown.int_bytes, (label, graph, need.method)
        assert 0 < grown.int_bytes < 8 * MIB
        print(f"\n{label} (graph {graph}): int need {grown.int_bytes:,} bytes by {need.method}")
