"""The replay's report: a table on stdout, ``report.json`` and a PNG where the user says."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._internal.table import format_table
from ..files import replacing, write_whole
from ..units import MIB, plural
from .workload import Workload

if TYPE_CHECKING:  # the setups run on a GPU; the dry run reports without torch
    from .engine import SetupResult


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` (nearest rank), 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def setup_summary(result: SetupResult) -> dict[str, Any]:
    """One setup's figures, as report.json holds them."""
    steps = result.decode_step_s
    p50 = statistics.median(steps) if steps else 0.0
    p99 = percentile(steps, 0.99)
    return {
        "setup": result.name,
        "workspace_bytes": result.workspace_bytes,
        "int_workspace_bytes": result.int_workspace_bytes,
        "pinned_bytes": result.pinned_bytes,
        "kv_tokens": result.kv_tokens,
        "kv_bytes": result.kv_bytes,
        "weights_bytes": result.weights_bytes,
        "decode_steps": len(steps),
        "decode_p50_ms": p50 * 1e3,
        "decode_p99_ms": p99 * 1e3,
        "decode_p99_over_p50": p99 / p50 if p50 else 0.0,
        "tokens_out": result.tokens_out,
        "steps_served": result.steps_served,
        "growths_before_seal": result.growths_before_seal,
        "growths_after_seal": result.growths_after_seal,
        "sealed_overflow": (
            None if result.sealed_overflow is None else dataclasses.asdict(result.sealed_overflow)
        ),
    }


def trace_summary(workload: Workload, steps: int) -> dict[str, Any]:
    """The trace as report.json holds it: its source, and the requests, steps and tokens served
    (the generated tokens are the trace's outputs, what each setup yields when it completes)."""
    return {
        **workload.source,
        "requests": workload.served,
        "steps": steps,
        "prompt_tokens": workload.prompt_tokens,
        "generated_tokens": workload.generated_tokens,
    }


def tokens_identical(results: Sequence[SetupResult]) -> bool:
    """Whether both setups ran to the end and generated the same tokens (a setup a sealed
    overflow stopped generated only part of them)."""
    ours, theirs = results
    complete = all(result.sealed_overflow is None for result in results)
    return complete and ours.tokens == theirs.tokens


def rank_report(
    results: Sequence[SetupResult],
    *,
    deployment: str,
    gpu: str,
    ranks: int,
    model: dict[str, Any],
    trace: dict[str, Any],
    round_ratios: Sequence[float] = (),
) -> dict[str, Any]:
    """One rank's report.json (under ``torchrun``, rank 0 adds ``per_rank``: every rank's): where
    it ran, the ``model`` and ``trace`` as described, each setup's figures, and whether they
    generated the same tokens."""
    return {
        "deployment": deployment,
        "gpu": gpu,
        "ranks": ranks,
        "model": model,
        "trace": trace,
        "setups": [setup_summary(result) for result in results],
        "tokens_identical": tokens_identical(results),
        "decode_p50_ratio_rounds": list(round_ratios),
    }


def trace_line(trace: dict[str, Any]) -> str:
    """The table's line on the trace (report.json's ``trace`` entry): its source, and what was
    served of it."""
    if trace["source"] == "file":
        first = trace["offset"]
        whole = trace.get("requested", trace["rows"]) > trace["rows"]
        source = (
            f"{trace['path']} rows {first:,}..{first + trace['rows'] - 1:,} of "
            f"{trace['rows_in_file']:,}"
            + (f", to its end (requests={trace['requested']:,} asked for more)" if whole else "")
            + f" ({trace['span_s']:,.1f} s at {trace['step_ms']:g} ms a step, seed "
            f"{trace['seed']})"
        )
    else:
        source = f"synthetic (seed {trace['seed']})"
    return (
        f"trace: {source}: {plural(trace['requests'], 'request')} served, "
        f"{trace['refused']:,} refused "
        f"(prompt >= max_model_len {trace['max_model_len']:,}), {trace['clipped']:,} clipped "
        f"(output cut to fit); {trace['steps']:,} steps; {trace['prompt_tokens']:,} prompt "
        f"tokens, {trace['generated_tokens']:,} generated"
    )


def table(report: dict[str, Any]) -> str:
    """The report's setups side by side, and what they prove."""
    head = (
        "setup", "workspace MiB", "int MiB", "pinned MiB", "KV-cache tokens", "decode p50 ms",
        "p99 ms", "p99/p50",
        "tokens out", "growths after seal", "sealed overflows",
    )  # fmt: skip
    rows = [
        (
            s["setup"],
            f"{s['workspace_bytes'] / MIB:,.2f}",
            f"{s['int_workspace_bytes'] / MIB:,.2f}",
            f"{s['pinned_bytes'] / MIB:,.2f}",
            f"{s['kv_tokens']:,}",
            f"{s['decode_p50_ms']:.3f}",
            f"{s['decode_p99_ms']:.3f}",
            f"{s['decode_p99_over_p50']:.2f}",
            f"{s['tokens_out']:,}",
            str(s["growths_after_seal"]),
            "0" if s["sealed_overflow"] is None else "1 (stopped)",
        )
        for s in report["setups"]
    ]
    lines = [format_table([head, None, *rows], right=set(range(1, len(head))))]
    ours, theirs = report["setups"]
    gained = ours["kv_tokens"] - theirs["kv_tokens"]
    ratio = ours["decode_p50_ms"] / theirs["decode_p50_ms"] if theirs["decode_p50_ms"] else 0.0
    lines += [
        f"ranks: {report['ranks']}; {report['deployment']} on {report['gpu']}",
        trace_line(report["trace"]),
        f"KV-cache tokens: {gained:+,} a rank with {ours['setup']} "
        f"({gained / max(1, theirs['kv_tokens']):+.2%}); decode p50 ratio "
        f"{ours['setup']}/{theirs['setup']}: {ratio:.3f}{_rounds(report)}",
        f"int workspaces: {ours['int_workspace_bytes']:,} bytes on the GPU and "
        f"{ours['pinned_bytes']:,} pinned on the host with {ours['setup']}, against "
        f"{theirs['int_workspace_bytes']:,} and {theirs['pinned_bytes']:,} with "
        f"{theirs['setup']} (each wrapper its own): "
        f"{theirs['int_workspace_bytes'] - ours['int_workspace_bytes']:+,} and "
        f"{theirs['pinned_bytes'] - ours['pinned_bytes']:+,} bytes saved",
        f"generated tokens identical between the setups: "
        f"{'yes' if report['tokens_identical'] else 'NO'}",
    ]
    for s in report["setups"]:
        if s["sealed_overflow"]:
            lines.append(
                f"{s['setup']} stopped at a sealed overflow: {s['sealed_overflow']['message']}"
            )
    return "\n".join(lines)


def _rounds(report: dict[str, Any]) -> str:
    """Each round's ratio and their spread, where there were several rounds."""
    rounds = report.get("decode_p50_ratio_rounds", [])
    if len(rounds) < 2:
        return ""
    each = ", ".join(f"{r:.3f}" for r in rounds)
    return f" (rounds, the order turned each: {each}; spread {max(rounds) - min(rounds):.3f})"


NO_FIGURE = "no replay.png: it needs matplotlib (pip install 'mstar-resources[bench]')"
"""What the replay says where it writes its report without the figure."""


def write(report: dict[str, Any], folder: Path, step_times: dict[str, list[float]]) -> list[Path]:
    """``report.json`` in ``folder`` (which exists), and ``replay.png`` where matplotlib is
    installed (the ``bench`` extra); the paths written."""
    json_path = folder / "report.json"
    write_whole(json_path, json.dumps(report, indent=2) + "\n")
    png = folder / "replay.png"
    try:
        _plot(report, step_times, png)
    except ModuleNotFoundError as error:
        if error.name != "matplotlib":
            raise
        return [json_path]
    return [json_path, png]


def _plot(report: dict[str, Any], step_times: dict[str, list[float]], png: Path) -> None:
    """What differs between the setups, each at its own scale: the float workspace memory, the
    KV-cache tokens it leaves over the other setup's, and the decode step times. (Drawn as shares
    of a GPU's memory, the workspaces would be slivers on a 110 GiB bar.)"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = report["setups"]
    names = [s["setup"] for s in setups]
    colors = ["tab:blue", "tab:orange"][: len(setups)]
    fig, (memory, tokens, times) = plt.subplots(1, 3, figsize=(14, 4.2))
    workspace = [s["workspace_bytes"] / MIB for s in setups]
    bars = memory.bar(names, workspace, color=colors)
    memory.bar_label(bars, labels=[f"{mib:,.0f} MiB" for mib in workspace])
    memory.margins(y=0.12)  # room for the labels above the bars
    memory.set_ylabel("MiB on one GPU")
    memory.set_title("Float workspaces")
    fewest = min(s["kv_tokens"] for s in setups)
    gained = [s["kv_tokens"] - fewest for s in setups]
    bars = tokens.bar(names, gained, color=colors)
    tokens.bar_label(bars, labels=[f"+{g:,} (+{g / fewest:.2%})" if g else "0" for g in gained])
    tokens.margins(y=0.12)
    tokens.set_ylabel(f"KV-cache tokens over {fewest:,}")
    tokens.set_title("KV-cache tokens the workspaces leave")
    data = [[t * 1e3 for t in step_times[name]] or [0.0] for name in names]
    times.boxplot(data, whis=(1, 99), showfliers=False)
    times.set_xticks(range(1, len(names) + 1), names)
    times.set_ylabel("decode step (ms), whiskers p1-p99")
    times.set_title("Decode step time")
    fig.suptitle(f"replay: {report['deployment']}, {report['ranks']} rank(s), {report['gpu']}")
    fig.tight_layout()
    try:
        with replacing(png) as drawing:  # a crash never leaves half a PNG
            fig.savefig(drawing, dpi=120, format="png")
    finally:
        plt.close(fig)
