"""The calibrated record (config key ``calibrated``): the inputs a deployment's floors were
measured with, and whether they still hold where, and as, it runs."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, cast

from omegaconf import DictConfig, OmegaConf

from ..errors import ResourceConfigError, ResourceUsageError
from ..resolver import RESOURCES_KEY, ResolvedResource, resolve
from ..schema import WORKSPACE_MANAGER_LABEL
from ..units import mb_to_hold
from .profile import PROFILE_KEY, CalibrationProfile, installed_flashinfer, load_profile

if TYPE_CHECKING:
    from torch import device as Device  # a field below is named torch

__all__ = ["NOT_INPUTS", "RECORD_KEY", "Difference", "StaleCalibration", "check_calibration"]

logger = logging.getLogger(__name__)

RECORD_KEY = "calibrated"

NOT_INPUTS = frozenset({"deployment", "date", "margin", "needs", "one_buffer"})
"""The fields of a record that no need depends on (the margin moves the floor, not the need)."""


def declared_mb_for(need_bytes: int, margin: float = 0.0) -> int:
    """The ``declared_mb`` that holds ``need_bytes`` plus ``margin``: at least 1."""
    return max(1, mb_to_hold(math.ceil(need_bytes * (1 + margin))))


def _plain(node: Any) -> Mapping[str, Any]:
    plain = OmegaConf.to_container(node) if isinstance(node, DictConfig) else node
    return cast(Mapping[str, Any], plain)


@dataclass(frozen=True)
class CalibratedFloor:
    """A floor a calibrated deployment declares as calibration wrote it."""

    need_bytes: int
    margin: float
    int_need_bytes: int | None = None  # where int_declared_mb is still the one written from it


def calibrated_floors(record: Any, resources: Sequence[Any]) -> dict[str, CalibratedFloor]:
    """By path, the ``resources`` whose floor is the one the calibrated ``record`` wrote."""
    plain = _plain(record or {})
    margin = float(plain.get("margin", 0.0))
    needs = {n["path"]: n for n in plain.get("needs", [])}
    floors = {}
    for r in resources:
        need = needs.get(r.path)
        if need is None or r.declared_mb != declared_mb_for(int(need["need_bytes"]), margin):
            continue
        int_need = need.get("int_need_bytes")
        if int_need is not None and r.int_declared_mb != declared_mb_for(int(int_need), margin):
            int_need = None
        floors[r.path] = CalibratedFloor(
            int(need["need_bytes"]), margin, None if int_need is None else int(int_need)
        )
    return floors


def floors_below_need(record: Any, resources: Sequence[ResolvedResource]) -> list[str]:
    """A sentence for each of ``resources`` whose floor is below what the calibrated ``record``
    measured it needs (a floor lowered after calibration)."""
    needs = {n["path"]: int(n["need_bytes"]) for n in _plain(record or {}).get("needs", [])}
    return [
        f"{r.floor.setting}={r.floor.mb} holds {r.floor.bytes:,} bytes, less than the "
        f"{needs[r.path]:,} calibration measured resources.{r.path} needs"
        for r in resources
        if r.path in needs and r.floor.bytes < needs[r.path]
    ]


@dataclass(frozen=True)
class Machine:
    """The machine a calibration ran on, or the one running now."""

    gpu: str  # e.g. NVIDIA H200
    sm_count: int
    flashinfer: str  # or none
    torch: str
    cuda: str  # the CUDA version torch was built with, e.g. 13.0

    @classmethod
    def here(cls, device: Device) -> Machine:
        """This process on ``device`` (imports torch, not FlashInfer)."""
        import torch

        gpu = torch.cuda.get_device_properties(device)
        return cls(
            gpu.name, gpu.multi_processor_count, installed_flashinfer() or "none",
            str(torch.__version__), str(torch.version.cuda),
        )  # fmt: skip

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Machine:
        """The machine ``values`` (a record, or inputs) names, ``?`` for a field it lacks."""
        return cls(**{f.name: values.get(f.name, "?") for f in dataclasses.fields(cls)})

    def __str__(self) -> str:
        return (
            f"{self.gpu} ({self.sm_count} SMs), FlashInfer {self.flashinfer}, torch {self.torch}, "
            f"CUDA {self.cuda}"
        )


def planned(resources: Sequence[ResolvedResource]) -> list[ResolvedResource]:
    """The ``resources`` calibration plans: all but vLLM's WorkspaceManager, which vLLM's memory
    profile sizes, so declaring or changing it leaves a calibration as it was."""
    return [r for r in resources if WORKSPACE_MANAGER_LABEL not in r.labels]


def calibration_inputs(
    machine: Machine, profile: CalibrationProfile, resources: Sequence[ResolvedResource]
) -> dict[str, Any]:
    """Every input a calibration's needs depend on, as the record keeps them."""
    return {
        **asdict(machine),
        "profile": OmegaConf.to_container(OmegaConf.structured(profile), enum_to_str=True),
        "resources": {
            r.path: {"labels": list(r.labels), "cg_slots": list(r.cg_slots)}
            for r in planned(resources)
        },
    }


@dataclass(frozen=True)
class Difference:
    """One input recorded with one value and running with another (None: it has no such field)."""

    field: str  # its dotted name in the record, e.g. profile.model.head_dim_ckv
    recorded: Any
    running: Any

    def __str__(self) -> str:
        recorded, running = ("nothing" if v is None else repr(v) if isinstance(v, str) else str(v)
                             for v in (self.recorded, self.running))  # fmt: skip
        return f"{self.field} ({recorded} recorded, {running} here)"


@dataclass(frozen=True)
class StaleCalibration:
    """Why a calibrated deployment's floors may not hold where it runs; its text is the warning."""

    deployment: str
    differences: tuple[Difference, ...]  # in the record's order
    recorded_on: str
    running_on: str

    def __str__(self) -> str:
        differs = "; ".join(map(str, self.differences))
        where = (
            f"was made on this machine ({self.running_on})"
            if self.recorded_on == self.running_on
            else f"was made on {self.recorded_on}, and this is {self.running_on}"
        )
        return (
            f"deployment {self.deployment}'s calibration {where}; what differs: {differs}. Its "
            f"floors may not hold here: recalibrate with `mstar-resources-calibrate "
            f"deployment={self.deployment}` on this machine, with the settings in use"
        )


def _flat(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``values`` as (dotted name, leaf) pairs, :data:`NOT_INPUTS` left out; lists are leaves."""
    for name, value in values.items():
        if not prefix and name in NOT_INPUTS:
            continue
        if isinstance(value, Mapping) and value:
            yield from _flat(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def stale_calibration(
    record: Mapping[str, Any], running: Mapping[str, Any]
) -> StaleCalibration | None:
    """How the ``record`` differs from the inputs ``running``, field by field, or None."""
    recorded, here = dict(_flat(record)), dict(_flat(running))
    # A field on one side only reads as None: one the record predates, unset here, is the same.
    differences = tuple(
        Difference(name, recorded.get(name), here.get(name))
        for name in {**recorded, **here}
        if recorded.get(name) != here.get(name)
    )
    if not differences:
        return None
    return StaleCalibration(
        deployment=str(record.get("deployment", "<deployment>")),
        differences=differences,
        recorded_on=str(Machine.of(record)),
        running_on=str(Machine.of(running)),
    )


def stale_record(
    record: Any, profile: Any, resources: Sequence[ResolvedResource], machine: Machine
) -> StaleCalibration | None:
    """How the ``record`` differs from the ``profile`` and ``resources`` now on ``machine``."""
    running = calibration_inputs(machine, load_profile(profile), resources)
    return stale_calibration(_plain(record), running)


def calibration_nodes(cfg: DictConfig) -> tuple[Any, Any]:
    """The ``calibration`` profile and ``calibrated`` record of ``cfg`` (None: it has none)."""
    profile, record = cfg.get(PROFILE_KEY), cfg.get(RECORD_KEY)
    for key, node, what in (
        (PROFILE_KEY, profile, "a calibration profile (model, limits, plans)"),
        (RECORD_KEY, record, "what calibration measured (its needs and margin)"),
    ):
        if node is not None and not isinstance(node, DictConfig | Mapping):
            raise ResourceConfigError(f"{key}={node!r} is not valid; {key} takes {what}")
    return profile, record


def checked_calibration_nodes(cfg: DictConfig) -> tuple[Any, Any]:
    """:func:`calibration_nodes`, checked as the dry run and both plugins check them."""
    profile, record = calibration_nodes(cfg)
    if profile is not None:
        load_profile(profile)
    if record is not None:
        known = (
            NOT_INPUTS | {f.name for f in dataclasses.fields(Machine)} | {"profile", "resources"}
        )
        if unknown := [str(key) for key in record if str(key) not in known]:
            raise ResourceConfigError(
                f"{RECORD_KEY}.{unknown[0]} is not a field of what calibration records, which "
                f"the calibration's check would ignore; {RECORD_KEY} takes "
                f"{', '.join(sorted(known))} (mstar-resources-calibrate writes them)"
            )
    return profile, record


def check_calibration(
    cfg: DictConfig,
    device: Device | str,
    *,
    resolved: Sequence[ResolvedResource] | None = None,
    warn: bool = True,
) -> StaleCalibration | None:
    """Log one WARNING (unless ``warn=False``), and return what differs, when the composed ``cfg``
    was calibrated with other inputs than those running on the CUDA ``device``; else None."""
    import torch

    if not isinstance(cfg, DictConfig | Mapping):
        raise ResourceUsageError(
            f"cfg={cfg!r} must be the composed config (a DictConfig), e.g. the cfg @hydra.main "
            "gives, or compose_deployment()'s"
        )
    profile, record = calibration_nodes(cfg)
    if record is None or profile is None:
        return None  # not calibrated: nothing to hold, on any device
    device = torch.device(device)
    if device.type != "cuda":
        raise ResourceConfigError(
            f"check_calibration needs a CUDA device, the GPU the deployment runs on, and got "
            f"{device}; on a CPU, the dry run (mstar-resources deployment=<name>) compares the "
            "profile alone"
        )
    if resolved is None:
        resolved = resolve(cfg.get(RESOURCES_KEY) or {})
    stale = stale_record(record, profile, resolved, Machine.here(device))
    if stale is not None and warn:
        logger.warning("%s", stale)
    return stale
