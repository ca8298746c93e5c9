"""Tests marked ``gpu`` run only where CUDA and FlashInfer are; elsewhere they skip, saying why."""

from __future__ import annotations

import importlib.util

import pytest
import torch


def _why_no_gpu() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch.cuda.is_available() is False"
    if importlib.util.find_spec("flashinfer") is None:
        return "needs FlashInfer: pip install -e '.[flashinfer]'"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _why_no_gpu()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
