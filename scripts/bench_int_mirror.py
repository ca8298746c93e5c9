"""The host side of a shared int workspace, three ways, side by side on one GPU.

    python scripts/bench_int_mirror.py          # a CUDA GPU and FlashInfer; about 20 s
    python scripts/bench_int_mirror.py --steps 2000 --run-us 300

A FlashInfer plan writes its indices to a host buffer, the wrapper's mirror, then queues a copy of
them into the int workspace on the GPU. A copy from pinned memory reads its source when the stream
reaches it; one from pageable memory, before ``cudaMemcpyAsync`` returns. Wrappers that share an
int workspace (one per CUDA-graph batch size) plan on it three ways here:

- ``ring``: ten pinned mirrors written in turn, a CUDA event recorded after every eight plans and
  queried before a mirror is written again, waited for where its copy has not run;
- ``pageable``: one pageable mirror, shared by every wrapper;
- ``own pinned``: each wrapper its own pinned mirror, as FlashInfer makes it;
- ``Workspace.plan``: the wrappers a ``WorkspacePool`` builds, planned through ``Workspace.plan``
  (whichever of the ways above the installed package uses, plus its own Python).

For each, on FlashInfer's decode plan of two wrappers (batch 512 of 2,048 tokens and batch 8 of
1,000; bf16, 32/8 heads of 128, page 16):

1. a plan's cost, the GPU idle: the median of the ways' plans taken in turn, round after round;
2. an engine's loop: each step plans both wrappers, then queues its run (a kernel of ``--run-us``),
   the host waiting for the step two before its own (as vLLM's async scheduling does); the plans'
   median, 99th percentile and longest, and how many took longer than a step's run (a plan that
   waits for a copy queued behind a run waits that long);
3. the race: the GPU busy for 200 ms, the first wrapper plans, the copy its run would read is
   queued, then the second wrapper plans and the first plans again (other indices): does that run
   read its own indices?

It prints one table; status 2 where no CUDA GPU or no FlashInfer is here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench_plan_overhead import gpu_missing

from _args import count, run_main

PAGE, HEADS, KV_HEADS, HEAD_DIM = 16, 32, 8, 128
INT_BYTES = 1 << 20
RING_MIRRORS, PLANS_PER_EVENT = 10, 8


def pages(batch: int, kv_len: int, offset: int = 0) -> tuple[Any, ...]:
    """A decode plan's arguments: ``batch`` requests of ``kv_len`` tokens, from pinned host
    tensors as engines keep them."""
    import torch

    per = -(-kv_len // PAGE)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * per
    indices = torch.arange(batch * per, dtype=torch.int32) + offset
    last = torch.full((batch,), kv_len - (per - 1) * PAGE, dtype=torch.int32)
    return (*(t.pin_memory() for t in (indptr, indices, last)), HEADS, KV_HEADS, HEAD_DIM, PAGE)


class Way:
    """Two decode wrappers on one int workspace, and how a plan reaches FlashInfer."""

    def __init__(self, name: str) -> None:
        import flashinfer
        import torch

        self.name = name
        self.int_buffer = torch.zeros(INT_BYTES, dtype=torch.uint8, device="cuda")
        self.plan: Callable[[Any, tuple[Any, ...]], None] = self._plan_direct
        kind = flashinfer.BatchDecodeWithPagedKVCacheWrapper
        if name == "Workspace.plan":
            from mstar_resources import WorkspacePool

            pool = WorkspacePool("cuda", size_mb=64, int_size_mb=1)
            self.workspace = pool.get("decode")
            self.wrappers = [pool.build(kind, "NHD", label="decode", backend="fa2")
                             for _ in range(2)]  # fmt: skip
            int_workspace = self.workspace.int_workspace
            assert int_workspace is not None
            self.int_buffer = int_workspace.tensor
            self.plan = self._plan_through_workspace
            return
        floats = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
        self.wrappers = [kind(floats, "NHD", backend="fa2") for _ in range(2)]
        shared = torch.zeros(INT_BYTES, dtype=torch.uint8)  # pageable
        for wrapper in self.wrappers:
            wrapper._int_workspace_buffer = self.int_buffer
            if name == "pageable":
                wrapper._pin_memory_int_workspace_buffer = shared
            elif name == "own pinned":
                wrapper._pin_memory_int_workspace_buffer = shared.clone().pin_memory()
        if name == "ring":
            self.mirrors = [torch.zeros(INT_BYTES, dtype=torch.uint8).pin_memory()
                            for _ in range(RING_MIRRORS)]  # fmt: skip
            self.events = [torch.cuda.Event() for _ in range(RING_MIRRORS // PLANS_PER_EVENT + 2)]
            self.plans = 0
            self.plan = self._plan_ring

    def _plan_direct(self, wrapper: Any, args: tuple[Any, ...]) -> None:
        wrapper.plan(*args, q_data_type=_bf16(), kv_data_type=_bf16())

    def _plan_through_workspace(self, wrapper: Any, args: tuple[Any, ...]) -> None:
        self.workspace.plan(wrapper.plan, *args, q_data_type=_bf16(), kv_data_type=_bf16())

    def _plan_ring(self, wrapper: Any, args: tuple[Any, ...]) -> None:
        n, events = self.plans, self.events
        if n >= RING_MIRRORS and (n - RING_MIRRORS) % PLANS_PER_EVENT == 0:
            event = events[(n - RING_MIRRORS) // PLANS_PER_EVENT % len(events)]
            if not event.query():
                event.synchronize()
        wrapper._pin_memory_int_workspace_buffer = self.mirrors[n % RING_MIRRORS]
        self._plan_direct(wrapper, args)
        self.plans = n + 1
        if n % PLANS_PER_EVENT == PLANS_PER_EVENT - 1:
            events[n // PLANS_PER_EVENT % len(events)].record()


def _bf16() -> Any:
    import torch

    return torch.bfloat16


def sleep_gpu(us: float) -> None:
    import torch

    torch.cuda._sleep(int(us * torch.cuda.get_device_properties(0).clock_rate / 1000))


def idle_cost(ways: list[Way], args: list[tuple[Any, ...]], rounds: int) -> dict[str, float]:
    """Each way's median plan, in us, the GPU idle, the ways taken in turn (order rotated)."""
    import torch

    times: dict[str, list[int]] = {w.name: [] for w in ways}
    clock = time.perf_counter_ns
    for r in range(rounds):
        for way in ways[r % len(ways) :] + ways[: r % len(ways)]:
            for _ in range(16):
                for wrapper, a in zip(way.wrappers, args, strict=True):
                    begin = clock()
                    way.plan(wrapper, a)
                    times[way.name].append(clock() - begin)
        torch.cuda.synchronize()
    return {name: statistics.median(t) / 1e3 for name, t in times.items()}


def engine_loop(way: Way, args: list[tuple[Any, ...]], steps: int, run_us: float) -> list[int]:
    """Each plan's nanoseconds in an engine's loop, the host at most two steps ahead."""
    import torch

    done = [torch.cuda.Event() for _ in range(steps)]
    spans = []
    clock = time.perf_counter_ns
    torch.cuda.synchronize()
    for step in range(steps):
        if step >= 2:
            done[step - 2].synchronize()
        for wrapper, a in zip(way.wrappers, args, strict=True):
            begin = clock()
            way.plan(wrapper, a)
            spans.append(clock() - begin)
        sleep_gpu(run_us)
        done[step].record()
    torch.cuda.synchronize()
    return spans


def race_holds(way: Way, args: list[tuple[Any, ...]], other: tuple[Any, ...]) -> bool:
    """Whether the first wrapper's run would read its own plan's indices, the GPU busy while the
    second wrapper plans and the first plans again."""
    import flashinfer
    import torch

    alone = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(64 << 20, dtype=torch.uint8, device="cuda"), "NHD", backend="fa2"
    )
    alone.plan(*args[0], q_data_type=_bf16(), kv_data_type=_bf16())
    torch.cuda.synchronize()
    head = 4096
    its_own = alone._int_workspace_buffer[:head].clone()
    sleep_gpu(200_000)
    way.plan(way.wrappers[0], args[0])
    seen = way.int_buffer[:head].clone()  # queued where the first wrapper's run would be
    way.plan(way.wrappers[1], args[1])
    way.plan(way.wrappers[0], other)
    torch.cuda.synchronize()
    return torch.equal(seen, its_own)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=count(10_000), default=41, help="idle rounds (41)")
    parser.add_argument("--steps", type=count(100_000), default=1000, help="loop steps (1000)")
    parser.add_argument("--run-us", type=count(1_000_000), default=1000,
                        help="each step's run on the GPU, us (1000)")  # fmt: skip
    options = parser.parse_args()
    problem = gpu_missing()
    if problem:
        parser.error(f"{problem}: this benchmark measures on a CUDA GPU with FlashInfer")
    import torch

    args = [pages(512, 2048), pages(8, 1000, offset=7)]
    other = pages(300, 1500, offset=3)
    ways = [Way(name) for name in ("own pinned", "pageable", "ring", "Workspace.plan")]
    for way in ways:  # kernels loaded, first plans made, untimed
        for wrapper, a in zip(way.wrappers, args, strict=True):
            way.plan(wrapper, a)
    torch.cuda.synchronize()
    idle = idle_cost(ways, args, options.rounds)
    base = idle["own pinned"]
    head = (f"{'way':<16} {'idle us':>8} {'vs own':>7} {'loop p50':>9} {'p99':>7} {'max':>8} "
            f"{'> a run':>8}  race")  # fmt: skip
    print(f"{torch.cuda.get_device_name()}, FlashInfer decode plans, {options.steps:,} steps of "
          f"{options.run_us} us on the GPU, the host two steps ahead")  # fmt: skip
    print(head)
    for way in ways:
        spans = sorted(engine_loop(way, args, options.steps, options.run_us))
        over = sum(s / 1e3 > options.run_us for s in spans)
        holds = race_holds(way, args, other)
        print(f"{way.name:<16} {idle[way.name]:>8.1f} {idle[way.name] / base:>7.3f} "
              f"{spans[len(spans) // 2] / 1e3:>9.1f} {spans[int(len(spans) * 0.99)] / 1e3:>7.1f} "
              f"{spans[-1] / 1e3:>8.1f} {over:>8,}  "
              f"{'holds' if holds else 'RACES'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_main(main)
