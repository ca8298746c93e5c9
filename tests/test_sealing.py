"""The GPU tests' check after ``seal()`` (``tests/sealing.py``), checked on the CPU: it passes on
a sealed pool's workspace and fails on a growable one, float and int alike."""

from __future__ import annotations

import pytest

from mstar_resources import WorkspacePool
from mstar_resources.attn._buffer import GrowableBuffer

from .sealing import assert_sealed


def test_a_sealed_workspace_and_its_int_workspace_pass():
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    workspace = pool.get("decode")
    pool.seal()
    assert_sealed(workspace)


@pytest.mark.parametrize("sealed", ["neither", "float only"])
def test_a_workspace_that_can_still_grow_fails_the_check(sealed):
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    workspace = pool.get("decode")
    if sealed == "float only":
        GrowableBuffer.seal(workspace)  # the float buffer alone
    with pytest.raises(pytest.fail.Exception):
        assert_sealed(workspace)
    grown = workspace.tensor if sealed == "neither" else workspace.int_workspace.tensor
    assert grown.numel() == 2 << 20  # the plan's 1 MiB over, taken instead of refused
