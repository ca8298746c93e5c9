"""Measuring a deployment's workspaces on this GPU: each resource's labels planned on FlashInfer's
wrappers, and their needs by label (the calibration table's rows). The checks before it are in
``checks``, the report of what it found in ``report``, and writing it down in ``deployments``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..resolver import ResolvedResource
from .checks import check_backends, check_labels
from .override import Measured
from .profile import CalibrationProfile
from .shapes import shapes_for
from .versions import check_flashinfer

if TYPE_CHECKING:  # torch and the measuring load when a GPU measures
    import torch

    from .measure import Need


@dataclass(frozen=True)
class LabelNeed:
    """One row of the calibration table."""

    resource: ResolvedResource
    label: str
    need: Need

    @property
    def surplus_bytes(self) -> int:
        """Today's floor less the need: waste if positive, shortfall if negative."""
        return self.resource.floor_bytes - self.need.bytes


def measure_all(
    records: Sequence[ResolvedResource],
    profile: CalibrationProfile,
    device: torch.device,
    show_progress: bool = True,
) -> list[LabelNeed]:
    """Plan every label's bounding shapes through FlashInfer; one row per (resource, label)."""
    from tqdm import tqdm

    from .measure import Planner

    check_labels(records, profile)  # before any kernel is built
    check_flashinfer(profile)
    check_backends(profile, device)
    planner = Planner(profile, device)
    work = [
        (record, label, shapes_for(profile.plans[label], profile, bool(record.cg_slots)))
        for record in records
        for label in record.labels
    ]
    rows = []
    total = sum(len(shapes) for *_, shapes in work)
    with tqdm(total=total, unit="plan", disable=not show_progress, leave=False) as bar:
        for record, label, shapes in work:
            bar.set_description(f"{record.path}/{label}")
            rows.append(LabelNeed(record, label, planner.need(profile.plans[label], shapes, bar)))
    return rows


def per_resource(rows: Sequence[LabelNeed]) -> list[Measured]:
    """A resource's need is the most any of its labels needs: all share one floor. So is its int
    need (None where no label's was measured)."""
    worst: dict[str, LabelNeed] = {}
    int_needs: dict[str, int | None] = {}
    for row in rows:
        path = row.resource.path
        if path not in worst or row.need.bytes > worst[path].need.bytes:
            worst[path] = row
        int_needs[path] = larger_need(int_needs.get(path), row.need.int_bytes)
    return [
        Measured(
            path,
            row.need.bytes,
            f"{row.label}: {row.need.worst or '-'}",
            row.need.method,
            int_needs[path],
        )
        for path, row in worst.items()
    ]


def larger_need(a: int | None, b: int | None) -> int | None:
    """The larger of two needs, either of which may be unmeasured (None)."""
    return b if a is None else a if b is None else max(a, b)
