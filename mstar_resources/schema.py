"""The schema of one declared resource, as engines write it under ``resources`` in their config
(``mstar_resources.conf`` stores it in Hydra's ConfigStore as ``mstar_resources/resource``)."""

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, fields

from omegaconf import MISSING

from .errors import Problem, ResourceConfigError, name_problem
from .floor import INT, MAX_MB, mb_problem, number_text
from .units import MAX_SLOTS

__all__ = ["Resource"]

MAX_ITEMS = MAX_SLOTS
"""The most labels, and the most CUDA-graph slots, one resource may list: each is a workspace of
its own, and an engine has a handful."""
WORKSPACE_MANAGER_LABEL = "workspace_manager"
"""The label of vLLM's WorkspaceManager's floor: sized by vLLM's memory profile, never planned by
calibration."""


@dataclass
class Resource:
    """One resource: a pool of FlashInfer workspaces, one per (plan label, CUDA-graph slot), each a
    float workspace (``declared_mb``) and an int one with its host mirror (``int_declared_mb``)."""

    owner: str = field(default="attention", metadata={"expects": "a non-empty string"})
    """Who the resource belongs to, as logs and errors name its workspaces (``owner:label:cgN``)."""

    declared_mb: int | None = field(
        default=None, metadata={"expects": f"a whole number of MB from 1 to {MAX_MB:,}, or null"}
    )
    """The floor of each workspace, in MB (2**20 bytes). Default null: ``MSTAR_WORKSPACE_BUFFER_MB``
    if set, else 512. Higher reserves more memory up front; lower lets plans grow it at run time."""

    int_declared_mb: int | None = field(
        default=None, metadata={"expects": f"a whole number of MB from 0 to {MAX_MB:,}, or null"}
    )
    """The floor of each int workspace (a plan's indices, kilobytes) and of its host mirror, in
    MB; it grows as the float one does. 0: none, each wrapper keeps its own (calibration's
    value where a wrapper makes its own at each plan, FlashInfer 0.7's MLA). Default null:
    ``MSTAR_INT_WORKSPACE_BUFFER_MB`` if set, else 8 (what each FlashInfer wrapper makes)."""

    labels: list[str] = field(
        default=MISSING, metadata={"expects": "a list of plan labels, e.g. [decode]"}
    )
    """The plan labels the resource serves (``prefill``, ``decode``, ...): non-empty, each once.
    Required: a pool hands out workspaces for these labels only."""

    cg_slots: list[int] = field(
        default_factory=list, metadata={"expects": "a list of slot numbers, e.g. [0, 1]"}
    )
    """The CUDA-graph slots it serves, each a graph context whose buffers must not alias another's
    (e.g. micro-batch overlap's two streams): ints >= 0, each once. ``[]``: eager only."""

    def __post_init__(self) -> None:
        checks: dict[str, Sequence[str | None]] = {
            "owner": _owner_problems(self.owner),
            "declared_mb": [mb_problem("declared_mb", self.declared_mb)],
            "int_declared_mb": [mb_problem("int_declared_mb", self.int_declared_mb, INT)],
            "labels": _label_problems(list(self.labels)),
            "cg_slots": _slot_problems(list(self.cg_slots)),
        }
        found = [
            Problem(
                problem,
                setting=name,
                value=getattr(self, name),
                expects=FIELDS[name].metadata["expects"],
                fix=getattr(problem, "fix", None),
            )
            for name, problems in checks.items()
            for problem in problems
            if problem is not None
        ]
        if found:
            raise ResourceConfigError(*found, where="the resource")


FIELDS = {f.name: f for f in fields(Resource)}


def _owner_problems(owner: object) -> list[str | None]:
    if isinstance(owner, str) and owner.strip():
        return [name_problem("owner", owner)]
    return [f"owner={owner!r} is empty; name who the resource belongs to (e.g. owner=attention)"]


def _label_problems(labels: list[str]) -> list[str | None]:
    if not labels:
        return [
            "labels=[] is empty; list the plan labels the resource serves (e.g. labels=[decode])"
        ]
    if len(labels) > MAX_ITEMS:
        return [f"labels has {len(labels):,} labels; at most {MAX_ITEMS} (each is a workspace)"]
    problems: list[str | None] = []
    if nested := [label for label in labels if not isinstance(label, str)]:
        problems.append(
            f"labels={labels!r} holds {nested[0]!r}, which is not a label; labels is a flat list "
            "of names, e.g. labels=[prefill,decode]"
        )
    elif any(not label.strip() for label in labels):
        problems.append(f"labels={labels!r} has an empty label; give every label a name")
    else:
        problems += (name_problem(f"labels[{i}]", label) for i, label in enumerate(labels))
    if repeated := repeats([label for label in labels if isinstance(label, Hashable)]):
        problems.append(f"labels={labels!r} repeats {repeated}; list each label once")
    return problems


def _slot_problems(slots: list[int]) -> list[str]:
    if len(slots) > MAX_ITEMS:
        return [
            f"cg_slots has {len(slots):,} slots; at most {MAX_ITEMS} (each is a workspace of "
            "every label, for a graph context of its own)"
        ]
    problems = []
    if negative := list(dict.fromkeys(slot for slot in slots if slot < 0)):
        problems.append(
            f"cg_slots={slots!r} has negative slots {negative}; slots are numbered from 0 "
            "(cg_slots=[] means eager only)"
        )
    if large := list(dict.fromkeys(slot for slot in slots if slot >= MAX_ITEMS)):
        problems.append(
            f"cg_slots has slots [{', '.join(map(number_text, large))}] past the largest, "
            f"{MAX_ITEMS - 1}; a slot numbers one of at most {MAX_ITEMS} graph contexts, from 0"
        )
    if repeated := repeats(slots):
        problems.append(f"cg_slots={slots!r} repeats {repeated}; list each slot once")
    return problems


def repeats(items: Sequence[Hashable]) -> list[Hashable]:
    return [item for item, count in Counter(items).items() if count > 1]
