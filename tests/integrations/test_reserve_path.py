"""The vLLM plugin's reserve, followed call by call: above the core (the integrations, calibration
and config layers of docs/architecture.md; the pools' own calls into ``attn/``, ``errors``,
``floor`` and ``units`` left out), each module is entered for one step and left, not visited back
and forth, and the path climbs back up the layers once (from the pools to the plugin's log).
``pytest -s`` prints the path."""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Callable
from types import FrameType
from typing import Any

from mstar_resources.integrations.vllm import workspace_manager
from tests.integrations import test_vllm_plugin
from tests.test_layers import LAYERS, layer

vllm_stand_in = test_vllm_plugin.vllm_stand_in  # the stand-in engine (a fixture)

MOST_STAYS = 9
MOST_RETURNS = 3  # calls into a module the path had left
MOST_CLIMBS = 1  # calls into a module of a layer above the caller's
CORE = list(LAYERS).index("config")  # this layer and those above it are followed


def modules_called(run: Callable[[], object]) -> list[str]:
    """The package's modules whose functions ``run`` calls, in order, a run of calls in one
    module once, the modules below the config layer left out."""
    path: list[str] = []

    def called(frame: FrameType, event: str, arg: Any) -> None:
        module = str(frame.f_globals.get("__name__", ""))
        if event != "call" or not module.startswith("mstar_resources."):
            return
        module = module.removeprefix("mstar_resources.")
        if layer(module) >= CORE and (not path or path[-1] != module):
            path.append(module)

    sys.setprofile(called)
    try:
        run()
    finally:
        sys.setprofile(None)
    return path


def test_the_reserve_path_visits_each_module_for_a_step(vllm_stand_in, monkeypatch):
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    manager = types.SimpleNamespace(_current_workspaces=[None], _device="cpu")
    vllm_workspace = types.ModuleType(workspace_manager.MODULE)  # vLLM's manager, made
    vllm_workspace.is_workspace_manager_initialized = lambda: True
    vllm_workspace.current_workspace_manager = lambda: manager
    monkeypatch.setitem(sys.modules, workspace_manager.MODULE, vllm_workspace)
    path = modules_called(lambda: served.reserve(runner))
    returns = sum(module in path[:i] for i, module in enumerate(path))
    climbs = sum(layer(after) > layer(before) for before, after in itertools.pairwise(path))
    print(f"\n{len(set(path))} modules, {len(path)} stays, {returns} returns, {climbs} climbs:",
          " > ".join(path))  # fmt: skip
    assert served.held_bytes > 0 and served.manager.reserved == [0]  # the whole path was followed
    assert len(path) <= MOST_STAYS, " > ".join(path)
    assert returns <= MOST_RETURNS and climbs <= MOST_CLIMBS, " > ".join(path)


AUTO_MOST_STAYS = 13  # with the measurement stood in; each step takes every phase at once
AUTO_MOST_RETURNS = 4
AUTO_MOST_CLIMBS = 4  # to measure, to make the records, the pools and the log


def test_auto_takes_every_phase_through_each_step_at_once(vllm_stand_in, monkeypatch):
    """``auto`` (the measurement on FlashInfer's wrappers stood in): every native phase's profile
    is made, then every need measured, every floor converted and every record made, each in one
    step, then the pools."""
    from mstar_resources.calibration.calibrate import Measured
    from mstar_resources.integrations.vllm import plans as vllm_plans
    from mstar_resources.integrations.vllm import workspaces

    def needs(profiles, device):
        return [Measured(f"attn.{role}", 3 << 20, f"{role}: bs=1", "query", 10_000)
                for role, _, _ in profiles]  # fmt: skip

    monkeypatch.setattr(workspaces, "measured_needs", needs)
    monkeypatch.setattr(vllm_plans, "vllm_envs", lambda: types.SimpleNamespace(
        VLLM_BATCH_INVARIANT=False))  # fmt: skip
    served = workspaces.VllmWorkspaces(workspaces.Setting(workspaces.ENV_VAR, "auto"))
    runner = vllm_stand_in.runner
    path = modules_called(lambda: served.reserve(runner))
    returns = sum(module in path[:i] for i, module in enumerate(path))
    climbs = sum(layer(after) > layer(before) for before, after in itertools.pairwise(path))
    print(f"\n{len(set(path))} modules, {len(path)} stays, {returns} returns, {climbs} climbs:",
          " > ".join(path))  # fmt: skip
    assert served.held_bytes == 2 * (3 << 20)  # both phases measured and reserved
    assert len(path) <= AUTO_MOST_STAYS, " > ".join(path)
    assert returns <= AUTO_MOST_RETURNS and climbs <= AUTO_MOST_CLIMBS, " > ".join(path)
