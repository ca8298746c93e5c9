"""The calibrated deployments: where they are written and found, how to compose one, and writing
the override a calibration produces."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..compose import shipped_deployments as shipped_deployments
from ..files import write_whole
from .calibrate import LabelNeed, per_resource
from .override import DEFAULT_MARGIN, OneBuffer, calibrated_yaml

CALIBRATED_SUFFIX = "_calibrated"
RECALIBRATED_SUFFIX = "_recalibrated"
"""A calibration written outside the package of a deployment the package ships calibrated: the
shipped ``<name>_calibrated`` would be composed in place of a file of that name (Hydra's search
path has a ``--config-dir`` after the package's configs)."""


DEFAULT_CONFIG_DIR = Path("calibrated")
"""Where calibrated deployments go by default: a config folder under the working directory,
never the installed package. Hydra finds ``calibrated/deployment/<name>_calibrated.yaml`` through
``--config-dir calibrated`` or ``hydra.searchpath: [file://calibrated]``."""


def default_output_dir() -> Path:
    """The ``deployment`` group of :data:`DEFAULT_CONFIG_DIR`, under the working directory."""
    return DEFAULT_CONFIG_DIR / "deployment"


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
    """The ``deployment/`` folder of the first of ``config_dirs`` (a user's ``--config-dir``s,
    as Hydra's search path lists them) that holds deployment ``name``; None where none does (a
    shipped deployment)."""
    for config_dir in config_dirs:
        folder = Path(config_dir) / "deployment"
        if (folder / f"{name}.yaml").is_file():
            return folder
    return None


def base_deployment(name: str) -> str:
    """Calibrating ``x_calibrated`` (or ``x_recalibrated``) again recalibrates ``x``."""
    return name.removesuffix(CALIBRATED_SUFFIX).removesuffix(RECALIBRATED_SUFFIX)


def calibrated_name(deployment: str, output_dir: Path) -> str:
    """The name of ``deployment``'s calibration written into ``output_dir``:
    ``<deployment>_calibrated``, or ``<deployment>_recalibrated`` where the package ships a
    ``<deployment>_calibrated`` and ``output_dir`` is another folder."""
    name = f"{deployment}{CALIBRATED_SUFFIX}"
    shipped = shipped_deployments()
    if (shipped / f"{name}.yaml").is_file() and output_dir.absolute() != shipped.absolute():
        return f"{deployment}{RECALIBRATED_SUFFIX}"
    return name


def write_override(
    deployment: str,
    rows: Sequence[LabelNeed],
    provenance: dict[str, Any],
    output_dir: Path,
    margin: float = DEFAULT_MARGIN,
    buffer: OneBuffer | None = None,
    profile: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``<deployment>_calibrated.yaml`` into ``output_dir`` (made if missing; named by
    :func:`calibrated_name`), whole or not at all, with the ``calibration`` node ``profile``
    where given (:func:`~.override.calibrated_yaml`); returns its path."""
    path = output_dir / f"{calibrated_name(deployment, output_dir)}.yaml"
    output_dir.mkdir(parents=True, exist_ok=True)
    config_dir = output_dir.parent if output_dir.name == "deployment" else None
    shipped = output_dir.absolute() == shipped_deployments().absolute()
    text = calibrated_yaml(
        deployment, per_resource(rows), provenance, margin, buffer, profile,
        config_dir=None if shipped else config_dir, name=path.stem,
    )  # fmt: skip
    write_whole(path, text)
    return path
