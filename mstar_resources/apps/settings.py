"""The dry run's settings: the schema of its primary config, registered as
``mstar_resources_settings`` when it runs (``hydra_app``), so a bad value fails at compose."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..compose import ComposedTree

__all__ = ["DryRunSettings", "OutputFormat"]


class OutputFormat(Enum):
    """How ``mstar-resources`` prints its report."""

    table = "table"
    """Aligned columns, for people."""
    json = "json"
    """One JSON document on stdout and nothing else, for programs."""


@dataclass
class DryRunSettings(ComposedTree):
    """``mstar-resources``: resolve the tree and print what it reserves."""

    format: OutputFormat = field(default=OutputFormat.table, metadata={"expects": "table or json"})
    """``table`` for people, ``json`` for programs."""
    device: str = field(default="cpu", metadata={"expects": "cpu, cuda or cuda:N"})
    """``cpu``: a dry run, allocating nothing. ``cuda`` or ``cuda:N``: also make every declared
    workspace there and report what the GPU then holds."""
