"""vLLM's WorkspaceManager as a resource (``integrations/vllm/workspace_manager.py``), on a stand-in
of vLLM 0.26's manager in the shape its source has (``vllm/v1/worker/workspace.py``): a buffer per
micro-batch slot, grown by ``_ensure_workspace_size`` to what a kernel asks, refused with an
``AssertionError`` once the model runner locks it after graph capture."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from mstar_resources.attn._buffer import WorkspaceGrowthError
from mstar_resources.errors import ResourceConfigError, WorkspaceSealedError
from mstar_resources.integrations import vllm as plugin
from mstar_resources.integrations.plugin import patch_module
from mstar_resources.integrations.setting import Setting
from mstar_resources.integrations.vllm.workspace_manager import MODULE, current_slot
from mstar_resources.resolver import resolve
from mstar_resources.units import MIB
from tests.integrations import test_vllm_plugin

vllm_stand_in = test_vllm_plugin.vllm_stand_in  # the stand-in engine (a fixture)
ROOM = 64 * MIB
"""What the stand-in's allocator has free: a larger buffer runs out, as CUDA's would."""
GIB = 1024 * MIB
FREE = (70 * GIB, 80 * GIB)  # what torch.cuda.mem_get_info says: the model holds 10 GiB


class StandInManager:
    """vLLM 0.26's WorkspaceManager in shape."""

    def __init__(self, device: torch.device, num_ubatches: int = 1) -> None:
        self._device = device
        self._current_workspaces: list[torch.Tensor | None] = [None] * num_ubatches
        self._locked = False

    def lock(self) -> None:
        self._locked = True

    def unlock(self) -> None:
        self._locked = False

    def is_locked(self) -> bool:
        return self._locked

    def get_simultaneous(self, nbytes: int) -> torch.Tensor:
        return self._ensure_workspace_size(nbytes)[:nbytes]

    def _ensure_workspace_size(self, required_bytes: int) -> torch.Tensor:
        slot = manager_module.dbo_current_ubatch_id()
        current = self._current_workspaces[slot]
        if current is None or current.numel() < required_bytes:
            if self._locked:
                raise AssertionError("Workspace is locked but allocation requires more")
            self._current_workspaces[slot] = None  # let go before the larger one is asked for
            if required_bytes > ROOM:
                raise torch.OutOfMemoryError("CUDA out of memory")
            self._current_workspaces[slot] = torch.empty(required_bytes, dtype=torch.uint8)
        return self._current_workspaces[slot]


manager_module = types.ModuleType(MODULE)


def moe_kernel(manager, nbytes):
    """A kernel of vLLM's taking scratch (its name is what the refusal names)."""
    return manager.get_simultaneous(nbytes)


def served(stand_in, monkeypatch, *, declared_mb=3, cg_slots=(0, 1), ubatches=2):
    """The stand-in engine with vLLM's manager made (as its worker does before the profile), and a
    deployment that declares the manager's floor (``declared_mb`` None: declares none)."""
    global manager_module
    manager_module = types.ModuleType(MODULE)
    manager_module.WorkspaceManager = type("WorkspaceManager", (StandInManager,), {})
    manager = manager_module.WorkspaceManager(torch.device("cpu"), ubatches)
    manager_module.current_workspace_manager = lambda: manager
    manager_module.is_workspace_manager_initialized = lambda: True
    manager_module.ubatch = 0
    manager_module.dbo_current_ubatch_id = lambda: manager_module.ubatch
    monkeypatch.setitem(sys.modules, MODULE, manager_module)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: FREE)
    state = stand_in.served
    patch_module(state, plugin.SEAMS, manager_module)
    if declared_mb is not None:
        tree = {"owner": "vllm", "labels": ["workspace_manager"], "cg_slots": list(cg_slots),
                "declared_mb": declared_mb}  # fmt: skip
        (record,) = resolve({"vllm": {"workspace_manager": tree}}, {})
        records = (*state.setting.records, record)
        state.setting = Setting(plugin.ENV_VAR, state.setting.value, records)
    stand_in.runner.vllm_config.scheduler_config = types.SimpleNamespace(
        max_num_batched_tokens=8192
    )
    stand_in.runner.vllm_config.cache_config.gpu_memory_utilization = 0.9  # 72 GiB: 62 left
    return state, manager


def test_the_declared_floor_is_made_in_each_slot_before_the_profile(vllm_stand_in, monkeypatch):
    state, manager = served(vllm_stand_in, monkeypatch)
    vllm_stand_in.runner.profile_run()
    assert [t.numel() for t in manager._current_workspaces] == [3 * MIB, 3 * MIB]
    slot = manager._current_workspaces[0]
    moe_kernel(manager, 2 * MIB)  # within the floor: no growth
    assert manager._current_workspaces[0] is slot
    moe_kernel(manager, 4 * MIB)  # before the lock: vLLM's own growth, as it is
    manager.lock()
    report = state.report()["workspace_manager"]
    assert report == {
        "floor_setting": "resources.vllm.workspace_manager.declared_mb",
        "bytes_before_profile": [3 * MIB, 3 * MIB],
        "bytes_at_seal": [4 * MIB, 3 * MIB],
        "sealed_when": "vLLM locked it",
        "growths_refused_after_seal": 0,
        "sealed": True,
    }


def test_a_growth_after_vllms_lock_names_the_caller_the_bytes_and_the_setting(
    vllm_stand_in, monkeypatch
):
    state, manager = served(vllm_stand_in, monkeypatch)
    vllm_stand_in.runner.profile_run()
    manager.lock()
    manager_module.ubatch = 1
    held = manager._current_workspaces[1]
    with pytest.raises(WorkspaceSealedError) as refused:
        moe_kernel(manager, 5 * MIB + 1)
    error = refused.value
    assert (error.workspace, error.held_bytes, error.needed_bytes) == (
        "vllm.workspace_manager:1",
        3 * MIB,
        5 * MIB + 1,
    )
    assert (error.setting, error.suggested_mb) == (
        "resources.vllm.workspace_manager.declared_mb",
        6,
    )
    assert "test_vllm_workspace_manager.py" in str(error) and ":moe_kernel" in str(error)
    assert "resources.vllm.workspace_manager.declared_mb=6 or more" in str(error)
    assert manager._current_workspaces[1] is held  # sealed: the slot keeps its buffer
    assert state.report()["workspace_manager"]["growths_refused_after_seal"] == 1


def test_graph_capture_seals_it_where_vllm_never_locks_it(vllm_stand_in, monkeypatch):
    """vLLM 0.26 to 0.29's V2 model runner captures graphs over the manager's buffers and never
    locks it: a growth would move a buffer the graphs replay into."""
    state, manager = served(vllm_stand_in, monkeypatch)
    vllm_stand_in.runner.profile_run()
    vllm_stand_in.runner.capture_model()
    assert not manager.is_locked()
    held = manager._current_workspaces[0]
    moe_kernel(manager, 3 * MIB)  # within what it holds: served
    with pytest.raises(WorkspaceSealedError) as refused:
        moe_kernel(manager, 3 * MIB + 1)
    assert "(as vLLM captures CUDA graphs over it)" in str(refused.value)
    assert manager._current_workspaces[0] is held
    manager.lock()  # vLLM's lock after it: sealed already, as it was
    assert state.manager.sealed_when == "vLLM captures CUDA graphs over it"


def test_without_graphs_vllm_grows_it_after_the_warm_up_as_it_would(vllm_stand_in, monkeypatch):
    _, manager = served(vllm_stand_in, monkeypatch)
    vllm_stand_in.worker.eager = True
    vllm_stand_in.runner.profile_run()
    vllm_stand_in.worker.compile_or_warm_up_model()  # seals the attention workspaces
    moe_kernel(manager, 8 * MIB)
    assert manager._current_workspaces[0].numel() == 8 * MIB


def test_vllms_own_unlock_is_followed_and_its_next_lock_seals_again(vllm_stand_in, monkeypatch):
    state, manager = served(vllm_stand_in, monkeypatch)
    vllm_stand_in.runner.profile_run()
    manager.lock()
    manager.unlock()  # elastic EP scaling: the number of experts changes
    moe_kernel(manager, 6 * MIB)
    assert not state.manager.sealed
    manager.lock()
    assert state.manager.sealed and state.manager.at_seal == [6 * MIB, 3 * MIB]


def test_without_a_declared_floor_vllm_grows_it_and_the_lock_still_seals(
    vllm_stand_in, monkeypatch
):
    state, manager = served(vllm_stand_in, monkeypatch, declared_mb=None)
    vllm_stand_in.runner.profile_run()
    assert manager._current_workspaces == [None, None]  # nothing made up front
    moe_kernel(manager, 2 * MIB)  # vLLM's profile grows it
    manager.lock()
    with pytest.raises(WorkspaceSealedError) as refused:
        moe_kernel(manager, 3 * MIB)
    assert refused.value.setting == "resources.vllm.workspace_manager.declared_mb"
    assert state.report()["workspace_manager"]["bytes_at_seal"] == [2 * MIB, 0]


def test_a_growth_the_gpu_has_no_room_for_says_what_was_free_and_what_to_lower(
    vllm_stand_in, monkeypatch
):
    _, manager = served(vllm_stand_in, monkeypatch)
    vllm_stand_in.runner.profile_run()
    with pytest.raises(WorkspaceGrowthError) as short:
        moe_kernel(manager, ROOM + 1)
    error = short.value
    assert isinstance(error, torch.OutOfMemoryError)  # an engine's OOM handling still sees one
    assert (error.needed_bytes, error.held_bytes) == (ROOM + 1, 3 * MIB)
    text = str(error)
    assert f"{FREE[0]:,} of {FREE[1]:,} bytes free" in text and ":moe_kernel" in text
    assert "lower max_num_batched_tokens (now 8,192)" in text


def test_a_declared_floor_with_no_room_ends_the_start_naming_the_floor(vllm_stand_in, monkeypatch):
    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    served(vllm_stand_in, monkeypatch, declared_mb=2048)
    monkeypatch.setattr(torch, "empty", no_room)
    with pytest.raises(WorkspaceGrowthError) as short:
        vllm_stand_in.runner.profile_run()
    assert vllm_stand_in.runner.profiled == 0  # the profile never ran
    text = str(short.value)
    assert f"needs {2048 * MIB:,} bytes for the plugin's floor" in text
    assert text.endswith(": lower resources.vllm.workspace_manager.declared_mb (now 2048 MB)")


def test_floors_that_leave_no_kv_cache_in_vllms_budget_end_the_start(vllm_stand_in, monkeypatch):
    def made(*args, **kwargs):
        raise AssertionError("nothing is allocated")

    served(vllm_stand_in, monkeypatch, declared_mb=32 * 1024)  # two slots: 64 GiB
    monkeypatch.setattr(torch, "empty", made)
    with pytest.raises(ResourceConfigError) as refused:
        vllm_stand_in.runner.profile_run()
    assert vllm_stand_in.runner.profiled == 0
    text = str(refused.value)
    assert text.startswith(f"resources.vllm.workspace_manager.declared_mb=32768 makes {64 * GIB:,}")
    assert f"gpu_memory_utilization=0.9 of the GPU's {80 * GIB:,} bytes" in text
    assert f"less the {10 * GIB:,} it holds now" in text and f"leaves {62 * GIB:,}" in text


def test_the_floor_fills_only_the_slots_it_serves_and_keeps_a_larger_buffer(
    vllm_stand_in, monkeypatch
):
    _, manager = served(vllm_stand_in, monkeypatch, cg_slots=(1, 7))  # 7: no such slot
    larger = torch.empty(5 * MIB, dtype=torch.uint8)
    manager._current_workspaces[1] = larger
    vllm_stand_in.runner.profile_run()
    assert manager._current_workspaces == [None, larger]


def test_the_slot_is_vllms_own_count_where_the_release_has_one():
    module = types.ModuleType(MODULE)
    module.dbo_current_ubatch_id = lambda: 1
    lanes = types.SimpleNamespace(get=lambda: 1)
    old = types.SimpleNamespace(_num_lanes=2)  # 0.28 to 0.30: (micro-batch, lane)
    newer = types.SimpleNamespace(_get_workspace_id=lambda: 5)  # 0.31+
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, MODULE, module)
        assert current_slot(types.SimpleNamespace()) == 1  # 0.26, 0.27: the micro-batch
        module._workspace_lane = lanes
        assert current_slot(old) == 3
        assert current_slot(newer) == 5


def test_a_failure_of_the_plugins_own_leaves_the_manager_as_vllm_makes_it(
    vllm_stand_in, monkeypatch, caplog
):
    def broken(*args):
        raise KeyError("a vLLM the plugin does not expect")

    state, manager = served(vllm_stand_in, monkeypatch)
    monkeypatch.setattr(type(state.manager), "_check_budget", broken)
    vllm_stand_in.runner.profile_run()
    assert vllm_stand_in.runner.profiled == 1  # vLLM went on, its attention served
    assert manager._current_workspaces == [None, None] and state.held_bytes == 6 * MIB
    assert "workspace manager is left as vLLM makes it" in caplog.text


def test_a_capture_that_captures_no_graph_leaves_it_growing_as_vllm_does(
    vllm_stand_in, monkeypatch
):
    """``cudagraph_mode`` NONE with ``enforce_eager`` off: vLLM calls its capture, which captures
    nothing and never locks the manager; it grows as vLLM grows it."""
    state, manager = served(vllm_stand_in, monkeypatch)
    vllm_stand_in.runner.cudagraph_mode_none = True
    vllm_stand_in.runner.profile_run()
    vllm_stand_in.worker.compile_or_warm_up_model()
    moe_kernel(manager, 8 * MIB)
    assert manager._current_workspaces[0].numel() == 8 * MIB and not state.manager.sealed
    assert state.sealed  # the attention workspaces: sealed before serving, as ever
    manager.lock()
    with pytest.raises(WorkspaceSealedError):
        moe_kernel(manager, 9 * MIB)


def test_a_sealed_manager_refuses_nothing_to_the_next_engines_manager(vllm_stand_in, monkeypatch):
    """The next engine's worker makes a manager of its own (0.33+'s MLA prefill grows it as the
    model is built), while the last engine's runner may still be alive."""
    _, manager = served(vllm_stand_in, monkeypatch)
    vllm_stand_in.runner.profile_run()
    manager.lock()
    following = manager_module.WorkspaceManager(torch.device("cpu"), 2)
    manager_module.current_workspace_manager = lambda: following
    moe_kernel(following, 5 * MIB)
    assert following._current_workspaces[0].numel() == 5 * MIB


def test_a_refusal_in_a_slot_the_floor_is_not_made_in_names_the_slots_setting(
    vllm_stand_in, monkeypatch
):
    _, manager = served(vllm_stand_in, monkeypatch, cg_slots=(0,))
    vllm_stand_in.runner.profile_run()
    moe_kernel(manager, MIB)  # slot 0's floor holds it
    manager_module.ubatch = 1  # a second micro-batch (DBO): no floor there
    moe_kernel(manager, MIB)
    manager.lock()
    with pytest.raises(WorkspaceSealedError) as refused:
        moe_kernel(manager, 2 * MIB)
    assert refused.value.suggested_mb == 3  # the declared floor holds it, once made there
    assert (
        "add 1 to resources.vllm.workspace_manager.cg_slots (now [0]), whose slots alone the "
        "floor is made in, and declare resources.vllm.workspace_manager.declared_mb=3 or more"
    ) in str(refused.value)


def test_vllm_034s_resolved_memory_share_is_the_budget(vllm_stand_in, monkeypatch):
    """0.34's ``gpu_memory_utilization`` is None unless given; the share vLLM uses is resolved."""
    served(vllm_stand_in, monkeypatch, declared_mb=32 * 1024)
    cache = vllm_stand_in.runner.vllm_config.cache_config
    cache.gpu_memory_utilization, cache.resolved_gpu_memory_utilization = None, 0.9
    with pytest.raises(ResourceConfigError, match=r"gpu_memory_utilization=0\.9 of the GPU's"):
        vllm_stand_in.runner.profile_run()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="co_qualname is Python 3.11's")
def test_vllms_own_messages_still_name_the_kernel_that_asked(vllm_stand_in, monkeypatch):
    """vLLM 0.32+ names the first frame whose qualified name is not ``WorkspaceManager.``'s: the
    plugin's check runs under the qualified name of the method it wraps."""
    _, manager = served(vllm_stand_in, monkeypatch)
    code = type(manager)._ensure_workspace_size.__code__
    assert code.co_qualname == "StandInManager._ensure_workspace_size"  # vLLM's: WorkspaceManager.
