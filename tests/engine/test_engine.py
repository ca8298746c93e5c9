"""An engine of our own (conf/ here, with its own groups) composing mstar-resources' tree with the
two lines: ``hydra.searchpath: [pkg://mstar_resources.conf]`` and ``- resources: default``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException

from mstar_resources import resolve

from ..conftest import VAR

CONF = Path(__file__).parent / "conf"
ROOT = Path(__file__).parents[2]


def compose_engine(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("engine", overrides=overrides)


def floors(cfg, env=None):
    return {r.path: (r.floor.mb, r.floor.source) for r in resolve(cfg.resources, env or {})}


# Which deployment an engine runs: overrides -> {path: (floor MB, source)}. (Where a floor comes
# from is tested once, in test_floor.py.)
ENGINE = [
    pytest.param(
        [],
        {"attn.prefill": (256, "declared"), "attn.decode": (128, "declared"),
         "mla.decode": (512, "default")},
        id="deployment-from-defaults-list",
    ),
    pytest.param(
        ["deployment=llama3-70b-tp8-h200"],
        {"attn.prefill": (128, "declared"), "attn.decode": (64, "declared"),
         "mla.decode": (512, "default")},
        id="deployment-from-command-line",
    ),
    pytest.param(
        ["deployment=lab-a100", "resources.mla.decode.declared_mb=12"],
        {"attn.prefill": (512, "default"), "attn.decode": (48, "declared"),
         "mla.decode": (12, "declared")},
        id="engine-deployment-and-override",
    ),
    pytest.param(
        ["resources.attn.decode.declared_mb=96", "deployment=none"],
        {"attn.prefill": (512, "default"), "attn.decode": (96, "declared"),
         "mla.decode": (512, "default")},
        id="no-deployment",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "expected"), ENGINE)
def test_engine_composes_the_tree_with_its_own_groups(overrides, expected):
    cfg = compose_engine(overrides)
    assert cfg.model.num_qo_heads == 32 and cfg.scheduler.max_num_batched_tokens == 8192
    assert floors(cfg) == expected


def test_engine_groups_and_resource_groups_mix_on_the_command_line():
    cfg = compose_engine(["model=llama3-70b", "deployment=llama3-70b-tp8-h200"])
    assert cfg.model.name == "meta-llama/Meta-Llama-3-70B"
    assert floors(cfg)["attn.decode"] == (64, "declared")


def test_a_misspelled_deployment_lists_the_engine_s_and_the_shipped_ones():
    with pytest.raises(MissingConfigException) as raised:
        compose_engine(["deployment=lab-a10"])
    assert list(raised.value.options or []) == [
        "deepseek-v3-tp8-h200",
        "deepseek-v3-tp8-h200_calibrated",
        "glm-4.5-air-h200",
        "glm-4.5-air-h200_calibrated",
        "lab-a100",
        "llama3-70b-tp8-h200",
        "llama3-70b-tp8-h200_calibrated",
        "llama3-8b-h200",
        "llama3-8b-h200_calibrated",
        "none",
        "qwen3.5-122b-a10b-h200",
        "qwen3.5-122b-a10b-h200_calibrated",
    ]


def run_engine(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.engine.app", *overrides],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_under_hydra_main_on_the_command_line(tmp_path):
    done = run_engine("deployment=llama3-70b-tp8-h200", "resources.attn.decode.declared_mb=96",
                      cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    got = {r["path"]: (r["floor_mb"], r["floor_setting"]) for r in report["resources"]}
    assert got == {
        "attn.prefill": (128, "resources.attn.prefill.declared_mb"),
        "attn.decode": (96, "resources.attn.decode.declared_mb"),
        "mla.decode": (512, VAR),
    }
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(["model=llama3-7b"],
                     r"model=llama3-7b is not a model \(did you mean llama3-70b\?\)", id="group"),
        pytest.param(["resources.mla.decode.declard_mb=8"],
                     r"resources\.mla\.decode\.declard_mb is not a setting \(did you mean "
                     r"resources\.mla\.decode\.declared_mb\?\)", id="misspelled-key"),
        pytest.param(["resources.mla.decode.labels=[]"],
                     r"resources\.mla\.decode\.labels=\[\] is empty", id="resolver"),
    ],
)  # fmt: skip
def test_bad_input_to_the_engine_is_one_paragraph_exit_2_and_no_files(tmp_path, overrides, message):
    done = run_engine(*overrides, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert re.match(rf"engine: error: {message}", done.stderr), done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def _plain_app(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.engine.plain_app", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_an_engine_on_plain_hydra_main_lists_its_deployments_in_help():
    """The documented snippet: register_options_resolver before @hydra.main's main()."""
    done = _plain_app("--help")
    assert done.returncode == 0, done.stderr
    listed = re.search(r"library's: (.*)", done.stdout)
    assert listed is not None, done.stdout
    names = listed[1].split(", ")
    assert {"lab-a100", "llama3-8b-h200", "llama3-8b-h200_calibrated"} <= set(names)


def test_an_engine_on_plain_hydra_main_resolves_its_deployment():
    done = _plain_app("deployment=llama3-70b-tp8-h200")
    assert done.returncode == 0, done.stderr
    assert "attn.decode" in done.stdout
