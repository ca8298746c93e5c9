"""Workspace against real FlashInfer decode wrappers on a CUDA GPU.

One kernel configuration throughout (bf16, head dim 128, 32 query and 8 KV heads, page 16, the
fa2 CUDA-core decode kernel), so FlashInfer's JIT builds it once per run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from mstar_resources import ResourceError, WorkspacePool, WorkspaceSealedError
from mstar_resources.units import MIB

pytestmark = pytest.mark.gpu

QO_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16


@dataclass
class Decode:
    """One decode batch: every request has ``kv_len`` tokens of KV cache."""

    batch: int
    kv_len: int
    qo_heads: int = QO_HEADS

    def __post_init__(self) -> None:
        pages = -(-self.kv_len // PAGE)
        gen = torch.Generator(device="cuda").manual_seed(self.batch * 7919 + self.kv_len)
        self.indptr = torch.arange(self.batch + 1, dtype=torch.int32, device="cuda") * pages
        self.indices = torch.arange(self.batch * pages, dtype=torch.int32, device="cuda")
        last = self.kv_len - (pages - 1) * PAGE
        self.last_page_len = torch.full((self.batch,), last, dtype=torch.int32, device="cuda")
        self.kv_cache = torch.randn(
            self.batch * pages, 2, PAGE, KV_HEADS, HEAD_DIM, device="cuda", generator=gen
        ).to(DTYPE)
        self.q = torch.randn(self.batch, self.qo_heads, HEAD_DIM, device="cuda", generator=gen).to(
            DTYPE
        )

    @property
    def plan_args(self) -> tuple:
        return (self.indptr, self.indices, self.last_page_len, self.qo_heads, KV_HEADS, HEAD_DIM)

    @property
    def plan_kwargs(self) -> dict:
        return {"page_size": PAGE, "q_data_type": DTYPE, "kv_data_type": DTYPE}

    def wrapper(self, buffer: torch.Tensor, graph: bool = False):
        import flashinfer

        if not graph:
            return flashinfer.BatchDecodeWithPagedKVCacheWrapper(buffer, "NHD", backend="fa2")
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            buffer,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.indptr.clone(),
            paged_kv_indices_buffer=self.indices.clone(),
            paged_kv_last_page_len_buffer=self.last_page_len.clone(),
            backend="fa2",
        )

    def float_bytes(self, wrapper) -> int:
        """FlashInfer's own figure for what this plan needs, from its counting allocator; a test
        that compares with it skips where FlashInfer has no such query (0.6.x, whose needs
        tests/attn/test_wrapper_kinds_gpu.py measures by growth)."""
        if not hasattr(wrapper, "workspace_size"):
            pytest.skip("needs FlashInfer's workspace_size() query, which 0.6.x wrappers lack")
        return wrapper.workspace_size(*self.plan_args, **self.plan_kwargs)[0]


def capture(run: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``run()`` captured in a CUDA graph, after one warm-up outside capture: the graph and the
    tensor its replays write."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out


def test_decode_plan_grows_a_1_mib_workspace_and_runs_as_on_a_large_buffer():
    decode = Decode(batch=64, kv_len=4096)
    workspace = WorkspacePool("cuda", size_mb=1).get("decode")
    tensor = workspace.tensor
    wrapper = decode.wrapper(tensor)
    need = decode.float_bytes(wrapper)
    assert need > MIB, "this shape must split KV and overflow 1 MiB"

    workspace.plan(wrapper.plan, *decode.plan_args, **decode.plan_kwargs)

    assert wrapper._float_workspace_buffer is tensor is workspace.tensor
    assert tensor.numel() == need  # grown to exactly FlashInfer's own figure
    reference = decode.wrapper(torch.zeros(512 * MIB, dtype=torch.uint8, device="cuda"))
    reference.plan(*decode.plan_args, **decode.plan_kwargs)
    assert torch.equal(
        wrapper.run(decode.q, decode.kv_cache), reference.run(decode.q, decode.kv_cache)
    )


def test_graph_wrappers_of_several_batch_sizes_share_one_workspace_then_seal_and_capture():
    pool = WorkspacePool("cuda", size_mb=1, owner="llama")
    workspace = pool.get("decode", 0)
    tensor = workspace.tensor
    decodes = [Decode(batch=b, kv_len=2048) for b in (1, 8, 32, 64)]
    wrappers = [d.wrapper(tensor, graph=True) for d in decodes]
    needs, growths = [], []
    for decode, wrapper in zip(decodes, wrappers, strict=True):
        needs.append(decode.float_bytes(wrapper))
        workspace.plan(wrapper.plan, *decode.plan_args, **decode.plan_kwargs)
        growths.append(workspace.stats().times_grown)
    assert all(w._float_workspace_buffer is tensor for w in wrappers)
    assert tensor.numel() == max(needs)  # as large as the largest, no larger
    # Under graphs the grid is padded, so every batch size needs the same (2,443,776 bytes on an
    # H200): the first plan grows the shared workspace (tmp_v, then tmp_s) and the others fit.
    assert growths == [2, 2, 2, 2], (needs, growths)

    pool.seal()
    address = tensor.data_ptr()
    decode, wrapper = decodes[-1], wrappers[-1]
    eager = wrapper.run(decode.q, decode.kv_cache).clone()
    graph, out = capture(lambda: wrapper.run(decode.q, decode.kv_cache))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    decode.q.copy_(torch.randn_like(decode.q))  # new inputs: the replay must follow them
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, wrapper.run(decode.q, decode.kv_cache))
    assert tensor.data_ptr() == address

    # Twice the query heads need about twice the partials: no longer fits the sealed buffer.
    wider = Decode(batch=64, kv_len=2048, qo_heads=2 * QO_HEADS)
    wide_wrapper = wider.wrapper(tensor, graph=True)
    with pytest.raises(WorkspaceSealedError) as raised:
        workspace.plan(wide_wrapper.plan, *wider.plan_args, **wider.plan_kwargs)
    message = str(raised.value)
    whole = wider.float_bytes(wide_wrapper)
    assert f"'llama:decode:cg0' is sealed at {tensor.numel():,} bytes" in message
    assert f"needs {whole:,} in all, per FlashInfer's workspace_size()" in message
    assert f"set size_mb={-(-whole // MIB)} or more" in message
    assert (tensor.data_ptr(), tensor.numel()) == (address, max(needs))
    graph.replay()  # the captured graph still runs on the untouched buffer
    torch.cuda.synchronize()
    assert torch.equal(out, wrapper.run(decode.q, decode.kv_cache))


def test_workspace_made_after_seal_is_sealed_and_reports_the_setting(monkeypatch):
    monkeypatch.setenv("MSTAR_WORKSPACE_BUFFER_MB", "1")
    pool = WorkspacePool("cuda")
    pool.seal()
    workspace = pool.get("decode", 1)
    decode = Decode(batch=64, kv_len=4096)
    wrapper = decode.wrapper(workspace.tensor)
    # tmp_v alone is 2 MiB and tmp_s comes after it: the whole plan needs 3 MB.
    whole = decode.float_bytes(wrapper)
    assert 2 * MIB < whole <= 3 * MIB
    with pytest.raises(WorkspaceSealedError, match=rf"{whole:,} in all.*BUFFER_MB=3 or more"):
        workspace.plan(wrapper.plan, *decode.plan_args, **decode.plan_kwargs)
    assert workspace.tensor.numel() == MIB


def _batch_mismatch(decode, workspace):
    wrapper = Decode(batch=decode.batch + 1, kv_len=decode.kv_len).wrapper(workspace.tensor, True)
    return wrapper.plan, decode.plan_args, decode.plan_kwargs


def _unknown_dtype(decode, workspace):
    kwargs = {**decode.plan_kwargs, "q_data_type": "float7"}
    return decode.wrapper(workspace.tensor).plan, decode.plan_args, kwargs


def _int_workspace_overflow(decode, workspace):
    # A tiny int workspace: FlashInfer's allocator overflows on an int allocation, which the
    # float workspace must not grow for.
    wrapper = decode.wrapper(workspace.tensor)
    wrapper.reset_workspace_buffer(
        workspace.tensor, torch.empty(64, dtype=torch.uint8, device="cuda")
    )
    return wrapper.plan, decode.plan_args, decode.plan_kwargs


@pytest.mark.parametrize(
    ("make_bad_plan", "text"),
    [
        (_batch_mismatch, "batch size should be fixed in cudagraph mode"),
        (_unknown_dtype, "float7"),
        (_int_workspace_overflow, "Buffer overflow when allocating memory for batch_decode_"),
    ],
    ids=["batch-mismatch", "unknown-dtype", "int-workspace-overflow"],
)
def test_a_plan_with_wrong_arguments_raises_flashinfers_own_error(make_bad_plan, text):
    decode = Decode(batch=64, kv_len=4096)  # would need 2 MiB: nothing may grow for it
    workspace = WorkspacePool("cuda", size_mb=1).get("decode")
    plan, args, kwargs = make_bad_plan(decode, workspace)

    with pytest.raises(Exception) as direct:
        plan(*args, **kwargs)
    with pytest.raises(Exception) as through:
        workspace.plan(plan, *args, **kwargs)

    assert type(through.value) is type(direct.value)
    assert str(through.value) == str(direct.value)
    assert text in str(through.value)
    assert not isinstance(through.value, ResourceError)
    assert through.value.__cause__ is None
    assert workspace.tensor.numel() == MIB


def test_growth_waits_for_a_side_stream_before_its_old_buffer_goes_back():
    """An engine's second stream queues a write into a workspace behind a long kernel; the
    default stream grows the workspace meanwhile. The write must land in the workspace (before
    its bytes are copied), never in memory the allocator hands out next."""
    from mstar_resources import Workspace

    from .fake_allocator import FakePlanner

    workspace = Workspace(torch.zeros(MIB, dtype=torch.uint8, device="cuda"), "streams")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # about a second on an H200
        workspace.tensor.fill_(7)  # queued on the buffer the workspace holds now
    workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 2 * MIB, 16)]))
    fresh = torch.zeros(MIB, dtype=torch.uint8, device="cuda")  # the old block, if it was free
    torch.cuda.synchronize()
    assert workspace.tensor.numel() == 2 * MIB
    assert not fresh.any(), "a side stream's write landed in memory handed out after growth"
    assert bool((workspace.tensor[:MIB] == 7).all())  # it landed before the copy
    assert not workspace.tensor[MIB:].any()


def test_growth_on_another_stream_keeps_every_byte_while_the_old_block_is_reused_at_once():
    """A workspace made on one stream, grown while another is current: the copy runs on the
    current stream, the old block goes back to the stream it was made on, and a tensor made there
    right away gets it. Growth waits for its copy before it lets go, so the new buffer holds every
    old byte; without that wait the overwrite below races the copy (a GiB takes about a
    millisecond to copy)."""
    from mstar_resources.units import ALIGNMENT

    from .fake_allocator import FakePlanner

    size = 1024 * MIB
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # no other free block of this size for the allocator to pick
    pool = WorkspacePool("cuda", 1024)
    workspace = pool.get("decode")  # made on the default stream
    pattern = torch.arange(size // 4, dtype=torch.int32, device="cuda").view(torch.uint8)
    workspace.tensor.copy_(pattern)
    old_block = workspace.tensor.data_ptr()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # grown while another stream is current
        workspace.plan(
            FakePlanner(workspace.tensor, [("batch_decode_tmp_v", size + ALIGNMENT, 16)])
        )
    reuse = torch.empty(size, dtype=torch.uint8, device="cuda")  # the default stream's, at once
    reuse.fill_(0xFF)
    torch.cuda.synchronize()
    assert reuse.data_ptr() == old_block  # the freed block was reused: the race was on
    assert workspace.tensor.numel() > size
    assert torch.equal(workspace.tensor[:size], pattern)
