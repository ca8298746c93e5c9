"""The package's public names, which load on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mstar_resources


@pytest.mark.parametrize("name", mstar_resources.__all__)
def test_every_public_name_loads_and_is_listed(name):
    assert getattr(mstar_resources, name).__name__ == name
    assert name in dir(mstar_resources)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'resolver_'"):
        mstar_resources.resolver_  # noqa: B018


def test_importing_the_package_and_its_conf_imports_no_torch():
    code = "import sys, mstar_resources.conf; print(sorted(m for m in sys.modules if m == 'torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr
