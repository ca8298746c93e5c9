"""The replay app: the library in an engine's loop, end to end, against the engines' way.

    python scripts/replay.py deployment=llama3-8b-h200_calibrated
    torchrun --nproc-per-node 2 scripts/replay.py deployment=llama3-8b-h200_calibrated

Composes the deployment, checks the settings and reads the trace before any GPU work (a seeded
synthetic one, or a slice of a production trace file: ``workload.py``, ``trace.py``), makes its
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

import gc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from .. import _limits as limits
from .._devices import cuda_device
from ..app import hydra_app, package_version
from ..calibration.engines import SGLANG_MB, vllm_buffer_mb
from ..errors import ResourceConfigError, WorkspaceSealedError
from ..profile import PROFILE_KEY, CalibrationProfile, load_profile
from ..resolver import ResolvedResource, build_pools, resolve
from ..settings import ReplaySettings
from ..units import MIB
from .roles import Roles, is_mla, roles_of
from .workload import Workload, load_workload

if TYPE_CHECKING:  # the model imports torch: only the run itself needs it
    from .model import Shape

__all__ = ["check", "main"]

PROG = "replay"


def check(
    cfg: DictConfig, ranks: int
) -> tuple[CalibrationProfile, list[ResolvedResource], Roles, Workload]:
    """Everything the settings can get wrong, on any machine, before a GPU is touched. The trace
    is read here too, so that a bad file is refused on any machine and the GPU part reads none."""
    problems = limits.problems(cfg, ReplaySettings)
    if cfg.trace is None and cfg.trace_offset > 0:
        problems.append(
            f"trace_offset={cfg.trace_offset} skips rows of a trace file, and trace=null replays "
            "the synthetic trace; set trace=PATH, or trace_offset=0"
        )
    if cfg.report_dir is not None:
        try:
            Path(cfg.report_dir).mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a file in the way, no permission, ...
            problems.append(
                f"report_dir={cfg.report_dir!r} can't be made a folder ({error.strerror}); "
                "point it at a folder that exists or can be made"
            )
    if problems:
        raise ResourceConfigError(*problems, where="the replay's settings")
    if cfg.get(PROFILE_KEY) is None:
        raise ResourceConfigError(
            "this deployment carries no `calibration` profile (the model's attention shape and "
            "the engine's limits); pick one that has, e.g. deployment=llama3-8b-h200_calibrated"
        )
    profile = load_profile(cfg[PROFILE_KEY])
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
    workload = load_workload(
        cfg.trace,
        requests=cfg.requests,
        trace_offset=cfg.trace_offset,
        step_ms=cfg.step_ms,
        seed=cfg.seed,
        vocab_size=cfg.vocab_size,
        max_model_len=profile.limits.max_model_len,
    )
    return profile, records, roles, workload


def kv_pages_for(free: int, workspace_bytes: int, shape: Shape, utilization: float) -> int:
    """Pages of KV cache a setup gets: ``utilization`` of the ``free`` memory its workspaces
    leave."""
    page_bytes = shape.kv_bytes_per_token * shape.page_size
    return int((free - workspace_bytes) * utilization) // page_bytes


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
    profile, records, roles, workload = check(cfg, ranks)
    device_setting = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if ranks > 1 else cfg.device
    device = cuda_device(device_setting, "the replay runs on a GPU")
    import torch
    import torch.distributed as dist

    if device.index is None:  # plain "cuda": the current device
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    if ranks > 1:
        dist.init_process_group("nccl", device_id=device)
    try:
        failures = _replay(cfg, profile, records, roles, workload, device, rank, ranks)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if failures:
        if rank == 0:
            print(f"{PROG}: failed: {'; '.join(failures)}", file=sys.stderr)
        raise SystemExit(1)


def _replay(
    cfg: DictConfig,
    profile: CalibrationProfile,
    records: list[ResolvedResource],
    roles: Roles,
    workload: Workload,
    device: Any,
    rank: int,
    ranks: int,
) -> list[str]:
    """Both setups over one schedule; rank 0 prints (and writes) the report. What failed."""
    import torch
    import torch.distributed as dist

    from . import report as reporting
    from .engine import FixedBuffer, LibraryBuffers, SealedOverflow, Setup
    from .model import Model, Shape, describe
    from .scheduler import schedule

    group = dist.group.WORLD if ranks > 1 else None
    limits = profile.limits
    trace = workload.requests
    shape = Shape.of(profile, cfg.layers, cfg.vocab_size, ranks)
    model = Model(shape, device, cfg.seed, rank, ranks)
    # vLLM's buffer where it plans FlashInfer for the model; for MLA on SM90 it plans none, and
    # SGLang's (the engine that does) stands for the engines.
    fixed_mb = cfg.fixed_buffer_mb or vllm_buffer_mb(profile, ranks) or SGLANG_MB

    # Each setup's KV cache is sized from the free memory measured once, now, less that setup's
    # workspaces (reserved before the KV cache is sized): measuring again after the first setup
    # would charge the second with what the process made once (kernels loaded, cuBLAS
    # workspaces). One schedule serves both (their tokens must match), within the smaller cache
    # of any rank.
    if group is not None:
        dist.barrier()  # NCCL makes its buffers at the first collective: before measuring
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    library_bytes = sum(record.reserved_bytes for record in records)
    fixed_bytes = fixed_mb * MIB
    kv_pages = {
        "library": kv_pages_for(free, library_bytes, shape, cfg.memory_utilization),
        "fixed": kv_pages_for(free, fixed_bytes, shape, cfg.memory_utilization),
    }
    pages = min(kv_pages.values()) - 1  # page 0 is the dummy page
    if group is not None:
        every: list[int | None] = [None] * ranks
        dist.all_gather_object(every, pages, group=group)
        pages = min(p for p in every if p is not None)
    steps = schedule(
        trace,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        cuda_graph_batch_sizes=profile.cuda_graph_batch_sizes,
        num_pages=pages,
        page_size=shape.page_size,
    )

    results = []
    for kind, make in (
        ("library", lambda: LibraryBuffers(build_pools(cfg.resources, device), roles)),
        ("fixed", lambda: FixedBuffer(fixed_bytes, device)),
    ):
        buffers = make()
        setup = Setup(model, profile, buffers, kv_pages[kind], group, cfg.cuda_graphs, roles)
        progress = _progress(cfg.progress and rank == 0, len(steps), buffers.name)
        try:
            if cfg.warmup:
                setup.warm_up()
            setup.seal_and_capture()
            result = setup.serve(steps, trace, progress)
        except WorkspaceSealedError as error:  # a graph's plan at capture did not fit
            setup.result.sealed_overflow = SealedOverflow.of(error)
            result = setup.result
        finally:
            progress.close()
        results.append(result)
        del setup, buffers
        gc.collect()
        torch.cuda.empty_cache()

    ours, theirs = results
    complete = all(r.sealed_overflow is None for r in results)
    identical = complete and ours.tokens == theirs.tokens
    report = {
        "deployment": _deployment(),
        "gpu": torch.cuda.get_device_name(device),
        "ranks": ranks,
        "model": describe(shape),
        "trace": reporting.trace_summary(workload, len(steps)),
        "setups": [reporting.setup_summary(r) for r in results],
        "tokens_identical": identical,
    }
    if group is not None:  # rank 0 reports every rank's figures
        every_report: list[dict[str, Any] | None] = [None] * ranks
        dist.all_gather_object(every_report, report, group=group)
        report["per_rank"] = every_report
    failures = []
    for r in results:
        if r.sealed_overflow is not None:
            failures.append(f"{r.name} overflowed a sealed workspace: {r.sealed_overflow}")
        elif r.growths_after_seal:
            failures.append(f"{r.name}: {r.growths_after_seal} growths after sealing")
    if complete and not identical:
        failures.append("the two setups generated different tokens")
    if rank == 0:
        print(reporting.table(report))
        if cfg.report_dir is not None:
            times = {r.name: r.decode_step_s for r in results}
            for path in reporting.write(report, Path(cfg.report_dir), times):
                print(f"wrote {path}")
    return failures


def _deployment() -> str:
    from hydra.core.hydra_config import HydraConfig

    return str(HydraConfig.get().runtime.choices.get("deployment"))


def _progress(show: bool, total: int, name: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="step", desc=name, disable=not show, leave=False)
