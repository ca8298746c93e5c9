"""scripts/sglang_proof.py where there is no SGLang: its dry run lists the calibrations and runs in
order with their settings, and its table compares each run's tokens with the other run of its
group and reads SGLang's KV-pool line, the workspace bytes and the plugin's report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.scripts import load_script, run_script


def test_the_dry_run_calibrates_before_the_first_run_of_its_limits_and_starts_none(tmp_path):
    out = tmp_path / "out"
    done = run_script("sglang_proof", "--dry-run", "--out", str(out))
    assert done.returncode == 0, done.stderr
    steps = {line.split(":")[0]: line for line in done.stdout.splitlines()}
    assert list(steps) == [
        "llama/sglang", "calibrate/128", "llama/plugin", "llama/auto", "qwen3/sglang",
        "qwen3/plugin", "qwen3/auto", "large-graph/sglang", "calibrate/512", "large-graph/plugin",
        "large-graph/auto", "prefill-graphs/sglang", "prefill-graphs/plugin", "prefill-graphs/auto",
    ]  # fmt: skip
    assert "disable_prefill_cuda_graph=False" in steps["prefill-graphs/auto"]
    assert "disable_prefill_cuda_graph=True" in steps["llama/auto"]
    folder = out / "calibrated-128-4096-4096" / "deployment"
    sizes = ",".join(map(str, [1, 2, 4, 8, 12, *range(16, 129, 8)]))  # SGLang's, up to 128
    assert steps["calibrate/128"] == (
        "calibrate/128: mstar-resources-calibrate deployment=llama3-8b-h200 "
        "calibration.model.page_size=1 calibration.plans.decode.backend=auto "
        f"calibration.plans.decode.tensor_cores=true calibration.cuda_graph_batch_sizes=[{sizes}] "
        "calibration.limits.max_num_seqs=128 calibration.limits.max_num_batched_tokens=4096 "
        f"calibration.limits.max_model_len=4096 output_dir={folder} progress=false"
    )
    file = folder / "llama3-8b-h200_recalibrated.yaml"  # not the shipped _calibrated
    assert f"MSTAR_RESOURCES_SGLANG={file}, LlamaForCausalLM" in steps["llama/plugin"]
    assert f"MSTAR_RESOURCES_SGLANG={file}, Qwen3ForCausalLM" in steps["qwen3/plugin"]
    assert "MSTAR_RESOURCES_SGLANG=(unset), Qwen3ForCausalLM" in steps["qwen3/sglang"]
    assert "MSTAR_RESOURCES_SGLANG=auto, LlamaForCausalLM" in steps["llama/auto"]
    for name in ("llama/sglang", "qwen3/plugin"):
        assert "attention_backend=flashinfer" in steps[name]
        assert "max_running_requests=128, cuda_graph_max_bs_decode=128" in steps[name]
        assert "context_length=4096" in steps[name] and "chunked_prefill_size=4096" in steps[name]
        assert "115 requests, 67,444 prompt tokens, 18,943 output tokens" in steps[name]
    for name in ("large-graph/sglang", "large-graph/plugin"):
        assert "max_running_requests=512, cuda_graph_max_bs_decode=512" in steps[name]
        assert "LlamaForCausalLM" in steps[name] and "480 requests" in steps[name]
    assert "calibrated-512-4096-4096/deployment" in steps["large-graph/plugin"]
    assert "calibration.limits.max_num_seqs=512" in steps["calibrate/512"]
    assert not out.exists()


def test_sides_and_cases_keep_only_the_named_runs_and_their_calibration():
    done = run_script("sglang_proof", "--dry-run", "--cases", "qwen3", "--sides", "plugin")
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == [
        "calibrate/128",
        "qwen3/plugin",
    ]


@pytest.mark.parametrize(
    "args", [("--cases", "llama3-70b"), ("--sides", "vllm")], ids=["case", "side"]
)
def test_an_unknown_choice_ends_with_argparses_status_2(args):
    done = run_script("sglang_proof", "--dry-run", *args)
    assert done.returncode == 2
    assert args[1] in done.stderr


def test_without_sglang_it_runs_nothing_and_ends_with_status_2(tmp_path):
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here")
    done = run_script("sglang_proof", "--cases", "llama", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "SGLang is not installed here" in done.stderr
    assert not (tmp_path / "out").exists()


KV = "[2026-12-02 09:11:53] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, K size: 1 GB"


def test_the_table_compares_tokens_in_a_group_and_reads_kv_tokens_and_workspaces():
    proof = load_script("sglang_proof")
    same, other = [[1, 2], [3]], [[1, 2], [4]]
    report = {"workspace_bytes": 23 << 20, "growths": 0, "sealed_overflows": 0, "untouched": None}
    results = {
        "llama/sglang": {"ok": True, "tokens": same, "tokens_out": 3, "kv_line": KV.format(8_000),
                         "hook": {"flashinfer_workspace_bytes": 384 << 20, "plugin": None},
                         "sealed_refusals": 0, "start_s": 40.1},
        "llama/plugin": {"ok": True, "tokens": same, "tokens_out": 3, "kv_line": KV.format(7_997),
                         "hook": {"flashinfer_workspace_bytes": 3 << 20, "plugin": report},
                         "sealed_refusals": 0},
        "qwen3/sglang": {"ok": True, "tokens": same, "tokens_out": 3},
        "qwen3/plugin": {"ok": True, "tokens": other, "tokens_out": 3},
        "large-graph/sglang": {"ok": False, "error": "RuntimeError: capture failed",
                               "overflow": "RuntimeError: Buffer overflow when allocating memory "
                               "for batch_prefill_tmp_v", "sealed_refusals": 0},
    }  # fmt: skip
    text = proof.table(results)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[1:]}
    assert rows["llama/plugin"][1:8] == [
        "yes", "3", proof.digest(same), "yes", "7,997", f"{23 << 20:,}", "0",
    ]  # fmt: skip
    assert rows["llama/sglang"][4:7] == ["yes", "8,000", f"{384 << 20:,}"]
    assert rows["qwen3/plugin"][4] == "NO"
    assert rows["large-graph/sglang"][1] == "no"
    assert "Buffer overflow when allocating" in text
    assert proof.kv_cost(results) == [
        f"llama/plugin: KV tokens as SGLang is 8,000, with the plugin 7,997 (-3); workspace bytes "
        f"{384 << 20:,} and {23 << 20:,}"
    ]


def test_a_plugin_that_served_is_read_from_its_lines_where_the_hook_did_not_run():
    """A run whose scheduler stopped before the hook (a capture that failed): the bytes come from
    the lines the plugin logged when it reserved the workspaces."""
    proof = load_script("sglang_proof")
    lines = [
        "[2026-12-02 09:11:52] mstar-resources: attention:prefill: 18,874,368 bytes for SGLang's "
        "FlashInfer prefill wrappers (floor from declared_mb), before SGLang sizes its KV pool",
        "[2026-12-02 09:11:52] mstar-resources: attention:decode:cg0: 5,242,880 bytes for "
        "SGLang's FlashInfer decode wrappers (floor from declared_mb), before SGLang sizes its KV "
        "pool",
        KV.format(7_990),
        "mstar_resources.errors.WorkspaceSealedError: attention:decode:cg0 is sealed ...",
    ]
    found = proof.from_log(lines)
    assert found["sealed_refusals"] == 1 and found["hook"] is None
    assert found["free_at_capture_gb"] is None  # no capture began
    assert proof.kv_tokens(found) == 7_990
    assert proof.workspace_bytes(found) == 18_874_368 + 5_242_880


def test_the_hooks_line_is_read_back_as_json():
    proof = load_script("sglang_proof")
    found = proof.from_log(
        ["noise", proof.HOOK_MARK + ' {"flashinfer_workspace_bytes": 536870912, "plugin": null}']
    )
    assert found["hook"] == {"flashinfer_workspace_bytes": 536870912, "plugin": None}
    assert proof.workspace_bytes(found) == 536870912


def test_a_calibrated_files_floors_are_read_by_resource():
    proof = load_script("sglang_proof")
    text = (Path(__file__).resolve().parents[2] / "conf" / "deployment"
            / "llama3-8b-h200_calibrated.yaml").read_text()  # fmt: skip
    assert proof.declared_mb(text) == {"prefill": 17, "decode": 3}


def test_the_free_memory_as_capture_begins_is_read_both_ways():
    """SGLang makes its own buffer after sizing its KV pool: the KV tokens barely move, the free
    memory at the capture does (the lines of the H200 run, 2026-12-02)."""
    proof = load_script("sglang_proof")
    capture = ("[2026-12-02 11:33:58] Capture target decode CUDA graph begin. backend=full, "
               "num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem={} GB")  # fmt: skip
    own = proof.from_log([KV.format(9_107_604), capture.format("68.60")])
    plugin = proof.from_log([KV.format(9_105_300), capture.format("68.98")])
    assert (own["free_at_capture_gb"], plugin["free_at_capture_gb"]) == (68.6, 68.98)
    (line,) = proof.kv_cost({"llama/sglang": own, "llama/plugin": plugin})
    assert line.startswith(
        "llama/plugin: KV tokens as SGLang is 9,107,604, with the plugin 9,105,300"
    )
    assert line.endswith("; free as graph capture begins 68.6 and 68.98 GB")


def test_what_the_capture_took_is_read_both_ways():
    """The decode wrappers' own int workspaces are taken as SGLang captures (the lines of the
    H200 runs of the large graph batch, 2026-12-02)."""
    proof = load_script("sglang_proof")
    captured = ("[2026-12-02 13:09:43] Capture target decode CUDA graph end. elapsed=32.59 s, "
                "mem usage={} GB, avail mem=68.92 GB.")  # fmt: skip
    own = proof.from_log([KV.format(9_107_604), captured.format("0.59")])
    plugin = proof.from_log([KV.format(9_078_420), captured.format("0.07")])
    (line,) = proof.kv_cost({"large-graph/sglang": own, "large-graph/auto": plugin})
    assert line.startswith("large-graph/auto: KV tokens as SGLang is 9,107,604")
    assert line.endswith("; the capture took 0.59 and 0.07 GB")
