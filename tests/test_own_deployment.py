"""docs/own-deployment.md: its deployment file, written where the page says, gives the floors the
page promises through the dry run's --config-dir and through the vLLM plugin's setting alike."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mstar_resources.errors import ResourceConfigError
from mstar_resources.integrations import vllm as plugin

from .apps import run_app

PAGE = Path(__file__).parents[1] / "docs" / "own-deployment.md"


def _write_deployment(tmp_path: Path) -> Path:
    (body,) = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
    path = tmp_path / "my-conf" / "deployment" / "mine.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(body)
    return path


def test_the_pages_deployment_composes_in_the_dry_run_and_in_the_plugin(tmp_path):
    path = _write_deployment(tmp_path)
    done = run_app("--config-dir", "my-conf", "deployment=mine", "format=json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    resources = {r["path"]: r for r in json.loads(done.stdout)["resources"]}
    floors = {p: (r["floor_mb"], r["floor_source"]) for p, r in resources.items()}
    assert floors == {"attn.prefill": (256, "declared"), "attn.decode": (160, "declared")}
    setting = plugin.read_setting({plugin.ENV_VAR: str(path)})
    assert {r.path: r.floor_mb for r in setting.records} == {
        "attn.prefill": 256,
        "attn.decode": 160,
    }


def test_the_commands_the_page_shows_are_the_ones_that_ran():
    text = PAGE.read_text()
    assert "mstar-resources --config-dir my-conf deployment=mine " in text
    assert "MSTAR_RESOURCES_VLLM=my-conf/deployment/mine.yaml vllm serve" in text


def test_a_file_named_as_a_shipped_deployment_is_refused_not_ignored(tmp_path):
    """Hydra finds the package's configs before a --config-dir's: a file of a shipped
    deployment's name would be composed as the shipped one, its own floors ignored. The dry run
    and the plugin's setting say so, naming the file; renamed, it composes."""
    path = _write_deployment(tmp_path).rename(
        tmp_path / "my-conf" / "deployment" / "llama3-8b-h200_calibrated.yaml"
    )
    done = run_app("--config-dir", "my-conf", "deployment=llama3-8b-h200_calibrated", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert "deployment=llama3-8b-h200_calibrated picks the shipped deployment" in done.stderr
    assert str(path.resolve()) in done.stderr and "rename it" in done.stderr
    with pytest.raises(ResourceConfigError, match="picks the shipped deployment") as refused:
        plugin.read_setting({plugin.ENV_VAR: str(path)})
    assert str(refused.value).startswith(f"{plugin.ENV_VAR}=")
    path.rename(path.with_name("llama3-8b-h200_calibrated_mine.yaml"))
    mine = "deployment=llama3-8b-h200_calibrated_mine"
    done = run_app("--config-dir", "my-conf", mine, "format=json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    floors = {r["path"]: r["floor_mb"] for r in json.loads(done.stdout)["resources"]}
    assert floors == {"attn.prefill": 256, "attn.decode": 160}  # the file's, not the shipped 17/3
