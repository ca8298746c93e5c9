"""``MSTAR_RESOURCES_SGLANG=auto``: each floor measured in SGLang's worker for what its FlashInfer
backend will plan (docs/sglang.md), as read in SGLang 0.5.17-0.5.23; what calibration's profile
cannot hold is left to SGLang, the log saying why (:func:`_not_planned`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...calibration.profile import CalibrationProfile, load_profile
from ...resolver import ResolvedResource, declared
from ...units import round_up
from ..plugin import dtype_name

MOST_RUNNING_REQUESTS = 4096
"""SGLang's cap on running requests a data-parallel rank where ``--max-running-requests`` is unset
(``resolve_max_num_reqs``, read in 0.5.17 to 0.5.23). A copy: SGLang settles it inside
``alloc_memory_pool``, after the plugin reserves; it can go once SGLang settles it before."""

PREFILL_LABELS = {"prefill": "paged_prefill", "ragged_prefill": "ragged_prefill"}
"""The prefill workspace's labels, each planned as its wrapper's kind."""


@dataclass(frozen=True)
class SglangPlans:
    """What SGLang's FlashInfer backend will plan in this worker."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_dtype: str
    kv_dtype: str
    max_running_requests: int
    """The most requests in a decode batch (an upper bound, known before the KV pool)."""
    max_prefill_tokens: int  # the most tokens in one prefill plan
    context_len: int
    decode_graph_batch_sizes: tuple[int, ...]  # empty where SGLang captures no decode graphs
    decode_tensor_cores: bool = False
    """Whether SGLang's backend decodes on tensor cores: its own ``should_use_tensor_core``."""

    def describe(self) -> str:
        graphs = self.decode_graph_batch_sizes
        captured = f"decode graphs up to {max(graphs)}" if graphs else "no decode graphs"
        return (
            f"{self.num_qo_heads}/{self.num_kv_heads} heads of {self.head_dim}, page "
            f"{self.page_size}, KV {self.kv_dtype}; {self.max_running_requests} requests, "
            f"{self.max_prefill_tokens} prefill tokens, context {self.context_len}; {captured}"
        )

    def profile(self) -> CalibrationProfile:
        """Calibration's profile of these plans: decode on tensor cores (backend ``auto``) where
        SGLang's backend does, at its captured graph batch sizes."""
        tensor_cores = self.decode_tensor_cores
        node = {
            "model": {
                "num_qo_heads": self.num_qo_heads,
                "num_kv_heads": self.num_kv_heads,
                "head_dim": self.head_dim,
                "page_size": self.page_size,
                "q_dtype": self.q_dtype,
                "kv_dtype": self.kv_dtype,
            },
            "limits": {
                "max_num_seqs": self.max_running_requests,
                "max_num_batched_tokens": self.max_prefill_tokens,
                "max_model_len": self.context_len,
            },
            # No graphs: the decode resource has no graph slot, but the profile wants a list.
            "cuda_graph_batch_sizes": list(self.decode_graph_batch_sizes) or [1],
            "plans": {
                **{label: {"kind": kind} for label, kind in PREFILL_LABELS.items()},
                "decode": {"kind": "decode", "backend": "auto", "tensor_cores": tensor_cores},
            },
        }
        return load_profile(node)

    def resources(
        self, floors: Mapping[str, tuple[int, int]] | None = None
    ) -> list[ResolvedResource]:
        """The resources measured, declaring ``floors`` (by path: MB and int MB): prefill (both
        labels), and decode, under graphs if captured."""
        floors = floors or {}
        graphs = [0] if self.decode_graph_batch_sizes else []
        served = {"attn.prefill": (list(PREFILL_LABELS), []), "attn.decode": (["decode"], graphs)}
        return [declared(path, "attention", labels, slots, *floors.get(path, (None, None)))
                for path, (labels, slots) in served.items()]  # fmt: skip


def sglang_plans(
    runner: Any, context: Any, should_use_tensor_core: Callable[..., bool]
) -> SglangPlans | str:
    """What SGLang's FlashInfer backend of ``runner`` will plan under the settings of ``context``
    (its ``runtime_context``), its decode on tensor cores where SGLang's own
    ``should_use_tensor_core`` says (as the backend asks it); where the profile cannot hold it,
    why."""
    if (reason := _not_planned(runner, context)) is not None:
        return reason
    model = runner.model_config
    parallel = context.get_parallel()
    schedule = context.get_schedule()
    graphs = context.get_exec().graph.cuda_graph_config
    tp = parallel.attn_tp_size
    requests = schedule.max_running_requests
    most = MOST_RUNNING_REQUESTS if requests is None else max(1, requests // parallel.attn_dp_size)
    # SGLang pads its batches (graph and eager) to an alignment of at most 2 (two-batch overlap)
    # x the attention TP ranks (a gathered buffer) x the context-parallel ranks.
    padded = round_up(most, 2 * tp * parallel.attn_cp_size)
    chunk = schedule.chunked_prefill_size
    prompt = chunk if chunk is not None and chunk > 0 else model.context_len
    # A prefill graph (breakable: attention eager, on the same wrappers) pads a batch up to its
    # largest captured token count.
    prefill = graphs.prefill
    prefill_graph = max([*(prefill.bs or ()), prefill.max_bs or 0]) if _captures(prefill) else 0
    heads, kv_heads = model.num_attention_heads // tp, model.get_num_kv_heads(tp)
    return SglangPlans(
        num_qo_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=model.head_dim,
        page_size=runner.page_size,
        q_dtype=dtype_name(model.dtype),
        kv_dtype=dtype_name(runner.kv_cache_dtype),
        max_running_requests=padded,
        max_prefill_tokens=max(schedule.max_prefill_tokens, prompt, prefill_graph),
        context_len=model.context_len,
        decode_graph_batch_sizes=_graph_batch_sizes(graphs.decode, most, padded),
        decode_tensor_cores=bool(should_use_tensor_core(
            kv_cache_dtype=runner.kv_cache_dtype, num_attention_heads=heads,
            num_kv_heads=kv_heads,
        )),
    )  # fmt: skip


def _not_planned(runner: Any, context: Any) -> str | None:
    """Why the profile cannot hold what SGLang will plan (None: it can)."""
    model = runner.model_config
    dcp = getattr(context.get_parallel(), "attn_dcp_size", 1) or 1
    if dcp > 1:  # 0.5.18+: the backend plans get_num_kv_heads(attn_tp_size, attn_dcp_size)
        return f"attention decode-context parallelism (attn_dcp_size {dcp}) splits its KV heads"
    if runner.sliding_window_size is not None:
        return "the model has sliding-window layers, planned on a second wrapper"
    if model.is_encoder_decoder:
        return "the model has cross-attention, planned on a second wrapper"
    if model.get_max_num_attention_heads() != model.num_attention_heads:
        return "its layers have different numbers of query heads"
    kv_dtype = dtype_name(runner.kv_cache_dtype)
    if "float4" in kv_dtype or kv_dtype == "uint8":
        return f"its KV cache ({kv_dtype}) is planned through an FP8 stand-in"
    speculative = context.get_spec().speculative_algorithm
    if speculative is not None and str(getattr(speculative, "name", speculative)).upper() != "NONE":
        return f"speculative decoding ({speculative}) plans draft and verify batches on it"
    execution = context.get_exec()
    # Diffusion LLMs (0.5.17+): SGLang captures their decode graphs with DLLM_EXTEND batches,
    # planned as prefill on the decode workspace.
    if (dllm := execution.dllm.dllm_algorithm) is not None:
        return f"diffusion-LLM decoding ({dllm}) plans prefill batches on the decode wrappers"
    # Backends built on SGLang's FlashInfer one with shapes of their own: LLaDA2's CFG prefill
    # (0.5.22+, its own ragged fa2 wrapper), MiniCPM's sparse head groups (0.5.19+, one KV head).
    named = [getattr(execution.kernel, f"{phase}attention_backend", None)
             for phase in ("", "decode_", "prefill_")]  # fmt: skip
    if own := [str(name) for name in named if str(name).startswith(("llada2", "minicpm"))]:
        return f"its attention backend {own[0]} plans FlashInfer wrappers of shapes of its own"
    if execution.deterministic.enable_deterministic_inference:
        # Its eager decode splits KV in fixed chunks and its graphs do not: two plans of one
        # label that the profile plans as one.
        return "deterministic inference plans decode with two KV splits"
    return None


def _graph_batch_sizes(decode: Any, most: int, padded: int) -> tuple[int, ...]:
    """The decode batch sizes SGLang may capture, as ``get_batch_sizes_to_capture`` clamps them:
    those up to ``most``, plus ``padded`` (``most`` aligned) where a larger one is dropped."""
    if not _captures(decode):
        return ()
    sizes = set(decode.bs or ())
    if sizes and max(sizes) > most:
        sizes = {b for b in sizes if b <= most} | {padded}
    return tuple(sorted(sizes))


def _captures(phase: Any) -> bool:
    """Whether SGLang captures CUDA graphs for a phase of its ``cuda_graph_config``."""
    return str(getattr(phase.backend, "value", phase.backend)).lower() != "disabled"


def measure(plans: SglangPlans, device: Any) -> tuple[list[ResolvedResource], dict[str, str]]:
    """The resources of ``plans``, each floor what its plans need on ``device``, and whence."""
    from ...calibration.calibrate import declared_mbs, measure_all, per_resource

    measured = measure_all(plans.resources(), plans.profile(), device, show_progress=False)
    needs = per_resource(measured)
    provenance = {  # FlashInfer's FA3 prefill plans take no float workspace: no worst to name
        need.path: f"measured here: need {need.need_bytes:,} bytes"
        + (f", worst {need.worst}" if need.need_bytes else " (no plan takes any)")
        + f", by {need.method}, for {plans.describe()}"
        for need in needs
    }
    floors = dict(zip([need.path for need in needs], declared_mbs(needs, margin=0.0), strict=True))
    return plans.resources(floors), provenance
