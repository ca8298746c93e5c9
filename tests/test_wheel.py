"""The wheel, installed into a fresh virtual environment, still serves pkg://mstar_resources.conf.

Offline: the wheel is built without build isolation (setuptools and build come with the test
extra), installed with pip into a venv made without pip, and the few packages composing needs
(Hydra, OmegaConf, their parser runtime, PyYAML, packaging) are linked in from this environment.
torch is not: composing must not import it, which the lazy names of ``mstar_resources`` ensure.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
COMPOSE_NEEDS = ["hydra", "omegaconf", "antlr4", "yaml", "packaging"]
LEFT_BEHIND = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")

COMPOSE = textwrap.dedent(
    """
    import json, sys
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    import mstar_resources.conf
    with initialize_config_dir(sys.argv[1], version_base="1.3"):
        cfg = compose("engine", overrides=["resources.attn.decode.declared_mb=96"])
    print(json.dumps({
        "conf": mstar_resources.conf.__file__,
        "torch": "torch" in sys.modules,
        "resources": OmegaConf.to_container(cfg.resources.attn),
    }))
    """
)

ENGINE = textwrap.dedent(
    """
    defaults:
      - resources: default
      - override deployment: llama3-70b-tp8-h200
    hydra:
      searchpath:
        - pkg://mstar_resources.conf
    """
)


def run(*command: str | Path, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if importlib.util.find_spec("build") is None:
        pytest.skip("needs the build package: pip install -e '.[test]'")
    # A copy, so the checkout gets no build/ or egg-info of the wheel's.
    source = tmp_path_factory.mktemp("source") / "mstar-resources"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, source)
    (built,) = dist.glob("mstar_resources-*.whl")
    return built


def test_the_wheel_ships_the_config_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "mstar_resources/conf/__init__.py",
        "mstar_resources/conf/mstar_resources.yaml",
        "mstar_resources/conf/resources/default.yaml",
        "mstar_resources/conf/deployment/none.yaml",
        "mstar_resources/conf/deployment/llama3-8b-h200.yaml",
        "mstar_resources/conf/deployment/llama3-70b-tp8-h200.yaml",
        "mstar_resources/apps/hydra_app.py",
        # What mstar_resources.testing renders FlashInfer's overflow from.
        "mstar_resources/attn/flashinfer_overflow.json",
    } <= names
    # The calibrations measured with older FlashInfers, in their folders.
    calibrated = ROOT.glob("conf/deployment/flashinfer-*/*.yaml")
    assert {f"mstar_resources/{path.relative_to(ROOT)}" for path in calibrated} <= names
    assert not any(name.startswith(("conf/", "tests/")) for name in names)


def test_a_fresh_venv_with_the_wheel_composes_the_tree(wheel, tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
        "--no-index", wheel)  # fmt: skip
    site = Path(
        run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
    )
    for name in COMPOSE_NEEDS:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, name
        (site / name).symlink_to(next(iter(spec.submodule_search_locations)))
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "engine.yaml").write_text(ENGINE)

    # Run from an empty directory with a bare environment, so the checkout is out of reach.
    done = run(python, "-c", COMPOSE, engine, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})

    report = json.loads(done.stdout)
    assert Path(report["conf"]).is_relative_to(site)
    assert report["torch"] is False
    assert report["resources"] == {
        "prefill": {
            "owner": "attention",
            "declared_mb": 128,
            "int_declared_mb": None,
            "labels": ["prefill"],
            "cg_slots": [],
        },
        "decode": {
            "owner": "attention",
            "declared_mb": 96,
            "int_declared_mb": None,
            "labels": ["decode"],
            "cg_slots": [0, 1],
        },
    }
    assert (venv / "bin" / "mstar-resources").exists()
