"""Writing what calibration measured as a deployment override that composes like any other.

``<name>_calibrated.yaml`` in the ``deployment`` group pulls in ``<name>`` and sets each measured
resource's ``declared_mb`` to its need (plus a margin, none by default), rounded up to a whole
MB, and its ``int_declared_mb`` to its int need the same way (where that was measured). It sets
the settings of the ``calibration`` profile the calibration was given on its command line, so
that the file composes the profile its floors hold for, and a check of the calibration compares
what runs with that. The measurements themselves go under the root
key ``calibrated``, so a program can read them back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from .._internal.floor import INT_DEFAULT_MB
from ..units import MIB
from .profile import PROFILE_KEY
from .record import RECORD_KEY, declared_mb_for, plain_values

DEFAULT_MARGIN = 0.0
"""Added to a measured need before it is declared. None by default: the need calibration measures
is the most any plan within the profile's limits can ask for (``bounds.py`` says why), so the
floor is that need rounded up to a whole MB. A margin stays possible (``margin=0.1``) for a GPU or
FlashInfer build the bound was not checked on."""


@dataclass(frozen=True)
class Measured:
    """What one resource needs: the most any of its labels' plans needs."""

    path: str
    need_bytes: int
    worst: str
    """Which label and shape needs it, e.g. ``decode: bs=64 q=1 kv=131072 graph``."""
    method: str
    int_need_bytes: int | None = None
    """The most int workspace its plans need; None where it was not measured."""


SGLANG_OVERWRITES = (
    "SGLang 0.5.23 replaces this setting with 512 MiB for Qwen2, Qwen3, MiMo and Qwen3-VL models "
    "and with 2 GiB in deterministic mode, whatever it is set to"
)
"""What SGLang does to its setting (``layers/attention/flashinfer_backend.py``; its PR 30244, open,
would stop it): for those models and modes the setting printed has no effect."""


@dataclass(frozen=True)
class OneBuffer:
    """What an engine that shares one float workspace among all its wrappers and graph sizes
    (vLLM, SGLang) must reserve for this deployment: every plan carves that buffer from offset
    0, so the most any single plan needs, across prefill and every graph size."""

    need_bytes: int
    """The most any one plan needs."""
    bytes: int
    """What to reserve: the need plus the margin, in whole MB (at least 1)."""
    worst: str
    """The label and shape that need it."""
    vllm_formula_bytes: int | None
    """vLLM 0.33's own floor under its setting (``max_num_batched_tokens x query heads x head
    dim x 16``), or None where vLLM plans no FlashInfer for the deployment."""
    int_need_bytes: int | None = None
    """The most int workspace any one plan needs (None: not measured). One-buffer engines give
    every wrapper an int workspace of FlashInfer's own 8 MiB, and no setting changes it."""

    def record(self) -> dict[str, Any]:
        """The fields the calibrated record keeps."""
        return {
            "need_bytes": self.need_bytes,
            "bytes": self.bytes,
            "worst": self.worst,
            **({} if self.int_need_bytes is None else {"int_need_bytes": self.int_need_bytes}),
        }

    def advice(self) -> list[str]:
        """The engines' settings, for people."""
        lines = [
            f"One buffer for every plan and graph size (vLLM, SGLang): {self.bytes:,} bytes "
            f"(the need of {self.worst}, {self.need_bytes:,} bytes, in whole MB). Set:",
            f"  SGLANG_FLASHINFER_WORKSPACE_SIZE={self.bytes}",
            f"  ({SGLANG_OVERWRITES})",
        ]
        if self.vllm_formula_bytes is not None:
            lines += [
                f"  VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE={self.bytes}",
                "  (vLLM 0.33 reserves the larger of this and max_num_batched_tokens x query heads "
                f"x head dim x 16 = {self.vllm_formula_bytes:,} bytes: the setting can raise its "
                "buffer, not lower it; the vLLM plugin, MSTAR_RESOURCES_VLLM=<this deployment>, "
                "gives vLLM these floors instead: docs/vllm.md)",
            ]
        if self.int_need_bytes is not None:
            lines.append(
                f"Int workspaces: a plan needs at most {self.int_need_bytes:,} bytes, and each "
                f"wrapper makes {INT_DEFAULT_MB * MIB:,} (and as many pinned on the host); no "
                "setting of vLLM's or SGLang's changes that, and the vLLM plugin shares one per "
                "label among the decode wrappers of its graph sizes"
            )
        return lines


def profile_settings(cfg: Any, overrides: Sequence[str]) -> dict[str, Any] | None:
    """The settings of the ``calibration`` profile that ``overrides`` (a command line's, as
    Hydra's ``key=value`` strings) gave the composed ``cfg``, with the values composed, nested
    as the profile holds them; None where it gave none. A calibration writes them into its file,
    so that the file composes the profile its floors hold for, and the rest of the profile stays
    the deployment's, which a check of the calibration then compares with the record."""
    settings = OmegaConf.create({})
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+")
        if override.startswith("~") or not (
            key == PROFILE_KEY or key.startswith(f"{PROFILE_KEY}.")
        ):
            continue
        value = OmegaConf.select(cfg, key)
        if isinstance(value, DictConfig | ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
        OmegaConf.update(settings, key, value, merge=True)
    found = plain_values(OmegaConf.to_container(settings, resolve=True))
    profile = found.get(PROFILE_KEY) if isinstance(found, dict) else None
    return profile if isinstance(profile, dict) and profile else None


def declared_floors(
    measured: Sequence[Measured], margin: float = DEFAULT_MARGIN, into: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A resource tree (``into``, else a new one) whose measured resources declare their needs
    as floors: ``declared_mb`` the need plus ``margin`` in whole MB, and ``int_declared_mb`` the
    int need the same way, or 0 where it is None (the wrappers keep their own int workspaces, as
    FlashInfer 0.7's MLA wrappers and an engine's prefill wrappers do, so none is reserved).

    The one conversion of measured needs to floors: calibration writes its file with it, and an
    engine plugin's ``auto`` builds its tree with it (``margin`` 0), a resource whose wrappers
    keep their own int workspace given ``int_need_bytes=None``. Each value is rounded by
    :func:`~mstar_resources.calibration.record.declared_mb_for`, which a calibrated record is
    checked against."""
    resources = {} if into is None else into
    for m in measured:
        node = resources
        for part in m.path.split("."):
            node = node.setdefault(part, {})
        node["declared_mb"] = declared_mb_for(m.need_bytes, margin)
        node["int_declared_mb"] = (
            0 if m.int_need_bytes is None else declared_mb_for(m.int_need_bytes, margin)
        )
    return resources


def calibrated_yaml(
    deployment: str,
    measured: list[Measured],
    provenance: Mapping[str, object],
    margin: float = DEFAULT_MARGIN,
    buffer: OneBuffer | None = None,
    profile: Mapping[str, Any] | None = None,
    *,
    config_dir: Path | None = None,
    name: str | None = None,
) -> str:
    """The text of ``<deployment>_calibrated.yaml``; ``profile``: settings of the ``calibration``
    node the needs were measured with (:func:`profile_settings`; None: the deployment's own).
    ``config_dir``: the config folder whose ``deployment/`` folder it is written to (None: the
    package's), which the commands in its header name; ``name``: its name, where it is not
    ``<deployment>_calibrated``."""
    folder = f"--config-dir {config_dir} " if config_dir is not None else ""
    body = {
        "defaults": [deployment, "_self_"],
        "resources": declared_floors(measured, margin),
        **({} if profile is None else {PROFILE_KEY: dict(profile)}),
        RECORD_KEY: {
            "margin": margin,
            **dict(provenance),
            "needs": [
                {
                    "path": m.path,
                    "need_bytes": m.need_bytes,
                    "worst": m.worst,
                    "method": m.method,
                    **({} if m.int_need_bytes is None else {"int_need_bytes": m.int_need_bytes}),
                }
                for m in measured
            ],
            **({"one_buffer": buffer.record()} if buffer is not None else {}),
        },
    }
    header = [
        "# @package _global_",
        f"# Calibrated {deployment}: written by",
        f"#   mstar-resources-calibrate {folder}deployment={deployment}",
        *(f"# {key}: {value}" for key, value in provenance.items() if _is_scalar(value)),
        f"# declared_mb = need{f' x {1 + margin:g}' if margin else ''}, rounded up to a whole MB "
        "(int_declared_mb: the int need, the same way). Use it with",
        f"#   mstar-resources {folder}deployment={name or f'{deployment}_calibrated'}",
    ]
    return "\n".join(header) + "\n" + OmegaConf.to_yaml(OmegaConf.create(body))


def _is_scalar(value: object) -> bool:
    return isinstance(value, str | int | float | bool)
