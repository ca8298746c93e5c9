"""What calibration measured, written as ``<name>_calibrated.yaml``: a deployment override that
pulls in ``<name>``, declares the measured floors, and keeps the measurements as ``calibrated``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, ListConfig, OmegaConf

from .._internal.floor import INT
from ..compose import shipped_deployments
from ..files import write_whole
from ..units import MIB
from .profile import PROFILE_KEY
from .record import RECORD_KEY, declared_mb_for

DEFAULT_MARGIN = 0.0
"""Added to a measured need before it is declared: none, since the need is the most any plan
within the profile's limits can ask for (``docs/calibration.md``); ``margin=0.1`` is for a GPU or
FlashInfer build the bound was not checked on."""

CALIBRATED_SUFFIX = "_calibrated"
RECALIBRATED_SUFFIX = "_recalibrated"
"""A calibration written outside the package of a deployment the package ships calibrated: Hydra
finds the shipped ``<name>_calibrated`` before a ``--config-dir``'s file of that name."""

DEFAULT_OUTPUT_DIR = Path("calibrated", "deployment")
"""Where calibrated deployments go by default: the ``deployment`` group of the config folder
``calibrated`` under the working directory (``--config-dir calibrated``), never the package."""


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


@dataclass(frozen=True)
class OneBuffer:
    """What an engine that shares one float workspace among all its wrappers and graph sizes (vLLM,
    SGLang) must reserve: every plan carves it from offset 0, so the most any one plan needs."""

    need_bytes: int
    bytes: int
    """What to reserve: the need plus the margin, in whole MB."""
    worst: str
    """The label and shape that need it."""
    vllm_formula_bytes: int | None
    """vLLM 0.33's own floor under its setting (None: vLLM plans no FlashInfer for it)."""
    int_need_bytes: int | None = None

    def record(self) -> dict[str, Any]:
        return {
            k: v for k, v in asdict(self).items() if k != "vllm_formula_bytes" and v is not None
        }

    def advice(self) -> list[str]:
        """The engines' settings, for people."""
        lines = [
            f"One buffer for every plan and graph size (vLLM, SGLang): {self.bytes:,} bytes "
            f"(the need of {self.worst}, {self.need_bytes:,} bytes, in whole MB). Set:",
            f"  SGLANG_FLASHINFER_WORKSPACE_SIZE={self.bytes}",
            # SGLang's layers/attention/flashinfer_backend.py
            "  (SGLang 0.5.23 replaces this setting with 512 MiB for Qwen2, Qwen3, MiMo and "
            "Qwen3-VL models and with 2 GiB in deterministic mode, whatever it is set to)",
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
                f"wrapper makes {INT.default_mb * MIB:,} (and as many pinned on the host); no "
                "setting of vLLM's or SGLang's changes that, and the vLLM plugin shares one per "
                "label among the decode wrappers of its graph sizes"
            )
        return lines


def declared_floors(
    measured: Sequence[Measured], margin: float = DEFAULT_MARGIN, into: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The one conversion of measured needs to floors, for calibration's file and the plugins'
    ``auto``: ``into`` (else a new resource tree), each measured resource declaring ``declared_mb``
    and ``int_declared_mb`` (0 for an int need of None: the wrappers keep their own)."""
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


def profile_settings(cfg: Any, overrides: Sequence[str]) -> dict[str, Any] | None:
    """The ``calibration`` settings that ``overrides`` (a command line's ``key=value`` strings) gave
    the composed ``cfg``, with their composed values, nested as the profile holds them, or None."""
    settings = OmegaConf.create({})
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+")
        if override.startswith("~") or key.split(".")[0] != PROFILE_KEY:
            continue
        value = OmegaConf.select(cfg, key)
        if isinstance(value, DictConfig | ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
        OmegaConf.update(settings, key, value, merge=True)
    found = OmegaConf.to_container(settings, resolve=True, enum_to_str=True)
    return cast(dict[str, Any], found).get(PROFILE_KEY) or None


def how_to_compose(path: Path) -> str:
    """How a config composes the calibrated deployment written at ``path``."""
    name = path.stem
    if path.parent.name != "deployment":
        return f"move it into the deployment/ folder of a config dir, then use deployment={name}"
    if path.parent.absolute() == shipped_deployments().absolute():
        return f"use it with deployment={name}"
    config_dir = path.parent.parent
    return (
        f"use it with --config-dir {config_dir} deployment={name} (or list "
        f"file://{config_dir.absolute()} under hydra.searchpath)"
    )


def users_deployment_folder(name: str, config_dirs: Sequence[str]) -> Path | None:
    """The ``deployment/`` folder of the first of ``config_dirs`` (a user's ``--config-dir``s)
    that holds deployment ``name``; None where none does (a shipped deployment)."""
    for config_dir in config_dirs:
        folder = Path(config_dir) / "deployment"
        if (folder / f"{name}.yaml").is_file():
            return folder
    return None


def base_deployment(name: str) -> str:
    """Calibrating ``x_calibrated`` (or ``x_recalibrated``) again recalibrates ``x``."""
    return name.removesuffix(CALIBRATED_SUFFIX).removesuffix(RECALIBRATED_SUFFIX)


def calibrated_name(deployment: str, output_dir: Path) -> str:
    """``<deployment>_calibrated``, or ``<deployment>_recalibrated`` where the package ships a
    ``<deployment>_calibrated`` and ``output_dir`` is not the package's folder."""
    name = f"{deployment}{CALIBRATED_SUFFIX}"
    shipped = shipped_deployments()
    if (shipped / f"{name}.yaml").is_file() and output_dir.absolute() != shipped.absolute():
        return f"{deployment}{RECALIBRATED_SUFFIX}"
    return name


def write_override(
    deployment: str,
    measured: Sequence[Measured],
    provenance: Mapping[str, Any],
    output_dir: Path,
    margin: float = DEFAULT_MARGIN,
    buffer: OneBuffer | None = None,
    profile: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``deployment``'s calibration into ``output_dir`` (made if missing), whole or not at
    all, with the ``calibration`` settings ``profile`` (:func:`profile_settings`, so the file
    composes the profile its floors hold for) where given; returns its path."""
    path = output_dir / f"{calibrated_name(deployment, output_dir)}.yaml"
    output_dir.mkdir(parents=True, exist_ok=True)
    shipped = output_dir.absolute() == shipped_deployments().absolute()
    in_config_dir = output_dir.name == "deployment" and not shipped
    folder = f"--config-dir {output_dir.parent} " if in_config_dir else ""
    needs = [{k: v for k, v in asdict(m).items() if v is not None} for m in measured]
    body = {
        "defaults": [deployment, "_self_"],
        "resources": declared_floors(measured, margin),
        **({} if profile is None else {PROFILE_KEY: dict(profile)}),
        RECORD_KEY: {
            "margin": margin,
            **provenance,
            "needs": needs,
            **({"one_buffer": buffer.record()} if buffer is not None else {}),
        },
    }
    header = [
        "# @package _global_",
        f"# Calibrated {deployment}: written by",
        f"#   mstar-resources-calibrate {folder}deployment={deployment}",
        *(f"# {key}: {value}" for key, value in provenance.items()
          if isinstance(value, str | int | float | bool)),
        f"# declared_mb = need{f' x {1 + margin:g}' if margin else ''}, rounded up to a whole MB "
        "(int_declared_mb: the int need, the same way). Use it with",
        f"#   mstar-resources {folder}deployment={path.stem}",
    ]  # fmt: skip
    write_whole(path, "\n".join(header) + "\n" + OmegaConf.to_yaml(OmegaConf.create(body)))
    return path
