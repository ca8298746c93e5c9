"""Agreeing on a pool across the ranks of a torch.distributed group, before it is sealed.

Ranks see different batches (data-parallel attention, uneven micro-batches), so a workspace can
grow on one rank and not on another. Engines size the KV cache from the smallest free memory of
any rank, so the largest rank's growth is lost on every rank anyway; agreeing makes it visible and
symmetric: every rank ends with the same keys, each as large as the largest any rank holds.

Two ``all_gather_object`` calls on the group's own backend (gloo on CPUs, NCCL on GPUs: there,
each rank must have set its CUDA device), at seal time only:

1. every rank's pool identity (owner, config key, served keys) and the bytes of each workspace it
   made. Pools that differ fail on every rank alike, since every rank sees the same gathered
   list: none waits for another.
2. after each rank made what it lacked and grew to the agreed sizes, whether it could. A rank
   that could not raises its own error (``WorkspaceGrowthError``: its buffers kept, intact) and
   every other rank raises ``WorkspaceAgreementError`` naming it; then no rank seals.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist

from ..errors import WorkspaceAgreementError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)

Key = tuple[str, int | None]
Identity = tuple[str, str | None, tuple[Key, ...] | None]
"""A pool's owner, config key and served keys: what must match across ranks."""


class Agreeing(Protocol):
    """A workspace, as far as agreeing on it goes (``workspace.Workspace``)."""

    @property
    def tensor(self) -> torch.Tensor: ...

    def _grow_to_agree(self, nbytes: int, ranks: str) -> int: ...


class Pool(Protocol):
    """A pool, as far as agreeing on it goes (``workspace.WorkspacePool``, which calls in here:
    this module names what it needs rather than importing it back)."""

    @property
    def identity(self) -> Identity: ...

    def workspaces(self) -> Mapping[Key, Agreeing]: ...

    def get(self, label: str, cg_slot: int | None = None) -> Agreeing: ...


def agree(pool: Pool, group: ProcessGroup) -> None:
    """Make ``pool`` on this rank hold what the largest of the group's ranks holds, key by key."""
    rank, ranks = dist.get_rank(), dist.get_world_size(group)
    every_held = _gather_pools(pool, group, rank, ranks)
    agreed = _largest(every_held.values())
    added = _grow_and_tell(pool, agreed, every_held, group, rank, ranks)
    logger.info(
        "rank %d: %s agreed on %d bytes in %d workspaces across %d ranks (+%d grown to agree)",
        rank,
        _describe(pool.identity),
        sum(agreed.values()),
        len(agreed),
        ranks,
        added,
    )


def _gather_pools(
    pool: Pool, group: ProcessGroup, rank: int, ranks: int
) -> dict[int, dict[Key, int]]:
    """Step 1: every rank's bytes of each workspace, by rank; raises on every rank alike when
    the ranks are sealing different pools."""
    held = {key: workspace.tensor.numel() for key, workspace in pool.workspaces().items()}
    gathered: list[tuple[int, Identity, dict[Key, int]] | None] = [None] * ranks
    dist.all_gather_object(gathered, (rank, pool.identity, held), group=group)
    everyone = [entry for entry in gathered if entry is not None]
    every_held = {r: sizes for r, _, sizes in everyone}
    if len({identity for _, identity, _ in everyone}) > 1:
        pools = {
            r: f"{_describe(identity)} serving {_served(identity)}" for r, identity, _ in everyone
        }
        listed = "; ".join(f"rank {r}: {described}" for r, described in pools.items())
        raise WorkspaceAgreementError(
            f"the ranks of the group are sealing different pools ({listed}); every rank must "
            "seal the same pools, in the same order",
            reasons=pools,
            held=every_held,
        )
    return every_held


def _largest(every_held: Iterable[Mapping[Key, int]]) -> dict[Key, int]:
    """Each key any rank made, at the most bytes any rank holds of it."""
    agreed: dict[Key, int] = {}
    for sizes in every_held:
        for key, nbytes in sizes.items():
            agreed[key] = max(agreed.get(key, 0), nbytes)
    return agreed


def _grow_and_tell(
    pool: Pool,
    agreed: Mapping[Key, int],
    every_held: Mapping[int, Mapping[Key, int]],
    group: ProcessGroup,
    rank: int,
    ranks: int,
) -> int:
    """Step 2: make and grow what this rank lacks, then tell every rank whether it could. A rank
    that could not raises its own error; the others raise one naming it. Returns the bytes
    added here."""
    others = f"{ranks - 1} other rank{'s' if ranks > 2 else ''}"
    failure: BaseException | None = None
    added = 0
    try:
        for (label, cg_slot), nbytes in agreed.items():
            added += pool.get(label, cg_slot)._grow_to_agree(nbytes, others)
    except Exception as error:  # told to every rank below, then raised here as it was
        failure = error
    outcomes: list[tuple[int, str | None] | None] = [None] * ranks
    report = None if failure is None else f"{type(failure).__name__}: {failure}"
    dist.all_gather_object(outcomes, (rank, report), group=group)
    if failure is not None:
        raise failure
    failed = {r: message for r, message in filter(None, outcomes) if message is not None}
    if failed:
        told = "; ".join(f"rank {r} failed: {message}" for r, message in failed.items())
        raise WorkspaceAgreementError(
            f"{_describe(pool.identity)} was not sealed on any rank of the group: {told}",
            reasons=failed,
            held=every_held,
        )
    return added


def _describe(identity: Identity) -> str:
    owner, config_key, _ = identity
    return f"pool {owner!r}" + (f" ({config_key})" if config_key else "")


def _served(identity: Identity) -> str:
    served = identity[2]
    return "any key" if served is None else ", ".join(f"{label}/{slot}" for label, slot in served)
