"""Upper bounds on the workspace of FlashInfer's TRT-LLM decode kernels, XQA (Hopper, SM120) and
trtllm-gen (SM100), as read in FlashInfer 0.6.14, 0.6.16.post3, 0.6.18.post1, 0.7.0.post1,
0.7.2.post1 and 0.7.4 (paths under ``flashinfer/``; the same arithmetic in each unless said).
Each covers every launch of up to ``batch`` requests: the kernels lay out their scratch by the
launch grid (requests, heads, page-table width), never by the sequences' actual lengths.
:class:`TrtllmLaunchCheck` compares each launch with the workspace it is given, before it runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ResourceUsageError
from ..units import MIB, mb_to_hold, plural, release, round_up

if TYPE_CHECKING:
    from ._buffer import GrowableBuffer

# decode.py xqa_batch_decode_with_kv_cache: workspace[:8 MiB] is the semaphores, the rest scratch.
XQA_SEMAPHORE_BYTES = 8 * MIB
# data/csrc/xqa/mha.cu: ctaTile.x = warpTile.x (64) * ctaShapeInWarps.x (4) KV tokens per CTA tile.
XQA_MHA_TILE_TOKENS = 256
# data/csrc/xqa/mha_sm90.cu: gemm0CtaTileNbTokens = 64.
XQA_SM90_TILE_TOKENS = 64
# data/csrc/xqa/defines.h M_TILESIZE: rows (query head x token) per CTA under SPEC_DEC in mha.cu.
XQA_SPEC_DEC_ROWS = 32
# data/csrc/xqa/mha_sm90.cu Q_HEADS_PER_CTA: rows per CTA under SPEC_DEC without SWAP_AB.
XQA_SM90_SPEC_DEC_ROWS = 64
# data/csrc/trtllm_fmha_kernel_launcher.cu kTrtllmGenSoftmaxStatsGuardBytes.
TRTLLM_GEN_STATS_GUARD_BYTES = 1 * MIB
# include/flashinfer/trtllm/fmha/fmhaKernels.cuh: every tileSizeQ the kernel selection sets is at
# most 128 (GQA candidates {128, 64, 32, 16, 8}; MLA 8 to 64, sparse MLA its heads, <= 128).
TRTLLM_GEN_MAX_STEP_Q = 128
# 0.6.14 trtllm_fmha_kernel_launcher.cu: counters of 8192 x 256 uint32 at the workspace's head.
TRTLLM_GEN_COUNTER_BYTES_0_6_14 = 8192 * 256 * 4


def counters_in_workspace(flashinfer: str) -> bool:
    """Whether FlashInfer ``flashinfer`` keeps trtllm-gen's counters at the workspace's head
    (before 0.6.16; from 0.6.16.post3 they are a buffer of their own)."""
    return release(flashinfer) < (0, 6, 16)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ResourceUsageError(f"{name} must be a positive integer, got {value!r}")


def _mha_scratch(b: int, hkv: int, group: int, head_dim: int, seq: int, sms: int, q: int) -> int:
    # mha.cu kernel_mha, multi-block branch: MemSegmenter (utils.h; each segment aligned to its
    # element size) carves rowMax[n], rowSum[n] (SMemWarpRowMax: 128 B per 32 rows) then n
    # Vec<ScratchBuf, nbHeadSlices>: rows x padded head (headElems, mha.h) x 2-byte input elements.
    # nbSubSeqPerSeq of launchMHAFlashInfer (mha.cu): the CTAs splitting one sequence.
    n = min(max(1, sms // (b * hkv)), _cdiv(seq, XQA_MHA_TILE_TOKENS))
    if n == 1:  # isMultiBlock is gridDim.x != 1: no scratch, no semaphore
        return 0
    rows, seqs = group, b * hkv
    if q > 1:  # SPEC_DEC: rowsPerBlock rows; gridDim.y = kv heads x token blocks
        rows, seqs = XQA_SPEC_DEC_ROWS, b * hkv * _cdiv(q * group, XQA_SPEC_DEC_ROWS)
    head_elems = next(e for e in (64, 128, 256, 512) if head_dim <= e)
    buf, row_max, sub = rows * head_elems * 2, 128 * _cdiv(rows, 32), n * seqs
    return round_up(2 * sub * row_max, buf) + sub * buf


def _sm90_scratch(b: int, hkv: int, group: int, head_dim: int, seq: int, sms: int, q: int) -> int:
    # launchHopperF8MHAFlashInfer (mha_sm90.cu): round(floor(3 SMs / (b x kv heads)) x 0.25),
    # capped by the 64-token tiles; ScratchMem: rowSumMax (8 B per row) then tokens, both aligned
    # to one chunk of rows x head_dim x 2 B, over maxNbSubSeq x kv heads x b x nbInputSeqSplit.
    n = min(max(1, (3 * sms // (b * hkv) + 2) // 4), _cdiv(seq, XQA_SM90_TILE_TOKENS))
    if n == 1:
        return 0
    shapes = [(group, 1)]  # (ctaNbValidQHeads, nbInputSeqSplit)
    if q > 1:  # SWAP_AB (q x group <= 32) or Q_HEADS_PER_CTA rows of 64 // group tokens
        rows = XQA_SM90_SPEC_DEC_ROWS
        shapes = [(q * group, 1)] if q * group <= 32 else []
        shapes.append((rows, _cdiv(q, max(1, rows // group))))
    out = 0
    for rows, split in shapes:
        chunk, chunks = rows * head_dim * 2, n * hkv * b * split
        out = max(out, round_up(chunks * 8 * rows, chunk) + chunks * chunk)
    return out


def xqa_launch_bytes(
    *,
    batch: int,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_seq_len: int,
    sm_count: int,
    q_len_per_req: int = 1,
    hopper_fp8_kv: bool = False,
) -> int:
    """Bytes of ``workspace_buffer`` one ``xqa_batch_decode_with_kv_cache`` launch of ``batch``
    requests of ``q_len_per_req`` query tokens can touch: the 8 MiB semaphore region plus its
    multi-block scratch. The heads are the layer's, per rank; ``max_seq_len``: the page table's
    width in tokens (xqa.py reads the length from it); ``hopper_fp8_kv``: an fp8 KV cache, which
    xqa.py may run on ``mha_sm90.cu`` on SM90."""
    scratch = _xqa_scratch(batch, num_qo_heads, num_kv_heads, head_dim, max_seq_len, sm_count,
                           q_len_per_req, hopper_fp8_kv)  # fmt: skip
    return XQA_SEMAPHORE_BYTES + scratch(batch, q_len_per_req)


def xqa_workspace_bytes(
    *,
    batch: int,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_seq_len: int,
    sm_count: int,
    q_len_per_req: int = 1,
    hopper_fp8_kv: bool = False,
) -> int:
    """The most :func:`xqa_launch_bytes` over every launch of up to ``batch`` requests of up to
    ``q_len_per_req`` query tokens each (1 + speculative tokens) on a page table up to
    ``max_seq_len`` tokens wide: what a workspace needs to hold for all of them."""
    scratch = _xqa_scratch(batch, num_qo_heads, num_kv_heads, head_dim, max_seq_len, sm_count,
                           q_len_per_req, hopper_fp8_kv)  # fmt: skip
    # Splitting needs b x kv heads <= SMs / 2, so larger batches add no scratch.
    batches, q_lens = range(1, min(batch, sm_count) + 1), range(1, q_len_per_req + 1)
    return XQA_SEMAPHORE_BYTES + max(scratch(b, q) for b in batches for q in q_lens)


def _xqa_scratch(
    batch: int, qo: int, kv: int, head_dim: int, max_seq_len: int, sms: int, q_len: int, fp8: bool
) -> Callable[[int, int], int]:
    """A launch's multi-block scratch by (requests, query tokens each), the arguments checked:
    the most any kernel that may run takes (``fp8``: ``mha_sm90.cu`` may run too)."""
    _positive(batch=batch, num_qo_heads=qo, num_kv_heads=kv, head_dim=head_dim,
              max_seq_len=max_seq_len, sm_count=sms, q_len_per_req=q_len)  # fmt: skip
    if qo % kv:
        raise ResourceUsageError(f"num_qo_heads={qo} is not a multiple of num_kv_heads={kv}")
    if head_dim % 16 or head_dim > 512:
        raise ResourceUsageError(f"head_dim must be a multiple of 16 up to 512, got {head_dim!r}")
    kernels = [_mha_scratch] + ([_sm90_scratch] if fp8 else [])
    return lambda b, q: max(
        kernel(b, kv, qo // kv, head_dim, max_seq_len, sms, q) for kernel in kernels
    )


def trtllm_gen_workspace_bytes(
    *,
    batch: int,
    num_qo_heads: int,
    head_dim_vo: int,
    sm_count: int,
    max_q_len: int = 1,
    return_lse: bool = False,
    counters_in_workspace: bool = False,
) -> int:
    """Bytes of ``workspace_buffer`` ``trtllm_batch_decode_with_kv_cache`` (trtllm-gen) can touch.

    Layout (trtllm_fmha_kernel_launcher.cu, AlignedAllocator of 16-byte steps): [counters] |
    [softmax stats, with LSE: heads x batch x round_up(max_q_len, 256) float2, a 1 MiB guard] |
    multi-CTA KV scratch: partial stats of max(SMs, CTAs) x stepQ float2 and partial O of CTAs x
    stepQ x headDimPerCtaV x 2 B (kernelParams.h, fmhaReduction.cu). Without the opt-in multi-wave
    split (which checks its partials against the scratch left, else falls back) a split launch has
    at most SMs CTAs (fmhaKernels.cuh computeCtaAndClusterConfig), each with headDimPerCtaV <=
    head_dim_vo. ``return_lse`` adds the softmax stats; ``counters_in_workspace``: FlashInfer
    0.6.14 keeps 8 MiB of counters at the workspace's head (0.6.16.post3: a separate buffer)."""
    _positive(batch=batch, num_qo_heads=num_qo_heads, head_dim_vo=head_dim_vo,
              sm_count=sm_count, max_q_len=max_q_len)  # fmt: skip
    head = TRTLLM_GEN_COUNTER_BYTES_0_6_14 if counters_in_workspace else 0
    if return_lse:
        head += num_qo_heads * batch * round_up(max_q_len, 256) * 8 + TRTLLM_GEN_STATS_GUARD_BYTES
    return round_up(head, 16) + sm_count * TRTLLM_GEN_MAX_STEP_Q * (8 + 2 * head_dim_vo)


# -- each launch checked where the engine makes it -------------------------------------------

_FIRST_ARGUMENTS = ("query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens")
"""The first positional parameters of both FlashInfer entry points, in their order."""
# The kernel layout each entry point takes where the caller names none.
_DEFAULT_LAYOUT = {"xqa": "NHD", "trtllm": "HND"}
# How a refusal names each kernel (``backend`` "auto": FlashInfer picks by the GPU).
_LAUNCH = {"xqa": "an XQA", "trtllm-gen": "a trtllm-gen", "auto": "a TRT-LLM (XQA or trtllm-gen)"}


class TrtllmLaunchCheck:
    """Each decode launch of FlashInfer's TRT-LLM kernels on ``workspace``, compared before the
    kernel runs with the bytes it touches (:func:`xqa_launch_bytes`,
    :func:`trtllm_gen_workspace_bytes`): the kernels check nothing, so a launch that would write
    past the workspace is refused here with the launch and the setting that makes room.

    Under a CUDA graph the check runs as the launch is captured; a replay runs the same launch.
    ``counters_in_workspace``: FlashInfer before 0.6.16 keeps trtllm-gen's counters in it."""

    def __init__(
        self, workspace: GrowableBuffer, sm_count: int, *, counters_in_workspace: bool = False
    ) -> None:
        self.workspace = workspace
        self.sm_count = sm_count
        self.counters_in_workspace = counters_in_workspace
        self._needs: dict[tuple[Any, ...], int] = {}  # by launch shape: computed once
        self.launches = 0  # checked on the workspace (eager, or as a graph captured them)
        self.refused = 0

    def check(
        self, entry: str, args: tuple[Any, ...], kwargs: dict[str, Any], *,
        parameters: Sequence[str] = _FIRST_ARGUMENTS,
    ) -> None:  # fmt: skip
        """Refuse a launch of FlashInfer's ``entry`` (``"xqa"`` for
        ``xqa_batch_decode_with_kv_cache``, ``"trtllm"`` for ``trtllm_batch_decode_with_kv_cache``)
        with these arguments that would touch more of the workspace than it holds; a launch on
        another buffer is not this check's. ``parameters``: the entry point's, in order, which
        ``args`` are given by."""
        if args:  # as vLLM calls them, all by keyword
            kwargs = {**dict(zip(parameters, args, strict=False)), **kwargs}
        buffer = kwargs.get("workspace_buffer")
        if buffer is not self.workspace.tensor:
            return
        self.launches += 1
        get = kwargs.get
        query, kv_cache = kwargs["query"], kwargs["kv_cache"]
        k_cache = kv_cache[0] if type(kv_cache) is tuple else kv_cache
        shape = k_cache.shape  # [pages, (2,) page, kv heads, dim], or HND's heads then page
        rows, cols = shape[-3], shape[-2]
        layout = get("kv_layout") or _DEFAULT_LAYOUT[entry]
        kv_heads, page = (rows, cols) if layout == "HND" else (cols, rows)
        # One token a request unless given (FlashInfer's default); None: up to max_q_len.
        q_len = get("q_len_per_req", 1) or get("max_q_len") or 1
        tokens, qo, head_dim = query.shape
        batch = max(kwargs["seq_lens"].shape[0], tokens // q_len)
        kernel = get("backend", "auto") if entry == "trtllm" else "xqa"
        table_tokens, kv_dtype = kwargs["block_tables"].shape[-1] * page, k_cache.dtype
        return_lse = bool(get("return_lse")) or get("lse") is not None  # either writes the stats
        key = (kernel, batch, q_len, qo, kv_heads, head_dim, table_tokens, kv_dtype, return_lse)
        need = self._needs.get(key)
        if need is None:
            need = self._needs[key] = self._need(*key)
        have = buffer.numel()
        if need <= have:
            return
        self.refused += 1
        lse = ", returning the LSE" if return_lse else ""
        name, setting = self.workspace.name, self.workspace.floor
        raise self.workspace._refusal(
            f"{_LAUNCH.get(kernel, f'a {kernel}')} decode launch of {plural(batch, 'request')} x "
            f"{q_len} query tokens ({qo}/{kv_heads} heads of {head_dim}, a page table of "
            f"{table_tokens:,} tokens, KV "
            f"{str(kv_dtype).removeprefix('torch.')}{lse}, {self.sm_count} SMs) would touch "
            f"{need:,} bytes of workspace {name!r}, which holds {have:,}; it was not "
            f"launched. Set {setting}={mb_to_hold(need)} or more",
            needed=need,
        )

    def _need(
        self, kernel: str, batch: int, q_len: int, qo: int, kv: int, head_dim: int,
        table_tokens: int, kv_dtype: Any, return_lse: bool,
    ) -> int:  # fmt: skip
        needs = []
        if kernel in ("xqa", "auto"):
            needs.append(xqa_launch_bytes(
                batch=batch, num_qo_heads=qo, num_kv_heads=kv, head_dim=head_dim,
                max_seq_len=table_tokens, sm_count=self.sm_count, q_len_per_req=q_len,
                hopper_fp8_kv="float8" in str(kv_dtype),
            ))  # fmt: skip
        if kernel != "xqa":  # trtllm-gen, or "auto", which may pick either
            needs.append(trtllm_gen_workspace_bytes(
                batch=batch, num_qo_heads=qo, head_dim_vo=head_dim, sm_count=self.sm_count,
                max_q_len=q_len, return_lse=return_lse,
                counters_in_workspace=self.counters_in_workspace,
            ))  # fmt: skip
        return max(needs)
