"""The TRT-LLM decode workspace bounds: each constant of the kernels' model against FlashInfer's
sources, the figures the GPU measured (tests/attn/test_trtllm_workspace_gpu.py proves the model
there: the kernels themselves on a buffer of the bound with a guard after it), the bounds'
properties over batch and length sweeps, trtllm-gen's LSE carve-out against vLLM's own check of
it, and the check of each launch against the workspace it is given (on the kernels' own argument
shapes)."""

from __future__ import annotations

import inspect
import itertools
import re

import pytest
import torch

from mstar_resources.attn import trtllm_workspace as model
from mstar_resources.attn.trtllm_workspace import (
    MIB,
    XQA_SEMAPHORE_BYTES,
    TrtllmLaunchCheck,
    trtllm_gen_workspace_bytes,
    xqa_launch_bytes,
    xqa_workspace_bytes,
)
from mstar_resources.attn.workspace import Workspace
from mstar_resources.errors import ResourceUsageError, WorkspaceSealedError

from ..flashinfer_sources import flashinfer_package, flashinfer_version

H200_SMS = 132
B200_SMS = 148

SOURCES = flashinfer_package()


def _read(path: str, pattern: str) -> list[int]:
    assert SOURCES is not None
    text = (SOURCES / path).read_text(encoding="utf-8")
    return [int(n) for n in re.findall(pattern, text)]


@pytest.mark.flashinfer
@pytest.mark.skipif(SOURCES is None, reason="needs FlashInfer's sources (test.sh fetches them)")
def test_each_constant_of_the_model_is_the_one_in_flashinfers_sources():
    """Where each constant ``trtllm_workspace.py`` names comes from, read in the FlashInfer the
    tests have (0.7.4): a kernel that changed one fails here, on the CPU."""
    version = flashinfer_version()
    (semaphore,) = set(_read("decode.py", r"semaphore = workspace_u8\[: (\d+) \* 1024 \* 1024\]"))
    assert semaphore * MIB == model.XQA_SEMAPHORE_BYTES, version
    (warp_tile,) = _read("data/csrc/xqa/mha.cu", r"constexpr uint2 warpTile = \{(\d+),")
    (warps,) = _read("data/csrc/xqa/mha.cu", r"constexpr uint3 ctaShapeInWarps = \{(\d+),")
    assert warp_tile * warps == model.XQA_MHA_TILE_TOKENS, version
    sm90 = "data/csrc/xqa/mha_sm90.cu"
    (group_tokens,) = _read(sm90, r"constexpr uint32_t gemm0WarpGrpTileNbTokens = (\d+);")
    (groups,) = _read(sm90, r"constexpr uint32_t gemm0NbGmmaGrps = (\d+);")
    assert group_tokens * groups == model.XQA_SM90_TILE_TOKENS, version
    assert _read(sm90, r"#define Q_HEADS_PER_CTA (\d+)") == [model.XQA_SM90_SPEC_DEC_ROWS]
    assert _read("data/csrc/xqa/defines.h", r"#define M_TILESIZE (\d+)") == [
        model.XQA_SPEC_DEC_ROWS
    ]
    (guard,) = _read("data/csrc/trtllm_fmha_kernel_launcher.cu",
                     r"kTrtllmGenSoftmaxStatsGuardBytes = (\d+) \* 1024 \* 1024;")  # fmt: skip
    assert guard * MIB == model.TRTLLM_GEN_STATS_GUARD_BYTES, version
    tile_sizes = _read("data/include/flashinfer/trtllm/fmha/fmhaKernels.cuh",
                       r"Cost factor when tileSizeQ = (\d+)")  # fmt: skip
    assert max(tile_sizes) == model.TRTLLM_GEN_MAX_STEP_Q, version


def xqa(**kwargs: int | bool) -> int:
    args: dict[str, int | bool] = dict(batch=512, num_qo_heads=40, num_kv_heads=8, head_dim=128,
                                       max_seq_len=32768, sm_count=H200_SMS)  # fmt: skip
    return xqa_workspace_bytes(**{**args, **kwargs})


def test_xqa_no_split_leaves_only_the_semaphores():
    assert xqa(max_seq_len=256) == XQA_SEMAPHORE_BYTES  # one tile: nothing to split
    assert xqa(sm_count=15) == XQA_SEMAPHORE_BYTES  # 15 // 8 < 2 CTAs a sequence
    assert xqa(sm_count=16) > XQA_SEMAPHORE_BYTES


@pytest.mark.parametrize("heads", [(32, 8), (40, 8), (64, 8), (8, 1), (128, 16), (16, 2)])
@pytest.mark.parametrize("head_dim", [64, 128, 256, 512])
def test_xqa_bound_is_monotone_and_holds_the_semaphores(heads, head_dim):
    qo, kv = heads
    batches, lens = [1, 2, 3, 7, 8, 16, 33, 512], [16, 256, 257, 1024, 4096, 32768, 131072]
    for hopper_fp8_kv, q_len in itertools.product((False, True), (1, 3)):
        if head_dim > 256 and (hopper_fp8_kv or q_len > 1):
            continue
        grid = [[xqa(batch=b, max_seq_len=n, num_qo_heads=qo, num_kv_heads=kv, head_dim=head_dim,
                     hopper_fp8_kv=hopper_fp8_kv, q_len_per_req=q_len) for n in lens]
                for b in batches]  # fmt: skip
        for row in grid:
            assert row == sorted(row) and row[0] >= XQA_SEMAPHORE_BYTES
        for column in zip(*grid, strict=True):
            assert list(column) == sorted(column)
        assert grid[-1][-1] < XQA_SEMAPHORE_BYTES + 64 * MIB


def test_xqa_batches_past_half_the_sms_add_no_scratch():
    # A request splits over at most SMs // (batch x KV heads) CTAs: none past half the SMs.
    for kv in (1, 2, 8):
        edge = H200_SMS // (2 * kv)
        assert xqa(batch=edge, num_kv_heads=kv) > XQA_SEMAPHORE_BYTES
        assert xqa(batch=10 * edge, num_kv_heads=kv) == xqa(batch=edge, num_kv_heads=kv)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"batch": 0}, "batch must be a positive integer, got 0"),
        ({"num_qo_heads": 36}, "num_qo_heads=36 is not a multiple of num_kv_heads=8"),
        ({"head_dim": 100}, "head_dim must be a multiple of 16 up to 512, got 100"),
        ({"sm_count": -1}, "sm_count must be a positive integer, got -1"),
    ],
)
def test_xqa_errors_name_the_setting(kwargs, words):
    with pytest.raises(ResourceUsageError, match=words):
        xqa(**kwargs)


def vllm_fits_workspace(q_lens: list[int], num_qo_heads: int, nbytes: int) -> bool:
    """vLLM 0.33.0 and 0.34.0, vllm/v1/attention/backends/flashinfer.py,
    TrtllmDCPContextWrapper.fits_workspace, on plain lists."""
    batch_size = len(q_lens)
    max_q_len = max(q_lens)
    stats_bytes = num_qo_heads * batch_size * (-(-max_q_len // 256) * 256) * 8
    return stats_bytes + (1 << 20) <= nbytes


@pytest.mark.parametrize("heads", [1, 8, 32, 40, 128])
def test_trtllm_gen_stats_match_vllm_fits_workspace(heads):
    for batch, q_len in itertools.product((1, 7, 512, 1024), (1, 4, 255, 256, 257, 8192)):
        args = dict(batch=batch, num_qo_heads=heads, head_dim_vo=128, sm_count=B200_SMS,
                    max_q_len=q_len)  # fmt: skip
        with_lse = trtllm_gen_workspace_bytes(**args, return_lse=True)
        need = with_lse - trtllm_gen_workspace_bytes(**args)  # the softmax stats
        q_lens = [1] * (batch - 1) + [q_len]
        assert vllm_fits_workspace(q_lens, heads, need)
        assert not vllm_fits_workspace(q_lens, heads, need - 1)


def test_trtllm_gen_bound_is_monotone():
    for lse in (False, True):
        grid = [[trtllm_gen_workspace_bytes(batch=b, num_qo_heads=32, head_dim_vo=128,
                                            sm_count=sms, max_q_len=q, return_lse=lse)
                 for b in (1, 8, 512) for q in (1, 4, 300)] for sms in (78, 132, 148)]  # fmt: skip
        for row in grid:  # batch and query length add softmax stats only
            assert row == sorted(row) and (lse or len(set(row)) == 1)
        for column in zip(*grid, strict=True):
            assert list(column) == sorted(column)


def test_trtllm_gen_errors_name_the_setting():
    with pytest.raises(ResourceUsageError, match="max_q_len must be a positive integer, got 0"):
        trtllm_gen_workspace_bytes(batch=1, num_qo_heads=8, head_dim_vo=128, sm_count=1,
                                   max_q_len=0)  # fmt: skip


# -- the bound over launches, and each launch -------------------------------------------------


def test_the_bounds_the_gpu_ran_the_kernels_on():
    """The figures the GPU tests and docs/vllm.md measured: XQA at 32/8 and 40/8 heads of 128 on
    132 SMs, one query token a request, held with a guard after it; two tokens a request on
    the one-token bound wrote 917,504 bytes past it, the difference to the two-token bound."""
    one = dict(batch=256, num_qo_heads=32, num_kv_heads=8, head_dim=128,
               max_seq_len=H200_SMS * 256, sm_count=H200_SMS)  # fmt: skip
    assert xqa_workspace_bytes(**one) == 8_552_448
    assert xqa_workspace_bytes(**{**one, "num_qo_heads": 40}) == 8_585_728
    assert xqa_workspace_bytes(**one, q_len_per_req=2) - 8_552_448 == 917_504


def test_speculative_launches_need_more_than_the_one_token_bound():
    # 32/8 heads of 128 on 132 SMs, 256 requests over any page table: one token a request,
    # then 1 + k tokens (bf16 KV on mha.cu; FP8 KV may run mha_sm90.cu's larger layout).
    one = dict(batch=256, num_qo_heads=32, num_kv_heads=8, head_dim=128,
               max_seq_len=H200_SMS * 256, sm_count=H200_SMS)  # fmt: skip
    assert xqa_workspace_bytes(**one) == 8_552_448
    for q in (2, 3, 5):
        assert xqa_workspace_bytes(**one, q_len_per_req=q) == 9_469_952
        assert xqa_workspace_bytes(**one, q_len_per_req=q, hopper_fp8_kv=True) == 10_551_296


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("heads", [(32, 8), (40, 8), (8, 1), (64, 4)])
def test_the_bound_holds_every_launch_up_to_its_batch_and_query_length(heads, fp8):
    qo, kv = heads
    args = dict(num_qo_heads=qo, num_kv_heads=kv, head_dim=128, sm_count=H200_SMS,
                hopper_fp8_kv=fp8)  # fmt: skip
    bound = xqa_workspace_bytes(batch=64, max_seq_len=32768, q_len_per_req=4, **args)
    launches = {
        xqa_launch_bytes(batch=b, max_seq_len=n, q_len_per_req=q, **args)
        for b in (1, 2, 3, 5, 8, 16, 17, 33, 64)
        for n in (16, 512, 4096, 32768)
        for q in (1, 2, 3, 4)
    }
    assert max(launches) == bound  # reached by a launch, and none past it
    assert min(launches) == XQA_SEMAPHORE_BYTES


def tensors(batch: int, q_len: int, table_tokens: int, kv_dtype=torch.bfloat16, layout="NHD",
            heads=(32, 8), page=16) -> dict:  # fmt: skip
    """A decode launch's arguments as vLLM passes them (shapes only matter here)."""
    qo, kv = heads
    pages = (4, page, kv, 128) if layout == "NHD" else (4, kv, page, 128)
    return {
        "query": torch.empty(batch * q_len, qo, 128, dtype=torch.bfloat16),
        "kv_cache": (torch.empty(pages, dtype=kv_dtype), torch.empty(pages, dtype=kv_dtype)),
        "block_tables": torch.zeros(batch, table_tokens // page, dtype=torch.int32),
        "seq_lens": torch.ones(batch, dtype=torch.int32),
        "max_seq_len": table_tokens,
        "kv_layout": layout,
        "q_len_per_req": q_len,
    }


def checked(nbytes: int) -> TrtllmLaunchCheck:
    held = Workspace(torch.zeros(nbytes, dtype=torch.uint8), "attn.trtllm",
                     floor="resources.attn.trtllm.declared_mb")  # fmt: skip
    return TrtllmLaunchCheck(held, H200_SMS)


def test_a_launch_inside_the_workspace_passes_and_one_past_it_is_refused_naming_the_setting():
    check = checked(8_552_448)  # the one-token bound at 32/8
    one = tensors(batch=1, q_len=1, table_tokens=32768)
    check.check("xqa", (), {**one, "workspace_buffer": check.workspace.tensor})
    spec = tensors(batch=1, q_len=3, table_tokens=32768)
    with pytest.raises(WorkspaceSealedError) as refused:
        check.check("xqa", (), {**spec, "workspace_buffer": check.workspace.tensor})
    error = refused.value
    need = xqa_launch_bytes(batch=1, num_qo_heads=32, num_kv_heads=8, head_dim=128,
                            max_seq_len=32768, sm_count=H200_SMS, q_len_per_req=3)  # fmt: skip
    assert (error.workspace, error.held_bytes, error.needed_bytes) == (
        "attn.trtllm",
        8_552_448,
        need,
    )
    assert error.setting == "resources.attn.trtllm.declared_mb" and error.suggested_mb == 10
    assert str(error).startswith("an XQA decode launch of 1 request x 3 query tokens (32/8 heads")
    assert "resources.attn.trtllm.declared_mb=10 or more" in str(error)
    assert (check.launches, check.refused) == (2, 1)


def test_the_arguments_are_read_positionally_and_in_either_layout():
    check = checked(XQA_SEMAPHORE_BYTES)  # no scratch: any split is refused
    for layout in ("NHD", "HND"):
        a = tensors(batch=1, q_len=1, table_tokens=4096, layout=layout)
        positional = (a.pop("query"), a.pop("kv_cache"), check.workspace.tensor)
        # both read as 32/8 heads on 16-token pages: a 4,096-token table, split 16 ways
        with pytest.raises(WorkspaceSealedError, match=r"32/8 heads of 128, a page table of 4,096"):
            check.check("xqa", positional, a)


def test_a_single_kv_tensor_fp8_and_ragged_queries_are_read_as_flashinfer_reads_them():
    fp8 = tensors(batch=1, q_len=2, table_tokens=32768, kv_dtype=torch.float8_e4m3fn)
    k, v = fp8.pop("kv_cache")
    fp8["kv_cache"] = torch.stack([k, v], dim=1)  # [pages, 2, page, kv heads, dim]
    need = xqa_launch_bytes(batch=1, num_qo_heads=32, num_kv_heads=8, head_dim=128,
                            max_seq_len=32768, sm_count=H200_SMS, q_len_per_req=2,
                            hopper_fp8_kv=True)  # fmt: skip
    for held, refused in ((need, False), (need - 1, True)):
        check = checked(held)
        call = {**fp8, "workspace_buffer": check.workspace.tensor}
        if refused:
            with pytest.raises(WorkspaceSealedError, match="KV float8_e4m3fn"):
                check.check("xqa", (), call)
        else:
            check.check("xqa", (), call)
    # ragged drafts: the batch is the requests' count, not the rows over the longest draft
    ragged = tensors(batch=3, q_len=4, table_tokens=32768)
    ragged["query"] = ragged["query"][:5]  # 5 draft rows in all, the longest 4
    ragged["q_cu_seq_lens"] = torch.tensor([0, 1, 4, 5], dtype=torch.int32)
    check = checked(XQA_SEMAPHORE_BYTES)
    with pytest.raises(WorkspaceSealedError, match="3 requests x 4 query tokens"):
        check.check("xqa", (), {**ragged, "workspace_buffer": check.workspace.tensor})


def test_trtllm_gen_launches_are_checked_with_their_lse_and_other_buffers_are_not():
    gen = tensors(batch=8, q_len=1, table_tokens=4096, layout="HND")
    gen.update(backend="trtllm-gen", return_lse=True, q_len_per_req=None, max_q_len=4)
    need = trtllm_gen_workspace_bytes(batch=8, num_qo_heads=32, head_dim_vo=128,
                                      sm_count=H200_SMS, max_q_len=4, return_lse=True)  # fmt: skip
    check = checked(need - 1)
    with pytest.raises(
        WorkspaceSealedError, match=r"^a trtllm-gen decode launch .* returning the LSE"
    ):
        check.check("trtllm", (), {**gen, "workspace_buffer": check.workspace.tensor})
    # backend "auto": FlashInfer picks the kernel, so the launch is named by both
    auto = checked(need - 1)
    with pytest.raises(WorkspaceSealedError, match=r"^a TRT-LLM \(XQA or trtllm-gen\) decode"):
        gen_auto = {**gen, "backend": "auto", "workspace_buffer": auto.workspace.tensor}
        auto.check("trtllm", (), gen_auto)
    fits = checked(need)
    fits.check("trtllm", (), {**gen, "workspace_buffer": fits.workspace.tensor})
    assert (fits.launches, fits.refused) == (1, 0)
    # the engine's own buffer (a launch the plugin does not hold the workspace of): not checked
    check.check("trtllm", (), {**gen, "workspace_buffer": torch.zeros(16, dtype=torch.uint8)})
    assert (check.launches, check.refused) == (1, 1)


def _xqa_entry(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len,
               bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, sinks=None,
               kv_layout="NHD", enable_pdl=None, q_len_per_req=1):  # fmt: skip
    """``xqa_batch_decode_with_kv_cache``'s first parameters, in FlashInfer 0.7.4's order."""


def test_every_argument_given_by_position_is_read_by_the_entry_points_own_order():
    a = tensors(batch=1, q_len=4, table_tokens=4096, layout="HND")
    need = xqa_launch_bytes(batch=1, num_qo_heads=32, num_kv_heads=8, head_dim=128,
                            max_seq_len=4096, sm_count=H200_SMS, q_len_per_req=4)  # fmt: skip
    check = checked(need - 1)
    positional = (a["query"], a["kv_cache"], check.workspace.tensor, a["block_tables"],
                  a["seq_lens"], 4096, 1.0, 1.0, -1, None, None, "HND", None, 4)  # fmt: skip
    parameters = tuple(inspect.signature(_xqa_entry).parameters)
    with pytest.raises(WorkspaceSealedError, match=r"1 request x 4 query tokens \(32/8 heads"):
        check.check("xqa", positional, {}, parameters=parameters)


def test_a_trtllm_gen_launch_given_an_lse_buffer_alone_is_checked_with_the_stats():
    """FlashInfer's launcher writes the softmax statistics wherever an ``lse`` tensor is given."""
    gen = tensors(batch=8, q_len=1, table_tokens=4096, layout="HND")
    gen.update(backend="trtllm-gen", lse=torch.empty(8, 32, 2))
    need = trtllm_gen_workspace_bytes(batch=8, num_qo_heads=32, head_dim_vo=128,
                                      sm_count=H200_SMS, max_q_len=1, return_lse=True)  # fmt: skip
    check = checked(need - 1)
    with pytest.raises(WorkspaceSealedError, match="returning the LSE"):
        check.check("trtllm", (), {**gen, "workspace_buffer": check.workspace.tensor})


def test_max_q_len_without_q_len_per_req_none_plans_one_token_a_request_as_flashinfer_does():
    """``q_len_per_req`` keeps its default of 1 unless given None: FlashInfer then reads each
    query row as a request of its own, whatever ``max_q_len`` says."""
    gen = tensors(batch=2, q_len=4, table_tokens=4096, layout="HND")
    del gen["q_len_per_req"]
    check = checked(XQA_SEMAPHORE_BYTES)
    with pytest.raises(WorkspaceSealedError, match="8 requests x 1 query tokens"):
        check.check(
            "trtllm", (), {**gen, "max_q_len": 4, "workspace_buffer": check.workspace.tensor}
        )
