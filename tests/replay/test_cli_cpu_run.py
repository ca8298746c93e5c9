"""The replay app's own flow, end to end on a CPU: ``main`` composes the deployment, measures the
free memory once and sizes both setups' KV caches from it, schedules the trace, serves it on the
library's pools (built, reserved, warmed up, sealed) and on the engines' fixed buffer, a run of
each a round in turned order, prints the report, writes report.json where asked, and exits 0, or
1 with a line naming what failed.

These tests check the app's flow, not FlashInfer nor CUDA. The calls of ``main`` that need a GPU
(finding the device, FlashInfer's version check, the calibration check, torch's current CUDA
device and ``set_device``) are replaced, and so is the GPU object ``main`` makes (``_Gpu``): the
CPU stand-in reports the free memory the test sets and names itself, and gathers one rank's
values and releases memory with ``_Gpu``'s own code. FlashInfer's wrappers are test_engine's
reference attention (plain torch over the paged KV cache) taking float workspace as FlashInfer's
allocator would, 32 KiB a token of context; decode runs eagerly (``cuda_graphs=false``). The model
is the deployment's attention shape narrowed to a few heads, one layer, a 64-token vocabulary,
its weights and queries in float32 (the KV cache keeps the deployment's dtype).
test_replay_gpu runs the same app on a GPU through FlashInfer."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.core.hydra_config import HydraConfig

from mstar_resources import resolver
from mstar_resources.apps import replay as cli
from mstar_resources.calibration.engine_buffers import own_int_mb
from mstar_resources.calibration.profile import load_profile
from mstar_resources.replay import engine, model
from mstar_resources.replay import report as reporting
from mstar_resources.resolver import resolve
from mstar_resources.units import MIB

from ..conftest import compose_shipped
from .test_engine import GQA, MLA, PER_TOKEN, SMALL, ReferenceAttention, context_need
from .test_report import FakePyplot, install_fake_matplotlib

CPU = torch.device("cpu")
GPU_NAME = "CPU stand-in"
TINY = [
    "layers=1", "vocab_size=64", "cuda_graphs=false", "progress=false",
    "calibration.model.num_kv_heads=1",
]  # fmt: skip
"""One layer over a 64-token vocabulary, decode eager, no progress bar: the CPU runs a step in a
millisecond or so."""
GQA_ARGS = [f"deployment={GQA}", *SMALL, *TINY, "calibration.model.num_qo_heads=4"]
"""The 8B deployment with test_engine's small limits (4 requests a step, 64 tokens, 256 a
request), 4 query heads and 1 KV head of 128: 512 bytes of KV cache a token."""
GQA_FIXED_MB = 64
"""The engines' buffer the GQA runs set (``fixed_buffer_mb``): it holds the reference
attention's largest plan (32 KiB x 4 requests x 256 tokens = 32 MiB)."""
TOKEN_BYTES = 2 * 128 * 2
"""KV-cache bytes a token of GQA_ARGS's model: K and V of one head of 128, bf16, one layer."""
ROOM = 2 * MIB
"""Free memory the stand-in reports beyond the fixed setup's buffers: KV cache for 4 whole
requests."""
FIXED_INT = MIB * own_int_mb(
    load_profile(compose_shipped([f"deployment={GQA}"]).calibration), cuda_graphs=False
)
"""What the replay counts for the int workspaces of the fixed setup's wrappers, eager (a prefill
and a decode wrapper, FlashInfer's own 8 MiB each)."""
LIBRARY_INT = sum(
    r.int_reserved_bytes for r in resolve(compose_shipped([f"deployment={GQA}"]).resources, {})
)
"""What the library's pools hold in int workspaces for the GQA deployment."""
TRACE = [(0.0, 40, 6), (0.0, 90, 4), (0.01, 12, 8), (0.02, 300, 5), (0.03, 250, 20),
         (0.05, 7, 3)]  # fmt: skip
"""JSON lines of (arrival_s, prompt_len, output_len): a prompt chunked (90 > 64 tokens a step),
one refused (300 >= max_model_len 256), one whose output is cut to fit (250 + 20)."""


def generated_tokens(trace_line: str) -> str:
    """The tokens the trace generates, as the report's ``trace:`` line ends with them."""
    found = re.search(r"([\d,]+) generated$", trace_line)
    assert found is not None, trace_line
    return found[1]


@dataclass(frozen=True)
class CpuGpu(cli._Gpu):
    """The replay's GPU object, on a CPU: the free memory is ``free``, the name is GPU_NAME;
    ``group``, ``gather`` (one rank) and ``release`` are ``_Gpu``'s own. Counts its releases."""

    free: int = 0
    released: list[int] = field(default_factory=list, compare=False)

    def name(self) -> str:
        return GPU_NAME

    def free_bytes(self) -> int:
        return self.free

    def release(self) -> None:
        super().release()
        self.released.append(1)


@dataclass
class Done:
    """One run of the app: its exit status, stdout and stderr."""

    status: int
    out: str
    err: str

    def rows(self) -> dict[str, dict[str, str]]:
        """The table's rows, by setup: each column's value by its heading."""
        lines = self.out.splitlines()
        head = re.split(r" {2,}", lines[0])
        rows = [dict(zip(head, re.split(r" {2,}", line), strict=True)) for line in lines[2:4]]
        return {row["setup"]: row for row in rows}

    def line(self, start: str) -> str:
        """The report's one line that starts with ``start``."""
        (found,) = [line for line in self.out.splitlines() if line.startswith(start)]
        return found


@dataclass
class CpuMachine:
    """What ``main`` finds on a CPU in place of a GPU, and what it did with it."""

    free: int = GQA_FIXED_MB * MIB + FIXED_INT + ROOM
    need: Callable[..., int] = field(default_factory=lambda: context_need(PER_TOKEN))
    gpus: list[CpuGpu] = field(default_factory=list)
    devices: list[torch.device] = field(default_factory=list)

    def gpu(self, device: torch.device, rank: int, ranks: int) -> CpuGpu:
        self.devices.append(device)
        self.gpus.append(CpuGpu(CPU, rank, ranks, free=self.free))
        return self.gpus[-1]

    def attention(self, model: Any, profile: Any, roles: Any) -> ReferenceAttention:
        return ReferenceAttention(model, profile, roles, self.need)


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> CpuMachine:
    """``main``'s GPU-only calls replaced for a CPU (see the module's docstring); the current
    CUDA device, for ``device=cuda``, is 3."""
    cpu = CpuMachine()
    monkeypatch.setattr(cli, "cuda_device", lambda setting, without_gpu: torch.device(setting))
    monkeypatch.setattr(cli, "check_flashinfer", lambda profile: None)
    monkeypatch.setattr(cli, "check_calibration", lambda cfg, device, resolved: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(cli, "_Gpu", cpu.gpu)
    monkeypatch.setattr(engine, "PagedAttention", cpu.attention)
    monkeypatch.setattr(engine, "MLAAttention", cpu.attention)
    deployments_sizes = model.ModelSizes.of
    monkeypatch.setattr(  # weights and queries in float32: a CPU's bf16 matmul is ~60x slower
        model.ModelSizes, "of",
        lambda *args: dataclasses.replace(deployments_sizes(*args), dtype=torch.float32),
    )  # fmt: skip
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    # main sets Hydra's config of the run, as @hydra.main does: the next test gets it back.
    monkeypatch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)
    return cpu


@pytest.fixture
def replay(
    machine: CpuMachine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Callable[..., Done]:  # fmt: skip
    """Runs ``python scripts/replay.py ARGS`` in this process, in an empty working folder."""
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")

    def run(*args: str) -> Done:
        monkeypatch.setattr(sys, "argv", ["scripts/replay.py", *args])
        capsys.readouterr()
        try:
            cli.main()
            status = 0
        except SystemExit as exit:
            status = int(exit.code or 0)
        out, err = capsys.readouterr()
        return Done(status, out, err)

    return run


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> FakePyplot:
    """matplotlib's recording stand-in (test_report's): CI has no matplotlib to draw replay.png."""
    return install_fake_matplotlib(monkeypatch)


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    keys = ("arrival_s", "prompt_len", "output_len")
    path.write_text("".join(json.dumps(dict(zip(keys, row, strict=True))) + "\n" for row in TRACE))
    return path


def test_a_replay_serves_both_setups_and_reports_them_side_by_side(
    replay, machine, trace_file, tmp_path, figures: FakePyplot
):
    """Status 0; the table printed is report.json's, the files written are named; both setups
    served the whole trace and generated the same tokens, nothing grew after sealing, and the
    library's setup leaves the KV cache the memory the fixed buffer holds back."""
    out = tmp_path / "out" / "replay"  # made when the report is written
    done = replay(*GQA_ARGS, f"fixed_buffer_mb={GQA_FIXED_MB}", f"trace={trace_file}",
                  "requests=6", f"report_dir={out}")  # fmt: skip
    assert (done.status, done.err) == (0, "")
    report = json.loads((out / "report.json").read_text())
    *table, wrote_json, wrote_png = done.out.splitlines()
    assert table == reporting.table(report).splitlines()
    assert (wrote_json, wrote_png) == (
        f"wrote {out / 'report.json'}",
        f"wrote {out / 'replay.png'}",
    )
    assert len(figures.figures) == 1 and (out / "replay.png").exists()  # drawn by the stand-in
    assert list(tmp_path.joinpath("cwd").iterdir()) == []

    rows = done.rows()
    assert list(rows) == ["mstar-resources", f"fixed {GQA_FIXED_MB} MiB"]
    ours, theirs = rows.values()
    # The calibrated floors: 17 MB of prefill and 3 MB in each of decode's two slots.
    assert (ours["workspace MiB"], theirs["workspace MiB"]) == ("23.00", "64.00")
    for row in (ours, theirs):
        assert (row["growths after seal"], row["sealed overflows"]) == ("0", "0")
    served = "5 requests served, 1 refused (prompt >= max_model_len 256), 1 clipped"
    trace = done.line("trace: ")
    assert f"{trace_file} rows 0..5 of 6" in trace and served in trace
    assert ours["tokens out"] == theirs["tokens out"] == generated_tokens(trace)
    assert done.line("ranks: ") == f"ranks: 1; {GQA} on {GPU_NAME}"
    assert done.line("generated tokens identical") == (
        "generated tokens identical between the setups: yes"
    )
    # 80% of what the fixed setup holds back over the library's floors (41 MiB of float buffer,
    # and the int workspaces), in whole pages of 16 tokens (each cache less its dummy page).
    kv_line = done.line("KV-cache tokens: ")
    gained = re.match(r"KV-cache tokens: \+([\d,]+) a rank", kv_line)
    assert gained is not None
    held_back = 41 * MIB + FIXED_INT - LIBRARY_INT
    assert abs(int(gained[1].replace(",", "")) - held_back * 0.8 / TOKEN_BYTES) < 16
    assert re.search(r"mstar-resources/fixed 64 MiB: [\d.]+ \(rounds, the order turned each: "
                     r"[\d.]+, [\d.]+; spread [\d.]+\)$", kv_line)  # fmt: skip

    setups = {s["setup"]: s for s in report["setups"]}
    library, fixed = setups["mstar-resources"], setups["fixed 64 MiB"]
    assert library["growths_before_seal"] > 0  # warm-up grew the pools to the largest plans
    assert fixed["growths_before_seal"] == 0
    assert library["steps_served"] == fixed["steps_served"] == report["trace"]["steps"]
    assert library["decode_steps"] == fixed["decode_steps"] > 0
    assert (library["kv_tokens"], fixed["kv_tokens"]) == (
        pytest.approx((machine.free - 23 * MIB - LIBRARY_INT) * 0.8 / TOKEN_BYTES, abs=32),
        pytest.approx(ROOM * 0.8 / TOKEN_BYTES, abs=32),
    )  # fmt: skip
    assert report["tokens_identical"] and len(report["decode_p50_ratio_rounds"]) == 2
    assert (report["deployment"], report["gpu"], report["ranks"]) == (GQA, GPU_NAME, 1)
    assert report["model"]["attention"] == "gqa"
    assert report["model"]["qo_heads_per_rank"] == 4 and report["model"]["layers"] == 1
    # device=cuda is the current device; each of the 4 runs' memory was given back after it.
    (gpu,) = machine.gpus
    assert (machine.devices, gpu.rank, gpu.ranks) == ([torch.device("cuda", 3)], 0, 1)
    assert len(gpu.released) == 4


@pytest.mark.parametrize(
    ("role", "workspace", "args"),
    [
        pytest.param("decode", "attention:decode:cg0", ["trace={trace}", "requests=6"],
                     id="decode-trace-file"),
        pytest.param("prefill", "attention:prefill", ["requests=4"], id="prefill-synthetic"),
    ],
)  # fmt: skip
def test_a_sealed_overflow_fails_the_run_naming_the_setting_to_raise(
    replay, trace_file, role, workspace, args
):
    """A floor too small for the trace, warm-up off: the library's setup stops at the first plan
    past it; the run fails (status 1) with one line naming the setting, the table marks the setup
    stopped and says why, and the fixed buffer's setup still served the whole trace."""
    args = [arg.format(trace=trace_file) for arg in args]
    done = replay(*GQA_ARGS, f"fixed_buffer_mb={GQA_FIXED_MB}", *args,
                  f"resources.attn.{role}.declared_mb=1", "warmup=false")  # fmt: skip
    assert done.status == 1
    assert "Traceback" not in done.err
    (failed,) = done.err.splitlines()
    prefix = "replay: failed: mstar-resources overflowed a sealed workspace: "
    assert failed.startswith(prefix)
    message = failed.removeprefix(prefix)
    assert message.startswith(f"workspace '{workspace}' is sealed at 1,048,576 bytes")
    suggested = re.search(rf"set resources\.attn\.{role}\.declared_mb=(\d+) or more", message)
    assert suggested is not None and int(suggested[1]) > 1
    rows = done.rows()
    ours, theirs = rows["mstar-resources"], rows[f"fixed {GQA_FIXED_MB} MiB"]
    assert (ours["sealed overflows"], theirs["sealed overflows"]) == ("1 (stopped)", "0")
    assert int(ours["tokens out"].replace(",", "")) < int(theirs["tokens out"].replace(",", ""))
    assert theirs["tokens out"] == generated_tokens(done.line("trace: "))  # the whole trace's
    assert done.line("generated tokens identical") == (
        "generated tokens identical between the setups: NO"
    )
    assert done.out.splitlines()[-1] == f"mstar-resources stopped at a sealed overflow: {message}"


def test_warm_up_grows_a_floor_too_small_before_sealing_and_the_run_passes(
    replay, trace_file, tmp_path, figures
):
    """The same floor too small for the trace, warm-up on: the pool grows while it may, nothing
    grows or overflows once sealed, and the run passes with both setups' tokens identical."""
    out = tmp_path / "out"
    done = replay(*GQA_ARGS, f"fixed_buffer_mb={GQA_FIXED_MB}", f"trace={trace_file}",
                  "requests=6", "resources.attn.decode.declared_mb=1",
                  f"report_dir={out}")  # fmt: skip
    assert (done.status, done.err) == (0, "")
    ours = done.rows()["mstar-resources"]
    assert ours["workspace MiB"] == "19.00"  # what its floors reserve: 17 + 2 x 1
    assert (ours["growths after seal"], ours["sealed overflows"]) == ("0", "0")
    assert done.line("generated tokens identical").endswith(": yes")
    library = json.loads((out / "report.json").read_text())["setups"][0]
    assert library["growths_before_seal"] > 0 and library["sealed_overflow"] is None


def test_each_round_serves_the_schedule_again_and_the_report_pools_the_rounds(
    replay, machine, trace_file, tmp_path, figures
):
    """timing_rounds=N serves each setup N times: the decode steps pooled N-fold, the same
    tokens, a ratio a round on the report's line (none with one round). The trace's first 3
    requests, to keep 8 runs short."""
    reports = {}
    for rounds in (1, 3):
        out = tmp_path / f"rounds-{rounds}"
        done = replay(*GQA_ARGS, f"fixed_buffer_mb={GQA_FIXED_MB}", f"trace={trace_file}",
                      "requests=3", f"timing_rounds={rounds}", f"report_dir={out}")  # fmt: skip
        assert (done.status, done.err) == (0, "")
        reports[rounds] = json.loads((out / "report.json").read_text())
        kv_line = done.line("KV-cache tokens: ")
        each = re.search(r"\(rounds, the order turned each: (.*); spread [\d.]+\)$", kv_line)
        assert (each is None) if rounds == 1 else (len(each[1].split(", ")) == rounds)
        assert len(machine.gpus[-1].released) == 2 * rounds  # each run's memory given back
    for one, three in zip(reports[1]["setups"], reports[3]["setups"], strict=True):
        assert three["decode_steps"] == 3 * one["decode_steps"]
        assert three["steps_served"] == one["steps_served"]
        assert three["tokens_out"] == one["tokens_out"]
    assert [len(reports[n]["decode_p50_ratio_rounds"]) for n in (1, 3)] == [1, 3]


def test_the_mla_deployment_replays_against_sglang_s_buffer_by_default(replay, machine, trace_file):
    """DeepSeek-V3's MLA deployment (the reference attention's MLA form) on the calibrated pools
    and, fixed_buffer_mb unset, on SGLang's 384 MiB: vLLM plans no FlashInfer MLA on SM90."""
    machine.free = 384 * MIB + FIXED_INT + ROOM
    done = replay(f"deployment={MLA}", *SMALL, *TINY, "calibration.model.num_qo_heads=2",
                  f"trace={trace_file}", "requests=6")  # fmt: skip
    assert (done.status, done.err) == (0, "")
    rows = done.rows()
    assert list(rows) == ["mstar-resources", "fixed 384 MiB"]
    ours, theirs = rows.values()
    # The calibrated floors: 17 MB for each of the three workspaces.
    assert (ours["workspace MiB"], theirs["workspace MiB"]) == ("51.00", "384.00")
    assert ours["tokens out"] == theirs["tokens out"]
    assert float(ours["decode p50 ms"]) > 0 and float(theirs["decode p50 ms"]) > 0
    assert done.line("ranks: ") == f"ranks: 1; {MLA} on {GPU_NAME}"
    assert done.line("generated tokens identical").endswith(": yes")


def test_a_synthetic_trace_is_replayed_where_no_trace_file_is_named(replay):
    """trace unset: the seeded synthetic trace, drawn to fit max_model_len (none refused)."""
    done = replay(*GQA_ARGS, f"fixed_buffer_mb={GQA_FIXED_MB}", "requests=2", "seed=5")
    assert (done.status, done.err) == (0, "")
    assert done.line("trace: ").startswith(
        "trace: synthetic (seed 5): 2 requests served, 0 refused (prompt >= max_model_len 256), "
        "0 clipped"
    )
    assert done.line("generated tokens identical").endswith(": yes")


def test_without_matplotlib_the_report_is_written_and_the_missing_figure_named(
    replay, trace_file, tmp_path, monkeypatch
):
    """A run that asked for report_dir on a machine without matplotlib ends as it would have,
    with report.json written and one line on stderr saying what the figure needs."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    out = tmp_path / "out"
    done = replay(*GQA_ARGS, f"fixed_buffer_mb={GQA_FIXED_MB}", f"trace={trace_file}",
                  "requests=6", "timing_rounds=1", f"report_dir={out}")  # fmt: skip
    assert done.status == 0
    assert done.out.splitlines()[-1] == f"wrote {out / 'report.json'}"
    assert done.err == f"replay: {reporting.NO_FIGURE}\n"
    assert sorted(path.name for path in out.iterdir()) == ["report.json"]


def test_the_replay_resolves_the_tree_once(replay, trace_file, monkeypatch):
    """The records checked before any GPU work build each round's pools and are what the
    calibration check compares: the tree is resolved once however many rounds run."""
    resolved: list[object] = []

    def resolve_and_record(*args: Any) -> Any:
        resolved.append(resolve(*args))
        return resolved[-1]

    monkeypatch.setattr(cli, "resolve", resolve_and_record)
    monkeypatch.setattr(resolver, "resolve", resolve_and_record)  # what build_pools would call
    done = replay(*GQA_ARGS, f"fixed_buffer_mb={GQA_FIXED_MB}", f"trace={trace_file}",
                  "requests=6", "timing_rounds=3")  # fmt: skip
    assert done.status == 0 and len(resolved) == 1
