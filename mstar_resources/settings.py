"""The settings of the two apps, as the schemas of their primary configs.

Registered in Hydra's ConfigStore (``mstar_resources_settings``, ``mstar_calibrate_settings``) and
listed first in ``conf/mstar_resources.yaml`` and ``conf/mstar_resources_calibrate.yaml``, so a
bad value (``format=xml``, ``margin=lots``) or a misspelled setting fails while Hydra composes,
naming the key. Each field's ``expects`` is how an error says what it takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore

from .calibration.override import DEFAULT_MARGIN

__all__ = ["CalibrateSettings", "DryRunSettings", "OutputFormat"]


class OutputFormat(Enum):
    """How ``mstar-resources`` prints its report."""

    table = "table"
    """Aligned columns, for people."""
    json = "json"
    """One JSON document on stdout and nothing else, for programs."""


@dataclass
class _Tree:
    """The keys the shipped tree composes at the top: typed node by node by their own schemas."""

    resources: Any = None
    """The resource tree (``conf/resources``), each resource typed as ``Resource``."""
    calibration: Any = None
    """The deployment's calibration profile, if it has one (``CalibrationProfile``)."""
    calibrated: Any = None
    """What calibration measured, in a ``..._calibrated`` deployment."""


@dataclass
class DryRunSettings(_Tree):
    """``mstar-resources``: resolve the tree and print what it reserves."""

    format: OutputFormat = field(default=OutputFormat.table, metadata={"expects": "table or json"})
    """``table`` for people, ``json`` for programs."""
    device: str = field(default="cpu", metadata={"expects": "cpu, cuda or cuda:N"})
    """``cpu``: a dry run, allocating nothing. ``cuda`` or ``cuda:N``: also make every declared
    workspace there and report what the GPU then holds."""


@dataclass
class CalibrateSettings(_Tree):
    """``mstar-resources-calibrate``: measure a deployment's workspaces on this GPU."""

    margin: float = field(
        default=DEFAULT_MARGIN, metadata={"expects": "a fraction >= 0, e.g. margin=0.1"}
    )
    """Added to each measured need before it is declared, as a fraction of it."""
    device: str = field(default="cuda", metadata={"expects": "cuda or cuda:N"})
    """The GPU to plan on."""
    output_dir: str | None = field(default=None, metadata={"expects": "a folder, or null"})
    """Where ``<deployment>_calibrated.yaml`` goes; null: the installed ``conf/deployment``."""
    progress: bool = field(default=True, metadata={"expects": "true or false"})
    """Show a progress bar on stderr."""


ConfigStore.instance().store(name="mstar_resources_settings", node=DryRunSettings)
ConfigStore.instance().store(name="mstar_calibrate_settings", node=CalibrateSettings)
