"""The apps' ``device`` setting: ``cpu`` for a dry run, ``cuda`` or ``cuda:N`` to allocate."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..errors import ResourceConfigError

if TYPE_CHECKING:
    import torch


def is_cuda_device(device: str) -> bool:
    return re.fullmatch(r"cuda(:\d+)?", device) is not None


def cuda_device(device: str, without_gpu: str) -> torch.device:
    """The ``device`` setting as a CUDA device that is here; ``without_gpu`` says what to do
    instead when there is none. Imports torch: only the apps' allocating paths call it."""
    if not is_cuda_device(device):
        raise ResourceConfigError(f"device={device!r} is not a CUDA device; set device=cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise ResourceConfigError(
            f"device={device!r}, but torch sees no CUDA device (torch.cuda.is_available() is "
            f"False); {without_gpu}"
        )
    target = torch.device(device)
    count = torch.cuda.device_count()
    if target.index is not None and target.index >= count:
        raise ResourceConfigError(
            f"device={device!r}, but there are {count} CUDA devices; "
            f"set device=cuda:0 to cuda:{count - 1}"
        )
    return target
