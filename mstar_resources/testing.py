"""FlashInfer's overflow, for an engine's own tests of its growth paths on a CPU, without
FlashInfer or a GPU: :class:`OverflowingPlanner` raises it as a wrapper's ``plan`` would::

    workspace = pools["attn.decode"].get("decode", cg_slot=0)
    workspace.plan(OverflowingPlanner(workspace.tensor, [("batch_decode_tmp_v", 3 << 20)]))
    assert workspace.tensor.numel() >= 3 << 20  # grown, as it would be on a GPU
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .units import ALIGNMENT

if TYPE_CHECKING:
    import torch

__all__ = ["OverflowingPlanner", "flashinfer_overflow"]


@functools.cache
def _expressions() -> dict[str, Any]:
    text = importlib.resources.files("mstar_resources.attn").joinpath("flashinfer_overflow.json")
    return dict(json.loads(text.read_text(encoding="utf-8"))["expressions"])


def _render(key: str, **values: object) -> str:
    parts = _expressions()[key]["parts"]
    return "".join(str(values[p["variable"]]) if "variable" in p else p["literal"] for p in parts)


def flashinfer_overflow(
    allocation: str, size: int, available: int, alignment: int = ALIGNMENT
) -> RuntimeError:
    """The error FlashInfer's allocator raises when ``allocation`` (e.g. ``batch_decode_tmp_v``)
    asks for ``size`` bytes with ``available`` left in the workspace."""
    where = _expressions()["overflow"]
    file = Path(
        sysconfig.get_path("purelib"), "flashinfer/data/include/flashinfer", where["header"]
    )
    message = _render(
        "overflow", name=allocation, size=size, alignment=alignment, remaining_space=available
    )
    line, func = where["throw_line"], where["function"]
    return RuntimeError(_render("error_prefix", func=func, file=file, line=line, message=message))


@dataclass
class OverflowingPlanner:
    """A planner that takes ``allocations`` ((name, bytes) each) from ``buffer`` in turn and raises
    :func:`flashinfer_overflow` for the first that does not fit."""

    buffer: torch.Tensor
    allocations: Sequence[tuple[str, int]]
    calls: int = 0

    def __call__(self, *args: object, **kwargs: object) -> None:
        self.calls += 1
        taken = 0
        for name, size in self.allocations:
            padding = -taken % ALIGNMENT
            if taken + padding + size > self.buffer.numel():
                raise flashinfer_overflow(name, size, self.buffer.numel() - taken)
            taken += padding + size
