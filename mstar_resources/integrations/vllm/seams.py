"""The names of vLLM's the plugin takes or reads, the versions they were read in, and the patches.

Each patch waits for its module's import (``_post_import``), so a vLLM process that never builds a
model (the API server, the engine core's front) never imports vLLM's model runner for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from ..._internal.floor import ENV_VAR as FLOOR_ENV_VAR
from .._post_import import when_imported
from ..seam import Seam, installed_version, lacking
from ..seam import missing_seams as _missing
from .setting import ENV_VAR
from .workspaces import ROLE, V2_RUNNER, VllmWorkspaces

SUPPORTED_VLLM = ("0.26.0", "0.33.0")
"""The vLLM versions whose source the seams below were read in (0.26.0 also run on an H200). A
patch release of one of them (0.26.1, 0.33.2) is served where every seam checks out."""


BACKEND = "vllm.v1.attention.backends.flashinfer"
RUNNERS = ("vllm.v1.worker.gpu_model_runner", V2_RUNNER)
"""vLLM's V1 and V2 model runners, each with a ``GPUModelRunner``."""
WORKER = "vllm.v1.worker.gpu_worker"
RAY_ENV = "vllm.ray.ray_env"

BUILDER_DECISIONS = (
    "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "kv_cache_dtype", "cache_dtype",
    "q_data_type_prefill", "q_data_type_decode", "use_trtllm_decode_attention",
    "flashinfer_trtllm_api_decode_kernel", "dcp_world_size", "enable_cuda_graph",
    "_decode_cudagraph_max_bs", "has_sinks",
)  # fmt: skip
"""What ``FlashInferMetadataBuilder.__init__`` decides, read from the plugin's own builders."""

SEAMS = (
    Seam(BACKEND, "FlashInferMetadataBuilder._get_workspace_buffer"),
    Seam(BACKEND, "FlashInferMetadataBuilder._get_prefill_wrapper"),
    Seam(BACKEND, "FlashInferMetadataBuilder._get_decode_wrapper"),
    Seam(BACKEND, "FlashInferMetadataBuilder._get_cascade_wrapper", required=False),
    *(Seam(BACKEND, f"FlashInferMetadataBuilder.{name}", instance=True)
      for name in BUILDER_DECISIONS),
    Seam(BACKEND, "fast_plan_decode"),
    Seam(BACKEND, "_get_trtllm_workspace_buffer"),
    Seam(BACKEND, "FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM"),
    Seam(BACKEND, "FLASHINFER_WORKSPACE_BUFFER_SIZE_BATCH_INVARIANT"),
    *(Seam(runner, f"GPUModelRunner.{method}") for runner in RUNNERS
      for method in ("profile_run", "capture_model", "get_kv_cache_spec")),
    Seam(WORKER, "Worker.compile_or_warm_up_model"),
    # vLLM's KV-cache groups: 0.26's function, or 0.33's builder of them.
    Seam("vllm.v1.core.kv_cache_utils", "get_kv_cache_groups", required=False),
    Seam("vllm.v1.core.kv_cache_planning", "get_kv_cache_groups_from_builder", required=False),
    Seam("vllm.v1.core.kv_cache_config_builder", "get_kv_cache_config_builder", required=False),
    Seam("vllm.v1.worker.utils", "select_common_block_size"),
    Seam("vllm.v1.kv_cache_interface", "UniformTypeKVCacheSpecs"),
    Seam("vllm.utils.flashinfer", "use_trtllm_attention"),
    Seam("vllm.config.vllm", "get_layers_from_vllm_config"),
    Seam("vllm.config.vllm", "set_current_vllm_config"),
    Seam("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
    Seam("vllm.envs", "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"),
    Seam("vllm.envs", "VLLM_BATCH_INVARIANT"),
    Seam(RAY_ENV, "DEFAULT_EXTRA_ENV_VARS"),
)  # fmt: skip
"""Every name of vLLM's the plugin relies on; ``tests/integrations`` checks each in the source of
every version in :data:`SUPPORTED_VLLM`."""

COPIED_TO_RAY_WORKERS = (ENV_VAR, FLOOR_ENV_VAR)
"""The plugin's settings, added to those vLLM copies to its Ray workers (it copies ``VLLM_*``,
``NCCL_*``, ``HF_*``... and the names in ``DEFAULT_EXTRA_ENV_VARS``)."""


def _patch_backend(workspaces: VllmWorkspaces, module: ModuleType) -> None:
    """vLLM's FlashInfer metadata builder: its wrappers on the workspaces, their plans through
    them."""
    if not _has_seams(workspaces, module):
        return
    builder = module.FlashInferMetadataBuilder
    own_buffer = builder._get_workspace_buffer

    @functools.wraps(own_buffer)
    def _get_workspace_buffer(self: Any) -> Any:
        workspace = None if workspaces.untouched else workspaces.workspace(self, ROLE.get())
        return own_buffer(self) if workspace is None else workspace.tensor

    def built_as(role: str, getter: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(getter)
        def get(self: Any, *args: Any, **kwargs: Any) -> Any:
            token = ROLE.set(role)  # type: ignore[arg-type]
            try:
                wrapper = getter(self, *args, **kwargs)
            finally:
                ROLE.reset(token)
            if workspaces.serving:
                workspaces.route(wrapper, role, self)  # type: ignore[arg-type]
            return wrapper

        return get

    builder._get_workspace_buffer = _get_workspace_buffer
    builder._get_prefill_wrapper = built_as("prefill", builder._get_prefill_wrapper)
    builder._get_decode_wrapper = built_as("decode", builder._get_decode_wrapper)
    if hasattr(builder, "_get_cascade_wrapper"):  # 0.26: a cascade plan is a prefill plan
        builder._get_cascade_wrapper = built_as("prefill", builder._get_cascade_wrapper)
    workspaces.take_decode_plans(module)


def _has_seams(workspaces: VllmWorkspaces, module: ModuleType) -> bool:
    """Whether ``module`` has every seam the plugin takes there; if not, vLLM is left as it is
    (nothing of the module is patched)."""
    lacks = lacking(module, SEAMS)
    if lacks is not None:
        workspaces.block(f"this vLLM lacks {lacks}")
    return lacks is None


def _patch_runner(workspaces: VllmWorkspaces, module: ModuleType) -> None:
    """A model runner: the workspaces made at its memory profile, sealed before its capture."""
    if not _has_seams(workspaces, module):
        return
    runner = module.GPUModelRunner
    profile_run, capture_model = runner.profile_run, runner.capture_model

    @functools.wraps(profile_run)
    def reserve_then_profile(self: Any, *args: Any, **kwargs: Any) -> Any:
        workspaces.reserve(self)
        return profile_run(self, *args, **kwargs)

    @functools.wraps(capture_model)
    def seal_then_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("profile_only"):  # 0.33's V2 captures once to measure, then again
            workspaces.seal("captures CUDA graphs")
        return capture_model(self, *args, **kwargs)

    runner.profile_run, runner.capture_model = reserve_then_profile, seal_then_capture


def _patch_worker(workspaces: VllmWorkspaces, module: ModuleType) -> None:
    """The GPU worker: sealed after its warm-up, before its first request, where no capture of
    CUDA graphs sealed the workspaces first (``enforce_eager``, ``cudagraph_mode=NONE``)."""
    if not _has_seams(workspaces, module):
        return
    worker = module.Worker
    warm_up = worker.compile_or_warm_up_model

    @functools.wraps(warm_up)
    def warmed_up(self: Any, *args: Any, **kwargs: Any) -> Any:
        done = warm_up(self, *args, **kwargs)
        workspaces.seal("serves its first request (it captured no CUDA graph)")
        return done

    worker.compile_or_warm_up_model = warmed_up


def _patch_ray_env(module: ModuleType) -> None:
    """vLLM's list of variables copied to Ray workers: with the plugin's settings in it."""
    names = getattr(module, "DEFAULT_EXTRA_ENV_VARS", None)
    if isinstance(names, set):
        names.update(COPIED_TO_RAY_WORKERS)


_active: VllmWorkspaces | None = None


def active() -> VllmWorkspaces | None:
    """This process's workspaces, where the plugin is enabled in it (None: it is not)."""
    return _active


def vllm_version() -> str | None:
    return installed_version("vllm")


def _series(version: str) -> str:
    """``0.26.1`` as ``0.26``: the release series whose patch releases keep its seams."""
    return ".".join(version.split("+")[0].split(".")[:2])


def version_problem(version: str | None) -> str | None:
    """Why the plugin does not serve vLLM ``version`` (None: it does, seams permitting)."""
    if version is None:
        return "vLLM is not installed here"
    if _series(version) not in {_series(v) for v in SUPPORTED_VLLM}:
        return f"vLLM {version} is not one this plugin was read in ({', '.join(SUPPORTED_VLLM)})"
    return None


def register() -> None:
    """vLLM's entry point (``vllm.general_plugins``): in every vLLM process, read the setting and,
    where it is set and this vLLM is one the seams were read in, patch them as their modules are
    imported. Once per process (each engine's workspaces are made at its profile); without the
    setting it does nothing at all."""
    global _active
    from .setting import read_setting

    setting = read_setting()
    if setting is None or _active is not None:
        return
    workspaces = VllmWorkspaces(setting)
    problem = version_problem(vllm_version())
    if problem is not None:
        workspaces.block(problem)
        return
    _active = workspaces
    when_imported(RAY_ENV, _patch_ray_env)
    when_imported(BACKEND, functools.partial(_patch_backend, workspaces))
    when_imported(WORKER, functools.partial(_patch_worker, workspaces))
    for runner in RUNNERS:
        when_imported(runner, functools.partial(_patch_runner, workspaces))


def missing_seams(modules: Mapping[str, Any], seams: Sequence[Seam] = SEAMS) -> list[Seam]:
    """The required seams of vLLM's that ``modules`` lack (:func:`..seam.missing_seams`)."""
    return _missing(modules, seams)
