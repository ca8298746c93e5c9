"""What a trace file costs the replay against its length: peak memory and seconds at 10,000,
100,000 and 1,000,000 rows.

    python scripts/bench_trace.py                         # 10k, 100k and 1M rows
    python scripts/bench_trace.py --rows 2000 20000 --deployment llama3-8b-h200_calibrated

Writes, in a temporary folder, a CSV trace in the Azure LLM inference trace's format of each
length: the prompt and output lengths of the public conversation trace's first 20 rows, in turn,
10 ms apart. Then, each in a fresh process of this Python, and one length after the other:

- ``read``: what the replay does before any GPU work, :func:`load_workload` (the file read and
  checked whole, then its requests drawn one by one, prompts included, and dropped);
- ``dry run``: ``scripts/replay.py ... dry_run=true``, which also schedules every step on the CPU.

Each line gives the process's wall seconds and its peak resident memory (``ru_maxrss``), and each
against the first length's, beside the ratio of rows: memory that holds the requests in flight
stays flat while rows grow; time grows with them. A measurement, not a check: the exit status is
0 either way (1 only if a process fails). ``--no-dry-run`` measures reading alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from _args import one_of, positive_int, run_main

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ROWS = (10_000, 100_000, 1_000_000)
DEFAULT_DEPLOYMENT = "llama3-8b-h200_calibrated"

AZURE_LENGTHS = (
    (374, 44), (396, 109), (879, 55), (91, 16), (91, 16), (381, 84), (1313, 142), (388, 84),
    (242, 14), (209, 152), (394, 124), (394, 59), (1315, 174), (2221, 15), (389, 90), (415, 106),
    (120, 12), (369, 74), (206, 162), (1353, 142),
)  # fmt: skip
"""(prompt, output) tokens of the first 20 rows of the public Azure conversation trace (2023)."""

READ = """import sys
from mstar_resources.replay.workload import load_workload
workload = load_workload(sys.argv[1], requests=int(sys.argv[2]), trace_offset=0, step_ms=10,
                         seed=0, vocab_size=32000, max_model_len=8192)
assert sum(len(request.prompt()) > 0 for request in workload.requests()) == workload.served
"""


@dataclass(frozen=True)
class Run:
    """One process's cost."""

    seconds: float
    peak_bytes: int


def write_trace(path: Path, rows: int) -> None:
    """``rows`` rows of the Azure trace's format in ``path``, timestamps written as it writes
    them (``2023-11-16 18:15:46.6805900``)."""
    start = datetime(2023, 11, 16, 18, 15, 46)
    with path.open("w", encoding="utf-8") as file:
        file.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for row in range(rows):
            prompt, output = AZURE_LENGTHS[row % len(AZURE_LENGTHS)]
            moment = start + timedelta(milliseconds=10 * row)
            file.write(f"{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond:06d}0,{prompt},{output}\n")


def measure(command: list[str]) -> Run:
    """Wall seconds and peak RSS of ``command`` run to its end, its output discarded."""
    start = time.perf_counter()
    child = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    stderr = child.stderr.read() if child.stderr else ""
    child.returncode = os.waitstatus_to_exitcode(status)  # wait4 reaped it
    if child.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{stderr}")
    # ru_maxrss is in kilobytes on Linux.
    return Run(seconds, usage.ru_maxrss * 1024)


def commands(path: Path, rows: int, deployment: str, dry_run: bool) -> dict[str, list[str]]:
    """What is measured on the trace ``path`` of ``rows`` rows, by name."""
    runs = {"read": [sys.executable, "-c", READ, str(path), str(rows)]}
    if dry_run:
        runs["dry run"] = [
            sys.executable, str(ROOT / "scripts" / "replay.py"), f"deployment={deployment}",
            f"trace={path}", f"requests={rows}", "dry_run=true", "progress=false",
        ]  # fmt: skip
    return runs


def table(results: dict[str, dict[int, Run]]) -> str:
    """Each measurement's line, and its ratios to the first length's."""
    lines = [
        f"{'what':<8} {'rows':>10} {'x rows':>7} {'seconds':>9} {'x time':>7} "
        f"{'peak RSS MiB':>13} {'x memory':>9}"
    ]
    for name, runs in results.items():
        first_rows, first = next(iter(runs.items()))
        for rows, run in runs.items():
            lines.append(
                f"{name:<8} {rows:>10,} {rows / first_rows:>7.1f} {run.seconds:>9.2f} "
                f"{run.seconds / first.seconds:>7.2f} {run.peak_bytes / 2**20:>13,.1f} "
                f"{run.peak_bytes / first.peak_bytes:>9.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        type=positive_int,
        nargs="+",
        default=list(DEFAULT_ROWS),
        help="the trace lengths to measure, in rows (default: %(default)s)",
    )
    # Checked before any trace is written: the replay refuses a deployment without a profile.
    profiled = sorted(p.stem for p in (ROOT / "conf" / "deployment").glob("*.yaml")
                      if p.stem != "none")  # fmt: skip
    parser.add_argument(
        "--deployment",
        default=DEFAULT_DEPLOYMENT,
        type=one_of(profiled, "profiled deployment"),
        help="the deployment the replay plans (default: %(default)s)",
    )
    parser.add_argument(
        "--no-dry-run",
        dest="dry_run",
        action="store_false",
        help="replay on the GPU too (default: the replay's dry run)",
    )
    args = parser.parse_args(argv)
    results: dict[str, dict[int, Run]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for rows in sorted(set(args.rows)):
            path = Path(folder) / f"trace-{rows}.csv"
            write_trace(path, rows)
            for name, command in commands(path, rows, args.deployment, args.dry_run).items():
                run = measure(command)
                results.setdefault(name, {})[rows] = run
                print(
                    f"{name}: {rows:,} rows ({path.stat().st_size / 2**20:,.1f} MiB): "
                    f"{run.seconds:.2f} s, peak RSS {run.peak_bytes / 2**20:,.1f} MiB",
                    file=sys.stderr,
                )
    print(table(results))


if __name__ == "__main__":
    run_main(main)
