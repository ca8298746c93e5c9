"""The calibration profile (config key ``calibration``): what a deployment plans, so that its
workspaces can be measured on a GPU; :func:`load_profile` checks it before any GPU work."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

from omegaconf import MISSING, DictConfig, OmegaConf, ValidationError
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from ..attn._flashinfer import plain_decode_groups
from ..errors import ResourceConfigError, did_you_mean
from ..units import installed_version, release

PROFILE_KEY = "calibration"
_WHERE = "the calibration profile"

DTYPES = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
"""Query and KV dtypes a profile may name (``torch.<name>``)."""


class PlanKind(Enum):
    """Which FlashInfer wrapper plans a label (not ``BatchPODWithPagedKVCacheWrapper``, whose views
    of its float buffer could not follow a growing one)."""

    decode = "decode"  # BatchDecodeWithPagedKVCacheWrapper
    paged_prefill = "paged_prefill"  # BatchPrefillWithPagedKVCacheWrapper
    ragged_prefill = "ragged_prefill"  # BatchPrefillWithRaggedKVCacheWrapper
    mla = "mla"  # flashinfer.mla.BatchMLAPagedAttentionWrapper, for decode and prefill alike
    pod = "pod"  # PODWithPagedKVCacheWrapper: one prefill and a decode batch in one kernel


# The backends each kind is calibrated with: those an SM80 or SM90 GPU runs (fa3 needs SM90).
BACKENDS: dict[PlanKind, tuple[str, ...]] = {
    PlanKind.decode: ("fa2", "auto"),
    PlanKind.paged_prefill: ("fa2", "fa3", "auto"),
    PlanKind.ragged_prefill: ("fa2", "fa3", "auto"),
    PlanKind.mla: ("fa2", "fa3", "auto"),
    PlanKind.pod: ("fa2",),
}

GRAPH_KINDS = frozenset({PlanKind.decode, PlanKind.mla, PlanKind.pod, PlanKind.paged_prefill})
"""Kinds calibrated under CUDA graphs (a paged prefill at each ``cuda_graph_prefill_tokens``)."""

SPLIT_KINDS = frozenset({PlanKind.decode, PlanKind.paged_prefill, PlanKind.ragged_prefill})
"""Kinds whose plans take FlashInfer's ``fixed_split_size`` and ``disable_split_kv``."""


@dataclass
class ModelShape:
    """The attention shape of the model, per GPU (after tensor parallelism)."""

    num_qo_heads: int = MISSING
    """Query (and output) heads on one GPU."""
    num_kv_heads: int = MISSING
    """KV heads on one GPU; must divide ``num_qo_heads``."""
    head_dim: int = 128
    """Dimension of one head (not read by ``mla`` plans)."""
    head_dim_ckv: int | None = None
    """MLA only: the compressed KV's dimension (512 for DeepSeek-V3). Required by ``mla`` plans."""
    head_dim_kpe: int | None = None
    """MLA only: the rotary part's dimension (64 for DeepSeek-V3). Required by ``mla`` plans."""
    page_size: int = 16
    """Tokens per KV-cache page."""
    q_dtype: str = "bfloat16"
    """Query dtype, a ``torch`` dtype name."""
    kv_dtype: str = "bfloat16"
    """KV-cache dtype, a ``torch`` dtype name (fp8 caches plan differently)."""
    o_dtype: str | None = None
    """Output dtype, a ``torch`` dtype name; None: the query's, as FlashInfer defaults (vLLM
    queries an FP8 cache in FP8 and writes the model's dtype). Not taken by ``mla`` plans."""


@dataclass
class EngineLimits:
    """The engine's scheduling limits, which bound every plan it can make."""

    max_num_seqs: int = MISSING
    """Most sequences in one batch."""
    max_num_batched_tokens: int = MISSING
    """Most query tokens in one batch (the chunked-prefill budget)."""
    max_model_len: int = MISSING
    """Longest context, in tokens."""


@dataclass
class PlanProfile:
    """How one plan label is planned."""

    kind: PlanKind = MISSING
    """The FlashInfer wrapper that plans it (under CUDA graphs where it has ``cg_slots``)."""
    backend: str = "fa2"
    """The FlashInfer backend the engine plans it with (``BACKENDS``; ``auto``: FlashInfer picks
    per plan). A backend that uses no float workspace measures 0: the smallest floor, 1 MB."""
    tensor_cores: bool = False
    """``decode`` only: plan with ``use_tensor_cores=True`` (FlashInfer's prefill scheduler, one
    query row a request), as vLLM always does and SGLang for GQA groups of 4 or more."""
    q_len_per_req: int = 1
    """``decode`` with ``tensor_cores`` only: query tokens a request per step (1 + speculative
    tokens); more than 1 needs FlashInfer 0.7.2."""
    fixed_split_size: int = -1
    """``decode`` with ``tensor_cores``, or a prefill: split each request's KV into chunks of this
    many pages (-1: the scheduler picks), as engines' deterministic modes do; not capped by the
    grid, so the need grows with the batch and its contexts."""
    disable_split_kv: bool = False
    """``decode`` or a prefill: never split KV; such plans need no float workspace."""

    def plan_options(self) -> dict[str, Any]:
        """The ``plan()`` keywords not at FlashInfer's defaults (0.6 takes no ``q_len_per_req``)."""
        options: dict[str, Any] = {}
        if self.fixed_split_size > 0:
            options["fixed_split_size"] = self.fixed_split_size
        if self.disable_split_kv:
            options["disable_split_kv"] = True
        if self.q_len_per_req > 1:
            options["q_len_per_req"] = self.q_len_per_req
        return options

    @property
    def fixed_split(self) -> bool:
        """Whether it splits KV in chunks of a fixed size, which the grid does not bound."""
        return self.fixed_split_size > 0 and not self.disable_split_kv


@dataclass
class CalibrationProfile:
    """Everything calibration needs to know about a deployment's plans."""

    model: ModelShape = MISSING
    limits: EngineLimits = MISSING
    cuda_graph_batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    """Batch sizes the engine captures decode graphs for; each is planned."""
    cuda_graph_prefill_tokens: list[int] = field(default_factory=list)
    """Token counts the engine captures prefill graphs for (SGLang's), for a ``paged_prefill``
    label served in CUDA-graph slots. Empty: prefill runs eagerly."""
    plans: dict[str, PlanProfile] = field(default_factory=dict)
    """By plan label (as in the resources' ``labels``): which wrapper plans it."""


def _not_positive(prefix: str, node: object, names: tuple[str, ...]) -> list[str]:
    return [
        f"{prefix}.{name}={getattr(node, name)!r} must be a positive whole number"
        for name in names
        if getattr(node, name) < 1
    ]


def _value_problems(profile: CalibrationProfile) -> list[str]:
    """What the schema's types let through: ranges, the heads' grouping, dtypes, graph sizes."""
    key, model = f"{PROFILE_KEY}.model", profile.model
    problems = _not_positive(key, model, ("num_qo_heads", "num_kv_heads", "head_dim", "page_size"))
    if min(model.num_qo_heads, model.num_kv_heads) > 0 and model.num_qo_heads % model.num_kv_heads:
        problems.append(
            f"{key}.num_kv_heads={model.num_kv_heads} does not divide "
            f"{key}.num_qo_heads={model.num_qo_heads}"
        )
    problems += [
        f"{key}.{name}={getattr(model, name)!r} is not one of {', '.join(DTYPES)}"
        for name in ("q_dtype", "kv_dtype", "o_dtype")
        if getattr(model, name) not in (*DTYPES, None)  # None: o_dtype's default, the query's
    ]
    limits = ("max_num_seqs", "max_num_batched_tokens", "max_model_len")
    problems += _not_positive(f"{PROFILE_KEY}.limits", profile.limits, limits)
    problems += _graph_size_problems(profile, "cuda_graph_batch_sizes", "max_num_seqs")
    problems += _graph_size_problems(profile, "cuda_graph_prefill_tokens", "max_num_batched_tokens")
    if not profile.plans:
        problems.append(f"{PROFILE_KEY}.plans is empty: name the wrapper kind of every plan label")
    for label, plan in profile.plans.items():
        problems += _plan_problems(label, plan)
    mla = [label for label, plan in profile.plans.items() if plan.kind is PlanKind.mla]
    return problems + [
        f"{key}.{name}={getattr(model, name)!r} must be a positive whole number for the mla "
        f"plans ({', '.join(mla)}); DeepSeek-V3 has head_dim_ckv=512, head_dim_kpe=64"
        for name in ("head_dim_ckv", "head_dim_kpe")
        if mla and (getattr(model, name) or 0) < 1
    ]


def _graph_size_problems(profile: CalibrationProfile, name: str, limit_name: str) -> list[str]:
    key, sizes = f"{PROFILE_KEY}.{name}", getattr(profile, name)
    limit = getattr(profile.limits, limit_name)
    if min(sizes, default=1) < 1 or len(set(sizes)) != len(sizes):
        return [f"{key}={sizes!r} must be distinct positive whole numbers"]
    if limit > 0 and sizes and max(sizes) > limit:
        return [f"{key} has {max(sizes)}, more than {PROFILE_KEY}.limits.{limit_name}={limit}"]
    return []


def _plan_problems(label: str, plan: PlanProfile) -> list[str]:
    key = f"{PROFILE_KEY}.plans.{label}"
    decode, tensor_cores = plan.kind is PlanKind.decode, plan.tensor_cores
    problems = []
    if plan.backend not in BACKENDS[plan.kind]:
        problems.append(
            f"{key}.backend={plan.backend!r} cannot be calibrated for kind {plan.kind.value}; use "
            f"one of {', '.join(BACKENDS[plan.kind])}"
        )
    if tensor_cores and not decode:
        problems.append(f"{key}.tensor_cores=true is for kind decode, not {plan.kind.value}")
    problems += _not_positive(key, plan, ("q_len_per_req",))
    if plan.q_len_per_req > 1 and not (decode and tensor_cores):
        problems.append(
            f"{key}.q_len_per_req={plan.q_len_per_req} needs kind decode with tensor_cores=true "
            "(FlashInfer plans several query tokens a request only through tensor cores)"
        )
    split = plan.fixed_split_size
    if split < 1 and split != -1:
        problems.append(
            f"{key}.fixed_split_size={split!r} must be -1 (the scheduler picks) or a positive "
            "whole number"
        )
    elif split != -1 and not (plan.kind in SPLIT_KINDS and (tensor_cores or not decode)):
        problems.append(
            f"{key}.fixed_split_size={split} is taken by a prefill, or by decode with "
            f"tensor_cores=true, not by {plan.kind.value}"
            + (" without tensor cores" if decode else "")
        )
    if plan.disable_split_kv and plan.kind not in SPLIT_KINDS:
        problems.append(f"{key}.disable_split_kv=true is not taken by kind {plan.kind.value}")
    return problems


def _schema_problem(error: OmegaConfBaseException, node: Mapping[str, Any]) -> str:
    """OmegaConf's refusal of the profile's schema (merging ``node``) as one problem."""
    full_key = f"{PROFILE_KEY}.{error.full_key}" if error.full_key else PROFILE_KEY
    reason = str(error).splitlines()[0]
    if isinstance(error, ValidationError):
        return f"{full_key}={error.value!r} is not valid: {reason}"
    schema = OmegaConf.get_type(error.parent_node)
    unknown_key = isinstance(error, ConfigKeyError | ConfigAttributeError)
    if unknown_key and dataclasses.is_dataclass(schema):
        holder = full_key.rpartition(".")[0]
        names = [f.name for f in dataclasses.fields(schema)]
        close = did_you_mean(str(error.key), names, f"{holder}.")
        given: Any = node
        for part in str(error.full_key).split("."):
            given = given.get(part) if isinstance(given, Mapping) else None
        shown = "" if given is None else f"={given!r}"
        return f"{full_key}{shown} is not a setting{close}; {holder} takes {', '.join(names)}"
    return f"{full_key}: {reason}"


def _unset_problems(merged: DictConfig) -> list[str]:
    problems = []
    for key in sorted(OmegaConf.missing_keys(merged)):
        holder, _, name = key.rpartition(".")
        schema = OmegaConf.get_type(OmegaConf.select(merged, holder) if holder else merged)
        hint = typing.get_type_hints(schema).get(name) if dataclasses.is_dataclass(schema) else None
        if isinstance(hint, type) and issubclass(hint, Enum):
            takes = "one of " + ", ".join(member.name for member in hint)
        elif dataclasses.is_dataclass(hint):
            takes = "a mapping of " + ", ".join(f.name for f in dataclasses.fields(hint))
        else:  # the schema's required values are whole numbers, a kind, or a mapping
            takes = "a whole number" if hint is int else "a value"
        problems.append(f"{PROFILE_KEY}.{key} is not set; set it to {takes}")
    return problems


def load_profile(node: DictConfig | Mapping[str, Any]) -> CalibrationProfile:
    """The checked profile in ``node`` (the value of the ``calibration`` key)."""
    try:
        if isinstance(node, DictConfig):
            # Plain values: a typed node lets a key forced in by Hydra's `+` through the merge.
            node = cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))
        merged = cast(DictConfig, OmegaConf.merge(OmegaConf.structured(CalibrationProfile), node))
        if unset := _unset_problems(merged):
            raise ResourceConfigError(*unset, where=_WHERE)
        profile = cast(CalibrationProfile, OmegaConf.to_object(merged))
    except OmegaConfBaseException as error:
        raise ResourceConfigError(_schema_problem(error, node), where=_WHERE) from None
    if problems := _value_problems(profile):
        raise ResourceConfigError(*problems, where=_WHERE)
    return profile


OLDEST = "0.6.6"  # measured by growth: 0.6.x wrappers have no workspace_size()
MLA_SINCE = MULTI_TOKEN_DECODE_SINCE = "0.7.2"


def installed_flashinfer() -> str | None:
    return installed_version("flashinfer-python")


def version_problems(
    profile: CalibrationProfile, version: str, *, plain_groups: frozenset[int] | None = None
) -> list[str]:
    """What FlashInfer ``version`` cannot plan of ``profile``, one line a feature; ``plain_groups``:
    the GQA group sizes its plain decode kernels are compiled for, or None."""
    have, plans = release(version), profile.plans.items()
    problems = []
    if have < release(OLDEST):
        problems.append(f"FlashInfer {version} is older than {OLDEST}, the oldest supported")
    mla = [f"calibration.plans.{label}" for label, plan in plans if plan.kind is PlanKind.mla]
    if mla and have < release(MLA_SINCE):
        problems.append(
            f"mla plans ({', '.join(mla)}) need FlashInfer {MLA_SINCE} or newer (installed: "
            f"{version})"
        )
    multi = [
        f"calibration.plans.{label}.q_len_per_req={plan.q_len_per_req}"
        for label, plan in plans
        if plan.q_len_per_req > 1
    ]
    if multi and have < release(MULTI_TOKEN_DECODE_SINCE):
        problems.append(
            f"{', '.join(multi)} needs FlashInfer {MULTI_TOKEN_DECODE_SINCE} or newer "
            f"(installed: {version})"
        )
    model = profile.model
    group = model.num_qo_heads // model.num_kv_heads
    plain = [
        f"calibration.plans.{label}"
        for label, plan in plans
        if plan.kind is PlanKind.decode and not plan.tensor_cores
    ]
    if plain and plain_groups is not None and group not in plain_groups:
        problems.append(
            f"plain decode ({', '.join(plain)}) with {model.num_qo_heads} query heads on "
            f"{model.num_kv_heads} KV heads, a group of {group}: FlashInfer {version}'s plain "
            f"decode kernels take groups of {', '.join(map(str, sorted(plain_groups)))}; set "
            f"{' and '.join(f'{key}.tensor_cores=true' for key in plain)} (as vLLM and SGLang "
            "plan such models), or install a FlashInfer whose kernels take it"
        )
    return problems


def check_flashinfer(profile: CalibrationProfile) -> None:
    """Refuse a profile the installed FlashInfer cannot plan, naming each feature's version."""
    version = installed_flashinfer()
    if version is None:
        raise ResourceConfigError(
            "FlashInfer is not installed: pip install 'mstar-resources[calibrate]'"
        )
    if problems := version_problems(profile, version, plain_groups=plain_decode_groups()):
        raise ResourceConfigError(*problems, where=f"what FlashInfer {version} can plan")
