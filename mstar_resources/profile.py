"""The calibration profile: what a deployment plans, so its workspaces can be measured on a GPU.

It lives under the config's root key ``calibration`` (each shipped deployment carries one) and is
read by ``mstar-resources-calibrate``. Registered in Hydra's ConfigStore as
``mstar_resources/calibration``, so a deployment types it by listing
``- /mstar_resources/calibration@calibration`` in its defaults. :func:`load_profile` turns a
composed node into a checked :class:`CalibrationProfile`, reporting every problem at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from .errors import ResourceConfigError
from .units import is_positive_int

PROFILE_KEY = "calibration"
"""The config key the profile lives under."""

_WHERE = "the calibration profile"
"""What :func:`load_profile`'s errors say they checked (their ``where``)."""

DTYPES = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
"""Query and KV dtypes a profile may name (``torch.<name>``)."""


class PlanKind(Enum):
    """Which FlashInfer wrapper plans a label.

    ``BatchPODWithPagedKVCacheWrapper`` is not one: it splits its float buffer into two views
    when it is built, so it cannot follow a workspace that grows (build it on a sealed one).
    """

    decode = "decode"  # BatchDecodeWithPagedKVCacheWrapper
    paged_prefill = "paged_prefill"  # BatchPrefillWithPagedKVCacheWrapper
    ragged_prefill = "ragged_prefill"  # BatchPrefillWithRaggedKVCacheWrapper
    mla = "mla"  # flashinfer.mla.BatchMLAPagedAttentionWrapper, for decode and prefill alike
    pod = "pod"  # PODWithPagedKVCacheWrapper: one prefill and a decode batch in one kernel


BACKENDS: dict[PlanKind, tuple[str, ...]] = {
    PlanKind.decode: ("fa2", "auto"),
    PlanKind.paged_prefill: ("fa2", "fa3", "auto"),
    PlanKind.ragged_prefill: ("fa2", "fa3", "auto"),
    PlanKind.mla: ("fa2", "fa3", "auto"),
    PlanKind.pod: ("fa2",),
}
"""The backends calibration can plan each kind with: those an SM80 or SM90 GPU runs (``fa3``
needs SM90). Others (``trtllm-gen``, ``cudnn``, ``cutlass``...) are refused by name, not guessed;
POD plans its decode with ``fa2`` only."""

GRAPH_KINDS = frozenset({PlanKind.decode, PlanKind.mla, PlanKind.pod})
"""Kinds calibrated under CUDA graphs: each graph batch size is one decode batch, planned once.
A prefill graph's need depends on the tokens it is captured with, which a profile does not say."""


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
    """The FlashInfer wrapper that plans it. Whether it runs under CUDA graphs is not said here:
    the resources that serve the label say so, by their ``cg_slots``."""
    backend: str = "fa2"
    """The FlashInfer backend the engine plans it with (see ``BACKENDS``); ``auto`` lets
    FlashInfer pick per plan, as it does for the engine. A backend that uses no float workspace
    measures 0, and its floor is the smallest there is, 1 MB."""


@dataclass
class CalibrationProfile:
    """Everything calibration needs to know about a deployment's plans."""

    model: ModelShape = MISSING
    limits: EngineLimits = MISSING
    cuda_graph_batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    """Batch sizes the engine captures graphs for; each is planned."""
    plans: dict[str, PlanProfile] = field(default_factory=dict)
    """By plan label (as in the resources' ``labels``): which wrapper plans it."""


def _not_positive(prefix: str, node: object, names: tuple[str, ...]) -> list[str]:
    """A problem for each of ``node``'s fields ``names`` that is not a positive whole number."""
    return [
        f"{prefix}.{name}={getattr(node, name)!r} must be a positive whole number"
        for name in names
        if not is_positive_int(getattr(node, name))
    ]


def _model_problems(model: ModelShape) -> list[str]:
    """What is wrong with the model's shape: sizes, the head grouping, the dtypes."""
    key = f"{PROFILE_KEY}.model"
    problems = _not_positive(key, model, ("num_qo_heads", "num_kv_heads", "head_dim", "page_size"))
    heads = (model.num_qo_heads, model.num_kv_heads)
    if all(is_positive_int(h) for h in heads) and model.num_qo_heads % model.num_kv_heads:
        problems.append(
            f"{key}.num_kv_heads={model.num_kv_heads} does not divide "
            f"{key}.num_qo_heads={model.num_qo_heads}"
        )
    problems += [
        f"{key}.{name}={getattr(model, name)!r} is not one of {', '.join(DTYPES)}"
        for name in ("q_dtype", "kv_dtype")
        if getattr(model, name) not in DTYPES
    ]
    return problems


def _limits_problems(limits: EngineLimits) -> list[str]:
    """What is wrong with the engine's limits: each is a positive whole number."""
    names = ("max_num_seqs", "max_num_batched_tokens", "max_model_len")
    return _not_positive(f"{PROFILE_KEY}.limits", limits, names)


def _graph_size_problems(sizes: list[int], limits: EngineLimits) -> list[str]:
    """What is wrong with the graph batch sizes: they are distinct positive whole numbers, none
    above the batch limit."""
    key = f"{PROFILE_KEY}.cuda_graph_batch_sizes"
    if any(not is_positive_int(s) for s in sizes) or len(set(sizes)) != len(sizes):
        return [f"{key}={sizes!r} must be distinct positive whole numbers"]
    if is_positive_int(limits.max_num_seqs) and sizes and max(sizes) > limits.max_num_seqs:
        return [
            f"{key} has {max(sizes)}, more than "
            f"{PROFILE_KEY}.limits.max_num_seqs={limits.max_num_seqs}"
        ]
    return []


def _plan_problems(plans: dict[str, PlanProfile]) -> list[str]:
    """What is wrong with the plans: none at all, or a backend calibration cannot plan the kind
    with."""
    key = f"{PROFILE_KEY}.plans"
    problems = [] if plans else [f"{key} is empty: name the wrapper kind of every plan label"]
    problems += [
        f"{key}.{label}.backend={plan.backend!r} cannot be calibrated for kind "
        f"{plan.kind.value}; use one of {', '.join(BACKENDS[plan.kind])}"
        for label, plan in plans.items()
        if plan.backend not in BACKENDS[plan.kind]
    ]
    return problems


def _mla_dimension_problems(plans: dict[str, PlanProfile], model: ModelShape) -> list[str]:
    """The model dimensions that ``mla`` plans need and the model leaves unset (or bad)."""
    mla = [label for label, plan in plans.items() if plan.kind is PlanKind.mla]
    if not mla:
        return []
    return [
        f"{PROFILE_KEY}.model.{name}={getattr(model, name)!r} must be a positive whole number "
        f"for the mla plans ({', '.join(mla)}); DeepSeek-V3 has head_dim_ckv=512, "
        "head_dim_kpe=64"
        for name in ("head_dim_ckv", "head_dim_kpe")
        if not is_positive_int(getattr(model, name))
    ]


def _problems(profile: CalibrationProfile) -> list[str]:
    """Every problem of ``profile``, in the order of its fields (the MLA dimensions, which
    depend on the plans, last)."""
    return [
        *_model_problems(profile.model),
        *_limits_problems(profile.limits),
        *_graph_size_problems(profile.cuda_graph_batch_sizes, profile.limits),
        *_plan_problems(profile.plans),
        *_mla_dimension_problems(profile.plans, profile.model),
    ]


def _schema_problem(error: OmegaConfBaseException) -> str:
    """OmegaConf's refusal of the profile's schema as one problem, from the error's fields: the
    full key, the value where it refused one (a wrong type or choice), then its reason."""
    full_key = f"{PROFILE_KEY}.{error.full_key}" if error.full_key else PROFILE_KEY
    reason = str(error).splitlines()[0]
    if isinstance(error, ValidationError):
        return f"{full_key}={error.value!r} is not valid: {reason}"
    return f"{full_key}: {reason}"


def load_profile(node: DictConfig | Mapping[str, Any]) -> CalibrationProfile:
    """The checked profile in ``node`` (the value of the ``calibration`` key)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(CalibrationProfile), node)
        profile = cast(CalibrationProfile, OmegaConf.to_object(merged))
    except OmegaConfBaseException as error:
        raise ResourceConfigError(_schema_problem(error), where=_WHERE) from None
    problems = _problems(profile)
    if problems:
        raise ResourceConfigError(*problems, where=_WHERE)
    return profile


ConfigStore.instance().store(
    group="mstar_resources", name=PROFILE_KEY, node=CalibrationProfile, provider="mstar-resources"
)
