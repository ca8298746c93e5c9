"""A calibrated deployment measured elsewhere than where it runs says so, once, with the fix."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from omegaconf import OmegaConf

from mstar_resources import check_calibration
from mstar_resources.calibration.profile import load_profile
from mstar_resources.calibration.stale import RunningOn, describe_profile, stale_calibration

from ..conftest import compose_shipped

CALIBRATED = ["llama3-8b-h200_calibrated", "llama3-70b-tp8-h200_calibrated"]


def recorded(deployment: str) -> tuple[dict, RunningOn]:
    """The shipped record, and an environment that matches it exactly."""
    cfg = compose_shipped([f"deployment={deployment}"])
    record = OmegaConf.to_container(cfg.calibrated)
    assert isinstance(record, dict)
    same = RunningOn(
        record["gpu"], record["sm_count"], record["flashinfer"], record["torch"],
        describe_profile(load_profile(cfg.calibration)),
    )  # fmt: skip
    return record, same


@pytest.mark.parametrize("deployment", CALIBRATED)
def test_a_shipped_record_matches_its_own_profile_and_where_it_was_measured(deployment):
    record, same = recorded(deployment)
    assert record["profile"] == same.profile  # else every engine running it would be warned
    assert stale_calibration(record, same) is None


# What runs instead -> the fields the warning names
CHANGES = [
    pytest.param({"gpu": "NVIDIA H100 80GB HBM3"}, "gpu", id="another-gpu"),
    pytest.param({"sm_count": 114}, "sm_count", id="fewer-sms"),
    pytest.param({"flashinfer": "0.6.7"}, "flashinfer", id="flashinfer-version"),
    pytest.param({"torch": "2.12.0+cu130"}, "torch", id="torch-version"),
    pytest.param({"flashinfer": "0.6.7", "torch": "2.12.0+cu130"}, "flashinfer, torch",
                 id="both-versions"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "named"), CHANGES)
def test_a_record_from_elsewhere_names_what_was_recorded_what_runs_and_the_fix(change, named):
    record, same = recorded("llama3-8b-h200_calibrated")
    running = dataclasses.replace(same, **change)
    warning = stale_calibration(record, running)
    assert warning is not None
    assert warning.startswith(
        "deployment llama3-8b-h200_calibrated was calibrated on NVIDIA H200 (132 SMs), "
        f"FlashInfer {record['flashinfer']}, torch {record['torch']}, and this is "
    )
    assert f"and this is {running} ({named} differ)" in warning
    assert warning.endswith(
        "recalibrate with `mstar-resources-calibrate deployment=llama3-8b-h200` on this machine"
    )


def test_another_profile_than_the_one_measured_is_stale_too():
    cfg = compose_shipped(
        ["deployment=llama3-8b-h200_calibrated", "calibration.limits.max_num_seqs=512"]
    )
    record, same = recorded("llama3-8b-h200_calibrated")
    running = dataclasses.replace(same, profile=describe_profile(load_profile(cfg.calibration)))
    warning = stale_calibration(record, running)
    assert warning is not None and "and a different profile (profile differ)" in warning


def running_elsewhere(monkeypatch, **change: object):
    """This process seen as running the 8B calibration's record with ``change``: its config."""
    _, same = recorded("llama3-8b-h200_calibrated")
    elsewhere = dataclasses.replace(same, **change)
    monkeypatch.setattr(RunningOn, "here", classmethod(lambda cls, device, profile: elsewhere))
    return compose_shipped(["deployment=llama3-8b-h200_calibrated"])


def test_check_calibration_logs_one_warning_and_returns_it(monkeypatch, caplog):
    cfg = running_elsewhere(monkeypatch, flashinfer="0.6.7")
    with caplog.at_level(logging.WARNING, logger="mstar_resources"):
        warning = check_calibration(cfg, "cuda:0")
    assert warning is not None and "(flashinfer differ)" in warning
    assert [r.getMessage() for r in caplog.records] == [warning]
    # A deployment that was not calibrated has nothing to check.
    assert check_calibration(compose_shipped(["deployment=llama3-8b-h200"]), "cuda:0") is None


def test_build_pools_for_a_gpu_checks_the_deployment_it_came_from(monkeypatch, caplog):
    from mstar_resources import build_pools

    cfg = running_elsewhere(monkeypatch, gpu="NVIDIA H100 80GB HBM3")
    with caplog.at_level(logging.WARNING, logger="mstar_resources"):
        build_pools(cfg.resources, "cpu", {})  # planning on the CPU: nothing to check
        assert caplog.records == []
        build_pools(cfg.resources, "cuda:0", {})  # allocates nothing until asked
    (record,) = caplog.records
    assert "this is NVIDIA H100 80GB HBM3 (132 SMs)" in record.getMessage()
