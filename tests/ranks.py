"""Running a test's scenario on several torch.distributed ranks, each a process of its own.

Every rank is started and waited for with a deadline, so a rank that hangs fails the test instead
of blocking the run. gloo ranks work on the CPU; NCCL ranks each take the GPU of their rank.

Ranks are forked from multiprocessing's fork server, started once a test process with torch and
the first scenario's module imported: a rank costs a fork, not a fresh interpreter's import of
torch (about 3 s of CPU each on a CI machine). The server is a single-threaded process that
imports torch but initialises no CUDA: each rank initialises its own after the fork, as a spawned
rank would.
"""

from __future__ import annotations

import datetime
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEADLINE_S = 60
"""How long a scenario may take on all its ranks."""

Scenario = Callable[[int, int], Any]


def run_ranks(
    scenario: Scenario, world: int, store: Path, backend: str = "gloo", deadline_s: int = DEADLINE_S
) -> list[Any]:
    """``scenario(rank, world)`` on ``world`` ranks of ``backend``; what each returned, or the
    exception it raised (as ``(type name, message)``), by rank."""
    context = mp.get_context("forkserver")
    # Read when the server starts (the first call), ignored after.
    context.set_forkserver_preload(["torch.distributed", __name__, scenario.__module__])
    results = context.Queue()
    ranks = [
        context.Process(
            target=_rank_main, args=(scenario, rank, world, str(store), backend, results)
        )
        for rank in range(world)
    ]
    for process in ranks:
        process.start()
    got: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, outcome = results.get(timeout=deadline_s)
            got[rank] = outcome
    except Exception:
        pytest.fail(f"ranks {sorted(set(range(world)) - set(got))} did not finish: a hang")
    finally:
        for process in ranks:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return [got[rank] for rank in range(world)]


def _rank_main(
    scenario: Scenario, rank: int, world: int, store: str, backend: str, results: Any
) -> None:
    outcome: Any
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"file://{store}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=DEADLINE_S // 2),
        )
        outcome = scenario(rank, world)
    except Exception as error:
        outcome = (type(error).__name__, str(error) or traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    results.put((rank, outcome))
