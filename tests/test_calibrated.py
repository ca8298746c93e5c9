"""A calibrated deployment measured with other inputs than those it runs with says so, once,
naming each input that differs, with the fix."""

from __future__ import annotations

import dataclasses
import logging
import typing

import pytest
from omegaconf import OmegaConf

from mstar_resources import check_calibration
from mstar_resources.calibration.profile import CalibrationProfile, PlanProfile, load_profile
from mstar_resources.calibration.record import (
    NOT_INPUTS,
    Difference,
    Machine,
    StaleCalibration,
    calibration_inputs,
    stale_calibration,
)
from mstar_resources.resolver import resolve

from .conftest import compose_shipped

CALIBRATED = [
    "deepseek-v3-tp8-h200_calibrated",
    "llama3-70b-tp8-h200_calibrated",
    "llama3-8b-h200_calibrated",
]
LLAMA = "llama3-8b-h200_calibrated"
DEEPSEEK = "deepseek-v3-tp8-h200_calibrated"


def stale_fields(stale: StaleCalibration) -> tuple[str, ...]:
    """The dotted names of the inputs that differ."""
    return tuple(difference.field for difference in stale.differences)


def recorded_machine(record: dict) -> Machine:
    return Machine(*(record[f.name] for f in dataclasses.fields(Machine)))


def record_and_inputs(deployment: str, overrides: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """The shipped record, and the inputs of the deployment composed with ``overrides`` on the
    machine the record names."""
    cfg = compose_shipped([f"deployment={deployment}", *overrides])
    record = OmegaConf.to_container(cfg.calibrated)
    assert isinstance(record, dict)
    inputs = calibration_inputs(
        recorded_machine(record), load_profile(cfg.calibration), resolve(cfg.resources, {})
    )
    return record, inputs


@pytest.mark.parametrize("deployment", CALIBRATED)
def test_a_shipped_record_holds_where_and_as_it_was_measured(deployment):
    record, inputs = record_and_inputs(deployment)
    assert stale_calibration(record, inputs) is None  # else every engine running it is warned


VLLM_SIZES = [1, 2, 4, *range(8, 256, 8), 256]
"""The 8B's decode graph batch sizes, vLLM 0.33's for max_num_seqs 256."""

# Overrides of the composed config -> (field, recorded, running) for each that differs
CHANGES = [
    pytest.param(DEEPSEEK, ["calibration.model.head_dim_ckv=256"],
                 [("profile.model.head_dim_ckv", 512, 256)], id="mla-ckv"),
    pytest.param(DEEPSEEK, ["calibration.model.head_dim_kpe=32"],
                 [("profile.model.head_dim_kpe", 64, 32)], id="mla-kpe"),
    pytest.param(DEEPSEEK, ["calibration.plans.mla_decode.backend=fa2"],
                 [("profile.plans.mla_decode.backend", "auto", "fa2")], id="plan-backend"),
    pytest.param(LLAMA, ["calibration.plans.prefill.kind=ragged_prefill"],
                 [("profile.plans.prefill.kind", "paged_prefill", "ragged_prefill")],
                 id="plan-kind"),
    pytest.param(LLAMA, ["calibration.limits.max_model_len=65536"],
                 [("profile.limits.max_model_len", 131072, 65536)], id="limit"),
    pytest.param(LLAMA, ["calibration.cuda_graph_batch_sizes=[1,2,4]"],
                 [("profile.cuda_graph_batch_sizes", VLLM_SIZES, [1, 2, 4])], id="graph-sizes"),
    pytest.param(LLAMA, ["calibration.plans.decode.tensor_cores=false"],
                 [("profile.plans.decode.tensor_cores", True, False)], id="tensor-cores"),
    pytest.param(LLAMA, ["resources.attn.decode.cg_slots=[0]"],
                 [("resources.attn.decode.cg_slots", [0, 1], [0])], id="resource-slots"),
    pytest.param(LLAMA, ["resources.attn.prefill.labels=[prefill,decode]"],
                 [("resources.attn.prefill.labels", ["prefill"], ["prefill", "decode"])],
                 id="resource-labels"),
]  # fmt: skip


MANAGER = ("+resources.vllm.workspace_manager={owner: vllm, labels: [workspace_manager], "
           "cg_slots: [0], declared_mb: 64, int_declared_mb: 0}")  # fmt: skip


def test_vllms_workspace_manager_declared_beside_a_calibration_leaves_it_holding():
    """Calibration does not plan vLLM's WorkspaceManager (vLLM's profile sizes it), so declaring
    its floor in a calibrated deployment, as a refusal of its growth says to, is no new input."""
    record, inputs = record_and_inputs(LLAMA, (MANAGER,))
    assert stale_calibration(record, inputs) is None
    assert "vllm.workspace_manager" not in inputs["resources"]


@pytest.mark.parametrize(("deployment", "overrides", "differences"), CHANGES)
def test_each_input_that_changes_a_need_is_named(deployment, overrides, differences):
    record, inputs = record_and_inputs(deployment, tuple(overrides))
    stale = stale_calibration(record, inputs)
    assert stale is not None
    assert [(d.field, d.recorded, d.running) for d in stale.differences] == differences
    base = deployment.removesuffix("_calibrated")
    assert stale.deployment == base
    for field in stale_fields(stale):
        assert field in str(stale)
    assert str(stale).endswith(
        f"recalibrate with `mstar-resources-calibrate deployment={base}` on this machine, with "
        "the settings in use"
    )
    # The same machine is said once.
    assert "was made on this machine (NVIDIA H200" in str(stale) and "this is" not in str(stale)


@pytest.mark.parametrize(
    "machine_change",
    [
        {"gpu": "NVIDIA H100 80GB HBM3"},
        {"sm_count": 114},
        {"flashinfer": "0.6.7"},
        {"torch": "2.12.0+cu130"},
        {"cuda": "12.8"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_another_machine_is_named_field_by_field(machine_change):
    record, inputs = record_and_inputs(LLAMA)
    stale = stale_calibration(record, {**inputs, **machine_change})
    assert stale is not None
    ((name, value),) = machine_change.items()
    assert stale.differences == (Difference(name, record[name], value),)
    assert str(stale).startswith(
        "deployment llama3-8b-h200's calibration was "
        f"made on {recorded_machine(record)}, and this is "
    )


def test_what_is_not_an_input_is_ignored_and_said_so():
    record, inputs = record_and_inputs(LLAMA)
    assert {"deployment", "date", "margin", "needs", "one_buffer"} == NOT_INPUTS
    changed = {**record, "date": "1999-01-01", "margin": 0.5, "needs": [], "deployment": "x"}
    changed["one_buffer"] = {"need_bytes": 1, "bytes": 1 << 20, "worst": "-"}
    assert stale_calibration(changed, inputs) is None


def test_a_record_in_the_old_single_sentence_form_is_stale():
    record, inputs = record_and_inputs(LLAMA)
    old = {key: value for key, value in record.items() if key not in ("profile", "resources")}
    old["profile"] = "32 q / 8 kv heads, head dim 128, ..."
    stale = stale_calibration(old, inputs)
    assert stale is not None
    assert "profile" in stale_fields(stale) and "profile.model.num_qo_heads" in stale_fields(stale)


def _dataclass_fields(cls: type, prefix: str) -> list[str]:
    names = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            names += _dataclass_fields(hint, f"{prefix}{field.name}.")
        else:
            names.append(f"{prefix}{field.name}")
    return names


def test_every_field_of_the_profile_is_recorded():
    """A field added to the profile's schema is recorded and compared without another change."""
    record, _ = record_and_inputs(LLAMA)
    profile = record["profile"]
    for name in _dataclass_fields(CalibrationProfile, ""):
        node = profile
        for part in name.split("."):
            assert part in node, f"calibrated.profile.{name} is not recorded"
            node = node[part]
    plan_fields = {field.name for field in dataclasses.fields(PlanProfile)}
    for plan in profile["plans"].values():
        assert set(plan) == plan_fields


def running_elsewhere(monkeypatch, **change: object):
    """This process seen as running on the machine of the 8B calibration's record, with
    ``change``: an honest stand-in for the GPU query, which this CPU machine cannot make."""
    record, _ = record_and_inputs(LLAMA)
    elsewhere = dataclasses.replace(recorded_machine(record), **change)
    monkeypatch.setattr(Machine, "here", classmethod(lambda cls, device: elsewhere))
    return compose_shipped([f"deployment={LLAMA}"])


def test_check_calibration_logs_one_warning_and_returns_what_differs(monkeypatch, caplog):
    cfg = running_elsewhere(monkeypatch, flashinfer="0.6.7")
    with caplog.at_level(logging.WARNING, logger="mstar_resources"):
        stale = check_calibration(cfg, "cuda:0")
    assert stale is not None and stale_fields(stale) == ("flashinfer",)
    assert [r.getMessage() for r in caplog.records] == [str(stale)]
    # A deployment that was not calibrated has nothing to check.
    assert check_calibration(compose_shipped(["deployment=llama3-8b-h200"]), "cuda:0") is None


def test_build_pools_reads_only_the_node_it_is_given(monkeypatch, caplog):
    """The same node gives the same pools whatever its parent: the calibration check is asked
    of the root, apart (the apps ask it on a GPU)."""
    from mstar_resources import build_pools

    cfg = running_elsewhere(monkeypatch, gpu="NVIDIA H100 80GB HBM3")
    alone = OmegaConf.create(OmegaConf.to_container(cfg.resources))
    with caplog.at_level(logging.WARNING, logger="mstar_resources"):
        beside = build_pools(cfg.resources, "cuda:0", {})  # allocates nothing until asked
        apart = build_pools(alone, "cuda:0", {})
    assert caplog.records == []
    assert {path: (pool.floor_bytes, pool.serves) for path, pool in beside.items()} == {
        path: (pool.floor_bytes, pool.serves) for path, pool in apart.items()
    }
    with caplog.at_level(logging.WARNING, logger="mstar_resources"):
        check_calibration(cfg, "cuda:0")
    (record,) = caplog.records
    assert "this is NVIDIA H100 80GB HBM3 (132 SMs)" in record.getMessage()
