"""What calibration checks before it plans, and how it reports and writes what it measured, on the
CPU. The GPU queries are monkeypatched with stand-ins for a GPU's answers; the measuring itself is
in test_measure.py and test_calibrate_gpu.py, the override's composing in test_override.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mstar_resources import ResourceConfigError, resolve
from mstar_resources.calibration.calibrate import (
    DEFAULT_OUTPUT_DIR,
    LabelNeed,
    base_deployment,
    calibrated_name,
    check_backends,
    check_labels,
    how_to_compose,
    one_buffer,
    per_resource,
    table,
    write_override,
)
from mstar_resources.calibration.measure import Need, Shape
from mstar_resources.calibration.profile import load_profile
from mstar_resources.files import shipped_deployments
from mstar_resources.resolver import ResolvedResource

from ..test_profile import GOOD, dense, with_


def records(tree: dict) -> list[ResolvedResource]:
    return resolve(OmegaConf.create(tree), env={})


# --- which labels can be calibrated --------------------------------------------------------------


@pytest.mark.parametrize(
    ("tree", "match"),
    [
        pytest.param({"attn": {"d": {"labels": ["decode", "verify"]}}},
                     r"add calibration\.plans\.verify \(for resources\.attn\.d\)", id="missing"),
        pytest.param({"attn": {"p": {"labels": ["prompt"], "cg_slots": [0]}}},
                     r"resources\.attn\.p\.cg_slots=\[0\] puts prompt under CUDA graphs, but "
                     r"calibration\.plans\.prompt\.kind=ragged_prefill: only decode, "
                     r"paged_prefill, mla, pod plans are calibrated under graphs",
                     id="graph-ragged-prefill"),
        pytest.param({"attn": {"p": {"labels": ["prefill"], "cg_slots": [0]}}},
                     r"puts the paged_prefill prefill under CUDA graphs, and "
                     r"calibration\.cuda_graph_prefill_tokens is empty",
                     id="graph-prefill-no-tokens"),
        pytest.param({"attn": {"d": {"labels": ["decode"]}},
                      "mla": {"d": {"owner": "mla", "labels": ["decode"]}}},
                     r"plans\.decode would plan resources\.attn\.d \(owner attention\), "
                     r"resources\.mla\.d \(owner mla\) alike", id="one-label-two-owners"),
    ],
)  # fmt: skip
def test_labels_that_cannot_be_calibrated_as_they_run_are_refused(tree, match):
    with pytest.raises(ResourceConfigError, match=match):
        check_labels(records(tree), load_profile(GOOD))


def test_every_label_problem_is_reported_at_once_in_the_order_of_the_checks():
    tree = {
        "attn": {"p": {"labels": ["prefill", "verify"], "cg_slots": [0]}},
        "mla": {"p": {"owner": "mla", "labels": ["prefill"]}},
    }
    with pytest.raises(ResourceConfigError) as raised:
        check_labels(records(tree), load_profile(GOOD))
    (problem,) = raised.value.problems
    assert problem.startswith("cannot calibrate: the profile does not say how these labels")
    found = [problem.index(part) for part in ("plans.verify (for", "puts the paged_prefill prefill",
                                              "plans.prefill would plan")]  # fmt: skip
    assert found == sorted(found)


def test_labels_that_can_be_calibrated_pass():
    tree = {
        "attn": {
            "d": {"labels": ["decode", "mixed"], "cg_slots": [0, 1]},
            "p": {"labels": ["prefill", "prompt"]},
        },
        "mla": {"d": {"owner": "mla", "labels": ["mla_decode"], "cg_slots": [0]}},
    }
    check_labels(records(tree), load_profile(GOOD))


# --- which backends this GPU runs ----------------------------------------------------------------


@pytest.fixture
def a100(monkeypatch):
    """Stand-ins for what torch's GPU queries answer on an A100 (SM80)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA A100")


def test_fa3_is_refused_on_a_gpu_that_is_not_sm90(a100, monkeypatch):
    profile = load_profile(with_("plans.prefill.backend", "fa3"))
    with pytest.raises(
        ResourceConfigError,
        match=r"cannot calibrate on cuda:0 \(NVIDIA A100, SM80\): "
        r"calibration\.plans\.prefill\.backend=fa3 needs an SM90 GPU",
    ):
        check_backends(profile, torch.device("cuda:0"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    check_backends(profile, torch.device("cuda:0"))  # an H100 or H200 runs it


def test_fa2_and_auto_run_on_a_gpu_that_is_not_sm90(a100):
    check_backends(load_profile(GOOD), torch.device("cuda:0"))  # fa2 and auto only


# --- what was measured ---------------------------------------------------------------------------


def measured_rows() -> list[LabelNeed]:
    """A resource whose decode needs nothing, beside one whose prefill refused a shape."""
    by_path = {r.path: r for r in records({"attn": {
        "d": {"labels": ["decode"], "declared_mb": 1},
        "p": {"labels": ["prefill"], "declared_mb": 2},
    }})}  # fmt: skip
    refused = ("bs=8 q=16 kv=1024: too many work items",)
    return [
        LabelNeed(by_path["attn.d"], "decode", Need(0, None, "workspace_size")),
        LabelNeed(
            by_path["attn.p"], "prefill", Need(3_000_000, Shape(1, 16, 4096), "growth", refused)
        ),
    ]


def test_a_need_of_nothing_names_no_shape_and_keeps_the_smallest_floor():
    (decode, prefill) = per_resource(measured_rows())
    assert (decode.path, decode.need_bytes, decode.worst) == ("attn.d", 0, "decode: -")
    assert (prefill.path, prefill.worst, prefill.method) == (
        "attn.p",
        "prefill: bs=1 q=16 kv=4096",
        "growth",
    )
    report = table(measured_rows())
    assert "resources.attn.d.declared_mb = 1  (need 0 bytes + 0%)" in report
    assert "resources.attn.p.declared_mb = 3  (need 3,000,000 bytes + 0%)" in report


def test_the_table_says_which_shapes_flashinfer_refused():
    report = table(measured_rows())
    assert (
        "attn.p/prefill: FlashInfer refused 1 of its shapes (an engine cannot plan them either), "
        "e.g. bs=8 q=16 kv=1024: too many work items"
    ) in report
    assert "attn.d/decode: FlashInfer refused" not in report
    assert f"{2 * 2**20 - 3_000_000:+,}" in report  # prefill's floor falls short


def test_recalibrating_a_calibrated_deployment_rewrites_its_base_s_override(tmp_path):
    """A deployment the package ships calibrated is written as ``<name>_recalibrated`` outside
    the package: a file named as the shipped ``<name>_calibrated`` would be composed as that
    one (Hydra's search path has a --config-dir after the package's configs)."""
    name = base_deployment("llama3-8b-h200_calibrated")
    assert name == base_deployment("llama3-8b-h200_recalibrated") == "llama3-8b-h200"
    path = write_override(name, per_resource(measured_rows()), {"gpu": "NVIDIA A100"}, tmp_path)
    assert path == tmp_path / "llama3-8b-h200_recalibrated.yaml"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert calibrated_name(name, shipped_deployments()) == "llama3-8b-h200_calibrated"
    assert calibrated_name("mine", tmp_path) == "mine_calibrated"  # no shipped one of its name
    written = OmegaConf.load(path)
    assert OmegaConf.to_container(written.resources) == {
        # No int need measured (the wrappers keep their own): none reserved for them.
        "attn": {
            "d": {"declared_mb": 1, "int_declared_mb": 0},
            "p": {"declared_mb": 3, "int_declared_mb": 0},
        }
    }
    assert written.calibrated.gpu == "NVIDIA A100"


def test_overrides_go_under_the_working_directory_by_default_never_the_package():
    assert Path("calibrated", "deployment") == DEFAULT_OUTPUT_DIR
    path = Path("calibrated", "deployment", "x_calibrated.yaml")
    assert how_to_compose(path) == (
        f"use it with --config-dir calibrated deployment=x_calibrated (or list "
        f"file://{Path('calibrated').absolute()} under hydra.searchpath)"
    )


def test_an_override_outside_a_deployment_folder_says_where_it_must_go(tmp_path):
    assert how_to_compose(tmp_path / "x_calibrated.yaml") == (
        "move it into the deployment/ folder of a config dir, then use deployment=x_calibrated"
    )


def test_the_output_folder_is_made_when_the_override_is_written(tmp_path):
    folder = tmp_path / "conf" / "deployment"
    path = write_override("x", per_resource(measured_rows()), {"gpu": "NVIDIA H200"}, folder)
    assert path.parent == folder and path.is_file()
    assert [p.name for p in folder.iterdir()] == ["x_calibrated.yaml"]  # no temporary left


# --- the one buffer engines keep -----------------------------------------------------------------


def test_one_buffer_is_the_largest_single_plan_and_names_both_engines_settings():
    profile = load_profile(dense())
    buffer = one_buffer(measured_rows(), profile)
    assert (buffer.need_bytes, buffer.bytes) == (3_000_000, 3 * 2**20)
    assert buffer.worst == "prefill: bs=1 q=16 kv=4096"
    # vLLM 0.33's own floor: 8,192 tokens x 32 heads x 128 x 16 bytes.
    assert buffer.vllm_formula_bytes == 8192 * 32 * 128 * 16
    report = table(measured_rows(), buffer=buffer)
    lines = [line.strip() for line in report.splitlines()]
    assert f"SGLANG_FLASHINFER_WORKSPACE_SIZE={3 * 2**20}" in lines
    assert f"VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE={3 * 2**20}" in lines
    # vLLM reserves the larger of the setting and its own formula: the report says the figure.
    assert f"{8192 * 32 * 128 * 16:,} bytes" in report
    # SGLang overwrites its setting for some models and modes, and the report says which.
    assert "512 MiB for Qwen2, Qwen3, MiMo and Qwen3-VL models" in report
    assert "MSTAR_RESOURCES_VLLM=" in report


def test_one_buffer_with_a_margin_is_rounded_up_to_whole_mb():
    buffer = one_buffer(measured_rows(), load_profile(GOOD), margin=0.5)
    assert buffer.bytes == 5 * 2**20  # 4.5 million bytes hold in 5 MB


def test_an_mla_deployment_gets_no_vllm_setting():
    profile = load_profile(with_("plans", {"mla_decode": {"kind": "mla"}}))
    report = "\n".join(one_buffer(measured_rows(), profile).advice())
    assert "SGLANG_FLASHINFER_WORKSPACE_SIZE=" in report
    assert "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE" not in report


def test_the_record_keeps_the_one_buffer_size(tmp_path):
    buffer = one_buffer(measured_rows(), load_profile(GOOD))
    path = write_override(
        "x", per_resource(measured_rows()), {"gpu": "NVIDIA H200"}, tmp_path, buffer=buffer
    )
    record = OmegaConf.load(path).calibrated.one_buffer
    assert OmegaConf.to_container(record) == {
        "need_bytes": 3_000_000,
        "bytes": 3 * 2**20,
        "worst": "prefill: bs=1 q=16 kv=4096",
    }


def test_a_fixed_split_under_a_graph_and_a_prefill_graph_without_tokens_are_refused():
    node = with_("plans.decode", {"kind": "decode", "tensor_cores": True, "fixed_split_size": 64})
    tree = {"attn": {"d": {"labels": ["decode"], "cg_slots": [0]}}}
    with pytest.raises(ResourceConfigError, match=r"calibration\.plans\.decode\.fixed_split_size="
                       r"64 under CUDA graphs .* set calibration\.plans\.decode\.disable_split_kv="
                       r"true"):  # fmt: skip
        check_labels(records(tree), load_profile(node))
    node["plans"]["decode"]["disable_split_kv"] = True  # engines' way: no split under graphs
    check_labels(records(tree), load_profile(node))


def test_a_prefill_graph_with_token_counts_can_be_calibrated():
    tree = {"attn": {"p": {"labels": ["prefill"], "cg_slots": [0]}}}
    check_labels(records(tree), load_profile(with_("cuda_graph_prefill_tokens", [256, 512])))


# --- the measuring driver, with the planner stood in for ----------------------------------------


def test_measure_all_refuses_before_any_plan_where_flashinfer_is_missing(monkeypatch):
    import mstar_resources.calibration.calibrate as calibrate

    monkeypatch.setattr("mstar_resources.calibration.profile.installed_flashinfer", lambda: None)
    tree = {"attn": {"decode": {"labels": ["decode"], "cg_slots": [0]}}}
    with pytest.raises(ResourceConfigError, match=r"FlashInfer is not installed"):
        calibrate.measure_all(records(tree), load_profile(GOOD), torch.device("cpu"), False)


def test_measure_all_gives_a_row_per_resource_and_label_from_the_planner(monkeypatch):
    """What the driver does around the planner (which needs a GPU and FlashInfer, and is tested
    on one): its checks first, every label of every resource planned over its shapes, one row
    each, in tree order, the graph kinds' shapes for a resource with graph slots."""
    import mstar_resources.calibration.calibrate as calibrate
    import mstar_resources.calibration.measure as measure

    asked: list[tuple[str, int]] = []

    class StandInPlanner:
        def __init__(self, profile, device):
            self.device = device

        def need(self, plan, shapes, progress=None):
            asked.append((plan.kind.value, len(shapes)))
            progress.update(len(shapes))
            return Need(bytes=1000 * len(asked), worst=shapes[-1], method="growth", int_bytes=64)

    monkeypatch.setattr(measure, "Planner", StandInPlanner)
    monkeypatch.setattr(calibrate, "check_flashinfer", lambda profile: None)
    monkeypatch.setattr(calibrate, "check_backends", lambda profile, device: None)
    tree = {"attn": {"prefill": {"labels": ["prefill"]},
                     "decode": {"labels": ["decode"], "cg_slots": [0]}}}  # fmt: skip
    rows = calibrate.measure_all(records(tree), load_profile(GOOD), torch.device("cpu"), False)
    assert [(row.resource.path, row.label, row.need.bytes) for row in rows] == [
        ("attn.prefill", "prefill", 1000), ("attn.decode", "decode", 2000)
    ]  # fmt: skip
    assert [kind for kind, _ in asked] == ["paged_prefill", "decode"]
    assert all(count > 0 for _, count in asked)
    with pytest.raises(ResourceConfigError, match=r"add calibration\.plans\.verify"):
        calibrate.measure_all(
            records({"attn": {"d": {"labels": ["verify"]}}}), load_profile(GOOD),
            torch.device("cpu"), False,
        )  # fmt: skip
