"""A calibrated deployment composes as measured with the FlashInfer installed, where a file measured
with that version sits in ``flashinfer-<version>/`` beside it (the package's or a --config-dir's):
in the dry run, its Hydra flags, calibration and both plugins alike. With any other FlashInfer the
deployment itself is composed, and its record names the version that differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mstar_resources import compose
from mstar_resources.calibration.calibrate import base_deployment
from mstar_resources.calibration.profile import load_profile, version_problems
from mstar_resources.calibration.record import Machine, calibrated_floors, stale_record
from mstar_resources.compose import compose_deployment
from mstar_resources.files import calibrated_for, shipped_deployments
from mstar_resources.resolver import resolve

from .apps import run_app

SHIPPED = shipped_deployments()
PINNED = ("0.6.14", "0.6.18.post1", "0.7.2.post1")
"""The FlashInfer versions vLLM 0.26, 0.30 and 0.33 pin, shipped beside the newest (0.7.4)."""
MINE = "mine_calibrated"
NEWEST, OLDER = "0.7.4", "0.6.14"
MB = {NEWEST: 17, OLDER: 67}
"""The prefill floor of each: 17,436,672 bytes measured with 0.7.4, 69,746,688 with 0.6.14."""


def installed(monkeypatch, version: str | None) -> None:
    """Compose as if FlashInfer ``version`` were installed (None: none is)."""
    monkeypatch.setattr(
        compose, "installed_version", lambda name: version if name == "flashinfer-python" else None
    )


@pytest.fixture
def config_dir(tmp_path) -> Path:
    """A --config-dir with ``mine``, its calibration (0.7.4's) and 0.6.14's beside it, as the
    shipped Llama-3-8B's are (the need of 0.6.14 from docs/calibration.md)."""
    folder = tmp_path / "conf" / "deployment"
    (folder / f"flashinfer-{OLDER}").mkdir(parents=True)
    (folder / "mine.yaml").write_text("# @package _global_\ndefaults:\n- llama3-8b-h200\n")
    shipped = (shipped_deployments() / "llama3-8b-h200_calibrated.yaml").read_text()
    assert "\n- llama3-8b-h200\n" in shipped and "flashinfer: 0.7.4\n" in shipped
    newest = shipped.replace("\n- llama3-8b-h200\n", "\n- mine\n")
    (folder / f"{MINE}.yaml").write_text(newest)
    older = (
        newest.replace("\n- mine\n", "\n- /deployment/mine\n")
        .replace("flashinfer: 0.7.4\n", f"flashinfer: {OLDER}\n")
        .replace("declared_mb: 17\n", f"declared_mb: {MB[OLDER]}\n")
        .replace("need_bytes: 17436672\n", "need_bytes: 69746688\n")
    )
    (folder / f"flashinfer-{OLDER}" / f"{MINE}.yaml").write_text(older)
    return tmp_path / "conf"


@pytest.mark.parametrize("version", [OLDER, NEWEST, "0.9.0", None])
def test_the_plugins_compose_the_installed_flashinfers_calibration(
    monkeypatch, config_dir, version
):
    installed(monkeypatch, version)
    cfg = compose_deployment("mstar_resources_vllm", MINE, config_dir)
    record = OmegaConf.to_container(cfg.calibrated)
    assert isinstance(record, dict)
    chosen = OLDER if version == OLDER else NEWEST
    assert record["flashinfer"] == chosen
    resources = resolve(cfg.resources)
    assert {r.path: r.floor.mb for r in resources}["attn.prefill"] == MB[chosen]
    # Where it was measured, it holds; elsewhere, the warning names the version that differs.
    here = Machine.of({**record, "flashinfer": version or "none"})
    stale = stale_record(record, cfg.calibration, resources, here)
    if version == chosen:
        assert stale is None
    else:
        assert stale is not None
        assert [(d.field, d.recorded, d.running) for d in stale.differences] == [
            ("flashinfer", chosen, version or "none")
        ]


@pytest.mark.parametrize("version", [OLDER, None])
def test_the_dry_run_and_its_hydra_flags_show_the_same_calibration(
    monkeypatch, config_dir, tmp_path, version
):
    installed(monkeypatch, version)
    given = ("--config-dir", str(config_dir), f"deployment={MINE}")
    table = run_app(*given, "format=json", cwd=tmp_path)
    job = run_app(*given, "--cfg", "job", cwd=tmp_path)
    text = run_app(*given, cwd=tmp_path)
    assert (table.returncode, job.returncode, text.returncode) == (0, 0, 0), text.stderr
    # The table says which FlashInfer's calibration it composed.
    assert f", FlashInfer {OLDER if version else NEWEST}, " in text.stdout.splitlines()[-1]
    mb = MB[OLDER if version else NEWEST]
    floors = {r["path"]: r["floor_mb"] for r in json.loads(table.stdout)["resources"]}
    assert floors["attn.prefill"] == mb
    printed = OmegaConf.create(job.stdout)
    assert printed.resources.attn.prefill.declared_mb == mb


def test_a_file_measured_with_another_flashinfer_is_read_within_the_same_bounds(
    monkeypatch, config_dir, tmp_path
):
    installed(monkeypatch, OLDER)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefg", "bcdefgh", strict=True)
    )
    base = config_dir / "deployment" / "mine.yaml"
    base.write_text(base.read_text() + bomb)  # listed as /deployment/mine
    done = run_app("--config-dir", str(config_dir), f"deployment={MINE}", cwd=tmp_path)
    assert done.returncode == 2
    assert "mine.yaml" in done.stderr and "10,000 values" in done.stderr


def test_only_a_file_that_is_there_is_chosen(tmp_path):
    folders = [shipped_deployments(), tmp_path]
    (tmp_path / f"flashinfer-{OLDER}").mkdir()
    (tmp_path / f"flashinfer-{OLDER}" / "x.yaml").write_text("")
    assert calibrated_for("x", OLDER, folders) == f"flashinfer-{OLDER}/x"
    assert calibrated_for("x", NEWEST, folders) == "x"
    assert calibrated_for("x", None, folders) == "x"
    assert calibrated_for("llama3-8b-h200", OLDER, folders) == "llama3-8b-h200"
    assert calibrated_for(f"flashinfer-{OLDER}/x", OLDER, folders) == f"flashinfer-{OLDER}/x"


def test_calibrating_a_version_s_calibration_recalibrates_its_deployment():
    assert base_deployment(f"flashinfer-{OLDER}/llama3-8b-h200_calibrated") == "llama3-8b-h200"


@pytest.mark.parametrize("version", PINNED)
def test_every_shipped_calibration_comes_measured_with_each_pinned_flashinfer(version):
    # All but those the version cannot plan (MLA before 0.7.2), where the newest's composes.
    plannable = []
    for path in sorted(SHIPPED.glob("*_calibrated.yaml")):
        profile = load_profile(compose_deployment("mstar_resources_vllm", path.stem).calibration)
        if not version_problems(profile, version):
            plannable.append(path.stem)
    assert plannable and plannable == sorted(
        path.stem for path in SHIPPED.glob(f"flashinfer-{version}/*.yaml")
    )


@pytest.mark.parametrize(
    "path", sorted(SHIPPED.glob("flashinfer-*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}"
)
def test_a_shipped_calibration_composes_where_its_flashinfer_runs_and_holds_there(
    monkeypatch, path
):
    version = path.parent.name.removeprefix("flashinfer-")
    installed(monkeypatch, version)
    cfg = compose_deployment("mstar_resources_vllm", path.stem)
    record = OmegaConf.to_container(cfg.calibrated)
    assert isinstance(record, dict) and record["flashinfer"] == version
    resources = resolve(cfg.resources)
    # Every attention floor is the record's need, and no input differs where it was measured.
    assert set(calibrated_floors(record, resources)) == {"attn.prefill", "attn.decode"}
    assert stale_record(record, cfg.calibration, resources, Machine.of(record)) is None
