"""The README's `mstar-resources` examples print what the program prints."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from .test_cli import run_cli

README = (Path(__file__).parents[1] / "README.md").read_text()
EXAMPLES = re.findall(r"```console\n\$ mstar-resources([^\n]*)\n(.*?)```", README, re.S)


def test_the_readme_shows_the_dry_run_a_deployment_json_and_an_error():
    commands = [args.strip() for args, _ in EXAMPLES]
    assert commands[0] == ""  # the main command, as is
    assert any("deployment=" in c and "declared_mb=" in c for c in commands)
    assert any("format=json" in c for c in commands)


@pytest.mark.parametrize(("args", "output"), EXAMPLES, ids=[a.strip() or "-" for a, _ in EXAMPLES])
def test_each_example_prints_what_the_readme_shows(tmp_path, args, output):
    done = run_cli(*shlex.split(args), cwd=tmp_path)
    assert (done.stdout + done.stderr) == output


ENGINE_YAML = re.search(r"### In an engine\n.*?```yaml\n(.*?)```", README, re.S)
ENGINE_APP = """
import dataclasses, json
from omegaconf import DictConfig
from mstar_resources import resolve
from mstar_resources.app import hydra_app

@hydra_app("my-engine", config_name="engine", config_path="conf")
def main(cfg: DictConfig) -> None:
    print(json.dumps([dataclasses.asdict(r) for r in resolve(cfg.resources)]))

main()
"""


def test_the_engine_snippet_runs_as_shown_and_writes_nothing(tmp_path):
    """The README's engine config, copied as shown beside the engine's own model group, composes,
    resolves, and leaves the working directory as it was."""
    assert ENGINE_YAML is not None
    engine = tmp_path / "engine"
    (engine / "conf" / "model").mkdir(parents=True)
    (engine / "conf" / "engine.yaml").write_text(ENGINE_YAML.group(1))
    (engine / "conf" / "model" / "llama3-8b.yaml").write_text("name: llama3-8b\n")
    (engine / "app.py").write_text(ENGINE_APP)
    work = tmp_path / "work"
    work.mkdir()
    done = run_cli(python=[sys.executable, str(engine / "app.py")], cwd=work)
    assert done.returncode == 0, done.stderr
    paths = [record["path"] for record in json.loads(done.stdout)]
    assert paths == ["attn.prefill", "attn.decode", "mla.decode"]
    assert list(work.iterdir()) == []  # no outputs/, no .hydra/, no log


WITHOUT_HYDRA = re.search(
    r"### Without Hydra\n.*?```python\n(.*?)```\n\n```text\n(.*?)```", README, re.S
)


def test_the_plain_dict_example_prints_what_the_readme_shows(tmp_path):
    """An engine without Hydra: the README's snippet runs as shown and prints what it shows."""
    assert WITHOUT_HYDRA is not None
    code, output = WITHOUT_HYDRA.groups()
    (tmp_path / "plain.py").write_text(code)
    done = run_cli(python=[sys.executable, str(tmp_path / "plain.py")], cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == output
