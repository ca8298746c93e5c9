"""The package's public names, which load on first use."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import mstar_resources


@pytest.mark.parametrize("name", mstar_resources.__all__)
def test_every_public_name_is_its_home_module_s_own(name):
    """The facade hands out the very object its home module defines and lists as public."""
    value = getattr(mstar_resources, name)
    home = importlib.import_module(value.__module__)
    assert value.__module__.startswith("mstar_resources.")
    assert getattr(home, name) is value
    assert name in home.__all__


def test_the_three_lists_of_public_names_agree():
    """The type checkers' imports, the facade's homes and ``__all__``: each written out."""
    source = ast.parse(Path(mstar_resources.__file__).read_text(encoding="utf-8"))
    (block,) = (n for n in source.body if isinstance(n, ast.If))  # if TYPE_CHECKING:
    imported = {
        alias.name: "." * node.level + (node.module or "")
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname == alias.name  # re-exported
    }
    assert imported == mstar_resources._HOMES
    assert sorted(mstar_resources.__all__) == sorted(imported)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'resolver_'"):
        mstar_resources.resolver_  # noqa: B018


def test_importing_the_package_and_its_conf_imports_no_torch():
    code = "import sys, mstar_resources.conf; print(sorted(m for m in sys.modules if m == 'torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr
