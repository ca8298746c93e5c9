"""Checks of a calibration profile against the resources it calibrates, before any GPU work: every
label has a plan, graph slots only on graph kinds, one owner a label, backends the installed
FlashInfer has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ResourceConfigError
from ..resolver import ResolvedResource
from .profile import GRAPH_KINDS, CalibrationProfile, PlanKind

if TYPE_CHECKING:  # torch loads when a GPU measures
    import torch


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
