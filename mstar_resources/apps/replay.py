"""The replay app: the library in an engine's loop, end to end, against the engines' way.

    python scripts/replay.py deployment=llama3-8b-h200_calibrated
    torchrun --nproc-per-node 2 scripts/replay.py deployment=llama3-8b-h200_calibrated

Composes the deployment and checks the settings before any GPU work, then, once the GPU and
FlashInfer are known to be there, reads the trace (a seeded synthetic one, or a slice of a
production trace file: ``workload.py``, ``trace.py``; ``dry_run=true`` reads and schedules it on
any machine and prints what it asks of the engine instead), makes its
schedule (``scheduler.py``), builds the model (``model.py``), then runs the schedule twice
(``engine.py``): on the deployment's pools, built, reserved, warmed up and sealed with the group,
and on one fixed buffer shared by every wrapper. Both setups serve the same schedule, so their
generated tokens must be identical, and after sealing nothing may grow or overflow; the report
says each and the run fails (status 1) if one does not hold. Bad settings, a bad trace file, or no
GPU, end in one paragraph and status 2. Under ``torchrun`` the heads are split between the ranks
(tensor parallel), NCCL sums the output and MLP projections, the pools are sealed with the group,
and rank 0 reports.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import DictConfig

from .._internal import limits
from .._internal.devices import cuda_device
from ..calibration.engine_buffers import SGLANG_MB, own_int_mb, vllm_buffer_mb
from ..calibration.profile import PROFILE_KEY, CalibrationProfile, load_profile
from ..calibration.record import check_calibration
from ..calibration.versions import check_flashinfer
from ..errors import ResourceConfigError, WorkspaceSealedError
from ..files import folder_problem
from ..replay.roles import Roles, is_mla, roles_of
from ..replay.workload import Workload, load_workload
from ..resolver import ResolvedResource, resolve
from ..units import MIB
from .hydra_app import hydra_app, package_version
from .replay_settings import MAX_REQUESTS, MAX_SYNTHETIC_REQUESTS, ReplaySettings

if TYPE_CHECKING:  # the model imports torch: only the run itself needs it
    from ..replay.engine import Setup, SetupResult
    from ..replay.model import Model, ModelSizes
    from ..replay.scheduler import Arrivals, Step
    from ..replay.trace import Request

__all__ = ["check", "dry_run", "load", "main"]

PROG = "replay"

T = TypeVar("T")


def check(cfg: DictConfig, ranks: int) -> tuple[CalibrationProfile, list[ResolvedResource], Roles]:
    """Everything the settings can get wrong, on any machine, before a GPU is touched. The trace
    file is read afterwards (:func:`load`): on the GPU, once it is known to be there, or on any
    machine with ``dry_run=true``."""
    problems = limits.problems(cfg, ReplaySettings)
    if cfg.trace is None and cfg.trace_offset > 0:
        problems.append(
            f"trace_offset={cfg.trace_offset} skips rows of a trace file, and trace=null replays "
            "the synthetic trace; set trace=PATH, or trace_offset=0"
        )
    if cfg.trace is None and MAX_SYNTHETIC_REQUESTS < cfg.requests <= MAX_REQUESTS:
        problems.append(
            f"requests={cfg.requests:,} synthetic requests is more than {MAX_SYNTHETIC_REQUESTS:,}"
            " (five times the largest public trace); a trace file's requests are bounded by its "
            "rows only: set trace=PATH to replay one"
        )
    if cfg.trace is not None and not str(cfg.trace).strip():
        problems.append(
            "trace='' names no file; set trace=PATH to a trace file, or trace=null for the "
            "synthetic trace"
        )
    if cfg.report_dir is not None and cfg.dry_run:
        problems.append(
            f"report_dir={cfg.report_dir!r} is where a replay writes its report, and "
            "dry_run=true replays nothing, so it would stay empty; leave report_dir out of a dry "
            "run (its table goes to stdout: > FILE keeps it)"
        )
    elif cfg.report_dir is not None and (problem := folder_problem(Path(cfg.report_dir))):
        problems.append(
            f"report_dir={cfg.report_dir!r} can't be made a folder ({problem}); point it at a "
            "folder that exists or can be made"
        )
    if problems:
        raise ResourceConfigError(*problems, where="the replay's settings")
    if cfg.get(PROFILE_KEY) is None:
        raise ResourceConfigError(
            "this deployment carries no `calibration` profile (the model's attention shape and "
            "the engine's limits); pick one that has, e.g. deployment=llama3-8b-h200_calibrated"
        )
    profile = load_profile(cfg[PROFILE_KEY])
    if profile.limits.max_model_len < 2:
        raise ResourceConfigError(
            f"calibration.limits.max_model_len={profile.limits.max_model_len} is too short to "
            "replay: a request needs a prompt token and an output token; set it to 2 or more"
        )
    records = resolve(cfg.resources)
    roles = roles_of(records, profile)
    model = profile.model
    if is_mla(profile):  # one compressed KV for all heads: only the heads are split
        if model.num_qo_heads % ranks:
            raise ResourceConfigError(
                f"{ranks} ranks can't split calibration.model.num_qo_heads="
                f"{model.num_qo_heads} evenly; run on a number of ranks that divides it"
            )
    elif model.num_qo_heads % ranks or model.num_kv_heads % ranks:
        raise ResourceConfigError(
            f"{ranks} ranks can't split calibration.model.num_qo_heads={model.num_qo_heads} and "
            f"num_kv_heads={model.num_kv_heads} evenly; run on a number of ranks that divides both"
        )
    return profile, records, roles


def load(cfg: DictConfig, profile: CalibrationProfile, rank: int = 0) -> Workload:
    """The requests the settings name: the synthetic trace, or a slice of a trace file (a bad
    file refused naming the file, the line and the replay's settings; a large one read under a
    progress bar on rank 0)."""
    return load_workload(
        cfg.trace,
        requests=cfg.requests,
        trace_offset=cfg.trace_offset,
        step_ms=cfg.step_ms,
        seed=cfg.seed,
        vocab_size=cfg.vocab_size,
        max_model_len=profile.limits.max_model_len,
        progress=cfg.progress and rank == 0,
    )


PROGRESS_DELAY_S = 2.0
"""A dry run shows its progress bar once it has run this long (``progress=true``)."""


def dry_run(workload: Workload, profile: CalibrationProfile, progress: bool = False) -> str:
    """What serving ``workload`` asks of an engine with ``profile``'s limits, scheduled on this
    machine with a KV cache no request waits for. The requests stream through the scheduler, so
    memory holds the requests in flight, whatever the trace's length; with ``progress``, a run
    that lasts more than :data:`PROGRESS_DELAY_S` shows the steps scheduled on stderr."""
    from tqdm import tqdm

    from ..replay import report as reporting
    from ..replay.scheduler import schedule

    page = profile.model.page_size
    steps = busiest = tokens = pages = 0
    bar = tqdm(unit=" steps", desc="dry run", disable=not progress, delay=PROGRESS_DELAY_S,
               leave=False, unit_scale=True)  # fmt: skip
    for step in schedule(
        workload.requests(),
        max_num_seqs=profile.limits.max_num_seqs,
        max_num_batched_tokens=profile.limits.max_num_batched_tokens,
        cuda_graph_batch_sizes=profile.cuda_graph_batch_sizes,
        num_pages=sys.maxsize,
        page_size=page,
    ):
        steps += 1
        bar.update()
        busiest = max(busiest, len(step.prefill) + len(step.decode))
        tokens = max(tokens, step.num_tokens)
        for chunk in (*step.prefill, *step.decode):  # a request's pages ascend
            pages = max(pages, chunk.page_table[chunk.num_pages - 1] + 1)
    bar.close()
    return "\n".join(
        [
            reporting.trace_line(reporting.trace_summary(workload, steps)),
            f"most requests in a step: {busiest:,} (max_num_seqs {profile.limits.max_num_seqs:,});"
            f" most tokens in a step: {tokens:,} (max_num_batched_tokens "
            f"{profile.limits.max_num_batched_tokens:,}); KV pages of {page} tokens the "
            f"schedule reached: {pages:,} ({pages * page:,} tokens)",
            "dry run: nothing ran on a GPU",
        ]
    )


def kv_pages_for(free: int, workspace_bytes: int, shape: ModelSizes, utilization: float) -> int:
    """Pages of KV cache a setup gets: ``utilization`` of the ``free`` memory its workspaces
    leave."""
    page_bytes = shape.kv_bytes_per_token * shape.page_size
    return int((free - workspace_bytes) * utilization) // page_bytes


def fixed_buffer_mb(setting: int | None, profile: CalibrationProfile, ranks: int) -> int:
    """The engines' one fixed buffer, in MB: ``fixed_buffer_mb=`` where set, else vLLM's for the
    deployment on ``ranks``; for MLA on SM90 vLLM plans no FlashInfer, and SGLang's (the engine
    that does) stands for the engines."""
    return setting or vllm_buffer_mb(profile, ranks) or SGLANG_MB


def kv_pages(
    free: int, workspace_bytes: Mapping[str, int], shape: ModelSizes, utilization: float
) -> dict[str, int]:
    """Each setup's KV-cache pages (the dummy page included), by the setup's name in
    ``workspace_bytes``: the ``free`` memory measured once, less that setup's workspaces.
    Measuring again after the first setup would charge the second with what the process made
    once (kernels loaded, cuBLAS workspaces)."""
    return {
        name: kv_pages_for(free, workspaces, shape, utilization)
        for name, workspaces in workspace_bytes.items()
    }


def schedule_pages(every_rank: Sequence[Mapping[str, int]]) -> int:
    """The KV pages one schedule may use, given every rank's :func:`kv_pages`: the smallest cache
    of any setup on any rank, less its dummy page (page 0). Both setups serve that one schedule,
    so their tokens must match."""
    return min(min(pages.values()) for pages in every_rank) - 1


def run_setup(
    setup: Setup,
    steps: Iterable[Step],
    requests: Mapping[int, Request],
    *,
    warm_up: bool,
    progress: Any,
) -> SetupResult:
    """One setup in an engine's order: warm up (where ``warm_up``), seal and capture, serve
    ``steps``. A plan that does not fit a sealed workspace stops it, kept in its result; the
    ``progress`` bar is closed either way."""
    from ..replay.engine import SealedOverflow

    try:
        if warm_up:
            setup.warm_up()
        setup.seal_and_capture()
        return setup.serve(steps, requests, progress)
    except WorkspaceSealedError as error:  # a graph's plan at capture did not fit
        setup.result.sealed_overflow = SealedOverflow.of(error)
        return setup.result
    finally:
        progress.close()


def failures(results: Sequence[SetupResult]) -> list[str]:
    """What failed, a line each: a setup stopped by a sealed overflow, one that grew after
    sealing, and two setups that both ran to the end and generated different tokens."""
    found = []
    for result in results:
        if result.sealed_overflow is not None:
            overflow = result.sealed_overflow.message
            found.append(f"{result.name} overflowed a sealed workspace: {overflow}")
        elif result.growths_after_seal:
            found.append(f"{result.name}: {result.growths_after_seal} growths after sealing")
    from ..replay.report import tokens_identical

    stopped = any(result.sealed_overflow is not None for result in results)
    if not stopped and not tokens_identical(results):  # a stopped setup's are only cut short
        found.append("the two setups generated different tokens")
    return found


def print_report(
    report: dict[str, Any], step_times: dict[str, list[float]], report_dir: str | None
) -> None:
    """Rank 0's output: the report's table on stdout; where ``report_dir`` is set (made by
    :func:`check`), report.json and the PNG written into it, a ``wrote`` line each."""
    from ..replay import report as reporting

    print(reporting.table(report))
    if report_dir is not None:
        Path(report_dir).mkdir(parents=True, exist_ok=True)  # checked by :func:`check`
        written = reporting.write(report, Path(report_dir), step_times)
        for path in written:
            print(f"wrote {path}")
        if len(written) == 1:
            print(f"{PROG}: {reporting.NO_FIGURE}", file=sys.stderr)


@hydra_app(
    PROG,
    config_name="replay",
    compose_once=True,
    command="python scripts/replay.py",
    version=package_version,
    settings=ReplaySettings,
)
def main(cfg: DictConfig) -> None:
    """Replay the trace on both setups and report; see the module's docstring."""
    ranks, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    profile, records, roles = check(cfg, ranks)
    if cfg.dry_run:
        print(dry_run(load(cfg, profile), profile, progress=cfg.progress))
        return
    device_setting = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if ranks > 1 else cfg.device
    device = cuda_device(device_setting, "the replay runs on a GPU")
    check_flashinfer(profile)  # what this FlashInfer can plan, before any GPU work
    workload = load(cfg, profile, rank)  # a trace of any size is read only where it can be served
    import torch
    import torch.distributed as dist

    if device.index is None:  # plain "cuda": the current device
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    check_calibration(cfg, device, resolved=records)  # calibrated elsewhere: one warning
    if ranks > 1:
        dist.init_process_group("nccl", device_id=device)
    try:
        failed = _replay(cfg, profile, records, roles, workload, _Gpu(device, rank, ranks))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if failed:
        if rank == 0:
            print(f"{PROG}: failed: {'; '.join(failed)}", file=sys.stderr)
        raise SystemExit(1)


@dataclass(frozen=True)
class _Gpu:
    """This rank's GPU among the replay's ranks: every CUDA memory call and collective the
    replay makes between the setups, kept here so that the steps around them run on a CPU."""

    device: Any
    """The ``torch.device`` this rank runs on."""
    rank: int
    ranks: int

    @property
    def group(self) -> Any:
        """The ranks' process group the pools seal with; None on one rank."""
        import torch.distributed as dist

        return dist.group.WORLD if self.ranks > 1 else None

    def name(self) -> str:
        import torch

        return str(torch.cuda.get_device_name(self.device))

    def free_bytes(self) -> int:
        """The free memory now, with the cached blocks given back first."""
        import torch
        import torch.distributed as dist

        if self.ranks > 1:
            dist.barrier()  # NCCL makes its buffers at the first collective: before measuring
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free)

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order."""
        if self.ranks == 1:
            return [value]
        import torch.distributed as dist

        every: list[Any] = [None] * self.ranks
        dist.all_gather_object(every, value, group=self.group)
        return every

    def release(self) -> None:
        """Give the memory of what is no longer referenced back to the GPU."""
        import torch

        gc.collect()
        torch.cuda.empty_cache()


def _replay(
    cfg: DictConfig,
    profile: CalibrationProfile,
    records: list[ResolvedResource],
    roles: Roles,
    workload: Workload,
    gpu: _Gpu,
) -> list[str]:
    """Both setups over one schedule; rank 0 prints (and writes) the report. What failed."""
    from ..replay import report as reporting
    from ..replay.model import Model, ModelSizes, describe

    shape = ModelSizes.of(profile, cfg.layers, cfg.vocab_size, gpu.ranks)
    model = Model(shape, gpu.device, cfg.seed, gpu.rank, gpu.ranks)
    fixed_bytes = fixed_buffer_mb(cfg.fixed_buffer_mb, profile, gpu.ranks) * MIB
    # Each setup's GPU scratch: its float buffers, and its int workspaces (the pools' one a key;
    # the fixed setup's one of FlashInfer's own a wrapper).
    workspace_bytes = {
        "library": sum(record.reserved_bytes + record.int_reserved_bytes for record in records),
        "fixed": fixed_bytes + own_int_mb(profile, cfg.cuda_graphs) * MIB,
    }
    # Free memory is measured once, now, before either setup's workspaces are made: each setup's
    # own are then taken from it (the library's as its records reserve them).
    pages = kv_pages(gpu.free_bytes(), workspace_bytes, shape, cfg.memory_utilization)
    streamed = _StreamedSchedule(workload, profile, schedule_pages(gpu.gather(pages)), shape)
    runs = _serve_setups(cfg, model, profile, records, roles, fixed_bytes, pages, streamed, gpu)
    results = [merge_runs(runs["library"]), merge_runs(runs["fixed"])]
    report = reporting.rank_report(
        results,
        deployment=_deployment(),
        gpu=gpu.name(),
        ranks=gpu.ranks,
        model=describe(shape),
        trace=reporting.trace_summary(workload, streamed.steps),
        round_ratios=round_ratios(runs["library"], runs["fixed"]),
    )
    if gpu.ranks > 1:  # rank 0 reports every rank's figures
        report["per_rank"] = gpu.gather(report)
    if gpu.rank == 0:
        print_report(report, {r.name: r.decode_step_s for r in results}, cfg.report_dir)
    return failures(results) + round_failures(runs)


def _serve_setups(
    cfg: DictConfig,
    model: Model,
    profile: CalibrationProfile,
    records: list[ResolvedResource],
    roles: Roles,
    fixed_bytes: int,
    pages: dict[str, int],
    streamed: _StreamedSchedule,
    gpu: _Gpu,
) -> dict[str, list[SetupResult]]:
    """Each setup's runs, by kind (``library``: the deployment's pools; ``fixed``: the engines'
    buffer), one a round in :func:`round_order`, each with a KV cache of its ``pages`` serving
    the one schedule, streamed afresh for each run; a run's memory given back before the next is
    made."""
    from ..replay.buffers import Buffers, FixedBuffer, LibraryBuffers
    from ..replay.engine import Setup

    makers: dict[str, Callable[[], Buffers]] = {
        "library": lambda: LibraryBuffers(records, gpu.device, roles),
        "fixed": lambda: FixedBuffer(fixed_bytes, gpu.device),
    }
    runs: dict[str, list[SetupResult]] = {kind: [] for kind in makers}
    for kind in round_order(cfg.timing_rounds):
        buffers = makers[kind]()
        setup = Setup(model, profile, buffers, pages[kind], gpu.group, cfg.cuda_graphs, roles)
        progress = _progress(cfg.progress and gpu.rank == 0, streamed.steps or None, buffers.name)
        steps, requests = streamed()
        runs[kind].append(run_setup(setup, steps, requests, warm_up=cfg.warmup, progress=progress))
        del setup, buffers
        gpu.release()
    return runs


def round_order(rounds: int) -> list[str]:
    """The setups' runs in order: library then fixed, the order turned each round (ABBA for two
    rounds), so that what runs first (a cold cache, clocks) favours neither."""
    pair = ["library", "fixed"]
    return [kind for r in range(rounds) for kind in (pair if r % 2 == 0 else pair[::-1])]


def merge_runs(runs: Sequence[SetupResult]) -> SetupResult:
    """One setup's runs as one result: the first run's figures, every run's decode steps, and
    any run's growth after sealing or sealed overflow."""
    first = runs[0]
    return dataclasses.replace(
        first,
        decode_step_s=[s for run in runs for s in run.decode_step_s],
        growths_after_seal=sum(run.growths_after_seal for run in runs),
        sealed_overflow=next((r.sealed_overflow for r in runs if r.sealed_overflow), None),
        steps_served=min(run.steps_served for run in runs),
    )


def round_ratios(library: Sequence[SetupResult], fixed: Sequence[SetupResult]) -> list[float]:
    """Each round's decode p50 ratio, library over fixed (0 where a run has no decode step)."""
    ratios = []
    for ours, theirs in zip(library, fixed, strict=True):
        if ours.decode_step_s and theirs.decode_step_s:
            ratios.append(median(ours.decode_step_s) / median(theirs.decode_step_s))
        else:
            ratios.append(0.0)
    return ratios


def round_failures(runs: Mapping[str, Sequence[SetupResult]]) -> list[str]:
    """A line for a setup whose later rounds generated other tokens than its first."""
    return [
        f"{rounds[0].name}: round {i + 1} generated other tokens than round 1"
        for rounds in runs.values()
        for i, run in enumerate(rounds[1:], start=1)
        if run.sealed_overflow is None and run.tokens != rounds[0].tokens
    ]


def _deployment() -> str:
    from hydra.core.hydra_config import HydraConfig

    return str(HydraConfig.get().runtime.choices.get("deployment"))


class _StreamedSchedule:
    """The one schedule every run serves, streamed afresh from the workload for each: the same
    steps each time (:func:`~.scheduler.schedule` is deterministic), and only the requests in
    flight in memory. ``steps`` counts the steps a run drew to the end of the trace (0 until
    one did)."""

    def __init__(
        self, workload: Workload, profile: CalibrationProfile, num_pages: int, shape: ModelSizes
    ) -> None:
        self._workload, self._profile = workload, profile
        self._num_pages, self._page_size = num_pages, shape.page_size
        self.steps = 0

    def __call__(self) -> tuple[Iterator[Step], Arrivals]:
        from ..replay.scheduler import Arrivals, schedule

        arrivals = Arrivals(self._workload.requests())
        limits = self._profile.limits
        steps = schedule(
            arrivals.stream(),
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            cuda_graph_batch_sizes=self._profile.cuda_graph_batch_sizes,
            num_pages=self._num_pages,
            page_size=self._page_size,
        )
        return self._count(steps, arrivals), arrivals

    def _count(self, steps: Iterator[Step], arrivals: Arrivals) -> Iterator[Step]:
        """``steps``, counted; once a step has run, its finished requests leave ``arrivals``."""
        drawn = 0
        for step in steps:
            drawn += 1
            yield step
            for request in step.finished:
                arrivals.pop(request)
        self.steps = max(self.steps, drawn)


def _progress(show: bool, total: int | None, name: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="step", desc=name, disable=not show, leave=False)
