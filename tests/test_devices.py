"""The apps' ``device`` setting as a CUDA device. torch's CUDA queries are monkeypatched with
stand-ins for what a machine with or without GPUs answers, so these run anywhere."""

from __future__ import annotations

import pytest
import torch

from mstar_resources import ResourceConfigError
from mstar_resources.apps.hydra_app import cuda_device, is_cuda_device


@pytest.mark.parametrize(
    ("device", "is_cuda"),
    [("cuda", True), ("cuda:0", True), ("cuda:12", True),
     ("cpu", False), ("tpu", False), ("cuda:", False), ("cuda:x", False), ("CUDA", False)],
)  # fmt: skip
def test_a_cuda_device_is_cuda_or_cuda_n(device, is_cuda):
    assert is_cuda_device(device) is is_cuda


def gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Stand-ins for what torch answers on a machine with ``count`` GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    ("device", "count", "problem"),
    [
        pytest.param("tpu", 1, "device='tpu' is not a CUDA device; set device=cuda:N",
                     id="not-cuda"),
        pytest.param("cuda:0", 0,
                     "device='cuda:0', but torch sees no CUDA device (torch.cuda.is_available() "
                     "is False); plan on a GPU", id="no-gpu"),
        pytest.param("cuda:2", 2,
                     "device='cuda:2', but there are 2 CUDA devices; set device=cuda:0 to cuda:1",
                     id="no-such-gpu"),
    ],
)  # fmt: skip
def test_a_device_that_is_not_here_is_refused_naming_the_setting(
    monkeypatch, device, count, problem
):
    gpus(monkeypatch, count)
    with pytest.raises(ResourceConfigError) as raised:
        cuda_device(device, "plan on a GPU")
    assert raised.value.problems == (problem,)


@pytest.mark.parametrize(("device", "expected"), [("cuda", "cuda"), ("cuda:1", "cuda:1")])
def test_a_gpu_that_is_here_is_the_device(monkeypatch, device, expected):
    gpus(monkeypatch, 2)
    assert cuda_device(device, "plan on a GPU") == torch.device(expected)
