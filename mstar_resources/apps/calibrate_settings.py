"""``mstar-resources-calibrate``'s settings, the schema of its primary config
(``mstar_resources_calibrate.yaml``); see :mod:`mstar_resources.apps.settings`."""

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
    """Where ``<deployment>_calibrated.yaml`` (or ``_recalibrated``) goes (made if missing); null:
    beside the deployment where it is one of a ``--config-dir`` (whose ``deployment/`` folder
    must hold it: the file lists it under its defaults), else ``calibrated/deployment`` under the
    working directory, found with ``--config-dir calibrated``."""
    progress: bool = field(default=True, metadata={"expects": "true or false"})
    """Show a progress bar on stderr."""
