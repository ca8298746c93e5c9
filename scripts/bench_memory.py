"""Workspace memory per shipped deployment: calibrated floors against engines' fixed sizes.

    python scripts/bench_memory.py                  # every deployment with a calibrated override
    python scripts/bench_memory.py llama3-8b-h200_calibrated
    python scripts/bench_memory.py --png docs/bench_memory.png      # docs/benchmarks.md's figure

For each deployment ``<name>`` shipped with a ``<name>_calibrated`` override (written on a GPU by
``mstar-resources-calibrate``), composes that override and reports, over all its attention
workspaces (one per label and CUDA-graph slot, none aliased; vLLM's WorkspaceManager, which an
engine holds beside its attention buffer either way, left out):
- need: what calibration measured (the floor no one can beat without aliasing);
- reserved: what its pools hold with the calibrated floors, and its ratio to the need;
- what each engine really reserves for that deployment: one buffer, shared by all its wrappers,
  of the size its current release gives it (``scripts/_engines.py``
  says where each figure comes from);
- int workspaces: what calibration measured the plans to need of them (``int need KiB``, over
  all workspaces), what the pools hold on the GPU with the calibrated ``int_declared_mb`` (and as
  many pinned on the host), and what the wrappers of an engine that builds them as vLLM and
  SGLang do make for themselves (8 MiB each, and as many pinned: a decode wrapper per graph
  batch size of the profile, an eager decode and a prefill wrapper).

It draws a figure only with ``--png`` (matplotlib: the ``bench`` extra), into a folder that exists.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from mstar_resources import resolve
from mstar_resources.apps.dry_run import DryRunSettings
from mstar_resources.apps.hydra_app import register_settings
from mstar_resources.calibration.calibrate import CALIBRATED_SUFFIX
from mstar_resources.calibration.profile import load_profile
from mstar_resources.calibration.record import planned
from mstar_resources.compose import shipped_deployments
from mstar_resources.units import MIB

from _args import one_of, run_main
from _engines import engine_buffers_mb, own_int_mb
from _plot import add_png_option, check_png, pyplot, save

ENGINES = ["vLLM", "SGLang", "TensorRT-LLM", "MLC-LLM"]


def calibrated_deployments() -> list[str]:
    folder = shipped_deployments()
    return sorted(p.stem for p in folder.glob(f"*{CALIBRATED_SUFFIX}.yaml"))


@dataclass(frozen=True)
class Row:
    """One deployment's figures, memory in MiB."""

    workspaces: int
    need: float
    reserved: float
    engines: dict[str, int | None]  # by engine; None: it plans no FlashInfer workspace for it
    int_need_kib: float | None  # None: not measured (FlashInfer 0.7's MLA)
    int_reserved: float
    engines_int: int

    def series(self) -> dict[str, float | None]:
        """The figure's bars: the need, the reserved memory and each engine's buffer."""
        return {"need": self.need, "reserved": self.reserved, **self.engines}


def measure(deployment: str) -> Row:
    GlobalHydra.instance().clear()
    register_settings("mstar_resources", DryRunSettings)  # as the dry run does
    with initialize_config_module("mstar_resources.conf", version_base="1.3"):
        cfg = compose("mstar_resources", overrides=[f"deployment={deployment}"])
    records = {r.path: r for r in planned(resolve(cfg.resources, env={}))}
    workspaces = sum(r.workspaces for r in records.values())
    need: int = sum(n.need_bytes * records[n.path].workspaces for n in cfg.calibrated.needs)
    int_needs = [n.get("int_need_bytes") for n in cfg.calibrated.needs]
    int_need = (
        None
        if None in int_needs
        else sum(int(n.int_need_bytes) * records[n.path].workspaces for n in cfg.calibrated.needs)
    )
    profile = load_profile(cfg.calibration)
    return Row(
        workspaces=workspaces,
        need=need / MIB,
        reserved=sum(r.reserved_bytes for r in records.values()) / MIB,
        engines=engine_buffers_mb(profile),
        int_need_kib=None if int_need is None else int_need / 1024,
        int_reserved=sum(r.int_reserved_bytes for r in records.values()) / MIB,
        engines_int=own_int_mb(profile),
    )


def _mb(value: float | None) -> str:
    """An engine's figure; ``-`` where it plans no FlashInfer workspace for the deployment."""
    return "-" if value is None else f"{value:,.0f}"


def _per_need(row: Row) -> str:
    """Reserved over need; ``-`` where calibration measured no need (nothing to divide by)."""
    return "-" if row.need == 0 else f"{row.reserved / row.need:.2f}"


def plot(results: dict[str, Row], png: Path) -> None:
    plt = pyplot()
    series = ["need", "reserved", *ENGINES]
    labels = ["measured need", "calibrated floors", *(f"{e} (one shared buffer)" for e in ENGINES)]
    names = list(results)
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, (key, label) in enumerate(zip(series, labels, strict=True)):
        xs = [n + (i - (len(series) - 1) / 2) * width for n in range(len(names))]
        values = [results[d].series()[key] for d in names]
        ax.bar(xs, [v or 0 for v in values], width, label=label)
        for x, v in zip(xs, values, strict=True):
            if v is None:  # this engine plans no FlashInfer workspace for the deployment
                ax.text(x, 25, "n/a", ha="center", va="bottom", rotation=90, fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), [d.removesuffix(CALIBRATED_SUFFIX) for d in names])
    ax.set_ylabel("float workspace memory (MiB, log scale)")
    ax.set_title("Float workspace memory for the same deployment")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save(fig, png)


def main(argv: list[str] | None = None) -> int:
    calibrated = calibrated_deployments()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "deployments",
        nargs="*",
        type=one_of(
            calibrated,
            "calibrated deployment",
            fix=f"on a GPU, mstar-resources-calibrate deployment=<name> writes "
            f"<name>{CALIBRATED_SUFFIX}",
        ),
        help="default: every calibrated deployment",
    )
    add_png_option(parser)
    options = parser.parse_args(argv)
    check_png(parser, options.png)
    deployments = options.deployments or calibrated
    if not deployments:
        print("no calibrated deployments: run mstar-resources-calibrate on a GPU", file=sys.stderr)
        return 1
    results = {d: measure(d) for d in deployments}
    name = max(32, *(len(d) for d in results))  # the longest name sets the first column
    head = (
        f"{'deployment':<{name}} {'workspaces':>10} {'need MiB':>9} {'reserved MiB':>12} "
        f"{'/need':>6}"
    )
    int_head = f" {'int need KiB':>12} {'int reserved MiB':>16} {'engines int MiB':>15}"
    print(head + "".join(f" {e + ' MiB':>16}" for e in ENGINES) + int_head)
    for d, r in results.items():
        line = (
            f"{d:<{name}} {r.workspaces:>10} {r.need:>9.2f} {r.reserved:>12.0f} {_per_need(r):>6}"
        )
        int_need = "-" if r.int_need_kib is None else f"{r.int_need_kib:,.1f}"
        ints = f" {int_need:>12} {r.int_reserved:>16.0f} {r.engines_int:>15,}"
        print(line + "".join(f" {_mb(r.engines[e]):>16}" for e in ENGINES) + ints)
    if options.png:
        plot(results, options.png)
    return 0


if __name__ == "__main__":
    run_main(main)
