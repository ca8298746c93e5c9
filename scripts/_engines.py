"""What inference engines reserve for FlashInfer's float workspace, for the benchmarks to compare.

Each engine makes one buffer and shares it among all its FlashInfer wrappers and CUDA-graph sizes:

- vLLM: ``max(394 MiB, max_num_batched_tokens x query heads per rank x head dim x 16 bytes)``
  (``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE``'s default in ``vllm/envs.py``; the per-token scaling
  from vLLM PR #48428). It plans FlashInfer MLA only on SM100 GPUs, so it has no figure for MLA.
- SGLang: ``SGLANG_FLASHINFER_WORKSPACE_SIZE``, 384 MiB by default (``python/sglang/srt/
  environ.py``; some architectures get 512 MiB), for its MLA wrappers too.
- TensorRT-LLM (PyTorch backend): 320 MiB, hard-coded.
- MLC-LLM / TVM: 768 MiB per KV cache.
"""

from __future__ import annotations

from typing import Any

from mstar_resources.calibration.calibrate import vllm_formula_bytes
from mstar_resources.calibration.profile import CalibrationProfile
from mstar_resources.floor import INT
from mstar_resources.units import mb_to_hold

VLLM_MIN_MB = 394


def vllm_buffer_mb(profile: CalibrationProfile) -> int | None:
    """vLLM's shared float workspace for the deployment, in MB (None for MLA models)."""
    formula = vllm_formula_bytes(profile)
    return None if formula is None else max(VLLM_MIN_MB, mb_to_hold(formula))


def engine_buffers_mb(profile: CalibrationProfile) -> dict[str, int | None]:
    """Each engine's one shared buffer for the deployment, in MB (None: it uses no FlashInfer
    workspace for it)."""
    return {"vLLM": vllm_buffer_mb(profile), "SGLang": 384, "TensorRT-LLM": 320, "MLC-LLM": 768}


def own_int_mb(profile: CalibrationProfile) -> int:
    """What vLLM's and SGLang's wrappers make for themselves in int workspaces, in MB (and as
    many pinned on the host): FlashInfer's 8 MiB each for a prefill, an eager decode and a decode
    wrapper per graph batch size. No setting of theirs changes it."""
    return (2 + len(profile.cuda_graph_batch_sizes)) * INT.default_mb


def decode_graph_batch_sizes(
    engine: str, max_num_seqs: int, max_num_batched_tokens: int
) -> list[int]:
    """The decode batch sizes ``engine`` (``vllm`` 0.33.0 or ``sglang`` 0.5.23) captures CUDA
    graphs for at these limits, one query token a request (what its plugin reads live)."""
    if engine == "sglang":  # arg_groups/cuda_graph_hook.py
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
                 *range(512, max_num_seqs + 1, 32)]  # fmt: skip
        return [s for s in sizes if s <= max_num_seqs]
    top = min(max_num_seqs * 2, 512)  # config/vllm.py: capture sizes in tokens, up to 512 on SM90
    tokens = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    tokens = [s for s in tokens if s <= top and s <= max_num_batched_tokens]
    return [s for s in tokens if s <= min(max_num_seqs, max(tokens))]


def engine_plans(
    engine: str, model: Any, max_num_seqs: int, max_num_batched_tokens: int
) -> list[str]:
    """The ``calibration`` overrides that plan the ``decode`` label as ``engine`` does at these
    limits: backend ``auto``, tensor cores (vLLM always; SGLang for an fp8 KV cache or GQA groups
    of 4 or more), its decode graph batch sizes. For benchmarks that vary the limits."""
    group = model.num_qo_heads // model.num_kv_heads
    tensor_cores = engine == "vllm" or str(model.kv_dtype).startswith("float8") or group >= 4
    sizes = decode_graph_batch_sizes(engine, max_num_seqs, max_num_batched_tokens)
    return [
        "calibration.plans.decode.backend=auto",
        f"calibration.plans.decode.tensor_cores={str(tensor_cores).lower()}",
        f"calibration.cuda_graph_batch_sizes=[{','.join(map(str, sizes))}]",
    ]
