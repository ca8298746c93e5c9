"""FlashInfer's workspaces by (plan label, CUDA-graph slot): made on first use at their floors,
handed to wrappers, sealed together, and agreed across the ranks of a group before it seals."""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ..errors import (
    ResourceConfigError,
    ResourceUsageError,
    WorkspaceAgreementError,
    check_argument,
    check_name,
)
from ..floor import INT, Floor, resolve_floor
from ..units import MAX_SLOTS, is_int, plural
from ._buffer import WorkspaceStats, allocate
from ._flashinfer import FLOAT_BUFFER, own_buffers
from ._float_workspace import Workspace, install_int_workspace
from ._int_workspace import IntWorkspace

logger = logging.getLogger("mstar_resources.attn.workspace")

T = TypeVar("T")
Key = tuple[str, int | None]
Identity = tuple[str, str | None, tuple[Key, ...] | None]
"""A pool's owner, config key and served keys: what must match across ranks."""


class WorkspacePool:
    """FlashInfer workspaces, one per (plan label, cg slot).

    Persistent: a wrapper is planned against the buffer it was built with, so these outlive any
    single step. Each starts on ``device`` at ``size_mb``, else ``MSTAR_WORKSPACE_BUFFER_MB``, else
    512. ``owner`` names the resource in what a workspace reports.

    Each key also holds an :class:`IntWorkspace` and its host mirror, shared by the key's wrappers
    in place of the 8 MiB pair each makes (:meth:`build`, :meth:`install`); an int floor of 0
    makes none.

    Keyword-only (:func:`mstar_resources.build_pools` passes them for a declared resource):
    ``int_size_mb``, each int floor (None: the variable, else 8); ``config_key``, the resource's key
    (``resources.attn.decode``), whose ``declared_mb`` and ``int_declared_mb`` errors then name;
    ``serves``, the (label, cg slot) pairs handed out (None: any); ``floors``, both floors already
    resolved.
    """

    def __init__(
        self,
        device: torch.device | str,
        size_mb: int | None = None,
        owner: str = "attention",
        *,
        int_size_mb: int | None = None,
        config_key: str | None = None,
        serves: Iterable[Key] | None = None,
        floors: tuple[Floor, Floor] | None = None,
    ) -> None:
        check_name("owner", owner, "must name who the pool belongs to (e.g. owner='attention')")
        check_argument("config_key", config_key, (str, type(None)), "a config key or None")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError, ValueError, OverflowError):
            raise ResourceUsageError(
                f"device={device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:N'"
            ) from None
        if self.device.type not in ("cuda", "cpu", "meta"):
            raise ResourceUsageError(
                f"device={str(self.device)!r} is not one FlashInfer runs on; make the pools on "
                "'cuda' (or 'cpu' to plan without a GPU)"
            )
        self.owner = owner
        self._config_key = config_key
        if floors is not None and (size_mb, int_size_mb) != (None, None):
            raise ResourceUsageError(
                f"WorkspacePool takes its floors one way: size_mb={size_mb!r} and "
                f"int_size_mb={int_size_mb!r} beside floors={floors!r}; give floors alone (the "
                "floors resolve() gave) or the sizes alone"
            )
        if floors is None:
            setting = "size_mb" if config_key is None else f"{config_key}.declared_mb"
            int_setting = "int_size_mb" if config_key is None else f"{config_key}.int_declared_mb"
            floors = (
                resolve_floor(size_mb, declared_setting=setting),
                resolve_floor(int_size_mb, declared_setting=int_setting, buffer=INT),
            )
        self._floor, self._int_floor = floors
        self.serves = None if serves is None else tuple(dict.fromkeys(_pairs(serves)))
        for label, cg_slot in self.serves or ():
            self._check_key(label, cg_slot)
        self._workspaces: dict[Key, Workspace] = {}
        self._lock = threading.Lock()
        self._sealed = False
        self._sealing = False  # agreeing with a group: workspaces made now are sealing too

    def __repr__(self) -> str:
        return (
            f"WorkspacePool(owner={self.owner!r}, device={str(self.device)!r}, "
            f"floor={self._floor.mb} MB, workspaces={len(self._workspaces)})"
        )

    @property
    def sealed(self) -> bool:
        return self._sealed

    @property
    def floor_bytes(self) -> int:
        """The bytes each workspace starts with."""
        return self._floor.bytes

    @property
    def int_floor_bytes(self) -> int:
        """The bytes each int workspace, and its host mirror, starts with."""
        return self._int_floor.bytes

    def get(self, label: str, cg_slot: int | None = None) -> Workspace:
        """The workspace of ``label`` in CUDA-graph slot ``cg_slot`` (None: eager), made once."""
        key = (label, cg_slot)
        # 0.0 and False are equal to the slot 0 as keys: only an int slot is looked up unchecked.
        workspace = self._workspaces.get(key) if type(cg_slot) in (int, type(None)) else None
        if workspace is not None:
            return workspace
        self._check_key(label, cg_slot)
        with self._lock:
            if key not in self._workspaces:
                self._workspaces[key] = self._make(label, cg_slot)
            return self._workspaces[key]

    def reserve(self) -> int:
        """Make every workspace served now, before an engine sizes its KV cache; the bytes held."""
        for label, cg_slot in self.serves or ():
            self.get(label, cg_slot)
        return self.held_bytes

    @property
    def held_bytes(self) -> int:
        """The bytes of every float workspace made so far."""
        return sum(workspace.tensor.numel() for workspace in self.workspaces().values())

    @property
    def int_held_bytes(self) -> int:
        """The GPU bytes of every int workspace made so far (their host mirrors hold as many)."""
        return sum(s.bytes for s in self.int_stats())

    def build(
        self,
        wrapper_class: Callable[..., T],
        *args: Any,
        label: str,
        cg_slot: int | None = None,
        **kwargs: Any,
    ) -> T:
        """``wrapper_class(float workspace, *args, **kwargs)`` on (``label``, ``cg_slot``)'s
        workspaces (:meth:`install`); plan it through ``pool.get(label, cg_slot).plan``."""
        # A builtin (int, dict, print) is callable too, and would fail on the tensor in its words.
        if not callable(wrapper_class) or getattr(wrapper_class, "__module__", "") == "builtins":
            raise ResourceUsageError(
                f"wrapper_class={wrapper_class!r} must be a FlashInfer wrapper class (e.g. "
                "flashinfer.BatchDecodeWithPagedKVCacheWrapper)"
            )
        workspace = self.get(label, cg_slot)
        wrapper = wrapper_class(workspace.tensor, *args, **kwargs)
        self.install(wrapper, label, cg_slot)
        return wrapper

    def install(self, wrapper: Any, label: str, cg_slot: int | None = None) -> None:
        """Give ``wrapper``, built on (``label``, ``cg_slot``)'s float workspace, that key's int
        workspace and mirror; each plan through :meth:`Workspace.plan` right before it runs."""
        where = self._name(label, cg_slot)
        workspace = self.get(label, cg_slot)
        if own_buffers(wrapper) is None:
            raise ResourceUsageError(
                f"{where}: a {type(wrapper).__name__} keeps no int workspace of its own to "
                "replace; build the wrappers it holds with WorkspacePool.build (a cascade "
                "wrapper plans all its levels before it runs them, so they cannot share one)"
            )
        if getattr(wrapper, FLOAT_BUFFER, None) is not workspace.tensor:
            raise ResourceUsageError(
                f"{where}: the {type(wrapper).__name__} was built on another float buffer; "
                f"build it on pool.get({label!r}, {cg_slot}).tensor, or with WorkspacePool.build"
            )
        install_int_workspace(wrapper, workspace)

    def seal(self, *, group: dist.ProcessGroup | None = None) -> None:
        """The workspaces here keep their addresses from now on, for the graphs about to be
        captured over them, and so does any made later. With a torch.distributed ``group``, its
        ranks first agree: each makes the keys another made and grows each to the largest any
        rank holds; every rank must call it, for the same pool, in the same order."""
        if group is not None:
            if not dist.is_available() or not isinstance(group, dist.ProcessGroup):
                raise ResourceUsageError(
                    f"group={group!r} must be a torch.distributed ProcessGroup (e.g. "
                    "dist.group.WORLD) or None to seal this rank's pool alone"
                )
            if not dist.is_initialized():
                raise ResourceUsageError(
                    "group= is given, and torch.distributed is not initialised; call "
                    "dist.init_process_group first, or seal without a group"
                )
            self._agree(group)
        with self._lock:
            self._sealed = True
            for workspace in self._workspaces.values():
                workspace.seal()
        logger.info("%s", self.summary())

    def _agree(self, group: dist.ProcessGroup) -> None:
        """Agree with ``group`` in two ``all_gather_object`` calls (every rank's pool and sizes,
        then whether each could grow to the largest), growth refused meanwhile lest this rank
        leave the sizes gathered; if it fails, nothing is sealed and plans may grow again."""
        identity = (self.owner, self._config_key, self.serves)
        self._refuse_growth(True)
        try:
            rank, ranks = dist.get_rank(group), dist.get_world_size(group)
            held, int_held = {}, {}
            for key, workspace in self.workspaces().items():
                held[key] = workspace.tensor.numel()
                if workspace.int_workspace is not None:  # grown by int overflows
                    int_held[key] = workspace.int_workspace.tensor.numel()
            every_held, every_int_held = _gather_held(identity, held, int_held, group)
            # Each key any rank made, at the most any rank holds, float and int.
            agreed, int_agreed = _most_held(every_held), _most_held(every_int_held)
            others = plural(ranks - 1, "other rank")
            failure: Exception | None = None
            added = 0
            try:
                for (label, cg_slot), nbytes in agreed.items():
                    int_nbytes = int_agreed.get((label, cg_slot), 0)
                    workspace = self.get(label, cg_slot)
                    added += workspace._grow_to_agree(nbytes, others, int_nbytes)
            except Exception as error:  # told to every rank, then raised here as it was
                failure = error
            _share_outcome(failure, identity, every_held, group)
        except BaseException:
            self._refuse_growth(False)
            raise
        logger.info(
            "rank %d: %s agreed on %d bytes in %d workspaces across %d ranks (+%d grown to agree)",
            rank, _describe(identity), sum(agreed.values()), len(agreed), ranks, added,
        )  # fmt: skip

    def _refuse_growth(self, refused: bool) -> None:
        """Refuse growth, as if sealed, here and in any workspace made from now on."""
        with self._lock:
            self._sealing = refused
            workspaces = list(self._workspaces.values())
        for workspace in workspaces:
            workspace._refuse_growth(refused)

    def workspaces(self) -> dict[Key, Workspace]:
        """The workspaces made so far, by (label, cg slot)."""
        with self._lock:
            return dict(self._workspaces)

    def stats(self) -> list[WorkspaceStats]:
        """One snapshot per float workspace made so far, in the order they were made."""
        return [workspace.stats() for workspace in self.workspaces().values()]

    def int_stats(self) -> list[WorkspaceStats]:
        """One snapshot per int workspace made so far, in the order they were made."""
        return [w.int_workspace.stats() for w in self.workspaces().values() if w.int_workspace]

    def summary(self) -> str:
        """A few lines an engine can log at seal time: the totals, then one line per workspace."""
        stats, int_stats = self.stats(), self.int_stats()
        total = sum(s.bytes for s in stats)
        floors = sum(s.floor_bytes for s in stats)
        int_total = sum(s.bytes for s in int_stats)
        int_floors = sum(s.floor_bytes for s in int_stats)
        head = (
            f"{self.owner}: {plural(len(stats), 'workspace')}, {total:,} bytes "
            f"({total - floors:+,} over their floors), {'sealed' if self._sealed else 'growable'}; "
            f"their int workspaces {int_total:,} bytes ({int_total - int_floors:+,}), and as "
            "many on the host"
        )
        return "\n".join([head, *(f"  {s}" for s in [*stats, *int_stats])])

    def _check_key(self, label: str, cg_slot: int | None) -> None:
        check_name("label", label, "must be a non-empty string naming a plan", f"{self.owner}: ")
        if cg_slot is not None and not (is_int(cg_slot) and 0 <= cg_slot < MAX_SLOTS):
            raise ResourceUsageError(
                f"{self.owner}: cg_slot={cg_slot!r} must be None (eager) or an int from 0 to "
                f"{MAX_SLOTS - 1}, as a resource's cg_slots"
            )
        if self.serves is None or (label, cg_slot) in self.serves:
            return
        labels = list(dict.fromkeys(label for label, _ in self.serves))
        slots = sorted({slot for _, slot in self.serves if slot is not None})
        served = f"in cg slots {slots}" if slots else "eagerly only (cg_slot=None)"
        key = self._config_key
        fix = f"Add the label to {key}.labels or the slot to {key}.cg_slots" if key else ""
        raise ResourceUsageError(
            f"{key or 'pool ' + repr(self.owner)} does not serve ({label!r}, cg_slot={cg_slot}); "
            f"it serves labels {labels} {served}. {fix or 'Ask for one of those'}"
        )

    def _name(self, label: str, cg_slot: int | None) -> str:
        return f"{self.owner}:{label}" + ("" if cg_slot is None else f":cg{cg_slot}")

    def _make(self, label: str, cg_slot: int | None) -> Workspace:
        name = self._name(label, cg_slot)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ResourceConfigError(
                f"workspace {name!r} is made on {self.device}, and torch sees no CUDA device "
                "(torch.cuda.is_available() is False); make the pools on 'cpu' to plan without "
                "a GPU"
            )
        int_workspace = None
        if self._int_floor.bytes:
            int_name = f"{name}:int"
            tensor = self._allocate(int_name, self._int_floor)
            int_workspace = IntWorkspace(tensor, int_name, self._sealed, self._int_floor.setting)
        tensor = self._allocate(name, self._floor)
        workspace = Workspace(
            tensor, name, self._sealed, self._floor.setting, int_workspace=int_workspace
        )
        if self._sealing:
            workspace._refuse_growth(True)
        return workspace

    def _allocate(self, name: str, floor: Floor) -> torch.Tensor:
        """``name``'s floor, zeroed: some FlashInfer backends keep semaphores in it."""
        failed = (
            f"workspace {name!r}: could not allocate its floor of {floor.bytes:,} bytes on "
            f"{self.device}; lower {floor.setting} (now {floor.mb} MB)."
        )
        return allocate(
            floor.bytes, self.device, failed, workspace=name, held_bytes=0, setting=floor.setting
        )


def _pairs(serves: object) -> list[Key]:
    """``serves`` as (label, cg slot) pairs, or the library's error saying what it got."""
    good = isinstance(serves, Iterable) and not isinstance(serves, str | bytes | torch.Tensor)
    pairs = list(serves) if good else []  # type: ignore[call-overload]
    if not good or not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
        raise ResourceUsageError(
            f"serves={serves!r} must be (label, cg slot) pairs, e.g. [('decode', 0), "
            "('prefill', None)], or None to serve any"
        )
    return pairs


# -- the ranks' agreement before a group seals ---------------------------------------------------


def _gather_held(
    identity: Identity,
    held: Mapping[Key, int],
    int_held: Mapping[Key, int],
    group: dist.ProcessGroup,
) -> tuple[dict[int, dict[Key, int]], dict[int, dict[Key, int]]]:
    """Each rank's ``held`` and ``int_held`` bytes by key; raises on every rank alike where their
    pools differ."""
    everyone: list[Any] = [None] * dist.get_world_size(group)  # by rank
    dist.all_gather_object(everyone, (identity, dict(held), dict(int_held)), group=group)
    every_held = {rank: sizes for rank, (_, sizes, _) in enumerate(everyone)}
    every_int_held = {rank: sizes for rank, (*_, sizes) in enumerate(everyone)}
    if len({identity for identity, *_ in everyone}) > 1:
        pools = {}
        for rank, (identity, *_) in enumerate(everyone):
            served = identity[2]
            keys = "any key" if served is None else ", ".join("/".join(map(str, k)) for k in served)
            pools[rank] = f"{_describe(identity)} serving {keys}"
        listed = "; ".join(f"rank {rank}: {described}" for rank, described in pools.items())
        raise WorkspaceAgreementError(
            f"the ranks of the group are sealing different pools ({listed}); every rank must "
            "seal the same pools, in the same order",
            reasons=pools,
            held=every_held,
        )
    return every_held, every_int_held


def _most_held(every_held: Mapping[int, Mapping[Key, int]]) -> dict[Key, int]:
    """Each key any rank holds, at the most any rank holds of it."""
    most: dict[Key, int] = {}
    for sizes in every_held.values():
        for key, nbytes in sizes.items():
            most[key] = max(most.get(key, 0), nbytes)
    return most


def _share_outcome(
    failure: Exception | None,
    identity: Identity,
    every_held: Mapping[int, Mapping[Key, int]],
    group: dist.ProcessGroup,
) -> None:
    """Tell every rank whether this one could grow to agree. A rank that could not raises its own
    ``failure``; the others one naming it, with its error in ``errors``."""
    outcomes: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(outcomes, _picklable(failure), group=group)
    if failure is not None:
        raise failure
    if failed := {rank: error for rank, error in enumerate(outcomes) if error is not None}:
        reasons = {rank: f"{type(error).__name__}: {error}" for rank, error in failed.items()}
        told = "; ".join(f"rank {rank} failed: {reason}" for rank, reason in reasons.items())
        raise WorkspaceAgreementError(
            f"{_describe(identity)} was not sealed on any rank of the group: {told}",
            reasons=reasons,
            held=every_held,
            errors=failed,
        )


def _picklable(error: Exception | None) -> Exception | None:
    """``error`` where it survives a pickle whole, else a RuntimeError with its type and text."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def _describe(identity: Identity) -> str:
    owner, config_key, _ = identity
    return f"pool {owner!r}" + (f" ({config_key})" if config_key else "")
