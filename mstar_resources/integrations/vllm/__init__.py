"""vLLM's FlashInfer workspaces from this library (docs/vllm.md): vLLM loads :func:`register`
(entry point ``vllm.general_plugins``) in each of its processes; it does nothing unless
``MSTAR_RESOURCES_VLLM`` is set. Here, the names of vLLM's the plugin takes or reads, and the
patches, as data (:class:`~..plugin.Seam`); each patch waits for its module's import (the API
server's process never imports the model runner)."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from ...floor import ENV_VAR as FLOOR_ENV_VAR
from ..plugin import EnginePlugin, Seam, after, before
from .plans import V2_RUNNER, Role
from .workspace_manager import MODULE as MANAGER
from .workspace_manager import checked_growth
from .workspaces import ENV_VAR, ROLE, VLLM, VllmWorkspaces

__all__ = [
    "ENV_VAR", "PLUGIN", "READ_IN", "SEAMS", "VLLM", "Seam", "active", "checked_launch",
    "register", "version_problem"
]  # fmt: skip

READ_IN = (
    "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0",
)  # fmt: skip
"""The vLLM releases whose wheels every seam below was read in (0.26.0 also run on an H200)."""

BACKEND = "vllm.v1.attention.backends.flashinfer"
V1_RUNNER = "vllm.v1.worker.gpu_model_runner"  # gone from 0.34
WORKER = "vllm.v1.worker.gpu_worker"
RAY_ENV = "vllm.ray.ray_env"

BUILDER_DECISIONS = (
    "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "kv_cache_dtype", "cache_dtype",
    "q_data_type_prefill", "q_data_type_decode", "use_trtllm_decode_attention",
    "flashinfer_trtllm_api_decode_kernel", "dcp_world_size", "enable_cuda_graph",
    "_decode_cudagraph_max_bs", "has_sinks", "prefill_fixed_split_size",
    "decode_fixed_split_size", "disable_split_kv",
)  # fmt: skip
"""What ``FlashInferMetadataBuilder.__init__`` decides, read from the plugin's own builders."""


# -- the patches: each (state, vLLM's original, its owner) -> what replaces it -------------------


def _workspace_buffer(workspaces: VllmWorkspaces, own_buffer: Any, owner: Any) -> Any:
    """A builder's buffer: the workspace of the wrapper being built, where the plugin serves."""

    @functools.wraps(own_buffer)
    def _get_workspace_buffer(self: Any) -> Any:
        role = ROLE.get()
        if (workspace := workspaces.workspace(self, role)) is not None:
            return workspace.tensor
        buffer = own_buffer(self)
        if role is not None:
            workspaces.unserved(role, buffer)
        return buffer

    return _get_workspace_buffer


def _built_as(role: Role) -> Callable[[VllmWorkspaces, Any, Any], Any]:
    """A wrapper getter: the wrapper built on ``role``'s workspace, and routed through it."""

    def patch(workspaces: VllmWorkspaces, getter: Any, owner: Any) -> Any:
        @functools.wraps(getter)
        def get(self: Any, *args: Any, **kwargs: Any) -> Any:
            token = ROLE.set(role)
            try:
                wrapper = getter(self, *args, **kwargs)
            finally:
                ROLE.reset(token)
            workspaces.route(wrapper, role, self)
            return wrapper

        return get

    return patch


def _trtllm_workspace(workspaces: VllmWorkspaces, own_buffer: Any, owner: Any) -> Any:
    """vLLM's TRT-LLM kernels' workspace: the plugin's, at their bound, where it made one."""

    @functools.wraps(own_buffer)
    def _get_trtllm_workspace_buffer() -> Any:
        held = workspaces.trtllm_workspace
        return own_buffer() if held is None else held.tensor

    return _get_trtllm_workspace_buffer


def checked_launch(entry: str) -> Callable[[VllmWorkspaces, Any, Any], Any]:
    """A decode entry point of FlashInfer's TRT-LLM kernels, as vLLM's backend imported it: a
    launch on the plugin's TRT-LLM workspace is checked against what it touches before it runs
    (the kernels check nothing; :class:`~...attn.trtllm_workspace.TrtllmLaunchCheck`)."""

    def patch(workspaces: VllmWorkspaces, launch: Any, owner: Any) -> Any:
        parameters = tuple(inspect.signature(launch).parameters)  # its own order, positional

        @functools.wraps(launch)
        def checked_launch(*args: Any, **kwargs: Any) -> Any:
            if (check := workspaces.trtllm_check) is not None:
                check.check(entry, args, kwargs, parameters=parameters)
            return launch(*args, **kwargs)

        return checked_launch

    return patch


PROFILING_GRAPHS: ContextVar[bool] = ContextVar("mstar_resources_vllm_graphs", default=False)
"""Whether V2's graph-memory profile runs: in 0.29 it calls ``capture_model()`` bare (0.30+ passes
``profile_only=True``), before the KV cache, the warm-ups and the capture that serves."""


def _profiling_graphs(workspaces: VllmWorkspaces, profile: Any, owner: Any) -> Any:
    @functools.wraps(profile)
    def profile_graphs(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = PROFILING_GRAPHS.set(True)
        try:
            return profile(self, *args, **kwargs)
        finally:
            PROFILING_GRAPHS.reset(token)

    return profile_graphs


def _seal_at_capture(workspaces: VllmWorkspaces, capture_model: Any, owner: Any) -> Any:
    """A model runner's capture, the workspaces sealed first (not at V2's profiling capture); the
    manager unsealed after one that captured nothing (``cudagraph_mode`` NONE), as the runner's
    ``compilation_counter`` counts them: vLLM then neither locks it nor stops growing it."""

    @functools.wraps(capture_model)
    def seal_then_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("profile_only") or PROFILING_GRAPHS.get():
            return capture_model(self, *args, **kwargs)
        workspaces.seal("captures CUDA graphs")
        workspaces.manager.seal("vLLM captures CUDA graphs over it")
        counter = sys.modules[owner.__module__].compilation_counter
        captures = counter.num_gpu_runner_capture_triggers
        captured = capture_model(self, *args, **kwargs)
        if counter.num_gpu_runner_capture_triggers == captures:
            workspaces.manager.unlocked("vLLM captured no CUDA graphs over it")
        return captured

    return seal_then_capture


def _copied_to_ray(workspaces: VllmWorkspaces, names: Any, module: Any) -> Any:
    """vLLM's set of variables copied to Ray workers (beside VLLM_*, NCCL_*...), with the
    plugin's settings in it."""
    if isinstance(names, set):
        names.update((ENV_VAR, FLOOR_ENV_VAR))
    return names


def _runner_seams(runner: str, until: str | None = None) -> tuple[Seam, ...]:
    return (
        # the workspaces made before the memory profile, so that it counts them
        Seam(
            runner, "GPUModelRunner.profile_run", patch=before(VllmWorkspaces.reserve), until=until
        ),
        Seam(runner, "GPUModelRunner.capture_model", patch=_seal_at_capture, until=until),
        Seam(runner, "compilation_counter", until=until),  # counts the captures that capture
        Seam(runner, "GPUModelRunner.get_kv_cache_spec", until=until),
    )


SEAMS = (
    Seam(BACKEND, "FlashInferMetadataBuilder._get_workspace_buffer", patch=_workspace_buffer),
    Seam(BACKEND, "FlashInferMetadataBuilder._get_prefill_wrapper", patch=_built_as("prefill")),
    Seam(BACKEND, "FlashInferMetadataBuilder._get_decode_wrapper", patch=_built_as("decode")),
    # A cascade plan is a prefill plan; 0.32 dropped the getter (cascade builds no wrapper).
    Seam(BACKEND, "FlashInferMetadataBuilder._get_cascade_wrapper", required=False,
         patch=_built_as("prefill"), until="0.31.0"),
    *(Seam(BACKEND, f"FlashInferMetadataBuilder.{name}", instance=True)
      for name in BUILDER_DECISIONS),
    Seam(BACKEND, "FlashInferMetadataBuilder.use_trtllm_dcp_prefill", instance=True,
         required=False, since="0.33.0"),
    Seam(BACKEND, "fast_plan_decode", patch=VllmWorkspaces.take_decode_plans),
    Seam(BACKEND, "_get_trtllm_workspace_buffer", patch=_trtllm_workspace),
    # The TRT-LLM decode launches, checked on the plugin's workspace: trtllm-gen's and, until
    # 0.27, XQA's through trtllm_batch_decode_with_kv_cache(backend=...); XQA's own from 0.28
    # (speculative tokens as decode: SM120 in 0.28 and 0.29, Hopper too from 0.30).
    Seam(BACKEND, "trtllm_batch_decode_with_kv_cache", patch=checked_launch("trtllm")),
    Seam(BACKEND, "flashinfer_xqa_batch_decode_with_kv_cache", required=False, since="0.28.0",
         patch=checked_launch("xqa")),
    Seam(BACKEND, "FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM"),
    Seam(BACKEND, "FLASHINFER_WORKSPACE_BUFFER_SIZE_BATCH_INVARIANT"),
    *_runner_seams(V1_RUNNER, until="0.33.0"),
    *_runner_seams(V2_RUNNER),
    Seam(V2_RUNNER, "GPUModelRunner.profile_cudagraph_memory", patch=_profiling_graphs),
    # sealed after the warm-up, where no CUDA-graph capture sealed them (enforce_eager)
    Seam(WORKER, "Worker.compile_or_warm_up_model", patch=after(lambda state, worker, done:
         state.seal("serves its first request (it captured no CUDA graph)"))),
    # vLLM's KV-cache groups: a function until 0.32, then a builder of them.
    Seam("vllm.v1.core.kv_cache_utils", "get_kv_cache_groups", required=False, until="0.32.0"),
    Seam("vllm.v1.core.kv_cache_planning", "get_kv_cache_groups_from_builder", required=False,
         since="0.33.0"),
    Seam("vllm.v1.core.kv_cache_config_builder", "get_kv_cache_config_builder", required=False,
         since="0.33.0"),
    Seam("vllm.v1.worker.utils", "select_common_block_size"),
    Seam("vllm.v1.kv_cache_interface", "UniformTypeKVCacheSpecs"),
    Seam("vllm.utils.flashinfer", "use_trtllm_attention"),
    Seam("vllm.config.vllm", "get_layers_from_vllm_config"),
    Seam("vllm.config.vllm", "set_current_vllm_config"),
    Seam("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
    Seam("vllm.envs", "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"),
    Seam("vllm.envs", "VLLM_BATCH_INVARIANT"),
    Seam(RAY_ENV, "DEFAULT_EXTRA_ENV_VARS", patch=_copied_to_ray),
    # vLLM's WorkspaceManager: a floor made before the profile, sealed at vLLM's lock
    Seam(MANAGER, "WorkspaceManager._ensure_workspace_size",
         patch=lambda state, ensure, owner: checked_growth(state.manager, ensure)),
    Seam(MANAGER, "WorkspaceManager.lock",
         patch=after(lambda state, manager, result: state.manager.seal("vLLM locked it"))),
    Seam(MANAGER, "WorkspaceManager.unlock",
         patch=after(lambda state, manager, result: state.manager.unlocked("by vLLM"))),
    *(Seam(MANAGER, f"WorkspaceManager.{name}", instance=True)
      for name in ("_current_workspaces", "_device", "_locked")),
    Seam(MANAGER, "WorkspaceManager.is_locked"),
    Seam(MANAGER, "is_workspace_manager_initialized"),
    Seam(MANAGER, "current_workspace_manager"),
    Seam(MANAGER, "dbo_current_ubatch_id"),
    Seam(MANAGER, "_workspace_lane", required=False, since="0.28.0"),
    Seam(MANAGER, "WorkspaceManager._get_workspace_id", required=False, since="0.31.0"),
)  # fmt: skip
"""Every name of vLLM's the plugin relies on (``scripts/engine_seams.py`` checks each wheel)."""

PLUGIN = EnginePlugin(VLLM, "vllm", READ_IN, SEAMS, VllmWorkspaces)

active, register, version_problem = PLUGIN.active, PLUGIN.register, PLUGIN.version_problem
