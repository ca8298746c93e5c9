"""docs/own-deployment.md, followed as a user follows it: its YAML files written where their first
comment says, its commands run in the page's order from the folder that holds ``my-conf/``, each
with the floors the page promises, through the dry run and through both plugins' settings.
Calibration's GPU step is the one thing not run: its writer writes the file where the app writes
it, with figures of its own."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from mstar_resources.calibration.calibrate import (
    LabelNeed,
    per_resource,
    users_deployment_folder,
    write_override,
)
from mstar_resources.calibration.measure import Need, Shape
from mstar_resources.calibration.profile import load_profile
from mstar_resources.calibration.record import Machine, calibration_inputs
from mstar_resources.compose import compose_deployment
from mstar_resources.errors import ResourceConfigError
from mstar_resources.integrations.sglang import SGLANG
from mstar_resources.integrations.vllm import VLLM
from mstar_resources.resolver import resolve
from mstar_resources.units import MIB

from .apps import run_app
from .test_app_inputs import CALIBRATE, assert_one_paragraph

PAGE = Path(__file__).parents[1] / "docs" / "own-deployment.md"
SETTINGS = {"MSTAR_RESOURCES_VLLM": VLLM, "MSTAR_RESOURCES_SGLANG": SGLANG}
MACHINE = Machine("NVIDIA H200", 132, "0.7.4", "2.11.0+cu130", "13.0")
NEEDS_MB = {"attn.prefill": 17, "attn.decode": 3}
"""What the stand-in for calibration's GPU step measured, in MB."""


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), re.S)


def commands() -> list[str]:
    """The page's commands, in order, each without its trailing comment."""
    lines = (line for block in blocks("bash") for line in block.splitlines())
    return [line.partition("  #")[0].strip() for line in lines if line.strip()]


def write_the_pages_files(folder: Path) -> dict[str, Path]:
    """Each YAML block, at the path its second line names; by deployment name."""
    written = {}
    for body in blocks("yaml"):
        (named,) = re.findall(r"^# (my-conf/deployment/\S+\.yaml):", body, re.M)
        path = folder / named
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        written[path.stem] = path
    return written


def composed(folder: Path, deployment: str):
    """``deployment`` of ``folder/my-conf``, composed as the plugins compose it."""
    config_dir = folder / "my-conf"
    return compose_deployment("mstar_resources_vllm", deployment, config_dir)


def calibrate_on_the_cpu(folder: Path, deployment: str, searchpath: list[str]) -> Path:
    """What ``mstar-resources-calibrate`` writes after its GPU step: its writer's file, in the
    folder it picks, with ``NEEDS_MB``."""
    root = composed(folder, deployment)
    records = resolve(root.resources, env={})
    by_path = {record.path: record for record in records}
    rows = [
        LabelNeed(by_path[path], path.rpartition(".")[2],
                  Need(mb * MIB, Shape(1, 1, 1024), "workspace_size"))
        for path, mb in NEEDS_MB.items()
    ]  # fmt: skip
    inputs = calibration_inputs(MACHINE, load_profile(root.calibration), records)
    record = {"deployment": deployment, **inputs}
    output_dir = users_deployment_folder(deployment, searchpath)
    assert output_dir is not None
    return write_override(deployment, per_resource(rows), record, output_dir, margin=0.0)


def floors_of(done) -> dict[str, int]:
    assert done.returncode == 0, done.stderr
    return {r["path"]: r["floor_mb"] for r in json.loads(done.stdout)["resources"]}


def test_the_page_s_commands_run_in_order_with_the_floors_it_promises(tmp_path, monkeypatch):
    files = write_the_pages_files(tmp_path)
    assert sorted(files) == ["mine", "mistral-7b-h200"]
    load_profile(composed(tmp_path, "mistral-7b-h200").calibration)  # the profile is whole
    expected = {"mine": {"attn.prefill": 256, "attn.decode": 160},
                "mistral-7b-h200": {"attn.prefill": 256, "attn.decode": 128},
                "mine_calibrated": NEEDS_MB}  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    ran = []
    for command in commands():
        words = shlex.split(command.replace("$PWD", str(tmp_path)))
        deployment = next((w.partition("=")[2] for w in words if w.startswith("deployment=")), "")
        if words[0] == "mstar-resources":
            done = run_app(*words[1:], "format=json", cwd=tmp_path)
            floors = floors_of(done)
            if "resources.attn.prefill.declared_mb=64" in words:
                assert floors == {**expected[deployment], "attn.prefill": 64}
            else:
                assert floors == expected[deployment], command
        elif words[0] == "mstar-resources-calibrate":
            done = run_app(*words[1:], cwd=tmp_path, python=CALIBRATE)
            # Every check passed on the CPU; the GPU step is the writer's, where the app writes.
            assert "torch sees no CUDA device" in done.stderr, done.stderr
            path = calibrate_on_the_cpu(tmp_path, deployment, [str(tmp_path / "my-conf")])
            assert path == tmp_path / "my-conf" / "deployment" / "mine_calibrated.yaml"
            header = path.read_text().split("\nresources:")[0]
            assert (
                f"mstar-resources --config-dir {tmp_path / 'my-conf'} deployment=mine_calibrated"
                in header
            )
        else:
            variable, _, value = words[0].partition("=")
            setting = SETTINGS[variable].read({variable: value})
            assert setting is not None, command
            floors = {record.path: record.floor.mb for record in setting.records}
            assert floors == expected[Path(value).stem], command
        ran.append(words[0].partition("=")[0])
    assert ran.count("MSTAR_RESOURCES_VLLM") == 3 and ran.count("MSTAR_RESOURCES_SGLANG") == 1
    assert ran.count("mstar-resources-calibrate") == 1


def test_the_calibrated_file_composes_from_an_engine_s_config_dir_too(tmp_path):
    files = write_the_pages_files(tmp_path)
    path = calibrate_on_the_cpu(tmp_path, "mine", [str(files["mine"].parents[1])])
    done = run_app("--config-dir", str(path.parents[1]), f"deployment={path.stem}", "format=json",
                   cwd=Path("/"))  # fmt: skip
    assert floors_of(done) == NEEDS_MB


def test_calibrating_into_a_folder_without_the_deployment_is_refused_before_the_gpu(tmp_path):
    write_the_pages_files(tmp_path)
    done = run_app("--config-dir", "my-conf", "deployment=mine", "output_dir=elsewhere",
                   cwd=tmp_path, python=CALIBRATE)  # fmt: skip
    assert_one_paragraph(done, "mstar-resources-calibrate", "output_dir='elsewhere' does not hold "
                         "mine.yaml", "leave output_dir out")  # fmt: skip


def test_a_second_config_dir_is_refused(tmp_path):
    write_the_pages_files(tmp_path)
    (tmp_path / "calibrated" / "deployment").mkdir(parents=True)
    done = run_app("--config-dir", "my-conf", "--config-dir", "calibrated", "deployment=mine",
                   cwd=tmp_path)  # fmt: skip
    assert_one_paragraph(done, "mstar-resources", "--config-dir is given 2 times (my-conf, "
                         "calibrated)")  # fmt: skip


def test_a_relative_path_in_a_setting_is_read_from_the_working_directory(tmp_path, monkeypatch):
    files = write_the_pages_files(tmp_path)
    monkeypatch.chdir(tmp_path / "my-conf")  # a worker started elsewhere
    with pytest.raises(ResourceConfigError, match="no such file"):
        VLLM.read({"MSTAR_RESOURCES_VLLM": "my-conf/deployment/mine.yaml"})
    assert VLLM.read({"MSTAR_RESOURCES_VLLM": str(files["mine"])}) is not None


def test_a_file_named_as_a_shipped_deployment_is_refused_not_ignored(tmp_path):
    """Hydra finds the package's configs before a --config-dir's: a file of a shipped
    deployment's name would be composed as the shipped one, its own floors ignored. The dry run
    and the plugin's setting say so, naming the file; renamed, it composes."""
    path = write_the_pages_files(tmp_path)["mine"].rename(
        tmp_path / "my-conf" / "deployment" / "llama3-8b-h200_calibrated.yaml"
    )
    done = run_app("--config-dir", "my-conf", "deployment=llama3-8b-h200_calibrated", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert "deployment=llama3-8b-h200_calibrated picks the shipped deployment" in done.stderr
    assert str(path.resolve()) in done.stderr and "rename it" in done.stderr
    with pytest.raises(ResourceConfigError, match="picks the shipped deployment") as refused:
        VLLM.read({"MSTAR_RESOURCES_VLLM": str(path)})
    assert str(refused.value).startswith("MSTAR_RESOURCES_VLLM=")
    path.rename(path.with_name("llama3-8b-h200_calibrated_mine.yaml"))
    mine = "deployment=llama3-8b-h200_calibrated_mine"
    done = run_app("--config-dir", "my-conf", mine, "format=json", cwd=tmp_path)
    assert floors_of(done) == {"attn.prefill": 256, "attn.decode": 160}  # not the shipped 17/3
