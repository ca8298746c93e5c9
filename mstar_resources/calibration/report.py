"""The calibration's report: the table of needs against floors, where each floor came from, and
what one buffer shared by every wrapper would need."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._internal.table import format_table
from ..resolver import ResolvedResource
from ..units import MIB
from .calibrate import LabelNeed, larger_need, per_resource
from .engine_buffers import vllm_formula_bytes
from .override import DEFAULT_MARGIN, OneBuffer
from .profile import CalibrationProfile
from .record import Machine, calibration_inputs, declared_mb_for

if TYPE_CHECKING:  # torch loads when a GPU measures
    import torch


def one_buffer(
    rows: Sequence[LabelNeed], profile: CalibrationProfile, margin: float = DEFAULT_MARGIN
) -> OneBuffer:
    """What an engine that keeps one buffer for every wrapper and graph size must reserve: every
    plan carves it from offset 0, so the most any single plan needs, plus ``margin``, in whole
    MB."""
    worst = max(rows, key=lambda row: row.need.bytes, default=None)
    need = worst.need.bytes if worst else 0
    where = f"{worst.label}: {worst.need.worst}" if worst and worst.need.worst else "-"
    int_need = None
    for row in rows:
        int_need = larger_need(int_need, row.need.int_bytes)
    return OneBuffer(
        need, declared_mb_for(need, margin) * MIB, where, vllm_formula_bytes(profile), int_need
    )


def provenance(
    profile: CalibrationProfile,
    device: torch.device,
    deployment: str,
    records: Sequence[ResolvedResource],
) -> dict[str, Any]:
    """What the calibration of ``deployment`` depends on, as its override records it (and
    ``record.check_calibration`` compares with what runs)."""
    return {
        "deployment": deployment,
        **calibration_inputs(Machine.here(device), profile, records),
        "date": datetime.date.today().isoformat(),
    }


def table(
    rows: Sequence[LabelNeed], margin: float = DEFAULT_MARGIN, buffer: OneBuffer | None = None
) -> str:
    """The calibration table, the floors to declare and, given ``buffer``, the one-buffer
    engines' settings."""
    head = ("resource", "label", "worst shape", "need bytes", "declared today", "waste(+)/short(-)",
            "int need bytes", "int declared today")  # fmt: skip
    body = []
    for row in rows:
        r = row.resource
        int_need = row.need.int_bytes
        body.append(
            (
                r.path,
                row.label,
                str(row.need.worst or "-"),
                f"{row.need.bytes:,}",
                f"{r.floor_bytes:,} ({r.floor_source})",
                f"{row.surplus_bytes:+,}",
                "-" if int_need is None else f"{int_need:,}",
                f"{r.int_floor_bytes:,} ({r.int_floor_source})",
            )
        )
    lines = [format_table([head, None, *body]), ""]
    for row in rows:
        if row.need.refused:
            lines.append(
                f"{row.resource.path}/{row.label}: FlashInfer refused {len(row.need.refused)} of "
                f"its shapes (an engine cannot plan them either), e.g. {row.need.refused[0]}"
            )
    measured = per_resource(rows)
    for m in measured:
        lines.append(
            f"resources.{m.path}.declared_mb = {declared_mb_for(m.need_bytes, margin)}"
            f"  (need {m.need_bytes:,} bytes + {margin:.0%})"
        )
        if m.int_need_bytes is not None:
            lines.append(
                f"resources.{m.path}.int_declared_mb = "
                f"{declared_mb_for(m.int_need_bytes, margin)}  (int need {m.int_need_bytes:,} "
                f"bytes + {margin:.0%})"
            )
    if buffer is not None:
        lines += ["", *buffer.advice()]
    return "\n".join(lines)
