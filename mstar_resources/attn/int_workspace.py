"""FlashInfer's int workspace, shared: the GPU buffer a plan's indices are copied to, the pinned
host mirrors they are written to first, the fence that keeps a plan from rewriting a mirror a
queued copy still reads, and the check that a wrapper runs on its own plan (``workspace.py``'s
notes say when sharing is safe)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from .._internal.floor import INT, PINNED_MIRRORS, PLANS_PER_EVENT
from ..errors import ResourceUsageError, WorkspacePlanError
from ._flashinfer import INT_BUFFER, PINNED_MIRROR, own_buffers
from .buffer import GrowableBuffer, WorkspaceStats, host_mirror

__all__ = ["FENCE_EVENTS", "IntWorkspace", "checked_run", "int_buffers"]

T = TypeVar("T")

FENCE_EVENTS = -(-PINNED_MIRRORS // PLANS_PER_EVENT) + 1
"""The CUDA events of an int workspace's fence, recorded in turn, one every
:data:`PLANS_PER_EVENT` plans: enough that an event is queried before it is recorded again."""


class IntWorkspace:
    """One FlashInfer int workspace and its pinned host mirrors: where a plan writes its indices
    (on the host, then copied to the GPU), and where the wrapper's run and its graph read them.

    It grows and seals as a float workspace does, on an int allocation that does not fit, and
    each mirror always holds as many bytes as it does: FlashInfer sizes the plan's int allocator
    by the GPU buffer and writes the mirror at the same offsets. Usually made by a pool with its
    float workspace (:attr:`Workspace.int_workspace`) and handed to wrappers by
    :meth:`WorkspacePool.build` or :meth:`WorkspacePool.install`.

    **The fence.** A plan writes a mirror, then queues the copy from it to the GPU buffer, which
    runs when the stream reaches it. Plans through :meth:`Workspace.plan` write the
    :data:`~mstar_resources._internal.floor.PINNED_MIRRORS` (10) mirrors in turn
    (:meth:`plan_fenced` hands the wrapper the next one), and after every
    :data:`~mstar_resources._internal.floor.PLANS_PER_EVENT` (8) plans a CUDA event is recorded
    behind their copies. Before a plan writes a mirror, the event recorded after that mirror's
    last plan, :data:`~mstar_resources._internal.floor.PLANS_BACK` (3) or more plans back, must
    say its copy has run: it is queried once for the 8 plans it covers, and waited for only where
    the host is that far ahead of its GPU. An engine planning one wrapper a step never is: vLLM
    and SGLang keep one step in flight while they prepare the next. So 8 plans cost one event
    record and one event query between them, and no wait on the GPU; :attr:`fence_waits` counts
    the plans that did wait.

    Args:
        tensor: the GPU buffer, 1-D ``torch.uint8``.
        name: how errors and logs refer to it, e.g. ``attention:decode:cg0:int``.
        sealed: start sealed.
        floor: the setting that sizes its floor (``MSTAR_INT_WORKSPACE_BUFFER_MB`` by default).
        mirrors: its host mirrors (keyword only): ``PINNED_MIRRORS`` 1-D ``torch.uint8`` CPU
            tensors of the same bytes, pinned where ``tensor`` is on a GPU. Default: fresh ones.
        events: the fence's events (keyword only), :data:`FENCE_EVENTS` objects with CUDA
            events' ``record(stream)``, ``query()`` and ``synchronize()``.
            Default: CUDA events where ``tensor`` is on a GPU; none on a CPU, where a plan queues
            no copy and nothing is fenced.
    """

    # Slots: a plan reads its fence's state beside FlashInfer's, in as few places as there are.
    __slots__ = (
        "__weakref__",
        "_confirm_at",
        "_device_index",
        "_events",
        "_last_planner",
        "_mirrors",
        "_plans",
        "_stream",
        "_stream_handle",
        "buffer",
        "fence_waits",
    )

    def __init__(
        self,
        tensor: torch.Tensor,
        name: str,
        sealed: bool = False,
        floor: str = INT.env_var,
        *,
        mirrors: Sequence[torch.Tensor] | None = None,
        events: Sequence[Any] | None = None,
    ) -> None:
        buffer = GrowableBuffer(tensor, name, sealed, floor, INT)
        if mirrors is None:
            mirrors = [host_mirror(tensor.numel(), tensor) for _ in range(PINNED_MIRRORS)]
        elif not (
            isinstance(mirrors, Sequence)
            and len(mirrors) == PINNED_MIRRORS
            and all(_is_mirror_of(mirror, tensor) for mirror in mirrors)
            and len({id(mirror) for mirror in mirrors}) == PINNED_MIRRORS
        ):
            raise ResourceUsageError(
                f"int workspace {name!r}: mirrors must be {PINNED_MIRRORS} distinct 1-D "
                f"torch.uint8 CPU tensors of {tensor.numel():,} bytes, pinned where the "
                "workspace is on a GPU (or None: they are made)"
            )
        buffer.mirrors = list(mirrors)
        self.buffer = buffer
        """Its GPU buffer and mirrors, which grow and seal together."""
        self._mirrors = tuple(buffer.mirrors)
        """The mirrors, in the order plans write them (each grows in place: the same objects)."""
        self._plans = 0
        """Plans made through :meth:`plan_fenced`; the next writes mirror
        ``_plans % PINNED_MIRRORS``."""
        if events is None and tensor.is_cuda:
            events = [torch.cuda.Event() for _ in range(FENCE_EVENTS)]
        elif events is not None and len(events) != FENCE_EVENTS:
            raise ResourceUsageError(
                f"int workspace {name!r}: events must be {FENCE_EVENTS} events"
            )
        self._events = None if events is None else list(events)
        """Event ``g % FENCE_EVENTS`` is recorded after group ``g`` of plans (plans
        ``g * PLANS_PER_EVENT`` to ``g * PLANS_PER_EVENT + PLANS_PER_EVENT - 1``)."""
        self._confirm_at = PINNED_MIRRORS
        """The plan that must first find the next group of plans' copies run: the first to
        write a mirror that group wrote."""
        self._device_index = tensor.device.index
        """The GPU of the buffer, which growth never moves it from."""
        self._stream_handle = -1
        """The raw handle of the stream of the last plan, compared at each plan with the current
        one's (:data:`_current_raw_stream`; ``torch.cuda.current_stream`` costs several us a
        call)."""
        self._stream: torch.cuda.Stream | None = None
        """That stream, which events are recorded on."""
        self._last_planner: Callable[[], Any] | None = None
        """The wrapper whose plan the workspace holds now (its last plan through Workspace.plan),
        by a weak reference."""
        self.fence_waits = 0
        """How many plans found the copy from their mirror not yet run, and waited for it."""

    @property
    def tensor(self) -> torch.Tensor:
        """The GPU buffer wrappers are given: the same object for the workspace's whole life."""
        return self.buffer.tensor

    @property
    def mirror(self) -> torch.Tensor:
        """The first of :attr:`mirrors`, which :func:`install_int_workspace` gives a wrapper
        in place of its own."""
        return self._mirrors[0]

    @property
    def mirrors(self) -> tuple[torch.Tensor, ...]:
        """The pinned host buffers plans write their indices to in turn before they are copied
        to :attr:`tensor`: the same objects, each as many bytes as it, for the workspace's life."""
        return self._mirrors

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def sealed(self) -> bool:
        return self.buffer.sealed

    @property
    def floor(self) -> str:
        """The setting that sizes its floor, which errors name as the one to raise."""
        return self.buffer.floor

    def __repr__(self) -> str:
        state = "sealed" if self.sealed else "growable"
        return f"IntWorkspace({self.name!r}, {self.tensor.numel()} bytes, {state})"

    def seal(self) -> None:
        """Keep this buffer's address from now on (and its mirrors')."""
        self.buffer.seal()

    def stats(self) -> WorkspaceStats:
        """A snapshot of this int workspace: bytes now, floor, growth history, sealed or not."""
        return self.buffer.stats()

    # Runs at every plan of an engine's steps: each line costs.
    def plan_fenced(
        self, plan: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any],
        attributes: dict[str, Any], planner: Callable[[], Any],
    ) -> T:  # fmt: skip
        """``plan(*args, **kwargs)``, the plan of the wrapper whose ``attributes`` (its
        ``__dict__``) are given and that ``planner`` (a weak reference) refers to, on this int
        workspace: the wrapper is handed the mirror the plan writes next, once the copy that last
        read that mirror has run; the plan made is marked as the one the workspace holds; after
        the last plan of a group, an event is recorded behind the copies the group queued. A plan
        that raises counts for nothing: the next one writes the same mirror."""
        plans = self._plans
        events = self._events
        if events is not None:
            if _current_raw_stream(self._device_index) != self._stream_handle:
                self._follow_stream()
            if plans >= self._confirm_at:
                self._confirm(plans, events)
        attributes[PINNED_MIRROR] = self._mirrors[plans % PINNED_MIRRORS]
        planned = plan(*args, **kwargs)
        self._last_planner = planner
        self._plans = plans + 1
        if events is not None and plans % PLANS_PER_EVENT == PLANS_PER_EVENT - 1:  # a group's last
            events[plans // PLANS_PER_EVENT % FENCE_EVENTS].record(self._stream)
        return planned

    def _confirm(self, plans: int, events: list[Any]) -> None:
        """Before plan ``plans``: find the copies of the group of plans that last wrote its
        mirror run (``events``: the fence's), waiting for them where they are not."""
        group = (plans - PINNED_MIRRORS) // PLANS_PER_EVENT
        event = events[group % FENCE_EVENTS]
        if not event.query():
            self.fence_waits += 1
            event.synchronize()
        self._confirm_at = (group + 1) * PLANS_PER_EVENT + PINNED_MIRRORS

    def _follow_stream(self) -> None:
        """Plans move to the current stream: the events recorded so far say nothing of
        copies queued on it, so every copy queued before is waited for (an engine plans on one
        stream, and seldom moves: twice in each vLLM run measured, against some 1,000 plans)."""
        previous = self._stream
        if previous is not None:
            previous.synchronize()
            self.fence_waits += 1
        # Every group begun before is run; the one in progress is recorded on the new stream.
        begun = self._plans // PLANS_PER_EVENT * PLANS_PER_EVENT  # the group in progress's first
        self._confirm_at = max(self._confirm_at, begun + PINNED_MIRRORS)
        self._stream = torch.cuda.current_stream(self.tensor.device)
        self._stream_handle = self._stream.cuda_stream

    def check_planned_by(self, wrapper: Any) -> None:
        """Raise :class:`WorkspacePlanError` unless the last plan this workspace holds is
        ``wrapper``'s (or no plan through :meth:`Workspace.plan` named a wrapper yet): a wrapper
        that ran now would read another wrapper's indices. Called by the ``run`` of every wrapper
        ``install_int_workspace`` gave this workspace, eagerly and at graph capture; a graph
        replay runs no Python, and relies on the rule alone."""
        last = self._last_planner
        planner = None if last is None else last()
        if planner is not None and planner is not wrapper:
            raise WorkspacePlanError(
                f"int workspace {self.name!r} holds the plan of another {type(planner).__name__} "
                f"({id(planner):#x}), made after this {type(wrapper).__name__}'s "
                f"({id(wrapper):#x}); wrappers that share an int workspace must each be planned "
                "right before they run (or before their graph is captured or replayed)",
                workspace=self.name,
                held_bytes=self.tensor.numel(),
            )


_current_raw_stream: Callable[[int | None], int] = getattr(
    torch._C, "_cuda_getCurrentRawStream", lambda device: -1
)
"""The raw handle of the current CUDA stream of a device index, as PyTorch's own CUDA code reads
it: one C call (a CPU-only build of torch has none, and no events to fence with either)."""


def _is_mirror_of(mirror: object, tensor: torch.Tensor) -> bool:
    """Whether ``mirror`` can be a host mirror of int workspace ``tensor``."""
    return (
        isinstance(mirror, torch.Tensor)
        and mirror.device.type == "cpu"
        and mirror.dtype == torch.uint8
        and mirror.dim() == 1
        and mirror.numel() == tensor.numel()
        and (mirror.is_pinned() or not tensor.is_cuda)
    )


def int_buffers(wrapper: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The int workspace and host mirror ``wrapper`` plans on now (its own, or one it was given);
    None where it keeps none (:func:`own_buffers`)."""
    own = own_buffers(wrapper)
    return None if own is None else (own[INT_BUFFER], own[PINNED_MIRROR])


def checked_run(
    run: Callable[..., T], wrapper: Any, int_workspace: IntWorkspace
) -> Callable[..., T]:
    """``run``, which first checks that ``int_workspace`` holds ``wrapper``'s own plan."""

    @functools.wraps(run)
    def check_then_run(*args: Any, **kwargs: Any) -> T:
        int_workspace.check_planned_by(wrapper)
        return run(*args, **kwargs)

    # Not functools' __wrapped__: FlashInfer 0.7 decorates run() itself, and its __wrapped__ is
    # the undecorated, unbound function.
    check_then_run._unchecked = run  # type: ignore[attr-defined]
    return check_then_run
