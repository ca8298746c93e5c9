"""FlashInfer's int workspace, shared: the GPU buffer a plan's indices are copied to, its pinned
host mirror they are written to first, the fence between two plans' copies, and the check that a
wrapper runs on its own plan (``workspace.py``'s notes say when sharing is safe)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .._internal.floor import INT
from ..errors import ResourceUsageError, WorkspacePlanError
from ._flashinfer import INT_BUFFER, PINNED_MIRROR, own_buffers
from .buffer import GrowableBuffer, WorkspaceStats, host_mirror

__all__ = ["IntWorkspace", "checked_run", "int_buffers"]

T = TypeVar("T")


class IntWorkspace:
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

    def __init__(
        self,
        tensor: torch.Tensor,
        name: str,
        sealed: bool = False,
        floor: str = INT.env_var,
        *,
        mirror: torch.Tensor | None = None,
    ) -> None:
        buffer = GrowableBuffer(tensor, name, sealed, floor, INT)
        if mirror is None:
            mirror = host_mirror(tensor.numel(), tensor)
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
        buffer.mirror = mirror
        self.buffer = buffer
        """Its GPU buffer and mirror, which grow and seal together."""
        self._last_copy = torch.cuda.Event() if tensor.is_cuda else None
        """Recorded after each plan: the copy it queued from the mirror has run once it has."""
        self._copy_queued = False
        """Whether :attr:`_last_copy` was recorded yet (a plan queued a copy)."""
        self._stream: tuple[int, torch.cuda.Stream | None] = (0, None)
        """The stream the last copy was queued on, by its raw handle: looked up again only when
        the current stream is another (``torch.cuda.current_stream`` costs several us a call)."""
        self._last_planner: weakref.ref[Any] | None = None
        """The wrapper whose plan the workspace holds now (its last plan through Workspace.plan)."""
        self.fence_waits = 0
        """How many plans found the previous plan's copy not yet run, and waited for it."""
        self.given_to_wrappers = False
        """Whether a wrapper plans on it (``install_int_workspace``): until then a plan
        writes a mirror of the wrapper's own, and nothing here needs fencing or tracking."""

    @property
    def tensor(self) -> torch.Tensor:
        """The GPU buffer wrappers are given: the same object for the workspace's whole life."""
        return self.buffer.tensor

    @property
    def mirror(self) -> torch.Tensor:
        """The pinned host buffer a plan writes its indices to before they are copied to
        :attr:`tensor`: the same object, and as many bytes, for the workspace's whole life."""
        assert self.buffer.mirror is not None  # set in __init__
        return self.buffer.mirror

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
        """Keep this buffer's address from now on (and its mirror's)."""
        self.buffer.seal()

    def stats(self) -> WorkspaceStats:
        """A snapshot of this int workspace: bytes now, floor, growth history, sealed or not."""
        return self.buffer.stats()

    def wait_for_last_copy(self) -> None:
        """Wait for the copy the previous plan queued from the mirror, before a plan rewrites it.

        Asked first, without waiting: by the time the host plans again the GPU has almost always
        run a copy queued a plan earlier (it sits before that plan's kernels in the stream), so a
        steady state waits for nothing; :attr:`fence_waits` counts the plans that did wait."""
        copy = self._last_copy
        if self._copy_queued and not copy.query():  # type: ignore[union-attr]
            self.fence_waits += 1
            copy.synchronize()  # type: ignore[union-attr]

    def copy_queued(self, planner: Any = None) -> None:
        """Mark where the plan just made (by wrapper ``planner``, where known) queued its copy from
        the mirror (the current stream), and whose plan the workspace now holds."""
        last = self._last_planner
        if planner is None:
            self._last_planner = None
        elif last is None or last() is not planner:
            self._last_planner = weakref.ref(planner)
        copy = self._last_copy
        if copy is not None:
            handle = torch._C._cuda_getCurrentRawStream(self.tensor.device.index)
            known, stream = self._stream
            if stream is None or handle != known:
                stream = torch.cuda.current_stream(self.tensor.device)
                self._stream = (handle, stream)
            copy.record(stream)
            self._copy_queued = True

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
    def checked(*args: Any, **kwargs: Any) -> T:
        int_workspace.check_planned_by(wrapper)
        return run(*args, **kwargs)

    # Not functools' __wrapped__: FlashInfer 0.7 decorates run() itself, and its __wrapped__ is
    # the undecorated, unbound function.
    checked._unchecked = run  # type: ignore[attr-defined]
    return checked
