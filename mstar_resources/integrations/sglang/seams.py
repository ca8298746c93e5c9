"""The names of SGLang's the plugin takes or reads, the versions they were read in, and the
patches. Each patch waits for its module's import (``_post_import``): an SGLang process that never
builds a model (the tokenizer, the detokenizer) never imports SGLang's model runner for it."""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from ...errors import ResourceConfigError
from .._post_import import when_imported
from ..seam import Seam, installed_version, lacking
from ..seam import missing_seams as _missing
from .setting import SGLANG
from .workspaces import SglangWorkspaces, logger

__all__ = ["SEAMS", "SUPPORTED_SGLANG", "active", "missing_seams", "register"]

SUPPORTED_SGLANG = ("0.5.17", "0.5.23")
"""The SGLang versions whose source the seams below were read in. SGLang's patch releases move
its internals, so another version, a patch release included, is left as it is."""

BACKEND = "sglang.srt.layers.attention.flashinfer_backend"
RUNNER = "sglang.srt.model_executor.model_runner"
CONTEXT = "sglang.srt.runtime_context"
WRAPPERS = ("BatchPrefillWithRaggedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
            "BatchDecodeWithPagedKVCacheWrapper")  # fmt: skip
"""FlashInfer's wrappers, as SGLang's backend imports them: each plans with ``begin_forward``."""

SEAMS = (
    Seam(RUNNER, "ModelRunner.alloc_memory_pool"),
    Seam(RUNNER, "ModelRunner.init_cuda_graphs"),
    Seam(RUNNER, "ModelRunner.use_mla_backend", instance=True),
    Seam(CONTEXT, "get_buffer"),
    # auto: the settings in effect (the parallel widths, the scheduler's limits, the graphs)
    *(Seam(CONTEXT, name) for name in ("get_parallel", "get_schedule", "get_exec", "get_spec")),
    *(Seam(RUNNER, f"ModelRunner.{name}", instance=True) for name in ("model_config", "page_size")),
    Seam(BACKEND, "FlashInferAttnBackend.__init__"),
    *(Seam(BACKEND, f"FlashInferAttnBackend.{name}", instance=True)
      for name in ("workspace_buffer", "prefill_wrapper_ragged", "prefill_wrappers_paged",
                   "prefill_wrappers_verify", "decode_wrappers", "num_wrappers")),
    Seam(BACKEND, "FlashInferAttnBackend._create_decode_wrappers"),
    Seam(BACKEND, "fast_decode_plan"),
    Seam(BACKEND, "fast_prefill_plan"),
    *(Seam(BACKEND, name) for name in WRAPPERS),
)  # fmt: skip
"""Every name of SGLang's the plugin relies on; ``tests/integrations`` checks each in the source
of every version in :data:`SUPPORTED_SGLANG` (``scripts/engine_seams.py``)."""


def missing_seams(modules: Mapping[str, Any], seams: Sequence[Seam] = SEAMS) -> list[Seam]:
    """The required seams of SGLang's that ``modules`` lack (:func:`..seam.missing_seams`)."""
    return _missing(modules, seams)


def _has_seams(workspaces: SglangWorkspaces, module: ModuleType) -> bool:
    lacks = lacking(module, SEAMS)
    if lacks is not None:
        workspaces.leave_untouched(f"this SGLang lacks {lacks}")
    return lacks is None


def _patch_runner(workspaces: SglangWorkspaces, module: ModuleType) -> None:
    """SGLang's model runner: the workspaces made before it sizes its KV pool, sealed before it
    captures CUDA graphs."""
    if not _has_seams(workspaces, module):
        return
    runner = module.ModelRunner
    alloc_memory_pool, init_cuda_graphs = runner.alloc_memory_pool, runner.init_cuda_graphs

    @functools.wraps(alloc_memory_pool)
    def reserve_then_allocate(self: Any, *args: Any, **kwargs: Any) -> Any:
        from sglang.srt.runtime_context import get_buffer

        try:
            workspaces.reserve(self, get_buffer)
        except Exception as error:  # the plugin's own failure must not stop SGLang
            workspaces.leave_untouched(f"it failed ({type(error).__name__}: {error})")
        return alloc_memory_pool(self, *args, **kwargs)

    @functools.wraps(init_cuda_graphs)
    def seal_then_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        workspaces.seal("captures CUDA graphs (or, with none, serves)")
        return init_cuda_graphs(self, *args, **kwargs)

    runner.alloc_memory_pool, runner.init_cuda_graphs = reserve_then_allocate, seal_then_capture


def _patch_backend(workspaces: SglangWorkspaces, module: ModuleType) -> None:
    """SGLang's FlashInfer backend: its prefill wrappers on the prefill workspace, and every plan
    of a wrapper on a workspace of the plugin's through it."""
    if not _has_seams(workspaces, module):
        return
    backend = module.FlashInferAttnBackend
    init, create_decode_wrappers = backend.__init__, backend._create_decode_wrappers

    @functools.wraps(init)
    def build_then_adopt(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        workspaces.adopt(self)

    @functools.wraps(create_decode_wrappers)
    def create_then_share_int(self: Any, *args: Any, **kwargs: Any) -> Any:
        wrappers = create_decode_wrappers(self, *args, **kwargs)  # one CUDA graph's
        workspaces.share_int(self, wrappers)
        return wrappers

    backend.__init__, backend._create_decode_wrappers = build_then_adopt, create_then_share_int
    # FlashInfer's own: a wrapper on no workspace of the plugin's plans as it did.
    _route(workspaces, module, "fast_decode_plan")
    _route(workspaces, module, "fast_prefill_plan")  # SGLang's, for its prefill graph wrappers
    for name in WRAPPERS:
        _route(workspaces, getattr(module, name), "begin_forward")


def _route(workspaces: SglangWorkspaces, owner: Any, name: str) -> None:
    """``owner.name`` (a planner taking the wrapper first) through :meth:`SglangWorkspaces.plan`,
    unless it already is."""
    plan = getattr(owner, name)
    if getattr(plan, "_mstar_resources", False):
        return

    @functools.wraps(plan)
    def plan_on_workspace(wrapper: Any, *args: Any, **kwargs: Any) -> Any:
        return workspaces.plan(plan, wrapper, *args, **kwargs)

    plan_on_workspace._mstar_resources = True  # type: ignore[attr-defined]
    setattr(owner, name, plan_on_workspace)


_active: SglangWorkspaces | None = None


def active() -> SglangWorkspaces | None:
    """This process's workspaces, where the plugin is enabled in it (None: it is not)."""
    return _active


def sglang_version() -> str | None:
    return installed_version("sglang")


def version_problem(version: str | None) -> str | None:
    """Why the plugin does not serve SGLang ``version`` (None: it does, seams permitting)."""
    if version is None:
        return "SGLang is not installed here"
    if version.split("+")[0] not in SUPPORTED_SGLANG:
        return (
            f"SGLang {version} is not one this plugin was read in ({', '.join(SUPPORTED_SGLANG)})"
        )
    return None


def register() -> None:
    """SGLang's entry point (``sglang.srt.plugins``): in every SGLang process, read the setting
    and, where it is set and this SGLang is one the seams were read in, patch them as their
    modules are imported. Once per process; without the setting it does nothing at all. A bad
    setting ends the process with status 2 and one paragraph naming the setting and its value
    (SGLang would log an exception of a plugin's and start without it)."""
    global _active
    try:
        setting = SGLANG.read()
    except ResourceConfigError as error:
        # SGLang logs a plugin's exception and starts without it; a bad setting stops the start.
        print(f"mstar-resources: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if setting is None or _active is not None:
        return
    workspaces = SglangWorkspaces(setting)
    problem = version_problem(sglang_version())
    if problem is not None:
        workspaces.leave_untouched(problem)
        return
    _active = workspaces
    logger.info("mstar-resources: %s: SGLang's FlashInfer workspaces from its pools",
                setting.describe())  # fmt: skip
    when_imported(RUNNER, functools.partial(_patch_runner, workspaces))
    when_imported(BACKEND, functools.partial(_patch_backend, workspaces))
