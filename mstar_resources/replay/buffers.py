"""Where a replay setup's wrappers plan: the library's pools (:class:`LibraryBuffers`) or the
engines' one fixed buffer (:class:`FixedBuffer`)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..attn.workspace import Workspace, WorkspacePool, install_int_workspace
from ..errors import ResourceConfigError
from ..resolver import ResolvedResource, build_pools, serving
from ..units import MIB
from .roles import Role, Roles


class Buffers(abc.ABC):
    """Where a setup's wrappers get their float workspaces, and how their plans are made."""

    name: str

    @abc.abstractmethod
    def prefill(self) -> torch.Tensor:
        """The buffer the prefill wrapper is built on."""

    @abc.abstractmethod
    def decode(self) -> torch.Tensor:
        """The buffer the decode wrappers (every graph batch size) are built on."""

    @abc.abstractmethod
    def plan(self, role: Role, plan: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``plan(*args, **kwargs)`` for the wrapper playing ``role``."""

    def adopt(self, wrapper: Any, role: Role) -> Any:
        """``wrapper``, just built on this role's buffer, given whatever else the buffers hold
        for it (the library's: the role's int workspace); a fixed buffer leaves it its own."""
        return wrapper

    def int_tensors(self) -> list[torch.Tensor]:
        """The int workspaces and host mirrors the buffers hold themselves, used or not."""
        return []

    def seal(self, group: Any) -> None:  # noqa: B027 (a fixed buffer has nothing to seal)
        """Before graphs are captured over the buffers."""

    @property
    @abc.abstractmethod
    def bytes(self) -> int:
        """The bytes the buffers hold."""

    def growths(self) -> int:
        """Times a workspace grew, so far (0 for a fixed buffer, which never grows)."""
        return 0


class LibraryBuffers(Buffers):
    """The library's way: pools built from the composed config and reserved before the KV cache
    is sized; plans go through :meth:`Workspace.plan`, and the pools are sealed with the group."""

    name = "mstar-resources"

    def __init__(
        self, records: Sequence[ResolvedResource], device: torch.device, roles: Roles
    ) -> None:
        self.pools: dict[str, WorkspacePool] = build_pools(records, device)
        self.reserved = sum(pool.reserve() for pool in self.pools.values())
        self._prefill = self._workspace_serving(records, roles.prefill, None)
        self._decode = self._workspace_serving(records, roles.decode, 0)

    def _workspace_serving(
        self, records: Sequence[ResolvedResource], label: str, cg_slot: int | None
    ) -> Workspace:
        record = serving(records, label, cg_slot)
        if record is not None:
            return self.pools[record.path].get(label, cg_slot)
        slot = "eagerly" if cg_slot is None else f"in cg slot {cg_slot}"
        raise ResourceConfigError(
            f"no resource under resources serves label {label!r} {slot}; the replay plans its "
            "prefill label eagerly and its decode label in cg slot 0 (e.g. "
            "resources.attn.decode.cg_slots=[0])"
        )

    def adopt(self, wrapper: Any, role: Role) -> Any:
        """Every wrapper of a role shares its int workspace: each is planned right before it
        runs (or its graph replays), one a step. FlashInfer 0.7's MLA wrapper, which makes its
        own at each plan, keeps its own."""
        workspace = self._workspace(role)
        install_int_workspace(wrapper, workspace)
        return wrapper

    def int_tensors(self) -> list[torch.Tensor]:
        return [
            t for pool in self.pools.values() for w in pool.int_workspaces().values()
            for t in (w.tensor, *w.mirrors)
        ]  # fmt: skip

    def prefill(self) -> torch.Tensor:
        return self._prefill.tensor

    def decode(self) -> torch.Tensor:
        return self._decode.tensor

    def plan(self, role: Role, plan: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._workspace(role).plan(plan, *args, **kwargs)

    def _workspace(self, role: Role) -> Workspace:
        return self._prefill if role == "prefill" else self._decode

    def seal(self, group: Any) -> None:
        for pool in self.pools.values():
            pool.seal(group=group)

    @property
    def bytes(self) -> int:
        return sum(pool.held_bytes for pool in self.pools.values())

    def growths(self) -> int:
        """Times a float or int workspace grew."""
        return sum(
            s.times_grown
            for pool in self.pools.values()
            for s in [*pool.stats(), *pool.int_stats()]
        )


class FixedBuffer(Buffers):
    """The engines' way: one buffer of a fixed size for every wrapper and graph, planned on
    directly."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.name = f"fixed {nbytes / MIB:,.0f} MiB"

    def prefill(self) -> torch.Tensor:
        return self.tensor

    def decode(self) -> torch.Tensor:
        return self.tensor

    def plan(self, role: Role, plan: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        plan(*args, **kwargs)

    @property
    def bytes(self) -> int:
        return self.tensor.numel()
