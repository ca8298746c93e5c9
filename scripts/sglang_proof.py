"""The SGLang plugin in real SGLang: the same generation with and without it, side by side.

    python scripts/sglang_proof.py                      # every group, each three ways
    python scripts/sglang_proof.py --cases llama        # one model
    python scripts/sglang_proof.py --dry-run            # what it would run, without SGLang

Two models with Llama 3 8B's attention (2 layers of 32 query / 8 KV heads of dim 128; random
weights of ``vllm_proof.INIT_STD``, seeded, saved locally), one of Llama's architecture and one of
Qwen3's (for which SGLang replaces ``SGLANG_FLASHINFER_WORKSPACE_SIZE`` with 512 MiB), run in
SGLang's offline ``sglang.Engine`` with the FlashInfer backend and decode CUDA graphs, greedy, on
prompts of token ids whose lengths are a slice of a public trace: once as SGLang is, and once with
``MSTAR_RESOURCES_SGLANG`` set to a deployment file calibrated on this GPU for the runs' limits.
Before the first run that needs it, the script writes that file with ``mstar-resources-calibrate
deployment=llama3-8b-h200``, SGLang's decode plans (``_engines.engine_plans``) and the runs'
limits (SGLang's page size of 1 token, its most running requests as the largest graph batch, its
prefill chunk, its context length). The large graph batch (``large-graph``) is the Llama model
with 512 running requests and decode graphs up to 512: SGLang's own 384 MiB may fall short of
what FlashInfer 0.6.15 plans there.
``prefill-graphs`` is the Llama model with SGLang's default prefill CUDA graphs (breakable on
CUDA), which the other groups turn off.

Each run is a process of its own (``--run``); SGLang's scheduler, which SGLang spawns, writes to
the same log. An SGLang forward hook (``forward_hooks``, :func:`report_hook`), which SGLang calls
in its scheduler once CUDA graphs are captured, prints the size of the FlashInfer workspace SGLang
took from its buffer registry and the plugin's report. The script prints one table and writes
``sglang_proof.json`` (``--out``): per run the generated tokens' digest, SGLang's own "KV Cache is
allocated" line, the GPU memory free as its graph capture begins and what the capture took, the
workspace bytes, the growths and sealed refusals, the time to start, and the error that ended a
run that failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import sys
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(ROOT))

import vllm_proof  # noqa: E402
from vllm_proof import INIT_STD, VOCAB, digest, trace_requests  # noqa: E402

from mstar_resources.calibration.calibrate import calibrated_name  # noqa: E402

from _args import DAY, output_folder, run_main, seconds  # noqa: E402
from _engines import engine_plans  # noqa: E402

PLUGIN_SETTING = "MSTAR_RESOURCES_SGLANG"
SGLANG_SIZE = "SGLANG_FLASHINFER_WORKSPACE_SIZE"
DEPLOYMENT = "llama3-8b-h200"
"""The shipped deployment whose calibration profile has the models' attention (32 / 8 heads of
128, bf16); calibrated here with SGLang's plans and the runs' limits."""
LLAMA_HEADS = types.SimpleNamespace(num_qo_heads=32, num_kv_heads=8, kv_dtype="bfloat16")
"""Its attention, as :func:`_engines.engine_plans` reads it."""
PAGE_SIZE = 1
"""SGLang's default ``page_size`` with the FlashInfer backend; the calibration plans with it."""
MEM_FRACTION = 0.5
"""``mem_fraction_static``: as the kit's smoke test, seen working on the H200."""


@dataclass(frozen=True)
class Model:
    name: str
    architecture: str
    """``LlamaForCausalLM`` or ``Qwen3ForCausalLM``: SGLang gives the latter 512 MiB."""
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    layers: int = 2


MODELS = {
    "llama": Model("llama", "LlamaForCausalLM"),
    "qwen3": Model("qwen3", "Qwen3ForCausalLM"),
}


@dataclass(frozen=True)
class Case:
    """One SGLang run."""

    name: str
    model: str
    plugin: bool
    """``MSTAR_RESOURCES_SGLANG`` set to the file calibrated for this run's limits, or to ``auto``
    (the ``auto`` side); False: unset."""
    max_running_requests: int = 128
    """SGLang's most running requests, and its largest decode graph batch
    (``cuda_graph_max_bs_decode``): the calibration's ``max_num_seqs``."""
    prefill_tokens: int = 4096
    """``chunked_prefill_size`` and ``max_prefill_tokens``: the calibration's
    ``max_num_batched_tokens``."""
    context_length: int = 4096
    """The calibration's ``max_model_len``."""
    requests: int = 128
    prefill_graphs: bool = False
    """SGLang's default prefill CUDA graphs (breakable on CUDA: attention eager between the
    graph's segments, on the same prefill wrappers); False: none."""

    @property
    def side(self) -> str:
        """What the run is of its group: ``sglang``, ``plugin`` or ``auto``."""
        return self.name.split("/")[-1]

    def setting(self, out: Path) -> str | None:
        """``MSTAR_RESOURCES_SGLANG`` in this run (None: unset)."""
        if not self.plugin:
            return None
        return "auto" if self.side == "auto" else str(self.calibration.path(out).resolve())

    @property
    def calibrated(self) -> bool:
        """Whether the run takes a file calibrated before it."""
        return self.plugin and self.side != "auto"

    @property
    def calibration(self) -> Calibration:
        return Calibration(self.max_running_requests, self.prefill_tokens, self.context_length)


@dataclass(frozen=True)
class Calibration:
    """One ``mstar-resources-calibrate`` run: the deployment file for the runs of these limits."""

    max_running_requests: int
    prefill_tokens: int
    context_length: int

    @property
    def name(self) -> str:
        return f"calibrate/{self.max_running_requests}"

    def folder(self, out: Path) -> Path:
        """Where it writes (a ``deployment/`` folder, as the plugin's setting takes a file)."""
        limits = f"{self.max_running_requests}-{self.prefill_tokens}-{self.context_length}"
        return out / f"calibrated-{limits}" / "deployment"

    def path(self, out: Path) -> Path:
        return self.folder(out) / f"{calibrated_name(DEPLOYMENT, self.folder(out))}.yaml"

    def settings(self, out: Path) -> list[str]:
        return [
            f"deployment={DEPLOYMENT}", f"calibration.model.page_size={PAGE_SIZE}",
            *engine_plans("sglang", LLAMA_HEADS, self.max_running_requests, self.prefill_tokens),
            f"calibration.limits.max_num_seqs={self.max_running_requests}",
            f"calibration.limits.max_num_batched_tokens={self.prefill_tokens}",
            f"calibration.limits.max_model_len={self.context_length}",
            f"output_dir={self.folder(out)}", "progress=false",
        ]  # fmt: skip


SIDES = ("sglang", "plugin", "auto")
"""As SGLang is, with a deployment file calibrated for the run's limits, and with ``auto``."""

LARGE_GRAPH = {"model": "llama", "max_running_requests": 512, "requests": 512}
"""Decode graphs up to 512 requests, and enough requests to fill them (480 of the trace's rows
fit): FlashInfer 0.6.15's tensor-core decode plans need more the larger the graph batch."""

GROUPS: dict[str, dict[str, Any]] = {
    "llama": {"model": "llama"},
    "qwen3": {"model": "qwen3"},
    "large-graph": LARGE_GRAPH,
    "prefill-graphs": {"model": "llama", "prefill_graphs": True},
}


def group_cases(group: str) -> list[Case]:
    """``group`` as SGLang runs it, then with the plugin: a calibrated file, then ``auto``."""
    return [Case(f"{group}/{side}", plugin=side != "sglang", **GROUPS[group]) for side in SIDES]


def plan(cases: list[Case]) -> list[Case | Calibration]:
    """``cases`` in order, each calibration just before the first run that uses its file."""
    steps: list[Case | Calibration] = []
    for case in cases:
        if case.calibrated and case.calibration not in steps:
            steps.append(case.calibration)
        steps.append(case)
    return steps


def engine_args(case: Case) -> dict[str, Any]:
    """``sglang.Engine``'s arguments for ``case`` (SGLang 0.5.17's ``ServerArgs``), but the
    model's path. Decode graphs up to the most running requests; no prefill graph but in the
    ``prefill-graphs`` group, which keeps SGLang's default ones."""
    return {
        "attention_backend": "flashinfer", "dtype": "bfloat16", "skip_tokenizer_init": True,
        "mem_fraction_static": MEM_FRACTION, "context_length": case.context_length,
        "max_running_requests": case.max_running_requests,
        "cuda_graph_max_bs_decode": case.max_running_requests,
        "chunked_prefill_size": case.prefill_tokens, "max_prefill_tokens": case.prefill_tokens,
        "disable_prefill_cuda_graph": not case.prefill_graphs, "random_seed": 0,
        "log_level": "info",
    }  # fmt: skip


def prompts(case: Case) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) for each request: the trace's first rows that fit,
    seeded ids, outputs capped at ``vllm_proof.MAX_OUTPUT``."""
    return trace_requests(min(case.context_length, 2048), case.requests)


def describe(step: Case | Calibration, out: Path) -> str:
    """One line: what the step runs, with its settings."""
    if isinstance(step, Calibration):
        return f"{step.name}: mstar-resources-calibrate {' '.join(step.settings(out))}"
    lengths = prompts(step)
    setting = step.setting(out) or "(unset)"
    settings = ", ".join(f"{k}={v}" for k, v in engine_args(step).items())
    return (
        f"{step.name}: {PLUGIN_SETTING}={setting}, {MODELS[step.model].architecture}, {settings}, "
        f"{len(lengths)} requests, {sum(len(p) for p, _ in lengths):,} prompt tokens, "
        f"{sum(n for _, n in lengths):,} output tokens"
    )


# -- one run, in a process of its own ------------------------------------------------------------


def build_model(model: Model, folder: Path) -> Path:
    """A model of ``model``'s architecture and attention, random weights (seeded, std
    ``INIT_STD``), saved with its config: nothing is downloaded."""
    path = folder / f"tiny-{model.name}"
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config, causal_lm = {
        "LlamaForCausalLM": (LlamaConfig, LlamaForCausalLM),
        "Qwen3ForCausalLM": (Qwen3Config, Qwen3ForCausalLM),
    }[model.architecture]
    torch.manual_seed(0)
    built = causal_lm(config(
        vocab_size=VOCAB, hidden_size=512, intermediate_size=1024, num_hidden_layers=model.layers,
        num_attention_heads=model.heads, num_key_value_heads=model.kv_heads,
        head_dim=model.head_dim, max_position_embeddings=8192, tie_word_embeddings=False,
        initializer_range=INIT_STD,
    )).to(torch.bfloat16)  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    built.save_pretrained(path)
    return path


HOOK_MARK = "sglang-proof:"
HOOK = {"name": "sglang-proof", "target_modules": ["lm_head"],
        "hook_factory": "sglang_proof:report_hook"}  # fmt: skip
"""SGLang's forward-hook spec: it imports this module in its scheduler (``scripts/`` is on the
run's ``PYTHONPATH``) and calls :func:`report_hook` there once CUDA graphs are captured."""


def report_hook(config: dict[str, Any]) -> None:
    """SGLang's forward-hook factory, in its scheduler process: prints (``HOOK_MARK`` and JSON)
    the bytes of the FlashInfer workspace SGLang's backend took from its buffer registry, the
    size SGLang set for it, and the plugin's report where it is enabled; registers no hook."""
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_buffer

    from mstar_resources.integrations import sglang as plugin

    def absent() -> Any:
        raise LookupError("flashinfer_workspace")

    try:
        buffer = get_buffer("flashinfer_workspace", absent)
        held = buffer.numel() * buffer.element_size()
    except LookupError:
        held = None
    workspaces = plugin.active()
    found = {
        "flashinfer_workspace_bytes": held,
        "sglang_workspace_size": envs.SGLANG_FLASHINFER_WORKSPACE_SIZE.get(),
        "plugin": workspaces.report() if workspaces is not None else None,
    }
    print(HOOK_MARK, json.dumps(found), flush=True)


def run(case: Case, models: Path) -> dict[str, Any]:
    """One SGLang engine: start it, generate, and shut it down."""
    import sglang

    path = build_model(MODELS[case.model], models)
    requests = prompts(case)
    start = time.perf_counter()
    llm = sglang.Engine(model_path=str(path), forward_hooks=[HOOK], **engine_args(case))
    started = time.perf_counter() - start
    try:
        info = llm.get_server_info()
        begin = time.perf_counter()
        outputs = llm.generate(
            input_ids=[p for p, _ in requests],
            sampling_params=[
                {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for _, n in requests
            ],
        )
        generate_s = time.perf_counter() - begin
    finally:
        llm.shutdown()
    tokens = [list(o["output_ids"]) for o in outputs]
    return {
        "start_s": round(started, 1),
        "generate_s": round(generate_s, 3),
        "max_total_num_tokens": info.get("max_total_num_tokens"),
        "graph_max_bs": case.max_running_requests,
        "tokens": tokens,
        "tokens_out": sum(len(t) for t in tokens),
    }


def _run_here(args: argparse.Namespace) -> None:
    case = Case(**json.loads(args.run))
    try:
        result = {"ok": True, **run(case, Path(args.models))}
    except BaseException as error:  # the run's outcome, a crash included, is the measurement
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    Path(args.result).write_text(json.dumps(result))


# -- the side-by-side ----------------------------------------------------------------------------


def launch(case: Case, out: Path, models: Path, timeout: float) -> dict[str, Any]:
    """``case`` in a process of its own; its result, with what its log says."""
    result_path = out / f"{case.name.replace('/', '-')}.json"
    setting = case.setting(out)
    command = [sys.executable, __file__, "--run", json.dumps(asdict(case)), "--result",
               str(result_path), "--models", str(models)]  # fmt: skip
    log = result_path.with_suffix(".log")
    env = _environment(setting)
    lines, wall_s, status = vllm_proof.run_logged(command, env, log, timeout, cwd=ROOT)
    result: dict[str, Any] = {"ok": False, "error": _ended(status, timeout)}
    if result_path.exists():
        result = json.loads(result_path.read_text())
    result.update(from_log(lines), setting=setting, wall_s=wall_s)
    if not result_path.exists() and result["errors"]:
        # SGLang ends the process whose scheduler failed (SIGQUIT): its log says why.
        result["error"] += f"; its log's last error: {result['errors'][-1]}"
    print(f"{case.name}: {'ok' if result['ok'] else result['error']} ({wall_s} s)",
          flush=True)  # fmt: skip
    return result


def calibrate(calibration: Calibration, out: Path, timeout: float) -> dict[str, Any]:
    """``mstar-resources-calibrate`` for ``calibration``'s limits, on this GPU and the FlashInfer
    SGLang runs; the file it wrote and the floors there."""
    path = calibration.path(out)
    command = [sys.executable, "-m", "mstar_resources.apps.calibrate",
               *calibration.settings(out)]  # fmt: skip
    log = out / f"{calibration.name.replace('/', '-')}.log"
    path.unlink(missing_ok=True)  # a file of an earlier run is not this one's
    env = _environment(None)
    lines, wall_s, status = vllm_proof.run_logged(command, env, log, timeout, cwd=ROOT)
    result: dict[str, Any] = {"ok": status == 0 and path.exists(), "path": str(path),
                              "wall_s": wall_s, "log_tail": lines[-30:]}  # fmt: skip
    if result["ok"]:
        result["declared_mb"] = declared_mb(path.read_text())
    else:
        last = next((x for x in reversed(lines) if x.strip()), "")
        result["error"] = f"{_ended(status, timeout)}: {last}"
    print(f"{calibration.name}: {path if path.exists() else result['error']} ({wall_s} s)",
          flush=True)  # fmt: skip
    return result


def declared_mb(text: str) -> dict[str, int]:
    """A calibrated deployment's float floors, by resource (``resources.attn.<name>``)."""
    return {m[1]: int(m[2]) for m in re.finditer(r"\n    (\w+):\n      declared_mb: (\d+)", text)}


def _environment(setting: str | None) -> dict[str, str]:
    """A run's environment: the plugin's setting (None: unset), SGLang's own workspace size
    unset, and ``scripts/`` last on the path so that SGLang's scheduler finds :data:`HOOK`."""
    env = dict(os.environ)
    env.pop(PLUGIN_SETTING, None)
    env.pop(SGLANG_SIZE, None)
    if setting is not None:
        env[PLUGIN_SETTING] = setting
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(SCRIPTS)) if p)
    return env


def _ended(status: int | None, timeout: float) -> str:
    if status is None:
        return f"no result within {timeout:.0f} s"
    return f"no result (the process ended with status {status})"


KV_LINE = re.compile(r"KV Cache is allocated\. .*#tokens: (\d+)")
CAPTURE_LINE = re.compile(r"Capture .*CUDA graph begin\..*avail mem=([\d.]+) GB")
"""SGLang's line as its decode graph capture begins: the GPU memory free then, after the KV pool
and (as SGLang is) its own FlashInfer buffer, which it makes after sizing the pool."""
CAPTURED_LINE = re.compile(r"Capture .*CUDA graph end\..*mem usage=([\d.]+) GB")
"""SGLang's line as its decode graph capture ends: the GPU memory the capture took, the decode
wrappers' own int workspaces (8 MiB each, one wrapper a graph) among it."""


def from_log(lines: list[str]) -> dict[str, Any]:
    """What a run's log says: SGLang's KV-pool line, the hook's report, the plugin's lines,
    FlashInfer's overflow and the plugin's refusals, errors, its tail."""
    hook = next((x.split(HOOK_MARK, 1)[1] for x in lines if x.startswith(HOOK_MARK)), None)
    free = (m[1] for x in lines if (m := CAPTURE_LINE.search(x)))
    taken = (m[1] for x in lines if (m := CAPTURED_LINE.search(x)))
    return {
        "kv_line": next((x for x in lines if KV_LINE.search(x)), None),
        "free_at_capture_gb": next(map(float, free), None),
        "capture_took_gb": next(map(float, taken), None),
        "hook": json.loads(hook) if hook else None,
        "mstar_lines": [x for x in lines if "mstar-resources" in x][:30],
        "overflow": next((x for x in lines if "Buffer overflow when allocating" in x), None),
        "sealed_refusals": len({x for x in lines if "WorkspaceSealedError:" in x}),
        "errors": [x for x in lines if "Error" in x or "error" in x][-8:],
        "log_tail": lines[-40:],
    }


def kv_tokens(r: dict[str, Any]) -> int | None:
    """SGLang's count of KV-pool tokens, from its line (None: no line)."""
    found = KV_LINE.search(r.get("kv_line") or "")
    return int(found[1]) if found else None


def workspace_bytes(r: dict[str, Any]) -> int | None:
    """The FlashInfer float workspace bytes the run held: the plugin's, where it served; else the
    buffer SGLang made."""
    hook = r.get("hook") or {}
    plugin = hook.get("plugin") or {}
    if plugin.get("workspace_bytes") and not plugin.get("untouched"):
        return int(plugin["workspace_bytes"])
    reserved = [int(m[1].replace(",", "")) for x in r.get("mstar_lines", [])
                if (m := re.search(r": ([\d,]+) bytes for SGLang's FlashInfer", x))]  # fmt: skip
    if reserved:
        return sum(reserved)
    return hook.get("flashinfer_workspace_bytes")


def growths(r: dict[str, Any]) -> str:
    plugin = (r.get("hook") or {}).get("plugin") or {}
    return str(plugin["growths"]) if "growths" in plugin else "-"


def table(results: dict[str, dict[str, Any]]) -> str:
    head = ("run", "ok", "tokens", "digest", "same tokens", "KV tokens (SGLang's line)",
            "workspace bytes", "growths", "sealed refusals", "start s", "error")  # fmt: skip
    rows = [head]
    for name, r in results.items():
        if name.startswith("calibrate/"):
            continue
        group = name.split("/")[0]
        base = next((b for n, b in results.items() if n.startswith(f"{group}/") and n != name
                     and b.get("tokens")), {})  # fmt: skip
        same = "-"
        if r.get("tokens") and base.get("tokens"):
            same = "yes" if r["tokens"] == base["tokens"] else "NO"
        kv, held = kv_tokens(r), workspace_bytes(r)
        rows.append((
            name, "yes" if r.get("ok") else "no", str(r.get("tokens_out", "-")),
            digest(r["tokens"]) if r.get("tokens") else "-", same,
            f"{kv:,}" if kv is not None else "-", f"{held:,}" if held is not None else "-",
            growths(r), str(r.get("sealed_refusals", "-")), str(r.get("start_s", "-")),
            "-" if r.get("ok") else (r.get("overflow") or r.get("error") or "-")[:120],
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in rows)  # fmt: skip
    return "\n".join(lines)


def kv_cost(results: dict[str, dict[str, Any]]) -> list[str]:
    """For each group run both ways: SGLang's KV-pool tokens as SGLang is and with the plugin,
    and the workspace bytes each held."""
    found = []
    for name, r in results.items():
        group, _, side = name.rpartition("/")
        if side not in ("plugin", "auto"):
            continue
        own = results.get(f"{group}/sglang", {})
        before, after = kv_tokens(own), kv_tokens(r)
        if before is None or after is None:
            continue
        held = [workspace_bytes(x) for x in (own, r)]
        line = (f"{name}: KV tokens as SGLang is {before:,}, with the plugin {after:,} "
                f"({after - before:+,})")  # fmt: skip
        if None not in held:
            line += f"; workspace bytes {held[0]:,} and {held[1]:,}"
        free = [x.get("free_at_capture_gb") for x in (own, r)]
        if None not in free:
            line += f"; free as graph capture begins {free[0]} and {free[1]} GB"
        took = [x.get("capture_took_gb") for x in (own, r)]
        if None not in took:
            line += f"; the capture took {took[0]} and {took[1]} GB"
        found.append(line)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        nargs="*",
        default=list(GROUPS),
        choices=list(GROUPS),
        help="groups to run, each as SGLang is and with the plugin",
    )
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES,
                        help="which runs of each group (default: both)")  # fmt: skip
    parser.add_argument("--budget", type=seconds(math.inf), default=math.inf,
                        help="seconds for all steps: a step that would start later is left "
                        "out")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("sglang-proof"), help="folder of results")
    parser.add_argument("--models", type=Path, default=Path("/tmp/mstar-sglang-models"))
    parser.add_argument("--timeout", type=seconds(DAY), default=300.0,
                        help="seconds a step may take, at most a day")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the steps, start none")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        _run_here(args)
        return
    output_folder(parser, "--out", args.out)
    cases = [c for group in args.cases for c in group_cases(group) if c.side in args.sides]
    steps = plan(cases)
    if args.dry_run:
        for step in steps:
            print(describe(step, args.out))
        return
    if importlib.util.find_spec("sglang") is None:
        parser.error("SGLang is not installed here; run where it is, or --dry-run for the runs")
    args.out.mkdir(parents=True, exist_ok=True)
    args.out = args.out.resolve()
    deadline = time.perf_counter() + args.budget
    results: dict[str, dict[str, Any]] = {}
    for step in steps:
        left = vllm_proof.time_left(step.name, deadline)
        if left is None:
            continue
        timeout = min(args.timeout, left)
        if isinstance(step, Calibration):
            results[step.name] = calibrate(step, args.out, timeout)
        elif step.calibrated and not results.get(step.calibration.name, {}).get("ok"):
            results[step.name] = {"ok": False, "error": f"no {step.calibration.name} file"}
        else:
            results[step.name] = launch(step, args.out, args.models, timeout)
        vllm_proof.write_summary(results, args.out / "sglang_proof.json")
    for name, r in results.items():
        if name.startswith("calibrate/") and r.get("ok"):
            print(f"{name}: {r['path']}: declared_mb {r['declared_mb']}")
    print(table(results))
    print("\n".join(kv_cost(results)))
    print(f"wrote {args.out / 'sglang_proof.json'}")


if __name__ == "__main__":
    run_main(main)
