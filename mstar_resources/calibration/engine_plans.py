"""The plans vLLM and SGLang make, so that a calibration measures them and not a guess.

``calibration.engine`` names one of :class:`Engine`; the profile then plans its labels and
captures its graph batch sizes as that engine version does (:func:`decode_graph_batch_sizes`,
:func:`uses_tensor_cores`, :func:`split_settings`), from the engine's limits and the model's heads
and KV dtype. Read in the wheels of the versions named below; torch-free, like the profile.

vLLM 0.33.0 (``v1/attention/backends/flashinfer.py``, ``config/vllm.py``):

- Decode is always ``BatchDecodeWithPagedKVCacheWrapper(..., use_tensor_cores=True,
  backend="auto")``, one wrapper per CUDA-graph size, re-planned each step with
  ``fixed_split_size=-1`` and ``disable_split_kv=False``.
- Graph sizes (in tokens) are ``[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)`` with
  ``max = min(max_num_seqs x q_len_per_req x 2, 512)``, none above ``max_num_batched_tokens``;
  decode graphs serve batches of up to ``min(q_len_per_req x max_num_seqs, max)`` tokens, each of
  ``q_len_per_req`` tokens a request.
- Batch-invariant mode: decode passes ``fixed_split_size=2048``, prefill 4096, and
  ``disable_split_kv=True`` turns the split off for both.
- vLLM plans no FlashInfer MLA on SM90 GPUs, so a vLLM profile with ``mla`` plans is refused.

SGLang 0.5.23 (``layers/attention/flashinfer_backend.py``, ``arg_groups/cuda_graph_hook.py``):

- Decode uses tensor cores when the KV cache is fp8, or when the GQA group (query heads per KV
  head) is 4 or more (``should_use_tensor_core``); backend ``auto``.
- Decode graph sizes: ``[1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512, 16) +
  range(512, max_bs + 1, 32)``, with ``max_bs`` the most sequences in a batch.
- Deterministic mode: tensor-core decode with ``fixed_split_size=2048``, prefill 4096, no KV
  split under CUDA graphs (its decode graphs). Its eager decode splits in those chunks, which a
  profile of decode under graphs does not plan (FlashInfer refuses a fixed split under a graph):
  such a profile measures the graphs' decode, and SGLang's eager decode can need more.
- vLLM's buffer is the larger of ``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE`` and
  :func:`vllm_formula`.
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
