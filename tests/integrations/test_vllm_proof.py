"""scripts/vllm_proof.py where there is no vLLM: its dry run says what it would run, bad input ends
as argparse ends it, and its table compares each run's tokens with the other runs of its group."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from mstar_resources import resolve
from mstar_resources.files import shipped_deployments
from mstar_resources.units import mb_to_hold
from tests.conftest import compose_shipped
from tests.scripts import load_script, run_script


def test_the_dry_run_lists_every_run_with_its_trace_slice_and_starts_none(tmp_path):
    done = run_script("vllm_proof", "--dry-run", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    runs = {line.split(":")[0]: line for line in done.stdout.splitlines()}
    assert list(runs) == [
        "llama3-8b/vllm", "llama3-8b/plugin", "llama3-8b/plugin-stale", "qwen3.5/vllm",
        "qwen3.5/plugin", "crash/vllm", "crash/plugin", "llama3-8b-v1/vllm",
        "llama3-8b-v1/plugin",
        *(f"{group}/{run}"
          for group in ("xqa", "spec-xqa", "fp8", "fp8-xqa", "eager", "two-groups", "soak")
          for run in ("vllm", "plugin", "plugin-mp", "plugin-planted")
          if run != "plugin-planted" or "xqa" in group),
    ]  # fmt: skip
    assert "num_speculative_tokens (ngram)=2" in runs["spec-xqa/plugin"]
    assert "planted TRT-LLM bytes=8388608" in runs["xqa/plugin-planted"]
    assert "enable_extensible_kv_cache" not in runs["llama3-8b/plugin"]
    assert "MSTAR_RESOURCES_VLLM=(unset)" in runs["llama3-8b/vllm"]
    assert "MSTAR_RESOURCES_VLLM=auto" in runs["qwen3.5/plugin"]
    assert "MSTAR_RESOURCES_VLLM=llama3-8b-h200_calibrated" in runs["llama3-8b/plugin-stale"]
    # 128 trace rows asked for; rows that do not fit the model's length are left out.
    assert "115 requests, 67,444 prompt tokens, 18,943 output tokens" in runs["llama3-8b/vllm"]
    assert "480 requests" in runs["crash/vllm"]
    assert not (tmp_path / "out").exists()


def test_sides_keep_only_the_named_runs_of_each_group(tmp_path):
    done = run_script(
        "vllm_proof", "--dry-run", "--cases", "crash", "llama3-8b-v1", "--sides", "plugin"
    )
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == [
        "crash/plugin",
        "llama3-8b-v1/plugin",
    ]
    refused = run_script("vllm_proof", "--dry-run", "--sides", "plugin-file")
    assert refused.returncode == 2
    assert "--sides" in refused.stderr and "'plugin-file'" in refused.stderr


def test_without_vllm_it_runs_nothing_and_ends_with_status_2(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    done = run_script("vllm_proof", "--cases", "xqa", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "vLLM is not installed here" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_case_ends_with_argparses_status_2():
    done = run_script("vllm_proof", "--cases", "llama3-70b", "--dry-run")
    assert done.returncode == 2
    assert "llama3-70b" in done.stderr


def test_the_table_compares_tokens_within_a_group_and_says_what_failed():
    proof = load_script("vllm_proof")
    same, other = [[1, 2], [3]], [[1, 2], [4]]
    results = {
        "a/vllm": {"ok": True, "tokens": same, "tokens_out": 3, "workspace_bytes": 10},
        "a/plugin": {"ok": True, "tokens": same, "tokens_out": 3, "workspace_bytes": 4,
                     "plugin": {"growths": 0, "sealed_overflows": 0},
                     "kv_cache_lines": ["GPU KV cache size: 1,234 tokens"]},
        "b/vllm": {"ok": True, "tokens": same, "tokens_out": 3, "workspace_bytes": 10},
        "b/plugin": {"ok": True, "tokens": other, "tokens_out": 3, "workspace_bytes": 4},
        "c/vllm": {"ok": False, "error": "RuntimeError: Buffer overflow"},
    }  # fmt: skip
    rows = {line.split()[0]: line.split() for line in proof.table(results).splitlines()[1:]}
    assert rows["a/plugin"][1:5] == ["yes", "3", proof.digest(same), "yes"]
    assert rows["b/plugin"][4] == "NO"
    assert rows["c/vllm"][1] == "no"
    assert "1,234" in proof.table(results)


def test_an_engine_core_in_its_own_process_is_read_from_the_plugins_lines():
    proof = load_script("vllm_proof")
    lines = [
        "(EngineCore pid=9) INFO mstar-resources: vLLM's FlashInfer builder for KV-cache group 0 "
        "(2 layers: 32/8 heads of 128, page 16, KV bfloat16): prefill on flashinfer-native (q "
        "bfloat16), decode on xqa (q bfloat16)",
        "(EngineCore pid=9) INFO mstar-resources: reserved 1,048,576 bytes in 1 FlashInfer "
        "workspaces (MSTAR_RESOURCES_VLLM=auto) and 413,138,944 bytes of vLLM's TRT-LLM workspace",
        "(EngineCore pid=9) INFO mstar-resources: sealed 2 FlashInfer workspaces at 1,048,576 "
        "bytes before vLLM captures CUDA graphs (0 growths before the seal): ...",
    ]
    results = {
        "x/plugin-mp": {"ok": True, "tokens": [[1]], "tokens_out": 1, "mstar_lines": lines,
                        "kv_line": "INFO [kv_cache_utils.py:2177] GPU KV cache size: 5,396,400 "
                        "tokens"},
    }  # fmt: skip
    _, row = proof.table(results).splitlines()
    cells = [c for c in row.split("  ") if c.strip()]
    assert cells[5:8] == ["5,396,400 tokens", "xqa", "1,048,576"]
    assert "captures CUDA graphs" in row


def test_an_auto_runs_floors_become_a_deployment_file_the_plugin_reads(tmp_path):
    """--file-floors: the floors an auto run measured, as a file in a deployment/ folder, which
    the plugin composes to the same floors: float, int, and none for prefill's int workspace."""
    from mstar_resources.integrations.vllm import VLLM

    proof = load_script("vllm_proof")
    auto = {"plugin": {"workspaces": [
        {"name": "attention:prefill", "floor_bytes": 3 << 20},
        {"name": "attention:decode:cg0", "floor_bytes": 106 << 20},
        {"name": "attention:decode:cg0:int", "floor_bytes": 1 << 20},
    ]}}  # fmt: skip
    path = proof.floors_file(auto, tmp_path / "deployment" / "crash.yaml")
    setting = VLLM.read({"MSTAR_RESOURCES_VLLM": str(path)})
    floors = {r.path: (r.floor.mb, r.int_floor.mb, r.floor.source) for r in setting.records}
    assert floors["attn.prefill"] == (3, 0, "declared")
    assert floors["attn.decode"] == (106, 1, "declared")


def test_kv_cost_compares_auto_with_its_floors_as_a_file():
    proof = load_script("vllm_proof")
    line = "GPU KV cache size: {:,} tokens"
    results = {
        "crash/plugin": {"kv_line": line.format(7_084_112)},
        "crash/plugin-file": {"kv_line": line.format(7_090_000)},
        "llama3-8b/plugin": {"kv_line": None},
        "llama3-8b/plugin-file": {"kv_line": line.format(10)},
    }
    assert proof.kv_cost(results) == [
        "crash: KV tokens with auto 7,084,112, with its floors as a file 7,090,000: -0.083%"
    ]


def test_crash_v1_runs_the_crash_configuration_on_vllms_v1_runner():
    proof = load_script("vllm_proof")
    vllm, plugin = proof.crash_cases("crash-v1")
    assert (vllm.name, plugin.name) == ("crash-v1/vllm", "crash-v1/plugin")
    assert vllm.env == plugin.env == proof.V1_RUNNER and plugin.max_num_seqs == 512
    assert proof.crash_cases()[0].env == {}


def test_requests_reach_every_group_but_those_that_serve_their_own_rows():
    proof = load_script("vllm_proof")
    assert {case.requests for case in proof.users_cases("spec-xqa", 40)} == {40}
    shape = proof.shape_of("moe-qwen3.5-122b")
    assert {case.requests for case in proof.shipped_moe_cases(shape, 40)} == {40}
    assert {case.requests for case in proof.users_cases("soak", 40)} == {2000}
    assert {case.requests for case in proof.crash_cases()} == {512}


@pytest.mark.parametrize(
    ("group", "deployment"),
    [("moe-qwen3.5-122b", "qwen3.5-122b-a10b-h200"), ("moe-glm-4.5-air", "glm-4.5-air-h200")],
)
def test_a_shipped_moe_group_runs_its_deployments_attention_at_its_limits(group, deployment):
    """The group that measures a shipped MoE deployment's manager floor runs that deployment's
    attention heads at its calibration limits, vLLM as it is and ``auto``."""
    proof = load_script("vllm_proof")
    calibration = yaml.safe_load((shipped_deployments() / f"{deployment}.yaml").read_text())
    calibration = calibration["calibration"]
    shape = proof.shape_of(group)
    model, limits = calibration["model"], calibration["limits"]
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (
        model["num_qo_heads"],
        model["num_kv_heads"],
        model["head_dim"],
    )
    cases = proof.shipped_moe_cases(shape, 40)
    assert [(case.side, case.plugin) for case in cases] == [("vllm", None), ("plugin", "auto")]
    for case in cases:
        assert case.max_num_seqs == limits["max_num_seqs"]
        assert case.max_num_batched_tokens == limits["max_num_batched_tokens"]


@pytest.mark.parametrize(
    ("group", "held"),
    [("moe", 50_331_648), ("moe-qwen3.5-122b", 805_306_368), ("moe-glm-4.5-air", 2_147_483_648)],
)
def test_the_triton_experts_reading_is_what_vllm_0_34_held(group, held):
    """The reading against runs: what vLLM 0.34.0's WorkspaceManager held at its lock in each MoE
    group on an H100, TritonExperts (docs/vllm.md, "vLLM's WorkspaceManager")."""
    proof = load_script("vllm_proof")
    assert proof.read_manager_bytes(group) == held
    assert proof.read_manager_bytes("llama3-8b") is None


def test_the_shipped_moe_deployment_declares_the_managers_floor_its_experts_take():
    """``qwen3.5-122b-a10b-h200`` (vLLM's plans) declares the floor its experts take at its limits;
    ``glm-4.5-air-h200`` (SGLang's plans, which has no such manager) declares none."""
    proof = load_script("vllm_proof")
    read = proof.read_manager_bytes("moe-qwen3.5-122b")
    tree = compose_shipped(["deployment=qwen3.5-122b-a10b-h200"]).resources
    manager = {r.path: r for r in resolve(tree, {})}["vllm.workspace_manager"]
    assert (manager.owner, manager.labels) == ("vllm", ("workspace_manager",))
    assert manager.cg_slots == (0,)
    assert manager.floor.bytes == mb_to_hold(read) << 20
    assert manager.int_floor.bytes == 0
    glm = resolve(compose_shipped(["deployment=glm-4.5-air-h200"]).resources, {})
    assert [r.path for r in glm] == ["attn.prefill", "attn.decode"]


def test_the_moe_group_declares_the_managers_floor_and_its_lines_say_what_sealed_it(tmp_path):
    proof = load_script("vllm_proof")
    cases = {case.side: case for case in proof.moe_cases(tmp_path, 40)}
    assert list(cases) == ["vllm", "plugin-declared", "plugin-no-room", "plugin"]
    assert {case.requests for case in cases.values()} == {40}
    assert cases["plugin-declared"].planted_manager_growth
    declared = (tmp_path / "deployment" / "moe-plugin-declared.yaml").read_text()
    assert "labels: [workspace_manager]" in declared and "declared_mb: 256" in declared
    seen = {"bytes_before_profile": [256], "bytes_at_seal": [256], "sealed_when": "at capture",
            "growths_refused_after_seal": 1}  # fmt: skip
    results = {
        "moe/vllm": {"workspace_manager": {"slot_bytes": [50_331_648 + 1, 0]}},
        "moe/plugin-declared": {
            "workspace_manager": {"slot_bytes": [256], "planted_growth": "WorkspaceSealedError: x"},
            "plugin": {"workspace_manager": seen},
        },
        "llama3-8b/vllm": {},
    }
    assert proof.manager_lines(results) == [
        "moe/vllm: vLLM's WorkspaceManager [50331649, 0] bytes by slot, as a floor "
        "resources.vllm.workspace_manager.declared_mb=49 (Triton experts as read: 50,331,648 "
        "bytes)",
        "moe/plugin-declared: vLLM's WorkspaceManager [256] bytes by slot; before the profile "
        "[256], at the seal [256] (at capture), growths refused after it 1; planted: "
        "WorkspaceSealedError: x",
    ]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_the_plugin_load_check_says_so_where_vllm_is_not_installed():
    done = run_script("vllm_plugin_loads")
    assert done.returncode == 2
    assert "vLLM is not installed here" in done.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM installed")
def test_the_installed_vllm_loads_the_plugin_and_every_seam_it_has():
    done = run_script("vllm_plugin_loads")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "plugin active: True" in done.stdout
    assert done.stdout.rstrip().endswith(" seams, 0 problems")


def test_a_group_of_vllm_034_runs_where_named_with_its_setting():
    done = run_script("vllm_proof", "--dry-run", "--cases", "extensible-off", "--sides", "plugin")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("extensible-off/plugin: ")
    assert "enable_extensible_kv_cache=False" in done.stdout.splitlines()[0]


def test_each_buffer_is_shown_with_the_allocator_segment_it_lies_in(monkeypatch):
    """What a profile counting free device memory pays: the whole segment around a buffer (a
    buffer in none, e.g. not from torch's allocator, shows 0)."""
    import torch

    proof = load_script("vllm_proof")
    mib = 1 << 20
    segments = [
        {"address": 0x1000_0000, "total_size": 20 * mib, "allocated_size": 9_469_952},
        {"address": 0x2000_0000, "total_size": 18 * mib, "allocated_size": 17 * mib},
    ]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments)
    shown = proof.allocator_segments({
        "attn.trtllm": (0x1000_0000, 9_469_952),
        "attention:prefill": (0x2000_0000 + 512, 17 * mib),
        "elsewhere": (0x3000_0000, 4096),
    })  # fmt: skip
    assert shown["attn.trtllm"] == {
        "bytes": 9_469_952, "segment_bytes": 20 * mib, "segment_allocated_bytes": 9_469_952,
    }  # fmt: skip
    assert shown["attention:prefill"]["segment_bytes"] == 18 * mib
    assert shown["elsewhere"]["segment_bytes"] == 0
