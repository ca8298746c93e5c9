"""SGLang's FlashInfer workspaces from this library (docs/sglang.md): SGLang loads
:func:`register` (entry point ``sglang.srt.plugins``) in each of its processes; it does nothing
unless ``MSTAR_RESOURCES_SGLANG`` is set. Here, the names of SGLang's the plugin takes or reads,
and the patches, as data (:class:`~..plugin.Seam`); each patch waits for its module's import
(the tokenizer's process never imports the runner)."""

from __future__ import annotations

import functools
from typing import Any

from ..plugin import PATCHED, EnginePlugin, Seam, after, before
from .workspaces import ENV_VAR, SGLANG, SglangWorkspaces

__all__ = [
    "ENV_VAR", "PLUGIN", "READ_IN", "SEAMS", "SGLANG", "active", "register", "version_problem"
]  # fmt: skip

READ_IN = ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
"""The SGLang releases whose wheels every seam below was read in."""

BACKEND = "sglang.srt.layers.attention.flashinfer_backend"
RUNNER = "sglang.srt.model_executor.model_runner"
CONTEXT = "sglang.srt.runtime_context"
WRAPPERS = ("BatchPrefillWithRaggedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
            "BatchDecodeWithPagedKVCacheWrapper")  # fmt: skip
"""FlashInfer's wrappers, as SGLang's backend imports them: each plans with ``begin_forward``."""


# -- the patches: each (state, SGLang's original, its owner) -> what replaces it -----------------


def _reserve(workspaces: SglangWorkspaces, runner: Any) -> None:
    """The workspaces made before the model runner sizes its KV pool from what is free."""
    from sglang.srt.runtime_context import get_buffer

    try:
        workspaces.reserve(runner, get_buffer)
    except Exception as error:  # the plugin's own failure must not stop SGLang
        workspaces.leave_untouched(f"it failed ({type(error).__name__}: {error})")


TRTLLM_BACKEND = "TRTLLMHAAttnBackend"
"""SGLang's TRT-LLM MHA backend (``trtllm_mha_backend.py``, 0.5.17 to 0.5.23), a subclass of its
FlashInfer backend that runs other kernels on a workspace of its own; its other subclass, LLaDA2's
CFG backend (0.5.22+), plans FlashInfer wrappers as the backend does, and a ragged prefill wrapper
of its own, made after the backend's ``__init__``: on the decode workspace, which it grows."""


def _adopt_when_built(workspaces: SglangWorkspaces, init: Any, owner: Any) -> Any:
    """A FlashInfer backend: its prefill wrappers on the prefill workspace once built (not SGLang's
    TRT-LLM MHA backend's)."""

    @functools.wraps(init)
    def build_then_adopt(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if type(self).__name__ == TRTLLM_BACKEND:
            workspaces.not_adopted(TRTLLM_BACKEND)
        else:
            workspaces.adopt(self)

    return build_then_adopt


def _through_workspace(workspaces: SglangWorkspaces, plan: Any, owner: Any) -> Any:
    """A planner taking the wrapper first: through the wrapper's workspace where it is ours."""

    @functools.wraps(plan)
    def plan_on_workspace(wrapper: Any, *args: Any, **kwargs: Any) -> Any:
        return workspaces.plan(plan, wrapper, *args, **kwargs)

    return plan_on_workspace


def _begin_forward_through_workspace(workspaces: SglangWorkspaces, cls: Any, owner: Any) -> Any:
    """A FlashInfer wrapper class as SGLang's backend imports it: its ``begin_forward`` through
    the plugin's workspace. On the class, not each wrapper: SGLang builds wrappers inside its
    capture and replay paths too, and rebinds some wrappers' ``begin_forward`` itself."""
    plan = cls.begin_forward
    if not getattr(plan, PATCHED, False):
        cls.begin_forward = _through_workspace(workspaces, plan, cls)
        setattr(cls.begin_forward, PATCHED, True)
    return cls


SEAMS = (
    Seam(RUNNER, "ModelRunner.alloc_memory_pool", patch=before(_reserve)),
    # sealed before the model runner's CUDA graphs (called also where it captures none)
    Seam(RUNNER, "ModelRunner.init_cuda_graphs", patch=before(
        lambda state, runner: state.seal("captures CUDA graphs (or, with none, serves)"))),
    # a prefill instance switching to decode captures decode graphs on the sealed workspaces
    Seam(RUNNER, "ModelRunner.ensure_decode_cuda_graphs", required=False, since="0.5.21",
         patch=before(SglangWorkspaces.decode_graphs_after_seal)),
    Seam(RUNNER, "ModelRunner.use_mla_backend", instance=True),
    Seam(CONTEXT, "get_buffer"),
    # auto: the settings in effect (the parallel widths, the scheduler's limits, the graphs)
    *(Seam(CONTEXT, name) for name in ("get_parallel", "get_schedule", "get_exec", "get_spec")),
    *(Seam(RUNNER, f"ModelRunner.{name}", instance=True) for name in ("model_config", "page_size")),
    Seam(BACKEND, "should_use_tensor_core"),  # auto: the decode kernel SGLang's backend picks
    Seam(BACKEND, "FlashInferAttnBackend.__init__", patch=_adopt_when_built),
    *(Seam(BACKEND, f"FlashInferAttnBackend.{name}", instance=True)
      for name in ("workspace_buffer", "prefill_wrapper_ragged", "prefill_wrappers_paged",
                   "prefill_wrappers_verify", "decode_wrappers", "num_wrappers")),
    # one CUDA graph's decode wrappers, given the shared int workspace
    Seam(BACKEND, "FlashInferAttnBackend._create_decode_wrappers",
         patch=after(SglangWorkspaces.share_int)),
    Seam(BACKEND, "fast_decode_plan", patch=_through_workspace),
    Seam(BACKEND, "fast_prefill_plan", patch=_through_workspace),
    *(Seam(BACKEND, name, patch=_begin_forward_through_workspace) for name in WRAPPERS),
)  # fmt: skip
"""Every name of SGLang's the plugin relies on (``scripts/engine_seams.py`` checks each wheel)."""

PLUGIN = EnginePlugin(SGLANG, "sglang", READ_IN, SEAMS, SglangWorkspaces)

active, register, version_problem = PLUGIN.active, PLUGIN.register, PLUGIN.version_problem
