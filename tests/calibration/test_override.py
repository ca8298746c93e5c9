"""The calibrated deployment override: its numbers, and that it composes like any deployment."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mstar_resources import resolve
from mstar_resources.calibration.calibrate import (
    LabelNeed,
    per_resource,
    profile_settings,
    table,
    write_override,
)
from mstar_resources.calibration.measure import Need, Shape
from mstar_resources.calibration.profile import load_profile
from mstar_resources.calibration.record import (
    Machine,
    calibration_inputs,
    declared_mb_for,
    stale_calibration,
)
from mstar_resources.units import MIB

from ..test_calibrated import stale_fields

PROVENANCE = {"gpu": "NVIDIA H200 (132 SMs)", "flashinfer": "0.7.2.post1", "date": "2026-11-29"}


@pytest.mark.parametrize(
    ("need", "margin", "mb"),
    [
        (0, 0.1, 1),  # nothing needed: the smallest floor there is
        (1, 0.1, 1),
        (2_443_776, 0.1, 3),  # 2.56 MiB with the margin
        (2 * MIB, 0.0, 2),
        (2 * MIB, 0.1, 3),
        (10 * MIB, 0.25, 13),
    ],
)
def test_declared_mb_is_the_need_plus_margin_rounded_up(need, margin, mb):
    assert declared_mb_for(need, margin) == mb


def rows_for(records) -> list[LabelNeed]:
    by_path = {r.path: r for r in records}
    return [
        LabelNeed(
            by_path["attn.decode"],
            "decode",
            Need(2_443_776, Shape(64, 1, 8192, True), "workspace_size", int_bytes=21_264),
        ),
        LabelNeed(
            by_path["attn.prefill"],
            "prefill",
            Need(3 * MIB + 5, Shape(1, 16, 8192), "workspace_size", int_bytes=MIB + 1),
        ),
    ]


def engine_config_dir(tmp_path: Path) -> Path:
    """An engine's config folder: the two lines that pull the tree in, and a deployment folder."""
    (tmp_path / "deployment").mkdir()
    (tmp_path / "engine.yaml").write_text(
        "defaults:\n  - resources: default\n  - _self_\n"
        "hydra:\n  searchpath:\n    - pkg://mstar_resources.conf\n"
    )
    return tmp_path


def test_calibrated_override_composes_and_round_trips_its_numbers(tmp_path):
    config_dir = engine_config_dir(tmp_path)
    with initialize_config_dir(str(config_dir), version_base="1.3"):
        base = compose("engine", overrides=["deployment=llama3-8b-h200"])
        rows = rows_for(resolve(base.resources, env={}))
        path = write_override(
            "llama3-8b-h200", per_resource(rows), PROVENANCE, config_dir / "deployment", 0.1
        )
        assert path.name == "llama3-8b-h200_recalibrated.yaml"  # the package ships _calibrated
        cfg = compose("engine", overrides=["deployment=llama3-8b-h200_recalibrated"])
        again = compose(
            "engine",
            overrides=[
                "deployment=llama3-8b-h200_recalibrated",
                "resources.attn.decode.declared_mb=7",
            ],
        )

    text = path.read_text()
    assert text.startswith("# @package _global_\n")
    assert "# gpu: NVIDIA H200 (132 SMs)" in text and "# flashinfer: 0.7.2.post1" in text
    records = {r.path: r for r in resolve(cfg.resources, env={})}
    assert records["attn.decode"].declared_mb == 3
    assert records["attn.prefill"].declared_mb == 4  # 3 MiB + 5 bytes, + 10%
    assert records["attn.decode"].floor.setting == "resources.attn.decode.declared_mb"
    # The int needs, with the margin, in whole MB: 1 and 2 (1 MiB + 1 byte, + 10%).
    assert records["attn.decode"].int_declared_mb == 1
    assert records["attn.prefill"].int_declared_mb == 2
    assert records["attn.prefill"].int_floor.setting == "resources.attn.prefill.int_declared_mb"
    needs = OmegaConf.to_container(cfg.calibrated.needs)
    assert needs == [
        {
            "path": "attn.decode",
            "need_bytes": 2_443_776,
            "worst": "decode: bs=64 q=1 kv=8192 graph",
            "method": "workspace_size",
            "int_need_bytes": 21_264,
        },
        {
            "path": "attn.prefill",
            "need_bytes": 3 * MIB + 5,
            "worst": "prefill: bs=1 q=16 kv=8192",
            "method": "workspace_size",
            "int_need_bytes": MIB + 1,
        },
    ]
    # The base deployment's other settings (its calibration profile) come along.
    assert cfg.calibration == base.calibration
    # And a launch can still override the calibrated value.
    assert again.resources.attn.decode.declared_mb == 7


def test_a_resource_needs_what_its_hungriest_label_needs():
    records = resolve(OmegaConf.create({"attn": {"mixed": {
        "owner": "attention", "labels": ["prefill", "verify"], "cg_slots": [],
    }}}), env={})  # fmt: skip
    rows = [
        LabelNeed(records[0], "prefill", Need(1000, Shape(1, 16, 8192), "workspace_size", (), 900)),
        LabelNeed(records[0], "verify", Need(5000, Shape(8, 4, 8192), "growth", (), 300)),
    ]
    (measured,) = per_resource(rows)
    assert (measured.path, measured.need_bytes, measured.method) == ("attn.mixed", 5000, "growth")
    assert measured.int_need_bytes == 900  # the most of any label's, whichever needs the most float
    assert measured.worst == "verify: bs=8 q=4 kv=8192"
    report = table(rows, 0.1)
    assert "resources.attn.mixed.declared_mb = 1  (need 5,000 bytes + 10%)" in report
    assert f"{512 * MIB - 5000:+,}" in report  # the default floor wastes all but 5,000 bytes
    assert "resources.attn.mixed.int_declared_mb = 1  (int need 900 bytes + 10%)" in report


def test_an_unmeasured_int_need_declares_no_int_floor():
    records = resolve(OmegaConf.create({"mla": {"labels": ["decode"]}}), env={})
    rows = [LabelNeed(records[0], "decode", Need(5000, Shape(8, 1, 8192), "growth"))]
    (measured,) = per_resource(rows)
    assert measured.int_need_bytes is None
    assert "int_declared_mb" not in table(rows)


def test_a_calibration_made_with_profile_settings_composes_the_profile_it_holds_for(tmp_path):
    """Calibrating a deployment for other limits or another engine's plans (settings of
    ``calibration`` on the command line) writes those settings into the file: composed again,
    its record holds there; a composition that changes a limit is told apart, and so is the
    deployment edited since, whose other settings the file leaves to it."""
    config_dir = engine_config_dir(tmp_path)
    mine = config_dir / "deployment" / "mine.yaml"  # a deployment of the user's, shipped's text
    mine.write_text((Path(__file__).parents[2] / "conf/deployment/llama3-8b-h200.yaml").read_text())
    settings = [
        "calibration.plans.decode.tensor_cores=false", "calibration.model.page_size=1",
        "++calibration.limits.max_num_seqs=128", "calibration.cuda_graph_batch_sizes=[1,2,4]",
        "resources.attn.decode.declared_mb=9",
    ]  # fmt: skip
    machine = Machine("NVIDIA H200", 132, "0.6.15.post1", "2.11.0+cu130", "13.0")

    def stale(composed):
        running = load_profile(composed.calibration)
        inputs = calibration_inputs(machine, running, resolve(composed.resources, env={}))
        return stale_calibration(OmegaConf.to_container(composed.calibrated), inputs)

    with initialize_config_dir(str(config_dir), version_base="1.3"):
        base = compose("engine", overrides=["deployment=mine", *settings])
        records = resolve(base.resources, env={})
        profile = load_profile(base.calibration)
        record = {"deployment": "mine", **calibration_inputs(machine, profile, records)}
        given = profile_settings(base, settings)
        assert given == {
            "plans": {"decode": {"tensor_cores": False}},
            "model": {"page_size": 1},
            "limits": {"max_num_seqs": 128},
            "cuda_graph_batch_sizes": [1, 2, 4],
        }
        path = write_override(
            "mine", per_resource(rows_for(records)), record, mine.parent, profile=given
        )
        calibrated = [f"deployment={path.stem}"]
        cfg = compose("engine", overrides=calibrated)
        assert load_profile(cfg.calibration) == profile
        assert stale(cfg) is None
        changed = compose("engine", overrides=[*calibrated, "calibration.limits.max_num_seqs=256"])
        assert stale_fields(stale(changed)) == ("profile.limits.max_num_seqs",)
        # The deployment edited since (its model's head dim): the calibrated file, which set
        # none of its model but the page size, composes the edit, and the record is told apart.
        mine.write_text(mine.read_text().replace("head_dim: 128", "head_dim: 64"))
        edited = compose("engine", overrides=calibrated)
        assert stale_fields(stale(edited)) == ("profile.model.head_dim",)


def test_no_profile_setting_on_the_command_line_writes_none():
    cfg = OmegaConf.create({"calibration": {"cuda_graph_batch_sizes": [1]}, "margin": 0.1})
    assert (
        profile_settings(cfg, ["margin=0.1", "~calibration.cuda_graph_batch_sizes", "device=cuda"])
        is None
    )
