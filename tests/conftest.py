"""What the tests share: GPU tests skip where there is no GPU, saying why; config tests compose the
shipped tree the way an engine or the CLI would, with no floor variable from the environment."""

from __future__ import annotations

import copy
import functools
import gc
import importlib.util
import os

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from mstar_resources.apps.dry_run import DryRunSettings
from mstar_resources.apps.hydra_app import register_settings

VAR = "MSTAR_WORKSPACE_BUFFER_MB"
INT_VAR = "MSTAR_INT_WORKSPACE_BUFFER_MB"


def _why_no_gpu() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch.cuda.is_available() is False"
    if importlib.util.find_spec("flashinfer") is None:
        return "needs FlashInfer: pip install -e '.[flashinfer]'"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """One CPU thread a process, for torch here and in the processes the tests start: pytest -n
    runs a worker a core beside the apps it starts, and torch's own pool of a thread a core would
    have each worker's threads spin waiting for one another (a CPU test's tensors are too small to
    gain from more threads; with another process on the cores the same tests took 4 times as long).
    A user's ``OMP_NUM_THREADS`` is kept for the processes started."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What is alive once the tests are collected (torch, Hydra, every test module and item:
    some 230,000 objects) lives to the end: frozen out of the garbage collector's sight, so that
    each full collection while the tests run walks only what was made since."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _why_no_gpu()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def compose_shipped(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The CLI's primary config composed through the Compose API, with ``overrides``: a copy of
    its own for each caller, of one compose a test process for each list of overrides (the tests
    ask some 130 composes of 40 lists, a tenth of a second of CPU each; a copy takes 4 ms)."""
    register_settings("mstar_resources", DryRunSettings)  # as the app does when it runs
    return copy.deepcopy(_composed(tuple(overrides)))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    with initialize_config_module("mstar_resources.conf", version_base="1.3"):
        return compose("mstar_resources", overrides=list(overrides))


@pytest.fixture(autouse=True)
def _no_floor_variable(monkeypatch):
    """The process environment sets no floor unless a test says so."""
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.delenv(INT_VAR, raising=False)
