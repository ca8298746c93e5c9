"""What vLLM's FlashInfer metadata builders will plan and run (heads, page size, query dtypes, each
phase's kernel), read from builders made on the CPU as vLLM makes them (:func:`builder_plans`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ...resolver import ResolvedResource, declared
from ...units import plural
from ..plugin import dtype_name
from ..setting import AUTO

if TYPE_CHECKING:
    from ...calibration.calibrate import Measured
    from ...calibration.profile import CalibrationProfile

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")  # the labels vLLM's wrappers plan as
Profiled = tuple[Role, "BuilderPlans", "CalibrationProfile"]  # a builder's plans of a role
FLASHINFER = "FLASHINFER"  # FlashInferBackend.get_name()
NATIVE = "flashinfer-native"  # FlashInfer's own wrappers, as vLLM's log names them
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"


@dataclass(frozen=True)
class BuilderPlans:
    """What one FlashInfer metadata builder of vLLM's plans and runs."""

    group: int  # its KV-cache group
    layers: tuple[str, ...]
    num_qo_heads: int  # per rank
    num_kv_heads: int
    head_dim: int
    page_size: int  # the kernel's block size, which FlashInfer plans with
    kv_dtype: str
    q_dtypes: Mapping[Role, str]
    """Each phase's query dtype (on SM90 with an FP8 KV cache, decode keeps the model's dtype)."""
    o_dtype: str  # attention's output: the model's dtype, for an FP8 query too
    kernels: Mapping[Role, str]  # each phase's: NATIVE, xqa or trtllm-gen
    dcp_world_size: int = 1  # the query heads of every DCP rank are planned together
    decode_q_len: int = 1
    """The most query tokens a decode request has: 1 + speculative tokens where the release's
    decode kernel takes them (vLLM's ``reorder_batch_threshold``)."""
    decode_graph_max_batch: int | None = None  # of a FULL CUDA graph; None: no decode graphs
    non_causal: bool = False
    """vLLM also builds a native non-causal prefill wrapper (attention_config.use_non_causal)."""
    trtllm_dcp_prefill: bool = False
    """Its DCP prefill runs trtllm-gen's context kernel on vLLM's TRT-LLM workspace where that
    fits (``use_trtllm_dcp_prefill``, 0.33+), beside its native wrappers."""
    fixed_split_sizes: Mapping[Role, int] = field(default_factory=lambda: dict.fromkeys(ROLES, -1))
    """Each phase's fixed KV split, as the builder plans it (-1: FlashInfer's scheduler picks;
    ``VLLM_BATCH_INVARIANT`` sets them), with ``disable_split_kv``."""
    disable_split_kv: bool = False

    def native(self, role: Role) -> bool:
        """Whether a ``role`` plan of this builder runs on FlashInfer's native wrappers."""
        return self.kernels[role] == NATIVE or (role == "prefill" and self.non_causal)

    def graphs(self, role: Role) -> bool:
        """Whether its ``role`` plans run under CUDA graphs (decode, where it captures them)."""
        return role == "decode" and self.decode_graph_max_batch is not None

    def describe(self) -> str:
        return (
            f"KV-cache group {self.group} ({plural(len(self.layers), 'layer')}: "
            f"{self.num_qo_heads}/{self.num_kv_heads} heads of {self.head_dim}, page "
            f"{self.page_size}, KV {self.kv_dtype})"
        )


@dataclass(frozen=True)
class VllmFunctions:
    """The parts of vLLM :func:`plans_of_groups` works with (stand-ins in the CPU tests)."""

    make_builder: Callable[[Any, list[str]], Any]  # (kv_cache_spec, layer_names) -> builder
    select_block_size: Callable[[int, list[Any]], int]  # select_common_block_size
    use_trtllm_attention: Callable[..., bool]
    uniform_type: Any  # UniformTypeKVCacheSpecs: one spec per layer


def plans_of_groups(
    vllm_config: Any, groups: Sequence[Any], layers: Mapping[str, Any], vllm: VllmFunctions
) -> list[BuilderPlans]:
    """What each FlashInfer builder of the KV-cache ``groups`` plans, made as vLLM makes them."""
    found: list[BuilderPlans] = []
    for group_id, group in enumerate(groups):
        names = [name for name in group.layer_names if name in layers]
        backends = {name: layers[name].get_attn_backend() for name in names}
        ours = [name for name in names if backends[name].get_name() == FLASHINFER]
        if not ours:
            continue
        distinct = list({b.__qualname__: b for b in backends.values()}.values())
        kernel_block = _kernel_block_size(group.kv_cache_spec, distinct, vllm)
        builders: dict[tuple[Any, int], list[str]] = {}
        for name in ours:
            spec = group.kv_cache_spec
            if isinstance(spec, vllm.uniform_type):
                spec = spec.kv_cache_specs[name]
            builders.setdefault((spec, getattr(layers[name], "num_heads", 0)), []).append(name)
        for (spec, _), layer_names in builders.items():
            builder = vllm.make_builder(spec.copy_with_new_block_size(kernel_block), layer_names)
            found.append(read_builder(builder, group_id, layer_names, vllm_config, vllm))
    return found


def _kernel_block_size(spec: Any, backends: list[Any], vllm: VllmFunctions) -> int:
    """The block size a group's kernels plan with, as vLLM's ``prepare_kernel_block_sizes`` picks
    it: the manager's where its spec has no layer views (0.30+), else the largest the group's
    backends all support that divides it."""
    first = (
        next(iter(spec.kv_cache_specs.values())) if isinstance(spec, vllm.uniform_type) else spec
    )
    if getattr(first, "has_layer_views", True) is False:
        return int(spec.block_size)
    return vllm.select_block_size(spec.block_size, backends)


def read_builder(
    builder: Any, group: int, layers: Sequence[str], vllm_config: Any, vllm: VllmFunctions
) -> BuilderPlans:
    """What ``builder`` (a FlashInfer metadata builder vLLM's ``__init__`` set up) will plan."""
    decode = NATIVE
    if builder.use_trtllm_decode_attention:
        decode = builder.flashinfer_trtllm_api_decode_kernel.value
    # Prefill's kernel is vLLM's own use_trtllm_attention, asked with the largest batch: the
    # builder decides it per batch in build(), not in __init__ (0.26.0 to 0.34.0), so this call
    # copies build()'s arguments; it can go once the builder records its decision.
    attention = vllm_config.attention_config
    prefill_trtllm = vllm.use_trtllm_attention(
        builder.num_qo_heads,
        builder.num_kv_heads,
        vllm_config.scheduler_config.max_num_batched_tokens,
        vllm_config.model_config.max_model_len,
        builder.dcp_world_size,
        builder.cache_dtype,
        builder.q_data_type_prefill,
        is_prefill=True,
        force_use_trtllm=builder.page_size >= 128 or attention.use_trtllm_attention,
        has_sinks=builder.has_sinks,
        has_spec=builder.reorder_batch_threshold > 1,
    )
    graph_max_batch = builder._decode_cudagraph_max_bs if builder.enable_cuda_graph else None
    return BuilderPlans(
        group=group,
        layers=tuple(layers),
        num_qo_heads=builder.num_qo_heads,
        num_kv_heads=builder.num_kv_heads,
        head_dim=builder.head_dim,
        page_size=builder.page_size,
        kv_dtype=dtype_name(builder.kv_cache_dtype),
        q_dtypes={
            "prefill": dtype_name(builder.q_data_type_prefill),
            "decode": dtype_name(builder.q_data_type_decode),
        },
        o_dtype=dtype_name(vllm_config.model_config.dtype),
        kernels={"prefill": "trtllm-gen" if prefill_trtllm else NATIVE, "decode": decode},
        dcp_world_size=builder.dcp_world_size,
        # vLLM's threshold counts speculative tokens wherever the release decodes them, else is 1.
        decode_q_len=max(1, int(builder.reorder_batch_threshold or 1)),
        decode_graph_max_batch=graph_max_batch,
        non_causal=bool(getattr(attention, "use_non_causal", False)),
        trtllm_dcp_prefill=bool(getattr(builder, "use_trtllm_dcp_prefill", False)),
        fixed_split_sizes={
            "prefill": int(builder.prefill_fixed_split_size),
            "decode": int(builder.decode_fixed_split_size),
        },
        disable_split_kv=bool(builder.disable_split_kv),
    )


@dataclass(frozen=True)
class EngineReading:
    """What the plugin reads of one vLLM engine at its memory profile, before it reserves."""

    plans: tuple[BuilderPlans, ...] = ()  # each FlashInfer metadata builder's
    native_roles: tuple[Role, ...] = ()  # the phases some builder runs on native wrappers
    vllm_bytes: int | None = None  # the buffer vLLM would make for each builder
    vllm_how: str = ""  # and how vLLM sizes it
    kv_cache_extensible: bool = False  # 0.34's enable_extensible_kv_cache: sized after capture
    vllm_outside_budget: bool = False
    """vLLM makes its buffer after it sizes the KV cache (the V2 runner; V1's profile counts it)."""

    def kernels(self, role: Role) -> str:
        """The kernels the builders run ``role`` on, named once each."""
        return ", ".join(sorted({p.kernels[role] for p in self.plans}))

    def builder_lines(self) -> list[str]:
        """A line for each builder: its group and the kernel and query dtype of each phase."""
        return [
            f"vLLM's FlashInfer builder for {p.describe()}: "
            + ", ".join(f"{role} on {p.kernels[role]} (q {p.q_dtypes[role]})" for role in ROLES)
            for p in self.plans
        ]


def read_engine(runner: Any, measuring: bool) -> EngineReading | str:
    """What ``runner`` (vLLM's ``GPUModelRunner``, its model loaded) will plan and make; where the
    plugin cannot serve it (``measuring``: for ``auto``), why."""
    config = runner.vllm_config
    if (reason := uncovered_attention(config)) is not None:
        return reason
    plans = tuple(builder_plans(runner))
    if measuring and (packed := unmeasured_kv(plans)) is not None:
        return packed
    vllm_bytes, vllm_how = vllm_buffer_bytes(config, plans)
    extensible = getattr(config.cache_config, "enable_extensible_kv_cache", None) is True
    return EngineReading(
        plans=plans,
        native_roles=tuple(role for role in ROLES if any(p.native(role) for p in plans)),
        vllm_bytes=vllm_bytes,
        vllm_how=vllm_how,
        kv_cache_extensible=extensible,
        vllm_outside_budget=not extensible and type(runner).__module__ == V2_RUNNER,
    )


def builder_plans(runner: Any) -> list[BuilderPlans]:
    """What each FlashInfer metadata builder of ``runner`` (vLLM's ``GPUModelRunner``, its model
    loaded) will plan, from builders made here on the CPU as vLLM will make them."""
    import torch
    import vllm.v1.attention.backends.flashinfer as backend
    from vllm.config.vllm import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.utils.flashinfer import use_trtllm_attention
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
    from vllm.v1.worker.utils import select_common_block_size

    config = runner.vllm_config
    cpu = torch.device("cpu")  # the builder's index buffers: on the host, never the GPU

    def make_builder(spec: Any, layer_names: list[str]) -> Any:
        return backend.FlashInferMetadataBuilder(spec, layer_names, config, cpu)

    vllm = VllmFunctions(
        make_builder, select_common_block_size, use_trtllm_attention, UniformTypeKVCacheSpecs
    )
    with set_current_vllm_config(config):
        groups = _kv_cache_groups(config, runner.get_kv_cache_spec())
        layers = get_layers_from_vllm_config(config, AttentionLayerBase)
        return plans_of_groups(config, groups, layers, vllm)


def _kv_cache_groups(config: Any, specs: dict[str, Any]) -> list[Any]:
    """vLLM's KV-cache groups: ``get_kv_cache_groups`` until 0.32, then from its config builder."""
    try:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
    except ImportError:
        from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
        from vllm.v1.core.kv_cache_planning import get_kv_cache_groups_from_builder

        builder = get_kv_cache_config_builder(config)
        return list(get_kv_cache_groups_from_builder(builder, config, specs))
    return list(get_kv_cache_groups(config, specs))


def vllm_envs() -> Any:
    import vllm.envs

    return vllm.envs


# -- a builder's plans as a calibration profile -------------------------------------------------


def builder_profiles(
    plans: Sequence[BuilderPlans], roles: Sequence[Role], vllm_config: Any
) -> list[Profiled]:
    """The profile of each builder's plans of each of ``roles`` it runs on native wrappers
    (:func:`profile_node`), once for builders alike."""
    from ...calibration.profile import load_profile

    nodes = [  # every node, then every profile: each step for all at once
        (role, builder, profile_node(builder, role, vllm_config))
        for role in roles
        for builder in plans
        if builder.native(role)
    ]
    made: dict[str, Profiled] = {}
    for role, builder, node in nodes:
        profile = load_profile(node)
        made.setdefault(repr(profile), (role, builder, profile))
    return list(made.values())


def profile_node(plans: BuilderPlans, role: Role, vllm_config: Any) -> dict[str, Any]:
    """The calibration profile (its node) of ``plans``' ``role`` plans as vLLM 0.33 makes them:
    decode on tensor cores (backend ``auto``) at its graph batch sizes; its KV split fixed and
    turned off where the builder plans so (``VLLM_BATCH_INVARIANT``)."""
    scheduler, model = vllm_config.scheduler_config, vllm_config.model_config
    plan: dict[str, Any] = {"kind": "paged_prefill" if role == "prefill" else "decode"}
    plan["backend"] = "auto"  # vLLM's prefill and decode wrappers take backend "auto"
    sizes: set[int] = set()
    if role == "decode":
        q_len, top = plans.decode_q_len, plans.decode_graph_max_batch or 0
        plan.update(tensor_cores=True, q_len_per_req=q_len)
        # its FULL graphs' batches (requests): vLLM's capture sizes (tokens) up to the builder's
        # cap, over q_len, at most max_num_seqs
        captured = vllm_config.compilation_config.cudagraph_capture_sizes or []
        sizes = {min(s // q_len, scheduler.max_num_seqs) for s in captured if q_len <= s <= top}
    split = plans.fixed_split_sizes[role]
    if split > 0 or plans.disable_split_kv:  # the builder's, as it plans each phase
        plan.update(fixed_split_size=split, disable_split_kv=plans.disable_split_kv)
    return {
        "model": {
            "num_qo_heads": plans.num_qo_heads * plans.dcp_world_size,
            "num_kv_heads": plans.num_kv_heads,
            "head_dim": plans.head_dim,
            "page_size": plans.page_size,
            "q_dtype": plans.q_dtypes[role],
            "kv_dtype": plans.kv_dtype,
            "o_dtype": plans.o_dtype,
        },
        "limits": {
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "max_model_len": model.max_model_len,
        },
        "cuda_graph_batch_sizes": sorted(sizes) or [1],
        "plans": {role: plan},
    }


def measured_records(
    profiles: Sequence[Profiled],
    needs: Sequence[Measured],
    floors: Sequence[tuple[int, int]],
    setting: str,
) -> tuple[Sequence[ResolvedResource], dict[str, str]]:
    """Each phase's resource, declaring the floors of the most any builder's plans need (the
    ``needs`` of ``profiles`` and their ``floors``, in order), and whence, by path."""
    measured: dict[Role, list[tuple[Measured, tuple[int, int], BuilderPlans]]] = {}
    for (role, builder, _), need, mbs in zip(profiles, needs, floors, strict=True):
        measured.setdefault(role, []).append((need, mbs, builder))
    served, provenance = [], {}  # each phase, whether under graphs, its floors; whence
    for role, found in measured.items():
        need, (mb, _), builder = max(found, key=lambda each: each[0].need_bytes)
        # Only decode wrappers are given the int workspace (route()); vLLM's prefill wrappers
        # keep their own, so none is reserved for them, nor where no int need was measured.
        ints = [(each.int_need_bytes, mbs[1]) for each, mbs, _ in found]
        every = role == "decode" and all(int_need is not None for int_need, _ in ints)
        int_need, int_mb = max(ints) if every else (None, 0)
        served.append((role, builder.graphs(role), mb, int_mb))
        provenance[f"attn.{role}"] = (
            f"measured here ({setting}): need {need.need_bytes:,} bytes"
            # FlashInfer's FA3 prefill (an FP8 query on SM90) takes none: no worst shape to name
            + (f", worst {need.worst}" if need.need_bytes else " (no plan takes any)")
            + f", by {need.method}, for {builder.describe()}"
            + (f", the most of {len(found)} builders" if len(found) > 1 else "")
            + (", no int workspace" if int_need is None else f", int need {int_need:,} bytes")
        )
    return serving_records(served), provenance


def serving_records(
    served: Sequence[tuple[Role, bool, int | None, int | None]],
) -> list[ResolvedResource]:
    """The resource each ``(role, graphs, declared_mb, int_declared_mb)`` is measured in and
    served from (in CUDA graphs' slot 0 where ``graphs``), declaring those floors."""
    return [
        declared(f"attn.{role}", "attention", [role], [0] if graphs else [], mb, int_mb)
        for role, graphs, mb, int_mb in served
    ]


# -- the model's attention, and vLLM's own buffers ----------------------------------------------


def uncovered_attention(vllm_config: Any) -> str | None:
    """Why the plugin cannot serve this model's attention (None: it can): no FlashInfer layer, or
    a FlashInfer backend other than the plain one (MLA)."""
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
    names = {layer.get_attn_backend().get_name() for layer in layers.values()}
    if FLASHINFER not in names:
        found = ", ".join(sorted(names)) or "no attention backend"
        return f"the model's attention runs on {found}, not FlashInfer ({FLASHINFER})"
    if others := sorted(name for name in names if FLASHINFER in name and name != FLASHINFER):
        return (
            f"the model also uses {', '.join(others)}, whose buffers this plugin does not "
            "manage; it serves vLLM's FLASHINFER backend alone"
        )
    return None


def vllm_buffer_bytes(vllm_config: Any, plans: Sequence[BuilderPlans]) -> tuple[int, str]:
    """The float buffer vLLM would make for the largest of ``plans``' builders, and how."""
    import vllm.v1.attention.backends.flashinfer as backend

    from ...calibration.calibrate import vllm_formula

    if vllm_envs().VLLM_BATCH_INVARIANT:
        size = backend.FLASHINFER_WORKSPACE_BUFFER_SIZE_BATCH_INVARIANT
        return size, f"VLLM_BATCH_INVARIANT's {size:,}"
    tokens = vllm_config.scheduler_config.max_num_batched_tokens
    widest = max(plans, key=lambda p: p.num_qo_heads * p.head_dim)
    per = backend.FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM
    formula = vllm_formula(tokens, widest.num_qo_heads, widest.head_dim, per)
    setting = vllm_envs().VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE
    how = (
        f"max(VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE={setting:,}, {tokens:,} batched tokens x "
        f"{widest.num_qo_heads} heads x {widest.head_dim} x {per} = {formula:,})"
    )
    return max(setting, formula), how


def trtllm_kernels(plans: Sequence[BuilderPlans]) -> Iterator[tuple[BuilderPlans, Role, str]]:
    """Each (builder, phase) that runs TRT-LLM's kernels (XQA, trtllm-gen), with the kernel."""
    for builder in plans:
        for role in ROLES:
            if builder.kernels[role] != NATIVE:
                yield builder, role, builder.kernels[role]
            elif role == "prefill" and builder.trtllm_dcp_prefill:
                yield builder, role, "trtllm-gen (DCP context)"


def trtllm_workspace_bound(
    plans: Sequence[BuilderPlans], vllm_config: Any, sm_count: int, flashinfer: str
) -> tuple[int, str]:
    """The most vLLM's TRT-LLM kernels can touch of their workspace, over every builder that runs
    them, and how; a DCP context run (0.33+) checks its own fit against vLLM's size, kept."""
    from ...attn import trtllm_workspace as bound

    scheduler = vllm_config.scheduler_config
    batch, tokens = scheduler.max_num_seqs, scheduler.max_num_batched_tokens
    counters = bound.counters_in_workspace(flashinfer)
    sizes: list[tuple[int, str]] = []
    for builder, role, kernel in trtllm_kernels(plans):
        heads = builder.num_qo_heads * builder.dcp_world_size
        if kernel == "xqa":
            need = bound.xqa_workspace_bytes(
                batch=batch, num_qo_heads=builder.num_qo_heads,
                num_kv_heads=builder.num_kv_heads, head_dim=builder.head_dim,
                # the worst over every page-table width: the split is capped by the SMs
                max_seq_len=sm_count * bound.XQA_MHA_TILE_TOKENS, sm_count=sm_count,
                q_len_per_req=builder.decode_q_len,
                hopper_fp8_kv=builder.kv_dtype.startswith("float8"),
            )  # fmt: skip
        elif kernel == "trtllm-gen":
            need = bound.trtllm_gen_workspace_bytes(
                batch=batch, num_qo_heads=heads, head_dim_vo=builder.head_dim,
                sm_count=sm_count,
                max_q_len=tokens if role == "prefill" else builder.decode_q_len,
                # LSE: a DCP decode's (its prefill runs the DCP context, below)
                return_lse=role == "decode" and builder.dcp_world_size > 1,
                counters_in_workspace=counters,
            )  # fmt: skip
        else:  # the DCP context, which checks its own fit
            need = vllm_envs().VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE
        sizes.append((need, f"{kernel} {role} for {builder.describe()}: {need:,}"))
    most = max(need for need, _ in sizes)
    return most, "; ".join(how for _, how in sizes) + f" (SMs {sm_count}, FlashInfer {flashinfer})"


def unmeasured_kv(plans: Sequence[BuilderPlans]) -> str | None:
    """Why ``auto`` cannot measure a builder's plans (None: it can): an NVFP4 KV cache, which
    vLLM 0.32+ plans on FlashInfer's native wrappers as ``uint8`` pages."""
    if packed := [p for p in plans if p.kv_dtype == "uint8" and any(p.native(r) for r in ROLES)]:
        return (f"the KV cache of {packed[0].describe()} is NVFP4, planned as uint8 pages, which "
                f"{AUTO} does not measure")  # fmt: skip
    return None
