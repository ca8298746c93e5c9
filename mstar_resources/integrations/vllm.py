"""vLLM's FlashInfer workspaces from this library: sized by a deployment or measured in the worker,
reserved before vLLM sizes its KV cache, and sealed before it captures CUDA graphs.

vLLM loads the entry point ``mstar_resources`` of the group ``vllm.general_plugins`` in each of its
processes (:func:`register`). It does nothing unless ``MSTAR_RESOURCES_VLLM`` is set:

- ``MSTAR_RESOURCES_VLLM=<deployment>``: the floors of a deployment of the shipped tree (its
  calibrated override, e.g. ``llama3-8b-h200_calibrated``), else ``MSTAR_WORKSPACE_BUFFER_MB``,
  else 512 MB, each with where it came from;
- ``MSTAR_RESOURCES_VLLM=/path/to/deployment/<name>.yaml``: a deployment file of the user's (one
  ``mstar-resources-calibrate`` wrote, say), composed over the shipped tree;
- ``MSTAR_RESOURCES_VLLM=auto``: no floors declared; each worker measures vLLM's own plans on its
  GPU and its FlashInfer (:func:`measured_profile`) before vLLM sizes its KV cache.

Enabled, in each worker:

1. When vLLM starts its memory profile (the model runner's ``profile_run``, V1 and V2 runners), the
   pools are made, so vLLM's profile counts them when it sizes the KV cache.
2. vLLM's ``FlashInferMetadataBuilder`` builds every wrapper lazily on ``_get_workspace_buffer()``:
   the prefill wrappers (causal, non-causal, DCP; cascade in 0.26) get the ``prefill`` workspace,
   the decode wrappers (one per CUDA-graph batch size, and the eager one) the ``decode`` workspace,
   and vLLM's own buffer is never made. Each plan of those wrappers goes through
   :meth:`Workspace.plan`: a plan that overflows grows its workspace, and a plan after the seal that
   does not fit raises :class:`~mstar_resources.WorkspaceSealedError`, naming the setting to raise.
3. Before vLLM captures CUDA graphs (``capture_model``, except 0.33's profiling capture) the pools
   are sealed.

Why one workspace serves many wrappers: vLLM runs its wrappers one after another on one stream, and
a float workspace holds only a plan's split-KV partials, used within that wrapper's run, so the
wrappers of one role share it as they share vLLM's one buffer. The decode wrappers (one per
CUDA-graph batch size, and the eager one) also share the decode key's int workspace and pinned
mirror, in place of FlashInfer's 8 MiB pair each: vLLM plans one of them a step, right before the
forward that runs it (or its graph's replay), and :meth:`Workspace.plan` waits for the previous
plan's copy from the mirror before it writes the mirror again. Only the first FlashInfer metadata
builder's decode wrappers share it: a model with several KV-cache groups has a builder each, and
vLLM plans every group's wrapper before the forward runs any. Prefill wrappers (causal,
non-causal, DCP, cascade) keep their own: several may be planned in one step.

On a vLLM this module was not read in (:data:`SUPPORTED_VLLM`), a model whose attention is not
FlashInfer's, or FlashInfer's MLA backend, the plugin logs one WARNING saying what and why and
leaves vLLM as it is; so does a failure of its own (an ``auto`` calibration that fails, say). A bad
setting fails vLLM's start with one paragraph naming the setting and its value.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import logging
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ResourceConfigError, WorkspaceSealedError, did_you_mean
from ..resolver import ResolvedResource, build_pools, resolve
from ._post_import import when_imported

if TYPE_CHECKING:
    import torch

    from ..attn.workspace import Workspace, WorkspacePool, WorkspaceStats
    from ..calibration.profile import CalibrationProfile

__all__ = [
    "ENV_VAR",
    "SEAMS",
    "SUPPORTED_VLLM",
    "Seam",
    "VllmWorkspaces",
    "active",
    "measured_profile",
    "read_setting",
    "register",
]

# Under vLLM's logger, so its handler prints these lines with its own.
logger = logging.getLogger("vllm.plugins.mstar_resources")

ENV_VAR = "MSTAR_RESOURCES_VLLM"
"""The setting that enables the plugin: a deployment name, a deployment file, or ``auto``."""

AUTO = "auto"

SUPPORTED_VLLM = ("0.26.0", "0.33.0")
"""The vLLM versions whose source the seams below were read in (0.26.0 also run on an H200)."""

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")
"""The plan labels vLLM's FlashInfer wrappers are planned under, one workspace each."""


@dataclass(frozen=True)
class Seam:
    """A name of vLLM's that the plugin replaces or reads: ``name`` in module ``module``
    (``Class.method`` for a method)."""

    module: str
    name: str
    required: bool = True
    """False: used where this vLLM has it (0.26's cascade wrapper, gone in 0.33)."""


BACKEND = "vllm.v1.attention.backends.flashinfer"
RUNNERS = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")
"""vLLM's V1 and V2 model runners, each with a ``GPUModelRunner``."""

SEAMS = (
    Seam(BACKEND, "FlashInferMetadataBuilder._get_workspace_buffer"),
    Seam(BACKEND, "FlashInferMetadataBuilder._get_prefill_wrapper"),
    Seam(BACKEND, "FlashInferMetadataBuilder._get_decode_wrapper"),
    Seam(BACKEND, "FlashInferMetadataBuilder._get_cascade_wrapper", required=False),
    Seam(BACKEND, "fast_plan_decode"),
    Seam(BACKEND, "FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM"),
    Seam(BACKEND, "FLASHINFER_WORKSPACE_BUFFER_SIZE_BATCH_INVARIANT"),
    *(Seam(runner, f"GPUModelRunner.{method}") for runner in RUNNERS
      for method in ("profile_run", "capture_model")),
    Seam("vllm.config.vllm", "get_layers_from_vllm_config"),
    Seam("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
    Seam("vllm.envs", "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"),
    Seam("vllm.envs", "VLLM_BATCH_INVARIANT"),
)  # fmt: skip
"""Every name of vLLM's the plugin relies on; ``tests/integrations`` checks each in the source of
every version in :data:`SUPPORTED_VLLM`."""

FLASHINFER = "FLASHINFER"
"""vLLM's name of its FlashInfer attention backend (``FlashInferBackend.get_name()``)."""


# -- the setting --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """What ``MSTAR_RESOURCES_VLLM`` asks for."""

    value: str
    """As set."""
    records: tuple[ResolvedResource, ...] = ()
    """The deployment's resources, floors resolved (empty for ``auto``)."""
    root: Any = None
    """The composed config of the deployment (None for ``auto``): its calibration is checked on
    the GPU."""

    @property
    def auto(self) -> bool:
        return self.value == AUTO

    def describe(self) -> str:
        return f"{ENV_VAR}={self.value}"


def read_setting(env: Mapping[str, str] | None = None) -> Setting | None:
    """The plugin's setting in ``env`` (``os.environ`` by default), checked: None when it is unset
    or empty. A deployment is composed and its floors resolved here, so a bad one fails where
    vLLM starts, as one paragraph (:class:`~mstar_resources.ResourceConfigError`)."""
    env = os.environ if env is None else env
    value = env.get(ENV_VAR, "").strip()
    if not value:
        return None
    if value == AUTO:
        return Setting(value)
    root = _compose(value)
    try:
        records = tuple(resolve(root.get("resources") or {}, env=env))
    except ResourceConfigError as error:
        raise ResourceConfigError(
            f"{ENV_VAR}={value}: {'; '.join(error.problems)}", where=error.where
        ) from None
    setting = Setting(value, records, root)
    _serving_key_of_each_role(records, setting.describe())  # both served, or which is not
    return setting


def _looks_like_a_path(value: str) -> bool:
    return os.sep in value or "/" in value or value.endswith((".yaml", ".yml"))


def _compose(value: str) -> Any:
    """The shipped tree composed with deployment ``value``: a name of the shipped deployments, or
    the path of a deployment file in a ``deployment/`` folder of a config dir."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    overrides = [f"deployment={value}"]
    if _looks_like_a_path(value):
        path = Path(value).expanduser()
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            raise ResourceConfigError(
                f"{ENV_VAR}={value!r} is not a deployment file: no such .yaml file; give the "
                "path of one (e.g. calibrated/deployment/llama3-8b-h200_calibrated.yaml), the "
                f"name of a shipped deployment, or {AUTO}"
            )
        if path.parent.name != "deployment":
            raise ResourceConfigError(
                f"{ENV_VAR}={value!r}: a deployment file lives in the deployment/ folder of a "
                f"config dir (as mstar-resources-calibrate writes it), and this one is in "
                f"{path.parent.name or '/'}/; move it into a deployment/ folder"
            )
        config_dir = path.resolve().parent.parent
        overrides = [f"deployment={path.stem}", f"hydra.searchpath=[file://{config_dir}]"]
    try:
        with initialize_config_module("mstar_resources.conf", version_base="1.3"):
            return compose("resources/default", overrides=overrides)
    except MissingConfigException as error:
        options = [o for o in (error.options or []) if not o.startswith("_")]
        raise ResourceConfigError(
            f"{ENV_VAR}={value!r} names no deployment"
            f"{did_you_mean(value, options)}; the deployments are {', '.join(options)}; or "
            f"give the path of a deployment file, or {AUTO} to measure vLLM's plans"
        ) from None
    except (HydraException, OmegaConfBaseException) as error:
        reason = " ".join(str(error).split())
        raise ResourceConfigError(f"{ENV_VAR}={value!r} does not compose: {reason}") from None


def _serving_key_of_each_role(
    records: Sequence[ResolvedResource], setting: str
) -> dict[Role, tuple[ResolvedResource, int | None]]:
    """For each role, the resource that serves its label and the slot vLLM's wrappers take
    there: the first CUDA-graph slot it declares (vLLM captures one graph context), else eager."""
    found: dict[Role, tuple[ResolvedResource, int | None]] = {}
    for role in ROLES:
        record = next((r for r in records if role in r.labels), None)
        if record is None:
            raise ResourceConfigError(
                f"{setting}: no resource under resources serves the label {role!r}, "
                f"and vLLM plans its FlashInfer wrappers as prefill and decode; declare both "
                "(the shipped tree's resources.attn.prefill and resources.attn.decode do)"
            )
        found[role] = (record, record.cg_slots[0] if record.cg_slots else None)
    return found


# -- what vLLM plans, from its config -----------------------------------------------------------


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


KV_CACHE_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
"""vLLM's ``--kv-cache-dtype`` names of FP8 caches, as the profile names their dtypes."""


def measured_profile(vllm_config: Any) -> tuple[CalibrationProfile, dict[str, Any]]:
    """The calibration profile of the plans vLLM makes under ``vllm_config`` (``engine: vllm``),
    and the resource tree they are planned for: heads and KV heads per rank, head dim, KV dtype,
    page size, ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, and the decode
    batch sizes vLLM captures CUDA graphs for.

    A speculative step's verification (1 + k query tokens a request) is planned by vLLM's prefill
    wrapper on an SM90 GPU (its FlashInfer decode graphs take one token a request there), and
    the prefill sweep covers such few-token queries over long contexts.
    """
    from vllm.config import CUDAGraphMode

    from ..calibration.profile import load_profile

    model, cache = vllm_config.model_config, vllm_config.cache_config
    scheduler, compilation = vllm_config.scheduler_config, vllm_config.compilation_config
    parallel = vllm_config.parallel_config
    model_dtype = _dtype_name(model.dtype)
    kv_dtype = KV_CACHE_DTYPES.get(str(cache.cache_dtype), model_dtype)
    node = {
        "engine": "vllm",
        "deterministic": bool(_vllm_envs().VLLM_BATCH_INVARIANT),
        "model": {
            "num_qo_heads": model.get_num_attention_heads(parallel),
            "num_kv_heads": model.get_num_kv_heads(parallel),
            "head_dim": model.get_head_size(),
            "page_size": cache.block_size or 16,
            # On SM90 vLLM queries an FP8 cache in FP8 (FlashInfer's native kernels).
            "q_dtype": kv_dtype if kv_dtype in KV_CACHE_DTYPES.values() else model_dtype,
            "kv_dtype": kv_dtype,
        },
        "limits": {
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "max_model_len": model.max_model_len,
        },
        # vLLM's prefill wrappers take backend "auto", as its decode wrappers do.
        "plans": {"prefill": {"kind": "paged_prefill", "backend": "auto"},
                  "decode": {"kind": "decode"}},
    }  # fmt: skip
    profile = load_profile(node)
    graphs = compilation.cudagraph_mode.decode_mode() == CUDAGraphMode.FULL
    sizes = _decode_graph_sizes(vllm_config) if graphs else []
    profile = dataclasses.replace(profile, cuda_graph_batch_sizes=sizes or [1])
    tree = {
        "attn": {
            "prefill": {"owner": "attention", "labels": ["prefill"]},
            "decode": {"owner": "attention", "labels": ["decode"], "cg_slots": sizes[:1] and [0]},
        }
    }
    return profile, tree


def _decode_graph_sizes(vllm_config: Any) -> list[int]:
    """The batch sizes vLLM captures FlashInfer decode graphs for: its capture sizes up to
    ``max_num_seqs`` (one token a request: the decode graphs FlashInfer takes on SM90)."""
    compilation = vllm_config.compilation_config
    top = vllm_config.scheduler_config.max_num_seqs
    if compilation.max_cudagraph_capture_size is not None:
        top = min(top, compilation.max_cudagraph_capture_size)
    return sorted({s for s in compilation.cudagraph_capture_sizes or [] if s <= top})


def _vllm_envs() -> Any:
    import vllm.envs

    return vllm.envs


def vllm_buffer_bytes(vllm_config: Any) -> tuple[int, str]:
    """The float buffer vLLM would make for each FlashInfer metadata builder, and how it got it:
    ``max(VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE, max_num_batched_tokens x query heads per rank x
    head dim x 16)`` (batch-invariant mode: its fixed size)."""
    import vllm.v1.attention.backends.flashinfer as backend

    envs = _vllm_envs()
    if envs.VLLM_BATCH_INVARIANT:
        size = backend.FLASHINFER_WORKSPACE_BUFFER_SIZE_BATCH_INVARIANT
        return size, f"VLLM_BATCH_INVARIANT's {size:,}"
    model = vllm_config.model_config
    tokens = vllm_config.scheduler_config.max_num_batched_tokens
    heads = model.get_num_attention_heads(vllm_config.parallel_config)
    head_dim = model.get_head_size()
    per = backend.FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM
    formula = tokens * heads * head_dim * per
    setting = envs.VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE
    how = (
        f"max(VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE={setting:,}, {tokens:,} batched tokens x "
        f"{heads} heads x {head_dim} x {per} = {formula:,})"
    )
    return max(setting, formula), how


def uncovered_attention(vllm_config: Any) -> str | None:
    """Why the plugin cannot serve this model's attention (None: it can): no FlashInfer layer, or
    a FlashInfer backend other than the plain one (MLA)."""
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
    names = {layer.get_attn_backend().get_name() for layer in layers.values()}
    if FLASHINFER not in names:
        found = ", ".join(sorted(names)) or "no attention backend"
        return f"the model's attention runs on {found}, not FlashInfer ({FLASHINFER})"
    others = sorted(name for name in names if FLASHINFER in name and name != FLASHINFER)
    if others:
        return (
            f"the model also uses {', '.join(others)}, whose buffers this plugin does not "
            "manage; it serves vLLM's FLASHINFER backend alone"
        )
    return None


# -- the workspaces of one worker ---------------------------------------------------------------

_ROLE: ContextVar[Role | None] = ContextVar("mstar_resources_vllm_role", default=None)
"""The role of the wrapper vLLM is building, while one of the builder's wrapper getters runs."""


class VllmWorkspaces:
    """The workspaces vLLM's FlashInfer wrappers plan on in one process, and their life: made at
    vLLM's memory profile, handed to each wrapper as it is built, sealed before graph capture."""

    def __init__(self, setting: Setting) -> None:
        self.setting = setting
        self.pools: dict[str, WorkspacePool] = {}
        self._workspaces: dict[Role, Workspace] = {}
        # By the wrapper's id (a wrapper need not be hashable), with a weak reference to it, so a
        # wrapper vLLM drops is not kept alive here.
        self._routed: dict[int, tuple[weakref.ref[Any], Workspace]] = {}
        self._keys: dict[Role, tuple[str, int | None]] = {}
        """Each role's pool (by resource path) and cg slot."""
        self._int_builder: weakref.ref[Any] | None = None
        """The metadata builder whose decode wrappers share the decode int workspace."""
        self.shared_int_wrappers = 0
        """Decode wrappers given the shared int workspace in place of their own."""
        self.untouched: str | None = None
        """Why vLLM runs as it is (None: the plugin serves it)."""
        self.vllm_bytes: int | None = None
        """What vLLM would have made for each FlashInfer metadata builder."""
        self.sealed_overflows = 0
        """Plans refused by a sealed workspace (each raised its error to vLLM)."""
        self._builders: weakref.WeakSet[Any] = weakref.WeakSet()
        """The FlashInfer metadata builders served (each would have made its own buffer in V1)."""
        self.provenance: dict[str, str] = {}
        """By resource path: where its floor came from, in words."""

    @property
    def serving(self) -> bool:
        return bool(self._workspaces)

    @property
    def sealed(self) -> bool:
        """Whether the workspaces keep their addresses from now on (vLLM captured over them)."""
        return bool(self.pools) and all(pool.sealed for pool in self.pools.values())

    def _stats(self) -> list[WorkspaceStats]:
        """The float workspaces' stats, then the int workspaces'."""
        return [s for pool in self.pools.values() for s in [*pool.stats(), *pool.int_stats()]]

    def leave_untouched(self, reason: str) -> None:
        if self.untouched is None and not self.serving:
            self.untouched = reason
            logger.warning(
                "mstar-resources: %s set, but %s; vLLM keeps its own FlashInfer workspace",
                self.setting.describe(),
                reason,
            )

    # Step 1: at vLLM's memory profile.
    def reserve(self, vllm_config: Any, device: torch.device) -> None:
        """Make the workspaces vLLM's wrappers will take, once per process; on a model this
        plugin does not serve, log why and leave vLLM as it is."""
        if self.serving or self.untouched is not None:
            return
        try:
            reason = uncovered_attention(vllm_config)
            if reason is not None:
                self.leave_untouched(reason)
                return
            records = self._measure(vllm_config, device) if self.setting.auto else None
            if records is None:
                records = self.setting.records
                self._check_calibration(device)
            self.vllm_bytes, vllm_how = vllm_buffer_bytes(vllm_config)
        except ResourceConfigError as error:
            self.leave_untouched(f"it cannot size the workspaces: {error}")
            return
        except Exception as error:  # the plugin's own failure must not stop vLLM
            self.leave_untouched(f"it failed ({type(error).__name__}: {error})")
            return
        keys = _serving_key_of_each_role(records, self.setting.describe())
        self.pools = build_pools(list(records), device)
        for role, (record, cg_slot) in keys.items():
            self._workspaces[role] = self.pools[record.path].get(role, cg_slot)
            self._keys[role] = (record.path, cg_slot)
        self._log_reserved(keys, vllm_how)

    def _measure(self, vllm_config: Any, device: torch.device) -> tuple[ResolvedResource, ...]:
        """``auto``: the resource tree of vLLM's plans, each floor the need measured here."""
        from ..calibration.calibrate import measure_all, per_resource
        from ..calibration.record import declared_mb_for

        profile, tree = measured_profile(vllm_config)
        rows = measure_all(resolve(tree), profile, device, show_progress=False)
        for measured in per_resource(rows):
            node = tree["attn"][measured.path.split(".")[-1]]
            node["declared_mb"] = declared_mb_for(measured.need_bytes)
            self.provenance[measured.path] = (
                f"measured here ({ENV_VAR}={AUTO}): need {measured.need_bytes:,} bytes, "
                f"worst {measured.worst}, by {measured.method}"
            )
        return tuple(resolve(tree))

    def _check_calibration(self, device: torch.device) -> None:
        """A calibrated deployment names what differs here (FlashInfer's version, the GPU)."""
        from ..calibration.record import check_calibration

        root = self.setting.root
        if root is not None and root.get("calibrated") is not None:
            stale = check_calibration(root, device, resolved=list(self.setting.records))
            if stale is not None:
                logger.warning(
                    "mstar-resources: %s was calibrated elsewhere (%s); its floors may not hold "
                    "here: recalibrate on this GPU, or set %s=%s to measure vLLM's plans in the "
                    "worker",
                    self.setting.describe(), stale, ENV_VAR, AUTO,
                )  # fmt: skip

    def _log_reserved(self, keys: Mapping[Role, tuple[ResolvedResource, int | None]],
                      vllm_how: str) -> None:  # fmt: skip
        for role, workspace in self._workspaces.items():
            record, _ = keys[role]
            source = self.provenance.get(
                record.path, f"{record.floor_setting} ({record.floor_source})"
            )
            logger.info(
                "mstar-resources: %s: %s bytes for vLLM's FlashInfer %s wrappers; floor from %s",
                workspace.name, f"{workspace.tensor.numel():,}", role, source,
            )  # fmt: skip
        logger.info(
            "mstar-resources: reserved %s bytes in %d FlashInfer workspaces (%s) before vLLM "
            "sizes its KV cache, where vLLM would reserve %s bytes for each FlashInfer metadata "
            "builder (%s)",
            f"{self.held_bytes:,}", len(self._workspaces), self.setting.describe(),
            f"{self.vllm_bytes:,}", vllm_how,
        )  # fmt: skip

    # Step 2: as vLLM builds and plans each wrapper.
    def workspace(self, builder: Any, role: Role | None) -> Workspace | None:
        """The workspace a wrapper of ``role`` is built on (None: a caller that only wants the
        builder's buffer, such as the V2 runner's sharing of it: the prefill workspace); None
        where the plugin leaves vLLM as it is."""
        if not self.serving:  # a builder made before vLLM's profile (not seen in 0.26 or 0.33)
            self.reserve(builder.vllm_config, builder.device)
        if not self.serving:
            return None
        self._builders.add(builder)
        return self._workspaces[role or "prefill"]

    def route(self, wrapper: Any, role: Role, builder: Any = None) -> None:
        """Send ``wrapper``'s plans through its workspace: a decode wrapper's through vLLM's
        ``fast_plan_decode`` (:meth:`plan_decode`), a prefill wrapper's through its own ``plan``,
        rebound on the wrapper itself (FlashInfer's wrappers have no hook, and vLLM checks their
        type, so the object stays FlashInfer's). A decode wrapper of the first ``builder`` is
        given the decode int workspace in place of its own."""
        if wrapper is None or self._routed_to(wrapper) is not None:
            return
        from ..attn._flashinfer import own_buffers

        workspace = self._workspaces[role]
        if role == "decode" and self._shares_int(builder) and own_buffers(wrapper) is not None:
            path, cg_slot = self._keys[role]
            self.pools[path].install(wrapper, role, cg_slot)
            self.shared_int_wrappers += 1
        key = id(wrapper)
        self._routed[key] = (weakref.ref(wrapper, lambda _: self._routed.pop(key, None)), workspace)
        if role == "prefill":
            wrapper.plan = functools.partial(self._plan, workspace, wrapper.plan)

    def _shares_int(self, builder: Any) -> bool:
        """Whether ``builder``'s decode wrappers share the int workspace: the first builder's."""
        if builder is None:
            return False
        if self._int_builder is None or self._int_builder() is None:
            self._int_builder = weakref.ref(builder)
        return self._int_builder() is builder

    def _routed_to(self, wrapper: Any) -> Workspace | None:
        found = self._routed.get(id(wrapper))
        return found[1] if found is not None and found[0]() is wrapper else None

    def plan_decode(self, fast_plan_decode: Callable[..., Any], wrapper: Any, *args: Any,
                    **kwargs: Any) -> Any:  # fmt: skip
        workspace = self._routed_to(wrapper)
        if workspace is None:
            return fast_plan_decode(wrapper, *args, **kwargs)
        return self._plan(workspace, fast_plan_decode, wrapper, *args, **kwargs)

    def _plan(self, workspace: Workspace, plan: Callable[..., Any], *args: Any,
              **kwargs: Any) -> Any:  # fmt: skip
        try:
            return workspace.plan(plan, *args, **kwargs)
        except WorkspaceSealedError:
            self.sealed_overflows += 1
            raise

    # Step 3: before vLLM captures CUDA graphs.
    def seal(self) -> None:
        if not self.serving or self.sealed:
            return
        for pool in self.pools.values():
            pool.seal()
        stats = self._stats()
        logger.info(
            "mstar-resources: sealed %d FlashInfer workspaces at %s bytes before vLLM captures "
            "CUDA graphs (%d growths before the seal): %s",
            len(stats), f"{self.held_bytes:,}", sum(s.times_grown for s in stats),
            "; ".join(str(s) for s in stats),
        )  # fmt: skip

    @property
    def held_bytes(self) -> int:
        return sum(pool.held_bytes for pool in self.pools.values())

    def report(self) -> dict[str, Any]:
        """What the plugin did in this process, as plain data."""
        stats = self._stats()
        return {
            "setting": self.setting.describe(),
            "untouched": self.untouched,
            "workspace_bytes": self.held_bytes,
            "vllm_bytes_per_builder": self.vllm_bytes,
            "builders": len(self._builders),
            "sealed": self.sealed,
            "growths": sum(s.times_grown for s in stats),
            "sealed_overflows": self.sealed_overflows,
            "workspaces": [dataclasses.asdict(s) for s in stats],
            "int_workspace_bytes": sum(pool.int_held_bytes for pool in self.pools.values()),
            "shared_int_wrappers": self.shared_int_wrappers,
            "provenance": dict(self.provenance),
        }


# -- vLLM's seams -------------------------------------------------------------------------------


def _patch_backend(workspaces: VllmWorkspaces, module: ModuleType) -> None:
    """vLLM's FlashInfer metadata builder: its wrappers on the workspaces, their plans through
    them."""
    if not _has_seams(workspaces, module):
        return
    builder = module.FlashInferMetadataBuilder
    own_buffer = builder._get_workspace_buffer

    @functools.wraps(own_buffer)
    def _get_workspace_buffer(self: Any) -> Any:
        workspace = None if workspaces.untouched else workspaces.workspace(self, _ROLE.get())
        return own_buffer(self) if workspace is None else workspace.tensor

    def built_as(role: Role, getter: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(getter)
        def get(self: Any, *args: Any, **kwargs: Any) -> Any:
            token = _ROLE.set(role)
            try:
                wrapper = getter(self, *args, **kwargs)
            finally:
                _ROLE.reset(token)
            if workspaces.serving:
                workspaces.route(wrapper, role, self)
            return wrapper

        return get

    builder._get_workspace_buffer = _get_workspace_buffer
    builder._get_prefill_wrapper = built_as("prefill", builder._get_prefill_wrapper)
    builder._get_decode_wrapper = built_as("decode", builder._get_decode_wrapper)
    if hasattr(builder, "_get_cascade_wrapper"):  # 0.26: a cascade plan is a prefill plan
        builder._get_cascade_wrapper = built_as("prefill", builder._get_cascade_wrapper)
    fast_plan_decode = module.fast_plan_decode

    @functools.wraps(fast_plan_decode)
    def planned_decode(wrapper: Any, *args: Any, **kwargs: Any) -> Any:
        return workspaces.plan_decode(fast_plan_decode, wrapper, *args, **kwargs)

    setattr(module, "fast_plan_decode", planned_decode)  # noqa: B010 (a module, typed as such)


def _has_seams(workspaces: VllmWorkspaces, module: ModuleType) -> bool:
    """Whether ``module`` has every seam the plugin takes there; if not, vLLM is left as it is
    (nothing of the module is patched)."""
    missing = missing_seams({module.__name__: module},
                            [s for s in SEAMS if s.module == module.__name__])  # fmt: skip
    if missing:
        names = ", ".join(f"{s.module}.{s.name}" for s in missing)
        workspaces.leave_untouched(f"this vLLM lacks {names}")
    return not missing


def _patch_runner(workspaces: VllmWorkspaces, module: ModuleType) -> None:
    """A model runner: the workspaces made at its memory profile, sealed before its capture."""
    if not _has_seams(workspaces, module):
        return
    runner = module.GPUModelRunner
    profile_run, capture_model = runner.profile_run, runner.capture_model

    @functools.wraps(profile_run)
    def profiled(self: Any, *args: Any, **kwargs: Any) -> Any:
        workspaces.reserve(self.vllm_config, self.device)
        return profile_run(self, *args, **kwargs)

    @functools.wraps(capture_model)
    def captured(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("profile_only"):  # 0.33's V2 captures once to measure, then again
            workspaces.seal()
        return capture_model(self, *args, **kwargs)

    runner.profile_run, runner.capture_model = profiled, captured


_active: VllmWorkspaces | None = None


def active() -> VllmWorkspaces | None:
    """This process's workspaces, where the plugin is enabled in it (None: it is not)."""
    return _active


def vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def register() -> None:
    """vLLM's entry point (``vllm.general_plugins``): in every vLLM process, read the setting and,
    where it is set and this vLLM is one the seams were read in, patch them as their modules are
    imported. Once per process; without the setting it does nothing at all."""
    global _active
    setting = read_setting()
    if setting is None or _active is not None:
        return
    workspaces = VllmWorkspaces(setting)
    version = vllm_version()
    if version not in SUPPORTED_VLLM:
        workspaces.leave_untouched(
            f"vLLM {version} is not one this plugin was read in ({', '.join(SUPPORTED_VLLM)})"
        )
        return
    _active = workspaces
    when_imported(BACKEND, functools.partial(_patch_backend, workspaces))
    for runner in RUNNERS:
        when_imported(runner, functools.partial(_patch_runner, workspaces))


def missing_seams(modules: Mapping[str, Any], seams: Sequence[Seam] = SEAMS) -> list[Seam]:
    """The required seams that ``modules`` (by module name: an object with the module's names as
    attributes) lack."""
    missing = []
    for seam in seams:
        target: Any = modules.get(seam.module)
        for part in seam.name.split("."):
            target = getattr(target, part, None)
        if target is None and seam.required:
            missing.append(seam)
    return missing
