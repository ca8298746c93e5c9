"""The calibrated record: what a calibrated deployment says it was measured with, and whether
that still holds where, and as, it runs now. Config, like the profile it records: the resolver
checks it when it builds pools on a GPU.

A calibrated floor holds for the inputs it was measured with: the GPU (its name and SM count:
FlashInfer's scheduler sizes its split-KV work by the SMs), the FlashInfer, torch and CUDA
versions, every field of the calibration profile (the model's shape, the engine's limits, the graph
batch sizes, each plan's kind and backend), and the labels and CUDA-graph slots of the resources
it measured. ``mstar-resources-calibrate`` records each of them as a field under the key
``calibrated`` (:func:`calibration_inputs`); :func:`stale_calibration` compares a record with what
runs field by field, every field but those in :data:`NOT_INPUTS`, and names each that differs.
Where a deployment whose record differs runs on a GPU, :func:`check_calibration` logs one
WARNING naming them and the command that recalibrates.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, cast

from omegaconf import DictConfig, OmegaConf

from ..errors import ResourceConfigError
from ..resolver import RESOURCES_KEY, resolve
from ..units import mb_to_hold
from .profile import PROFILE_KEY, CalibrationProfile, load_profile

if TYPE_CHECKING:
    from torch import device as Device  # a field below is named torch

__all__ = [
    "NOT_INPUTS",
    "RECORD_KEY",
    "CalibratedFloor",
    "Difference",
    "Machine",
    "StaleCalibration",
    "calibrated_floors",
    "calibration_inputs",
    "calibration_nodes",
    "check_calibration",
    "declared_mb_for",
    "record_differences",
    "stale_calibration",
    "warn_if_stale",
]

logger = logging.getLogger(__name__)

RECORD_KEY = "calibrated"
"""The config key a calibrated deployment keeps its measurements and their inputs under, beside
``resources`` and ``calibration``."""


class Declared(Protocol):
    """A declared resource, as far as its calibration depends on it."""

    @property
    def path(self) -> str: ...

    @property
    def labels(self) -> tuple[str, ...]: ...

    @property
    def cg_slots(self) -> tuple[int, ...]: ...


def declared_mb_for(need_bytes: int, margin: float = 0.0) -> int:
    """The ``declared_mb`` that holds ``need_bytes`` plus ``margin``: at least 1. What
    calibration declares for a measured need."""
    return max(1, mb_to_hold(math.ceil(need_bytes * (1 + margin))))


@dataclass(frozen=True)
class CalibratedFloor:
    """A floor a calibrated deployment declares as calibration wrote it."""

    need_bytes: int
    """What calibration measured the resource's plans to need."""
    margin: float
    """What it added, as a fraction."""
    int_need_bytes: int | None = None
    """What it measured the plans to need of the int workspace, where the resource's
    ``int_declared_mb`` is still the one it wrote from that (None: not measured, or set
    otherwise since)."""


def calibrated_floors(record: Any, resources: Sequence[Any]) -> dict[str, CalibratedFloor]:
    """The resources of ``resources`` (resolved, with ``path`` and ``declared_mb``) whose floor is
    the one the calibrated ``record`` wrote (its need plus its margin), by path; a floor set
    otherwise since (on the command line, say) is not calibrated."""
    if record is None:
        return {}
    plain = cast(
        Mapping[str, Any],
        OmegaConf.to_container(record) if isinstance(record, DictConfig) else record,
    )
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


def record_differences(
    record: Any, profile: Any, resources: Sequence[Declared]
) -> tuple[Difference, ...]:
    """What differs between the calibrated ``record`` and the ``profile`` (the ``calibration``
    node) and ``resources`` composed now, the machine aside: a check any CPU can make (the dry
    run's). Empty when they match, or when either node is missing."""
    if record is None or profile is None:
        return ()
    plain = cast(
        Mapping[str, Any],
        OmegaConf.to_container(record) if isinstance(record, DictConfig) else record,
    )
    recorded_machine = Machine(
        **{f.name: plain.get(f.name, "?") for f in dataclasses.fields(Machine)}
    )
    running = calibration_inputs(recorded_machine, load_profile(profile), resources)
    stale = stale_calibration(plain, running)
    return () if stale is None else stale.differences


NOT_INPUTS = frozenset({"deployment", "date", "margin", "needs", "one_buffer"})
"""The fields of a record that no need depends on, and that the comparison ignores: the
deployment's name, the day, the margin (it moves the floor, not the need) and the needs
themselves (per resource, and the one-buffer engines' size).
Every other recorded field is compared; a field recorded on one side only differs."""


@dataclass(frozen=True)
class Machine:
    """The machine a calibration ran on, or the one running now."""

    gpu: str
    """The GPU's name, e.g. ``NVIDIA H200``."""
    sm_count: int
    flashinfer: str
    """FlashInfer's version (``flashinfer-python``'s), or ``none`` where it is not installed."""
    torch: str
    """torch's version, e.g. ``2.11.0+cu130``."""
    cuda: str
    """The CUDA version torch was built with, e.g. ``13.0``."""

    @classmethod
    def here(cls, device: Device) -> Machine:
        """This process on ``device`` (imports torch, not FlashInfer)."""
        import torch

        gpu = torch.cuda.get_device_properties(device)
        try:
            flashinfer = importlib.metadata.version("flashinfer-python")
        except importlib.metadata.PackageNotFoundError:
            flashinfer = "none"
        return cls(
            gpu.name, gpu.multi_processor_count, flashinfer, str(torch.__version__),
            str(torch.version.cuda),
        )  # fmt: skip

    def __str__(self) -> str:
        return (
            f"{self.gpu} ({self.sm_count} SMs), FlashInfer {self.flashinfer}, torch {self.torch}, "
            f"CUDA {self.cuda}"
        )


def calibration_inputs(
    machine: Machine, profile: CalibrationProfile, resources: Sequence[Declared]
) -> dict[str, Any]:
    """Every input a calibration's needs depend on, as plain fields: what a calibrated deployment
    records under ``calibrated`` (besides :data:`NOT_INPUTS`), and what runs is compared with."""
    return {
        **asdict(machine),
        "profile": plain_values(asdict(profile)),
        "resources": {
            r.path: {"labels": list(r.labels), "cg_slots": list(r.cg_slots)} for r in resources
        },
    }


@dataclass(frozen=True)
class Difference:
    """One input recorded with one value and running with another."""

    field: str
    """Its dotted name in the record, e.g. ``profile.model.head_dim_ckv``."""
    recorded: Any
    """Its value in the record; None where the record has no such field."""
    running: Any
    """Its value where it runs now; None where it has no such field."""

    def __str__(self) -> str:
        return f"{self.field} ({_text(self.recorded)} recorded, {_text(self.running)} here)"


@dataclass(frozen=True)
class StaleCalibration:
    """Why a calibrated deployment's floors may not hold where it runs: what differs. Its text is
    the warning :func:`check_calibration` logs."""

    deployment: str
    """The deployment that was calibrated (its override is ``<deployment>_calibrated``, or
    ``_recalibrated``)."""
    differences: tuple[Difference, ...]
    """Each input that differs, in the record's order."""
    recorded_on: str
    """The machine in the record, in words."""
    running_on: str
    """The machine running now, in words."""

    @property
    def fields(self) -> tuple[str, ...]:
        """The dotted names of the inputs that differ."""
        return tuple(difference.field for difference in self.differences)

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


def stale_calibration(
    record: Mapping[str, Any], running: Mapping[str, Any]
) -> StaleCalibration | None:
    """How the calibration ``record`` (the ``calibrated`` node) differs from the inputs
    ``running`` (:func:`calibration_inputs` of what runs), field by field; None when every input
    is the same."""
    recorded = dict(_flat(record, skip=NOT_INPUTS))
    here = dict(_flat(running, skip=NOT_INPUTS))
    differences = tuple(
        Difference(name, recorded.get(name), here.get(name))
        for name in {**recorded, **here}
        if recorded.get(name, _ABSENT) != here.get(name, _ABSENT)
        # A field the record predates, unset here (a profile field added since, at its None):
        # nothing recorded and nothing here are the same input.
        and not (recorded.get(name) is None and here.get(name) is None)
    )
    if not differences:
        return None
    return StaleCalibration(
        deployment=str(record.get("deployment", "<deployment>")),
        differences=differences,
        recorded_on=_machine_in_words(record),
        running_on=_machine_in_words(running),
    )


def calibration_nodes(cfg: DictConfig) -> tuple[Any, Any]:
    """The calibration profile (``calibration``) and record (``calibrated``) of the composed
    ``cfg``, None where it has none; :class:`ResourceConfigError` where one is no mapping (a
    value set on the command line, ``calibrated=5``)."""
    found = []
    takes = {PROFILE_KEY: "a calibration profile (model, limits, plans)",
             RECORD_KEY: "what calibration measured (its needs and margin)"}  # fmt: skip
    for key, what in takes.items():
        node = cfg.get(key)
        if node is not None and not isinstance(node, DictConfig | Mapping):
            raise ResourceConfigError(f"{key}={node!r} is not valid; {key} takes {what}")
        found.append(node)
    return found[0], found[1]


def check_calibration(
    cfg: DictConfig,
    device: Device | str,
    *,
    resolved: Sequence[Declared] | None = None,
    warn: bool = True,
) -> StaleCalibration | None:
    """Log one WARNING, and return what differs, when the composed config ``cfg`` (holding
    ``resources``, ``calibration`` and ``calibrated``) was calibrated with other inputs than
    those running on ``device``; None when it holds, or when ``cfg`` is not calibrated. The apps
    ask it wherever they build pools on a GPU; an engine asks it once, beside ``build_pools``.
    ``resolved``: what :func:`~mstar_resources.resolve` gave for ``cfg.resources``, where the
    caller has it (else it is resolved here). ``warn=False``: return it, logging nothing (a
    caller that says it in a warning of its own)."""
    import torch

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
    return warn_if_stale(record, profile, resolved, device, warn=warn)


def warn_if_stale(
    record: Any, profile: Any, resources: Sequence[Declared], device: Device, *, warn: bool = True
) -> StaleCalibration | None:
    """Log one WARNING (unless not ``warn``), and return what differs, when a calibrated
    deployment's ``record`` (its ``calibrated`` node) was measured with other inputs than
    ``profile`` (its ``calibration`` node) and ``resources`` have on ``device``; None when it
    holds, or when either node is missing (a deployment that was not calibrated)."""
    if record is None or profile is None:
        return None
    running = calibration_inputs(Machine.here(device), load_profile(profile), resources)
    plain = OmegaConf.to_container(record) if isinstance(record, DictConfig) else record
    stale = stale_calibration(cast(Mapping[str, Any], plain), running)
    if stale is not None and warn:
        logger.warning("%s", stale)
    return stale


_ABSENT = object()


def _flat(
    values: Mapping[str, Any], skip: frozenset[str], prefix: str = ""
) -> Iterator[tuple[str, Any]]:
    """``values`` as (dotted name, leaf value) pairs; lists are leaves, compared whole."""
    for name, value in values.items():
        if not prefix and name in skip:
            continue
        if isinstance(value, Mapping) and value:
            yield from _flat(value, skip, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def plain_values(value: Any) -> Any:
    """``value`` with its enums as their values, as YAML writes them."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): plain_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_values(v) for v in value]
    return value


def _machine_in_words(values: Mapping[str, Any]) -> str:
    fields = {f.name: values.get(f.name, "?") for f in dataclasses.fields(Machine)}
    return str(Machine(**fields))


def _text(value: Any) -> str:
    return "nothing" if value is None else repr(value) if isinstance(value, str) else str(value)
