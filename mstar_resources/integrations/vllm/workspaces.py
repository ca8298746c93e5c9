"""One vLLM worker's workspaces: made at vLLM's memory profile, handed to each wrapper as vLLM
builds it, sealed before serving."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ...errors import ResourceConfigError, WorkspaceShortError
from ...resolver import ResolvedResource
from ...schema import WORKSPACE_MANAGER_LABEL
from ..plugin import PluginState
from ..setting import Keys, PluginSetting, Setting, serving
from . import plans as vllm_plans
from .plans import ROLES, EngineReading, Profiled, Role
from .workspace_manager import ManagerScratch, logger

if TYPE_CHECKING:
    import torch

    from ...attn.trtllm_workspace import TrtllmLaunchCheck
    from ...attn.workspace import Workspace
    from ...calibration.calibrate import Measured
    from ...calibration.profile import CalibrationProfile

ENV_VAR = "MSTAR_RESOURCES_VLLM"
VLLM = PluginSetting(ENV_VAR, "mstar_resources_vllm", "vLLM", ROLES)
"""The vLLM plugin's setting; its deployments compose with ``conf/mstar_resources_vllm``."""

SCALE_UP_LAUNCH = "VLLM_ELASTIC_EP_SCALE_UP_LAUNCH"  # 0.34: no profile, no warm-up (engine/core.py)

TRTLLM_LABEL = "trtllm"  # a deployment's resource of this label raises the TRT-LLM workspace
TRTLLM_PATH = "attn.trtllm"

ROLE: ContextVar[Role | None] = ContextVar("mstar_resources_vllm_role", default=None)
"""The role of the wrapper vLLM is building, while one of the builder's wrapper getters runs."""


class VllmWorkspaces(PluginState):
    """The workspaces vLLM's FlashInfer wrappers plan on in one process, one engine at a time."""

    engine = "vLLM"
    logger = logger

    def __init__(self, setting: Setting) -> None:
        # An engine started after the setting changed reads it again.
        self._loaded_value = os.environ.get(ENV_VAR, "").strip()
        self._engine: Callable[[], Any] | None = None  # the model runner served, weakly
        # vLLM's FlashInfer backend module and its own fast_plan_decode.
        self._decode_seam: tuple[Any, Callable[..., Any]] | None = None
        super().__init__(setting)
        if os.environ.get(SCALE_UP_LAUNCH, "0").strip() not in ("", "0"):
            self.block(
                f"{SCALE_UP_LAUNCH} is set: vLLM skips its memory profile in this launch (an "
                "elastic EP scale-up), and with it the plugin's reserve"
            )

    def _start_engine(self) -> None:
        super()._start_engine()
        self._workspaces: dict[str, Workspace] = {}
        # By id (a wrapper need not be hashable), weakly: a wrapper vLLM drops is not kept alive.
        self._routed: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._keys: Keys = {}
        self._int_builder: weakref.ref[Any] | None = None  # whose decode wrappers share the int
        self.reading = EngineReading()  # what vLLM's builders will plan, and vLLM's own buffer
        # vLLM's TRT-LLM kernels' workspace, where a phase runs them, and the check of each launch.
        self.trtllm_workspace: Workspace | None = None
        self.trtllm_check: TrtllmLaunchCheck | None = None
        self.unexpected: list[str] = []  # phases given a native wrapper no builder said would run
        self._unplanned_pages: set[int] = set()
        self._builders: weakref.WeakSet[Any] = weakref.WeakSet()  # the builders served
        self.manager = ManagerScratch()  # vLLM's WorkspaceManager
        self._set_decode_planner()

    @property
    def serving(self) -> bool:
        return bool(self._workspaces) or self.trtllm_workspace is not None

    @property
    def sealed(self) -> bool:
        return (
            self.serving
            and all(pool.sealed for pool in self.pools.values())
            and (self.trtllm_workspace is None or self.trtllm_workspace.sealed)
        )

    # Step 1: at vLLM's memory profile.
    def reserve(self, runner: Any) -> None:
        """Make the floor of vLLM's workspace manager, the native wrappers' workspaces and the
        TRT-LLM kernels', once an engine, before vLLM sizes its KV cache; else log why. Another
        engine's ``runner`` starts afresh."""
        if self._engine is not None:
            if self._engine() is runner:
                return
            self._start_engine()
        try:
            self._engine = weakref.ref(runner, self._on_engine_freed)
        except TypeError:  # a runner that takes no weak reference
            self._engine = lambda: runner
        if self.untouched is not None or not self._read_setting_again():
            return
        # Each read once, in order: the setting, vLLM's workspace manager (its floor made), what
        # vLLM's builders will plan; then the floors, the pools, the log.
        setting, config, device = self.setting, runner.vllm_config, runner.device
        auto, described = setting.auto, setting.describe()
        try:
            self.manager.reserve(serving(setting.records, WORKSPACE_MANAGER_LABEL), runner)
        except (ResourceConfigError, WorkspaceShortError):
            raise  # a floor with no room: the start ends, saying so
        except Exception as error:  # the plugin's own failure must not stop vLLM
            logger.warning(
                "mstar-resources: vLLM's workspace manager is left as vLLM makes it: the plugin "
                "failed to reserve it (%s: %s)", type(error).__name__, error,
            )  # fmt: skip
        try:
            reading = vllm_plans.read_engine(runner, measuring=auto)
            if isinstance(reading, str):
                self.leave_untouched(reading)
                return
            self.reading, roles = reading, reading.native_roles
            runs_trtllm = any(vllm_plans.trtllm_kernels(reading.plans))
            for line in reading.builder_lines():
                logger.info("mstar-resources: %s", line)
            if auto:  # each step for every builder and phase at once
                from ...calibration.calibrate import declared_mbs

                profiles = vllm_plans.builder_profiles(reading.plans, roles, config)
                needs = measured_needs(profiles, device)
                floors = declared_mbs(needs, margin=0.0)
                records, measured = vllm_plans.measured_records(profiles, needs, floors, described)
                self.provenance.update(measured)
            else:
                records = setting.records
                self.check_calibration(device)
            # no native phase (trtllm-gen prefills and decodes): no native workspace is served
            pools, keys = VLLM.pools(records, described, device, roles) if roles else ({}, {})
            trtllm = self._trtllm_size(config, device, records) if runs_trtllm else None
        except ResourceConfigError as error:
            self.leave_untouched(f"it cannot size the workspaces: {error}")
            return
        except Exception as error:  # the plugin's own failure must not stop vLLM
            self.leave_untouched(f"it failed ({type(error).__name__}: {error})")
            return
        self.pools, self._keys = pools, keys
        if trtllm is not None:  # zeroed: the kernels' semaphores must start at zero
            import torch

            from ...attn.trtllm_workspace import TrtllmLaunchCheck
            from ...attn.workspace import Workspace

            nbytes, floor_setting, sms, counters = trtllm
            zeros = torch.zeros(nbytes, dtype=torch.uint8, device=device)
            workspace = self.trtllm_workspace = Workspace(zeros, TRTLLM_PATH, floor=floor_setting)
            self.trtllm_check = TrtllmLaunchCheck(workspace, sms, counters_in_workspace=counters)
        for role, (record, cg_slot) in keys.items():
            self._workspaces[role] = pools[record.path].get(role, cg_slot)
        self._set_decode_planner()
        self._log_reserved(described)

    def _trtllm_size(
        self, config: Any, device: torch.device, records: Sequence[ResolvedResource]
    ) -> tuple[int, str, int, bool] | None:
        """The TRT-LLM kernels' workspace bytes, the setting that raises them, the SMs and whether
        FlashInfer keeps trtllm-gen's counters in it (None: the release was not read), where a
        phase runs them: their bound, or a deployment's ``trtllm`` floor where that is more."""
        if self.unread_release is not None:
            # The bound covers the launches of the releases read; another may launch otherwise.
            logger.info(
                "mstar-resources: vLLM %s is not a release this plugin was read in, so it does "
                "not size the TRT-LLM kernels' workspace there: vLLM keeps its own "
                "(VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE) for them",
                self.unread_release,
            )  # fmt: skip
            return None
        import torch

        from ...attn.trtllm_workspace import counters_in_workspace
        from ...calibration.profile import installed_flashinfer

        sms = torch.cuda.get_device_properties(device).multi_processor_count
        flashinfer = installed_flashinfer() or "unknown"
        counters = counters_in_workspace(flashinfer)
        need, how = vllm_plans.trtllm_workspace_bound(self.reading.plans, config, sms, flashinfer)
        self.provenance[TRTLLM_PATH] = f"the bound of what the kernels touch: {how}"
        declared = serving(records, TRTLLM_LABEL)
        if declared is None:
            return need, f"resources.{TRTLLM_PATH}.declared_mb", sms, counters
        floor = declared.floor.bytes
        if floor > need:
            self.provenance[TRTLLM_PATH] = (
                f"{declared.floor.setting} ({declared.floor.mb} MB), above the bound {need:,}"
            )
        return max(need, floor), declared.floor.setting, sms, counters

    def _on_engine_freed(self, runner: weakref.ref[Any]) -> None:
        """Let the workspaces go with their engine, before another engine's profile measures what
        is free (it fails where memory is freed during it)."""
        if self._engine is runner:
            self._engine = None
            self._start_engine()

    def _read_setting_again(self) -> bool:
        """Whether this engine is served by the setting as it is now, where it changed."""
        if os.environ.get(ENV_VAR, "").strip() == self._loaded_value:
            return True
        try:
            setting = VLLM.read()
        except ResourceConfigError as error:
            self.leave_untouched(f"it cannot read the setting as this engine starts: {error}")
            return False
        if setting is None:
            self.untouched = f"{ENV_VAR} is unset as this engine starts"
            logger.info("mstar-resources: %s: vLLM keeps its own FlashInfer workspace",
                        self.untouched)  # fmt: skip
            return False
        self.setting = setting
        return True

    def _log_reserved(self, described: str) -> None:
        for role in ROLES:
            workspace = self._workspaces.get(role)
            if workspace is None:
                logger.info(
                    "mstar-resources: no %s workspace: no FlashInfer native %s wrapper runs "
                    "(%s runs it)", role, role, self.reading.kernels(role),
                )  # fmt: skip
                continue
            record = self._keys[role][0]
            source = self.provenance.get(
                record.path, f"{record.floor.setting} ({record.floor.source})"
            )
            logger.info(
                "mstar-resources: %s: %s bytes for vLLM's FlashInfer %s wrappers; floor from %s",
                workspace.name, f"{workspace.tensor.numel():,}", role, source,
            )  # fmt: skip
        trtllm_bytes = self.trtllm_bytes
        if self.trtllm_workspace is not None:
            logger.info(
                "mstar-resources: %s: %s bytes for vLLM's TRT-LLM kernels, zeroed, in place of "
                "vLLM's VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE buffer, before vLLM sizes its KV "
                "cache; floor from %s",
                TRTLLM_PATH, f"{trtllm_bytes:,}", self.provenance[TRTLLM_PATH],
            )  # fmt: skip
        reading = self.reading
        where = "for each FlashInfer metadata builder, inside its memory profile"
        if reading.kv_cache_extensible:
            where = (
                "before it sizes its extensible KV cache after graph capture, from the memory "
                "then free: inside its budget, as these workspaces are"
            )
        elif reading.vllm_outside_budget:
            where = "once, shared by its builders, after it sizes its KV cache: outside its budget"
        logger.info(
            "mstar-resources: reserved %s bytes in %d FlashInfer workspaces (%s) and %s bytes for "
            "vLLM's TRT-LLM kernels before vLLM sizes its KV cache, where vLLM as it is would "
            "make %s bytes (%s) %s",
            f"{self.held_bytes:,}", len(self._workspaces), described,
            f"{trtllm_bytes:,}", f"{reading.vllm_bytes:,}", reading.vllm_how, where,
        )  # fmt: skip

    # Step 2: as vLLM builds and plans each wrapper.
    def workspace(self, builder: Any, role: Role | None) -> Workspace | None:
        """The workspace a wrapper of ``role`` is built on (None: any, for the V2 runner's shared
        buffer); None where vLLM keeps its own."""
        if not self.serving:
            return None
        if builder not in self._builders:
            self._builders.add(builder)
            self._check_page_size(builder)
        if role is None:  # any of them: the caller hands it to builders that build on it
            return next(iter(self._workspaces.values()), None)
        return self._workspaces.get(role)

    def unserved(self, role: Role, buffer: Any) -> None:
        """Say once that vLLM built a native ``role`` wrapper, on ``buffer``, where its builders
        said none would run (so the plugin made no workspace for it)."""
        if not self.serving or role in self.unexpected:
            return
        self.unexpected.append(role)
        where = "it takes vLLM's own buffer, which its KV-cache budget does not count"
        if ours := next((w for w in self._workspaces.values() if w.tensor is buffer), None):
            where = (
                f"it plans on the plugin's {ours.name} workspace, which vLLM's V2 runner gave "
                "every builder as its buffer, without growing it: FlashInfer checks each plan "
                "against that buffer's size"
            )
        logger.warning(
            "mstar-resources: vLLM built a FlashInfer native %s wrapper, though its builders run "
            "%s on %s; %s",
            role, role, self.reading.kernels(role), where,
        )  # fmt: skip

    def _check_page_size(self, builder: Any) -> None:
        """Warn once of a builder whose page size was not planned (0.32+ keeps the manager's
        block size for block-outermost packed KV tensors, which the profile cannot see)."""
        page = getattr(builder, "page_size", None)
        planned = {p.page_size for p in self.reading.plans}
        if page is None or not planned or page in planned or page in self._unplanned_pages:
            return
        self._unplanned_pages.add(page)
        logger.warning(
            "mstar-resources: vLLM made a FlashInfer metadata builder with pages of %d tokens, "
            "where the plugin planned %s; a plan past a floor grows its workspace before the "
            "seal, and one after it is refused naming the setting to raise",
            page, ", ".join(str(p) for p in sorted(planned)),
        )  # fmt: skip

    def route(self, wrapper: Any, role: Role, builder: Any) -> None:
        """Send ``wrapper``'s plans through its workspace: a decode wrapper's go through vLLM's
        ``fast_plan_decode`` (:meth:`take_decode_plans`); a prefill wrapper's ``plan`` is
        rebound on the wrapper itself (vLLM checks its type, so it stays FlashInfer's). The
        first ``builder``'s decode wrappers get the decode int workspace in place of their own."""
        workspace = self._workspaces.get(role)
        if wrapper is None or workspace is None or self._routed.get(id(wrapper)) is wrapper:
            return
        from ...attn._flashinfer import own_buffers
        from ...attn._float_workspace import plan_through

        if role == "decode" and workspace.int_workspace is not None:
            if self._int_builder is None or self._int_builder() is None:  # none yet, or freed
                self._int_builder = weakref.ref(builder)
            if self._int_builder() is builder and own_buffers(wrapper) is not None:
                record, cg_slot = self._keys[role]
                self.pools[record.path].install(wrapper, role, cg_slot)
                self.shared_int_wrappers += 1
        self._routed[id(wrapper)] = wrapper
        if role == "prefill":
            wrapper.plan = plan_through(workspace, wrapper.plan)

    def take_decode_plans(self, fast_plan_decode: Callable[..., Any], backend: Any) -> Any:
        """Make ``backend.fast_plan_decode`` the decode workspace's plan of vLLM's own
        ``fast_plan_decode`` while an engine is served with one, and vLLM's own while none is;
        returns the planner in place now."""
        self._decode_seam = (backend, fast_plan_decode)
        self._set_decode_planner()
        return backend.fast_plan_decode

    def _set_decode_planner(self) -> None:
        if self._decode_seam is None:
            return
        backend, original = self._decode_seam
        if (decode := self._workspaces.get("decode")) is None:
            # No import: an engine may be freed as the interpreter exits, when none can run.
            backend.fast_plan_decode = original
            return
        from ...attn._float_workspace import plan_through

        backend.fast_plan_decode = plan_through(decode, original)

    # Step 3: before vLLM captures CUDA graphs, or, where it captures none, before it serves.
    def seal(self, before: str) -> None:
        if self.trtllm_workspace is not None:
            self.trtllm_workspace.seal()
        super().seal(before)

    @property
    def trtllm_bytes(self) -> int:
        return 0 if self.trtllm_workspace is None else self.trtllm_workspace.tensor.numel()

    def report(self) -> dict[str, Any]:
        check, reading = self.trtllm_check, self.reading
        return {
            **super().report(),
            "builders_planned": [
                {"group": p.describe(), "kernels": dict(p.kernels), "q_dtypes": dict(p.q_dtypes)}
                for p in reading.plans
            ],
            "native_roles": list(reading.native_roles),
            "trtllm_workspace_bytes": self.trtllm_bytes,
            "trtllm_launches_checked": check.launches if check else 0,
            "trtllm_launches_refused": check.refused if check else 0,
            "vllm_bytes_per_builder": reading.vllm_bytes,
            "vllm_bytes_outside_budget": reading.vllm_bytes if reading.vllm_outside_budget else 0,
            "kv_cache_sized": (
                "after graph capture, from the memory then free (extensible KV cache)"
                if reading.kv_cache_extensible
                else "at the memory profile"
            ),
            "builders": len(self._builders),
            "sealed": self.sealed,
            "unexpected_wrappers": list(self.unexpected),
            "workspace_manager": self.manager.report(),
        }


@contextlib.contextmanager
def left_out_of_peak(device: torch.device) -> Iterator[None]:
    """Leave what the body allocates and frees out of torch's peak, which vLLM's profile reads,
    where the peak was at what was allocated before (a reset would lose an earlier peak)."""
    if device.type != "cuda":
        yield
        return
    import torch

    at_peak = torch.cuda.max_memory_allocated(device) == torch.cuda.memory_allocated(device)
    yield
    if at_peak:  # the measurement's memory is freed by then: it holds no cycle (tested on a GPU)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        logger.info(
            "mstar-resources: the measurement's transient memory counts in vLLM's profile (a "
            "peak reached before it would be lost by leaving it out)"
        )


def measured_needs(profiles: Sequence[Profiled], device: torch.device) -> list[Measured]:
    """What each of ``profiles`` needs (:func:`measured_need`), left out of torch's peak."""
    with left_out_of_peak(device):
        return [
            measured_need(profile, role, builder.graphs(role), device)
            for role, builder, profile in profiles
        ]


def measured_need(
    profile: CalibrationProfile, role: Role, graphs: bool, device: torch.device
) -> Measured:
    """What ``role``'s plans under ``profile`` need, measured on ``device`` (graphs: under them)."""
    from ...calibration.calibrate import measure_all, per_resource

    records = vllm_plans.serving_records([(role, graphs, None, None)])
    return per_resource(measure_all(records, profile, device, show_progress=False))[0]
