"""The plans vLLM and SGLang make, so that a calibration (``calibration.engine``) measures them
and not a guess: their decode graph batch sizes, tensor-core choice and KV split, as read in the
wheels of the versions below. Torch-free, like the profile.

vLLM 0.33.0 (``v1/attention/backends/flashinfer.py``, ``config/vllm.py``): decode always on
tensor cores with backend ``auto``, one wrapper per graph size; graph sizes in tokens, capped at
512; batch-invariant mode splits KV in fixed chunks and turns the split off. It plans no
FlashInfer MLA on SM90 GPUs. Its buffer is the larger of ``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE``
and :func:`vllm_formula`.

SGLang 0.5.23 (``layers/attention/flashinfer_backend.py``, ``arg_groups/cuda_graph_hook.py``):
decode on tensor cores for an fp8 KV cache or GQA groups of 4 or more (``should_use_tensor_core``),
backend ``auto``. Its deterministic mode splits in fixed chunks eagerly and not at all under
graphs; a profile of decode under graphs measures the graphs, and its eager decode can need more.
"""

from __future__ import annotations

from enum import Enum


class Engine(Enum):
    """An engine whose plans a profile can follow (``calibration.engine``)."""

    vllm = "vllm"
    """vLLM 0.33.0 (FlashInfer 0.7.2.post1)."""
    sglang = "sglang"
    """SGLang 0.5.23 (FlashInfer 0.7.2)."""


VERSIONS = {Engine.vllm: "vLLM 0.33.0", Engine.sglang: "SGLang 0.5.23"}
"""The engine versions the presets follow, in words."""

VLLM_MAX_GRAPH_TOKENS = 512
"""vLLM's default ``max_cudagraph_capture_size`` cap on an SM90 GPU."""


def decode_graph_batch_sizes(
    engine: Engine, max_num_seqs: int, max_num_batched_tokens: int, q_len_per_req: int = 1
) -> list[int]:
    """The decode batch sizes (requests) ``engine`` captures CUDA graphs for."""
    if engine is Engine.sglang:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
                 *range(512, max_num_seqs + 1, 32)]  # fmt: skip
        return [s for s in sizes if s <= max_num_seqs]
    top = min(max_num_seqs * q_len_per_req * 2, VLLM_MAX_GRAPH_TOKENS)
    tokens = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    tokens = [s for s in tokens if s <= top and s <= max_num_batched_tokens]
    decode_cap = min(q_len_per_req * max_num_seqs, max(tokens))
    # A decode graph of s tokens serves s // q_len_per_req requests of q_len_per_req tokens.
    return sorted({s // q_len_per_req for s in tokens if q_len_per_req <= s <= decode_cap})


def uses_tensor_cores(
    engine: Engine, num_qo_heads: int, num_kv_heads: int, kv_dtype: str, deterministic: bool
) -> bool:
    """Whether ``engine`` plans decode with tensor cores (FlashInfer's prefill scheduler)."""
    if engine is Engine.vllm or deterministic:
        return True
    return kv_dtype.startswith("float8") or num_qo_heads // num_kv_heads >= 4


def split_settings(engine: Engine, deterministic: bool, decode: bool) -> tuple[int, bool]:
    """How ``engine`` splits KV for a decode (``decode``) or a prefill plan: the plan's
    ``fixed_split_size`` (-1: the scheduler picks) and ``disable_split_kv``."""
    if not deterministic:
        return -1, False
    # vLLM turns the split off for both; SGLang only under CUDA graphs (its decode graphs).
    return (2048 if decode else 4096), engine is Engine.vllm or decode


def vllm_formula(batched_tokens: int, heads: int, head_dim: int, per: int = 16) -> int:
    """vLLM's per-token floor of its FlashInfer buffer, in bytes: ``max_num_batched_tokens`` x
    query heads per rank x head dim x ``per`` (``FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM``,
    16 in vLLM 0.26 and 0.33; the vLLM plugin passes the running vLLM's own)."""
    return batched_tokens * heads * head_dim * per
