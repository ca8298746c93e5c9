"""``mstar-resources-calibrate``'s settings, the schema of its primary config."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._internal.limits import bounds
from ..calibration.override import DEFAULT_MARGIN
from ..compose import ComposedTree

__all__ = ["CalibrateSettings"]


@dataclass
class CalibrateSettings(ComposedTree):
    """``mstar-resources-calibrate``: measure a deployment's workspaces on this GPU."""

    margin: float = field(default=DEFAULT_MARGIN, metadata=bounds("a fraction", ge=0, le=10))
    """Added to each measured need before it is declared, as a fraction of it. At most 10 (eleven
    times the need): more is a typo, and would declare floors past the 1 TiB a floor may be."""
    device: str = field(default="cuda", metadata={"expects": "cuda or cuda:N"})
    """The GPU to plan on."""
    output_dir: str | None = field(default=None, metadata={"expects": "a folder, or null"})
    """Where ``<deployment>_calibrated.yaml`` goes (made if missing); null: beside a deployment of
    a ``--config-dir`` (the file lists it under its defaults), else ``calibrated/deployment``."""
    progress: bool = field(default=True, metadata={"expects": "true or false"})
    """Show a progress bar on stderr."""
