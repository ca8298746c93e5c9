"""What the config tests share: composing the shipped tree the way an engine or the CLI would."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

VAR = "MSTAR_WORKSPACE_BUFFER_MB"


def compose_shipped(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The CLI's primary config composed through the Compose API, with ``overrides``."""
    with initialize_config_module("mstar_resources.conf", version_base="1.3"):
        return compose("mstar_resources", overrides=list(overrides))


@pytest.fixture(autouse=True)
def _no_floor_variable(monkeypatch):
    """The process environment sets no floor unless a test says so."""
    monkeypatch.delenv(VAR, raising=False)
