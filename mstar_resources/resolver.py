"""From a composed ``resources`` tree to resolved records and workspace pools, reading data only:
never composing (an engine may run it under ``@hydra.main``), never instantiating a ``_target_``
(a config file must not run code). Only :func:`build_pools`, which allocates, imports torch."""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import Problem, ResourceConfigError, ResourceUsageError, check_argument, did_you_mean
from .floor import FLOAT, INT, Floor, read_mb, resolve_floor
from .schema import FIELDS, MAX_ITEMS, Resource, repeats
from .units import is_int

if TYPE_CHECKING:  # the resolver itself runs without torch: only build_pools allocates
    import torch

    from .attn.workspace import WorkspacePool

__all__ = ["ResolvedResource", "build_pools", "declared", "resolve"]

MAX_DEPTH = 32
"""How many groups deep a resource may sit: deeper would exhaust OmegaConf's recursion."""

RESOURCES_KEY = "resources"

_TYPES = typing.get_type_hints(Resource)
_REQUIRED = {name for name, f in FIELDS.items() if f.default == MISSING}
_BUFFERS = {buffer.declared_key: buffer for buffer in (FLOAT, INT)}


@dataclass(frozen=True)
class ResolvedResource:
    """One declared resource with its floors resolved: what its pool will reserve, and why."""

    path: str  # below resources, e.g. attn.decode
    owner: str
    labels: tuple[str, ...]
    cg_slots: tuple[int, ...]  # empty: eager only
    declared_mb: int | None
    int_declared_mb: int | None
    floor: Floor  # each workspace's: declared, else from the environment, else 512 MB
    int_floor: Floor  # each int workspace's (and its host mirror's)

    @property
    def key(self) -> str:
        """The resource's full config key, e.g. ``resources.attn.decode``."""
        return f"{RESOURCES_KEY}.{self.path}"

    @property
    def workspaces(self) -> int:
        """One per label and slot: ``len(labels) * max(1, len(cg_slots))``."""
        return len(self.labels) * max(1, len(self.cg_slots))

    @property
    def reserved_bytes(self) -> int:
        """What the pool holds once every workspace is made (int workspaces: ``int_``)."""
        return self.workspaces * self.floor.bytes

    @property
    def int_reserved_bytes(self) -> int:
        return self.workspaces * self.int_floor.bytes

    def as_json(self) -> dict[str, Any]:
        """The record as ``mstar-resources format=json`` gives it, each floor's fields flat."""
        floor, int_floor = self.floor, self.int_floor
        return {
            "path": self.path, "owner": self.owner, "labels": list(self.labels),
            "cg_slots": list(self.cg_slots), "declared_mb": self.declared_mb,
            "floor_mb": floor.mb, "floor_bytes": floor.bytes, "floor_source": floor.source,
            "floor_setting": floor.setting, "workspaces": self.workspaces,
            "reserved_bytes": self.reserved_bytes, "int_declared_mb": self.int_declared_mb,
            "int_floor_mb": int_floor.mb, "int_floor_bytes": int_floor.bytes,
            "int_floor_source": int_floor.source, "int_floor_setting": int_floor.setting,
            "int_reserved_bytes": self.int_reserved_bytes,
        }  # fmt: skip


def resolve(
    resources_node: DictConfig | Mapping[str, Any], env: Mapping[str, str] | None = None
) -> list[ResolvedResource]:
    """One record per resource of the composed ``resources`` tree, in tree order, floors read from
    ``env`` (``os.environ`` by default); every problem is raised at once (ResourceConfigError)."""
    env = os.environ if env is None else env
    check_argument("env", env, Mapping, "a mapping of environment variables (os.environ) or None")
    problems: list[str] = []
    found: list[tuple[str, Resource]] = []
    for key, node in _walk(_as_config(resources_node), RESOURCES_KEY, problems):
        if resource := _validate(node, key, problems):
            found.append((key, resource))
    problems += [
        f"{key} is declared twice (a dotted key and a nested path both spell it), and one pool "
        "would serve only one of them; declare it once"
        for key in repeats([key for key, _ in found])
    ]
    # Checked once, and even where every floor is declared: a bad value is a mistake either way.
    for buffer in (FLOAT, INT):
        try:
            resolve_floor(None, env, buffer=buffer)
        except ResourceConfigError as error:
            problems.extend(error.problems)
    if problems:
        raise ResourceConfigError(*problems, where="the resources config")
    prefix = f"{RESOURCES_KEY}."
    return [
        declared(key.removeprefix(prefix), r.owner, r.labels, r.cg_slots, r.declared_mb,
                 r.int_declared_mb, env)
        for key, r in found
    ]  # fmt: skip


def declared(
    path: str, owner: str, labels: Sequence[str], cg_slots: Sequence[int] = (),
    declared_mb: int | None = None, int_declared_mb: int | None = None,
    env: Mapping[str, str] | None = None,
) -> ResolvedResource:  # fmt: skip
    """The record of a resource declared with these fields, its floors resolved as in a tree."""
    key = f"{RESOURCES_KEY}.{path}"
    return ResolvedResource(
        path, owner, tuple(labels), tuple(cg_slots), declared_mb, int_declared_mb,
        floor=resolve_floor(declared_mb, env, f"{key}.declared_mb"),
        int_floor=resolve_floor(int_declared_mb, env, f"{key}.int_declared_mb", INT),
    )  # fmt: skip


def build_pools(
    resources: DictConfig | Mapping[str, Any] | Sequence[ResolvedResource],
    device: torch.device | str,
    env: Mapping[str, str] | None = None,
    *,
    reserve: bool = False,
) -> dict[str, WorkspacePool]:
    """A workspace pool on ``device`` for every resource, by path, from the composed ``resources``
    tree or :func:`resolve`'s records; ``reserve`` makes every workspace now."""
    from .attn.workspace import WorkspacePool

    check_argument("reserve", reserve, bool, "True or False")
    env = dict(os.environ) if env is None else env  # the one environment resolve() checks
    if isinstance(resources, DictConfig | Mapping):
        records = resolve(resources, env)
    elif isinstance(resources, list | tuple) and all(
        isinstance(record, ResolvedResource) for record in resources
    ):
        records = list(resources)
    else:
        shown = repr(resources)
        shown = shown if len(shown) <= 60 else f"a {type(resources).__name__} ({shown[:57]}...)"
        raise ResourceUsageError(
            f"build_pools takes the resources tree or the list resolve() returns, and got "
            f"{shown}; e.g. build_pools(cfg.resources, device)"
        )
    pools = {
        record.path: WorkspacePool(
            device,
            owner=record.owner,
            config_key=record.key,
            serves=[(label, slot) for label in record.labels for slot in record.cg_slots or [None]],
            floors=(record.floor, record.int_floor),
        )
        for record in records
    }
    if reserve:
        for pool in pools.values():
            pool.reserve()
    return pools


def _as_config(resources_node: DictConfig | Mapping[str, Any]) -> DictConfig:
    if isinstance(resources_node, DictConfig):
        return resources_node
    if not isinstance(resources_node, Mapping):
        unset = " (unset: null, or deleted with ~resources)" if resources_node is None else ""
        raise ResourceConfigError(
            f"{RESOURCES_KEY}={resources_node!r}{unset} is not a mapping; give it resources by "
            f"name (e.g. {RESOURCES_KEY}.attn.decode.labels=[decode])"
        )
    stack: list[tuple[str, Mapping[str, Any], int]] = [(RESOURCES_KEY, resources_node, 0)]
    while stack:  # not recursive: so deep a tree would exhaust Python's recursion
        key, node, level = stack.pop()
        if level > MAX_DEPTH:
            raise ResourceConfigError(_too_deep(key))
        if long := next((k for k, v in node.items() if isinstance(v, list | tuple)
                         and len(v) > MAX_ITEMS), None):  # fmt: skip
            raise ResourceConfigError(  # before a config of it is made, which takes seconds
                f"{key}.{long} has {len(node[long]):,} items; at most {MAX_ITEMS} (each label and "
                "slot is a workspace of its own)"
            )
        stack += [(f"{key}.{k}", v, level + 1) for k, v in node.items() if isinstance(v, Mapping)]
    try:
        return OmegaConf.create(dict(resources_node))
    except OmegaConfBaseException as error:
        raise ResourceConfigError(
            f"{RESOURCES_KEY} can't be read as a config: {_first_line(error)}"
        ) from None


def _too_deep(key: str) -> str:
    shown = key if len(key) <= 80 else f"{key[:77]}..."
    return (
        f"{shown} is nested more than {MAX_DEPTH} levels below {RESOURCES_KEY}; a resource sits "
        f"under a group or two (e.g. {RESOURCES_KEY}.attn.decode)"
    )


def _walk(
    node: DictConfig, key: str, problems: list[str], level: int = 0
) -> Iterator[tuple[str, DictConfig]]:
    """The resources below ``node`` as (full key, node); any other mapping is a group of them."""
    for name in node:
        child_key = key + "." + str(name)
        try:
            child = node[name]
        except OmegaConfBaseException as error:
            problems.append(f"{child_key} can't be read: {_first_line(error)}")
            continue
        if name == "_target_":
            problems.append(_no_target(child_key, child))
        elif isinstance(child, DictConfig) and not child:
            problems.append(
                f"{child_key} is empty: a resource declares its labels (and owner, floors), a "
                f"group holds resources; give it {child_key}.labels=[...] or leave it out"
            )
        elif isinstance(child, DictConfig) and level + 1 > MAX_DEPTH:  # as _as_config counts
            problems.append(_too_deep(child_key))
        elif isinstance(child, DictConfig) and _is_resource(child):
            yield child_key, child
        elif isinstance(child, DictConfig):
            yield from _walk(child, child_key, problems, level + 1)
        else:
            if isinstance(child, ListConfig):
                child = OmegaConf.to_container(child)
            problems.append(
                f"{child_key}={child!r} is neither a resource nor a group of them; a "
                f"resource is a mapping of {', '.join(FIELDS)} (e.g. {child_key}.labels=[decode])"
            )


def _is_resource(node: DictConfig) -> bool:
    """Whether ``node`` is one resource, not a group: a child that is a mapping makes a group of
    it, whatever its name (``layers: {owner: {labels: [x]}}`` is the resource ``layers.owner``)."""
    if OmegaConf.get_type(node) is Resource or "labels" in node:
        return True
    return any(str(key) in FIELDS and not _is_mapping(node, key) for key in node)


def _is_mapping(node: DictConfig, key: Any) -> bool:
    try:
        return OmegaConf.is_dict(node[key])
    except OmegaConfBaseException:  # unreadable: the resource's check says why
        return False


def _validate(node: DictConfig, key: str, problems: list[str]) -> Resource | None:
    """``node`` as a :class:`Resource`, or None with what is wrong with it added to ``problems``."""
    values: dict[str, Any] | None
    try:
        values = cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))
    except OmegaConfBaseException as error:  # an interpolation: name the field it is in
        field = getattr(error, "key", None)
        where = f"{key}.{field}" if isinstance(field, str) and field in FIELDS else key
        problems.append(f"{where} can't be read: {_first_line(error)}")
        return None
    if not _already_typed(node, values):  # converting is most of resolve()'s cost
        values = _converted(values, key, problems)
    if values is None:
        return None
    try:
        return Resource(**values)
    except ResourceConfigError as error:  # Resource's own complaints, given their full key
        problems.extend(problem.under(f"{key}.") for problem in error.problems)
        return None


def _converted(values: dict[str, Any], key: str, problems: list[str]) -> dict[str, Any] | None:
    """``values`` in the schema's types, as OmegaConf converts; else None, why in ``problems``."""
    typed = OmegaConf.structured(Resource)
    before = len(problems)
    for name, value in values.items():
        field_key = f"{key}.{name}"
        if name == "_target_":
            problems.append(_no_target(field_key, value))
        elif name not in FIELDS:
            takes = ", ".join(FIELDS)
            close = did_you_mean(str(name), FIELDS)
            text = f"{field_key} is not a resource setting{close}; a resource takes {takes}"
            expects = f"one of {takes}"
            problems.append(Problem(text, setting=field_key, value=value, expects=expects))
        else:
            if name in _BUFFERS and isinstance(value, str):  # one rule for a number as text
                try:
                    value = read_mb(field_key, value, _BUFFERS[name])
                except ResourceConfigError as error:
                    problems.extend(error.problems)
                    continue
            try:
                typed[name] = value
            except OmegaConfBaseException:
                problems.append(
                    _problem(f"{field_key}={value!r} has the wrong type", key, name, value)
                )
    for name in FIELDS:
        # A value of the wrong type left the field unset too, and is reported already.
        if OmegaConf.is_missing(typed, name) and values.get(name, MISSING) == MISSING:
            problems.append(_problem(f"{key}.{name} is not set", key, name, MISSING))
    if len(problems) > before:
        return None
    return cast(dict[str, Any], OmegaConf.to_container(typed))


def _already_typed(node: DictConfig, values: dict[str, Any]) -> bool:
    """Whether ``values`` hold every required field, each of its type, and nothing else."""
    if not (_REQUIRED <= values.keys() <= FIELDS.keys()) or MISSING in values.values():
        return False
    if OmegaConf.get_type(node) is Resource:  # OmegaConf checked each value when it was set
        return True
    return all(_is_of_type(value, _TYPES[name]) for name, value in values.items())


def _is_of_type(value: object, hint: object) -> bool:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list:
        return isinstance(value, list) and all(_is_of_type(item, args[0]) for item in value)
    if args:  # a union, e.g. int | None
        return any(_is_of_type(value, arg) for arg in args)
    if hint is int:
        return is_int(value)
    return isinstance(hint, type) and isinstance(value, hint)


def _problem(text: str, key: str, name: str, value: object) -> Problem:
    expects = FIELDS[name].metadata["expects"]
    return Problem(
        f"{text}; set it to {expects}", setting=f"{key}.{name}", value=value, expects=expects
    )


def _no_target(key: str, value: object) -> str:
    return (
        f"{key}={value!r} is not allowed: resources are data, and nothing in them is "
        "instantiated; remove the key"
    )


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__
