"""vLLM's WorkspaceManager (``vllm/v1/worker/workspace.py``, read in 0.26.0 to 0.34.0) as a
resource: the scratch vLLM's MoE kernels, MLA prefill, Marlin and sparse indexers take, one buffer
per micro-batch slot (and lane), which vLLM grows on demand and locks after graph capture. A
deployment's floor is made before vLLM's memory profile, so the KV cache pays it; the manager is
sealed at graph capture or vLLM's lock, and a growth after that, or one the GPU has no room for,
ends in one paragraph naming the resource, the caller, the bytes and the setting to change."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import sys
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ResourceConfigError, WorkspaceSealedError
from ...resolver import ResolvedResource
from ...units import mb_to_hold

if TYPE_CHECKING:  # torch is imported where vLLM's manager is: not by the plugin's registration
    from ...attn._buffer import WorkspaceGrowthError

MODULE = "vllm.v1.worker.workspace"
PATH = "vllm.workspace_manager"
SETTING = f"resources.{PATH}.declared_mb"

# The vLLM plugin's logger: under vLLM's, so its handler prints these lines with its own.
logger = logging.getLogger("vllm.plugins.mstar_resources")


class ManagerScratch:
    """What the plugin holds and saw of vLLM's workspace manager in one engine."""

    def __init__(self) -> None:
        self.record: ResolvedResource | None = None  # the deployment's resource (None: auto)
        # The manager sealed (None: none is): another engine's, made before this one's is freed,
        # is not.
        self._sealed_manager: weakref.ref[Any] | None = None
        self.sealed_when: str | None = None  # what sealed it last
        self.reserved: list[int] = []  # each slot's bytes before vLLM's memory profile
        self.at_seal: list[int] = []  # each slot's bytes when it was sealed
        self.room = 0  # the least any slot held then: a request within it grows nothing
        self.refused = 0  # growths asked after the seal
        self.max_num_batched_tokens: int | None = None

    @property
    def setting(self) -> str:
        return SETTING if self.record is None else self.record.floor.setting

    def reserve(self, record: ResolvedResource | None, runner: Any) -> None:
        """``record``'s floor made in each slot it serves, before vLLM's memory profile (None: no
        resource declares one, as in ``auto``: vLLM's profile grows the manager as it does)."""
        manager = _manager()
        if manager is None:
            return
        scheduler = getattr(runner.vllm_config, "scheduler_config", None)
        self.max_num_batched_tokens = getattr(scheduler, "max_num_batched_tokens", None)
        self.record = record
        slots: list[Any] = manager._current_workspaces
        if record is not None:
            import torch

            floor = record.floor.bytes
            fill = [s for s in record.cg_slots or range(len(slots))
                    if s < len(slots) and held(slots[s]) < floor]  # fmt: skip
            self._check_budget(runner, manager, floor * len(fill), record.floor.mb)
            # 0.32+ allocates in a context of its own (sleep mode's pool): so does the floor.
            pool = getattr(manager, "_alloc_context", contextlib.nullcontext)
            for slot in fill:
                try:
                    with pool():
                        slots[slot] = torch.empty(floor, dtype=torch.uint8, device=manager._device)
                except torch.OutOfMemoryError as error:
                    had = held(slots[slot])
                    raise self.no_room(manager, floor, slot, had, "the plugin's floor") from error
        self.reserved = [held(tensor) for tensor in slots]
        floor_from = (
            f"floor from {self.setting}" if self.record else "no floor declared: vLLM's profile "
            "grows it to what its largest batch takes"
        )  # fmt: skip
        logger.info(
            "mstar-resources: %s: %s bytes in vLLM's workspace manager (%d slots), before vLLM's "
            "memory profile; %s", PATH, f"{sum(self.reserved):,}", len(slots), floor_from,
        )  # fmt: skip

    def _check_budget(self, runner: Any, manager: Any, need: int, mb: int) -> None:
        """Refuse floors that leave no KV cache in the memory the user gave vLLM
        (``gpu_memory_utilization`` of the GPU, less what it holds now: the model's weights...)."""
        import torch

        cache = getattr(runner.vllm_config, "cache_config", None)
        # 0.34's gpu_memory_utilization is None unless given: the share it uses is resolved apart.
        share = getattr(cache, "resolved_gpu_memory_utilization", None)
        share = share or getattr(cache, "gpu_memory_utilization", None)
        if (
            not need
            or not isinstance(share, int | float)
            or isinstance(share, bool)
            or getattr(cache, "kv_cache_memory_bytes", None)
        ):
            return  # an explicit KV cache size is vLLM's to check
        free, total = torch.cuda.mem_get_info(manager._device)
        left = math.ceil(total * share) - (total - free)
        if need > left:
            raise ResourceConfigError(
                f"{self.setting}={mb} makes {need:,} bytes of vLLM's workspace "
                f"manager before its memory profile, and gpu_memory_utilization={share} of the "
                f"GPU's {total:,} bytes, less the {total - free:,} it holds now (the model's "
                f"weights among them), leaves {max(left, 0):,} for it, vLLM's activations and its "
                f"KV cache: lower {self.setting}, or raise gpu_memory_utilization"
            )

    def seal(self, when: str) -> None:
        """Sealed where graphs are captured over it or vLLM locks it, whichever comes first."""
        manager = _manager()
        if manager is None or self.sealed:
            return
        self._sealed_manager, self.sealed_when = weakref.ref(manager), when
        self.at_seal = [held(tensor) for tensor in manager._current_workspaces]
        self.room = min(self.at_seal)
        logger.info(
            "mstar-resources: %s: sealed as %s, at %s bytes (%s by slot; %s before its memory "
            "profile)", PATH, when, f"{sum(self.at_seal):,}",
            ", ".join(f"{n:,}" for n in self.at_seal), f"{sum(self.reserved):,}",
        )  # fmt: skip

    @property
    def sealed(self) -> bool:
        return self._sealed_manager is not None

    def seals(self, manager: Any) -> bool:
        """Whether ``manager`` is the one sealed (not a manager of another engine's made since)."""
        return self._sealed_manager is not None and self._sealed_manager() is manager

    def unlocked(self, why: str) -> None:
        """Unsealed ``why`` (vLLM's own unlock for elastic EP scaling, or no graphs captured): it
        may grow again until vLLM locks it."""
        if not self.sealed:
            return
        self._sealed_manager = None
        logger.info("mstar-resources: %s: unsealed, %s: it grows until vLLM locks it", PATH, why)

    def refusal(self, manager: Any, required: int) -> WorkspaceSealedError:
        """A growth asked after the seal, as the error that replaces vLLM's assertion."""
        self.refused += 1
        slot = current_slot(manager)
        have = held(manager._current_workspaces[slot])
        mb, record = mb_to_hold(required), self.record
        slots = "" if record is None or not record.cg_slots or slot in record.cg_slots else (
            f"add {slot} to resources.{PATH}.cg_slots (now {list(record.cg_slots)}), whose "
            "slots alone the floor is made in, and "
        )  # fmt: skip
        if slots and record is not None:
            mb = max(mb, record.floor.mb)
        return WorkspaceSealedError(
            f"vLLM's workspace manager ({PATH}, slot {slot}) is sealed at {have:,} bytes (as "
            f"{self.sealed_when}), and {caller()} asks for {required:,}; {slots}"
            f"declare {self.setting}={mb} or more in the deployment, so that "
            "it is made before vLLM's memory profile and its KV cache pays it",
            workspace=f"{PATH}:{slot}", held_bytes=have, needed_bytes=required,
            setting=self.setting, suggested_mb=mb,
        )  # fmt: skip

    def no_room(
        self, manager: Any, required: int, slot: int, had: int, asker: str | None = None
    ) -> WorkspaceGrowthError:
        """The GPU has no room for ``required`` bytes in ``slot``, which ``had`` bytes before:
        what was free, and what to set (for ``asker``, the plugin's floor: that floor)."""
        import torch

        from ...attn._buffer import WorkspaceGrowthError

        free, total = torch.cuda.mem_get_info(manager._device)
        tokens = self.max_num_batched_tokens
        fix = (
            f"lower {self.setting} (now {self.record.floor.mb} MB)" if self.record and asker
            else f"lower max_num_batched_tokens{'' if tokens is None else f' (now {tokens:,})'}, "
            "whose largest batch the kernels taking this scratch are sized for"
        )  # fmt: skip
        return WorkspaceGrowthError(
            f"vLLM's workspace manager ({PATH}, slot {slot}) needs {required:,} bytes for "
            f"{asker or caller()}, and the GPU has {free:,} of {total:,} bytes free before vLLM "
            "sizes its KV cache (the model and vLLM's profile hold the rest; "
            f"gpu_memory_utilization does not change it): {fix}",
            workspace=f"{PATH}:{slot}", needed_bytes=required, held_bytes=had,
            setting=self.setting,
        )  # fmt: skip

    def report(self) -> dict[str, Any]:
        return {
            "floor_setting": self.setting if self.record else None,
            "bytes_before_profile": list(self.reserved),
            "bytes_at_seal": list(self.at_seal),
            "sealed_when": self.sealed_when,
            "growths_refused_after_seal": self.refused,
            "sealed": self.sealed,
        }


def checked_growth(scratch: ManagerScratch, ensure: Any) -> Any:
    """``WorkspaceManager._ensure_workspace_size``: vLLM's, its refusal after the lock and an
    allocator with no room raised as the plugin's errors."""
    import torch

    @functools.wraps(ensure)
    def _ensure_workspace_size(self: Any, required_bytes: int) -> Any:
        if (  # sealed: refused before vLLM moves the buffer graphs replay into
            scratch.sealed
            and required_bytes > scratch.room
            and scratch.seals(self)
            and held(self._current_workspaces[current_slot(self)]) < required_bytes
        ):
            raise scratch.refusal(self, required_bytes)
        buffers = list(self._current_workspaces)  # vLLM lets a slot's go before it grows it
        try:
            return ensure(self, required_bytes)
        except AssertionError:
            if not self.is_locked():
                raise
            raise scratch.refusal(self, required_bytes) from None
        except torch.OutOfMemoryError as error:
            slot = current_slot(self)
            raise scratch.no_room(self, required_bytes, slot, held(buffers[slot])) from error

    # vLLM 0.32+ names its caller by the first frame whose qualified name is not the manager's.
    checked: Any = _ensure_workspace_size
    if hasattr(checked.__code__, "co_qualname"):  # Python 3.11+
        checked.__code__ = checked.__code__.replace(co_qualname=checked.__qualname__)
    return checked


def _manager() -> Any:
    """vLLM's workspace manager of this process, None where there is none yet."""
    module = sys.modules.get(MODULE)
    if module is None or not module.is_workspace_manager_initialized():
        return None
    return module.current_workspace_manager()


def current_slot(manager: Any) -> int:
    """The slot vLLM's manager serves now: its own count from 0.31 (``_get_workspace_id``);
    before, as 0.26 to 0.30 count it (this copy goes once 0.31 is the oldest release served)."""
    if hasattr(manager, "_get_workspace_id"):
        return int(manager._get_workspace_id())
    module = sys.modules[MODULE]
    lane = getattr(module, "_workspace_lane", None)  # 0.28 to 0.30
    lanes = getattr(manager, "_num_lanes", 1)
    return int(module.dbo_current_ubatch_id()) * lanes + (0 if lane is None else lane.get())


def caller() -> str:
    """Where the bytes were asked for, as vLLM's own message names it (``file:line:function``):
    the first frame outside this package and the manager's own methods."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_globals.get("__name__", "").startswith(f"{__package__.partition('.')[0]}.")
        or type(frame.f_locals.get("self")).__name__ == "WorkspaceManager"
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "an unknown caller"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}:{frame.f_code.co_name}"


def held(tensor: Any) -> int:
    return 0 if tensor is None else int(tensor.numel() * tensor.element_size())
