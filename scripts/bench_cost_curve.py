"""The cost curve: what a deployment's workspaces need as its batch limits grow, against engines.

    python scripts/bench_cost_curve.py                 # llama3-8b-h200 on this GPU (needs CUDA)
    python scripts/bench_cost_curve.py llama3-70b-tp8-h200 --tokens 8192 65536 --seqs 256
    python scripts/bench_cost_curve.py --json /tmp/cost_curve.json --png /tmp/cost_curve.png
    python scripts/bench_cost_curve.py --png docs/bench_cost_curve.png    # docs' figure
    python scripts/bench_cost_curve.py qwen3.5-122b-a10b-h200 --engine none   # plain decode

For every point of ``--tokens`` (``max_num_batched_tokens``; default 8,192 to 65,536) by
``--seqs`` (``max_num_seqs``; default 256 and 1,024), composes the deployment (default
``llama3-8b-h200``) with those limits through Hydra's Compose API, keeping its CUDA-graph batch
sizes up to ``max_num_seqs`` (or those of ``--engine``: ``vllm`` and ``sglang`` plan as those
engines do, tensor-core decode included; ``none`` plans as the profile declares, plain decode for
the shipped ones; default: the deployment's own choice), and calibrates it on the GPU as
``mstar-resources-calibrate`` does (``calibrate.measure_all``: every label's bounding shapes
planned through FlashInfer). Each row gives:
- the measured need: the largest of one workspace (and the resource it is in), and the total over
  all the deployment's workspaces (labels x graph slots each, none aliased, as
  ``bench_memory.py`` counts them), in bytes and MiB;
- what vLLM reserves for that deployment at those limits (``max(394 MiB, max_num_batched_tokens x
  query heads x head dim x 16 B)``; ``-`` for MLA models) and SGLang (384 MiB), each as one
  shared buffer, and its ratio to the total need (``mstar_resources/calibration/engines.py`` says
  where each figure comes from).

Every argument, the deployment (one that carries a ``calibration`` profile) and its profile at
each point are checked before any GPU work, with the rules the benchmarks share
(``scripts/_args.py``): bad input ends the run with ``prog: error: ...`` naming the flag and the
value on stderr and exit status 2, as does a machine without CUDA or FlashInfer. A progress bar
over the points goes to stderr. It writes the rows only with ``--json PATH`` and draws a figure
(x: max_num_batched_tokens, log2; y: MiB, log) only with ``--png PATH`` (matplotlib: the
``bench`` extra), each into a folder that exists. It names the machine it measured on.
docs/benchmarks.md quotes its output.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from mstar_resources import resolve
from mstar_resources.apps.dry_run import DryRunSettings
from mstar_resources.apps.hydra_app import register_settings
from mstar_resources.calibration.calibrate import (
    LabelNeed,
    check_backends,
    check_labels,
    measure_all,
    per_resource,
)
from mstar_resources.calibration.profile import PROFILE_KEY, CalibrationProfile, load_profile
from mstar_resources.calibration.record import Machine
from mstar_resources.errors import ResourceConfigError
from mstar_resources.files import write_whole
from mstar_resources.resolver import ResolvedResource
from mstar_resources.units import MIB

from _args import count, one_of, refuse, run_main
from _engines import engine_buffers_mb, engine_plans
from _plot import add_png_option, check_png, pyplot, save

if TYPE_CHECKING:  # imported where the curve is measured: its arguments are checked without it
    import torch

DEPLOYMENT = "llama3-8b-h200"
TOKENS = [8192, 16384, 32768, 65536]
SEQS = [256, 1024]
MOST_TOKENS, MOST_SEQS = 1 << 20, 1 << 16  # far past any engine's limits
ENGINES = ["vLLM", "SGLang"]
CUDA_DEVICE = re.compile(r"cuda(:\d+)?")

Measurement = Callable[[Sequence[ResolvedResource], CalibrationProfile], Sequence[LabelNeed]]
"""What measures one point: one row per (resource, label), as ``calibrate.measure_all`` gives."""


@dataclass(frozen=True)
class Setting:
    """One point of the curve, composed and checked, before anything is measured."""

    max_num_batched_tokens: int
    max_num_seqs: int
    records: list[ResolvedResource]
    profile: CalibrationProfile


@dataclass(frozen=True)
class ResourceNeed:
    """What one resource's workspaces need at a point: each the most any of its labels needs."""

    path: str
    need_bytes: int
    """Of one workspace."""
    workspaces: int
    worst: str
    """Which label and shape needs it."""


@dataclass(frozen=True)
class Point:
    """One row: the measured need at these limits and what each engine reserves for it."""

    max_num_batched_tokens: int
    max_num_seqs: int
    cuda_graph_batch_sizes: list[int]
    needs: list[ResourceNeed]
    engines_mb: dict[str, int | None]
    """Each engine's one shared buffer, in MiB (None: it plans no FlashInfer workspace here)."""

    @property
    def largest(self) -> ResourceNeed:
        return max(self.needs, key=lambda n: n.need_bytes)

    @property
    def workspaces(self) -> int:
        return sum(n.workspaces for n in self.needs)

    @property
    def total_bytes(self) -> int:
        """Over every workspace, none aliased."""
        return sum(n.need_bytes * n.workspaces for n in self.needs)

    def ratio(self, engine: str) -> float | None:
        """``engine``'s buffer over the total need; None where either is nothing."""
        mb = self.engines_mb[engine]
        if mb is None or self.total_bytes == 0:
            return None
        return mb * MIB / self.total_bytes


def cuda_device(text: str) -> str:
    if CUDA_DEVICE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a CUDA device (cuda or cuda:N): the curve is measured on a GPU"
        )
    return text


def compose_deployment(deployment: str, overrides: Sequence[str] = ()) -> DictConfig:
    GlobalHydra.instance().clear()
    register_settings("mstar_resources", DryRunSettings)  # as the dry run does
    with initialize_config_module("mstar_resources.conf", version_base="1.3"):
        return compose("mstar_resources", overrides=[f"deployment={deployment}", *overrides])


ENGINE_CHOICES = ("vllm", "sglang", "none")
"""``--engine``'s values: an engine's plans (``_engines.engine_plans``), or plain decode."""


def shipped_deployments() -> list[str]:
    """The deployments shipped in ``conf/deployment``, listed (nothing composed)."""
    GlobalHydra.instance().clear()
    with initialize_config_module("mstar_resources.conf", version_base="1.3"):
        return GlobalHydra.instance().config_loader().get_group_options("deployment")


def is_profiled(deployment: str) -> bool:
    """Whether the shipped ``deployment`` carries a ``calibration`` profile, composed to tell."""
    return compose_deployment(deployment).get(PROFILE_KEY) is not None


def profiled_deployments() -> list[str]:
    """The deployments shipped in ``conf/deployment`` that carry a ``calibration`` profile (the
    ones a curve can be measured for), each composed to tell."""
    return [name for name in shipped_deployments() if is_profiled(name)]


NO_PROFILE = f"a profiled deployment carries the `{PROFILE_KEY}` profile the curve is measured from"


def profiled_deployment(text: str) -> str:
    """``text``, where it names a profiled deployment; else a refusal that lists the profiled
    ones. The named deployment alone is composed, unless it is refused."""
    if text in shipped_deployments() and is_profiled(text):
        return text
    return one_of(profiled_deployments(), "profiled deployment", fix=NO_PROFILE)(text)


class HelpListingDeployments(argparse.Action):
    """``-h``/``--help``: the help, with the profiled deployments listed under ``deployment``
    (composed only when help is asked for)."""

    def __init__(self, option_strings: Sequence[str], dest: str, deployment: argparse.Action):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show this help message and exit")  # fmt: skip
        self.deployment = deployment

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        self.deployment.help = f"{self.deployment.help}: {', '.join(profiled_deployments())}"
        parser.print_help()
        parser.exit()


def settings(
    deployment: str, tokens: Sequence[int], seqs: Sequence[int], engine: str | None = None
) -> list[Setting]:
    """Every point of ``tokens`` x ``seqs`` for ``deployment`` (one of
    :func:`profiled_deployments`), planned as ``engine`` does (``none``: as declared; None: as
    the deployment says), composed and checked on the CPU; a problem with a point's profile
    raises :class:`ResourceConfigError`."""
    plain = ["calibration.plans.decode.backend=fa2", "calibration.plans.decode.tensor_cores=false"]
    base = compose_deployment(deployment)
    graph_sizes = list(base[PROFILE_KEY].cuda_graph_batch_sizes)
    model = base[PROFILE_KEY].model
    points = []
    for t in tokens:
        for s in seqs:
            # The profile refuses graph sizes above max_num_seqs: an engine captures none there.
            within = ",".join(str(size) for size in graph_sizes if size <= s)
            plans = (
                [f"{PROFILE_KEY}.cuda_graph_batch_sizes=[{within}]", *(plain if engine else [])]
                if engine in (None, "none")
                else engine_plans(engine, model, s, t)
            )
            cfg = compose_deployment(
                deployment,
                [
                    f"{PROFILE_KEY}.limits.max_num_batched_tokens={t}",
                    f"{PROFILE_KEY}.limits.max_num_seqs={s}",
                    *plans,
                ],
            )
            profile = load_profile(cfg[PROFILE_KEY])
            records = resolve(cfg.resources, env={})  # the floors don't enter the need
            check_labels(records, profile)
            points.append(Setting(t, s, records, profile))
    return points


def engines_mb(profile: CalibrationProfile) -> dict[str, int | None]:
    """What vLLM and SGLang reserve, in MiB, for a deployment with ``profile``'s limits."""
    buffers = engine_buffers_mb(profile)
    return {engine: buffers[engine] for engine in ENGINES}


def measure_point(setting: Setting, measurement: Measurement) -> Point:
    """``setting`` measured by ``measurement``, with the engines' figures beside it."""
    rows = measurement(setting.records, setting.profile)
    records = {r.path: r for r in setting.records}
    needs = [
        ResourceNeed(m.path, m.need_bytes, records[m.path].workspaces, m.worst)
        for m in per_resource(rows)
    ]
    return Point(
        setting.max_num_batched_tokens,
        setting.max_num_seqs,
        list(setting.profile.cuda_graph_batch_sizes),
        needs,
        engines_mb(setting.profile),
    )


def on_gpu(device: torch.device, show_progress: bool) -> Measurement:
    """The real measurement: calibration's, through FlashInfer on ``device``."""

    def measurement(
        records: Sequence[ResolvedResource], profile: CalibrationProfile
    ) -> Sequence[LabelNeed]:
        return measure_all(records, profile, device, show_progress=show_progress)

    return measurement


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(deployment: str, points: Sequence[Point]) -> str:
    head = (
        f"{'deployment':<22} {'max_num_batched_tokens':>22} {'max_num_seqs':>12} "
        f"{'largest need B':>14} {'MiB':>7} {'largest in':<14} {'workspaces':>10} "
        f"{'total need B':>13} {'MiB':>7} {'vLLM MiB':>8} {'vLLM/need':>9} "
        f"{'SGLang MiB':>10} {'SGLang/need':>11}"
    )
    lines = [head]
    for p in points:
        largest = p.largest
        lines.append(
            f"{deployment:<22} {p.max_num_batched_tokens:>22,} {p.max_num_seqs:>12,} "
            f"{largest.need_bytes:>14,} {largest.need_bytes / MIB:>7.2f} {largest.path:<14} "
            f"{p.workspaces:>10} {p.total_bytes:>13,} {p.total_bytes / MIB:>7.2f} "
            f"{_mib(p.engines_mb['vLLM']):>8} {_ratio(p.ratio('vLLM')):>9} "
            f"{_mib(p.engines_mb['SGLang']):>10} {_ratio(p.ratio('SGLang')):>11}"
        )
    return "\n".join(lines)


def as_json(
    deployment: str, points: Sequence[Point], measured_on: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The rows as one JSON document; ``measured_on``: the GPU and versions, where known."""
    return {
        "deployment": deployment,
        "measured_on": measured_on,
        "points": [
            {
                **asdict(p),
                "largest_need_bytes": p.largest.need_bytes,
                "total_need_bytes": p.total_bytes,
                "workspaces": p.workspaces,
                "ratio_to_need": {engine: p.ratio(engine) for engine in ENGINES},
            }
            for p in points
        ],
    }


def plot(deployment: str, points: Sequence[Point], png: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    tokens = sorted({p.max_num_batched_tokens for p in points})
    # Lines that coincide (the need often does not grow with max_num_seqs) stay told apart by
    # their markers.
    markers = ["o", "^", "v", "D", "x"]
    for i, seqs in enumerate(sorted({p.max_num_seqs for p in points})):
        line = sorted(
            (p for p in points if p.max_num_seqs == seqs), key=lambda p: p.max_num_batched_tokens
        )
        ax.plot(
            [p.max_num_batched_tokens for p in line],
            [p.total_bytes / MIB for p in line],
            marker=markers[i % len(markers)],
            markersize=8 - i,
            label=f"measured need, {line[0].workspaces} workspaces (max_num_seqs={seqs:,})",
        )
    # An engine's figure depends on the tokens, not on max_num_seqs.
    at = {p.max_num_batched_tokens: p for p in points}
    for engine, style in zip(ENGINES, ["--", ":"], strict=True):
        values = [at[t].engines_mb[engine] for t in tokens]
        if any(v is None for v in values):  # it plans no FlashInfer workspace here
            continue
        ax.plot(tokens, values, linestyle=style, marker="s", label=f"{engine} (one shared buffer)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(tokens, [f"{t:,}" for t in tokens])
    ax.set_yscale("log")
    ax.set_xlabel("max_num_batched_tokens (log2 scale)")
    ax.set_ylabel("float workspace memory (MiB, log scale)")
    ax.set_title(f"Float workspace memory of {deployment} as its limits grow")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, png)


def gpu_problem(device: str) -> str | None:
    """Why the curve cannot be measured on ``device`` here, or None when it can."""
    import torch

    if not torch.cuda.is_available():
        return (
            "torch sees no CUDA device (torch.cuda.is_available() is False); the cost curve "
            "plans through FlashInfer, so it needs a GPU"
        )
    index = torch.device(device).index
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        return f"there are {count} CUDA devices; use cuda:0 to cuda:{count - 1}"
    for module, what in [("flashinfer", "FlashInfer"), ("tqdm", "tqdm")]:
        if importlib.util.find_spec(module) is None:
            return (
                f"{what} is not installed; the curve is measured with it: "
                "pip install 'mstar-resources[calibrate]'"
            )
    return None


def check_json(parser: argparse.ArgumentParser, path: Path | None) -> None:
    """Ends the run with status 2 and one line on stderr, before anything is measured, when the
    rows could not be written to ``path`` (as ``check_png`` does for the figure)."""
    if path is None:
        return
    if not path.parent.is_dir():
        refuse(
            parser,
            "--json",
            path,
            f"the folder {path.parent} does not exist (no folder is created)",
        )
    if path.is_dir():
        refuse(parser, "--json", path, "that is a folder, not a file")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    positional_deployment = parser.add_argument(
        "deployment",
        nargs="?",
        type=profiled_deployment,
        help=f"the deployment to measure (default {DEPLOYMENT}), one with a profile",
    )
    parser.add_argument(
        "-h", "--help", action=HelpListingDeployments, deployment=positional_deployment
    )
    parser.add_argument(
        "--deployment",
        dest="deployment_option",
        type=profiled_deployment,
        metavar="NAME",
        help="the same, as an option",
    )
    parser.add_argument(
        "--tokens",
        type=count(MOST_TOKENS),
        nargs="+",
        default=TOKENS,
        metavar="N",
        help=f"max_num_batched_tokens values (default {' '.join(map(str, TOKENS))})",
    )
    parser.add_argument(
        "--seqs",
        type=count(MOST_SEQS),
        nargs="+",
        default=SEQS,
        metavar="N",
        help=f"max_num_seqs values (default {' '.join(map(str, SEQS))})",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        help="plan decode as this engine does at each point (none: plain decode; default: as the "
        "deployment declares)",
    )
    parser.add_argument(
        "--device", type=cuda_device, default="cuda", help="cuda or cuda:N (default cuda)"
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="also write the rows into this JSON file; its folder must exist",
    )
    add_png_option(parser)
    options = parser.parse_args(argv)
    check_png(parser, options.png)
    check_json(parser, options.json)
    positional, named = options.deployment, options.deployment_option
    if positional and named and positional != named:
        parser.error(f"deployment {positional} and --deployment {named} differ: give one")
    deployment = positional or named or DEPLOYMENT
    tokens, seqs = sorted(set(options.tokens)), sorted(set(options.seqs))

    # Everything the arguments and the config can get wrong, on any machine; then the GPU.
    try:
        points = settings(deployment, tokens, seqs, options.engine)
    except ResourceConfigError as error:
        parser.error(" ".join(line.strip() for line in str(error).splitlines()))
    problem = gpu_problem(options.device)
    if problem:
        refuse(parser, "--device", options.device, problem)
    import torch

    device = torch.device(options.device)
    try:
        for setting in points:
            check_backends(setting.profile, device)
    except ResourceConfigError as error:
        refuse(parser, "--device", options.device, str(error))

    from tqdm import tqdm

    measurement = on_gpu(device, show_progress=True)
    results = []
    print(f"{deployment}: plans {options.engine or 'declared'}")
    with tqdm(points, unit="point", desc=deployment) as bar:
        for setting in bar:
            bar.set_postfix_str(f"{setting.max_num_batched_tokens} x {setting.max_num_seqs}")
            results.append(measure_point(setting, measurement))
    print(table(deployment, results))
    machine = Machine.here(device)
    print(f"measured on {machine}")
    if options.json:
        write_whole(
            options.json, json.dumps(as_json(deployment, results, asdict(machine)), indent=2)
        )
        print(f"json: {options.json}")
    if options.png:
        plot(deployment, results, options.png)
    return 0


if __name__ == "__main__":
    run_main(main)
