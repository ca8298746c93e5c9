"""The check a test makes after ``seal()``: one that fails if sealing did nothing."""

from __future__ import annotations

import pytest

from mstar_resources import Workspace, WorkspaceSealedError
from mstar_resources.units import MIB

from .attn.fake_allocator import FakePlanner, FakeWrapper

FLOAT_ALLOCATION, INT_ALLOCATION = "batch_decode_tmp_v", "batch_decode_request_indices"
"""A float and an int allocation, as FlashInfer's decode plan names them."""


def assert_sealed(workspace: Workspace) -> None:
    """``workspace`` (and its int workspace, where it has one) refuses to grow: a plan that
    overflows it by a MiB raises ``WorkspaceSealedError``, and its buffer stays where and as
    large as it was. A growable workspace would grow instead, and fail this."""
    for kind, allocation in (("float", FLOAT_ALLOCATION), ("int", INT_ALLOCATION)):
        target = workspace if kind == "float" else workspace.int_workspace
        if target is None:
            continue
        address, held = target.tensor.data_ptr(), target.tensor.numel()
        overflow = [(allocation, held + MIB, 16)]
        if kind == "float":
            overflowing = FakePlanner(target.tensor, overflow)
        else:  # found planning on the int workspace, as a wrapper the pool gave it to
            wrapper = FakeWrapper(workspace.tensor, int_allocations=overflow)
            wrapper._int_workspace_buffer = target.tensor
            wrapper._pin_memory_int_workspace_buffer = target.mirror
            overflowing = wrapper.plan
        with pytest.raises(WorkspaceSealedError) as caught:
            workspace.plan(overflowing)
        assert caught.value.workspace == target.name
        assert (target.tensor.data_ptr(), target.tensor.numel()) == (address, held), kind
