"""Measuring a deployment's workspaces on this GPU and writing the result down as an override."""

from __future__ import annotations

import datetime
import importlib.resources
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._internal.table import format_table
from ..errors import ResourceConfigError
from ..files import write_whole
from ..resolver import ResolvedResource
from ..units import MIB
from .engine_buffers import vllm_formula_bytes
from .override import DEFAULT_MARGIN, Measured, OneBuffer, calibrated_yaml
from .profile import GRAPH_KINDS, CalibrationProfile, PlanKind
from .record import Machine, calibration_inputs, declared_mb_for
from .shapes import shapes_for
from .versions import check_flashinfer

if TYPE_CHECKING:  # torch and the measuring load when a GPU measures, not for the checks above it
    import torch

    from .measure import Need

CALIBRATED_SUFFIX = "_calibrated"


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


DEFAULT_CONFIG_DIR = Path("calibrated")
"""Where calibrated deployments go by default: a config folder under the working directory,
never the installed package. Hydra finds ``calibrated/deployment/<name>_calibrated.yaml`` through
``--config-dir calibrated`` or ``hydra.searchpath: [file://calibrated]``."""


def shipped_deployments() -> Path:
    """The ``deployment`` group of the installed ``conf`` (the source tree's, when editable):
    where the shipped deployments, calibrated ones included, are."""
    return Path(str(importlib.resources.files("mstar_resources.conf"))) / "deployment"


def default_output_dir() -> Path:
    """The ``deployment`` group of :data:`DEFAULT_CONFIG_DIR`, under the working directory."""
    return DEFAULT_CONFIG_DIR / "deployment"


def how_to_compose(path: Path) -> str:
    """How a config composes the calibrated deployment written at ``path``."""
    name = path.stem
    if path.parent.name != "deployment":
        return f"move it into the deployment/ folder of a config dir, then use deployment={name}"
    if path.parent.absolute() == shipped_deployments().absolute():
        return f"use it with deployment={name}"
    config_dir = path.parent.parent
    return (
        f"use it with --config-dir {config_dir} deployment={name} (or list "
        f"file://{config_dir.absolute()} under hydra.searchpath)"
    )


def base_deployment(name: str) -> str:
    """Calibrating ``x_calibrated`` again recalibrates ``x``."""
    return name.removesuffix(CALIBRATED_SUFFIX)


def check_labels(records: Sequence[ResolvedResource], profile: CalibrationProfile) -> None:
    """Every label of every resource has a plan profile that can be calibrated as it runs, and
    a label names one kind of plan: resources of different owners don't share it."""
    problems = [
        *_labels_without_a_plan(records, profile),
        *_graph_slots_on_eager_kinds(records, profile),
        *_graph_plans_without_sizes(records, profile),
        *_labels_of_several_owners(records),
    ]
    if problems:
        raise ResourceConfigError("cannot calibrate: " + "; ".join(problems))


def _labels_without_a_plan(
    records: Sequence[ResolvedResource], profile: CalibrationProfile
) -> list[str]:
    """Labels the profile has no plan for: calibration cannot tell how they are planned."""
    missing = [
        f"calibration.plans.{label} (for resources.{r.path})"
        for r in records
        for label in r.labels
        if label not in profile.plans
    ]
    if not missing:
        return []
    return [
        f"the profile does not say how these labels are planned; add {', '.join(missing)} "
        f"with a kind ({', '.join(kind.value for kind in PlanKind)})"
    ]


def _graph_slots_on_eager_kinds(
    records: Sequence[ResolvedResource], profile: CalibrationProfile
) -> list[str]:
    """Labels a resource serves under CUDA graphs whose kind is not calibrated under graphs."""
    graph_kinds = ", ".join(k.value for k in PlanKind if k in GRAPH_KINDS)
    return [
        f"resources.{r.path}.cg_slots={list(r.cg_slots)} puts {label} under CUDA graphs, but "
        f"calibration.plans.{label}.kind={plan.kind.value}: only {graph_kinds} plans are "
        "calibrated under graphs"
        for r in records
        if r.cg_slots
        for label in r.labels
        if (plan := profile.plans.get(label)) is not None and plan.kind not in GRAPH_KINDS
    ]


def _graph_plans_without_sizes(
    records: Sequence[ResolvedResource], profile: CalibrationProfile
) -> list[str]:
    """Graph labels calibration could not plan as they run: a prefill graph with no captured
    token counts, a fixed KV split under a graph (FlashInfer refuses a split past the graph's
    padding)."""
    problems = []
    for r in records:
        if not r.cg_slots:
            continue
        for label in r.labels:
            plan = profile.plans.get(label)
            if plan is None:
                continue
            key = f"calibration.plans.{label}"
            if plan.kind is PlanKind.paged_prefill and not profile.cuda_graph_prefill_tokens:
                problems.append(
                    f"resources.{r.path}.cg_slots={list(r.cg_slots)} puts the paged_prefill "
                    f"{label} under CUDA graphs, and calibration.cuda_graph_prefill_tokens is "
                    "empty; list the token counts the engine captures prefill graphs for"
                )
            if plan.fixed_split_size > 0 and not plan.disable_split_kv:
                problems.append(
                    f"{key}.fixed_split_size={plan.fixed_split_size} under CUDA graphs "
                    f"(resources.{r.path} has cg_slots): FlashInfer cannot pad a fixed split to a "
                    f"graph; set {key}.disable_split_kv=true, as engines do under graphs"
                )
    return problems


def _labels_of_several_owners(records: Sequence[ResolvedResource]) -> list[str]:
    """Labels that resources of different owners serve: one plan profile would plan them all."""
    owners: dict[str, dict[str, str]] = {}  # label -> owner -> the first resource of it
    for r in records:
        for label in r.labels:
            owners.setdefault(label, {}).setdefault(r.owner, r.path)
    return [
        f"calibration.plans.{label} would plan "
        f"{', '.join(f'resources.{p} (owner {o})' for o, p in by_owner.items())} alike; give "
        "their plans different labels"
        for label, by_owner in owners.items()
        if len(by_owner) > 1
    ]


def check_backends(profile: CalibrationProfile, device: torch.device) -> None:
    """Every plan's backend runs on ``device``: ``fa3`` needs an SM90 GPU (Hopper)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) == (9, 0):
        return
    fa3 = [f"calibration.plans.{label}.backend=fa3" for label, plan in profile.plans.items()
           if plan.backend == "fa3"]  # fmt: skip
    if fa3:
        name = torch.cuda.get_device_name(device)
        raise ResourceConfigError(
            f"cannot calibrate on {device} ({name}, SM{major}{minor}): {', '.join(fa3)} needs "
            "an SM90 GPU; calibrate on the GPU the engine runs, or plan with fa2 or auto"
        )


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
        int_needs[path] = _most(int_needs.get(path), row.need.int_bytes)
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


def _most(a: int | None, b: int | None) -> int | None:
    """The larger of two needs, either of which may be unmeasured (None)."""
    return b if a is None else a if b is None else max(a, b)


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
        int_need = _most(int_need, row.need.int_bytes)
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


def write_override(
    deployment: str,
    rows: Sequence[LabelNeed],
    provenance: dict[str, Any],
    output_dir: Path,
    margin: float = DEFAULT_MARGIN,
    buffer: OneBuffer | None = None,
) -> Path:
    """Write ``<deployment>_calibrated.yaml`` into ``output_dir`` (made if missing), whole or not
    at all; returns its path."""
    path = output_dir / f"{deployment}{CALIBRATED_SUFFIX}.yaml"
    output_dir.mkdir(parents=True, exist_ok=True)
    write_whole(path, calibrated_yaml(deployment, per_resource(rows), provenance, margin, buffer))
    return path
