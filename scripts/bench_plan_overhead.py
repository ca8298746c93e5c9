"""What Workspace.plan adds around a plan, as a ratio to calling the planner directly.

    python scripts/bench_plan_overhead.py                 # CPU, and the GPU when there is one
    python scripts/bench_plan_overhead.py --rounds 3 --min-run-time 0.05 --png /tmp/o.png

Two planners: a real FlashInfer decode plan (batch 64, 4096 tokens each, on a CUDA GPU) and, on
the CPU, a planner of similar cost (host work calibrated to the decode plan's ~220 us). Direct and
wrapped calls alternate round by round, and each ratio is taken within one round, so drift in the
machine's speed cancels out; the table gives the median over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils.benchmark as benchmark

from mstar_resources import WorkspacePool

DECODE_PLAN_US = 220.0  # FlashInfer's decode plan on an H200 (see the FlashInfer notes)


@dataclass
class Row:
    case: str
    direct_us: float
    wrapped_us: float
    ratio: float

    @property
    def added_us(self) -> float:
        return self.wrapped_us - self.direct_us


def measure(
    case: str, direct: Callable[[], object], wrapped: Callable[[], object], rounds: int, t: float
) -> Row:
    def median_us(fn: Callable[[], object]) -> float:
        timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
        return timer.blocked_autorange(min_run_time=t).median * 1e6

    direct_us, wrapped_us, ratios = [], [], []
    for _ in range(rounds):
        d, w = median_us(direct), median_us(wrapped)
        direct_us.append(d)
        wrapped_us.append(w)
        ratios.append(w / d)
    return Row(
        case,
        statistics.median(direct_us),
        statistics.median(wrapped_us),
        statistics.median(ratios),
    )


def cpu_planner(target_us: float) -> Callable[..., object]:
    """Host work costing about ``target_us`` per call, taking a decode plan's arguments."""
    work = torch.arange(1024, dtype=torch.int64)

    def planner(*args: object, **kwargs: object) -> object:
        for _ in range(repeats):
            work.cumsum(0)
        return None

    repeats = 1
    one = benchmark.Timer(stmt="fn()", globals={"fn": planner}).blocked_autorange(min_run_time=0.2)
    repeats = max(1, round(target_us / (one.median * 1e6)))
    return planner


def cpu_row(rounds: int, t: float) -> Row:
    workspace = WorkspacePool("cpu", size_mb=1).get("decode")
    planner = cpu_planner(DECODE_PLAN_US)
    args = (1, 2, 3, 32, 8, 128, 16)
    kwargs = {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    return measure(
        "CPU planner of similar cost",
        lambda: planner(*args, **kwargs),
        lambda: workspace.plan(planner, *args, **kwargs),
        rounds,
        t,
    )


def noop_row(rounds: int, t: float) -> Row:
    """A planner that does nothing: what remains is Workspace.plan's own cost per call."""
    workspace = WorkspacePool("cpu", size_mb=1).get("decode")

    def planner(*args: object, **kwargs: object) -> None:
        return None

    args = (1, 2, 3, 32, 8, 128, 16)
    kwargs = {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    return measure(
        "no-op planner (Workspace.plan's own cost)",
        lambda: planner(*args, **kwargs),
        lambda: workspace.plan(planner, *args, **kwargs),
        rounds,
        t,
    )


def gpu_row(rounds: int, t: float) -> Row:
    import flashinfer

    batch, kv_len, page = 64, 4096, 16
    pages = kv_len // page
    indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * pages
    indices = torch.arange(batch * pages, dtype=torch.int32, device="cuda")
    last_page_len = torch.full((batch,), page, dtype=torch.int32, device="cuda")
    workspace = WorkspacePool("cuda", size_mb=1).get("decode")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace.tensor, "NHD", backend="fa2")
    args = (indptr, indices, last_page_len, 32, 8, 128, page)
    kwargs = {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    workspace.plan(wrapper.plan, *args, **kwargs)  # builds the kernel and grows once, untimed
    return measure(
        f"FlashInfer decode plan (bs={batch}, kv={kv_len}, {torch.cuda.get_device_name()})",
        lambda: wrapper.plan(*args, **kwargs),
        lambda: workspace.plan(wrapper.plan, *args, **kwargs),
        rounds,
        t,
    )


def plot(rows: list[Row], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.8 * len(rows)))
    names = [row.case for row in rows]
    ax.barh(names, [row.ratio for row in rows], color="tab:blue")
    ax.axvline(1.0, color="black", linewidth=0.8)
    for i, row in enumerate(rows):
        ax.annotate(f" {row.ratio:.4f}  ({row.added_us:+.2f} us)", (row.ratio, i), va="center")
    ax.set_xscale("log")
    ax.set_xlabel("time via Workspace.plan / time calling the planner directly")
    ax.set_title("Workspace.plan overhead (median ratio over rounds)")
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    parser.add_argument(
        "--min-run-time", type=float, default=0.2, help="seconds per measurement (default 0.2)"
    )
    parser.add_argument("--png", type=Path, default=Path("docs/bench_plan_overhead.png"))
    options = parser.parse_args(argv)
    rows = []
    if options.device in ("cpu", "all"):
        rows.append(noop_row(options.rounds, options.min_run_time))
        rows.append(cpu_row(options.rounds, options.min_run_time))
    if options.device in ("cuda", "all"):
        if torch.cuda.is_available():
            rows.append(gpu_row(options.rounds, options.min_run_time))
        elif options.device == "cuda":
            print("no CUDA GPU here", file=sys.stderr)
            return 1
    print(f"{'planner':<62} {'direct us':>10} {'via plan us':>12} {'added us':>9} {'ratio':>7}")
    for row in rows:
        print(
            f"{row.case:<62} {row.direct_us:>10.1f} {row.wrapped_us:>12.1f} "
            f"{row.added_us:>9.2f} {row.ratio:>7.4f}"
        )
    options.png.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, options.png)
    print(f"plot: {options.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
