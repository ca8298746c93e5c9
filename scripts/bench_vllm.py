"""What the vLLM plugin costs generation, and the KV cache, in real vLLM: side by side, ABBA.

    python scripts/bench_vllm.py                          # 3 and 16 layers, max_num_seqs 256, 512
    python scripts/bench_vllm.py --depths 3 --max-num-seqs 256 --rounds 3
    python scripts/bench_vllm.py --dry-run                # the runs, in order, without vLLM

For each model depth (Llama 3 8B's attention, 32 query / 8 KV heads of 128, random weights; see
``scripts/vllm_proof.py``) and each ``max_num_seqs``, vLLM runs as it is (A) and with
``MSTAR_RESOURCES_VLLM=auto`` (B), in the order A B B A, A B B A..., ``--rounds`` runs each. Every
run is a process of its own with the engine in it (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), serves
the trace's first ``max_num_seqs`` requests that fit (their prompt and output lengths, greedy),
four times, and is timed by the median of the last three generations (the first warms up). The
table gives, per configuration, the median generation time both ways and their ratio (the plugin's
over vLLM's), the median of each round's ratio (its two runs back to back, so the host's drift
cancels), whether every run generated the same tokens, and vLLM's own count of KV-cache tokens
both ways. It writes ``bench_vllm.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_proof import (
    DEPTHS,
    Case,
    digest,
    kv_count,
    launch,
    launch_in_turn,
    time_left,
    write_summary,
)

from _args import DAY, count, output_folder, run_main, seconds

AUTO = "auto"


@dataclass(frozen=True)
class Config:
    layers: int
    max_num_seqs: int

    @property
    def name(self) -> str:
        return f"{self.layers} layers, max_num_seqs {self.max_num_seqs}"

    @property
    def group(self) -> str:
        """The runs' names start with it."""
        return f"L{self.layers}-S{self.max_num_seqs}"

    def case(self, plugin: str | None, run: int) -> Case:
        shape = f"llama3-8b-{self.layers}l"
        side = "plugin" if plugin else "vllm"
        return Case(
            f"{self.group}/{side}-{run}", shape, plugin,
            max_num_seqs=self.max_num_seqs, requests=self.max_num_seqs, generations=4,
        )  # fmt: skip


def order(configs: list[Config], rounds: int) -> list[tuple[Config, Case]]:
    """Every configuration's runs, A B B A A B B A...: ``rounds`` of vLLM as it is (A) and as
    many with the plugin (B)."""
    runs = []
    for config in configs:
        for i in range(rounds):
            pair = [None, AUTO] if i % 2 == 0 else [AUTO, None]
            runs += [(config, config.case(plugin, i)) for plugin in pair]
    return runs


def finished_runs(config: Config, results: dict[str, dict[str, Any]]) -> dict[str, list[Any]]:
    """The results of ``config``'s runs that finished, of each side (``vllm``, ``plugin``)."""
    return {side: [r for name, r in results.items()
                   if name.startswith(f"{config.group}/{side}-") and r.get("ok")]
            for side in ("vllm", "plugin")}  # fmt: skip


def host_lines(configs: list[Config], results: dict[str, dict[str, Any]]) -> list[str]:
    """For each configuration: the process's CPU time in its timed generations (medians, each
    side, and their ratio), and the share of the machine's CPU time its hypervisor gave to other
    machines meanwhile (``steal``): how loud the host was, where the wall times disagree."""
    lines = []
    cpus = os.cpu_count() or 1
    timed = slice(1, None)  # the first generation warms up
    for config in configs:
        cpu: dict[str, list[float]] = {"vllm": [], "plugin": []}
        steal: dict[str, list[float]] = {"vllm": [], "plugin": []}
        for side, runs in finished_runs(config, results).items():
            for r in runs:
                if r.get("generate_cpu_s"):
                    cpu[side].append(statistics.median(r["generate_cpu_s"][timed]))
                if r.get("host_steal_s"):
                    wall = sum(r["generate_each_s"][timed]) * cpus
                    steal[side].append(sum(r["host_steal_s"][timed]) / wall)
        if not (cpu["vllm"] and cpu["plugin"]):
            continue
        median = statistics.median
        lines.append(
            f"{config.name}: CPU time of a generation {median(cpu['vllm']):.3f} s (vLLM) and "
            f"{median(cpu['plugin']):.3f} s (plugin), ratio "
            f"{median(cpu['plugin']) / median(cpu['vllm']):.3f}; the host's steal "
            + "/".join(f"{median(steal[s]):.1%}" if steal[s] else "-" for s in steal)
            + " of the CPUs' time (vLLM/plugin, medians)"
        )
    return lines


def table(configs: list[Config], results: dict[str, dict[str, Any]]) -> str:
    """One row a configuration: medians of the runs that finished, their ratio, the tokens."""
    head = ("configuration", "runs", "vLLM s", "plugin s", "ratio", "ratio of pairs",
            "same tokens", "KV tokens vLLM", "KV tokens plugin", "decode plan us vLLM/plugin",
            "added us vLLM/plugin", "plugin's path of generation")  # fmt: skip
    rows: list[tuple[str, ...]] = [head]
    for config in configs:
        sides = finished_runs(config, results)
        times = {side: [r["generate_s"] for r in runs] for side, runs in sides.items()}
        medians = {side: statistics.median(t) if t else None for side, t in times.items()}
        ratio = (
            f"{medians['plugin'] / medians['vllm']:.3f}"
            if medians["vllm"] and medians["plugin"] else "-"
        )  # fmt: skip
        digests = {r.get("digest") or digest(r["tokens"]) for runs in sides.values()
                   for r in runs if r.get("tokens") or r.get("digest")}  # fmt: skip
        kv = {side: {n for r in runs if (n := kv_count(r)) is not None}
              for side, runs in sides.items()}  # fmt: skip
        pairs = pair_ratios(config, results)
        rows.append((
            config.name, f"{len(sides['vllm'])}+{len(sides['plugin'])}",
            *(f"{medians[s]:.3f}" if medians[s] else "-" for s in ("vllm", "plugin")), ratio,
            f"{statistics.median(pairs):.3f}" if pairs else "-",
            "-" if not digests else "yes" if len(digests) == 1 else "NO",
            *(", ".join(f"{n:,}" for n in sorted(kv[s])) or "-" for s in ("vllm", "plugin")),
            *_plan_clock(sides),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                     for row in rows)  # fmt: skip


def pair_ratios(config: Config, results: dict[str, dict[str, Any]]) -> list[float]:
    """The plugin's generation time over vLLM's in each round whose two runs both finished: the
    two ran one right after the other, so a drift of the host's speed over the runs (seen on the
    H200's host: FlashInfer's own plan 185 to 357 us within one process) cancels in each."""
    finished = {name: r["generate_s"] for name, r in results.items() if r.get("ok")}
    rounds = (tuple(f"{config.group}/{side}-{i}" for side in ("vllm", "plugin"))
              for i in range(len(results)))  # fmt: skip
    return [finished[b] / finished[a] for a, b in rounds if a in finished and b in finished]


def _plan_clock(sides: dict[str, list[dict[str, Any]]]) -> tuple[str, str, str]:
    """Medians of the decode plan's clock (``vllm_proof._PlanClock``): FlashInfer's plan without
    and with the plugin (how fast the host ran each side), what the call around it added without
    the plugin (the clock's own cost) and with it, and the plugin's path as a share of
    generation: in each plugin run, what the calls added less the clock's own cost a plan (vLLM's
    side, mean), over the same generation, so the host's speed in that run moves both."""

    def median(side: str, key: str) -> float | None:
        found = [c[key] for r in sides[side] if key in (c := r.get("decode_plan_clock") or {})]
        return statistics.median(found) if found else None

    def both(key: str) -> str:
        found = [median(side, key) for side in ("vllm", "plugin")]
        return "/".join("-" if a is None else f"{a:.1f}" for a in found)

    clock_us = median("vllm", "added_per_plan_us") or 0.0
    clocks = [
        c
        for r in sides["plugin"]
        if (c := r.get("decode_plan_clock") or {}).get("added_per_plan_us")
    ]
    shares = [c["added_of_generate"] * (1 - clock_us / c["added_per_plan_us"]) for c in clocks]
    return (
        both("flashinfer_plan_us"),
        both("added_median_us"),
        f"{statistics.median(shares):.2%}" if shares else "-",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    depths = sorted(int(name.split("-")[-1].removesuffix("l")) for name in DEPTHS)
    parser.add_argument("--depths", type=int, nargs="+", default=depths, choices=depths,
                        help="model depths, in layers")  # fmt: skip
    parser.add_argument(
        "--max-num-seqs",
        type=count(1 << 16),
        nargs="+",
        default=[256, 512],
        help="vLLM's max_num_seqs (each run serves as many requests)",
    )
    parser.add_argument(
        "--rounds",
        type=count(100),
        default=5,
        help="runs each way, per configuration (at least 5 for the median)",
    )
    parser.add_argument(
        "--budget",
        type=seconds(math.inf),
        default=float("inf"),
        help="seconds for all runs: a run that would start later is left out",
    )
    parser.add_argument("--in-turn", action="store_true",
                        help="each configuration's runs one after another in one process (the "
                        "plugin loaded, its setting read again as each engine starts), free of "
                        "the differences between processes")  # fmt: skip
    parser.add_argument("--timeout", type=seconds(DAY), default=400.0,
                        help="seconds a run may take, at most a day")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench-vllm"), help="folder of results")
    parser.add_argument("--models", type=Path, default=Path("/tmp/mstar-vllm-models"))
    parser.add_argument("--dry-run", action="store_true", help="print the runs, start none")
    args = parser.parse_args(argv)
    output_folder(parser, "--out", args.out)
    configs = [Config(d, n) for d in args.depths for n in args.max_num_seqs]
    runs = order(configs, args.rounds)
    if args.dry_run:
        for _, case in runs:
            print(f"{case.name}: {case.shape}, MSTAR_RESOURCES_VLLM={case.plugin or '(unset)'}, "
                  f"max_num_seqs {case.max_num_seqs}, {case.requests} requests")  # fmt: skip
        print(table(configs, {}))
        return 0
    if importlib.util.find_spec("vllm") is None:
        parser.error("vLLM is not installed here; run where it is, or --dry-run for the runs")
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.budget
    results: dict[str, dict[str, Any]] = {}
    summary = args.out / "bench_vllm.json"
    for config in configs:
        mine = [case for c, case in runs if c == config]
        if args.in_turn:
            left = time_left(config.name, deadline)
            if left is None:
                continue
            results.update(launch_in_turn(mine, args.out, args.models, left))
            write_summary(results, summary)
            continue
        for case in mine:
            left = time_left(case.name, deadline)
            if left is None:
                continue
            result = launch(case, args.out, args.models, min(args.timeout, left))
            results[case.name] = result
            write_summary(results, summary)
    print(table(configs, results))
    print("\n".join(host_lines(configs, results)))
    return 0 if all(r.get("ok") for r in results.values()) and results else 1


if __name__ == "__main__":
    run_main(main)
