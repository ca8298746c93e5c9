"""What a workspace adds around a plan, as a ratio to calling the planner directly: through
``plan_through(workspace, plan)``, which the plugins put where an engine calls its planner.

    python scripts/bench_plan_overhead.py                 # CPU rows; GPU rows where they can run
    python scripts/bench_plan_overhead.py --device cpu --rounds 3 --min-run-time 0.05
    python scripts/bench_plan_overhead.py --png docs/bench_plan_overhead.png  # docs', on a GPU

The planners: a real FlashInfer decode plan (batch 64, 4096 tokens each, its inputs in pinned
host memory as an engine's are), its wrapper given the pool's int workspace (its plans write the
pageable host mirror), the same plan through a Python function that does nothing else (the least
any layer of Python adds beside a real plan, whose work leaves the host's caches cold), the plan
on an int workspace of its own; and a no-op wrapper on the shared int workspace, which leaves the
workspace's own cost on the GPU. These GPU rows only where there are a CUDA GPU and FlashInfer,
else they are left out and stderr says why, or, asked for alone with ``--device cuda``, the run
is refused with status 2 (``scripts/bench_int_mirror.py`` times the int workspace's host side in
an engine's loop). On the CPU: a planner of similar cost (host work calibrated to the decode
plan's ~220 us), and a no-op planner, which leaves only the workspace's own cost. Each round
calls the planner directly and through the workspace in turn, one call each a pair, the pair's
order swapped every time (ABBA, so a drift in the machine's speed cancels out), and takes the
median of the pairs' differences; the table gives the medians over rounds.

It draws a figure only with ``--png`` (matplotlib: the ``bench`` extra), into a folder that exists.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _args import count, refuse, run_main, seconds
from _plot import add_png_option, check_png, pyplot, save

DECODE_PLAN_US = 220.0  # FlashInfer's decode plan on an H200 (see the FlashInfer notes)


@dataclass
class Row:
    case: str
    direct_us: float
    wrapped_us: float
    added_us: float
    ratio: float


def measure(
    case: str, direct: Callable[[], object], wrapped: Callable[[], object], rounds: int, t: float
) -> Row:
    """``rounds`` rounds of ``t`` seconds each, calling ``direct`` and ``wrapped`` in turn, one
    call each a pair, their order swapped every pair (ABBA): a pair's difference is free of any
    drift slower than two calls, and its median within a round of the calls that something else
    on the machine disturbed. The row gives the medians over rounds."""
    clock = time.perf_counter_ns
    direct_us, wrapped_us, added_us, ratios = [], [], [], []
    direct(), wrapped()  # warm
    for _ in range(rounds):
        plain: list[int] = []
        through: list[int] = []
        end = clock() + int(t * 1e9)
        while clock() < end or len(plain) < 64:
            for first, second, into in ((direct, wrapped, (plain, through)),
                                        (wrapped, direct, (through, plain))):  # fmt: skip
                begin = clock()
                first()
                middle = clock()
                second()
                into[0].append(middle - begin)
                into[1].append(clock() - middle)
        median = statistics.median
        direct_us.append(median(plain) / 1e3)
        wrapped_us.append(median(through) / 1e3)
        added_us.append(median(w - d for w, d in zip(through, plain, strict=True)) / 1e3)
        ratios.append(wrapped_us[-1] / direct_us[-1])
    median = statistics.median
    return Row(case, median(direct_us), median(wrapped_us), median(added_us), median(ratios))


def cpu_planner(target_us: float) -> Callable[..., object]:
    """Host work costing about ``target_us`` per call, taking a decode plan's arguments: a
    single-threaded loop, steadier than torch's CPU kernels, which may spread over threads."""

    def planner(*args: object, **kwargs: object) -> int:
        total = 0
        for i in range(steps):
            total += i * i
        return total

    import torch.utils.benchmark as benchmark

    steps = 1000
    one = benchmark.Timer(stmt="fn()", globals={"fn": planner}).blocked_autorange(min_run_time=0.2)
    steps = max(1, round(steps * target_us / (one.median * 1e6)))
    return planner


def host_row(case: str, planner: Callable[..., object], rounds: int, t: float) -> Row:
    """``planner`` called with a decode plan's arguments, directly and through a CPU workspace."""
    import torch

    from mstar_resources import WorkspacePool
    from mstar_resources.attn._float_workspace import plan_through

    planned = plan_through(WorkspacePool("cpu", size_mb=1).get("decode"), planner)
    args = (1, 2, 3, 32, 8, 128, 16)
    kwargs = {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    return measure(
        case,
        lambda: planner(*args, **kwargs),
        lambda: planned(*args, **kwargs),
        rounds,
        t,
    )


def call_through(plan: Callable[..., object], *args: object, **kwargs: object) -> object:
    """``plan(*args, **kwargs)``: the least any layer of Python around a plan adds."""
    return plan(*args, **kwargs)


def noop(*args: object, **kwargs: object) -> None:
    """A planner that does nothing: what remains around it is the workspace's own cost."""


class _NoOpWrapper:
    """A wrapper whose plan does nothing, with the buffers FlashInfer's wrappers keep: given the
    pool's int workspace, its plans are treated as a real wrapper's."""

    def __init__(self, float_workspace_buffer: object) -> None:
        import torch

        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = torch.empty(8, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.empty(8, dtype=torch.uint8)

    def plan(self, *args: object, **kwargs: object) -> None:
        pass

    def run(self, *args: object, **kwargs: object) -> None:
        pass


def gpu_rows(rounds: int, t: float) -> list[Row]:
    """The FlashInfer decode plan through a workspace, its wrapper given the pool's int workspace
    (as the vLLM plugin's decode wrappers are) and on an int workspace of its own; and
    the workspace around a no-op wrapper on the shared int workspace, which leaves its own cost
    on the GPU."""
    import flashinfer
    import torch

    from mstar_resources import WorkspacePool
    from mstar_resources.attn._float_workspace import plan_through

    batch, kv_len, page = 64, 4096, 16
    pages = kv_len // page
    # From pinned host tensors, as an engine plans (vLLM's and the replay's plan inputs): FlashInfer
    # reads the indptrs there without a device-to-host sync, and queues the indices' copy.
    indptr = (torch.arange(batch + 1, dtype=torch.int32) * pages).pin_memory()
    indices = torch.arange(batch * pages, dtype=torch.int32).pin_memory()
    last_page_len = torch.full((batch,), page, dtype=torch.int32).pin_memory()
    args = (indptr, indices, last_page_len, 32, 8, 128, page)
    kwargs = {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    name = f"bs={batch}, kv={kv_len}, {torch.cuda.get_device_name()}"
    rows = []
    for case, shared in (("shared int workspace", True), ("its own int workspace", False)):
        pool = WorkspacePool("cuda", size_mb=1, int_size_mb=1)
        workspace = pool.get("decode")
        wrapper_class = flashinfer.BatchDecodeWithPagedKVCacheWrapper
        wrapper = (
            pool.build(wrapper_class, "NHD", label="decode", backend="fa2")
            if shared
            else wrapper_class(workspace.tensor, "NHD", backend="fa2")
        )
        plan = wrapper.plan
        planned = plan_through(workspace, plan)
        planned(*args, **kwargs)  # builds the kernel and grows once, untimed
        wrapped = functools.partial(planned, *args, **kwargs)
        direct = functools.partial(plan, *args, **kwargs)
        rows.append(measure(f"FlashInfer decode plan, {case} ({name})", direct, wrapped, rounds, t))
        if shared:  # the floor under any layer of Python, on the same plan and host
            rows.append(measure(
                "the same, through a Python function that only calls it",
                direct, functools.partial(call_through, plan, *args, **kwargs), rounds, t,
            ))  # fmt: skip
    rows.append(wrapper_row("cuda", rounds, t))
    return rows


def wrapper_row(device: str, rounds: int, t: float) -> Row:
    """A no-op wrapper built by the pool on ``device``, so given its int workspace, planned
    through it with vLLM's ``fast_plan_decode`` arguments (a wrapper first, 16 keywords): the
    path every plan of an engine's wrapper takes after its first."""
    from mstar_resources import WorkspacePool
    from mstar_resources.attn._float_workspace import plan_through

    pool = WorkspacePool(device, size_mb=1, int_size_mb=1)
    wrapper = pool.build(_NoOpWrapper, label="decode")
    planned = plan_through(pool.get("decode"), _NoOpWrapper.plan)
    kwargs = {name: i for i, name in enumerate(VLLM_PLAN_KEYWORDS)}
    return measure(
        f"no-op wrapper, shared int workspace ({device}: the workspace's own cost)",
        functools.partial(_NoOpWrapper.plan, wrapper, **kwargs),
        functools.partial(planned, wrapper, **kwargs), rounds, t,
    )  # fmt: skip


VLLM_PLAN_KEYWORDS = (
    "indptr_cpu",
    "indices",
    "last_page_len_cpu",
    "num_qo_heads",
    "num_kv_heads",
    "head_dim",
    "page_size",
    "pos_encoding_mode",
    "window_left",
    "logits_soft_cap",
    "q_data_type",
    "kv_data_type",
    "o_data_type",
    "sm_scale",
    "rope_scale",
    "rope_theta",
)
"""The keywords vLLM passes ``fast_plan_decode`` after the wrapper (0.26.0)."""


def gpu_missing() -> str | None:
    """Why the FlashInfer row cannot be measured here, or None when it can."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU here"
    if importlib.util.find_spec("flashinfer") is None:
        return "FlashInfer is not installed (pip install 'mstar-resources[flashinfer]')"
    return None


def plot(rows: list[Row], png: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.9 * len(rows)))
    ys = range(len(rows))
    ax.barh(
        [y + 0.2 for y in ys], [r.direct_us for r in rows], 0.4, label="planner called directly"
    )
    ax.barh([y - 0.2 for y in ys], [r.wrapped_us for r in rows], 0.4, label="through the workspace")
    for y, row in zip(ys, rows, strict=True):
        ax.annotate(
            f"  ratio {row.ratio:.4f}, {row.added_us:+.2f} us",
            (max(row.direct_us, row.wrapped_us), y),
            va="center",
        )
    ax.set_yticks(list(ys), [row.case.split(" (")[0] for row in rows])
    ax.set_xscale("log")
    ax.set_xlim(right=max(r.wrapped_us for r in rows) * 30)
    ax.set_xlabel("median time per call (us, log scale)")
    ax.set_title("plan_through overhead (medians over ABBA rounds)")
    ax.legend(loc="lower right", fontsize=8)
    save(fig, png)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    # Many short rounds: a drift in the machine's speed within a round is small, and the median
    # over rounds leaves out the rounds that something else on the machine disturbed.
    parser.add_argument("--rounds", type=count(1000), default=41, help="ABBA rounds (default 41)")
    parser.add_argument(
        "--min-run-time",
        type=seconds(1.0),
        default=0.02,
        help="seconds per measurement, at most 1 (default 0.02)",
    )
    add_png_option(parser)
    options = parser.parse_args(argv)
    check_png(parser, options.png)
    missing = gpu_missing() if options.device in ("cuda", "all") else None
    if missing and options.device == "cuda":
        # The only row asked for is one this machine cannot measure: nothing is left to run.
        refuse(parser, "--device", "cuda", f"{missing}; --device cpu measures the CPU rows")
    rows = []
    if options.device in ("cpu", "all"):
        planners = {
            "no-op planner (the workspace's own cost)": noop,
            "CPU planner of similar cost": cpu_planner(DECODE_PLAN_US),
        }
        for case, planner in planners.items():
            rows.append(host_row(case, planner, options.rounds, options.min_run_time))
        rows.append(wrapper_row("cpu", options.rounds, options.min_run_time))
    if options.device in ("cuda", "all"):
        if missing:
            print(f"no FlashInfer decode row: {missing}", file=sys.stderr)
        else:
            rows.extend(gpu_rows(options.rounds, options.min_run_time))
    print(f"{'planner':<62} {'direct us':>10} {'through us':>12} {'added us':>9} {'ratio':>7}")
    for row in rows:
        print(
            f"{row.case:<62} {row.direct_us:>10.1f} {row.wrapped_us:>12.1f} "
            f"{row.added_us:>9.2f} {row.ratio:>7.4f}"
        )
    if options.png:
        plot(rows, options.png)
    return 0


if __name__ == "__main__":
    run_main(main)
