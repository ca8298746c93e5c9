"""The dry run's settings.

Each app's settings are the schema of its primary config, extend the composed tree
(:class:`~mstar_resources.compose.ComposedTree`) and sit beside the app
(``calibrate_settings.py``). Each app registers its own in Hydra's ConfigStore when it runs, as
``<primary config>_settings`` (``mstar_resources_settings``,
``mstar_resources_calibrate_settings``: see ``hydra_app.hydra_app``), and its
primary config in ``conf/`` lists it first, so a bad value (``format=xml``, ``margin=lots``) or a
misspelled setting fails while Hydra composes, naming the key. Each field's ``expects`` is how an
error says what it takes.
"""

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
