"""The vLLM plugin's reserve, followed call by call: above the core (the integrations, calibration
and config layers of docs/architecture.md; the pools' own calls into ``attn/``, ``errors``,
``floor`` and ``units`` left out), each module is entered for one step and left, not visited back
and forth. ``pytest -s`` prints the path."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from tests.integrations import test_vllm_plugin
from tests.test_layers import LAYERS, layer

vllm_stand_in = test_vllm_plugin.vllm_stand_in  # the stand-in engine (a fixture)

MOST_STAYS = 16
MOST_RETURNS = 10  # calls into a module the path had left
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


def test_the_reserve_path_visits_each_module_for_a_step(vllm_stand_in):
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    path = modules_called(lambda: served.reserve(runner))
    returns = sum(module in path[:i] for i, module in enumerate(path))
    print(f"\n{len(set(path))} modules, {len(path)} stays, {returns} returns:", " > ".join(path))
    assert served.held_bytes > 0  # it reserved: the whole path was followed
    assert len(path) <= MOST_STAYS and returns <= MOST_RETURNS, " > ".join(path)
