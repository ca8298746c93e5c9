"""What inference engines reserve today for FlashInfer's float workspace, for comparison.

Each of these engines makes one buffer and shares it among all its FlashInfer wrappers and CUDA
graph sizes (they run one after another on a stream):

- vLLM: ``max(394 MiB, max_num_batched_tokens x query heads per rank x head dim x 16 bytes)``.
  The 394 MiB is ``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE``'s default (``vllm/envs.py``); the
  per-token scaling came with vLLM PR #48428, for deployments whose split-KV partials outgrow it.
  For MLA models vLLM plans FlashInfer only on SM100 GPUs (its FlashInfer MLA decode backend, and
  ``vllm/v1/attention/backends/mla/prefill/flashinfer.py``, which asks ``supports_compute_
  capability`` for major 10); on an H200 it runs MLA without FlashInfer, so it has no figure here.
- SGLang: ``SGLANG_FLASHINFER_WORKSPACE_SIZE``, 384 MiB by default
  (``python/sglang/srt/environ.py``; some architectures get 512 MiB), process-global. Its
  FlashInfer MLA backend (``layers/attention/flashinfer_mla_backend.py``) plans its ragged
  prefill and every MLA wrapper, graph ones included, on that same buffer.
- TensorRT-LLM (PyTorch backend): 320 MiB, hard-coded.
- MLC-LLM / TVM: 768 MiB per KV cache.
"""

from __future__ import annotations

from .._internal.floor import INT_DEFAULT_MB
from ..units import mb_to_hold
from .profile import CalibrationProfile, PlanKind

VLLM_MIN_MB = 394
VLLM_BYTES_PER_TOKEN_HEAD_DIM = 16
SGLANG_MB = 384
TENSORRT_LLM_MB = 320
MLC_LLM_MB = 768


def vllm_formula(
    batched_tokens: int, heads: int, head_dim: int, per: int = VLLM_BYTES_PER_TOKEN_HEAD_DIM
) -> int:
    """vLLM's per-token floor of its FlashInfer buffer, in bytes: ``max_num_batched_tokens`` x
    query heads per rank x head dim x ``per`` (``FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM``,
    16 in vLLM 0.26 and 0.33). The vLLM plugin passes the running vLLM's own constant."""
    return batched_tokens * heads * head_dim * per


def vllm_formula_bytes(profile: CalibrationProfile, ranks: int = 1) -> int | None:
    """vLLM 0.33's per-token floor under its buffer setting, in bytes (None for MLA models)."""
    if any(plan.kind is PlanKind.mla for plan in profile.plans.values()):
        return None
    model = profile.model
    heads = model.num_qo_heads // ranks
    return vllm_formula(profile.limits.max_num_batched_tokens, heads, model.head_dim)


def vllm_buffer_mb(profile: CalibrationProfile, ranks: int = 1) -> int | None:
    """vLLM's shared float workspace for this deployment on ``ranks`` tensor-parallel ranks
    (the profile's heads are one GPU's; ``ranks`` splits them further). None for MLA models,
    which vLLM runs without FlashInfer on the GPUs calibrated here (SM90)."""
    formula = vllm_formula_bytes(profile, ranks)
    return None if formula is None else max(VLLM_MIN_MB, mb_to_hold(formula))


def engine_buffers_mb(profile: CalibrationProfile) -> dict[str, int | None]:
    """Each engine's one shared buffer for this deployment, in MB (None: it uses no FlashInfer
    workspace for it)."""
    return {
        "vLLM": vllm_buffer_mb(profile),
        "SGLang": SGLANG_MB,
        "TensorRT-LLM": TENSORRT_LLM_MB,
        "MLC-LLM": MLC_LLM_MB,
    }


def own_int_mb(profile: CalibrationProfile, cuda_graphs: bool = True) -> int:
    """What the wrappers of an engine that builds them as vLLM and SGLang do make for themselves
    in int workspaces, in MB (and as many pinned on the host): FlashInfer's 8 MiB each, for a
    prefill wrapper, an eager decode wrapper and (``cuda_graphs``) a decode wrapper per graph
    batch size of the profile. No setting of theirs changes it."""
    wrappers = 2 + (len(profile.cuda_graph_batch_sizes) if cuda_graphs else 0)
    return wrappers * INT_DEFAULT_MB


__all__ = [
    "engine_buffers_mb",
    "own_int_mb",
    "vllm_buffer_mb",
    "vllm_formula",
    "vllm_formula_bytes",
]
