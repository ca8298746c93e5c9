"""What agreeing across ranks costs: WorkspacePool.seal(group=...) against plain seal(), as ratios.

    python scripts/bench_seal_ranks.py                          # gloo on the CPU, 2 and 4 ranks
    python scripts/bench_seal_ranks.py --full                   # ... and 8 ranks
    python scripts/bench_seal_ranks.py --ranks 2 --rounds 5 --png /tmp/seal_ranks.png
    python scripts/bench_seal_ranks.py --backend nccl --ranks 2  # on GPUs, one per rank

For each world size, that many processes (spawned, each its own torch.distributed rank with one
CPU thread, as torchrun sets it, meeting through a FileStore in a temporary folder). Each round,
every rank builds a pool as build_pools would (``resources.attn.decode``: decode in cg slots 0 and
1, and eager prefill, 1 MB floors) and reserves it; rank 0 then grows one workspace to 2 MB
through a planner that fails with FlashInfer's overflow text, so the ranks differ and the others
must grow to agree. After a barrier, each rank times ``seal(group=WORLD)``; then, on a second pool
made the same way, after another barrier, plain ``seal()``. A round's time is the slowest rank's;
the table gives the medians over rounds (after a few untimed warm-up rounds), the time agreement
adds and its ratio to the plain seal. On CUDA the clock is read after a synchronize.
With more gloo ranks than CPU cores, ranks wait for a core, and that waiting is in the times.

It draws a figure only with ``--png`` (matplotlib: the ``bench`` extra), into a folder that exists.
"""

from __future__ import annotations

import argparse
import datetime
import queue
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mstar_resources import WorkspacePool
from mstar_resources.units import MIB

from _args import count, refuse, run_main
from _plot import add_png_option, check_png, pyplot, save

RANKS = [2, 4]
FULL_RANKS = 8  # 8 processes importing torch: only in the full sweep
MOST_RANKS = 64  # a process each
WARMUP_ROUNDS = 3
GROWN_BYTES = 2 * MIB
"""What rank 0's planned overflow grows one workspace to (twice the floor)."""
SERVES = [("decode", 0), ("decode", 1), ("prefill", None)]
INIT_TIMEOUT_S = 60
"""How long a rank waits for the others at init and at each collective before failing."""
DEADLINE_S = 180
"""How long the parent waits for all ranks of one world size (each imports torch first)."""
COLLECTIVES = "seal(group) makes 2 all_gather_object calls on the group; nothing runs per step"


class RanksFailed(Exception):
    """A rank raised, or the ranks did not finish in time: there is nothing meaningful to report."""


@dataclass
class Row:
    """One world size's line of the table: median microseconds of the slowest rank."""

    backend: str
    ranks: int
    device: str
    plain_us: float
    group_us: float

    @property
    def added_us(self) -> float:
        return self.group_us - self.plain_us

    @property
    def ratio(self) -> float:
        return self.group_us / self.plain_us


def overflowing_planner(buffer: torch.Tensor, nbytes: int) -> Callable[[], None]:
    """A planner that needs ``nbytes`` of ``buffer`` and, short of them, fails with the text
    FlashInfer's AlignedAllocator throws, so ``Workspace.plan`` grows the buffer to ``nbytes``."""

    def plan() -> None:
        available = buffer.numel()  # the tensor itself: it sees the workspace grow in place
        if available < nbytes:
            raise RuntimeError(
                f"Buffer overflow when allocating memory for batch_decode_tmp_v with size "
                f"{nbytes} and alignment 16, but only {available} bytes available in "
                "AlignedAllocator."
            )

    return plan


def fresh_pool(device: torch.device, rank: int) -> WorkspacePool:
    """A pool as build_pools makes one, reserved; on rank 0 one workspace grew past its floor."""
    pool = WorkspacePool(device, 1, "attention", config_key="resources.attn.decode", serves=SERVES)
    pool.reserve()
    if rank == 0:
        workspace = pool.get("decode", 0)
        workspace.plan(overflowing_planner(workspace.tensor, GROWN_BYTES))
    return pool


def timed_seal(pool: WorkspacePool, group: Any, sync: Callable[[], None]) -> float:
    """Seconds one ``pool.seal(group=group)`` takes on this rank, the ranks started together."""
    dist.barrier()
    sync()  # a barrier on NCCL is a kernel: done before the clock starts
    start = time.perf_counter()
    pool.seal(group=group)
    sync()  # growth on CUDA is asynchronous: count it
    return time.perf_counter() - start


def measure_rank(rank: int, backend: str, rounds: int) -> tuple[list[float], list[float], int]:
    """This rank's seconds per timed round, (seal(group), seal()), and the bytes it held after
    the last agreement (the same on every rank, or agreement failed)."""
    if backend == "nccl":
        device = torch.device("cuda", rank)

        def sync() -> None:
            torch.cuda.synchronize(device)

    else:
        device = torch.device("cpu")

        def sync() -> None:
            pass

    group, plain, held = [], [], 0
    for round_ in range(WARMUP_ROUNDS + rounds):
        agreed = fresh_pool(device, rank)
        group_s = timed_seal(agreed, dist.group.WORLD, sync)
        alone = fresh_pool(device, rank)
        plain_s = timed_seal(alone, None, sync)
        held = agreed.held_bytes
        if round_ >= WARMUP_ROUNDS:
            group.append(group_s)
            plain.append(plain_s)
    return group, plain, held


def rank_main(rank: int, world: int, backend: str, rounds: int, store: str, results: Any) -> None:
    """One rank: measure, then rank 0 sends every rank's timings; any error is sent instead."""
    error, payload = None, None
    # One thread per rank, as torchrun sets it: ranks that each start a thread per core contend
    # for the cores, and gloo's seal(group) then timed ten times slower on a 32-core machine.
    torch.set_num_threads(1)
    try:
        options: dict[str, Any] = {}
        if backend == "nccl":
            torch.cuda.set_device(rank)
            options["device_id"] = torch.device("cuda", rank)  # barrier() knows its device
        dist.init_process_group(
            backend,
            init_method=f"file://{store}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S),
            **options,
        )
        mine = measure_rank(rank, backend, rounds)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            name = torch.cuda.get_device_name(rank) if backend == "nccl" else "CPU"
            payload = (name, gathered)
    except Exception:
        error = traceback.format_exc().strip().splitlines()[-1]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    results.put((rank, error, payload))


def collect(ranks: Sequence[BaseProcess], results: Any, backend: str) -> dict[int, Any]:
    """What each rank sent, by rank; fails as soon as one reports an error or dies silently,
    or once the deadline passes."""
    world = len(ranks)
    got: dict[int, Any] = {}
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < world:
        try:
            rank, error, payload = results.get(timeout=1)
        except queue.Empty:
            # A rank that exited sent its result before it did (the queue flushes at exit).
            dead = [r for r, p in enumerate(ranks) if r not in got and p.exitcode not in (None, 0)]
            if dead:
                code = ranks[dead[0]].exitcode
                raise RanksFailed(
                    f"{world} {backend} ranks: rank {dead[0]} died (exit code {code})"
                ) from None
            if time.monotonic() > deadline:
                missing = sorted(set(range(world)) - set(got))
                raise RanksFailed(
                    f"{world} {backend} ranks: ranks {missing} did not finish within {DEADLINE_S} s"
                ) from None
            continue
        if error is not None:
            raise RanksFailed(f"{world} {backend} ranks: rank {rank} failed: {error}")
        got[rank] = payload
    return got


def slowest_median(by_rank: list[list[float]]) -> float:
    """The median over rounds of the slowest rank's seconds (``by_rank[rank][round]``)."""
    # A round takes as long as its slowest rank: the others wait for it at the next collective.
    slowest: list[float] = [max(times) for times in zip(*by_rank, strict=True)]
    return statistics.median(slowest)


def run_world(world: int, backend: str, rounds: int) -> Row:
    """The row of ``world`` ranks: medians over rounds of the slowest rank's time."""
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as workdir:
        store = str(Path(workdir) / "store")
        ranks = [
            context.Process(target=rank_main, args=(rank, world, backend, rounds, store, results))
            for rank in range(world)
        ]
        # The ranks start with Ctrl-C ignored (a spawned Python keeps an ignored SIGINT): it reaches
        # the whole process group, and the parent alone says so, ending the ranks below.
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for process in ranks:
                process.start()
        finally:
            signal.signal(signal.SIGINT, handler)
        finished = False
        try:
            got = collect(ranks, results, backend)
            finished = True
        finally:
            for process in ranks:
                # After a failure the others wait in a collective until its timeout: end them now.
                process.join(timeout=10 if finished else 0)
                if process.is_alive():
                    process.kill()
                    process.join()
    device, gathered = got[0]
    if len({held for _, _, held in gathered}) != 1:
        raise RanksFailed(f"{world} ranks ended holding different bytes: {gathered}")
    group_s = slowest_median([group for group, _, _ in gathered])
    plain_s = slowest_median([plain for _, plain, _ in gathered])
    return Row(backend, world, device, plain_s * 1e6, group_s * 1e6)


def plot(rows: list[Row], png: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ranks = [row.ranks for row in rows]
    ax.plot(ranks, [row.plain_us for row in rows], "o-", label="seal()")
    ax.plot(ranks, [row.group_us for row in rows], "s-", label="seal(group=WORLD)")
    ax.set_xticks(ranks)
    ax.set_xlabel(f"ranks ({rows[0].backend}, {rows[0].device})")
    ax.set_ylabel("median of the slowest rank (us)")
    ax.set_yscale("log")
    ax.set_title("What agreeing across ranks adds to sealing a pool")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save(fig, png)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ranks",
        type=count(MOST_RANKS),
        nargs="+",
        default=RANKS,
        help=f"world sizes, at most {MOST_RANKS} (default 2 4)",
    )
    parser.add_argument("--full", action="store_true", help=f"also {FULL_RANKS} ranks")
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default="gloo",
        help="gloo: pools on the CPU (default); nccl: rank r on cuda:r, one GPU per rank",
    )
    parser.add_argument("--rounds", type=count(1000), default=30, help="timed rounds (default 30)")
    add_png_option(parser)
    options = parser.parse_args(argv)
    check_png(parser, options.png)
    worlds = sorted(set(options.ranks) | ({FULL_RANKS} if options.full else set()))
    if options.backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < worlds[-1]:
            refuse(
                parser,
                "--backend",
                "nccl",
                f"{worlds[-1]} ranks need {worlds[-1]} GPUs, one per rank; this machine has {gpus}",
            )
    try:
        rows = [run_world(world, options.backend, options.rounds) for world in worlds]
    except RanksFailed as error:
        print(error, file=sys.stderr)
        return 1
    print(
        f"{'backend':<7} {'ranks':>5} {'seal() us':>10} {'seal(group) us':>15} "
        f"{'added us':>9} {'ratio':>7}  device"
    )
    for row in rows:
        print(
            f"{row.backend:<7} {row.ranks:>5} {row.plain_us:>10.1f} {row.group_us:>15.1f} "
            f"{row.added_us:>9.1f} {row.ratio:>7.1f}  {row.device}"
        )
    print(COLLECTIVES)
    if options.png:
        plot(rows, options.png)
    return 0


if __name__ == "__main__":
    run_main(main)
