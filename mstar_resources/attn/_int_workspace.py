"""FlashInfer's int workspace, shared: its GPU buffer, its host mirror, and the check that a
wrapper runs on its own plan (``docs/workspaces-and-ranks.md`` says when sharing is safe)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import WorkspacePlanError
from ..floor import INT
from ._buffer import GrowableBuffer


class IntWorkspace(GrowableBuffer):
    """One FlashInfer int workspace and its host mirror: a plan writes its indices to the mirror
    and copies them to the GPU buffer, where the run and its graph read them. It grows and seals
    as a float workspace does, its mirror with it (FlashInfer writes the mirror at the GPU
    buffer's offsets). Args as :class:`Workspace`'s.

    The mirror is pageable: a copy from pinned memory reads its source only when the stream
    reaches it, after the next plan may have rewritten it; from pageable memory the driver stages
    the bytes before ``cudaMemcpyAsync`` returns, so one mirror serves every wrapper.
    """

    def __init__(
        self, tensor: torch.Tensor, name: str, sealed: bool = False, floor: str = INT.env_var
    ) -> None:
        super().__init__(tensor, name, sealed, floor, INT)
        self.last_planner: Callable[[], Any] = lambda: None
        """A weak reference to the wrapper whose plan it holds now, set by ``Workspace.plan``."""

    @property
    def mirror(self) -> torch.Tensor:
        """The pageable host mirror: the same object, as many bytes as :attr:`tensor`."""
        return self._mirror  # type: ignore[return-value]

    def check_planned_by(self, wrapper: Any) -> None:
        """Raise :class:`WorkspacePlanError` unless the plan held is ``wrapper``'s (or none is
        known): it would run on another wrapper's indices. Called by each installed wrapper's
        ``run``, eagerly and at graph capture; a replay runs no Python, and relies on the rule."""
        if (planner := self.last_planner()) is not None and planner is not wrapper:
            raise WorkspacePlanError(
                f"int workspace {self.name!r} holds the plan of another {type(planner).__name__} "
                f"({id(planner):#x}), made after this {type(wrapper).__name__}'s "
                f"({id(wrapper):#x}); wrappers that share an int workspace must each be planned "
                "right before they run (or before their graph is captured or replayed)",
                workspace=self.name,
                held_bytes=self.tensor.numel(),
            )
