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
from omegaconf.errors import OmegaConfBaseException

from .._floor import is_positive_int
from ..errors import ResourceConfigError

ROOT = "calibration"
"""The config key the profile lives under."""

DTYPES = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
"""Query and KV dtypes a profile may name (``torch.<name>``)."""


class PlanKind(Enum):
    """Which FlashInfer wrapper plans a label."""

    decode = "decode"  # BatchDecodeWithPagedKVCacheWrapper
    paged_prefill = "paged_prefill"  # BatchPrefillWithPagedKVCacheWrapper
    ragged_prefill = "ragged_prefill"  # BatchPrefillWithRaggedKVCacheWrapper


@dataclass
class ModelShape:
    """The attention shape of the model, per GPU (after tensor parallelism)."""

    num_qo_heads: int = MISSING
    """Query (and output) heads on one GPU."""
    num_kv_heads: int = MISSING
    """KV heads on one GPU; must divide ``num_qo_heads``."""
    head_dim: int = 128
    """Dimension of one head."""
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
    """The FlashInfer backend the engine plans it with. ``fa2`` splits KV and so uses the float
    workspace; a backend that uses none (``fa3`` prefill) measures 0."""


@dataclass
class CalibrationProfile:
    """Everything calibration needs to know about a deployment's plans."""

    model: ModelShape = MISSING
    limits: EngineLimits = MISSING
    cuda_graph_batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    """Batch sizes the engine captures graphs for; each is planned."""
    plans: dict[str, PlanProfile] = field(default_factory=dict)
    """By plan label (as in the resources' ``labels``): which wrapper plans it."""


def _problems(profile: CalibrationProfile) -> list[str]:
    key = ROOT
    problems = []

    def positive(name: str, value: object) -> None:
        if not is_positive_int(value):
            problems.append(f"{key}.{name}={value!r} must be a positive whole number")

    model, limits = profile.model, profile.limits
    for name in ("num_qo_heads", "num_kv_heads", "head_dim", "page_size"):
        positive(f"model.{name}", getattr(model, name))
    if (
        is_positive_int(model.num_qo_heads)
        and is_positive_int(model.num_kv_heads)
        and model.num_qo_heads % model.num_kv_heads
    ):
        problems.append(
            f"{key}.model.num_kv_heads={model.num_kv_heads} does not divide "
            f"{key}.model.num_qo_heads={model.num_qo_heads}"
        )
    for name in ("q_dtype", "kv_dtype"):
        if getattr(model, name) not in DTYPES:
            problems.append(
                f"{key}.model.{name}={getattr(model, name)!r} is not one of {', '.join(DTYPES)}"
            )
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        positive(f"limits.{name}", getattr(limits, name))
    sizes = profile.cuda_graph_batch_sizes
    if any(not is_positive_int(s) for s in sizes) or len(set(sizes)) != len(sizes):
        problems.append(
            f"{key}.cuda_graph_batch_sizes={sizes!r} must be distinct positive whole numbers"
        )
    elif is_positive_int(limits.max_num_seqs) and sizes and max(sizes) > limits.max_num_seqs:
        problems.append(
            f"{key}.cuda_graph_batch_sizes has {max(sizes)}, more than "
            f"{key}.limits.max_num_seqs={limits.max_num_seqs}"
        )
    if not profile.plans:
        problems.append(f"{key}.plans is empty: name the wrapper kind of every plan label")
    return problems


def load_profile(node: DictConfig | Mapping[str, Any]) -> CalibrationProfile:
    """The checked profile in ``node`` (the value of the ``calibration`` key)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(CalibrationProfile), node)
        profile = cast(CalibrationProfile, OmegaConf.to_object(merged))
    except OmegaConfBaseException as error:
        full_key = f"{ROOT}.{error.full_key}" if getattr(error, "full_key", None) else ROOT
        reason = str(error).splitlines()[0]
        raise ResourceConfigError(f"{full_key}: {reason}") from None
    problems = _problems(profile)
    if problems:
        raise ResourceConfigError.listing(problems, "the calibration profile")
    return profile


ConfigStore.instance().store(group="mstar_resources", name=ROOT, node=CalibrationProfile)
