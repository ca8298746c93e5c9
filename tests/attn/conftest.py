"""The ways a wrapper's plan reaches a workspace, for tests whose behaviour must hold in each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mstar_resources.attn._float_workspace import Workspace, plan_through

PlanOn = Callable[..., Any]
"""``plan_on(workspace, wrapper, *args, **kwargs)``: ``wrapper``'s plan through ``workspace``."""


def _workspace_plan(workspace: Workspace, wrapper: Any, *args: Any, **kwargs: Any) -> Any:
    return workspace.plan(wrapper.plan, *args, **kwargs)


def _through_bound(workspace: Workspace, wrapper: Any, *args: Any, **kwargs: Any) -> Any:
    # As the vLLM plugin rebinds a prefill wrapper's plan.
    return plan_through(workspace, wrapper.plan)(*args, **kwargs)


def _through_wrapper_first(workspace: Workspace, wrapper: Any, *args: Any, **kwargs: Any) -> Any:
    # As vLLM's fast_plan_decode(wrapper, ...) and SGLang's patched classes plan.
    return plan_through(workspace, type(wrapper).plan)(wrapper, *args, **kwargs)


@pytest.fixture(
    params=[_workspace_plan, _through_bound, _through_wrapper_first],
    ids=["Workspace.plan", "plan_through-bound", "plan_through-wrapper-first"],
)
def plan_on(request: pytest.FixtureRequest) -> PlanOn:
    return request.param
