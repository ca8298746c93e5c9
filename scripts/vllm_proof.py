"""The vLLM plugin in real vLLM: the same generation with and without it, side by side.

    python scripts/vllm_proof.py                      # both shapes, then the crash case
    python scripts/vllm_proof.py --cases llama3-8b    # one shape
    python scripts/vllm_proof.py --dry-run            # what it would run, without vLLM

For each attention shape (2 layers of Llama-3-8B's 32 query / 8 KV heads of dim 128, and of the
Qwen3.5-class 32 / 2 of dim 256; random weights, saved locally, loaded with ``load_format=dummy``),
vLLM runs offline with the FlashInfer backend and CUDA graphs (full decode graphs) on prompts of
token ids whose prompt and output lengths are a slice of a public trace, greedy, once as it is and
once with ``MSTAR_RESOURCES_VLLM=auto``. The crash case is the Qwen3.5-class shape with
``max_num_seqs=512`` and few batched tokens, so vLLM's buffer stays at its 394 MiB floor: as it is,
with the plugin, and with ``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE`` raised to the plugin's measured
need. Each run is a process of its own (``--run``), with vLLM's engine in it
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the plugin's report and vLLM's buffers can be read.

It prints one table and writes ``vllm_proof.json`` (``--out``): per run the generated tokens'
digest, vLLM's KV-cache line, the workspace bytes, the growths and sealed refusals, the time to
start, and the error that ended a run that failed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import hashlib
import importlib.util
import itertools
import json
import logging
import math
import os
import random
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mstar_resources.files import write_whole  # noqa: E402
from mstar_resources.units import mb_to_hold, round_up  # noqa: E402

from _args import DAY, count, output_folder, run_main, seconds  # noqa: E402

TRACE = ROOT / "scripts" / "data" / "azure-conv-2023-first-2000.csv"
"""Prompt and output lengths of a public trace (scripts/data/README.md)."""
VOCAB = 1024
MAX_OUTPUT = 256
"""Output lengths of the trace are capped here, so a run takes seconds."""


@dataclass(frozen=True)
class Shape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    """A Qwen3-architecture model whose first layer attends a sliding window of this many tokens
    and whose second attends all: two KV-cache groups in vLLM."""
    layers: int = 2
    experts: int = 0
    """A Qwen3-MoE model of this many experts in every layer: vLLM's MoE kernels take their
    scratch from its WorkspaceManager."""
    experts_per_token: int = 4
    hidden: int = 512
    moe_intermediate: int = 512


SHAPES = {
    "llama3-8b": Shape("llama3-8b", 32, 8, 128),
    "qwen3.5": Shape("qwen3.5", 32, 2, 256),
}
TWO_GROUPS = Shape("two-groups", 32, 8, 128, sliding_window=256)
MOE = Shape("moe", 32, 8, 128, layers=3, experts=16)
SHIPPED_MOE = {
    Shape("moe-qwen3.5-122b", 32, 2, 256, layers=1, experts=256, experts_per_token=8,
          hidden=3072, moe_intermediate=1024): (512, 8192),
    Shape("moe-glm-4.5-air", 96, 8, 128, layers=1, experts=128, experts_per_token=8,
          hidden=4096, moe_intermediate=1408): (256, 16384),
}  # fmt: skip
"""One layer of the attention and routed experts of each shipped MoE deployment's model, with that
deployment's limits (max_num_seqs, max_num_batched_tokens): Qwen3.5-122B-A10B (hidden 3,072; 256
experts, 8 a token, 1,024 wide) for ``qwen3.5-122b-a10b-h200``, GLM-4.5-Air (hidden 4,096; 128
experts, 8 a token, 1,408 wide) for ``glm-4.5-air-h200``. What vLLM's WorkspaceManager takes
depends on the MoE layer's widths and the batched tokens, not on the layer count (the layers take
turns with one buffer; shared experts and dense layers take none of it, and 0.34's Gated DeltaNet
prefill checkpoints, which Qwen3.5's layers would take in prefix caching's align mode, are not in
this model)."""


def triton_experts_bytes(shape: Shape, batched_tokens: int) -> int:
    """What vLLM's WorkspaceManager takes for ``shape``'s experts on Triton (what vLLM 0.33 and
    0.34 pick on one Hopper GPU for bf16 and 128-block FP8 experts), read in their wheels: one
    ``get_simultaneous`` of ``TritonExperts.workspace_shapes`` at every batched token, in bf16,
    each view aligned to 256 bytes (``fused_moe/modular_kernel.py``, ``v1/worker/workspace.py``)."""
    width, hidden, tokens = shape.moe_intermediate, shape.hidden, batched_tokens
    views = (tokens * shape.experts_per_token * max(width, hidden),  # and the output, M x hidden
             tokens * shape.experts_per_token * max(2 * width, hidden))  # fmt: skip
    return sum(round_up(2 * n, 256) for n in views)


def read_manager_bytes(group: str) -> int | None:
    """:func:`triton_experts_bytes` of a MoE group's model at its batched tokens; None: no MoE."""
    if group == MOE.name:
        return triton_experts_bytes(MOE, Case.max_num_batched_tokens)
    return next((triton_experts_bytes(s, tokens) for s, (_, tokens) in SHIPPED_MOE.items()
                 if s.name == group), None)  # fmt: skip


DEPTHS = {
    "llama3-8b-3l": Shape("llama3-8b-3l", 32, 8, 128, layers=3),
    "llama3-8b-16l": Shape("llama3-8b-16l", 32, 8, 128, layers=16),
}
"""Llama 3 8B's attention at 3 and 16 layers: ``scripts/bench_vllm.py``'s models."""


def shape_of(name: str) -> Shape:
    others = (TWO_GROUPS, MOE, *SHIPPED_MOE)
    return {**SHAPES, **DEPTHS, **{shape.name: shape for shape in others}}[name]


@dataclass(frozen=True)
class Case:
    """One vLLM run."""

    name: str
    shape: str
    plugin: str | None
    """``MSTAR_RESOURCES_VLLM``'s value, or None: vLLM as it is."""
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 4096
    max_model_len: int = 4096
    requests: int = 128
    buffer_bytes: int | None = None
    """``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE``, where set."""
    env: dict[str, str] = field(default_factory=dict)
    kv_cache_dtype: str = "auto"
    eager: bool = False
    """``enforce_eager``: no CUDA graph, no torch.compile."""
    max_capture: int | None = None
    """vLLM's ``max_cudagraph_capture_size``: larger decode batches run eagerly."""
    long_every: int = 0
    """Every n-th prompt as long as ``max_model_len`` lets it, and the trace's rows repeated (other
    ids) up to ``requests`` (0: the trace's rows that fit, as they are)."""
    in_process: bool = True
    """The engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the tokens and
    the plugin's report can be read; False: vLLM's default, its own process (the log is read)."""
    generations: int = 1
    """How many times the prompts are generated; the time is the last one's (the first also pays
    for what runs once per engine)."""
    speculative_tokens: int = 0
    """ngram speculative decoding with this many draft tokens a step (0: none)."""
    planted_trtllm_bytes: int | None = None
    """The TRT-LLM workspace planted at this many bytes in place of the plugin's bound: its check
    must refuse the launches past it before they run."""
    extensible_kv_cache: bool | None = None
    """vLLM 0.34's ``enable_extensible_kv_cache`` (None: vLLM's default, on for CUDA from 0.34;
    earlier releases have no such setting)."""
    planted_manager_growth: bool = False
    """After generating, vLLM's WorkspaceManager is asked for one byte more than its slot holds:
    sealed, the plugin must refuse it naming the setting."""

    @property
    def side(self) -> str:
        """What the run is of its group: ``vllm``, ``plugin``, ``plugin-mp``..."""
        return self.name.split("/")[-1]

    def settings(self) -> str:
        """What this run sets beside the prompts, as the dry run prints it."""
        engine = {"shape": self.shape, "max_num_seqs": self.max_num_seqs,
                  "num_speculative_tokens (ngram)": self.speculative_tokens or None,
                  "enable_extensible_kv_cache": self.extensible_kv_cache,
                  "planted TRT-LLM bytes": self.planted_trtllm_bytes,
                  "max_num_batched_tokens": self.max_num_batched_tokens,
                  "max_model_len": self.max_model_len, "kv_cache_dtype": self.kv_cache_dtype,
                  "enforce_eager": self.eager, "max_cudagraph_capture_size": self.max_capture,
                  "engine core in this process": self.in_process}  # fmt: skip
        env = dict(self.env)
        if self.buffer_bytes is not None:
            env["VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"] = str(self.buffer_bytes)
        shown = [f"{k}={v}" for k, v in engine.items() if v is not None]
        return ", ".join(shown + [f"{k}={v}" for k, v in env.items()])


SIDES = ("vllm", "plugin", "plugin-mp", "plugin-stale", "plugin-planted", "vllm-raised",
         "plugin-declared", "plugin-no-room")  # fmt: skip
"""The runs a group can have (``--sides``); ``plugin-file`` follows ``plugin``
(``--file-floors``)."""


V1_RUNNER = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
"""vLLM 0.26 runs a dense model on its V2 model runner by default; this selects V1."""


STALE_FLOORS = "llama3-8b-h200_calibrated"
"""A deployment calibrated on FlashInfer 0.7.4 (decode floor 3 MB), run on vLLM 0.26's 0.6.14:
its sealed decode workspace must refuse the larger graph plans, naming the setting."""


def shape_cases(shape: str, requests: int) -> list[Case]:
    """``shape`` as vLLM runs it and with the plugin; ``<shape>-v1``: on vLLM's V1 model runner."""
    group, env = shape, {}
    if shape.endswith("-v1"):
        shape, env = shape.removesuffix("-v1"), V1_RUNNER
    cases = [
        Case(f"{group}/vllm", shape, None, requests=requests, env=env),
        Case(f"{group}/plugin", shape, "auto", requests=requests, env=env),
    ]
    if group == "llama3-8b":
        cases.append(Case(f"{group}/plugin-stale", shape, STALE_FLOORS, requests=requests))
    return cases


CRASH = {"shape": "qwen3.5", "max_num_seqs": 512, "max_num_batched_tokens": 1024, "requests": 512}
"""vLLM's formula stays under its 394 MiB floor: 1,024 tokens x 32 heads x 256 x 16 = 128 MiB."""


XQA = {"VLLM_HAS_FLASHINFER_CUBIN": "1"}
"""vLLM's own switch that makes ``has_nvidia_artifactory()`` true (FlashInfer's cubins present): on
an H200 its builders then decode with TRT-LLM's XQA kernel, which FlashInfer builds from its
sources; without a network that check is false and decode stays on FlashInfer's wrappers."""

SOAK = {"requests": 2000, "max_num_seqs": 256, "max_capture": 128, "max_model_len": 4096,
        "max_num_batched_tokens": 2048, "long_every": 10}  # fmt: skip
"""2,000 requests, one in ten of ``max_model_len``, under chunked prefill (2,048 tokens a step),
up to 256 running where the largest decode graph holds 128."""

USERS_CASES: dict[str, dict[str, Any]] = {
    "xqa": {"env": XQA},
    "spec-xqa": {"env": XQA, "speculative_tokens": 2},
    "fp8": {"kv_cache_dtype": "fp8"},
    "fp8-xqa": {"kv_cache_dtype": "fp8", "env": XQA},
    "extensible-off": {"extensible_kv_cache": False},
    "eager": {"eager": True},
    "two-groups": {"shape": TWO_GROUPS.name},
    "soak": SOAK,
}
"""The configurations vLLM's users run (llama3-8b's shape unless named): each as vLLM runs it,
with the plugin, and with the plugin and the engine core in its own process."""

FROM_0_34 = ("extensible-off",)
"""Groups whose setting vLLM has from 0.34 only: run where named, not by default."""


PLANTED_TRTLLM_BYTES = 8 << 20
"""XQA's semaphores alone: every launch that splits a sequence needs more."""


def users_cases(group: str, requests: int) -> list[Case]:
    """As vLLM runs it, with the plugin, with the engine core in its own process; where vLLM
    decodes on XQA, also with the TRT-LLM workspace planted too small. ``requests`` trace rows,
    unless the group names its own (``soak``)."""
    settings = {"shape": "llama3-8b", "requests": requests, **USERS_CASES[group]}
    cases = [
        Case(f"{group}/vllm", plugin=None, **settings),
        Case(f"{group}/plugin", plugin="auto", **settings),
        Case(f"{group}/plugin-mp", plugin="auto", in_process=False, **settings),
    ]
    if settings.get("env") == XQA:
        cases.append(Case(f"{group}/plugin-planted", plugin="auto",
                          planted_trtllm_bytes=PLANTED_TRTLLM_BYTES, **settings))  # fmt: skip
    return cases


MANAGER_MB = 256
"""The floor the MoE group's deployment declares for vLLM's WorkspaceManager."""


def moe_cases(folder: Path, requests: int) -> list[Case]:
    """A 3-layer Qwen3-MoE as vLLM runs it, with the plugin's ``auto``, and with deployments (in
    ``folder``) that declare the WorkspaceManager's floor: ``MANAGER_MB``, then a floor past what
    the GPU holds (the start must end with the plugin's paragraph)."""
    files = {}
    for side, mb in (("plugin-declared", MANAGER_MB), ("plugin-no-room", 1 << 20)):
        files[side] = folder / "deployment" / f"moe-{side}.yaml"
        files[side].parent.mkdir(parents=True, exist_ok=True)
        files[side].write_text(
            "# @package _global_\ndefaults:\n  - llama3-8b-h200\n  - _self_\nresources:\n"
            "  vllm:\n    workspace_manager: {owner: vllm, labels: [workspace_manager], "
            f"cg_slots: [0], declared_mb: {mb}, int_declared_mb: 0}}\n"
        )
    return [
        Case("moe/vllm", "moe", None, requests=requests),
        Case("moe/plugin-declared", "moe", str(files["plugin-declared"].resolve()),
             requests=requests, planted_manager_growth=True),
        Case("moe/plugin-no-room", "moe", str(files["plugin-no-room"].resolve()),
             requests=requests),
        Case("moe/plugin", "moe", "auto", requests=requests),
    ]  # fmt: skip


def shipped_moe_cases(shape: Shape, requests: int) -> list[Case]:
    """One layer of a shipped MoE deployment's model at its limits (:data:`SHIPPED_MOE`), as vLLM
    runs it and with ``auto``: what vLLM's WorkspaceManager holds at its lock, the floor that
    deployment needs."""
    seqs, tokens = SHIPPED_MOE[shape]
    return [
        Case(f"{shape.name}/{side}", shape.name, plugin, max_num_seqs=seqs,
             max_num_batched_tokens=tokens, requests=requests)
        for side, plugin in (("vllm", None), ("plugin", "auto"))
    ]  # fmt: skip


def crash_cases(group: str = "crash") -> list[Case]:
    """The public crash's configuration; ``crash-v1``: on vLLM's V1 model runner."""
    env = V1_RUNNER if group.endswith("-v1") else {}
    return [
        Case(f"{group}/vllm", plugin=None, env=env, **CRASH),  # type: ignore[arg-type]
        Case(f"{group}/plugin", plugin="auto", env=env, **CRASH),  # type: ignore[arg-type]
    ]


def floors_file(auto: dict[str, Any], path: Path) -> Path:
    """A deployment file of the floors an ``auto`` run measured, float and int (0 where a role
    has no int workspace: its wrappers keep their own), for the run that checks that ``auto``
    costs the KV cache what it holds."""
    floors: dict[str, dict[str, int]] = {}
    for workspace in (auto.get("plugin") or {}).get("workspaces", []):
        _, role, *rest = workspace["name"].split(":")
        key = "int_declared_mb" if rest[-1:] == ["int"] else "declared_mb"
        floors.setdefault(role, {"int_declared_mb": 0})[key] = workspace["floor_bytes"] >> 20
    lines = ["# @package _global_", "resources:", "  attn:"]
    for role, floor in floors.items():
        lines += [f"    {role}:", *(f"      {key}: {mb}" for key, mb in sorted(floor.items()))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def kv_cost(results: dict[str, dict[str, Any]]) -> list[str]:
    """For each group run with ``auto`` and with its floors as a file: KV tokens both ways."""
    found = []
    for name, r in results.items():
        if not name.endswith("/plugin-file"):
            continue
        group = name.removesuffix("/plugin-file")
        auto, file = kv_count(results.get(f"{group}/plugin", {})), kv_count(r)
        if auto and file:
            found.append(f"{group}: KV tokens with auto {auto:,}, with its floors as a file "
                         f"{file:,}: {auto / file - 1:+.3%}")  # fmt: skip
    return found


def kv_count(r: dict[str, Any]) -> int | None:
    """vLLM's count of KV-cache tokens, as a number (None: no line)."""
    digits = _kv_tokens(r).split(" ")[0].replace(",", "")
    return int(digits) if digits.isdigit() else None


# -- one run, in a process of its own ------------------------------------------------------------


INIT_STD = 0.05
"""The weights' standard deviation: large enough that attention decides the tokens. vLLM's dummy
loader draws every weight within +-1e-3, where a model emits one cycle of tokens whatever its
attention computes (seen on the H200: both shapes gave the same tokens), so it could not show a
workspace that corrupts attention."""


def build_model(shape: Shape, folder: Path) -> Path:
    """A Llama-architecture model of ``shape``'s attention and layers, random weights (seeded),
    saved with its config: nothing is downloaded."""
    path = folder / f"tiny-{shape.name}"
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    common = dict(
        vocab_size=VOCAB, hidden_size=shape.hidden, intermediate_size=1024,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, max_position_embeddings=8192, tie_word_embeddings=False,
        initializer_range=INIT_STD,
    )  # fmt: skip
    torch.manual_seed(0)
    if shape.experts:
        moe = Qwen3MoeConfig(
            **common, num_experts=shape.experts, num_experts_per_tok=shape.experts_per_token,
            moe_intermediate_size=shape.moe_intermediate, decoder_sparse_step=1,
        )  # fmt: skip
        model = Qwen3MoeForCausalLM(moe).to(torch.bfloat16)
    elif shape.sliding_window is None:
        model = LlamaForCausalLM(LlamaConfig(**common)).to(torch.bfloat16)
    else:
        config = Qwen3Config(
            **common, use_sliding_window=True, sliding_window=shape.sliding_window,
            max_window_layers=common["num_hidden_layers"],  # vLLM asserts it when interleaved
            layer_types=["sliding_attention", "full_attention"],
        )  # fmt: skip
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return path


def trace_requests(max_model_len: int, rows: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) of the trace's first ``rows`` rows, as an engine serves
    them: a prompt of ``max_model_len`` tokens or more is left out, an output cut to end there and
    capped at ``MAX_OUTPUT``. The trace holds lengths only: each prompt's ids are drawn from
    ``random.Random`` seeded by the next 64 bits of ``random.Random(0)``, in the file's order."""
    with TRACE.open(newline="") as file:
        lengths = [(int(row["ContextTokens"]), int(row["GeneratedTokens"]))
                   for row in itertools.islice(csv.DictReader(file), rows)]  # fmt: skip
    seeds = random.Random(0)
    found = []
    for prompt_len, output_len in lengths:
        if prompt_len < max_model_len:
            ids = random.Random(seeds.getrandbits(64)).choices(range(VOCAB), k=prompt_len)
            found.append((ids, min(output_len, max_model_len - prompt_len, MAX_OUTPUT)))
    return found


def prompts(case: Case) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) for each request: lengths from the trace's first rows;
    every ``long_every``-th prompt as long as ``max_model_len`` lets it, seeded ids."""
    longest = case.max_model_len if case.long_every else min(case.max_model_len, 2048)
    found = trace_requests(longest, case.requests)
    if case.long_every:
        draw = random.Random(1)
        # The trace file's rows that fit, then their lengths again with other ids, up to the count.
        for i in range(case.requests - len(found)):
            prompt, out = found[i]
            found.append(([draw.randrange(VOCAB) for _ in prompt], out))
        for i in range(0, len(found), case.long_every):
            out = found[i][1]
            found[i] = ([draw.randrange(VOCAB) for _ in range(case.max_model_len - out)], out)
    return found


class _KVLine(logging.Handler):
    """Keeps vLLM's own line on its KV cache's size."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "GPU KV cache size" in message:
            self.lines.append(message)


def _vllm_buffers() -> dict[int, int]:
    """vLLM's own FlashInfer buffers as its builders make them: by address, bytes."""
    import vllm.v1.attention.backends.flashinfer as backend

    made: dict[int, int] = {}
    own = backend.FlashInferMetadataBuilder._get_workspace_buffer

    def recorded(self: Any) -> Any:
        buffer = own(self)
        made[buffer.data_ptr()] = buffer.numel()
        return buffer

    backend.FlashInferMetadataBuilder._get_workspace_buffer = recorded
    own_trtllm = backend._get_trtllm_workspace_buffer

    def recorded_trtllm() -> Any:
        buffer = own_trtllm()
        made[buffer.data_ptr()] = buffer.numel()
        return buffer

    backend._get_trtllm_workspace_buffer = recorded_trtllm
    return made


class _PlanClock:
    """The time vLLM's decode plans take inside FlashInfer's plan (``fast_plan_decode``) and as
    vLLM's builder calls them (through the plugin's ``plan_through`` where it serves), in the
    same process, plan by plan: their difference is what the plugin adds to each plan, free of the
    noise between runs. Without the plugin the difference is the clock's own cost."""

    def __init__(self) -> None:
        import vllm.v1.attention.backends.flashinfer as backend

        self.backend = backend
        self.spans: dict[str, list[int]] = {}
        """By what was timed, each call's nanoseconds."""
        backend.fast_plan_decode = self._timed(backend.fast_plan_decode, "inner")

    def _timed(self, call: Any, name: str) -> Any:
        spans = self.spans.setdefault(name, [])
        clock = time.perf_counter_ns

        @functools.wraps(call)
        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = clock()
            try:
                return call(*args, **kwargs)
            finally:
                spans.append(clock() - begin)

        timed.timed_as = (name, call)  # type: ignore[attr-defined]
        return timed

    def around_the_plugin(self) -> None:
        """Once an engine is built (the plugin has put its plan in place where it serves the
        engine, and vLLM's own back where it does not): time the plan as the builder calls it."""
        call = self.backend.fast_plan_decode
        name, timed = getattr(call, "timed_as", (None, None))
        if name == "outer":  # an earlier engine's, still in place
            call = timed
        self.backend.fast_plan_decode = self._timed(call, "outer")

    def reset(self) -> None:
        for spans in self.spans.values():
            spans.clear()

    def report(self, generate_s: float) -> dict[str, Any]:
        inner, outer = self.spans["inner"], self.spans.get("outer", [])
        plans = len(outer)
        # Nested calls end inner first: the k-th outer span holds the k-th inner one.
        added = [o - i for o, i in zip(outer, inner, strict=False)]
        us = 1e-3
        return {
            "decode_plans": plans,
            "flashinfer_plan_us": round(sum(inner) / max(len(inner), 1) * us, 2),
            "added_per_plan_us": round(sum(added) / max(plans, 1) * us, 2),
            "added_median_us": round(statistics.median(added) * us, 2) if added else None,
            "added_p90_us": round(_quantile(added, 0.9) * us, 2) if added else None,
            "added_of_generate": round(sum(added) * 1e-9 / generate_s, 5),
        }


def _quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _GcClock:
    """Python's garbage collections during a generation: how many, and the time they took."""

    def __init__(self) -> None:
        import gc

        self.collections = 0
        self.total_ns = 0
        self._begin = 0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._begin = time.perf_counter_ns()
        else:
            self.collections += 1
            self.total_ns += time.perf_counter_ns() - self._begin

    def reset(self) -> None:
        self.collections, self.total_ns = 0, 0

    def report(self) -> dict[str, Any]:
        """What it counted, and it stops counting (engines in turn have a clock each)."""
        import gc

        gc.callbacks.remove(self._callback)
        return {"gc_collections": self.collections, "gc_ms": round(self.total_ns / 1e6, 2)}


def _stolen_s() -> float:
    """Seconds the hypervisor has run other machines on this one's CPUs (all CPUs together; the
    ``steal`` column of ``/proc/stat``), 0.0 where the system does not say."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run(case: Case, models: Path, clock: _PlanClock | None = None) -> dict[str, Any]:
    """One vLLM engine: start it, generate, say what it held, and shut it down. ``clock``: the
    process's decode-plan clock, set around the plugin already (engines one after another in one
    process, :func:`run_in_turn`); None: this run's own."""
    made = _vllm_buffers() if case.plugin is None else {}
    clock = clock or _PlanClock()
    collections = _GcClock()
    from vllm import LLM, SamplingParams
    from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode

    handler = _KVLine()  # after vLLM's import, which configures its logger
    logging.getLogger("vllm").addHandler(handler)

    requests = prompts(case)
    if case.planted_trtllm_bytes is not None:
        from mstar_resources.integrations.vllm import plans as vllm_plans

        planted = (case.planted_trtllm_bytes, f"planted at {case.planted_trtllm_bytes:,} bytes")
        vllm_plans.trtllm_workspace_bound = lambda *args, **kwargs: planted
    optional: dict[str, Any] = {}  # settings passed only where the case sets them
    if case.extensible_kv_cache is not None:
        optional["enable_extensible_kv_cache"] = case.extensible_kv_cache
    from vllm.engine.arg_utils import EngineArgs

    if "enable_cutedsl_warmup" in EngineArgs.__dataclass_fields__:
        # 0.34 compiles CuTe DSL GEMMs at start (both sides); none touches attention's scratch
        optional["enable_cutedsl_warmup"] = False
    if case.speculative_tokens:
        optional["speculative_config"] = {
            "method": "ngram", "num_speculative_tokens": case.speculative_tokens,
        }  # fmt: skip
    start = time.perf_counter()
    shape = shape_of(case.shape)
    # Full CUDA graphs of the decode batches, where FlashInfer's workspace is captured; no
    # torch.compile (it costs minutes a shape and does not touch the workspace).
    graphs = CompilationConfig(
        mode=CompilationMode.NONE, cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY,
        max_cudagraph_capture_size=case.max_capture,
    )  # fmt: skip
    llm = LLM(
        model=str(build_model(shape, models)),
        skip_tokenizer_init=True, dtype="bfloat16", seed=0,
        attention_backend="FLASHINFER", max_model_len=case.max_model_len,
        max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
        gpu_memory_utilization=0.3, enable_flashinfer_autotune=False,
        kv_cache_dtype=case.kv_cache_dtype, enforce_eager=case.eager,
        **({} if case.eager else {"compilation_config": graphs}), **optional,
    )  # fmt: skip
    started = time.perf_counter() - start
    clock.around_the_plugin()
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
        for _, n in requests
    ]
    times, cpu_times, stolen = [], [], []
    for _ in range(case.generations):
        clock.reset()
        collections.reset()
        steal, cpu = _stolen_s(), time.process_time()
        begin = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], params)
        times.append(time.perf_counter() - begin)
        cpu_times.append(time.process_time() - cpu)
        stolen.append(_stolen_s() - steal)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    config = llm.llm_engine.vllm_config
    result: dict[str, Any] = {
        "start_s": round(started, 1),
        "kv_cache_lines": handler.lines,
        "num_gpu_blocks": config.cache_config.num_gpu_blocks,
        "graph_sizes": config.compilation_config.cudagraph_capture_sizes,
        "tokens": tokens,
        "tokens_out": sum(len(t) for t in tokens),
        # The first generation warms up; the others' median is the figure.
        "generate_s": round(statistics.median(times[1:] or times), 3),
        "generate_each_s": [round(t, 3) for t in times],
        # The process's CPU time, and the time the hypervisor gave this machine's CPUs to others
        # (all CPUs together), during each generation: how loud the host was.
        "generate_cpu_s": [round(t, 3) for t in cpu_times],
        "host_steal_s": [round(t, 3) for t in stolen],
        "decode_plan_clock": clock.report(times[-1]),
        "gc": collections.report(),
    }
    manager = _workspace_manager(case.planted_manager_growth)
    if manager:
        result["workspace_manager"] = manager
    from mstar_resources.integrations import vllm as plugin

    # With the engine core in its own process, the plugin served that one: its log says what.
    workspaces = plugin.active() if case.in_process else None
    if workspaces is not None and case.plugin is not None:
        result["plugin"] = workspaces.report()
        result["workspace_bytes"] = workspaces.held_bytes
        held = [w for pool in workspaces.pools.values() for w in pool.workspaces().values()]
        tensors = {w.name: w.tensor for w in held}
        tensors.update({f"{w.name} (int)": w.int_workspace.tensor for w in held if w.int_workspace})
        if (trtllm := getattr(workspaces, "trtllm_workspace", None)) is not None:
            tensors["attn.trtllm"] = trtllm.tensor
        result["segments"] = allocator_segments(
            {name: (t.data_ptr(), t.numel() * t.element_size()) for name, t in tensors.items()}
        )
    elif case.plugin is None:
        result["workspace_bytes"] = sum(made.values())
        result["vllm_buffers"] = sorted(made.values())
        result["segments"] = allocator_segments(
            {f"vLLM's at {a:#x}": (a, n) for a, n in made.items()}
        )
        if workspaces is not None:
            result["plugin_untouched"] = workspaces.untouched
    logging.getLogger("vllm").removeHandler(handler)
    llm.llm_engine.engine_core.shutdown()  # in this process: its memory goes with it
    return result


def allocator_segments(buffers: dict[str, tuple[int, int]]) -> dict[str, dict[str, int]]:
    """For each buffer (its address and bytes), the segment of torch's caching allocator it lies
    in: a profile that counts free device memory (vLLM 0.34's) pays the whole segment, which for a
    request of 1 to 10 MiB is 20 MiB unless a cached block held it."""
    import torch

    segments = torch.cuda.memory_snapshot()
    found = {}
    for name, (address, nbytes) in buffers.items():
        within = (s for s in segments if s["address"] <= address < s["address"] + s["total_size"])
        segment = next(within, None)
        found[name] = {
            "bytes": nbytes,
            "segment_bytes": segment["total_size"] if segment else 0,
            "segment_allocated_bytes": segment["allocated_size"] if segment else 0,
        }
    return found


def _workspace_manager(planted: bool) -> dict[str, Any]:
    """vLLM's WorkspaceManager after generating: each slot's bytes, and where ``planted``, what a
    growth of one byte past slot 0 ended with (the manager is locked after capture)."""
    import torch
    from vllm.v1.worker import workspace

    if not workspace.is_workspace_manager_initialized():
        return {}
    manager = workspace.current_workspace_manager()
    slots = [0 if t is None else t.numel() for t in manager._current_workspaces]
    found: dict[str, Any] = {"slot_bytes": slots, "locked": manager.is_locked()}
    if planted:
        try:
            manager.get_simultaneous(((slots[0] + 1,), torch.uint8))
            found["planted_growth"] = "grown: nothing refused it"
        except Exception as error:
            found["planted_growth"] = f"{type(error).__name__}: {error}"
    return found


def run_in_turn(cases: list[Case], models: Path, out: Path) -> None:
    """``cases`` one after another in this process, each engine shut down and its memory freed
    before the next starts (as vLLM's own tests run engines in turn): the plugin, loaded as vLLM
    loads it with its setting set, serves the engines whose case has it, and leaves the others
    as vLLM makes them (it reads the setting again as each engine starts). Each case's result is
    written to ``out`` as it ends."""
    clock = _PlanClock()  # FlashInfer's plan timed inside the plugin's wrapper, which comes next
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.plugins import load_general_plugins

    os.environ[PLUGIN_SETTING] = AUTO_SETTING
    load_general_plugins()
    results: dict[str, Any] = {}
    for case in cases:
        os.environ[PLUGIN_SETTING] = case.plugin or ""
        try:
            results[case.name] = {"ok": True, **run(case, models, clock)}
        except BaseException as error:  # the run's outcome, a crash included, is the measurement
            results[case.name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        cleanup_dist_env_and_memory()
        out.write_text(json.dumps(results))


PLUGIN_SETTING = "MSTAR_RESOURCES_VLLM"
AUTO_SETTING = "auto"


def _run_here(args: argparse.Namespace) -> None:
    case = Case(**json.loads(args.run))
    out = Path(args.result)
    try:
        result = {"ok": True, **run(case, Path(args.models))}
    except BaseException as error:  # the run's outcome, a crash included, is the measurement
        traceback.print_exc()  # into the run's log
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    out.write_text(json.dumps(result))


# -- the side-by-side ----------------------------------------------------------------------------


def launch(case: Case, out: Path, models: Path, timeout: float) -> dict[str, Any]:
    """``case`` in a process of its own; its result, with the tail of its log."""
    result_path = out / f"{case.name.replace('/', '-')}.json"
    env = _environment(case, case.plugin)
    arguments = ["--run", json.dumps(asdict(case)), "--result", str(result_path)]
    command = _this_script(arguments, models)
    lines, wall_s, _ = run_logged(command, env, result_path.with_suffix(".log"), timeout)
    result: dict[str, Any] = {"ok": False, "error": f"no result within {timeout:.0f} s"}
    if result_path.exists():
        result = json.loads(result_path.read_text())
    result.update(_from_log(lines), wall_s=wall_s)
    print(f"{case.name}: {'ok' if result['ok'] else result['error']} ({wall_s} s)",
          flush=True)  # fmt: skip
    return result


def launch_in_turn(
    cases: list[Case], out: Path, models: Path, timeout: float
) -> dict[str, dict[str, Any]]:
    """``cases`` one after another in one process (:func:`run_in_turn`; their ``env`` the
    first's); each one's result. A case the process did not reach has none."""
    result_path = out / f"{cases[0].name.split('/')[0]}-in-turn.json"
    env = _environment(cases[0], AUTO_SETTING)
    arguments = ["--in-turn", json.dumps([asdict(c) for c in cases]), "--result", str(result_path)]
    command = _this_script(arguments, models)
    lines, wall_s, _ = run_logged(command, env, result_path.with_suffix(".log"), timeout)
    results = json.loads(result_path.read_text()) if result_path.exists() else {}
    for name, result in results.items():
        print(f"{name}: {'ok' if result['ok'] else result['error']}", flush=True)
    print(f"{len(results)} of {len(cases)} engines in one process ({wall_s} s)", flush=True)
    if len(results) < len(cases):
        print("\n".join(lines[-15:]), flush=True)
    return results


def _environment(case: Case, setting: str | None) -> dict[str, str]:
    """A run's environment: the engine core in this process or not, vLLM's own sampler,
    ``case.env``, and the plugin's setting (None: unset) and vLLM's buffer size as the case has
    them."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if case.in_process else "1",
           **case.env}  # fmt: skip
    # Greedy decoding on both sides: vLLM's own sampler, not FlashInfer's, whose JIT build takes
    # minutes on a host without its cache.
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.pop(PLUGIN_SETTING, None)
    env.pop("VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE", None)
    if setting is not None:
        env[PLUGIN_SETTING] = setting
    if case.buffer_bytes is not None:
        env["VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"] = str(case.buffer_bytes)
    return env


def time_left(name: str, deadline: float) -> float | None:
    """Seconds before ``deadline`` (``time.perf_counter``'s) for step ``name``; None, said on
    stdout, where less than a minute is left to start it."""
    left = deadline - time.perf_counter()
    if left < 60:
        print(f"{name}: left out, {left:.0f} s of the budget left", flush=True)
        return None
    return left


def run_logged(
    command: list[str], env: dict[str, str], log_path: Path, timeout: float,
    cwd: Path | None = None,
) -> tuple[list[str], float, int | None]:  # fmt: skip
    """``command`` in a process of its own (in ``cwd``), its output in ``log_path``: the log's
    lines, seconds, and its exit status (None: it ran past ``timeout`` and was killed)."""
    begin = time.perf_counter()
    status: int | None = None
    with log_path.open("w") as log, contextlib.suppress(subprocess.TimeoutExpired):
        status = subprocess.run(
            command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
        ).returncode
    lines = log_path.read_text(errors="replace").splitlines()
    return lines, round(time.perf_counter() - begin, 1), status


def _this_script(arguments: list[str], models: Path) -> list[str]:
    return [sys.executable, __file__, *arguments, "--models", str(models)]


def _from_log(lines: list[str]) -> dict[str, Any]:
    """What a run's log says: its tail, the plugin's lines, vLLM's KV-cache line, errors."""
    return {
        "log_tail": lines[-40:],
        "mstar_lines": [line for line in lines if "mstar-resources" in line][:30],
        "kv_line": next((line for line in lines if "GPU KV cache size" in line), None),
        "errors": [line for line in lines if "Error" in line or "error" in line][-8:],
    }


def digest(tokens: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:12]


def _kv_tokens(r: dict[str, Any]) -> str:
    """vLLM's own count of KV-cache tokens, from its line (``GPU KV cache size: N tokens``)."""
    lines = [*r.get("kv_cache_lines", []), r.get("kv_line") or ""]
    line = next((x for x in lines if "GPU KV cache size" in x), "")
    return line.split("GPU KV cache size:")[-1].strip() if line else "-"


def _decode_kernel(r: dict[str, Any]) -> str:
    """The kernel the plugin found vLLM decodes with, from its report or its log lines."""
    planned = (r.get("plugin") or {}).get("builders_planned") or []
    if planned:
        return ",".join(sorted({p["kernels"]["decode"] for p in planned}))
    found = {line.split("decode on ")[1].split()[0] for line in r.get("mstar_lines", [])
             if "decode on " in line}  # fmt: skip
    return ",".join(sorted(found)) or "-"


def _reserved_line(r: dict[str, Any]) -> str:
    """The bytes the plugin's log says it reserved (an engine core in its own process)."""
    line = next((x for x in r.get("mstar_lines", []) if "mstar-resources: reserved " in x), "")
    return line.split("mstar-resources: reserved ")[1].split()[0] if line else "-"


def manager_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    """vLLM's WorkspaceManager in each run that has one: its slots' bytes after generating (vLLM's
    own: as the floor that holds them), what the plugin saw of it, and what a planted growth past
    the seal ended with."""
    found = []
    for name, r in results.items():
        held, seen = r.get("workspace_manager"), (r.get("plugin") or {}).get("workspace_manager")
        if not held:
            continue
        line = f"{name}: vLLM's WorkspaceManager {held['slot_bytes']} bytes by slot"
        if not seen and (most := max(held["slot_bytes"])):  # vLLM's own: the floor it needs
            line += f", as a floor resources.vllm.workspace_manager.declared_mb={mb_to_hold(most)}"
            if (read := read_manager_bytes(name.partition("/")[0])) is not None:
                line += f" (Triton experts as read: {read:,} bytes)"
        if seen:
            line += (f"; before the profile {seen['bytes_before_profile']}, at the seal "
                     f"{seen['bytes_at_seal']} ({seen['sealed_when']}), growths refused after it "
                     f"{seen['growths_refused_after_seal']}")  # fmt: skip
        found.append(line + (f"; planted: {held['planted_growth']}" if "planted_growth" in held
                             else ""))  # fmt: skip
    return found


def table(results: dict[str, dict[str, Any]]) -> str:
    head = ("run", "ok", "tokens", "digest", "same tokens", "KV cache (vLLM's line)",
            "decode on", "workspace bytes", "TRT-LLM bytes", "launches checked/refused",
            "growths", "sealed refusals",
            "sealed before", "start s", "generate s")  # fmt: skip
    rows = [head]
    for name, r in results.items():
        group = name.split("/")[0]
        base = next((b for n, b in results.items() if n.startswith(f"{group}/") and n != name
                     and b.get("tokens")), {})  # fmt: skip
        same = "-"
        if r.get("tokens") and base.get("tokens"):
            same = "yes" if r["tokens"] == base["tokens"] else "NO"
        plugin = r.get("plugin") or {}
        sealed = plugin.get("sealed_before") or next(
            (line.split(" before vLLM ")[1].split(" (")[0] for line in r.get("mstar_lines", [])
             if "sealed" in line and " before vLLM " in line), "-"
        )  # fmt: skip
        rows.append((
            name, "yes" if r.get("ok") else "no", str(r.get("tokens_out", "-")),
            digest(r["tokens"]) if r.get("tokens") else "-", same, _kv_tokens(r),
            _decode_kernel(r),
            f"{r['workspace_bytes']:,}" if "workspace_bytes" in r else _reserved_line(r),
            f"{plugin['trtllm_workspace_bytes']:,}" if "trtllm_workspace_bytes" in plugin
            else "-",
            f"{plugin['trtllm_launches_checked']:,}/{plugin['trtllm_launches_refused']:,}"
            if "trtllm_launches_checked" in plugin else "-",
            str(plugin.get("growths", "-")), str(plugin.get("sealed_overflows", "-")), sealed,
            str(r.get("start_s", "-")), str(r.get("generate_s", "-")),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    choices = [*SHAPES, *(f"{s}-v1" for s in SHAPES), "crash", "crash-v1", *USERS_CASES, "moe",
               *(shape.name for shape in SHIPPED_MOE)]  # fmt: skip
    default = [*SHAPES, "crash", "llama3-8b-v1", *(c for c in USERS_CASES if c not in FROM_0_34)]
    parser.add_argument("--cases", nargs="*", default=default, choices=choices,
                        help="shapes to run (-v1: on vLLM's V1 model runner, to 0.33), the crash "
                        "case, and the configurations vLLM's users run "
                        f"({', '.join(USERS_CASES)}; {', '.join(FROM_0_34)} from vLLM 0.34, "
                        "named only)")  # fmt: skip
    parser.add_argument(
        "--budget",
        type=seconds(math.inf),
        default=math.inf,
        help="seconds for all runs: a run that would start later is left out",
    )
    parser.add_argument("--requests", type=count(1 << 16), default=128,
                        help="trace rows each group serves (the crash and soak groups serve "
                        "their own: 512 and 2,000)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("vllm-proof"), help="folder of results")
    parser.add_argument("--models", type=Path, default=Path("/tmp/mstar-vllm-models"),
                        help="folder the random-weight models are saved in")  # fmt: skip
    parser.add_argument("--timeout", type=seconds(DAY), default=400.0,
                        help="seconds a run may take, at most a day")  # fmt: skip
    parser.add_argument("--file-floors", nargs="*", default=[], metavar="GROUP",
                        help="in these groups (crash, llama3-8b...), after the run with the "
                        "plugin's auto, one with the floors it measured as a deployment file: "
                        "their KV tokens must agree")  # fmt: skip
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES,
                        help="which runs of each group: vLLM as it is, with the plugin, with a "
                        "stale calibration, the crash's vLLM with its buffer raised (default: "
                        "all)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the runs, start none")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--in-turn", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        _run_here(args)
        return
    output_folder(parser, "--out", args.out)
    if args.in_turn:
        cases = [Case(**c) for c in json.loads(args.in_turn)]
        run_in_turn(cases, Path(args.models), Path(args.result))
        return
    order: list[Case] = []
    for name in args.cases:
        if name.startswith("crash"):
            order += crash_cases(name)
        elif name == "moe":
            order += moe_cases(args.out, args.requests)
        elif name in {shape.name for shape in SHIPPED_MOE}:
            order += shipped_moe_cases(shape_of(name), args.requests)
        elif name in USERS_CASES:
            order += users_cases(name, args.requests)
        else:
            order += shape_cases(name, args.requests)
    order = [case for case in order if case.side in args.sides]
    if args.dry_run:
        for case in order:
            lengths = prompts(case)
            print(f"{case.name}: MSTAR_RESOURCES_VLLM={case.plugin or '(unset)'}, "
                  f"{len(lengths)} requests, {sum(len(p) for p, _ in lengths):,} prompt tokens, "
                  f"{sum(n for _, n in lengths):,} output tokens; {case.settings()}")  # fmt: skip
        return
    if importlib.util.find_spec("vllm") is None:
        parser.error("vLLM is not installed here; run where it is, or --dry-run for the runs")
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.budget
    results: dict[str, dict[str, Any]] = {}
    for case in order:
        left = time_left(case.name, deadline)
        if left is None:
            continue
        results[case.name] = launch(case, args.out, args.models, min(args.timeout, left))
        if case.name == "crash/plugin" and "vllm-raised" in args.sides:
            _crash_raised(results, args, deadline)
        auto = results[case.name]
        group = case.name.split("/")[0]
        if (
            group in args.file_floors
            and case.plugin == "auto"
            and case.in_process
            and auto.get("ok")
        ):
            path = floors_file(auto, args.out / "deployment" / f"{group}.yaml")
            file = replace(case, name=case.name.replace("/plugin", "/plugin-file"),
                           plugin=str(path.resolve()))  # fmt: skip
            left = deadline - time.perf_counter()
            if left >= 60:
                results[file.name] = launch(file, args.out, args.models, min(args.timeout, left))
        write_summary(results, args.out / "vllm_proof.json")
    print(table(results))
    print("\n".join([*kv_cost(results), *manager_lines(results)]))
    shapes = [results.get(f"{s}/vllm", {}).get("tokens") for s in SHAPES]
    if all(shapes):
        print(f"the two shapes generate different tokens: {shapes[0] != shapes[1]}")
    print(f"wrote {args.out / 'vllm_proof.json'}")


def _crash_raised(results: dict[str, dict[str, Any]], args: argparse.Namespace,
                  deadline: float) -> None:  # fmt: skip
    """vLLM as it is, its buffer raised to what the plugin measured: vLLM's one buffer must hold
    the largest plan, i.e. the largest of the plugin's workspaces."""
    need = (results["crash/plugin"].get("plugin") or {}).get("workspaces") or []
    left = deadline - time.perf_counter()
    if not need or left < 60:
        return
    one_buffer = mb_to_hold(max(w["bytes"] for w in need)) * (1 << 20)
    raised = replace(crash_cases()[0], name="crash/vllm-raised", buffer_bytes=one_buffer)
    results[raised.name] = launch(raised, args.out, args.models, min(args.timeout, left))
    results[raised.name]["buffer_bytes"] = one_buffer


def write_summary(results: dict[str, dict[str, Any]], path: Path) -> None:
    """``results`` as JSON in ``path``, each run's tokens as their digest."""
    summary = {
        name: {k: v for k, v in r.items() if k != "tokens"}
        | {"digest": digest(r["tokens"]) if r.get("tokens") else None}
        for name, r in results.items()
    }
    write_whole(path, json.dumps(summary, indent=1))


if __name__ == "__main__":
    run_main(main)
