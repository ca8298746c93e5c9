"""The growable buffer of a float or int workspace (the latter with its host mirror): moved in
place onto a larger block when a plan overflows it, never once sealed."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import (
    ResourceUsageError,
    WorkspaceSealedError,
    WorkspaceShortError,
    check_argument,
    check_name,
)  # fmt: skip
from ..floor import FLOAT, INT, Buffer
from ..units import ALIGNMENT, mb_to_hold, plural
from ._overflow import Overflow

logger = logging.getLogger("mstar_resources.attn.workspace")


class WorkspaceGrowthError(WorkspaceShortError, torch.OutOfMemoryError):
    """The allocator ran out as a workspace grew (or made its floor); it keeps its old buffer
    (``held_bytes``). A ``torch.OutOfMemoryError`` too, for an engine's out-of-memory handling."""


# torch's CPU allocator runs out with a plain RuntimeError (c10/core/impl/alloc_cpu.cpp).
_CPU_ALLOCATOR_FAILED = "DefaultCPUAllocator: can't allocate memory"


def allocate(nbytes: int, device: torch.device | None, failed: str, **fields: Any) -> torch.Tensor:
    """``nbytes`` zeroed bytes on ``device``; if the allocator runs out, what ``failed``."""
    try:
        return torch.zeros(nbytes, dtype=torch.uint8, device=device)
    except RuntimeError as error:
        cpu_short = type(error) is RuntimeError and _CPU_ALLOCATOR_FAILED in str(error)
        if not cpu_short and not isinstance(error, torch.OutOfMemoryError):
            raise
        raise WorkspaceGrowthError(f"{failed} ({error})", needed_bytes=nbytes, **fields) from error


@dataclass(frozen=True)
class WorkspaceStats:
    """What one workspace holds now and how it got there."""

    name: str
    bytes: int
    floor_bytes: int
    floor_setting: str
    """The setting that sizes its floor: a config key, ``size_mb`` or the variable."""
    times_grown: int
    largest_growth_bytes: int
    largest_growth_allocation: str | None
    """The FlashInfer allocation that caused the largest growth."""
    sealed: bool
    grown_to_agree_bytes: int = 0
    """Bytes added at a group seal to match what other ranks hold."""
    kind: str = "float"
    """``float`` or ``int`` (an :class:`IntWorkspace`, whose host mirror holds as many)."""
    sealed_refusals: int = 0
    """Plans it refused, sealed, for want of room (each a :class:`WorkspaceSealedError`)."""

    def __str__(self) -> str:
        grown = (
            f"grew {self.times_grown}x, largest +{self.largest_growth_bytes:,} "
            f"for {self.largest_growth_allocation}"
            if self.times_grown
            else "never grew"
        )
        if self.grown_to_agree_bytes:
            grown += f", +{self.grown_to_agree_bytes:,} to agree with other ranks"
        sealed = "sealed" if self.sealed else "growable"
        if self.sealed_refusals:
            sealed += f", refused {plural(self.sealed_refusals, 'plan')}"
        return (
            f"{self.name}: {self.bytes:,} bytes (floor {self.floor_bytes:,} from "
            f"{self.floor_setting}), {grown}, {sealed}"
        )


class GrowableBuffer:
    """A workspace's device buffer, the base of a float and an int workspace (the latter with a
    pageable host mirror of as many bytes); every change of size or state is made under its lock:
    sealed while a plan runs, it stays."""

    def __init__(
        self, tensor: torch.Tensor, name: str, sealed: bool, floor: str, kind: Buffer = FLOAT
    ) -> None:
        check_argument("sealed", sealed, bool, "True or False")
        check_name("name", name, "must be a non-empty string: errors and logs name the workspace")
        is_tensor = isinstance(tensor, torch.Tensor)
        if not is_tensor or tensor.dtype != torch.uint8 or tensor.dim() != 1:
            described = f"{tensor.dim()}-D {tensor.dtype}" if is_tensor else type(tensor).__name__
            raise ResourceUsageError(
                f"workspace {name!r}: tensor must be a 1-D torch.uint8 tensor, got a {described}"
            )
        if not tensor.is_contiguous():
            raise ResourceUsageError(f"workspace {name!r}: tensor must be contiguous")
        if tensor.data_ptr() % ALIGNMENT:
            raise ResourceUsageError(
                f"workspace {name!r}: tensor starts at {tensor.data_ptr():#x}, which FlashInfer "
                f"cannot use: it must be {ALIGNMENT}-byte aligned (a fresh torch.empty is)"
            )
        self._tensor, self._name, self._sealed, self._floor = tensor, name, sealed, floor
        self._floor_bytes = tensor.numel()
        self._kind = kind
        self._mirror = torch.zeros(tensor.numel(), dtype=torch.uint8) if kind is INT else None
        self._lock = threading.Lock()
        self._growth_refused = False  # its group is agreeing: plans may no longer grow it
        self._times_grown = 0
        self._largest_growth: tuple[int, str | None] = (0, None)  # (bytes added, allocation)
        self._grown_to_agree = 0
        self._sealed_refusals = 0

    # Read-only: a sealed workspace never moves, and only its lock changes its state.
    @property
    def tensor(self) -> torch.Tensor:
        """The buffer wrappers are given: the same object for the workspace's whole life."""
        return self._tensor

    @property
    def name(self) -> str:
        return self._name

    @property
    def sealed(self) -> bool:
        return self._sealed

    @property
    def floor(self) -> str:
        return self._floor

    def __repr__(self) -> str:
        state = "sealed" if self.sealed else "growable"
        return f"{type(self).__name__}({self.name!r}, {self.tensor.numel()} bytes, {state})"

    def seal(self) -> None:
        """Keep this buffer's address from now on: graphs are about to be captured over it."""
        with self._lock:
            self._sealed = True

    def _refuse_growth(self, refused: bool) -> None:
        """Refuse a plan's overflow as if sealed while the ranks agree on sizes, or no longer."""
        with self._lock:
            self._growth_refused = refused

    def stats(self) -> WorkspaceStats:
        with self._lock:
            added, allocation = self._largest_growth
            return WorkspaceStats(
                self.name, self.tensor.numel(), self._floor_bytes, self.floor, self._times_grown,
                added, allocation, self.sealed, self._grown_to_agree, self._kind.kind,
                self._sealed_refusals,
            )  # fmt: skip

    def _grow(self, overflow: Overflow, planned_on: int, error: Exception | None) -> None:
        """Grow to what ``overflow``, from a plan on ``planned_on`` bytes, needs."""
        with self._lock:
            # Sealed while the plan ran, or its group agreeing on sizes a growth would leave behind.
            if self.sealed or self._growth_refused:
                raise self._sealed_error(overflow, None) from error
            have, need = self.tensor.numel(), overflow.bytes_needed(planned_on)
            added = self._resize(need, overflow.allocation)
            if not added:  # another plan grew it meanwhile
                return
            self._times_grown += 1
            if added > self._largest_growth[0]:
                self._largest_growth = (added, overflow.allocation)
        if not self.floor:  # a measurement's scratch: its growths are what it measures
            logger.debug("workspace %r grew from %d to %d bytes for %s", self.name, have, need,
                         overflow.allocation)  # fmt: skip
            return
        logger.info(
            "workspace %r grew from %d to %d bytes for %s; set %s=%d to reserve it up front",
            self.name, have, need, overflow.allocation, self.floor, mb_to_hold(need),
        )  # fmt: skip

    def _grow_to_agree(self, nbytes: int, ranks: str) -> int:
        """Grow to ``nbytes``, what ``ranks`` hold of this buffer; returns the bytes added."""
        with self._lock:
            have = self.tensor.numel()
            if self.sealed and have < nbytes:
                raise self._refusal(
                    f"workspace {self.name!r} is sealed at {have:,} bytes, and {ranks} hold "
                    f"{nbytes:,}; seal with the group before any rank seals alone",
                    needed=nbytes,
                )
            added = self._resize(nbytes, f"agreement with {ranks}")
            self._grown_to_agree += added
            return added

    def _sealed_error(
        self, overflow: Overflow, whole: int | None, said_by: str = ""
    ) -> WorkspaceShortError:
        """A sealed buffer's refusal of ``overflow``, counted (``whole``: what the whole plan
        needs, where ``said_by`` said)."""
        self._sealed_refusals += 1
        have = self.tensor.numel()
        need = overflow.bytes_needed(have)
        failed = (
            f"{overflow.allocation} asked for {overflow.size:,} bytes in all"
            if overflow.whole_buffer
            else f"{overflow.allocation} asked for {overflow.size:,} bytes, alignment "
            f"{overflow.alignment}, with {have - overflow.available:,} taken"
        )
        asked, caveat = f"{need:,} ({failed})", ""
        if whole is not None and whole >= need:
            asked = f"{whole:,} in all, per {said_by} ({failed})"
        elif not overflow.whole_buffer:
            asked = f"at least {asked}"
            caveat = " (allocations after it were not tried and may ask for more)"
        whole = max(whole or 0, need)
        return self._refusal(
            f"workspace {self.name!r} is sealed at {have:,} bytes, and a plan needs {asked}; "
            f"set {self.floor}={mb_to_hold(whole)} or more{caveat}, or plan the largest shape "
            "before sealing",
            needed=whole,
        )

    def _refusal(self, message: str, needed: int) -> WorkspaceSealedError:
        return WorkspaceSealedError(
            message,
            workspace=self.name,
            held_bytes=self.tensor.numel(),
            needed_bytes=needed,
            setting=self.floor,
            suggested_mb=mb_to_hold(needed),
        )

    def _resize(self, need: int, cause: str) -> int:
        """Move onto ``need`` bytes (tail zeroed), the mirror with it, under the caller's lock;
        returns the bytes added. If either cannot be had, both keep their buffers."""
        have = self.tensor.numel()
        if have >= need:
            return 0
        fields: dict[str, Any] = {"workspace": self.name, "held_bytes": have, "setting": self.floor}
        # What reserves it up front ("" where no setting sizes it: a measurement's scratch).
        reserve = (
            f", or set {self.floor} so the workspace is reserved up front" if self.floor else ""
        )
        if need >= 1 << 63:  # torch would raise a TypeError of its own
            raise WorkspaceGrowthError(
                f"workspace {self.name!r}: {cause} asks to grow it from {have:,} to {need:,} "
                f"bytes, more than any GPU holds (or a tensor can count); it keeps its "
                f"{have:,}-byte buffer. The plan's arguments are likely wrong",
                needed_bytes=need,
                **fields,
            )
        grown_mirror = None
        if self._mirror is not None:
            failed = (
                f"int workspace {self.name!r}: could not grow its host mirror from {have:,} to "
                f"{need:,} bytes for {cause}; both keep their {have:,}-byte buffers. Free host "
                f"memory{reserve}."
            )
            grown_mirror = allocate(need, None, failed, **fields)
        # A failed resize_() leaves the tensor claiming storage it does not have, so the new
        # buffer is made whole before the tensor moves onto it.
        failed = (
            f"workspace {self.name!r}: could not grow from {have:,} to {need:,} bytes for "
            f"{cause}; it keeps its {have:,}-byte buffer. Free device memory{reserve}."
        )
        grown = allocate(need, self.tensor.device, failed, **fields)
        # Any error from here on (a broken CUDA context, say) is not a shortage: it reaches the
        # caller as it was raised, and the tensor has not moved.
        wait_for_every_stream(self.tensor)
        grown[:have].copy_(self.tensor)
        wait_for_every_stream(self.tensor)  # the copy reads the block about to be let go
        self.tensor.set_(grown.untyped_storage())
        if self._mirror is not None and grown_mirror is not None:
            self._mirror.set_(grown_mirror.untyped_storage())
        return need - have


def wait_for_every_stream(tensor: torch.Tensor) -> None:
    """Wait until no CUDA stream can use ``tensor``'s storage (the whole device: growth is rare).
    The caching allocator knows only a block's own stream: work another stream queued would land
    after the copy, or in the block's next tensor (seen on an H200)."""
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
