"""Workspace and WorkspacePool on the CPU, through FakePlanner: a planner that fails the way
FlashInfer's allocator does (its text read from the installed FlashInfer). The real FlashInfer is
checked in test_workspace_gpu.py."""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import pickle
import re
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from mstar_resources import (
    ResourceConfigError,
    ResourceError,
    ResourceUsageError,
    Workspace,
    WorkspaceGrowthError,
    WorkspacePlanError,
    WorkspacePool,
    WorkspaceSealedError,
    WorkspaceStats,
)
from mstar_resources.attn import _float_workspace
from mstar_resources.attn._float_workspace import MAX_GROWTHS_PER_PLAN, plan_through
from mstar_resources.attn._overflow import MLA_PARTIALS
from mstar_resources.floor import MAX_MB
from mstar_resources.testing import flashinfer_overflow
from mstar_resources.units import MIB

from .fake_allocator import (
    FakePlanner,
    FakePrefillWrapper,
    FakeWrapper,
    flashinfer_overflow_message,
)

VAR = "MSTAR_WORKSPACE_BUFFER_MB"
DECODE_CHAIN = [("batch_decode_tmp_v", 2 * MIB, 16), ("batch_decode_tmp_s", 16_400, 16)]
MLA_PARTIALS_ON_AN_H200 = [("mla_partial_o", 17_301_504, 16), ("mla_partial_lse", 67_584, 16)]


def make_workspace(size: int = MIB, **kwargs) -> Workspace:
    return Workspace(torch.zeros(size, dtype=torch.uint8), "attention:decode", **kwargs)


def test_plan_returns_what_the_planner_returns_and_passes_arguments():
    workspace = make_workspace()
    planner = FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 1024, 16)])
    assert workspace.plan(planner, 1, 2, page_size=16) == ((1, 2), {"page_size": 16})
    assert planner.calls == 1
    assert workspace.tensor.numel() == MIB


def test_overflow_grows_in_place_keeping_bytes_and_zeroing_the_tail():
    workspace = make_workspace()
    tensor = workspace.tensor
    pattern = torch.arange(MIB, dtype=torch.int64).remainder(251).to(torch.uint8)
    tensor.copy_(pattern)
    planner = FakePlanner(tensor, DECODE_CHAIN)

    workspace.plan(planner)

    assert workspace.tensor is tensor  # the wrapper holds this object: it must see the growth
    assert (tensor.dtype, tensor.dim(), tensor.is_contiguous()) == (torch.uint8, 1, True)
    assert tensor.numel() == planner.bytes_needed()  # exactly what the chain needs, no more
    assert torch.equal(tensor[:MIB], pattern)
    assert not tensor[MIB:].any()
    assert planner.calls == 3  # tmp_v overflows, then tmp_s, then it fits


def test_growth_rounds_the_taken_bytes_up_to_the_alignment():
    workspace = make_workspace(100)
    planner = FakePlanner(workspace.tensor, [("a_tmp_s", 90, 1), ("a_tmp_v", 64, 64)])
    workspace.plan(planner)
    assert workspace.tensor.numel() == 128 + 64
    assert planner.offsets == {"a_tmp_s": 0, "a_tmp_v": 128}


def test_a_second_plan_that_fits_does_not_grow():
    workspace = make_workspace()
    workspace.plan(FakePlanner(workspace.tensor, DECODE_CHAIN))
    size = workspace.tensor.numel()
    small = FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 1024, 16)])
    workspace.plan(small)
    assert (workspace.tensor.numel(), small.calls) == (size, 1)


def test_a_wrapper_planned_before_grows_the_workspace_then_is_refused_once_sealed(plan_on):
    """The plans of every step after a wrapper's first: one that fits runs once, one that does
    not grows the workspace before the seal and is refused after it, the buffer kept."""
    pool = WorkspacePool("cpu", 1, int_size_mb=1, config_key="resources.attn.decode")
    workspace = pool.get("decode")
    wrapper = pool.build(FakeWrapper, label="decode")
    plan_on(workspace, wrapper)
    wrapper.float_allocations = [("batch_decode_tmp_v", 2 * MIB, 16)]
    plan_on(workspace, wrapper, 1, page_size=16)
    assert (wrapper.plans, workspace.tensor.numel()) == (3, 2 * MIB)  # the second ran twice
    assert wrapper.run("q") == "ran"  # its plan is the one the int workspace holds
    pool.seal()
    address = workspace.tensor.data_ptr()
    wrapper.float_allocations = [("batch_decode_tmp_v", 3 * MIB, 16)]
    with pytest.raises(WorkspaceSealedError) as raised:
        plan_on(workspace, wrapper)
    assert (raised.value.setting, raised.value.suggested_mb) == (
        "resources.attn.decode.declared_mb", 3,
    )  # fmt: skip
    assert (workspace.tensor.data_ptr(), workspace.tensor.numel()) == (address, 2 * MIB)


class _EveryKind(FakeWrapper):
    """A wrapper whose plan takes every kind of parameter, and returns what it was given."""

    def plan(self, a, b=2, /, c=3, *rest, d, e=5, **more):  # type: ignore[override]
        super().plan()
        return (a, b, c, rest, d, e, more)


def _every_kind(wrapper, a, b=2, /, c=3, *rest, d, e=5, **more):
    return _EveryKind.plan(wrapper, a, b, c, *rest, d=d, e=e, **more)


def _named_as_its_locals(wrapper, key, plan=0, *, planner=1, result=2):
    return (key, plan, planner, result)


CALLS = [((1,), {"d": 4}), ((1, 9, 8, 7, 6), {"d": 4, "e": 0, "f": -1}), ((1,), {"c": 7, "d": 4})]


@pytest.mark.parametrize("args, kwargs", CALLS)
def test_plan_through_gives_a_plan_its_arguments_as_a_direct_call_would(args, kwargs):
    """Before and after the wrapper's route is known, bound and with the wrapper first."""
    workspace = make_workspace()
    wrapper = _EveryKind(workspace.tensor)
    bound, first = plan_through(workspace, wrapper.plan), plan_through(workspace, _every_kind)
    direct = wrapper.plan(*args, **kwargs)
    for _ in range(2):
        assert bound(*args, **kwargs) == direct
        assert first(wrapper, *args, **kwargs) == direct
    assert wrapper.plans == 5
    assert inspect.signature(first) == inspect.signature(_every_kind)
    with pytest.raises(TypeError):
        first(wrapper, 1)  # d is required, as it is of the plan


def test_plan_through_takes_a_plan_whose_parameters_are_named_as_its_own_names():
    workspace = make_workspace()
    wrapper = FakeWrapper(workspace.tensor)
    planned = plan_through(workspace, _named_as_its_locals)
    for _ in range(2):
        assert planned(wrapper, "k", result=5) == ("k", 0, 1, 5)
        assert planned(wrapper, "k", plan=7) == ("k", 7, 1, 2)  # plan_through's own name


def test_a_plan_through_a_freed_wrapper_is_refused_naming_the_workspace():
    workspace = make_workspace()
    wrapper = FakeWrapper(workspace.tensor)
    planned = plan_through(workspace, wrapper.plan)
    del wrapper
    gc.collect()
    with pytest.raises(ResourceUsageError, match="'attention:decode' after its wrapper was freed"):
        planned()


def test_a_workspace_s_buffer_and_state_are_read_only():
    workspace = make_workspace()
    for name, value in [("tensor", torch.zeros(8, dtype=torch.uint8)), ("sealed", True),
                        ("name", "x"), ("floor", "y")]:  # fmt: skip
        with pytest.raises(AttributeError):
            setattr(workspace, name, value)
    assert not workspace.sealed and workspace.int_workspace is None


class _PlansWithinItsRecordedSize:
    """Plans as FlashInfer's paged prefill wrapper does: within the size it recorded."""

    def __init__(self, workspace: Workspace, need: int) -> None:
        self._float_workspace_buffer = workspace.tensor
        self._workspace_size = workspace.tensor.numel()
        self.need = need

    def plan(self) -> str:
        if self.need > self._workspace_size:
            raise flashinfer_overflow("batch_prefill_tmp_v", self.need, self._workspace_size)
        return "planned"


@pytest.mark.parametrize("need", [4608, 6144])
def test_a_plan_while_another_thread_grows_the_workspace_plans_on_the_size_it_read(
    monkeypatch, need
):
    """The other plan grows the workspace right after this one read its size: this one records,
    and grows from, the size it read, and plans (within the grown size, or after growing)."""
    workspace = make_workspace(4096)
    planning, other = _PlansWithinItsRecordedSize(workspace, need), None
    refresh = _float_workspace.refresh_recorded_size

    def another_thread_grows_it_now(attributes, tensor, size=None):
        nonlocal other
        if attributes is vars(planning) and other is None:
            other = _PlansWithinItsRecordedSize(workspace, 5120)
            workspace.plan(other.plan)
        refresh(attributes, tensor, size)

    monkeypatch.setattr(_float_workspace, "refresh_recorded_size", another_thread_grows_it_now)
    assert workspace.plan(planning.plan) == "planned"
    assert workspace.tensor.numel() >= max(need, 5120) and other is not None


def test_a_plan_reading_the_tensors_size_while_another_thread_grows_it_grows_from_the_new_size(
    monkeypatch,
):
    """As a decode plan does, this one reads the tensor's own size, after another plan grew it
    past the size this one read first: the overflow counts from neither, so it plans again."""
    workspace = make_workspace(4096)
    chain = [("batch_decode_tmp_v", 5000, 16), ("batch_decode_tmp_s", 2000, 16)]
    planning, other = FakePlanner(workspace.tensor, chain), None
    refresh = _float_workspace.refresh_recorded_size

    def another_thread_grows_it_now(attributes, tensor, size=None):
        nonlocal other
        if attributes is vars(planning) and other is None:
            other = FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 6000, 16)])
            workspace.plan(other.plan)
        refresh(attributes, tensor, size)

    monkeypatch.setattr(_float_workspace, "refresh_recorded_size", another_thread_grows_it_now)
    workspace.plan(planning.plan)
    assert workspace.tensor.numel() == planning.bytes_needed() and other is not None


def test_int_workspace_overflow_reaches_the_caller_unchanged():
    workspace = make_workspace()
    planner = FakePlanner(workspace.tensor, [("batch_prefill_request_indices", 2 * MIB, 16)])
    with pytest.raises(RuntimeError) as raised:
        workspace.plan(planner)
    assert type(raised.value) is RuntimeError
    assert "batch_prefill_request_indices" in str(raised.value)
    assert (planner.calls, workspace.tensor.numel()) == (1, MIB)


def test_an_overflow_with_more_room_than_this_buffer_has_is_not_ours():
    workspace = make_workspace()
    message = flashinfer_overflow_message("batch_decode_tmp_v", 4 * MIB, 16, 2 * MIB)
    original = RuntimeError(message)

    def planner():
        raise original

    with pytest.raises(RuntimeError) as raised:
        workspace.plan(planner)
    assert raised.value is original
    assert workspace.tensor.numel() == MIB


@pytest.mark.parametrize(
    "error",
    [
        ValueError("The dtype of q torch.float16 does not match q_data_type torch.bfloat16"),
        RuntimeError("CHECK_EQ(indptr.size(0), batch_size + 1) failed"),
        TypeError("plan() got an unexpected keyword argument 'head_size'"),
        torch.OutOfMemoryError("CUDA out of memory"),
    ],
    ids=["value", "runtime", "type", "oom"],
)
def test_other_errors_reach_the_caller_unchanged(error):
    workspace = make_workspace()

    def planner():
        raise error

    with pytest.raises(type(error)) as raised:
        workspace.plan(planner)
    assert raised.value is error
    assert raised.value.__cause__ is None
    assert workspace.tensor.numel() == MIB


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_mlas_check_before_planning_grows_the_workspace_in_one_step(backend):
    workspace = make_workspace(64 * 1024)
    planner = FakePlanner(workspace.tensor, MLA_PARTIALS_ON_AN_H200, mla_backend=backend)

    workspace.plan(planner)

    assert (workspace.tensor.numel(), planner.calls) == (17_369_088, 2)
    stats = workspace.stats()
    assert (stats.times_grown, stats.largest_growth_allocation) == (1, MLA_PARTIALS)


def test_a_sealed_mla_workspace_names_the_whole_need_and_the_setting():
    workspace = make_workspace(floor="resources.attn.decode.declared_mb", sealed=True)
    planner = FakePlanner(workspace.tensor, MLA_PARTIALS_ON_AN_H200, mla_backend="fa2")

    with pytest.raises(WorkspaceSealedError, match=r"a plan needs 17,369,088 \("
                       rf"{re.escape(MLA_PARTIALS)} asked for 17,369,088 bytes in all\); set "
                       r"resources\.attn\.decode\.declared_mb=17 or more, or plan"):  # fmt: skip
        workspace.plan(planner)
    assert workspace.tensor.numel() == MIB


def test_a_wrapper_that_recorded_its_buffers_size_learns_the_grown_size():
    # FlashInfer's paged prefill wrapper records the size when it is built and hands it to its run.
    workspace = make_workspace()
    before = FakePrefillWrapper(workspace.tensor, [("batch_prefill_tmp_v", 1024, 16)])
    grows = FakePrefillWrapper(workspace.tensor, [("batch_prefill_tmp_v", 3 * MIB, 16)])

    workspace.plan(grows.plan)
    assert grows._workspace_size == workspace.tensor.numel() == 3 * MIB
    workspace.plan(before.plan)  # built before the growth, plans without growing
    assert before._workspace_size == 3 * MIB


def test_a_wrapper_records_the_size_its_last_plan_was_made_on(plan_on):
    # Its run hands the recorded size to trtllm-gen, which bounds its scratch by it: a wrapper
    # planned before another's growth runs that plan within the size it was made on, and learns
    # the grown size at its next plan.
    workspace = make_workspace()
    planned_before = FakeWrapper(workspace.tensor)
    planned_before._workspace_size = MIB  # as FlashInfer's paged prefill wrapper records it
    plan_on(workspace, planned_before)
    grows = FakeWrapper(workspace.tensor, float_allocations=[("batch_prefill_tmp_v", 3 * MIB, 16)])
    grows._workspace_size = MIB
    plan_on(workspace, grows)
    assert workspace.tensor.numel() == grows._workspace_size == 3 * MIB
    assert planned_before._workspace_size == MIB
    plan_on(workspace, planned_before)
    assert planned_before._workspace_size == 3 * MIB


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """Python's garbage collector off: what is freed is freed by its last reference."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_workspace_keeps_no_wrapper_alive_that_planned_through_it(plan_on):
    """Freed as its last reference goes, with the garbage collector off: neither the workspace
    nor the int workspace's check of its run holds it in a cycle with what it holds."""
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    workspace = pool.get("decode")
    wrapper = pool.build(FakeWrapper, label="decode")  # on the int workspace, its run checked
    plan_on(workspace, wrapper)
    assert wrapper.run("q") == "ran"
    gone = weakref.ref(wrapper)
    with collector_off():
        del wrapper
        assert gone() is None


def test_a_wrapper_on_another_buffer_keeps_its_recorded_size():
    workspace = make_workspace()
    elsewhere = FakePrefillWrapper(torch.zeros(4 * MIB, dtype=torch.uint8), [])
    workspace.plan(elsewhere.plan)
    assert elsewhere._workspace_size == 4 * MIB


@pytest.mark.parametrize(
    "more", [lambda asked: 2 * asked, lambda asked: asked + 64], ids=["doubling", "adding"]
)
def test_a_planner_that_asks_again_for_an_allocation_it_was_given_is_stopped(more):
    """Doubling (or adding to) what it asks each time, however much it gets: one growth, to what
    it first asked, then the library's error; never a workspace doubled until memory runs out."""
    workspace = make_workspace(64)
    asked = [64]

    def greedy():
        raise RuntimeError(flashinfer_overflow_message("x_tmp_v", asked[-1], 16, 0))

    def planning():
        try:
            greedy()
        finally:
            asked.append(more(asked[-1]))

    with pytest.raises(WorkspacePlanError, match="does not converge") as raised:
        workspace.plan(planning)
    assert (len(asked) - 1, workspace.stats().times_grown) == (2, 1)
    assert raised.value.held_bytes == workspace.tensor.numel() == 64 + 64  # its first ask
    assert isinstance(raised.value.__cause__, RuntimeError)
    # A planner's logic, not a lack of memory: an engine's out-of-memory handling stays out of it.
    assert not isinstance(raised.value, torch.OutOfMemoryError)


def test_a_chain_of_allocations_each_asked_once_is_stopped_after_the_most_growths():
    workspace = make_workspace(16)
    names = iter(range(MAX_GROWTHS_PER_PLAN + 1))

    def chain():  # a new allocation each time, each of 16 bytes more than there is
        raise RuntimeError(flashinfer_overflow_message(f"x{next(names)}_tmp_v", 16, 16, 0))

    with pytest.raises(WorkspacePlanError, match="does not converge"):
        workspace.plan(chain)
    assert workspace.stats().times_grown == MAX_GROWTHS_PER_PLAN


def test_a_planner_on_another_buffer_is_stopped_after_one_growth():
    workspace = make_workspace()
    elsewhere = FakePlanner(
        torch.zeros(MIB, dtype=torch.uint8), [("batch_decode_tmp_v", 2 * MIB, 16)]
    )

    with pytest.raises(WorkspacePlanError, match="does not plan on this workspace's tensor"):
        workspace.plan(elsewhere)
    assert elsewhere.calls == 2
    assert workspace.stats().times_grown == 1


def test_an_overflow_two_plans_saw_grows_the_workspace_once():
    workspace = make_workspace()
    other = FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 2 * MIB, 16)])
    calls = 0

    def planner():
        nonlocal calls
        calls += 1
        if calls == 1:  # overflows at 1 MiB, and meanwhile another plan grows the workspace
            message = flashinfer_overflow_message("batch_decode_tmp_v", 2 * MIB, 16, MIB)
            workspace.plan(other)
            raise RuntimeError(message)
        return "planned"

    assert workspace.plan(planner) == "planned"
    assert (workspace.tensor.numel(), workspace.stats().times_grown) == (2 * MIB, 1)


def test_sealed_overflow_names_workspace_bytes_and_setting_and_never_moves():
    workspace = make_workspace(floor="resources.attn.decode.declared_mb")
    workspace.seal()
    address = workspace.tensor.data_ptr()
    planner = FakePlanner(workspace.tensor, DECODE_CHAIN)

    with pytest.raises(WorkspaceSealedError) as raised:
        workspace.plan(planner)  # a plain callable: only the failed allocation is known

    assert str(raised.value) == (
        "workspace 'attention:decode' is sealed at 1,048,576 bytes, and a plan needs at least "
        "2,097,152 (batch_decode_tmp_v asked for 2,097,152 bytes, alignment 16, with 0 taken); "
        "set resources.attn.decode.declared_mb=2 or more (allocations after it were not tried "
        "and may ask for more), or plan the largest shape before sealing"
    )
    assert isinstance(raised.value, ResourceError)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert (workspace.tensor.data_ptr(), workspace.tensor.numel()) == (address, MIB)
    error = raised.value
    assert (error.workspace, error.held_bytes, error.needed_bytes) == (
        "attention:decode",
        MIB,
        2 * MIB,
    )
    assert (error.setting, error.suggested_mb) == ("resources.attn.decode.declared_mb", 2)
    # Each refusal is counted where an engine's report reads it.
    with pytest.raises(WorkspaceSealedError):
        workspace.plan(planner)
    stats = workspace.stats()
    assert (stats.sealed_refusals, stats.times_grown) == (2, 0)
    assert str(stats).endswith("never grew, sealed, refused 2 plans")


def test_sealed_overflow_of_a_wrapper_plan_says_what_the_whole_plan_needs():
    workspace = make_workspace()
    workspace.seal()
    planner = FakePlanner(workspace.tensor, DECODE_CHAIN)

    with pytest.raises(WorkspaceSealedError) as raised:
        workspace.plan(planner.plan, 1, page_size=16)  # a bound method, like wrapper.plan

    # tmp_v alone fits in 2 MB; with tmp_s after it the plan needs 3: the wrapper's own
    # workspace_size() says so, and the error passes that on.
    assert str(raised.value) == (
        "workspace 'attention:decode' is sealed at 1,048,576 bytes, and a plan needs 2,113,552 "
        "in all, per FlashInfer's workspace_size() (batch_decode_tmp_v asked for 2,097,152 "
        "bytes, alignment 16, with 0 taken); set MSTAR_WORKSPACE_BUFFER_MB=3 or more, or plan "
        "the largest shape before sealing"
    )
    assert (planner.calls, workspace.tensor.numel()) == (1, MIB)


class _SizedWrapper(FakeWrapper):
    """A plan taking a keyword its ``workspace_size()`` does not, as FlashInfer's may."""

    def plan(self, page_size, non_blocking=True):  # type: ignore[override]
        super().plan()

    def workspace_size(self, page_size):  # type: ignore[override]
        return super().workspace_size()


def test_a_sealed_overflow_through_plan_through_says_what_the_whole_plan_needs():
    workspace = make_workspace()
    wrapper = _SizedWrapper(workspace.tensor, float_allocations=DECODE_CHAIN[:1])
    planned = plan_through(workspace, wrapper.plan)
    planned(16)  # grows to 2 MiB
    workspace.seal()
    wrapper.float_allocations = [("batch_decode_tmp_v", 3 * MIB, 16), DECODE_CHAIN[1]]
    with pytest.raises(WorkspaceSealedError) as raised:
        planned(page_size=16)
    assert raised.value.needed_bytes == 3 * MIB + 16_400  # the whole plan, not its first part


def test_sealed_workspace_still_plans_what_fits():
    workspace = make_workspace(sealed=True)
    planner = FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 1024, 16)])
    workspace.plan(planner)
    assert planner.calls == 1


def test_failed_growth_keeps_the_old_buffer_intact_and_usable():
    workspace = make_workspace()
    workspace.tensor.fill_(7)
    address = workspace.tensor.data_ptr()
    # 2**55 bytes is more than any machine has: the CPU allocator really fails.
    huge = FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 1 << 55, 16)])

    with pytest.raises(WorkspaceGrowthError) as raised:
        workspace.plan(huge)

    message = str(raised.value)
    assert "workspace 'attention:decode'" in message
    assert f"to {(1 << 55):,} bytes" in message
    assert isinstance(raised.value, torch.OutOfMemoryError)
    assert (workspace.tensor.data_ptr(), workspace.tensor.numel()) == (address, MIB)
    assert bool((workspace.tensor == 7).all())
    fits = FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 1024, 16)])
    workspace.plan(fits)
    assert fits.calls == 1


def test_growth_is_logged_with_the_setting_to_raise(caplog):
    workspace = make_workspace()
    with caplog.at_level(logging.INFO, logger="mstar_resources"):
        workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 3 * MIB, 16)]))
    assert caplog.messages == [
        "workspace 'attention:decode' grew from 1048576 to 3145728 bytes for batch_decode_tmp_v; "
        "set MSTAR_WORKSPACE_BUFFER_MB=3 to reserve it up front"
    ]


@pytest.mark.parametrize(
    ("floor", "ending"),
    [
        ("MSTAR_WORKSPACE_BUFFER_MB", "Free device memory, or set MSTAR_WORKSPACE_BUFFER_MB so "
         "the workspace is reserved up front."),
        ("", "Free device memory."),
    ],
    ids=["a-setting", "no-setting"],
)  # fmt: skip
def test_a_growth_the_allocator_refuses_names_the_setting_that_reserves_it(
    monkeypatch, floor, ending
):
    workspace = make_workspace(floor=floor)
    zeros = torch.zeros

    def allocator_short_of_3_mib(*args, **kwargs):
        if args == (3 * MIB,):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 MiB")
        return zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", allocator_short_of_3_mib)
    with pytest.raises(WorkspaceGrowthError) as raised:
        workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 3 * MIB, 16)]))
    assert str(raised.value).startswith(
        "workspace 'attention:decode': could not grow from 1,048,576 to 3,145,728 bytes for "
        f"batch_decode_tmp_v; it keeps its 1,048,576-byte buffer. {ending} (CUDA out of memory"
    )
    assert (raised.value.setting, workspace.tensor.numel()) == (floor, MIB)


def test_a_workspace_no_setting_sizes_logs_its_growth_at_debug_without_advice(caplog):
    # A measurement's scratch (floor ""): no "set ...=N" line in an engine's INFO log.
    workspace = Workspace(torch.zeros(MIB, dtype=torch.uint8), "calibration", floor="")
    with caplog.at_level(logging.DEBUG, logger="mstar_resources"):
        workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 3 * MIB, 16)]))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "workspace 'calibration' grew from 1048576 to 3145728 bytes for "
         "batch_decode_tmp_v")
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("tensor", "match"),
    [
        (torch.zeros(4, 4, dtype=torch.uint8), "1-D torch.uint8 tensor, got a 2-D torch.uint8"),
        (torch.zeros(16, dtype=torch.float32), "got a 1-D torch.float32"),
        (torch.zeros(32, dtype=torch.uint8)[::2], "must be contiguous"),
        (torch.zeros(64, dtype=torch.uint8)[3:], "must be 16-byte aligned"),
        ([0] * 16, "got a list"),
    ],
    ids=["2d", "float", "strided", "misaligned", "list"],
)
def test_workspace_rejects_tensors_flashinfer_cannot_use(tensor, match):
    with pytest.raises(ResourceUsageError, match=match):
        Workspace(tensor, "w")


# --- WorkspacePool -------------------------------------------------------------------------------


def test_pool_makes_one_zeroed_workspace_per_key_at_its_floor():
    pool = WorkspacePool("cpu", size_mb=1, owner="attn")
    decode = pool.get("decode")
    assert pool.get("decode") is decode
    graph = pool.get("decode", 0)
    assert graph is not decode and pool.get("decode", 1) is not graph
    assert [w.name for w in (decode, graph)] == ["attn:decode", "attn:decode:cg0"]
    assert decode.tensor.numel() == MIB and not decode.tensor.any()
    assert decode.tensor.device == torch.device("cpu")
    assert (decode.floor, decode.sealed) == ("size_mb", False)
    assert set(pool.workspaces()) == {("decode", None), ("decode", 0), ("decode", 1)}


def test_pool_floor_comes_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("MSTAR_WORKSPACE_BUFFER_MB", "2")
    workspace = WorkspacePool(torch.device("cpu")).get("prefill")
    assert workspace.tensor.numel() == 2 * MIB
    assert workspace.floor == "MSTAR_WORKSPACE_BUFFER_MB"
    assert workspace.name == "attention:prefill"


def test_pool_seal_seals_what_exists_and_what_comes_later():
    pool = WorkspacePool("cpu", size_mb=1)
    before = pool.get("decode", 0)
    pool.seal()
    after = pool.get("decode", 1)
    assert before.sealed and after.sealed and pool.sealed
    with pytest.raises(WorkspaceSealedError, match=r"'attention:decode:cg1'.*size_mb=3 or more"):
        after.plan(FakePlanner(after.tensor, [("batch_decode_tmp_v", 3 * MIB - 16, 16)]))


def test_pool_get_from_many_threads_makes_one_workspace_per_key(monkeypatch):
    pool = WorkspacePool("cpu", size_mb=1)
    threads = 16
    start = threading.Barrier(threads)
    got: list[Workspace] = []
    allocate = WorkspacePool._allocate

    def slow_allocate(self, *args, **kwargs):
        # A slow allocation holds the door open: every thread not kept out by the pool would
        # come in meanwhile and make a workspace of its own.
        time.sleep(0.05)
        return allocate(self, *args, **kwargs)

    monkeypatch.setattr(WorkspacePool, "_allocate", slow_allocate)

    def worker():
        start.wait()
        got.append(pool.get("decode", 0))

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert len(got) == threads
    assert len({id(w) for w in got}) == 1
    assert len(pool.workspaces()) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        # A floor is a setting (the config's, or the engine's own): a config error.
        ({"size_mb": 0}, ResourceConfigError, r"size_mb=0 is not a positive whole number"),
        ({"size_mb": 1.5}, ResourceConfigError, r"size_mb=1.5 is not a positive whole number"),
        # An owner no config gave: the calling code's own mistake.
        ({"owner": ""}, ResourceUsageError, r"owner='' must name who the pool belongs to"),
        ({"owner": "  "}, ResourceUsageError, r"owner='  ' must name who the pool belongs to"),
    ],
)
def test_pool_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match) as raised:
        WorkspacePool("cpu", **kwargs)
    assert isinstance(raised.value, ResourceConfigError) is (error is ResourceConfigError)


@pytest.mark.parametrize(
    ("size_mb", "env", "setting", "floor"),
    [
        pytest.param(1, {VAR: "2"}, "resources.attn.decode.declared_mb", MIB, id="declared"),
        pytest.param(None, {VAR: "2"}, VAR, 2 * MIB, id="env"),
    ],
)
def test_a_pool_declared_in_the_config_names_its_setting(size_mb, env, setting, floor, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pool = WorkspacePool("cpu", size_mb, config_key="resources.attn.decode")
    assert pool.floor_bytes == floor
    workspace = pool.get("decode", 0)
    assert (workspace.floor, workspace.tensor.numel()) == (setting, floor)


def test_a_pool_that_serves_some_keys_refuses_others_and_makes_nothing():
    pool = WorkspacePool("cpu", size_mb=1, serves=[("decode", 0), ("decode", 1)])
    assert pool.serves == (("decode", 0), ("decode", 1))
    assert pool.get("decode", 1).tensor.numel() == MIB
    with pytest.raises(
        ResourceUsageError,
        match=r"^pool 'attention' does not serve \('decode', cg_slot=None\); it serves labels "
        r"\['decode'\] in cg slots \[0, 1\]\. Ask for one of those",
    ):
        pool.get("decode")
    assert list(pool.workspaces()) == [("decode", 1)]


def test_a_pool_checks_the_keys_it_serves_when_it_is_made():
    with pytest.raises(ResourceUsageError, match=r"cg_slot=-1 must be None \(eager\) or an int"):
        WorkspacePool("cpu", size_mb=1, serves=[("decode", -1)])


def test_pool_rejects_a_bad_variable_at_construction(monkeypatch):
    monkeypatch.setenv("MSTAR_WORKSPACE_BUFFER_MB", "lots")
    with pytest.raises(ResourceConfigError, match="MSTAR_WORKSPACE_BUFFER_MB='lots'"):
        WorkspacePool("cpu")


def test_a_workspace_needs_a_name():
    with pytest.raises(ResourceUsageError, match="name=None must be a non-empty string"):
        Workspace(torch.zeros(16, dtype=torch.uint8), None)


@pytest.mark.parametrize(
    ("label", "slot", "match"),
    [
        ("", None, "label='' must be a non-empty string"),
        ("  ", None, "label='  ' must be a non-empty string"),
        ("a\tb", None, r"label='a\\tb' holds the control character"),
        (3, None, "label=3 must be a non-empty string"),
        ("decode", -1, "cg_slot=-1 must be None"),
        ("decode", "0", "cg_slot='0' must be None"),
        ("decode", True, "cg_slot=True must be None"),
    ],
)
def test_pool_rejects_bad_keys(label, slot, match):
    pool = WorkspacePool("cpu", size_mb=1)
    with pytest.raises(ResourceUsageError, match=match):
        pool.get(label, slot)
    assert pool.workspaces() == {}


def test_pool_that_cannot_allocate_its_floor_says_which_setting_to_lower():
    pool = WorkspacePool("cpu", size_mb=MAX_MB)  # 1 TiB: more than this machine has
    with pytest.raises(WorkspaceGrowthError, match=r"'attention:decode'.*lower size_mb"):
        pool.get("decode")
    assert pool.workspaces() == {}


# --- stats ---------------------------------------------------------------------------------------


def test_stats_record_growth_history_and_sealing():
    pool = WorkspacePool("cpu", size_mb=1, owner="llama")
    workspace = pool.get("decode", 0)
    assert workspace.stats() == WorkspaceStats(
        "llama:decode:cg0", MIB, MIB, "size_mb", 0, 0, None, sealed=False
    )
    planner = FakePlanner(workspace.tensor, DECODE_CHAIN)
    workspace.plan(planner)  # tmp_v: 1 MiB -> 2 MiB, then tmp_s: +16,400
    pool.seal()

    stats = workspace.stats()
    assert stats.bytes == planner.bytes_needed() == 2 * MIB + 16_400
    assert (stats.floor_bytes, stats.times_grown, stats.sealed) == (MIB, 2, True)
    assert (stats.largest_growth_bytes, stats.largest_growth_allocation) == (
        MIB,
        "batch_decode_tmp_v",
    )
    assert pool.stats() == [stats]


def test_failed_and_refused_growths_are_not_counted():
    workspace = make_workspace()
    workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 2 * MIB, 16)]))
    assert (workspace.tensor.numel(), workspace.stats().times_grown) == (2 * MIB, 1)  # counted
    with pytest.raises(WorkspaceGrowthError):
        workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 1 << 55, 16)]))
    workspace.seal()
    with pytest.raises(WorkspaceSealedError):
        workspace.plan(FakePlanner(workspace.tensor, DECODE_CHAIN))  # 2 MiB + 16,400 needed
    stats = workspace.stats()
    assert (stats.bytes, stats.times_grown, stats.largest_growth_bytes) == (2 * MIB, 1, MIB)


def test_pool_summary_is_logged_at_seal(caplog):
    pool = WorkspacePool("cpu", size_mb=1, owner="llama")
    grown = pool.get("decode", 0)
    grown.plan(FakePlanner(grown.tensor, [("batch_decode_tmp_v", 3 * MIB, 16)]))
    pool.get("prefill")
    with caplog.at_level(logging.INFO, logger="mstar_resources"):
        pool.seal()
    assert caplog.messages == [pool.summary()]
    assert pool.summary().splitlines() == [
        "llama: 2 workspaces, 4,194,304 bytes (+2,097,152 over their floors), sealed; their "
        "int workspaces 16,777,216 bytes (+0), and as many on the host",
        "  llama:decode:cg0: 3,145,728 bytes (floor 1,048,576 from size_mb), grew 1x, "
        "largest +2,097,152 for batch_decode_tmp_v, sealed",
        "  llama:prefill: 1,048,576 bytes (floor 1,048,576 from size_mb), never grew, sealed",
        "  llama:decode:cg0:int: 8,388,608 bytes (floor 8,388,608 from "
        "MSTAR_INT_WORKSPACE_BUFFER_MB), never grew, sealed",
        "  llama:prefill:int: 8,388,608 bytes (floor 8,388,608 from "
        "MSTAR_INT_WORKSPACE_BUFFER_MB), never grew, sealed",
    ]


def test_a_pool_of_one_workspace_says_so_in_the_singular():
    pool = WorkspacePool("cpu", size_mb=1, owner="llama")
    pool.get("decode")
    assert pool.summary().splitlines()[0].startswith("llama: 1 workspace, 1,048,576 bytes")


# --- what an engine reads: fields, not text; state it cannot write -------------------------------


def test_growth_error_carries_its_figures():
    workspace = make_workspace(floor="resources.attn.decode.declared_mb")
    with pytest.raises(WorkspaceGrowthError) as raised:
        workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 1 << 55, 16)]))
    error = raised.value
    assert (error.workspace, error.held_bytes, error.needed_bytes, error.setting) == (
        "attention:decode",
        MIB,
        1 << 55,
        "resources.attn.decode.declared_mb",
    )


def test_a_non_memory_error_while_growing_propagates_unchanged_and_the_buffer_stays(monkeypatch):
    workspace = make_workspace()
    workspace.tensor.fill_(7)
    address = workspace.tensor.data_ptr()
    broken = RuntimeError("CUDA error: an illegal memory access was encountered")

    def broken_context(*args, **kwargs):  # stands in for a CUDA context a kernel broke
        raise broken

    planner = FakePlanner(workspace.tensor, DECODE_CHAIN)
    monkeypatch.setattr(torch, "zeros", broken_context)
    with pytest.raises(RuntimeError) as raised:
        workspace.plan(planner)
    monkeypatch.undo()

    assert raised.value is broken  # not an out-of-memory error, and not renamed
    assert not isinstance(raised.value, torch.OutOfMemoryError | ResourceError)
    assert (workspace.tensor.data_ptr(), workspace.tensor.numel()) == (address, MIB)
    assert bool((workspace.tensor == 7).all())
    assert workspace.stats().times_grown == 0


def test_a_non_memory_error_making_a_workspace_propagates_unchanged(monkeypatch):
    pool = WorkspacePool("cpu", size_mb=1)
    broken = RuntimeError("CUDA error: an illegal memory access was encountered")

    def broken_context(*args, **kwargs):  # stands in for a CUDA context a kernel broke
        raise broken

    monkeypatch.setattr(torch, "zeros", broken_context)
    with pytest.raises(RuntimeError) as raised:
        pool.get("decode")
    assert raised.value is broken
    monkeypatch.undo()
    assert pool.workspaces() == {}


def test_floor_allocation_error_carries_its_figures():
    pool = WorkspacePool("cpu", size_mb=MAX_MB)
    with pytest.raises(WorkspaceGrowthError) as raised:
        pool.get("decode")
    error = raised.value
    assert (error.workspace, error.held_bytes, error.needed_bytes, error.setting) == (
        "attention:decode",
        0,
        MAX_MB * MIB,
        "size_mb",
    )


def test_plan_error_carries_the_workspace_and_its_bytes():
    workspace = make_workspace()
    elsewhere = torch.zeros(MIB, dtype=torch.uint8)  # the planner plans on another buffer
    with pytest.raises(WorkspacePlanError) as raised:
        workspace.plan(FakePlanner(elsewhere, DECODE_CHAIN))
    assert (raised.value.workspace, raised.value.held_bytes) == ("attention:decode", 2 * MIB)


def _sealed_error() -> WorkspaceSealedError:
    workspace = make_workspace(sealed=True)
    with pytest.raises(WorkspaceSealedError) as raised:
        workspace.plan(FakePlanner(workspace.tensor, DECODE_CHAIN))
    return raised.value


def _growth_error() -> WorkspaceGrowthError:
    workspace = make_workspace()
    with pytest.raises(WorkspaceGrowthError) as raised:
        workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 1 << 55, 16)]))
    return raised.value


@pytest.mark.parametrize(
    "make",
    [
        _sealed_error,
        _growth_error,
        lambda: ResourceConfigError("a=1 is bad", "b=2 is bad", where="the test"),
        lambda: WorkspacePlanError("it never fits", workspace="w", held_bytes=3),
    ],
    ids=["sealed", "growth", "config", "plan"],
)
def test_errors_cross_a_process_boundary_whole(make):
    """A worker process hands its parent the error, fields and all (pickle is how)."""
    error = make()
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error)
    fields = {k: v for k, v in vars(error).items() if not k.startswith("_")}
    assert fields and {k: v for k, v in vars(again).items() if not k.startswith("_")} == fields


def test_config_error_lists_its_problems_in_order():
    error = ResourceConfigError("a=1 is bad", "b=2 is bad", where="the test")
    assert error.problems == ("a=1 is bad", "b=2 is bad")
    assert str(error) == "2 problems in the test:\n  - a=1 is bad\n  - b=2 is bad"
    assert str(ResourceConfigError("only one")) == "only one"


def test_a_workspace_sealed_while_a_plan_runs_never_moves():
    """Another thread seals the workspace between the plan's overflow and its growth: the growth
    is refused as a sealed overflow, and the buffer keeps its address and size."""
    workspace = make_workspace(floor="resources.attn.decode.declared_mb")
    address = workspace.tensor.data_ptr()
    overflowing = FakePlanner(workspace.tensor, DECODE_CHAIN)

    def sealed_meanwhile() -> object:
        try:
            return overflowing()
        finally:
            workspace.seal()  # as another thread's seal() would, before the growth

    with pytest.raises(WorkspaceSealedError) as raised:
        workspace.plan(sealed_meanwhile)
    assert (workspace.tensor.data_ptr(), workspace.tensor.numel()) == (address, MIB)
    assert (raised.value.held_bytes, raised.value.needed_bytes) == (MIB, 2 * MIB)
    assert workspace.stats().times_grown == 0


def test_a_growth_beyond_any_gpu_is_refused_and_the_buffer_kept():
    workspace = make_workspace()
    with pytest.raises(WorkspaceGrowthError) as raised:
        workspace.plan(FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 10**30, 16)]))
    error = raised.value
    assert (error.workspace, error.held_bytes, error.setting) == ("attention:decode", MIB, VAR)
    assert error.needed_bytes == 10**30  # nothing taken before it
    assert "more than any GPU holds (or a tensor can count)" in str(error)
    assert workspace.tensor.numel() == MIB and workspace.stats().times_grown == 0


class ViewTakingWrapper(FakeWrapper):
    """Takes a view of its float buffer when it is built, as a wrapper that carves its buffer
    into fixed regions would: growth in place would leave the view on the old memory."""

    def __init__(self, float_workspace_buffer: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(float_workspace_buffer, **kwargs)
        self._partials = float_workspace_buffer[MIB // 2 :]


def test_a_wrapper_holding_views_of_its_buffer_is_refused_on_a_growable_workspace(plan_on):
    pool = WorkspacePool("cpu", 1, config_key="resources.attn.decode")
    workspace = pool.get("decode")
    wrapper = ViewTakingWrapper(workspace.tensor, float_allocations=[("tmp_v", 2 * MIB, 16)])
    with pytest.raises(WorkspacePlanError) as caught:
        plan_on(workspace, wrapper)
    assert caught.value.workspace == "attention:decode"
    assert "_partials" in str(caught.value)
    assert "resources.attn.decode.declared_mb" in str(caught.value)
    assert (wrapper.plans, workspace.tensor.numel()) == (0, MIB)  # not planned, not grown


def test_a_wrapper_holding_views_plans_on_a_sealed_workspace():
    """Sealed, the buffer never moves, so its views stay good."""
    pool = WorkspacePool("cpu", 1)
    workspace = pool.get("decode")
    wrapper = ViewTakingWrapper(workspace.tensor, float_allocations=[("tmp_v", MIB // 4, 16)])
    pool.seal()
    workspace.plan(wrapper.plan)
    assert wrapper.plans == 1


# Arguments of the Python API of the wrong type: each refused by name, with its value, as the
# calling code's mistake (ResourceUsageError), never taken for what it resembles.
def _sealed_as_a_string() -> object:
    return make_workspace(sealed="no")


def _served_slot(slot: object) -> object:
    pool = WorkspacePool("cpu", 1)
    pool.get("decode", 0)  # 0.0 and False are equal to 0 as keys of the pool's dict
    return pool.get("decode", slot)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "setting", "value"),
    [
        pytest.param(_sealed_as_a_string, "sealed", "no", id="workspace-sealed"),
        pytest.param(lambda: WorkspacePool("cpu", 1, config_key=5), "config_key", 5,
                     id="config-key"),
        pytest.param(lambda: WorkspacePool("cpu", 1).seal(group="x"), None, "group='x'",
                     id="seal-group"),
        pytest.param(lambda: WorkspacePool("cpu", 1).build(None, label="decode"), None,
                     "wrapper_class=None", id="build-none"),
    ],
)  # fmt: skip
def test_an_argument_of_the_wrong_type_is_refused_by_name(call, setting, value):
    with pytest.raises(ResourceUsageError) as raised:
        call()
    (problem,) = raised.value.problems
    if setting is not None:
        assert (problem.setting, problem.value) == (setting, value)
    else:
        assert problem.startswith(value), problem
    assert not isinstance(raised.value, ResourceConfigError)


@pytest.mark.parametrize("slot", [0.0, False])
def test_a_slot_of_another_type_names_its_value(slot):
    with pytest.raises(ResourceUsageError, match=rf"cg_slot={slot!r} must be None"):
        _served_slot(slot)


def test_a_wrappers_plan_through_its_workspace_set_on_it_keeps_it_in_no_cycle():
    """As the vLLM plugin sets a prefill wrapper's ``plan``: the wrapper is freed by its last
    reference, with the garbage collector off, and plans through the workspace while it lives."""
    workspace = make_workspace()
    wrapper = FakePrefillWrapper(workspace.tensor, [("batch_prefill_tmp_v", 3 * MIB, 16)])
    wrapper.plan = plan_through(workspace, wrapper.plan)
    wrapper.plan()
    assert workspace.tensor.numel() == wrapper._workspace_size == 3 * MIB
    gone = weakref.ref(wrapper)
    with collector_off():
        del wrapper
        assert gone() is None


class _DecodeWrapperRunningXqa:
    """What FlashInfer 0.7.4's decode wrapper leaves of a plan whose run it sends to XQA, on its
    float workspace (decode.py: tensor cores, backend auto, CUDA graphs, several query tokens a
    request): the flag, the batch, the heads, the page table, the query tokens, the KV dtype."""

    def __init__(self, float_workspace_buffer: torch.Tensor) -> None:
        self._float_workspace_buffer = float_workspace_buffer

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, *, q_len_per_req=1, pages_per_request=512, keeps_table=True,
             fa2_bytes=0):  # fmt: skip
        batch = len(indptr) - 1
        self._use_xqa_mtp_decode = q_len_per_req > 1
        self._batch_size, self._num_qo_heads, self._num_kv_heads = batch, num_qo_heads, num_kv_heads
        if keeps_table:
            self._block_tables = torch.zeros(batch, pages_per_request, dtype=torch.int32)
        self._xqa_mtp_q_len_per_req, self._cached_kv_data_type = q_len_per_req, torch.float16
        # Then FlashInfer plans its tensor-core FA2 decode too, on the same float workspace.
        FakePlanner(self._float_workspace_buffer, [("batch_prefill_tmp_v", fa2_bytes, 16)])()


def _xqa_plan(
    wrapper: _DecodeWrapperRunningXqa, requests: int = 4, **kwargs: Any
) -> tuple[Any, ...]:
    indptr = torch.arange(requests + 1, dtype=torch.int32)
    return (wrapper.plan, indptr, indptr, indptr, 32, 8, 128, 16), kwargs


def test_a_decode_plan_run_on_xqa_grows_the_workspace_to_what_xqa_touches(monkeypatch):
    """XQA writes its semaphores and scratch into the float workspace and checks nothing: the
    plan makes the workspace hold the most a run of its batch, query tokens and page table can
    touch; a plan of one query token, which runs natively, leaves it as it is."""
    from mstar_resources.attn.trtllm_workspace import XQA_SEMAPHORE_BYTES, xqa_workspace_bytes

    monkeypatch.setattr(_float_workspace, "sm_count", lambda device: 132)
    workspace = make_workspace(MIB, floor="resources.attn.decode.declared_mb")
    wrapper = _DecodeWrapperRunningXqa(workspace.tensor)
    (plan, *args), kwargs = _xqa_plan(wrapper)
    workspace.plan(plan, *args, **kwargs)
    assert workspace.tensor.numel() == MIB  # one query token: FlashInfer's own kernel
    (plan, *args), kwargs = _xqa_plan(wrapper, q_len_per_req=8)
    workspace.plan(plan, *args, **kwargs)
    need = xqa_workspace_bytes(batch=4, num_qo_heads=32, num_kv_heads=8, head_dim=128,
                               max_seq_len=512 * 16, sm_count=132, q_len_per_req=8)  # fmt: skip
    assert workspace.tensor.numel() == need > XQA_SEMAPHORE_BYTES
    assert workspace.stats().largest_growth_allocation == "XQA's decode run"
    sealed = make_workspace(MIB, sealed=True, floor="resources.attn.decode.declared_mb")
    wrapper = _DecodeWrapperRunningXqa(sealed.tensor)
    (plan, *args), kwargs = _xqa_plan(wrapper, q_len_per_req=8)
    with pytest.raises(WorkspaceSealedError) as raised:
        sealed.plan(plan, *args, **kwargs)
    assert (raised.value.setting, raised.value.suggested_mb) == (sealed.floor, 10)
    assert (raised.value.needed_bytes, raised.value.held_bytes) == (need, MIB)
    assert sealed.tensor.numel() == MIB


def test_a_sealed_refusal_of_a_plan_run_on_xqa_asks_for_xqas_bound_not_fa2s(monkeypatch):
    """Sealed below both, the plan's FA2 partials overflow first: the refusal asks for what the
    run on XQA touches, which FlashInfer's workspace_size() does not give, so that one raise of
    the floor makes room for both."""
    from mstar_resources.attn.trtllm_workspace import xqa_workspace_bytes

    monkeypatch.setattr(_float_workspace, "sm_count", lambda device: 132)
    sealed = make_workspace(MIB, sealed=True, floor="resources.attn.decode.declared_mb")
    (plan, *args), kwargs = _xqa_plan(
        _DecodeWrapperRunningXqa(sealed.tensor), q_len_per_req=8, fa2_bytes=2 * MIB
    )
    with pytest.raises(WorkspaceSealedError) as raised:
        sealed.plan(plan, *args, **kwargs)
    need = xqa_workspace_bytes(batch=4, num_qo_heads=32, num_kv_heads=8, head_dim=128,
                               max_seq_len=512 * 16, sm_count=132, q_len_per_req=8)  # fmt: skip
    assert (raised.value.needed_bytes, raised.value.suggested_mb) == (need, 10)
    assert f"needs {need:,} in all, per the bound of XQA's decode run (batch_prefill_tmp_v" in str(
        raised.value
    )


def test_a_decode_plan_run_on_xqa_whose_shape_cannot_be_read_is_refused(monkeypatch):
    monkeypatch.setattr(_float_workspace, "sm_count", lambda device: 132)
    workspace = make_workspace()
    wrapper = _DecodeWrapperRunningXqa(workspace.tensor)
    # A FlashInfer whose decode wrapper keeps its page table elsewhere.
    (plan, *args), kwargs = _xqa_plan(wrapper, q_len_per_req=4, keeps_table=False)
    with pytest.raises(WorkspacePlanError, match="will run this plan on XQA") as raised:
        workspace.plan(plan, *args, **kwargs)
    assert (raised.value.workspace, raised.value.held_bytes) == ("attention:decode", MIB)
