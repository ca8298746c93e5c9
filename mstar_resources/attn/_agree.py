"""Agreeing on a pool across the ranks of a torch.distributed group before it is sealed, in two
``all_gather_object`` calls: every rank's pool identity and the bytes of each workspace it made,
then whether each rank could make and grow what it lacked (if one could not, no rank seals)."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import torch.distributed as dist

from ..errors import WorkspaceAgreementError

Key = tuple[str, int | None]
Identity = tuple[str, str | None, tuple[Key, ...] | None]
"""A pool's owner, config key and served keys: what must match across ranks."""


def gather_held(
    identity: Identity, held: Mapping[Key, int], group: dist.ProcessGroup
) -> dict[int, dict[Key, int]]:
    """Step 1: each rank's ``held`` bytes by key, by rank; raises on every rank alike when the
    ranks' pool ``identity`` differs."""
    everyone: list[Any] = [None] * dist.get_world_size(group)  # by rank
    dist.all_gather_object(everyone, (identity, dict(held)), group=group)
    every_held = {rank: sizes for rank, (_, sizes) in enumerate(everyone)}
    if len({identity for identity, _ in everyone}) > 1:
        pools = {
            rank: f"{describe(identity)} serving {_keys(identity)}"
            for rank, (identity, _) in enumerate(everyone)
        }
        listed = "; ".join(f"rank {rank}: {described}" for rank, described in pools.items())
        raise WorkspaceAgreementError(
            f"the ranks of the group are sealing different pools ({listed}); every rank must "
            "seal the same pools, in the same order",
            reasons=pools,
            held=every_held,
        )
    return every_held


def largest(every_held: Iterable[Mapping[Key, int]]) -> dict[Key, int]:
    """Each key any rank made, at the most bytes any rank holds of it."""
    agreed: dict[Key, int] = {}
    for sizes in every_held:
        for key, nbytes in sizes.items():
            agreed[key] = max(agreed.get(key, 0), nbytes)
    return agreed


def share_outcome(
    failure: Exception | None,
    identity: Identity,
    every_held: Mapping[int, Mapping[Key, int]],
    group: dist.ProcessGroup,
) -> None:
    """Step 2: tell every rank whether this one could make and grow what it lacked. A rank that
    could not raises its own ``failure``; the others raise one naming it, with its error (pickled
    whole, with its fields) in ``errors``."""
    outcomes: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(outcomes, _picklable(failure), group=group)
    if failure is not None:
        raise failure
    failed = {rank: error for rank, error in enumerate(outcomes) if error is not None}
    if failed:
        reasons = {rank: f"{type(error).__name__}: {error}" for rank, error in failed.items()}
        told = "; ".join(f"rank {rank} failed: {reason}" for rank, reason in reasons.items())
        raise WorkspaceAgreementError(
            f"{describe(identity)} was not sealed on any rank of the group: {told}",
            reasons=reasons,
            held=every_held,
            errors=failed,
        )


def _picklable(error: Exception | None) -> Exception | None:
    """``error`` where it survives a pickle whole (this library's errors do), else a
    ``RuntimeError`` with its type and text, so no rank fails to read what another sent."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def describe(identity: Identity) -> str:
    owner, config_key, _ = identity
    return f"pool {owner!r}" + (f" ({config_key})" if config_key else "")


def _keys(identity: Identity) -> str:
    served = identity[2]
    return "any key" if served is None else ", ".join(f"{label}/{slot}" for label, slot in served)
