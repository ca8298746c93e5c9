"""FlashInfer's int workspace, shared: the GPU buffer a plan's indices are copied to, the host
mirror they are written to first, and the check that a wrapper runs on its own plan
(``workspace.py``'s notes say when sharing is safe)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .._internal.floor import INT
from ..errors import WorkspacePlanError
from ._flashinfer import HOST_MIRROR, INT_BUFFER, own_buffers
from .buffer import GrowableBuffer, WorkspaceStats

__all__ = ["IntWorkspace", "checked_run", "int_buffers"]

T = TypeVar("T")


class IntWorkspace:
    """One FlashInfer int workspace and its host mirror: where a plan writes its indices (on the
    host, then copied to the GPU), and where the wrapper's run and its graph read them.

    It grows and seals as a float workspace does, on an int allocation that does not fit, and its
    mirror always holds as many bytes as it does: FlashInfer sizes the plan's int allocator by the
    GPU buffer and writes the mirror at the same offsets. Usually made by a pool with its float
    workspace (:attr:`Workspace.int_workspace`) and handed to wrappers by
    :meth:`WorkspacePool.build` or :meth:`WorkspacePool.install`.

    **The mirror is pageable.** A plan queues the copy from the mirror to the GPU buffer. From
    pinned memory that copy reads the mirror when the stream reaches it, so the next plan on the
    workspace (another wrapper's, or the same one's a step later) would rewrite what a queued copy
    still reads, and a run would read another plan's indices. From pageable memory the driver
    takes the bytes before ``cudaMemcpyAsync`` returns, so the next plan may write the mirror at
    once: one mirror serves every wrapper, with nothing to track. ``scripts/bench_int_mirror.py``
    measures both on a GPU (docs/workspaces-and-ranks.md).

    Args:
        tensor: the GPU buffer, 1-D ``torch.uint8``.
        name: how errors and logs refer to it, e.g. ``attention:decode:cg0:int``.
        sealed: start sealed.
        floor: the setting that sizes its floor (``MSTAR_INT_WORKSPACE_BUFFER_MB`` by default).
    """

    __slots__ = ("__weakref__", "_last_planner", "buffer")

    def __init__(
        self, tensor: torch.Tensor, name: str, sealed: bool = False, floor: str = INT.env_var
    ) -> None:
        self.buffer = GrowableBuffer(tensor, name, sealed, floor, INT)
        """Its GPU buffer and mirror, which grow and seal together."""
        self._last_planner: Callable[[], Any] | None = None
        """The wrapper whose plan the workspace holds now (its last plan through Workspace.plan),
        by a weak reference."""

    @property
    def tensor(self) -> torch.Tensor:
        """The GPU buffer wrappers are given: the same object for the workspace's whole life."""
        return self.buffer.tensor

    @property
    def mirror(self) -> torch.Tensor:
        """The pageable host buffer plans write their indices to before they are copied to
        :attr:`tensor`: the same object, as many bytes as it, for the workspace's life."""
        return self.buffer.mirror  # type: ignore[return-value]

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

    # Runs at every plan of an engine's steps: each line costs.
    def plan_on(
        self, plan: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any],
        attributes: dict[str, Any], planner: Callable[[], Any],
    ) -> T:  # fmt: skip
        """``plan(*args, **kwargs)``, the plan of the wrapper whose ``attributes`` (its
        ``__dict__``) are given and that ``planner`` (a weak reference) refers to, writing this
        workspace's mirror; the plan made is marked as the one the workspace holds. A plan that
        raises marks nothing."""
        attributes[HOST_MIRROR] = self.buffer.mirror
        planned = plan(*args, **kwargs)
        self._last_planner = planner
        return planned

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
    return None if own is None else (own[INT_BUFFER], own[HOST_MIRROR])


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
