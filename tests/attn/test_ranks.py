"""WorkspacePool.seal(group=...) across gloo ranks, each in a process of its own.

Every test starts its ranks (tests/ranks.py) and waits for them with a deadline, so a rank that
hangs fails the test instead of blocking the run. The GPU twin, with NCCL and real FlashInfer
plans, is test_ranks_gpu.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from mstar_resources import (
    WorkspaceAgreementError,
    WorkspaceGrowthError,
    WorkspacePool,
    WorkspaceSealedError,
)
from mstar_resources.units import MIB

from ..ranks import run_ranks
from .fake_allocator import FakePlanner, FakeWrapper


def _pool(**kwargs: Any) -> WorkspacePool:
    return WorkspacePool("cpu", 1, "attention", config_key="resources.attn.decode", **kwargs)


def _grow(pool: WorkspacePool, label: str, cg_slot: int | None, nbytes: int) -> None:
    """Plan on (label, slot) something that needs ``nbytes``: the workspace grows to exactly it."""
    workspace = pool.get(label, cg_slot)
    workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", nbytes, 16)]))


def _holding(pool: WorkspacePool) -> dict[str, Any]:
    return {
        "sizes": {f"{k[0]}/{k[1]}": w.tensor.numel() for k, w in pool.workspaces().items()},
        "sealed": pool.sealed and all(w.sealed for w in pool.workspaces().values()),
        "agreed": {s.name: s.grown_to_agree_bytes for s in pool.stats()},
    }


SERVES = [("decode", 0), ("decode", 1), ("prefill", None)]


def grew_differently(rank: int, world: int) -> dict[str, Any]:
    pool = _pool(serves=SERVES)
    pool.get("decode", 0)
    if rank == 0:
        _grow(pool, "decode", 0, 3 * MIB)
    if rank == world - 1:
        pool.get("prefill").tensor.fill_(rank)  # bytes a rank wrote survive the growth
        _grow(pool, "prefill", None, 2 * MIB)
    tensors = {key: workspace.tensor for key, workspace in pool.workspaces().items()}
    pool.seal(group=dist.group.WORLD)
    holding = _holding(pool)
    holding["same_tensors"] = all(pool.get(*key).tensor is t for key, t in tensors.items())
    if rank == world - 1:
        holding["kept"] = bool((pool.get("prefill").tensor[:MIB] == rank).all())
    return holding


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_that_grew_differently_agree_on_every_key_and_size(tmp_path, world):
    results = run_ranks(grew_differently, world, tmp_path / "store")
    agreed = {"decode/0": 3 * MIB, "prefill/None": 2 * MIB}
    for holding in results:
        assert isinstance(holding, dict), holding
        assert holding["sizes"] == agreed and holding["sealed"] and holding["same_tensors"]
    # What each rank grew to agree: the first rank only the prefill, the last only the decode.
    assert results[0]["agreed"] == {"attention:decode:cg0": 0, "attention:prefill": MIB}
    assert results[-1]["agreed"] == {"attention:decode:cg0": 2 * MIB, "attention:prefill": 0}
    assert results[-1]["kept"]


def missing_a_key(rank: int, world: int) -> dict[str, Any]:
    pool = _pool(serves=SERVES)
    if rank == 1:
        _grow(pool, "decode", 1, 2 * MIB)
    pool.seal(group=dist.group.WORLD)
    return _holding(pool)


def test_a_rank_missing_a_key_gets_it(tmp_path):
    first, second = run_ranks(missing_a_key, 2, tmp_path / "store")
    assert first["sizes"] == second["sizes"] == {"decode/1": 2 * MIB}
    assert first["agreed"] == {"attention:decode:cg1": MIB}  # made at its floor, then grown
    assert first["sealed"] and second["sealed"]


def int_grew_on_one_rank(rank: int, world: int) -> dict[str, Any]:
    pool = _pool(int_size_mb=1)
    needs = [("batch_prefill_request_indices", 2 * MIB, 16)]
    wrapper = pool.build(FakeWrapper, int_allocations=needs, label="decode")
    workspace = pool.get("decode")
    if rank == 0:
        workspace.plan(wrapper.plan)  # its int workspace grows from 1 MiB to 2
    pool.seal(group=dist.group.WORLD)
    int_workspace = workspace.int_workspace
    assert int_workspace is not None
    workspace.plan(wrapper.plan)  # the plan rank 0 grew for fits every rank, sealed
    return {
        "int": (int_workspace.tensor.numel(), int_workspace.mirror.numel()),
        "agreed": int_workspace.stats().grown_to_agree_bytes,
    }


def test_ranks_agree_on_their_int_workspaces_too(tmp_path):
    first, second = run_ranks(int_grew_on_one_rank, 2, tmp_path / "store")
    assert first["int"] == second["int"] == (2 * MIB, 2 * MIB)  # the mirror grown with it
    assert (first["agreed"], second["agreed"]) == (0, MIB)


def mismatched(rank: int, world: int) -> Any:
    pool = WorkspacePool("cpu", 1, owner=f"owner{rank}")
    pool.get("decode")
    try:
        pool.seal(group=dist.group.WORLD)
    except WorkspaceAgreementError as error:
        reasons, held = sorted(error.reasons.items()), sorted(error.held.items())
        return ("WorkspaceAgreementError", str(error), pool.sealed, error.ranks, reasons, held)
    return "sealed"


def test_mismatched_pools_raise_the_same_error_on_every_rank(tmp_path):
    results = run_ranks(mismatched, 3, tmp_path / "store")
    assert len(set(map(repr, results))) == 1  # the same error, word for word; nobody sealed
    kind, message, sealed, ranks, reasons, held = results[0]
    assert (kind, sealed, ranks) == ("WorkspaceAgreementError", False, (0, 1, 2))
    for rank in range(3):
        assert f"rank {rank}: pool 'owner{rank}'" in message
        assert reasons[rank] == (rank, f"pool 'owner{rank}' serving any key")
        assert held[rank] == (rank, {("decode", None): MIB})


FAILING_RANK = 2
HUGE = 1 << 55
"""More bytes than any machine has."""


def one_rank_cannot_grow(rank: int, world: int) -> Any:
    # The other ranks keep their pools on the meta device, where HUGE bytes cost nothing; this
    # rank's CPU really cannot allocate them, as a full GPU could not.
    device = "cpu" if rank == FAILING_RANK else "meta"
    pool = WorkspacePool(device, 1, config_key="resources.attn.decode", serves=SERVES)
    workspace = pool.get("decode", 0)
    if rank == FAILING_RANK:
        workspace.tensor.fill_(7)
    else:
        _grow(pool, "decode", 0, HUGE)
    try:
        pool.seal(group=dist.group.WORLD)
    except (WorkspaceGrowthError, WorkspaceAgreementError) as error:
        intact = rank != FAILING_RANK or (
            workspace.tensor.numel() == MIB and bool((workspace.tensor == 7).all())
        )
        figures = (
            (
                error.ranks,
                sorted(error.reasons),
                error.held,
                {
                    r: (type(e).__name__, e.workspace, e.needed_bytes)
                    for r, e in error.errors.items()
                },
            )
            if isinstance(error, WorkspaceAgreementError)
            else (error.workspace, error.held_bytes, error.needed_bytes)
        )
        return (type(error).__name__, str(error), pool.sealed, intact, figures)
    return "sealed"


def test_a_rank_that_cannot_grow_fails_every_rank_clearly_and_keeps_its_buffer(tmp_path):
    results = run_ranks(one_rank_cannot_grow, 3, tmp_path / "store")
    kind, message, sealed, intact, figures = results[FAILING_RANK]
    assert (kind, sealed, intact) == ("WorkspaceGrowthError", False, True)
    assert f"to {HUGE:,} bytes" in message and "keeps its 1,048,576-byte buffer" in message
    assert figures == ("attention:decode:cg0", MIB, HUGE)
    for rank in (0, 1):
        kind, message, sealed, _, (ranks, reasons, held, errors) = results[rank]
        assert (kind, sealed) == ("WorkspaceAgreementError", False)
        assert (ranks, reasons) == ((FAILING_RANK,), [FAILING_RANK])
        # The failing rank's own error, whole: its type and fields, not its text.
        assert errors == {FAILING_RANK: ("WorkspaceGrowthError", "attention:decode:cg0", HUGE)}
        assert held == {0: {("decode", 0): HUGE}, 1: {("decode", 0): HUGE},
                        FAILING_RANK: {("decode", 0): MIB}}  # fmt: skip
        assert f"rank {FAILING_RANK} failed: WorkspaceGrowthError" in message
        assert "'attention' (resources.attn.decode) was not sealed on any rank" in message


def subgroup_member_cannot_grow(rank: int, world: int) -> Any:
    """Ranks 1 and 2 of the world seal in a group of their own; world rank 2, the group's rank 1,
    cannot grow. Every rank waits for the others at the end: the first, outside the group, would
    otherwise leave the world (its gloo pairs closed) while the group's ranks still work."""
    group = dist.new_group([1, 2])  # every rank of the world takes part in making it
    outcome = "not in the group" if rank == 0 else _seal_in(group, failing=rank == 2)
    dist.barrier()
    return outcome


def _seal_in(group: Any, failing: bool) -> Any:
    pool = WorkspacePool("cpu" if failing else "meta", 1, serves=SERVES)
    if not failing:
        _grow(pool, "decode", 0, HUGE)
    else:
        pool.get("decode", 0)
    try:
        pool.seal(group=group)
    except (WorkspaceGrowthError, WorkspaceAgreementError) as error:
        if isinstance(error, WorkspaceAgreementError):
            return (type(error).__name__, error.ranks, sorted(error.held), str(error))
        return (type(error).__name__,)
    return "sealed"


def test_ranks_are_named_within_their_group(tmp_path):
    results = run_ranks(subgroup_member_cannot_grow, 3, tmp_path / "store")
    assert results[0] == "not in the group"
    assert results[2] == ("WorkspaceGrowthError",)
    kind, ranks, held_by, message = results[1]
    # The group's ranks are 0 and 1, whatever their ranks in the world.
    assert (kind, ranks, held_by) == ("WorkspaceAgreementError", (1,), [0, 1])
    assert "rank 1 failed: WorkspaceGrowthError" in message


def test_reserve_makes_exactly_the_served_keys_and_reports_the_bytes():
    pool = _pool(serves=SERVES)
    assert pool.reserve() == 3 * MIB
    assert list(pool.workspaces()) == SERVES
    assert pool.reserve() == 3 * MIB  # again: nothing new
    assert WorkspacePool("cpu", 1).reserve() == 0  # serves any key: none is known up front


def test_without_a_group_seal_is_the_plain_seal():
    pool = _pool(serves=SERVES)
    pool.get("decode", 0)
    pool.seal()
    assert pool.sealed and [s.grown_to_agree_bytes for s in pool.stats()] == [0]
    assert torch.distributed.is_initialized() is False


def one_rank_sealed_alone(rank: int, world: int) -> Any:
    pool = _pool(serves=SERVES)
    workspace = pool.get("decode", 0)
    if rank == 0:
        workspace.seal()  # this rank sealed its workspace before the group did
    else:
        _grow(pool, "decode", 0, 3 * MIB)
    try:
        pool.seal(group=dist.group.WORLD)
    except (WorkspaceSealedError, WorkspaceAgreementError) as error:
        figures = (
            (error.held_bytes, error.needed_bytes, error.suggested_mb)
            if isinstance(error, WorkspaceSealedError)
            else error.ranks
        )
        return type(error).__name__, str(error), pool.sealed, workspace.tensor.numel(), figures
    return "sealed"


def test_a_rank_that_sealed_alone_refuses_to_grow_and_no_rank_seals(tmp_path):
    first, second = run_ranks(one_rank_sealed_alone, 2, tmp_path / "store")
    kind, message, pool_sealed, held, figures = first
    assert (kind, pool_sealed, held, figures) == ("WorkspaceSealedError", False, MIB,
                                                  (MIB, 3 * MIB, 3))  # fmt: skip
    assert "seal with the group before any rank seals alone" in message
    kind, message, pool_sealed, held, figures = second
    assert (kind, pool_sealed, held, figures) == ("WorkspaceAgreementError", False, 3 * MIB, (0,))
    assert "rank 0 failed: WorkspaceSealedError" in message


def plan_races_the_seal(rank: int, world: int) -> dict[str, Any]:
    """Rank 0's plan, made while the group agrees (after the sizes were gathered, before they
    are applied), would grow its workspace past the agreed size."""
    from mstar_resources.attn import _pool as pool_module

    pool = _pool(serves=SERVES)
    pool.get("decode", 0)
    gather = pool_module._gather_held
    refused: list[str] = []

    def gather_then_plan(*args):  # the window a growth could slip into
        every_held = gather(*args)
        if rank == 0:
            try:
                _grow(pool, "decode", 0, 5 * MIB)
            except WorkspaceSealedError as error:
                refused.append(error.workspace)
        return every_held

    pool_module._gather_held = gather_then_plan
    pool.seal(group=dist.group.WORLD)
    return {**_holding(pool), "refused": refused}


def test_a_plan_during_the_group_seal_is_refused_and_the_ranks_seal_at_one_size(tmp_path):
    first, second = run_ranks(plan_races_the_seal, 2, tmp_path / "store")
    assert first["refused"] == ["attention:decode:cg0"]
    assert first["sizes"] == second["sizes"] == {"decode/0": MIB}
    assert first["sealed"] and second["sealed"]


def failed_seal_then_grows(rank: int, world: int) -> dict[str, Any]:
    pool = _pool(serves=SERVES if rank == 0 else SERVES[:1])  # the ranks' pools differ
    pool.get("decode", 0)
    refused = None
    try:
        pool.seal(group=dist.group.WORLD)
    except WorkspaceAgreementError as error:
        refused = type(error).__name__
    _grow(pool, "decode", 0, 2 * MIB)  # not sealed, so plans may grow it again
    return {**_holding(pool), "refused": refused}


def test_a_group_seal_that_fails_leaves_the_workspaces_growable(tmp_path):
    for holding in run_ranks(failed_seal_then_grows, 2, tmp_path / "store"):
        assert holding["refused"] == "WorkspaceAgreementError"
        assert holding["sizes"] == {"decode/0": 2 * MIB} and not holding["sealed"]


class _KeywordOnly(Exception):
    """An error that pickles but can't be rebuilt from its args (a keyword-only field)."""

    def __init__(self, message: str, *, held: int) -> None:
        super().__init__(message)
        self.held = held


def test_a_peer_gets_the_error_whole_or_its_type_and_text():
    from mstar_resources.attn._pool import _picklable

    whole = _picklable(WorkspaceSealedError(
        "sealed", workspace="w", held_bytes=1, needed_bytes=2, setting="s", suggested_mb=1
    ))  # fmt: skip
    assert isinstance(whole, WorkspaceSealedError) and whole.needed_bytes == 2
    told = _picklable(_KeywordOnly("boom", held=3))
    assert (type(told), str(told)) == (RuntimeError, "_KeywordOnly: boom")
