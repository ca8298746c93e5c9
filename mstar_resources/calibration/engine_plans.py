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
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Engine",
    "SplitSettings",
    "decode_graph_batch_sizes",
    "split_settings",
    "uses_tensor_cores",
]


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

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
SGLANG_TENSOR_CORE_GROUP = 4
"""SGLang plans tensor-core decode from this many query heads per KV head."""


@dataclass(frozen=True)
class SplitSettings:
    """How a plan splits the KV of a request: FlashInfer's ``fixed_split_size`` (-1: the
    scheduler picks the chunk) and ``disable_split_kv``."""

    fixed_split_size: int = -1
    disable_split_kv: bool = False


def _vllm_graph_token_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, q_len: int
) -> list[int]:
    top = min(max_num_seqs * q_len * 2, VLLM_MAX_GRAPH_TOKENS)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return [s for s in sizes if s <= top and s <= max_num_batched_tokens]


def _sglang_graph_batch_sizes(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return [s for s in sizes if s <= max_bs]


def decode_graph_batch_sizes(
    engine: Engine, max_num_seqs: int, max_num_batched_tokens: int, q_len_per_req: int = 1
) -> list[int]:
    """The decode batch sizes (requests) ``engine`` captures CUDA graphs for."""
    if engine is Engine.sglang:
        return _sglang_graph_batch_sizes(max_num_seqs)
    tokens = _vllm_graph_token_sizes(max_num_seqs, max_num_batched_tokens, q_len_per_req)
    decode_cap = min(q_len_per_req * max_num_seqs, max(tokens))
    # A decode graph of s tokens serves s // q_len_per_req requests of q_len_per_req tokens.
    return sorted({s // q_len_per_req for s in tokens if s <= decode_cap and s >= q_len_per_req})


def uses_tensor_cores(
    engine: Engine, num_qo_heads: int, num_kv_heads: int, kv_dtype: str, deterministic: bool = False
) -> bool:
    """Whether ``engine`` plans decode with tensor cores (FlashInfer's prefill scheduler), in its
    deterministic mode or not."""
    if engine is Engine.vllm or deterministic:
        return True
    group = num_qo_heads // num_kv_heads
    return kv_dtype in FP8_DTYPES or group >= SGLANG_TENSOR_CORE_GROUP


def split_settings(engine: Engine, deterministic: bool, decode: bool) -> SplitSettings:
    """How ``engine`` splits KV for a decode (``decode``) or a prefill plan, in its
    deterministic / batch-invariant mode or not."""
    if not deterministic:
        return SplitSettings()
    size = 2048 if decode else 4096
    # vLLM turns the split off for both; SGLang only under CUDA graphs (its decode graphs).
    return SplitSettings(size, disable_split_kv=engine is Engine.vllm or decode)
