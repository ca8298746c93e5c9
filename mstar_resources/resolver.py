"""From a composed ``resources`` tree to resolved records and workspace pools.

The resolver reads data only: it never composes a config (an engine may run it under
``@hydra.main``) and never instantiates a ``_target_`` (a config file must not be able to run code).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import cast

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ._floor import MIB, Floor, FloorSource, is_int, resolve_floor
from .attn.workspace import WorkspacePool
from .errors import ResourceConfigError
from .schema import Resource

__all__ = ["ResolvedResource", "build_pools", "resolve"]

ROOT = "resources"
"""The config key the tree lives under; a resource's full key is ``resources.<path>``."""

_FIELDS = {f.name: f for f in dataclasses.fields(Resource)}


@dataclass(frozen=True)
class ResolvedResource:
    """One declared resource with its floor resolved: what its pool will reserve, and why.

    The fields are the keys of ``mstar-resources format=json``.
    """

    path: str
    """Where it sits below ``resources``, e.g. ``attn.decode``."""
    owner: str
    labels: tuple[str, ...]
    cg_slots: tuple[int, ...]
    """Empty: eager only."""
    declared_mb: int | None
    floor_mb: int
    """The floor of each workspace, in MB: declared, else from the environment, else 512."""
    floor_bytes: int = field(init=False)
    floor_source: FloorSource
    """Where ``floor_mb`` came from: ``declared``, ``env`` or ``default``."""
    floor_setting: str
    """What to change to move the floor: ``resources.<path>.declared_mb`` or the variable."""
    workspaces: int = field(init=False)
    """One per label and slot: ``len(labels) * max(1, len(cg_slots))``."""
    reserved_bytes: int = field(init=False)
    """What the pool holds once every workspace is made: ``workspaces * floor_bytes``."""

    def __post_init__(self) -> None:
        derived = {
            "floor_bytes": self.floor_mb * MIB,
            "workspaces": len(self.labels) * max(1, len(self.cg_slots)),
        }
        derived["reserved_bytes"] = derived["workspaces"] * derived["floor_bytes"]
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @property
    def key(self) -> str:
        """The resource's full config key, e.g. ``resources.attn.decode``."""
        return f"{ROOT}.{self.path}"

    @property
    def floor(self) -> Floor:
        return Floor(self.floor_mb, self.floor_source, self.floor_setting)

    def served(self) -> Iterator[tuple[str, int | None]]:
        """Every (label, cg slot) the resource serves; the slot is None for eager."""
        for label in self.labels:
            for slot in self.cg_slots or (None,):
                yield label, slot


class DeclaredWorkspacePool(WorkspacePool):
    """A pool built from a declared resource: it serves the declared labels and slots only, and
    its sealed workspaces name the setting that sized them."""

    def __init__(self, device: torch.device | str, resource: ResolvedResource) -> None:
        # The floor is passed resolved, so the pool reads no environment of its own.
        super().__init__(device, size_mb=resource.floor_mb, owner=resource.owner)
        self.resource = resource
        self._floor = resource.floor

    def _check_key(self, label: str, cg_slot: int | None) -> None:
        super()._check_key(label, cg_slot)
        if (label, cg_slot) not in self.resource.served():
            key, slots = self.resource.key, list(self.resource.cg_slots)
            raise ResourceConfigError(
                f"{key} does not serve ({label!r}, cg_slot={cg_slot}); it serves labels "
                f"{list(self.resource.labels)} "
                + (f"in cg slots {slots}" if slots else "eagerly only (cg_slot=None)")
                + f". Add the label to {key}.labels or the slot to {key}.cg_slots"
            )


def resolve(
    resources_node: DictConfig | Mapping, env: Mapping[str, str] | None = None
) -> list[ResolvedResource]:
    """One record per resource of the composed ``resources`` tree, in tree order.

    ``env`` (``os.environ`` by default) supplies ``MSTAR_WORKSPACE_BUFFER_MB``. Every problem of
    the tree is collected and raised together as one :class:`ResourceConfigError`.
    """
    env = os.environ if env is None else env
    problems: list[str] = []
    declared: list[tuple[str, Resource]] = []
    reads_env = False
    for path, node in _walk(_as_config(resources_node), ROOT, problems):
        reads_env = reads_env or _reads_env(node)
        resource = _validate(node, f"{ROOT}.{path}", problems)
        if resource is not None:
            declared.append((path, resource))
    if reads_env:  # checked once: a bad variable is one problem, however many resources read it
        try:
            resolve_floor(None, env)
        except ResourceConfigError as error:
            problems.append(str(error))
    if problems:
        raise ResourceConfigError(_report(problems))
    records = []
    for path, resource in declared:
        floor = resolve_floor(resource.declared_mb, env, f"{ROOT}.{path}.declared_mb")
        records.append(
            ResolvedResource(
                path=path,
                owner=resource.owner,
                labels=tuple(resource.labels),
                cg_slots=tuple(resource.cg_slots),
                declared_mb=resource.declared_mb,
                floor_mb=floor.mb,
                floor_source=floor.source,
                floor_setting=floor.setting,
            )
        )
    return records


def build_pools(
    resources_node: DictConfig | Mapping,
    device: torch.device | str,
    env: Mapping[str, str] | None = None,
) -> dict[str, WorkspacePool]:
    """A workspace pool on ``device`` for every resource of the tree, by path. Allocates nothing
    until a workspace is asked for."""
    return {
        record.path: DeclaredWorkspacePool(device, record)
        for record in resolve(resources_node, env)
    }


def _as_config(resources_node: DictConfig | Mapping) -> DictConfig:
    if isinstance(resources_node, DictConfig):
        return resources_node
    if not isinstance(resources_node, Mapping):
        raise ResourceConfigError(
            f"{ROOT}={resources_node!r} is not a mapping; give it resources by name "
            f"(e.g. {ROOT}.attn.decode.labels=[decode])"
        )
    try:
        return OmegaConf.create(dict(resources_node))
    except OmegaConfBaseException as error:
        raise ResourceConfigError(
            f"{ROOT} can't be read as a config: {_first_line(error)}"
        ) from None


def _walk(node: DictConfig, key: str, problems: list[str]) -> Iterator[tuple[str, DictConfig]]:
    """The resources below ``node`` as (path, node): a mapping with a schema field is a resource,
    any other mapping a group of them."""
    for name in node:
        child_key = key + "." + str(name)
        path = child_key.removeprefix(f"{ROOT}.")
        try:
            child = node[name]
        except OmegaConfBaseException as error:
            problems.append(f"{child_key} can't be read: {_first_line(error)}")
            continue
        if name == "_target_":
            problems.append(_no_target(child_key, child))
        elif isinstance(child, DictConfig) and any(str(k) in _FIELDS for k in child):
            yield path, child
        elif isinstance(child, DictConfig):
            yield from _walk(child, child_key, problems)
        else:
            problems.append(
                f"{child_key}={_plain(child)!r} is neither a resource nor a group of them; a "
                f"resource is a mapping of {', '.join(_FIELDS)} (e.g. {child_key}.labels=[decode])"
            )


def _validate(node: DictConfig, key: str, problems: list[str]) -> Resource | None:
    """``node`` as a :class:`Resource`, or None with what is wrong with it added to ``problems``."""
    try:
        values = cast(dict, OmegaConf.to_container(node, resolve=True))
    except OmegaConfBaseException as error:
        problems.append(f"{key} can't be read: {_first_line(error)}")
        return None
    if _typed_as_declared(values):
        # The common case, a node composed through the schema: no conversion needed, so skip
        # OmegaConf's (which costs most of resolve()); Resource's own checks still run.
        return _checked(lambda: Resource(**values), key, problems)
    typed = OmegaConf.structured(Resource)
    before = len(problems)
    for name, value in values.items():
        field_key = f"{key}.{name}"
        if name == "_target_":
            problems.append(_no_target(field_key, value))
        elif name not in _FIELDS:
            problems.append(
                f"{field_key} is not a resource setting; a resource takes {', '.join(_FIELDS)}"
            )
        else:
            try:
                typed[name] = value
            except OmegaConfBaseException as error:
                problems.append(
                    f"{field_key}={value!r} has the wrong type ({_first_line(error)}); "
                    f"set it to {_expects(name)}"
                )
    for name in _FIELDS:
        # A value of the wrong type left the field unset too, and is reported already.
        if OmegaConf.is_missing(typed, name) and values.get(name, "???") == "???":
            problems.append(f"{key}.{name} is not set; set it to {_expects(name)}")
    if len(problems) > before:
        return None
    return _checked(lambda: cast(Resource, OmegaConf.to_object(typed)), key, problems)


def _reads_env(node: DictConfig) -> bool:
    """Whether the resource leaves its floor to the environment (even if it is bad otherwise)."""
    try:
        return node.get("declared_mb") is None
    except OmegaConfBaseException:  # a broken interpolation: _validate reports it
        return False


# What each schema field holds when it needs no conversion. A field missing here takes the slow
# path; test_resolver checks that every field of Resource is here.
_ALREADY_TYPED: dict[str, Callable[[object], bool]] = {
    "owner": lambda v: isinstance(v, str),
    "declared_mb": lambda v: v is None or is_int(v),
    "labels": lambda v: isinstance(v, list) and all(isinstance(label, str) for label in v),
    "cg_slots": lambda v: isinstance(v, list) and all(is_int(slot) for slot in v),
}


def _typed_as_declared(values: dict) -> bool:
    """Every field present, the required ``labels`` included, already has the schema's type."""
    return "labels" in values and all(
        name in _ALREADY_TYPED and _ALREADY_TYPED[name](value) for name, value in values.items()
    )


def _checked(make: Callable[[], Resource], key: str, problems: list[str]) -> Resource | None:
    """``make()``, or None with Resource's own complaints, given their full key, in ``problems``."""
    try:
        return make()
    except ResourceConfigError as error:
        problems.extend(f"{key}.{line}" for line in str(error).splitlines())
        return None


def _expects(name: str) -> str:
    return str(_FIELDS[name].metadata["expects"])


def _plain(value: object) -> object:
    return OmegaConf.to_container(value) if isinstance(value, ListConfig) else value


def _no_target(key: str, value: object) -> str:
    return (
        f"{key}={value!r} is not allowed: resources are data, and nothing in them is "
        "instantiated; remove the key"
    )


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _report(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in the resources config:\n" + "\n".join(
        f"  - {problem}" for problem in problems
    )
