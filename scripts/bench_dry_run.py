"""What the CLI's dry run costs, against the floor any Hydra app pays: importing Hydra.

    python scripts/bench_dry_run.py                  # 7 rounds
    python scripts/bench_dry_run.py --rounds 21 --png /tmp/dry_run.png

Times, as fresh processes of this Python, the dry run
``python -m mstar_resources.apps.dry_run`` (its output discarded) and ``python -c "import hydra"``,
interleaved (baseline, dry run, baseline, ..., so a drift in the machine's speed touches both
alike), each in an empty temporary folder as its working directory. The table gives each
command's median wall time and its ratio to the baseline's; a last line says whether the goal, dry
run / import hydra <= 2.0, holds. A measurement, not a check: the exit status is 0 either way (1
only if a command fails).

One untimed dry run before the rounds (which also warms the file cache for them) reports whether
torch or FlashInfer got imported: on the CPU, the dry run should need neither.

It draws a figure only with ``--png`` (matplotlib: the ``bench`` extra), into a folder that exists.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _args import count, run_main
from _plot import add_png_option, check_png, pyplot, save

GOAL_RATIO = 2.0
BASELINE = "import hydra"
DRY_RUN = "mstar_resources.apps.dry_run"
COMMANDS = {
    BASELINE: [sys.executable, "-c", "import hydra"],
    DRY_RUN: [sys.executable, "-m", "mstar_resources.apps.dry_run"],
}
HEAVY = ("torch", "flashinfer")
MARKER = "bench_dry_run imported:"

# The dry run as cli.main() runs it from the console script, then (even when it exits) the
# heavy modules it left in sys.modules, on stderr after a marker.
RUNNER = f"""import json, sys
sys.argv = ["mstar-resources"]
try:
    from mstar_resources.apps.dry_run import main
    main()
finally:
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
    print({MARKER!r}, json.dumps(heavy), file=sys.stderr)
"""


class CommandFailed(Exception):
    """A timed command exited non-zero: there is nothing meaningful to time."""


def shown(command: list[str]) -> str:
    """``command`` as a reader would type it (the import-reporting runner named, not spelt out)."""
    args = ["<the dry run via cli.main()>" if arg == RUNNER else arg for arg in command[1:]]
    return shlex.join(["python", *args])


def run(command: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    """``command`` in ``cwd``, stdout discarded, stderr kept for when it fails."""
    done = subprocess.run(
        command,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0:
        # The end of a traceback says what went wrong; the runner's module list says nothing.
        tail = [line for line in done.stderr.splitlines() if not line.startswith(MARKER)][-15:]
        raise CommandFailed(f"{shown(command)} exited {done.returncode}:\n" + "\n".join(tail))
    return done


def heavy_imports(cwd: str) -> list[str]:
    """The torch and FlashInfer modules one dry run imports."""
    stderr = run([sys.executable, "-c", RUNNER], cwd).stderr
    lines = [line for line in stderr.splitlines() if line.startswith(MARKER)]
    modules: list[str] = json.loads(lines[-1].removeprefix(MARKER))  # RUNNER's sorted names
    return modules


def seconds(command: list[str], cwd: str) -> float:
    """The wall time of one run of ``command``, process start and exit included."""
    start = time.perf_counter()
    run(command, cwd)
    return time.perf_counter() - start


def plot(medians: dict[str, float], png: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 2.4))
    names = list(medians)
    ax.barh(names, [medians[n] * 1e3 for n in names], color=["tab:gray", "tab:blue"])
    goal = medians[BASELINE] * GOAL_RATIO * 1e3
    ax.axvline(goal, color="tab:red", linestyle="--", label=f"goal: {GOAL_RATIO:g}x import hydra")
    ax.set_xlabel("median wall time per process (ms)")
    ax.set_title("CLI dry run vs. importing Hydra")
    ax.legend(loc="lower right", fontsize=8)
    save(fig, png)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=count(1000), default=7, help="interleaved rounds (default 7)"
    )
    add_png_option(parser)
    options = parser.parse_args(argv)
    check_png(parser, options.png)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    try:
        with tempfile.TemporaryDirectory() as cwd:
            heavy = heavy_imports(cwd)
            for _ in range(options.rounds):
                for name, command in COMMANDS.items():
                    times[name].append(seconds(command, cwd))
    except CommandFailed as error:
        print(error, file=sys.stderr)
        return 1
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    ratio = medians[DRY_RUN] / medians[BASELINE]
    print(f"{'command':<48} {'median ms':>10} {'ratio':>7}")
    for name, command in COMMANDS.items():
        print(
            f"{shown(command):<48} {medians[name] * 1e3:>10.1f} "
            f"{medians[name] / medians[BASELINE]:>7.2f}"
        )
    verdict = "holds" if ratio <= GOAL_RATIO else "does not hold"
    print(f"goal: dry run / import hydra <= {GOAL_RATIO:.1f}: {verdict} ({ratio:.2f})")
    for module in HEAVY:
        found = [m for m in heavy if m.split(".")[0] == module]
        print(f"dry run imports {module}: " + (f"yes ({len(found)} modules)" if found else "no"))
    if options.png:
        plot(medians, options.png)
    return 0


if __name__ == "__main__":
    run_main(main)
