"""Int workspaces and their host mirrors on the CPU: the floors and where they come from, a pool's
int workspace per key, wrappers built on it or given it, its growth on an int overflow and its
refusal once sealed. FakeWrapper keeps its buffers where FlashInfer's wrappers do; the real
FlashInfer is checked in test_int_workspace_gpu.py."""

from __future__ import annotations

import pytest
import torch

from mstar_resources import (
    IntWorkspace,
    ResourceConfigError,
    ResourceUsageError,
    Workspace,
    WorkspaceGrowthError,
    WorkspacePlanError,
    WorkspacePool,
    WorkspaceSealedError,
    build_pools,
    resolve,
)
from mstar_resources.units import MIB

from ..conftest import INT_VAR, compose_shipped
from .fake_allocator import FakeWrapper

INDICES = [
    ("batch_prefill_request_indices", 3 * MIB // 2, 16),
    ("batch_prefill_o_indptr", 40_004, 16),
]
"""An int allocation chain larger than a 1 MiB floor: two growths, the first the larger."""
INDEX_BYTES = 3 * MIB // 2 + 40_004


def test_the_int_floor_is_declared_else_the_variable_else_flashinfers_8_mb():
    tree = {
        "declared": {"labels": ["decode"], "int_declared_mb": 2},
        "inherited": {"labels": ["prefill"]},
    }
    declared, inherited = resolve(tree, {})
    assert (declared.int_floor.mb, declared.int_floor.source, declared.int_floor.setting) == (
        2, "declared", "resources.declared.int_declared_mb",
    )  # fmt: skip
    assert (inherited.int_floor.mb, inherited.int_floor.source) == (8, "default")
    _, from_env = resolve(tree, {INT_VAR: "3"})
    assert (from_env.int_floor.mb, from_env.int_floor.source, from_env.int_floor.setting) == (
        3, "env", INT_VAR,
    )  # fmt: skip
    # The float floor's variable leaves the int floor alone, and the other way round.
    _, float_only = resolve(tree, {"MSTAR_WORKSPACE_BUFFER_MB": "64"})
    assert (float_only.floor.mb, float_only.int_floor.mb) == (64, 8)


def test_a_deployment_and_the_command_line_declare_the_int_floor():
    cfg = compose_shipped(["resources.attn.decode.int_declared_mb=1"])
    prefill, decode = resolve(cfg.resources, {})
    assert (decode.int_floor.mb, decode.int_reserved_bytes) == (1, 2 * MIB)  # two slots
    assert (prefill.int_floor.mb, prefill.int_reserved_bytes) == (8, 8 * MIB)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (-1, "resources.d.int_declared_mb=-1 is not a whole number of MB (0: none)"),
        (True, "resources.d.int_declared_mb=True has the wrong type"),
        (2**21, "resources.d.int_declared_mb=2,097,152 MB is more than 1,048,576"),
    ],
)
def test_a_bad_int_floor_names_the_key_and_value(value, problem):
    with pytest.raises(ResourceConfigError) as raised:
        resolve({"d": {"labels": ["x"], "int_declared_mb": value}}, {})
    assert any(p.startswith(problem) for p in raised.value.problems), raised.value.problems


def test_a_bad_int_variable_is_reported_with_the_trees_problems():
    with pytest.raises(ResourceConfigError) as raised:
        resolve({"d": {"labels": []}}, {INT_VAR: "lots"})
    assert len(raised.value.problems) == 2
    assert raised.value.problems[1].startswith(f"{INT_VAR}='lots' is not a positive whole number")


def test_each_key_of_a_pool_has_an_int_workspace_with_a_mirror_of_its_size():
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=2)
    workspace = pool.get("decode", 0)
    int_workspace = workspace.int_workspace
    assert isinstance(int_workspace, IntWorkspace)
    assert (int_workspace.name, int_workspace.floor) == ("attention:decode:cg0:int", "int_size_mb")
    mirror = int_workspace.mirror
    assert (mirror.device.type, mirror.dtype, mirror.numel()) == ("cpu", torch.uint8, 2 * MIB)
    assert int_workspace.tensor.numel() == 2 * MIB
    assert pool.get("prefill").int_workspace is not int_workspace  # one per key
    assert (pool.held_bytes, pool.int_held_bytes) == (2 * MIB, 4 * MIB)


def test_pools_from_the_tree_name_the_int_setting():
    pools = build_pools({"d": {"labels": ["decode"], "int_declared_mb": 1}}, "cpu", {})
    int_workspace = pools["d"].get("decode").int_workspace
    assert int_workspace.floor == "resources.d.int_declared_mb"
    assert int_workspace.tensor.numel() == MIB


def test_build_makes_the_wrapper_on_the_keys_float_and_int_workspaces():
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    wrapper = pool.build(FakeWrapper, INDICES, label="decode", cg_slot=1)
    workspace = pool.get("decode", 1)
    assert wrapper._float_workspace_buffer is workspace.tensor
    assert wrapper._int_workspace_buffer is workspace.int_workspace.tensor
    assert wrapper._pin_memory_int_workspace_buffer is workspace.int_workspace.mirror
    assert wrapper.int_allocations == INDICES  # the rest of the arguments reach the wrapper


def test_wrappers_of_one_key_share_its_int_workspace():
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    first, second = (pool.build(FakeWrapper, label="decode") for _ in range(2))
    assert first._int_workspace_buffer is second._int_workspace_buffer
    assert first._pin_memory_int_workspace_buffer is second._pin_memory_int_workspace_buffer


def test_install_gives_an_engines_wrapper_the_int_workspace_in_place_of_its_own():
    pool = WorkspacePool("cpu", size_mb=1)
    workspace = pool.get("prefill")
    wrapper = FakeWrapper(workspace.tensor)
    own = wrapper._int_workspace_buffer
    pool.install(wrapper, "prefill")
    assert wrapper._int_workspace_buffer is workspace.int_workspace.tensor is not own


def test_install_refuses_a_wrapper_built_on_another_float_buffer():
    pool = WorkspacePool("cpu", size_mb=1)
    wrapper = FakeWrapper(torch.zeros(MIB, dtype=torch.uint8))
    own = wrapper._int_workspace_buffer
    with pytest.raises(ResourceUsageError, match=r"built on another float buffer"):
        pool.install(wrapper, "prefill")
    assert wrapper._int_workspace_buffer is own  # left as it was


def test_install_refuses_a_wrapper_without_an_int_workspace_of_its_own():
    class Cascade:  # FlashInfer's cascade wrapper keeps a list of wrappers, one per level
        def __init__(self, float_workspace_buffer: torch.Tensor) -> None:
            self._float_workspace_buffer = float_workspace_buffer
            self._batch_prefill_wrappers = [FakeWrapper(float_workspace_buffer)]

    pool = WorkspacePool("cpu", size_mb=1)
    with pytest.raises(ResourceUsageError, match=r"a Cascade keeps no int workspace of its own"):
        pool.build(Cascade, label="prefill")


def test_an_int_overflow_grows_the_int_workspace_and_its_mirror_in_place():
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    workspace = pool.get("prefill")
    int_workspace = workspace.int_workspace
    tensor, mirror = int_workspace.tensor, int_workspace.mirror
    wrapper = pool.build(FakeWrapper, INDICES, label="prefill")

    workspace.plan(wrapper.plan)

    assert int_workspace.tensor is tensor and int_workspace.mirror is mirror
    assert mirror.numel() == tensor.numel() == INDEX_BYTES
    stats = int_workspace.stats()
    assert (stats.kind, stats.times_grown, stats.largest_growth_allocation) == (
        "int",
        2,
        "batch_prefill_request_indices",
    )
    assert workspace.stats().times_grown == 0  # the float workspace had room
    assert pool.int_stats() == [stats]


def test_float_and_int_overflows_in_one_plan_grow_each_their_own():
    workspace = Workspace(
        torch.zeros(1024, dtype=torch.uint8), "w",
        int_workspace=IntWorkspace(torch.zeros(1024, dtype=torch.uint8), "w:int"),
    )  # fmt: skip
    wrapper = FakeWrapper(workspace.tensor, INDICES, [("batch_decode_tmp_v", 5000, 16)])
    wrapper._int_workspace_buffer = workspace.int_workspace.tensor
    wrapper._pin_memory_int_workspace_buffer = workspace.int_workspace.mirror
    workspace.plan(wrapper.plan)
    assert (workspace.tensor.numel(), workspace.int_workspace.tensor.numel()) == (
        5000, INDEX_BYTES
    )  # fmt: skip


def test_an_int_overflow_without_an_int_workspace_reaches_the_caller():
    workspace = Workspace(torch.zeros(MIB, dtype=torch.uint8), "w")
    wrapper = FakeWrapper(workspace.tensor, INDICES, int_bytes=1024)
    with pytest.raises(RuntimeError, match="batch_prefill_request_indices") as raised:
        workspace.plan(wrapper.plan)
    assert not isinstance(raised.value, WorkspaceSealedError)
    assert workspace.tensor.numel() == MIB


def test_an_int_overflow_of_a_planner_the_library_cannot_find_grows_nothing():
    """A plan that is no wrapper's method and takes none first: whose int buffer overflowed
    cannot be told, so nothing grows and FlashInfer's error reaches the caller as it was."""
    workspace = Workspace(
        torch.zeros(MIB, dtype=torch.uint8), "w",
        int_workspace=IntWorkspace(torch.zeros(1024, dtype=torch.uint8), "w:int"),
    )  # fmt: skip
    theirs = FakeWrapper(torch.zeros(MIB, dtype=torch.uint8), INDICES, int_bytes=1024)
    calls = []

    def plan() -> None:  # a planner of the engine's own, around a wrapper the library never saw
        calls.append(1)
        theirs.plan()

    with pytest.raises(RuntimeError, match="batch_prefill_request_indices") as raised:
        workspace.plan(plan)
    assert type(raised.value) is RuntimeError and calls == [1]  # planned once, not retried
    assert workspace.int_workspace.tensor.numel() == 1024
    assert workspace.int_workspace.stats().times_grown == 0


def test_a_sealed_int_workspace_names_its_setting_and_what_the_plan_needs():
    pools = build_pools({"d": {"labels": ["decode"], "cg_slots": [0], "int_declared_mb": 1}},
                        "cpu", {})  # fmt: skip
    pool = pools["d"]
    workspace = pool.get("decode", 0)
    big = [("batch_prefill_request_indices", 3 * MIB, 16)]
    wrapper = pool.build(FakeWrapper, big, label="decode", cg_slot=0)
    pool.seal()
    assert workspace.int_workspace.sealed
    with pytest.raises(WorkspaceSealedError) as raised:
        workspace.plan(wrapper.plan)
    error = raised.value
    assert (error.workspace, error.held_bytes, error.setting, error.suggested_mb) == (
        "attention:decode:cg0:int", MIB, "resources.d.int_declared_mb", 3,
    )  # fmt: skip
    assert error.needed_bytes == 3 * MIB  # FakeWrapper answers workspace_size() as FlashInfer
    assert "set resources.d.int_declared_mb=3 or more" in str(error)
    assert workspace.int_workspace.tensor.numel() == MIB  # never moved


def test_an_int_workspace_that_cannot_grow_keeps_both_buffers():
    int_workspace = IntWorkspace(torch.zeros(1024, dtype=torch.uint8), "w:int")
    workspace = Workspace(torch.zeros(1024, dtype=torch.uint8), "w", int_workspace=int_workspace)
    wrapper = FakeWrapper(workspace.tensor, [("batch_decode_request_indices", 1 << 55, 16)])
    wrapper._int_workspace_buffer = int_workspace.tensor
    wrapper._pin_memory_int_workspace_buffer = int_workspace.mirror
    with pytest.raises(WorkspaceGrowthError) as raised:
        workspace.plan(wrapper.plan)
    assert (raised.value.workspace, raised.value.setting) == (
        "w:int",
        "MSTAR_INT_WORKSPACE_BUFFER_MB",
    )
    assert int_workspace.mirror.numel() == int_workspace.tensor.numel() == 1024


def test_every_wrapper_on_the_int_workspace_plans_into_its_one_mirror(plan_on):
    """Plans through Workspace.plan, whichever wrapper of the key makes them, write the int
    workspace's mirror: a wrapper whose mirror was set to another buffer is given it back."""
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    workspace = pool.get("decode")
    first, second = (pool.build(FakeWrapper, label="decode") for _ in range(2))
    written = []
    for wrapper in [first, second, second, first]:  # given another mirror before each plan
        wrapper._pin_memory_int_workspace_buffer = torch.zeros(MIB, dtype=torch.uint8)
        plan_on(workspace, wrapper)
        written.append(wrapper._pin_memory_int_workspace_buffer)
    assert all(mirror is workspace.int_workspace.mirror for mirror in written)


def test_a_wrapper_with_its_own_int_workspace_keeps_its_own_mirror(plan_on):
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    workspace = pool.get("decode")
    own = FakeWrapper(workspace.tensor)
    mirror = own._pin_memory_int_workspace_buffer
    for _ in range(3):
        plan_on(workspace, own)
    assert own._pin_memory_int_workspace_buffer is mirror


def test_a_wrapper_planned_on_the_int_workspace_then_given_its_own_keeps_its_own_mirror(plan_on):
    """Whether a wrapper plans on the int workspace is asked at every plan, not only its first:
    one given an int buffer of its own later (FlashInfer's ``reset_workspace_buffer``) is handed
    no more of the int workspace's mirror, which its plan would overrun."""
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    workspace = pool.get("decode")
    wrapper = pool.build(FakeWrapper, label="decode")
    plan_on(workspace, wrapper)
    assert wrapper._pin_memory_int_workspace_buffer is workspace.int_workspace.mirror
    own_int, own_mirror = (
        torch.empty(2 * MIB, dtype=torch.uint8),
        torch.empty(2 * MIB, dtype=torch.uint8),
    )
    wrapper._int_workspace_buffer, wrapper._pin_memory_int_workspace_buffer = own_int, own_mirror
    for _ in range(3):
        plan_on(workspace, wrapper)
    assert wrapper._pin_memory_int_workspace_buffer is own_mirror


def test_a_wrapper_moved_to_another_workspace_writes_the_mirror_of_the_one_it_plans_on(plan_on):
    """A wrapper given another key's workspaces and planned there writes that int workspace's
    mirror and not the first's; given the first's back, it writes the first's again."""
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    first, second = pool.get("decode", 0), pool.get("decode", 1)
    wrapper = pool.build(FakeWrapper, label="decode", cg_slot=0)
    written = []
    for workspace, slot in ((first, 0), (second, 1), (first, 0)):
        wrapper._float_workspace_buffer = workspace.tensor
        pool.install(wrapper, "decode", slot)
        for _ in range(2):
            plan_on(workspace, wrapper)
            written.append(wrapper._pin_memory_int_workspace_buffer)
    where = {id(workspace.int_workspace.mirror): i for i, workspace in enumerate((first, second))}
    assert [where.get(id(mirror)) for mirror in written] == [0, 0, 1, 1, 0, 0]
    assert wrapper.run("q") == "ran"


def test_int_workspace_must_be_an_int_workspace():
    with pytest.raises(ResourceUsageError, match=r"int_workspace=.* must be an IntWorkspace"):
        Workspace(torch.zeros(8, dtype=torch.uint8), "w", int_workspace=torch.zeros(8))


def test_a_wrapper_whose_plan_another_overwrote_refuses_to_run(plan_on):
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    workspace = pool.get("decode", 0)
    first, second = (pool.build(FakeWrapper, label="decode", cg_slot=0) for _ in range(2))
    plan_on(workspace, first)
    assert first.run("q") == "ran"  # its own plan: it runs
    plan_on(workspace, second)
    for run in (first.run, first.run_return_lse):  # FlashInfer's run_return_lse is checked too
        with pytest.raises(WorkspacePlanError) as raised:
            run("q")
        assert raised.value.workspace == "attention:decode:cg0:int"
        assert "must each be planned right before they run" in str(raised.value)
    assert (second.run("q"), second.run_return_lse("q")) == ("ran", "ran with lse")
    plan_on(workspace, first)  # planned again, right before it runs
    assert first.run("q") == "ran"


def test_a_wrapper_given_another_keys_int_workspace_checks_only_that_one():
    pool = WorkspacePool("cpu", size_mb=1, int_size_mb=1)
    wrapper = FakeWrapper(pool.get("decode", 0).tensor)
    pool.install(wrapper, "decode", 0)
    pool.get("decode", 0).plan(pool.build(FakeWrapper, label="decode", cg_slot=0).plan)
    wrapper._float_workspace_buffer = pool.get("decode", 1).tensor
    pool.install(wrapper, "decode", 1)  # slot 0 holds another wrapper's plan: no longer its own
    pool.get("decode", 1).plan(wrapper.plan)
    assert wrapper.run("q") == "ran"


def test_an_int_floor_of_zero_reserves_no_int_workspace_and_the_wrappers_keep_their_own():
    """``int_declared_mb: 0`` (what calibration writes where the wrappers keep their own int
    workspace, FlashInfer 0.7's MLA): the pool reserves only float workspaces, and a wrapper it
    builds or is given keeps the int workspace and mirror it made."""
    (record,) = resolve({"d": {"labels": ["decode"], "int_declared_mb": 0, "declared_mb": 1}}, {})
    assert (record.int_floor.mb, record.int_floor.source) == (0, "declared")
    (pool,) = build_pools([record], "cpu").values()
    assert pool.reserve() == MIB
    workspace = pool.get("decode")
    assert workspace.int_workspace is None
    assert (pool.int_held_bytes, pool.int_stats()) == (0, [])
    wrapper = FakeWrapper(
        workspace.tensor, int_allocations=[("batch_decode_request_indices", 64, 16)]
    )
    own = wrapper._int_workspace_buffer
    pool.install(wrapper, "decode")
    assert wrapper._int_workspace_buffer is own
    workspace.plan(wrapper.plan)
    assert wrapper.plans == 1
