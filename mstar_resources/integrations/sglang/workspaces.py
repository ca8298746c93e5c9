"""One SGLang process's workspaces: reserved before its KV pool, sealed before its CUDA graphs."""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

from ...attn._flashinfer import FLOAT_BUFFER, refresh_recorded_size
from ...attn._float_workspace import install_int_workspace, plan_through
from ...attn.workspace import Workspace
from ...resolver import ResolvedResource, build_pools
from ..plugin import PluginState
from ..setting import AUTO, PluginSetting, Setting
from .measure import measure, sglang_plans

logger = logging.getLogger("mstar_resources.integrations.sglang")

ENV_VAR = "MSTAR_RESOURCES_SGLANG"
ROLES = ("prefill", "decode")
"""The labels SGLang's wrappers plan as: its ragged, paged and verify prefill, and its decode."""
SGLANG = PluginSetting(ENV_VAR, "mstar_resources_sglang", "SGLang", ROLES)
"""The SGLang plugin's setting; its deployments compose with ``conf/mstar_resources_sglang``."""

BUFFER_NAME = "flashinfer_workspace"
"""What SGLang's FlashInfer backend takes its float workspace as from ``get_buffer``'s registry."""

PREFILL_WRAPPERS = ("prefill_wrapper_ragged", "prefill_wrappers_paged", "prefill_wrappers_verify")
"""``FlashInferAttnBackend``'s attributes holding its prefill wrappers (one, or a list)."""


class SglangWorkspaces(PluginState):
    """The plugin's state in one SGLang process."""

    engine = "SGLang"
    logger = logger

    def __init__(self, setting: Setting) -> None:
        super().__init__(setting)
        self.workspaces: dict[str, Workspace] = {}  # by role
        self._by_tensor: dict[int, Workspace] = {}
        self._planners = functools.cache(plan_through)  # each (workspace, plan) wrapped once
        self.backends = 0  # FlashInfer backends given the workspaces
        self.own_workspaces = 0  # backends that made one of their own (init_new_workspace)
        self.other_backends: list[str] = []  # subclasses that run other kernels, by name
        self._int_sharer: weakref.ref[Any] | None = None  # whose decode wrappers share the int

    @property
    def serving(self) -> bool:
        return bool(self.workspaces) and self.untouched is None

    # Step 1: before SGLang sizes its KV pool (ModelRunner.alloc_memory_pool).
    def reserve(self, runner: Any, get_buffer: Callable[[str, Callable[[], Any]], Any]) -> None:
        """Make each role's workspace and store the decode one in SGLang's buffer registry, once."""
        if self.workspaces or self.untouched is not None:
            return
        # MLA's FlashInfer backend takes another buffer. Which backend runs attention SGLang
        # decides after the KV pool: seal() says where none took the workspaces.
        if runner.use_mla_backend:
            self.leave_untouched(
                "the model's attention is MLA, whose FlashInfer backend the plugin does not serve"
            )
            return
        import torch

        device, gpu_id = torch.device(runner.device), getattr(runner, "gpu_id", None)
        if device.type == "cuda" and device.index is None and isinstance(gpu_id, int):
            device = torch.device("cuda", gpu_id)  # SGLang's device is "cuda", gpu_id its index
        if self.setting.auto:
            if (measured := self._measure(runner, device)) is None:
                return
        else:
            measured = list(self.setting.records)
            self.check_calibration(device)
        keys = SGLANG.serving_keys(measured, self.setting.describe())
        # Only decode wrappers share an int workspace (each is planned, then run); SGLang plans
        # both prefill wrappers of a batch before it runs either, so each keeps its own.
        records = {r.path: r for r, _ in keys.values()}
        for path in records.keys() - {keys["decode"][0].path}:
            r = records[path]
            records[path] = dataclasses.replace(r, int_floor=dataclasses.replace(r.int_floor, mb=0))
        if others := [r.key for r in measured if r.path not in records]:
            logger.info(
                "mstar-resources: not made, as no FlashInfer wrapper of SGLang's plans on it: %s "
                "(another engine's resource, such as vLLM's WorkspaceManager)", ", ".join(others),
            )  # fmt: skip
        pools = build_pools(list(records.values()), device)
        workspaces = {role: pools[r.path].get(role, cg_slot) for role, (r, cg_slot) in keys.items()}
        decode = workspaces["decode"]
        if get_buffer(BUFFER_NAME, lambda: decode.tensor) is not decode.tensor:
            self.leave_untouched(f"SGLang made its {BUFFER_NAME!r} buffer before the plugin")
            return
        self.pools, self.workspaces = pools, workspaces
        self._by_tensor = {id(workspace.tensor): workspace for workspace in workspaces.values()}
        for role, (record, _) in keys.items():
            workspace = workspaces[role]
            shared = workspace.int_workspace
            logger.info(
                "mstar-resources: %s: %s bytes for SGLang's FlashInfer %s wrappers (floor %s)%s, "
                "before SGLang sizes its KV pool",
                workspace.name, f"{workspace.tensor.numel():,}", role,
                self.provenance.get(record.path) or f"from {record.floor.setting}",
                "" if shared is None or role != "decode" else
                f", and an int workspace of {shared.tensor.numel():,} bytes its wrappers share",
            )  # fmt: skip

    def _measure(self, runner: Any, device: Any) -> list[ResolvedResource] | None:
        """``auto``: the floors measured here (None: SGLang keeps its own, the log says why)."""
        from sglang.srt import runtime_context
        from sglang.srt.layers.attention.flashinfer_backend import should_use_tensor_core

        plans = sglang_plans(runner, runtime_context, should_use_tensor_core)
        if isinstance(plans, str):
            self.leave_untouched(f"{plans}, which {AUTO} does not measure")
            return None
        try:
            records, self.provenance = measure(plans, device)
        finally:
            if device.type == "cuda":  # what the measurement freed, given back before KV sizing
                import torch

                torch.cuda.empty_cache()
        return records

    # Step 2: as SGLang builds each FlashInfer backend.
    def adopt(self, backend: Any) -> None:
        """Put ``backend``'s prefill wrappers on the prefill workspace (its decode wrappers are on
        the decode one, from the registry); one with a workspace of its own keeps it."""
        if not self.serving:
            return
        decode, prefill = self.workspaces["decode"], self.workspaces["prefill"]
        if getattr(backend, "workspace_buffer", None) is not decode.tensor:
            self.own_workspaces += 1
            if self.own_workspaces == 1:
                logger.warning(
                    "mstar-resources: a FlashInfer backend of SGLang made its own workspace "
                    "(init_new_workspace: a speculative worker's, say), which the plugin does "
                    "not size; its KV pool was sized without it"
                )
            return
        self.backends += 1
        if self._int_sharer is None and backend.num_wrappers == 1:
            self._int_sharer = weakref.ref(backend)
            self.share_int(backend, backend.decode_wrappers)
        for name in PREFILL_WRAPPERS:
            held = getattr(backend, name, None)
            for wrapper in held if isinstance(held, list) else [held]:
                if wrapper is not None:  # as if built on the prefill workspace
                    attributes = vars(wrapper)
                    attributes[FLOAT_BUFFER] = prefill.tensor
                    refresh_recorded_size(attributes, prefill.tensor, prefill.tensor.numel())

    def not_adopted(self, backend: str) -> None:
        """Say once that ``backend``, a subclass running other kernels, is not served."""
        if backend not in self.other_backends:
            self.other_backends.append(backend)
            logger.info(
                "mstar-resources: SGLang's %s runs TRT-LLM's kernels on a workspace of its own, "
                "which the plugin does not size; its FlashInfer wrappers plan nothing", backend,
            )  # fmt: skip

    def share_int(self, backend: Any, wrappers: Any) -> None:
        """Give ``backend``'s decode ``wrappers`` the decode int workspace in place of their own,
        where it is the first with one decode wrapper a batch; any other (a multi-step draft's, a
        sliding-window pair) plans several before running them."""
        if (sharer := self._int_sharer) is None or sharer() is not backend:
            return
        for wrapper in wrappers or ():
            if install_int_workspace(wrapper, self.workspaces["decode"]):
                self.shared_int_wrappers += 1

    def plan(self, plan: Callable[..., Any], wrapper: Any, *args: Any, **kwargs: Any) -> Any:
        """``plan(wrapper, ...)``, through ``wrapper``'s workspace where it is the plugin's."""
        workspace = self._by_tensor.get(id(getattr(wrapper, FLOAT_BUFFER, None)))
        if workspace is None:
            return plan(wrapper, *args, **kwargs)
        return self._planners(workspace, plan)(wrapper, *args, **kwargs)

    # Step 3: before SGLang captures CUDA graphs (ModelRunner.init_cuda_graphs).
    def seal(self, before: str) -> None:
        if self.serving and self.sealed_before is None and not self.backends:
            logger.warning(
                "mstar-resources: %s set, but no FlashInfer backend of SGLang took the "
                "workspaces (SGLang runs attention on another backend; set --attention-backend "
                "flashinfer, or unset %s): %s bytes held for nothing",
                self.setting.describe(), self.setting.name, f"{self.held_bytes:,}",
            )  # fmt: skip
        super().seal(before)

    def decode_graphs_after_seal(self, runner: Any) -> None:
        """SGLang captures decode graphs after startup (a PD role switch, 0.5.21+: a prefill
        instance switching to decode), once: over the sealed workspaces, which do not grow; say
        which floor must hold them."""
        if not self.serving or getattr(runner, "decode_cuda_graph_captured", False):
            return
        decode = self.workspaces["decode"]
        logger.warning(
            "mstar-resources: SGLang captures decode CUDA graphs after startup (a switch to the "
            "decode role) over workspace '%s' of %s bytes, sealed at startup; a decode plan past "
            "it is refused, naming %s. Declare it for this instance's decode graphs: calibrate "
            "the deployment on an instance launched as decode",
            decode.name, f"{decode.tensor.numel():,}", decode.floor,
        )  # fmt: skip

    def report(self) -> dict[str, Any]:
        return {
            **super().report(),
            "backends": self.backends,
            "own_workspaces": self.own_workspaces,
            "other_backends": list(self.other_backends),
        }
