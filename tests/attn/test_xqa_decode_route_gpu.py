"""FlashInfer 0.7.4's decode wrapper running a plan on XQA, on its float workspace: a graph-mode,
tensor-core, ``auto`` wrapper of fp16, 32/8 heads of 128, pages of 16, with 16 requests of 4 query
tokens at a KV length of 1,024 each, one of the shapes its decode.py sends to XQA on an SM90 GPU.
XQA checks nothing of the workspace; ``Workspace.plan`` makes it hold what the run touches.

One kernel configuration of each route (XQA, and the tensor-core FA2 reference), built on first use.
Runs as is under ``compute-sanitizer --tool memcheck``:
``python -m pytest tests/attn/test_xqa_decode_route_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from mstar_resources import Workspace, WorkspaceSealedError
from mstar_resources.attn._flashinfer import XQA_DECODE_RUN_NAME
from mstar_resources.attn.trtllm_workspace import xqa_workspace_bytes
from mstar_resources.units import MIB

pytestmark = pytest.mark.gpu

BATCH, Q_LEN, KV_LEN, PAGE, QO, KV, DIM = 16, 4, 1024, 16, 32, 8, 128
DTYPE = torch.float16
SETTING = "resources.attn.decode.declared_mb"
# Room for FA2's split-KV partials of this plan (tmp_v + tmp_s: 2,179,584 bytes on 132 SMs; the
# padded batch is 2 x SMs / KV heads, so below 4 MiB up to ~250 SMs), yet short of XQA's 8 MiB of
# semaphores alone: a workspace sealed at this size is refused by the XQA bound, not by FA2.
FA2_ROOM = 4 * MIB


def _wrapper(flashinfer, workspace: torch.Tensor, graphs: bool):
    pages = BATCH * KV_LEN // PAGE
    buffers = {}
    if graphs:  # a graph-mode wrapper plans into buffers of its own, made up front
        buffers = {
            "paged_kv_indptr_buffer": torch.empty(BATCH + 1, dtype=torch.int32, device="cuda"),
            "paged_kv_indices_buffer": torch.empty(pages, dtype=torch.int32, device="cuda"),
            "paged_kv_last_page_len_buffer": torch.empty(BATCH, dtype=torch.int32, device="cuda"),
        }
    return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=graphs, use_tensor_cores=True, backend="auto", **buffers
    )


def _plan_args() -> tuple:
    pages = KV_LEN // PAGE
    indptr = torch.arange(BATCH + 1, dtype=torch.int32, device="cuda") * pages
    indices = torch.arange(BATCH * pages, dtype=torch.int32, device="cuda")
    last = torch.full((BATCH,), PAGE, dtype=torch.int32, device="cuda")
    return indptr, indices, last, QO, KV, DIM, PAGE


def test_a_decode_plan_run_on_xqa_grows_the_workspace_and_runs_as_natively():
    flashinfer = pytest.importorskip("flashinfer")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("FlashInfer sends this shape to XQA on SM90 only")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    options = {"q_data_type": DTYPE, "kv_data_type": DTYPE, "q_len_per_req": Q_LEN}
    workspace = Workspace(torch.zeros(MIB, dtype=torch.uint8, device="cuda"), "attention:decode",
                          floor=SETTING)  # fmt: skip
    wrapper = _wrapper(flashinfer, workspace.tensor, graphs=True)
    workspace.plan(wrapper.plan, *_plan_args(), **options)
    if not getattr(wrapper, "_use_xqa_mtp_decode", False):
        pytest.skip(f"FlashInfer {flashinfer.__version__} plans this shape natively")
    bound = xqa_workspace_bytes(batch=BATCH, num_qo_heads=QO, num_kv_heads=KV, head_dim=DIM,
                                max_seq_len=wrapper._block_tables.shape[-1] * PAGE, sm_count=sms,
                                q_len_per_req=Q_LEN)  # fmt: skip
    assert workspace.tensor.numel() >= bound
    # FA2's own plan grew it too (to ~2 MB), but only the XQA bound reaches past 8 MiB.
    assert workspace.stats().largest_growth_allocation == XQA_DECODE_RUN_NAME

    gen = torch.Generator(device="cuda").manual_seed(7)
    pages = BATCH * KV_LEN // PAGE
    k, v = (torch.randn(pages, PAGE, KV, DIM, device="cuda", generator=gen).to(DTYPE)
            for _ in range(2))  # fmt: skip
    q = torch.randn(BATCH * Q_LEN, QO, DIM, device="cuda", generator=gen).to(DTYPE)
    # q_len_per_req was given to plan(); run() infers it from q (passing it here is deprecated).
    out = wrapper.run(q, (k, v))
    native = _wrapper(flashinfer, torch.zeros(256 * MIB, dtype=torch.uint8, device="cuda"), False)
    native.plan(*_plan_args(), **options)
    assert not getattr(native, "_use_xqa_mtp_decode", False)
    torch.testing.assert_close(out, native.run(q, (k, v)), atol=1e-2, rtol=1e-2)

    # Sealed with room for FA2's partials but below the XQA bound: refused by the bound, before
    # XQA could run past the workspace.
    sealed = Workspace(torch.zeros(FA2_ROOM, dtype=torch.uint8, device="cuda"),
                       "attention:decode", sealed=True, floor=SETTING)  # fmt: skip
    refused = _wrapper(flashinfer, sealed.tensor, graphs=True)
    with pytest.raises(WorkspaceSealedError) as raised:
        sealed.plan(refused.plan, *_plan_args(), **options)
    assert raised.value.setting == SETTING
    assert raised.value.needed_bytes == bound
    assert XQA_DECODE_RUN_NAME in str(raised.value)

    # Sealed at 1 MiB, FA2's own split-KV partials (batch_prefill_tmp_v) overflow first: refused
    # too, asking for the XQA bound, which one raise of the floor needs.
    small = Workspace(torch.zeros(MIB, dtype=torch.uint8, device="cuda"), "attention:decode",
                      sealed=True, floor=SETTING)  # fmt: skip
    with pytest.raises(WorkspaceSealedError) as raised:
        small.plan(_wrapper(flashinfer, small.tensor, graphs=True).plan, *_plan_args(), **options)
    assert (raised.value.setting, raised.value.needed_bytes) == (SETTING, bound)
    assert "batch_prefill_tmp_v" in str(raised.value)
