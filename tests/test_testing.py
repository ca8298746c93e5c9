"""mstar_resources.testing: FlashInfer's overflow for an engine's CPU tests."""

from __future__ import annotations

import pytest

from mstar_resources import WorkspacePool, WorkspaceSealedError
from mstar_resources.attn._overflow import parse_overflow
from mstar_resources.testing import OverflowingPlanner, flashinfer_overflow
from mstar_resources.units import MIB

from .attn.fake_allocator import error_prefix_text, fixture_expression, header_file, overflow_text


def test_the_overflow_is_worded_as_the_checked_fixture_words_it():
    error = flashinfer_overflow("batch_decode_tmp_v", 3 * MIB, MIB)
    # The fixture's expressions as the tests read them (tests/attn/test_overflow.py checks those
    # against FlashInfer's headers), rendered apart from the library's own rendering.
    where = fixture_expression("overflow")
    message = overflow_text().render(
        name="batch_decode_tmp_v", size=3 * MIB, alignment=16, remaining_space=MIB
    )
    expected = error_prefix_text().render(
        func=where["function"], file=header_file(where["header"]),
        line=overflow_text().throw_line, message=message,
    )  # fmt: skip
    assert str(error) == expected
    overflow = parse_overflow(error)
    assert overflow is not None
    assert (overflow.allocation, overflow.size, overflow.kind) == ("batch_decode_tmp_v", 3 * MIB,
                                                                   "float")  # fmt: skip


def test_a_workspace_grows_for_the_planner_and_a_sealed_one_refuses_it():
    pool = WorkspacePool("cpu", 1, config_key="resources.attn.decode")
    workspace = pool.get("decode")
    planner = OverflowingPlanner(workspace.tensor, [("batch_decode_tmp_v", 3 * MIB)])
    workspace.plan(planner)
    assert workspace.tensor.numel() >= 3 * MIB and planner.calls == 2  # overflowed, then fit
    pool.seal()
    bigger = OverflowingPlanner(workspace.tensor, [("batch_decode_tmp_v", 8 * MIB)])
    with pytest.raises(WorkspaceSealedError) as caught:
        workspace.plan(bigger)
    assert caught.value.setting == "resources.attn.decode.declared_mb"
