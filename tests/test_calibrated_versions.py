"""A calibrated deployment composes as measured with the FlashInfer installed, where a file measured
with that version sits in ``flashinfer-<version>/`` beside it (the package's or a --config-dir's):
in the dry run, its Hydra flags, calibration and both plugins alike. With any other FlashInfer the
deployment itself is composed, and its record names the version that differs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mstar_resources import compose
from mstar_resources.apps import dry_run
from mstar_resources.calibration.calibrate import Measured, base_deployment, write_override
from mstar_resources.calibration.profile import load_profile, version_problems
from mstar_resources.calibration.record import Machine, calibrated_floors, stale_record
from mstar_resources.compose import compose_deployment
from mstar_resources.files import calibrated_for, shipped_deployments
from mstar_resources.integrations.sglang import SGLANG
from mstar_resources.integrations.vllm import VLLM
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
    """Compose, and check in the dry run, as if FlashInfer ``version`` were installed (None: none
    is)."""
    for module in (compose, dry_run):
        monkeypatch.setattr(
            module,
            "installed_version",
            lambda name: version if name == "flashinfer-python" else None,
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
    report = json.loads(table.stdout)
    floors = {r["path"]: r["floor_mb"] for r in report["resources"]}
    assert floors["attn.prefill"] == mb
    assert f", FlashInfer {OLDER if version else NEWEST}, " in report["calibrated_on"]
    assert table.stderr == ""  # made with the FlashInfer installed, or none is: nothing to warn
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


def floors_shown(*args: str, cwd: Path) -> dict[str, int]:
    done = run_app(*args, "format=json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return {r["path"]: r["floor_mb"] for r in json.loads(done.stdout)["resources"]}


def test_a_deployment_given_twice_is_the_last_as_measured_here(monkeypatch, config_dir, tmp_path):
    installed(monkeypatch, OLDER)
    at = ("--config-dir", str(config_dir))
    for given in ([f"deployment={MINE}"] * 2, ["deployment=mine", f"deployment={MINE}"]):
        assert floors_shown(*at, *given, cwd=tmp_path)["attn.prefill"] == MB[OLDER]
    # The file composed is the one read within bounds.
    versioned = config_dir / "deployment" / f"flashinfer-{OLDER}" / f"{MINE}.yaml"
    versioned.write_text(versioned.read_text() + "x: &x [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("xabcd", "abcde", strict=True)
    ))  # fmt: skip
    done = run_app(*at, "deployment=mine", f"deployment={MINE}", cwd=tmp_path)
    assert done.returncode == 2 and str(versioned) in done.stderr, done.stderr


def test_a_users_file_named_as_a_shipped_one_is_refused_whichever_is_composed(
    monkeypatch, tmp_path
):
    installed(monkeypatch, OLDER)  # the package's 0.6.14 file would be composed in its place
    name = "llama3-8b-h200_calibrated"
    (tmp_path / "deployment").mkdir()
    (tmp_path / "deployment" / f"{name}.yaml").write_text("# @package _global_\n")
    done = run_app("--config-dir", str(tmp_path), f"deployment={name}", cwd=tmp_path)
    assert done.returncode == 2 and "picks the shipped deployment of that name" in done.stderr
    # A version the package has no file for: the user's own is composed, and not refused.
    installed(monkeypatch, "0.7.2")
    mine = tmp_path / "deployment" / "flashinfer-0.7.2" / f"{name}.yaml"
    mine.parent.mkdir()
    shipped = (SHIPPED / "flashinfer-0.7.2.post1" / f"{name}.yaml").read_text()
    mine.write_text(shipped.replace("flashinfer: 0.7.2.post1\n", "flashinfer: 0.7.2\n"))
    (tmp_path / "deployment" / f"{name}.yaml").unlink()
    cfg = compose_deployment("mstar_resources_vllm", name, tmp_path)
    assert cfg.calibrated.flashinfer == "0.7.2"


def test_a_plugin_setting_given_as_a_path_composes_that_file(monkeypatch, config_dir):
    installed(monkeypatch, OLDER)
    folder = config_dir / "deployment"
    for path, mb in (
        (folder / f"{MINE}.yaml", MB[NEWEST]),
        (folder / f"flashinfer-{OLDER}" / f"{MINE}.yaml", MB[OLDER]),
        (SHIPPED / "llama3-8b-h200_calibrated.yaml", MB[NEWEST]),
        (SHIPPED / f"flashinfer-{OLDER}" / "llama3-8b-h200_calibrated.yaml", MB[OLDER]),
    ):
        for setting in (VLLM, SGLANG):
            records = setting.read({setting.env_var: str(path)}).records
            assert {r.path: r.floor.mb for r in records}["attn.prefill"] == mb, (path, setting)


def test_a_broken_link_where_a_versions_file_would_be_is_named(monkeypatch, config_dir, tmp_path):
    installed(monkeypatch, "0.9.0")
    (config_dir / "deployment" / "flashinfer-0.9.0").mkdir()
    (config_dir / "deployment" / "flashinfer-0.9.0" / f"{MINE}.yaml").symlink_to("gone.yaml")
    done = run_app("--config-dir", str(config_dir), f"deployment={MINE}", cwd=tmp_path)
    assert done.returncode == 2 and "gone.yaml, which does not exist" in done.stderr


def test_calibrating_with_another_flashinfer_keeps_each_versions_file(monkeypatch, config_dir):
    """The second FlashInfer's calibration goes into its folder, the first's kept; calibrating
    with a FlashInfer that has its folder's file replaces that one."""
    folder = config_dir / "deployment"
    (folder / f"flashinfer-{OLDER}" / f"{MINE}.yaml").unlink()
    shipped = compose_deployment("mstar_resources_vllm", "llama3-8b-h200_calibrated")
    needs = [Measured(n.path, n.need_bytes, n.worst, n.method, n.int_need_bytes)
             for n in shipped.calibrated.needs]  # fmt: skip
    written = []
    for version, grown in ((NEWEST, 0), (OLDER, 52 << 20), (OLDER, 60 << 20)):
        bigger = [dataclasses.replace(n, need_bytes=n.need_bytes + grown) for n in needs]
        written.append(write_override("mine", bigger, {"flashinfer": version}, folder, margin=0))
    top, versioned = folder / f"{MINE}.yaml", folder / f"flashinfer-{OLDER}" / f"{MINE}.yaml"
    assert written == [top, versioned, versioned]
    for version, mb in ((NEWEST, 17), (OLDER, 17 + 60)):
        installed(monkeypatch, version)
        cfg = compose_deployment("mstar_resources_vllm", MINE, config_dir)
        assert cfg.calibrated.flashinfer == version
        assert cfg.resources.attn.prefill.declared_mb == mb


def test_the_dry_run_warns_where_the_flashinfer_installed_has_no_calibration(monkeypatch, tmp_path):
    installed(monkeypatch, "0.7.2")  # SGLang 0.5.23's: none is shipped for it
    done = run_app("deployment=glm-4.5-air-h200_calibrated", cwd=tmp_path)
    assert done.returncode == 0
    assert "flashinfer ('0.7.4' recorded, '0.7.2' here)" in done.stderr


def test_a_builds_local_label_is_its_releases_calibration(tmp_path):
    (tmp_path / f"flashinfer-{OLDER}").mkdir()
    (tmp_path / f"flashinfer-{OLDER}" / "x.yaml").write_text("")
    assert calibrated_for("x", f"{OLDER}+cu128", [tmp_path]) == f"flashinfer-{OLDER}/x"
