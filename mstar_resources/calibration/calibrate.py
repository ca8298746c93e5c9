"""Calibrating a deployment on this GPU: the checks before any GPU work, each resource's labels
planned on FlashInfer's wrappers, and the report of their needs against today's floors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._internal.output import format_table
from ..errors import ResourceConfigError
from ..resolver import ResolvedResource
from ..units import MIB
from .override import DEFAULT_MARGIN, Measured, OneBuffer
from .profile import GRAPH_KINDS, CalibrationProfile, PlanKind, check_flashinfer
from .record import declared_mb_for

if TYPE_CHECKING:  # torch and the measuring load when a GPU measures
    import torch

    from .measure import Need


@dataclass(frozen=True)
class LabelNeed:
    """One row of the calibration table."""

    resource: ResolvedResource
    label: str
    need: Need


def check_labels(records: Sequence[ResolvedResource], profile: CalibrationProfile) -> None:
    """Refuse, naming every problem, resources that cannot be calibrated as they run: a label
    without a plan, graph slots on a kind not calibrated under graphs, a prefill graph without
    token counts, a fixed KV split under graphs, a label served by resources of several owners."""
    missing = [f"calibration.plans.{label} (for resources.{r.path})"
               for r in records for label in r.labels if label not in profile.plans]  # fmt: skip
    problems = []
    if missing:
        problems.append(
            f"the profile does not say how these labels are planned; add {', '.join(missing)} "
            f"with a kind ({', '.join(kind.value for kind in PlanKind)})"
        )
    graph_kinds = ", ".join(k.value for k in PlanKind if k in GRAPH_KINDS)
    for r in (r for r in records if r.cg_slots):
        slots = f"resources.{r.path}.cg_slots={list(r.cg_slots)}"
        for label in (label for label in r.labels if label in profile.plans):
            plan, key = profile.plans[label], f"calibration.plans.{label}"
            if plan.kind not in GRAPH_KINDS:
                problems.append(
                    f"{slots} puts {label} under CUDA graphs, but {key}.kind={plan.kind.value}: "
                    f"only {graph_kinds} plans are calibrated under graphs"
                )
            if plan.kind is PlanKind.paged_prefill and not profile.cuda_graph_prefill_tokens:
                problems.append(
                    f"{slots} puts the paged_prefill {label} under CUDA graphs, and "
                    "calibration.cuda_graph_prefill_tokens is empty; list the token counts the "
                    "engine captures prefill graphs for"
                )
            if plan.fixed_split_size > 0 and not plan.disable_split_kv:
                problems.append(
                    f"{key}.fixed_split_size={plan.fixed_split_size} under CUDA graphs "
                    f"(resources.{r.path} has cg_slots): FlashInfer cannot pad a fixed split to a "
                    f"graph; set {key}.disable_split_kv=true, as engines do under graphs"
                )
    owners: dict[str, dict[str, str]] = {}  # label -> owner -> the first resource of it
    for r in records:
        for label in r.labels:
            owners.setdefault(label, {}).setdefault(r.owner, r.path)
    problems += [
        f"calibration.plans.{label} would plan "
        f"{', '.join(f'resources.{p} (owner {o})' for o, p in by_owner.items())} alike; give "
        "their plans different labels"
        for label, by_owner in owners.items()
        if len(by_owner) > 1
    ]
    if problems:
        raise ResourceConfigError("cannot calibrate: " + "; ".join(problems))


def check_backends(profile: CalibrationProfile, device: torch.device) -> None:
    """Refuse a ``fa3`` plan on a GPU other than SM90 (Hopper), the only one it runs on."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    fa3 = [f"calibration.plans.{label}.backend=fa3" for label, plan in profile.plans.items()
           if plan.backend == "fa3"]  # fmt: skip
    if fa3 and (major, minor) != (9, 0):
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

    from .measure import Planner, shapes_for

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


def _most_int(rows: Sequence[LabelNeed]) -> int | None:
    return max((r.need.int_bytes for r in rows if r.need.int_bytes is not None), default=None)


def per_resource(rows: Sequence[LabelNeed]) -> list[Measured]:
    """Each resource's needs: the most any of its labels needs (they share one floor)."""
    by_path: dict[str, list[LabelNeed]] = {}
    for row in rows:
        by_path.setdefault(row.resource.path, []).append(row)
    measured = []
    for path, its in by_path.items():
        worst = max(its, key=lambda row: row.need.bytes)  # the first of those that tie
        where = f"{worst.label}: {worst.need.worst or '-'}"
        measured.append(Measured(path, worst.need.bytes, where, worst.need.method, _most_int(its)))
    return measured


def vllm_formula(batched_tokens: int, heads: int, head_dim: int, per: int = 16) -> int:
    """vLLM's per-token floor of its FlashInfer buffer, in bytes: ``max_num_batched_tokens`` x
    query heads per rank x head dim x ``per`` (``FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM``,
    16 in vLLM 0.26 and 0.33; the vLLM plugin passes the running vLLM's own)."""
    return batched_tokens * heads * head_dim * per


def vllm_formula_bytes(profile: CalibrationProfile) -> int | None:
    """vLLM 0.33's per-token floor under its buffer setting, in bytes; None for MLA models, which
    vLLM runs without FlashInfer on the GPUs calibrated here (SM90)."""
    if any(plan.kind is PlanKind.mla for plan in profile.plans.values()):
        return None
    model = profile.model
    return vllm_formula(profile.limits.max_num_batched_tokens, model.num_qo_heads, model.head_dim)


def one_buffer(
    rows: Sequence[LabelNeed], profile: CalibrationProfile, margin: float = DEFAULT_MARGIN
) -> OneBuffer:
    """What an engine that keeps one buffer for every wrapper and graph size must reserve."""
    worst = max(rows, key=lambda row: row.need.bytes, default=None)
    need = worst.need.bytes if worst else 0
    where = f"{worst.label}: {worst.need.worst}" if worst and worst.need.worst else "-"
    reserve = declared_mb_for(need, margin) * MIB
    return OneBuffer(need, reserve, where, vllm_formula_bytes(profile), _most_int(rows))


def table(
    rows: Sequence[LabelNeed], margin: float = DEFAULT_MARGIN, buffer: OneBuffer | None = None
) -> str:
    """The calibration table, the floors to declare and the one-buffer engines' settings."""
    head = ("resource", "label", "worst shape", "need bytes", "declared today", "waste(+)/short(-)",
            "int need bytes", "int declared today")  # fmt: skip
    body = [
        (
            row.resource.path,
            row.label,
            str(row.need.worst or "-"),
            f"{row.need.bytes:,}",
            f"{row.resource.floor_bytes:,} ({row.resource.floor_source})",
            f"{row.resource.floor_bytes - row.need.bytes:+,}",
            "-" if row.need.int_bytes is None else f"{row.need.int_bytes:,}",
            f"{row.resource.int_floor_bytes:,} ({row.resource.int_floor_source})",
        )
        for row in rows
    ]
    lines = [format_table([head, None, *body]), ""]
    lines += [
        f"{row.resource.path}/{row.label}: FlashInfer refused {len(row.need.refused)} of its "
        f"shapes (an engine cannot plan them either), e.g. {row.need.refused[0]}"
        for row in rows
        if row.need.refused
    ]
    for m in per_resource(rows):
        int_need = ("int_declared_mb", "int need", m.int_need_bytes)
        for key, what, need in (("declared_mb", "need", m.need_bytes), int_need):
            if need is not None:
                mb = declared_mb_for(need, margin)
                lines.append(
                    f"resources.{m.path}.{key} = {mb}  ({what} {need:,} bytes + {margin:.0%})"
                )
    if buffer is not None:
        lines += ["", *buffer.advice()]
    return "\n".join(lines)
