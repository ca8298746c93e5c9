"""FlashInfer's workspaces: the scratch a plan reserves its split-KV partials in, and the int
workspace (with its pinned host mirror) it writes its indices to.

What is shared, and on what condition (``docs/workspaces-and-ranks.md`` says it at length):

- A **float workspace** is shared by every wrapper of its (label, cg slot). It holds a plan's
  split-KV partials, written and read within one run, so wrappers that run one after another on
  one stream can share it.
- An **int workspace** is shared by the same wrappers, on one condition: each wrapper is planned
  right before it runs, and no other plan on that int workspace comes between its plan and its
  run (or its graph's replay). It holds the plan's indices from the plan to the run, and a graph
  replays over its fixed addresses. vLLM and SGLang plan their decode wrapper of a graph size
  right before each replay, one wrapper a step; a wrapper that plans several levels before it
  runs them (FlashInfer's cascade) cannot share, and :meth:`WorkspacePool.install` refuses it.
- Its **pinned mirror** is shared with it: a plan writes its indices there, then queues an
  asynchronous copy to the int workspace. A second plan that wrote the mirror before that copy
  ran would hand the first wrapper the second's indices, so :meth:`Workspace.plan` waits for the
  previous plan's copy from the mirror before it plans (a CUDA event, recorded after each plan).
  That is enforced for every plan made through :meth:`Workspace.plan`; a plan called on the
  wrapper directly skips it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .._internal.floor import ENV_VAR, INT, Floor, resolve_floor
from .._internal.limits import name_problem
from ..errors import (
    ResourceConfigError,
    ResourceUsageError,
    WorkspacePlanError,
    WorkspaceSealedError,
    WorkspaceShortError,
)
from ..units import ALIGNMENT, counted, is_int, mb_to_hold
from ._flashinfer import (
    FLOAT_BUFFER,
    INT_BUFFER,
    PINNED_MIRROR,
    buffer_views,
    own_buffers,
    refresh_recorded_size,
)
from ._overflow import Overflow, parse_overflow

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "IntWorkspace",
    "Workspace",
    "WorkspaceGrowthError",
    "WorkspacePool",
    "WorkspaceStats",
    "workspace_bytes",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_GROWTHS_PER_PLAN = 16
"""How many times one plan may grow a workspace. FlashInfer's allocations come in short chains
(``tmp_v`` then ``tmp_s``: two growths at most seen); the bound stops a planner that never fits."""


class WorkspaceGrowthError(WorkspaceShortError, torch.OutOfMemoryError):
    """A workspace could not get the memory it needed; it keeps its old buffer, intact and usable.

    Raised only when the allocator ran out of memory (``torch.OutOfMemoryError``, or the CPU
    allocator's failure to allocate): any other error while growing reaches the caller unchanged.
    Also a ``torch.OutOfMemoryError``, so an engine's out-of-memory handling still catches it.
    Fields: those of :class:`WorkspaceShortError` (``workspace``: its name, or the pool's name for
    the workspace it could not make; ``held_bytes``: what it keeps; ``needed_bytes``: what it
    asked for; ``setting``: reserving it up front, or lowering it, is the fix).
    """


_CPU_ALLOCATOR_FAILED = "DefaultCPUAllocator: can't allocate memory"
"""How torch's CPU allocator says it ran out (``c10/core/impl/alloc_cpu.cpp``): a plain
``RuntimeError``, where a GPU raises ``torch.OutOfMemoryError``."""


_PINNED_ALLOCATOR_FAILED = "CUDA error: out of memory"
"""How torch's pinned host allocator says it ran out (``cudaHostAlloc`` failing, raised through
``C10_CUDA_CHECK``): a ``RuntimeError`` (``torch.AcceleratorError`` in newer torch)."""


def _is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocator running out of memory, and nothing else."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    if type(error) is RuntimeError and _CPU_ALLOCATOR_FAILED in str(error):
        return True
    return isinstance(error, RuntimeError) and _PINNED_ALLOCATOR_FAILED in str(error)


@dataclass(frozen=True)
class WorkspaceStats:
    """What one workspace holds now and how it got there."""

    name: str
    bytes: int
    """Bytes it holds now."""
    floor_bytes: int
    """Bytes it started with."""
    floor_setting: str
    """The setting that sizes its floor: a config key, ``size_mb`` or the variable."""
    times_grown: int
    largest_growth_bytes: int
    """Bytes added by its largest growth (0 if it never grew)."""
    largest_growth_allocation: str | None
    """The FlashInfer allocation that caused that growth."""
    sealed: bool
    grown_to_agree_bytes: int = 0
    """Bytes added at a group seal to match what other ranks hold (0 without a group)."""
    kind: str = "float"
    """``float`` or ``int`` (an :class:`IntWorkspace`, whose pinned mirror holds as many)."""

    def __str__(self) -> str:
        grown = (
            f"grew {self.times_grown}x, largest +{self.largest_growth_bytes:,} "
            f"for {self.largest_growth_allocation}"
            if self.times_grown
            else "never grew"
        )
        if self.grown_to_agree_bytes:
            grown += f", +{self.grown_to_agree_bytes:,} to agree with other ranks"
        sealed = "sealed" if self.sealed else "growable"
        return (
            f"{self.name}: {self.bytes:,} bytes (floor {self.floor_bytes:,} from "
            f"{self.floor_setting}), {grown}, {sealed}"
        )


def workspace_bytes(declared_mb: int | None = None) -> int:
    """The floor of one FlashInfer workspace: what its resource declares, else
    ``MSTAR_WORKSPACE_BUFFER_MB`` (default 512), in bytes (MB = 2**20 bytes)."""
    return resolve_floor(declared_mb).bytes


class Workspace:
    """One FlashInfer float workspace, which wrappers plan against through :meth:`plan`.

    A workspace starts at its floor and a plan that overflows it grows it in place: ``tensor``
    stays the same object, so every wrapper built on it sees the larger buffer, and the workspace
    ends as large as the largest plan made on it. Once sealed (before CUDA graphs are captured over
    it) it never moves, and a plan that does not fit raises :class:`WorkspaceSealedError` naming
    ``floor``, the setting that would have made room.

    Args:
        tensor: the buffer, 1-D ``torch.uint8``, as given to FlashInfer's wrappers.
        name: how errors and logs refer to this workspace.
        sealed: start sealed.
        floor: the setting (config key or environment variable) that sizes this workspace's
            floor; errors and logs name it as the one to raise.
        int_workspace: the int workspace the same wrappers plan their indices into (keyword
            only). Given, a plan through :meth:`plan` that overflows it grows it too, and waits
            for the previous plan's copy from its pinned mirror; :meth:`seal` seals it. None:
            each wrapper keeps the int buffer it made, and an int overflow reaches the caller.
    """

    kind = "float"
    _answer_index = 0
    """Where this kind's bytes are in ``workspace_size()``'s answer (float bytes, int bytes)."""

    def __init__(
        self,
        tensor: torch.Tensor,
        name: str,
        sealed: bool = False,
        floor: str = ENV_VAR,
        *,
        int_workspace: IntWorkspace | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ResourceUsageError(
                f"name={name!r} must be a non-empty string: errors and logs name the workspace"
            )
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
            described = (
                f"{tensor.dim()}-D {tensor.dtype}"
                if isinstance(tensor, torch.Tensor)
                else type(tensor).__name__
            )
            raise ResourceUsageError(
                f"workspace {name!r}: tensor must be a 1-D torch.uint8 tensor, got a {described}"
            )
        if not tensor.is_contiguous():
            raise ResourceUsageError(f"workspace {name!r}: tensor must be contiguous")
        if tensor.data_ptr() % ALIGNMENT:
            raise ResourceUsageError(
                f"workspace {name!r}: tensor starts at {tensor.data_ptr():#x}, which FlashInfer "
                f"cannot use: it must be {ALIGNMENT}-byte aligned (a fresh torch.empty is)"
            )
        self._tensor = tensor
        self._name = name
        self._sealed = sealed
        self._sealing = False  # its group is agreeing: plans may no longer grow it
        self._floor = floor
        # Serialises growth against seal(), so a workspace sealed mid-plan never moves.
        self._lock = threading.Lock()
        self._floor_bytes = tensor.numel()
        self._times_grown = 0
        self._largest_growth: tuple[int, str | None] = (0, None)  # (bytes added, allocation)
        self._grown_to_agree = 0  # bytes added to match other ranks at a group seal
        if int_workspace is not None and not isinstance(int_workspace, IntWorkspace):
            raise ResourceUsageError(
                f"workspace {name!r}: int_workspace={int_workspace!r} must be an IntWorkspace "
                "(or None: each wrapper keeps its own)"
            )
        self._int = int_workspace
        # The wrappers whose attributes were checked for views of this buffer (_refuse_views).
        self._checked: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def int_workspace(self) -> IntWorkspace | None:
        """The int workspace the wrappers on this one plan into (None: each keeps its own)."""
        return self._int

    @property
    def tensor(self) -> torch.Tensor:
        """The buffer wrappers are built on: the same object for the workspace's whole life."""
        return self._tensor

    @property
    def name(self) -> str:
        """How errors and logs refer to this workspace, e.g. ``attention:decode:cg0``."""
        return self._name

    @property
    def sealed(self) -> bool:
        """Whether its buffer keeps its address from now on (see :meth:`seal`)."""
        return self._sealed

    @property
    def floor(self) -> str:
        """The setting that sizes this workspace's floor, which errors name as the one to raise."""
        return self._floor

    def __repr__(self) -> str:
        state = "sealed" if self._sealed else "growable"
        return f"Workspace({self._name!r}, {self._tensor.numel()} bytes, {state})"

    def plan(self, plan: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``plan(*args, **kwargs)``. One that runs short of room grows this workspace to the bytes
        it had taken plus the allocation that failed, and runs again; so does one that runs short
        of the :attr:`int_workspace`, which grows it (and its pinned mirror) the same way.

        MLA's check of the whole buffer before it plans (FlashInfer 0.7.4) counts as running
        short too, and grows the workspace to what it asked for. Any other error reaches the caller
        unchanged: an int overflow without an int workspace, or from a wrapper the library cannot
        find planning on this one's int workspace, included (it grows nothing).

        With an int workspace, the plan first waits until the copy queued by the previous plan
        from its pinned mirror has run (see the module's notes on sharing).
        """
        growths, last = 0, None
        mirrored = self._mirrored()
        self._refuse_views(plan)
        while True:
            # What the plan sees, whatever another thread does.
            have = self._tensor.numel()
            have_int = None if self._int is None else self._int._tensor.numel()
            if mirrored is not None:
                mirrored._wait_for_last_copy()
            try:
                planned = plan(*args, **kwargs)
            except (RuntimeError, ValueError) as error:  # MLA's check raises ValueError
                seen = {self.kind: have, **({} if have_int is None else {"int": have_int})}
                overflow = parse_overflow(error)
                short = self._short_of(overflow, seen, _wrapper_of(plan, args))
                if short is None or overflow is None:
                    raise
                planned_on = seen[short.kind]
                if short._sealed:
                    whole = _whole_plan_need(plan, args, kwargs, short._answer_index)
                    raise short._sealed_error(overflow, whole) from error
                if overflow == last:
                    raise WorkspacePlanError(
                        f"workspace {short._name!r} grew to {planned_on:,} bytes, yet the plan "
                        f"reports the same overflow again ({overflow.allocation}, "
                        f"{overflow.size:,} bytes): it does not plan on this workspace's tensor; "
                        f"{short._build_advice}",
                        workspace=short._name,
                        held_bytes=planned_on,
                    ) from error
                if growths == MAX_GROWTHS_PER_PLAN:
                    raise WorkspacePlanError(
                        f"workspace {short._name!r}: the plan still overflows after "
                        f"{MAX_GROWTHS_PER_PLAN} growths (now {planned_on:,} bytes, "
                        f"{overflow.allocation} asked for {overflow.size:,} more); "
                        "the planner does not converge",
                        workspace=short._name,
                        held_bytes=planned_on,
                    ) from error
                short._grow(overflow, planned_on, error)
                growths, last = growths + 1, overflow
            else:
                if mirrored is not None:
                    mirrored._copy_queued(_wrapper_of(plan, args))
                if self._tensor.numel() != self._floor_bytes:  # grown, here or by another plan
                    refresh_recorded_size(plan, self._tensor)
                return planned

    _build_advice = "build the wrapper on workspace.tensor (or with WorkspacePool.build)"

    def _refuse_views(self, plan: Callable[..., Any]) -> None:
        """Refuse, before it plans on this growable workspace, a wrapper that holds a view of its
        buffer (:func:`_flashinfer.buffer_views`): growth would move the buffer and leave the view
        on the old memory. Each wrapper is checked once; a sealed workspace never moves, so
        views of it are safe."""
        wrapper = getattr(plan, "__self__", None)
        if wrapper is None or self._sealed:
            return
        try:
            if wrapper in self._checked:
                return
        except TypeError:  # no weak references to it: checked at every plan
            pass
        views = buffer_views(wrapper, self._tensor)
        if not views:
            with contextlib.suppress(TypeError):
                self._checked.add(wrapper)
            return
        raise WorkspacePlanError(
            f"workspace {self._name!r} can grow, and the {type(wrapper).__name__} planning "
            f"on it holds views of its buffer ({', '.join(views)}), which growing would "
            "leave on the old memory; give the workspace room for every plan up front "
            f"({self._floor}) and seal it before this wrapper plans",
            workspace=self._name,
            held_bytes=self._tensor.numel(),
        )

    def _short_of(
        self, overflow: Overflow | None, have: dict[str, int], wrapper: Any
    ) -> Workspace | None:
        """The workspace here that ``overflow`` ran short of, or None (not one of ours)."""
        short = None if overflow is None else dict(self._by_kind()).get(overflow.kind)
        # An allocator with more room than this buffer holds was not allocating from it.
        if short is None or overflow is None or (overflow.available or 0) > have[short.kind]:
            return None
        # An int overflow is this int workspace's only where the wrapper is found planning on it:
        # one that keeps its own overflowed that one, and one the library cannot find may too.
        ours = wrapper is not None and getattr(wrapper, INT_BUFFER, None) is short._tensor
        return None if short.kind == "int" and not ours else short

    def _by_kind(self) -> list[tuple[str, Workspace]]:
        """The workspaces a plan through this one may grow, by the kind of overflow."""
        return [(self.kind, self)] + ([] if self._int is None else [(self._int.kind, self._int)])

    def _mirrored(self) -> IntWorkspace | None:
        """The int workspace whose pinned mirror a plan through this one writes, to fence and
        track: none until a wrapper was given it (until then each writes a mirror of its own)."""
        given = self._int
        return given if given is not None and given._wrappers_given else None

    def seal(self) -> None:
        """Keep this buffer's address from now on, and its int workspace's: graphs are about to
        be captured over them."""
        with self._lock:
            self._sealed = True
        if self._int is not None:
            self._int.seal()

    def stats(self) -> WorkspaceStats:
        """A snapshot of this workspace: bytes now, floor, growth history, sealed or not."""
        with self._lock:
            added, allocation = self._largest_growth
            return WorkspaceStats(
                self._name,
                self._tensor.numel(),
                self._floor_bytes,
                self._floor,
                self._times_grown,
                added,
                allocation,
                self._sealed,
                self._grown_to_agree,
                self.kind,
            )

    def _sealed_error(self, overflow: Overflow, whole: int | None) -> WorkspaceSealedError:
        have = self._tensor.numel()
        need = overflow.bytes_needed(have)
        failed = (
            f"{overflow.allocation} asked for {overflow.size:,} bytes in all"
            if overflow.whole_buffer
            else f"{overflow.allocation} asked for {overflow.size:,} bytes, alignment "
            f"{overflow.alignment}, with {have - (overflow.available or 0):,} taken"
        )
        if whole is not None and whole >= need:
            asked, caveat = f"{whole:,} in all, per FlashInfer's workspace_size() ({failed})", ""
        elif overflow.whole_buffer:
            whole, asked, caveat = need, f"{need:,} ({failed})", ""
        else:
            whole = need
            asked = f"at least {need:,} ({failed})"
            caveat = " (allocations after it were not tried and may ask for more)"
        return self._refusal(
            f"workspace {self._name!r} is sealed at {have:,} bytes, and a plan needs {asked}; "
            f"set {self._floor}={mb_to_hold(whole)} or more{caveat}, or plan the largest shape "
            "before sealing",
            needed=whole,
        )

    def _refusal(self, message: str, needed: int) -> WorkspaceSealedError:
        """A sealed workspace's refusal of ``needed`` bytes, with its figures."""
        return WorkspaceSealedError(
            message,
            workspace=self._name,
            held_bytes=self._tensor.numel(),
            needed_bytes=needed,
            setting=self._floor,
            suggested_mb=mb_to_hold(needed),
        )

    def _grow(self, overflow: Overflow, planned_on: int, error: Exception) -> None:
        """Grow to what ``overflow``, from a plan on ``planned_on`` bytes, needs."""
        with self._lock:
            # Sealed while the plan ran, or being sealed with a group: the ranks have agreed on
            # sizes that a growth now would leave behind.
            if self._sealed or self._sealing:
                raise self._sealed_error(overflow, None) from error
            have, need = self._tensor.numel(), overflow.bytes_needed(planned_on)
            added = self._resize(need, overflow.allocation)
            if not added:  # another plan grew it meanwhile
                return
            self._times_grown += 1
            if added > self._largest_growth[0]:
                self._largest_growth = (added, overflow.allocation)
        logger.info(
            "workspace %r grew from %d to %d bytes for %s; set %s=%d to reserve it up front",
            self._name,
            have,
            need,
            overflow.allocation,
            self._floor,
            mb_to_hold(need),
        )

    def _begin_sealing(self, sealing: bool = True) -> None:
        """Refuse growth by plans from now on (``sealing``), while the group agrees on sizes;
        ``False`` lifts it again, when the agreement failed and nothing was sealed."""
        with self._lock:
            self._sealing = sealing
        if self._int is not None:
            self._int._begin_sealing(sealing)

    def _grow_to_agree(self, nbytes: int, ranks: str) -> int:
        """Grow to ``nbytes``, what ``ranks`` hold of this workspace; returns the bytes added."""
        with self._lock:
            have = self._tensor.numel()
            if self._sealed and have < nbytes:
                raise self._refusal(
                    f"workspace {self._name!r} is sealed at {have:,} bytes, and {ranks} hold "
                    f"{nbytes:,}; seal with the group before any rank seals alone",
                    needed=nbytes,
                )
            added = self._resize(nbytes, f"agreement with {ranks}")
            self._grown_to_agree += added
            return added

    def _refuse_beyond_any_gpu(self, need: int, cause: str) -> None:
        """A growth to more bytes than a tensor's size can count (2**63) is refused, the buffer
        kept: torch would raise a ``TypeError`` of its own. Anything less is asked of the
        allocator, whose refusal is a :class:`WorkspaceGrowthError` too."""
        if need >= 1 << 63:
            have = self._tensor.numel()
            raise self._growth_refusal(
                f"workspace {self._name!r}: {cause} asks to grow it from {have:,} to {need:,} "
                f"bytes, more than any GPU holds (or a tensor can count); it keeps its "
                f"{have:,}-byte buffer. The plan's arguments are likely wrong",
                needed=need,
            )

    def _growth_refusal(self, message: str, needed: int) -> WorkspaceGrowthError:
        """This workspace's refusal to grow to ``needed`` bytes, with its figures."""
        return WorkspaceGrowthError(
            message,
            workspace=self._name,
            held_bytes=self._tensor.numel(),
            needed_bytes=needed,
            setting=self._floor,
        )

    def _resize(self, need: int, cause: str) -> int:
        """Move onto a buffer of ``need`` bytes, old bytes kept and the tail zeroed; returns the
        bytes added (0 if it holds that many already). The caller holds the lock."""
        have = self._tensor.numel()
        if have >= need:
            return 0
        self._refuse_beyond_any_gpu(need, cause)
        try:
            # A failed resize_() leaves the tensor claiming storage it does not have, so the
            # new buffer is made whole before the tensor moves onto it.
            grown = torch.empty(need, dtype=torch.uint8, device=self._tensor.device)
        except RuntimeError as error:
            if not _is_out_of_memory(error):
                raise
            raise self._growth_refusal(
                f"workspace {self._name!r}: could not grow from {have:,} to {need:,} bytes for "
                f"{cause}; it keeps its {have:,}-byte buffer. Free device memory, or set "
                f"{self._floor} so the workspace is reserved up front. ({error})",
                needed=need,
            ) from error
        # Any error from here on (a broken CUDA context, say) is not a shortage: it reaches the
        # caller as it was raised, and the tensor has not moved.
        _wait_for_every_stream(self._tensor)
        grown[:have].copy_(self._tensor)
        grown[have:].zero_()
        # The copy is queued on the current stream, and the old block goes back to the stream it
        # was made on as soon as the tensor lets go of it: waited for first, or another tensor of
        # that stream could take the block while the copy still reads it.
        _wait_for_every_stream(self._tensor)
        self._tensor.set_(grown.untyped_storage())
        return need - have


class IntWorkspace(Workspace):
    """One FlashInfer int workspace and its pinned host mirror: where a plan writes its indices
    (on the host, then copied to the GPU), and where the wrapper's run and its graph read them.

    It grows and seals as a float workspace does, on an int allocation that does not fit, and its
    mirror always holds as many bytes as it does: FlashInfer sizes the plan's int allocator by the
    GPU buffer and writes the mirror at the same offsets. Usually made by a pool with its float
    workspace (:attr:`Workspace.int_workspace`) and handed to wrappers by
    :meth:`WorkspacePool.build` or :meth:`WorkspacePool.install`.

    Args:
        tensor: the GPU buffer, 1-D ``torch.uint8``.
        name: how errors and logs refer to it, e.g. ``attention:decode:cg0:int``.
        sealed: start sealed.
        floor: the setting that sizes its floor (``MSTAR_INT_WORKSPACE_BUFFER_MB`` by default).
        mirror: its host mirror (keyword only): a 1-D ``torch.uint8`` CPU tensor of the same
            bytes, pinned where ``tensor`` is on a GPU. Default: a fresh one.
    """

    kind = "int"
    _answer_index = 1
    _build_advice = "give the wrapper this int workspace with WorkspacePool.install"

    def __init__(
        self,
        tensor: torch.Tensor,
        name: str,
        sealed: bool = False,
        floor: str = INT.env_var,
        *,
        mirror: torch.Tensor | None = None,
    ) -> None:
        super().__init__(tensor, name, sealed, floor)
        if mirror is None:
            mirror = _host_mirror(tensor.numel(), tensor)
        elif not (
            isinstance(mirror, torch.Tensor)
            and mirror.device.type == "cpu"
            and mirror.dtype == torch.uint8
            and mirror.dim() == 1
            and mirror.numel() == tensor.numel()
            and (mirror.is_pinned() or not tensor.is_cuda)
        ):
            raise ResourceUsageError(
                f"int workspace {name!r}: mirror must be a 1-D torch.uint8 CPU tensor of "
                f"{tensor.numel():,} bytes, pinned where the workspace is on a GPU (or None: one "
                "is made)"
            )
        self._mirror = mirror
        self._last_copy: torch.cuda.Event | None = None
        """Recorded after each plan: the copy it queued from the mirror has run once it has."""
        self._last_planner: weakref.ref[Any] | None = None
        """The wrapper whose plan the workspace holds now (its last plan through Workspace.plan)."""
        self._wrappers_given = False
        """Whether a wrapper plans on it (install_int_workspace): until then a plan writes a
        mirror of the wrapper's own, and nothing here needs fencing or tracking."""

    @property
    def mirror(self) -> torch.Tensor:
        """The pinned host buffer a plan writes its indices to before they are copied to
        :attr:`tensor`: the same object, and as many bytes, for the workspace's whole life."""
        return self._mirror

    def _by_kind(self) -> list[tuple[str, Workspace]]:
        return [(self.kind, self)]

    def _mirrored(self) -> IntWorkspace | None:
        return self if self._wrappers_given else None

    def _wait_for_last_copy(self) -> None:
        """Wait for the copy the previous plan queued from the mirror, before a plan rewrites it
        (asked first: it has almost always run, and asking costs less than waiting)."""
        copy = self._last_copy
        if copy is not None and not copy.query():
            copy.synchronize()

    def _copy_queued(self, planner: Any = None) -> None:
        """Mark where the plan just made (by wrapper ``planner``, where known) queued its copy from
        the mirror (the current stream), and whose plan the workspace now holds."""
        self._last_planner = None if planner is None else weakref.ref(planner)
        if self._tensor.is_cuda:
            if self._last_copy is None:
                self._last_copy = torch.cuda.Event()
            self._last_copy.record(torch.cuda.current_stream(self._tensor.device))

    def check_planned_by(self, wrapper: Any) -> None:
        """Raise :class:`WorkspacePlanError` unless the last plan this workspace holds is
        ``wrapper``'s (or no plan through :meth:`Workspace.plan` named a wrapper yet): a wrapper
        that ran now would read another wrapper's indices. Called by the ``run`` of every wrapper
        :func:`install_int_workspace` gave this workspace, eagerly and at graph capture; a graph
        replay runs no Python, and relies on the rule alone."""
        last = self._last_planner
        planner = None if last is None else last()
        if planner is not None and planner is not wrapper:
            raise WorkspacePlanError(
                f"int workspace {self._name!r} holds the plan of another {type(planner).__name__} "
                f"({id(planner):#x}), made after this {type(wrapper).__name__}'s "
                f"({id(wrapper):#x}); wrappers that share an int workspace must each be planned "
                "right before they run (or before their graph is captured or replayed)",
                workspace=self._name,
                held_bytes=self._tensor.numel(),
            )

    def _resize(self, need: int, cause: str) -> int:
        """Grow the GPU buffer and the mirror together; if either cannot be had, both keep their
        buffers. The caller holds the lock."""
        have = self._tensor.numel()
        if have >= need:
            return 0
        self._refuse_beyond_any_gpu(need, cause)
        try:
            grown_mirror = _host_mirror(need, self._tensor)
        except RuntimeError as error:
            if not _is_out_of_memory(error):
                raise
            raise self._growth_refusal(
                f"int workspace {self._name!r}: could not grow its pinned host mirror from "
                f"{have:,} to {need:,} bytes for {cause}; both keep their {have:,}-byte buffers. "
                f"Set {self._floor} so the workspace is reserved up front. ({error})",
                needed=need,
            ) from error
        added = super()._resize(need, cause)  # waits for every stream: no copy still reads it
        self._mirror.set_(grown_mirror.untyped_storage())
        return added


def _host_mirror(nbytes: int, like: torch.Tensor) -> torch.Tensor:
    """A host buffer of ``nbytes`` for an int workspace like ``like``: pinned where ``like`` is on
    a GPU (an asynchronous copy needs it), plain memory on a CPU (where nothing is pinned)."""
    return torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=like.is_cuda)


def int_buffers(wrapper: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The int workspace and host mirror ``wrapper`` plans on now (its own, or one it was given);
    None where it keeps none (:func:`own_buffers`)."""
    own = own_buffers(wrapper)
    return None if own is None else (own[INT_BUFFER], own[PINNED_MIRROR])


def install_int_workspace(wrapper: Any, workspace: Workspace, where: str) -> bool:
    """Give ``wrapper`` the int workspace of ``workspace`` and its mirror, in place of its own;
    False (and ``wrapper`` left as it is) where it keeps none to replace (:func:`own_buffers`).
    ``where`` names the key in errors."""
    own = own_buffers(wrapper)
    int_workspace = workspace.int_workspace
    if int_workspace is None:
        raise ResourceUsageError(f"{where}: workspace {workspace.name!r} has no int workspace")
    if own is None:
        return False
    # Assigned, not reset_workspace_buffer(): that would allocate a pinned mirror of its own.
    own[INT_BUFFER] = int_workspace.tensor
    own[PINNED_MIRROR] = int_workspace.mirror
    int_workspace._wrappers_given = True
    run = own.get("run") or getattr(wrapper, "run", None)
    run = getattr(run, "_unchecked", run)  # given another int workspace before: not that check
    if callable(run):
        own["run"] = _checked_run(run, wrapper, int_workspace)
    return True


def _checked_run(
    run: Callable[..., T], wrapper: Any, int_workspace: IntWorkspace
) -> Callable[..., T]:
    """``run``, which first checks that ``int_workspace`` holds ``wrapper``'s own plan."""

    @functools.wraps(run)
    def checked(*args: Any, **kwargs: Any) -> T:
        int_workspace.check_planned_by(wrapper)
        return run(*args, **kwargs)

    # Not functools' __wrapped__: FlashInfer 0.7 decorates run() itself, and its __wrapped__ is
    # the undecorated, unbound function.
    checked._unchecked = run  # type: ignore[attr-defined]
    return checked


def _wrapper_of(plan: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """The wrapper a plan plans: its bound ``plan``'s object, or the first argument of a module
    function that takes it (vLLM's ``fast_plan_decode(wrapper, ...)``); None if neither."""
    bound = getattr(plan, "__self__", None)
    if bound is not None and own_buffers(bound) is not None:
        return bound
    if args and own_buffers(args[0]) is not None:
        return args[0]
    return None


def _device(device: object) -> torch.device:
    """``device`` as a torch device, or the library's error saying why not."""
    try:
        found: torch.device = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError):
        raise ResourceUsageError(
            f"device={device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:N'"
        ) from None
    return found


def _pairs(serves: object) -> list[tuple[str, int | None]]:
    """``serves`` as (label, cg slot) pairs, or the library's error saying what it got."""
    good = not isinstance(serves, str | bytes) and isinstance(serves, Iterable)
    pairs = list(serves) if good else []  # type: ignore[call-overload]
    if not good or not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
        raise ResourceUsageError(
            f"serves={serves!r} must be (label, cg slot) pairs, e.g. [('decode', 0), "
            "('prefill', None)], or None to serve any"
        )
    return pairs


def _wait_for_every_stream(tensor: torch.Tensor) -> None:
    """Wait until no CUDA stream can still use ``tensor``'s storage, before it is copied and
    handed back to the caching allocator.

    The allocator knows only the stream a block was allocated on. Work another stream queued on
    the old buffer (an engine's second micro-batch, a copy) would otherwise land after the copy
    (lost) or in whatever the allocator hands out next from the old block (seen on an H200: a
    write queued behind a 1.5 s kernel on a side stream overwrote a fresh tensor of the old
    size). Which streams used the buffer is not known here, and growth is rare (warm-up), so the
    whole device is synchronised rather than a ``record_stream`` per stream."""
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)


def _whole_plan_need(
    plan: Callable[..., Any], args: Any, kwargs: Any, index: int = 0
) -> int | None:
    """What the whole plan needs of one buffer (``index`` 0: float, 1: int), where its FlashInfer
    wrapper can say without planning.

    Decode and paged-prefill wrappers answer ``workspace_size()`` (float bytes, int bytes) with
    the arguments of ``plan()``; anything else, or any failure, gives None. Asked only on the way
    to a sealed error, never on a plan that fits.
    """
    query = getattr(getattr(plan, "__self__", None), "workspace_size", None)
    if not callable(query):
        return None
    try:
        answer = query(*args, **kwargs)
        need = answer[index] if isinstance(answer, tuple) else (answer if index == 0 else None)
    except Exception:  # not this wrapper's arguments, or no query for its backend
        return None
    return need if is_int(need) else None


class WorkspacePool:
    """FlashInfer workspaces, one per (plan label, cg slot).

    Persistent: a wrapper is planned against the buffer it was built with, so these outlive any
    single step. Each starts at the floor ``size_mb`` resolves to (``size_mb``, else
    ``MSTAR_WORKSPACE_BUFFER_MB``, else 512) on ``device``. ``owner`` names the resource in what a
    workspace reports.

    Each key also holds an int workspace and its pinned host mirror (:class:`IntWorkspace`, at the
    floor ``int_size_mb`` resolves to: else ``MSTAR_INT_WORKSPACE_BUFFER_MB``, else 8), which the
    wrappers of the key share in place of the 8 MiB pair each FlashInfer wrapper makes for
    itself. :meth:`build` makes a wrapper on both; :meth:`install` gives them to one an engine
    made. See the module's notes for when sharing them is safe.

    A pool built from a declared resource (see :func:`mstar_resources.build_pools`) says so with
    the keyword-only arguments:

    Args:
        int_size_mb: the floor of each int workspace, in MB (None: the variable, else 8).
        config_key: the resource's key in the config, e.g. ``resources.attn.decode``. Its
            ``declared_mb`` and ``int_declared_mb`` are then the settings that ``size_mb`` and
            ``int_size_mb`` came from, and errors point there.
        serves: the (label, cg slot) pairs the pool hands out; None (the default) serves any.
        env: where ``MSTAR_WORKSPACE_BUFFER_MB`` and ``MSTAR_INT_WORKSPACE_BUFFER_MB`` are read
            (``os.environ`` by default).
        floors: the float and int floors already resolved, each with its source and setting
            (``build_pools`` passes its records'): taken as they are, the environment unread.
    """

    def __init__(
        self,
        device: torch.device | str,
        size_mb: int | None = None,
        owner: str = "attention",
        *,
        int_size_mb: int | None = None,
        config_key: str | None = None,
        serves: Iterable[tuple[str, int | None]] | None = None,
        env: Mapping[str, str] | None = None,
        floors: tuple[Floor, Floor] | None = None,
    ) -> None:
        if not isinstance(owner, str) or not owner.strip():
            raise ResourceUsageError(
                f"owner={owner!r} must name who the pool belongs to (e.g. owner='attention')"
            )
        if (problem := name_problem("owner", owner)) is not None:
            raise ResourceUsageError(problem)
        self._device = _device(device)
        self._size_mb = size_mb
        self._owner = owner
        self._config_key = config_key
        self._int_size_mb = int_size_mb
        if floors is None:
            setting = "size_mb" if config_key is None else f"{config_key}.declared_mb"
            int_setting = "int_size_mb" if config_key is None else f"{config_key}.int_declared_mb"
            floors = (
                resolve_floor(size_mb, env, setting),
                resolve_floor(int_size_mb, env, int_setting, INT),
            )
        self._floor, self._int_floor = floors
        self._serves = None if serves is None else tuple(dict.fromkeys(_pairs(serves)))
        for label, cg_slot in self._serves or ():
            self._check_key(label, cg_slot)
        self._workspaces: dict[tuple[str, int | None], Workspace] = {}
        self._lock = threading.Lock()
        self._sealed = False
        self._sealing = False  # agreeing with a group: workspaces made now are sealing too

    def __repr__(self) -> str:
        return (
            f"WorkspacePool(owner={self.owner!r}, device={str(self.device)!r}, "
            f"floor={self._floor.mb} MB, workspaces={len(self._workspaces)})"
        )

    @property
    def device(self) -> torch.device:
        """Where the workspaces are made."""
        return self._device

    @property
    def owner(self) -> str:
        """Who the pool belongs to: the first part of each workspace's name."""
        return self._owner

    @property
    def size_mb(self) -> int | None:
        """The floor asked for, in MB; None: the variable's, else the default."""
        return self._size_mb

    @property
    def int_size_mb(self) -> int | None:
        """The int floor asked for, in MB; None: the variable's, else the default."""
        return self._int_size_mb

    @property
    def config_key(self) -> str | None:
        """The resource's key in the config (``resources.attn.decode``), or None."""
        return self._config_key

    @property
    def sealed(self) -> bool:
        return self._sealed

    @property
    def serves(self) -> tuple[tuple[str, int | None], ...] | None:
        """The (label, cg slot) pairs this pool hands out, in declared order; None: any."""
        return self._serves

    @property
    def floor_bytes(self) -> int:
        """The bytes each workspace starts with."""
        return self._floor.bytes

    @property
    def int_floor_bytes(self) -> int:
        """The bytes each int workspace, and its pinned mirror, starts with."""
        return self._int_floor.bytes

    def get(self, label: str, cg_slot: int | None = None) -> Workspace:
        """The workspace of plans labelled ``label`` in CUDA-graph slot ``cg_slot`` (None: eager),
        made on first use. Safe to call from several threads: one key never gets two."""
        key = (label, cg_slot)
        workspace = self._workspaces.get(key)
        if workspace is not None:
            return workspace
        self._check_key(label, cg_slot)
        with self._lock:
            workspace = self._workspaces.get(key)
            if workspace is None:
                workspace = self._make(label, cg_slot)
                self._workspaces[key] = workspace
            return workspace

    def reserve(self) -> int:
        """Make, now, every workspace this pool serves (a pool built from the config: every
        declared label and slot), so an engine takes their memory before it sizes its KV cache
        from what is left. Returns the bytes the pool holds."""
        for label, cg_slot in self._serves or ():
            self.get(label, cg_slot)
        return self.held_bytes

    @property
    def held_bytes(self) -> int:
        """The bytes of every float workspace made so far."""
        return sum(workspace.tensor.numel() for workspace in self.workspaces().values())

    @property
    def int_held_bytes(self) -> int:
        """The GPU bytes of every int workspace made so far; their pinned mirrors on the host hold
        as many."""
        return sum(w.tensor.numel() for w in self.int_workspaces().values())

    def int_workspaces(self) -> dict[tuple[str, int | None], IntWorkspace]:
        """The int workspaces made so far, by (label, cg slot)."""
        return {key: w.int_workspace for key, w in self.workspaces().items() if w.int_workspace}

    def build(
        self,
        wrapper_class: Callable[..., T],
        *args: Any,
        label: str,
        cg_slot: int | None = None,
        **kwargs: Any,
    ) -> T:
        """``wrapper_class(float workspace, *args, **kwargs)``: a FlashInfer wrapper built on the
        float workspace of (``label``, ``cg_slot``) and given its int workspace and pinned mirror
        (:meth:`install`). Plan it through ``pool.get(label, cg_slot).plan``::

            decode = pool.build(flashinfer.BatchDecodeWithPagedKVCacheWrapper, "NHD",
                                label="decode", cg_slot=0, use_cuda_graph=True, ...)
            pool.get("decode", 0).plan(decode.plan, indptr, indices, last_page_len, ...)
        """
        workspace = self.get(label, cg_slot)
        wrapper = wrapper_class(workspace.tensor, *args, **kwargs)
        self.install(wrapper, label, cg_slot)
        return wrapper

    def install(self, wrapper: Any, label: str, cg_slot: int | None = None) -> None:
        """Give ``wrapper``, a FlashInfer wrapper built on the float workspace of (``label``,
        ``cg_slot``), that key's int workspace and pinned mirror in place of its own (which it
        then drops). Its plans must go through that float workspace's :meth:`Workspace.plan`,
        each right before the wrapper runs (the module's notes say why)."""
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
        install_int_workspace(wrapper, workspace, where)

    def seal(self, *, group: ProcessGroup | None = None) -> None:
        """The workspaces here keep their addresses from now on, for the graphs about to be
        captured over them, and so does any made later.

        With a torch.distributed process ``group``, its ranks agree first: each makes the keys
        another made, and grows each workspace to the largest any rank holds, so every rank
        holds the same bytes (see ``_agree.py``). Every rank of the group must call it, for the
        same pool, in the same order.
        """
        if group is not None:
            self._agree_sealing(group)
        with self._lock:
            self._sealed = True
            for workspace in self._workspaces.values():
                workspace.seal()
        logger.info("%s", self.summary())

    def _agree_sealing(self, group: ProcessGroup) -> None:
        """Agree with ``group`` while no plan can grow a workspace here: from the moment the
        sizes are gathered to the seal, a growth would leave this rank at a size the others
        never saw. If the agreement fails, nothing is sealed and plans may grow again."""
        with self._lock:
            self._sealing = True
            workspaces = list(self._workspaces.values())
        for workspace in workspaces:
            workspace._begin_sealing()
        try:
            self._agree(group)
        except BaseException:
            with self._lock:
                self._sealing = False
                workspaces = list(self._workspaces.values())
            for workspace in workspaces:
                workspace._begin_sealing(False)
            raise

    def _agree(self, group: ProcessGroup) -> None:
        """Hold what the largest of the group's ranks holds, key by key (see ``_agree.py``)."""
        import torch.distributed as dist

        from . import _agree

        rank, ranks = dist.get_rank(group), dist.get_world_size(group)
        held = {key: workspace.tensor.numel() for key, workspace in self.workspaces().items()}
        every_held = _agree.gather_held(self._identity, held, group)
        agreed = _agree.largest(every_held.values())
        others = f"{ranks - 1} other rank{'s' if ranks > 2 else ''}"
        failure: Exception | None = None
        added = 0
        try:
            for (label, cg_slot), nbytes in agreed.items():
                added += self.get(label, cg_slot)._grow_to_agree(nbytes, others)
        except Exception as error:  # told to every rank, then raised here as it was
            failure = error
        _agree.share_outcome(failure, self._identity, every_held, group)
        logger.info(
            "rank %d: %s agreed on %d bytes in %d workspaces across %d ranks (+%d grown to agree)",
            rank, _agree.describe(self._identity), sum(agreed.values()), len(agreed), ranks, added,
        )  # fmt: skip

    @property
    def _identity(self) -> tuple[str, str | None, tuple[tuple[str, int | None], ...] | None]:
        """What must match across ranks for their pools to be one: (owner, config key, the keys
        it serves)."""
        return self.owner, self.config_key, self._serves

    def workspaces(self) -> dict[tuple[str, int | None], Workspace]:
        """The workspaces made so far, by (label, cg slot)."""
        with self._lock:
            return dict(self._workspaces)

    def stats(self) -> list[WorkspaceStats]:
        """One snapshot per float workspace made so far, in the order they were made."""
        return [workspace.stats() for workspace in self.workspaces().values()]

    def int_stats(self) -> list[WorkspaceStats]:
        """One snapshot per int workspace made so far, in the order they were made."""
        return [workspace.stats() for workspace in self.int_workspaces().values()]

    def summary(self) -> str:
        """A few lines an engine can log at seal time: the totals, then one line per workspace."""
        stats, int_stats = self.stats(), self.int_stats()
        total = sum(s.bytes for s in stats)
        floors = sum(s.floor_bytes for s in stats)
        int_total = sum(s.bytes for s in int_stats)
        int_floors = sum(s.floor_bytes for s in int_stats)
        head = (
            f"{self.owner}: {counted(len(stats), 'workspace')}, {total:,} bytes "
            f"({total - floors:+,} over their floors), {'sealed' if self._sealed else 'growable'}; "
            f"their int workspaces {int_total:,} bytes ({int_total - int_floors:+,}), and as "
            "many pinned on the host"
        )
        return "\n".join([head, *(f"  {s}" for s in [*stats, *int_stats])])

    def _check_key(self, label: str, cg_slot: int | None) -> None:
        if not isinstance(label, str) or not label.strip():
            raise ResourceUsageError(
                f"{self.owner}: label={label!r} must be a non-empty string naming a plan"
            )
        if (problem := name_problem("label", label)) is not None:
            raise ResourceUsageError(f"{self.owner}: {problem}")
        if cg_slot is not None and not (is_int(cg_slot) and cg_slot >= 0):
            raise ResourceUsageError(
                f"{self.owner}: cg_slot={cg_slot!r} must be None (eager) or an int >= 0"
            )
        if self._serves is not None and (label, cg_slot) not in self._serves:
            raise ResourceUsageError(self._not_served(label, cg_slot))

    def _not_served(self, label: str, cg_slot: int | None) -> str:
        labels = list(dict.fromkeys(label for label, _ in self._serves or ()))
        slots = sorted({slot for _, slot in self._serves or () if slot is not None})
        where = self.config_key or f"pool {self.owner!r}"
        served = f"labels {labels} " + (
            f"in cg slots {slots}" if slots else "eagerly only (cg_slot=None)"
        )
        fix = (
            f"Add the label to {self.config_key}.labels or the slot to {self.config_key}.cg_slots"
            if self.config_key
            else "Ask for one of those"
        )
        return f"{where} does not serve ({label!r}, cg_slot={cg_slot}); it serves {served}. {fix}"

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
        int_name = f"{name}:int"
        int_tensor = self._allocate(int_name, self._int_floor)
        try:
            mirror = _host_mirror(int_tensor.numel(), int_tensor)
        except RuntimeError as error:
            if not _is_out_of_memory(error):
                raise
            raise self._short(int_name, self._int_floor, error, "pinned host memory") from error
        int_workspace = IntWorkspace(
            int_tensor, int_name, self._sealed, self._int_floor.setting, mirror=mirror
        )
        tensor = self._allocate(name, self._floor)
        workspace = Workspace(
            tensor, name, self._sealed, self._floor.setting, int_workspace=int_workspace
        )
        if self._sealing:
            workspace._begin_sealing()
        return workspace

    def _allocate(self, name: str, floor: Floor) -> torch.Tensor:
        try:
            # Zeroed: FlashInfer asks for a zeroed workspace (some backends keep semaphores in it).
            return torch.zeros(floor.bytes, dtype=torch.uint8, device=self.device)
        except RuntimeError as error:
            if not _is_out_of_memory(error):
                raise
            raise self._short(name, floor, error, str(self.device)) from error

    def _short(self, name: str, floor: Floor, error: Exception, where: str) -> WorkspaceGrowthError:
        return WorkspaceGrowthError(
            f"workspace {name!r}: could not allocate its floor of {floor.bytes:,} bytes on "
            f"{where}; lower {floor.setting} (now {floor.mb} MB). ({error})",
            workspace=name,
            held_bytes=0,
            needed_bytes=floor.bytes,
            setting=floor.setting,
        )
