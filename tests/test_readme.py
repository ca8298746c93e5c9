"""The README's `mstar-resources` examples print what the program prints."""

from __future__ import annotations

import re
import shlex
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


def test_the_readme_has_no_unfilled_placeholder():
    assert not re.findall(r"\b[A-Z]+_TABLE\b", README)
