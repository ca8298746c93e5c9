"""``mstar-resources``: compose the resource tree, resolve it, and print what it reserves (with
``device=cuda``, also make every declared workspace and report what the GPU then holds)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from omegaconf import DictConfig

from .._internal.output import format_table
from ..calibration.record import (
    CalibratedFloor,
    Machine,
    calibrated_floors,
    check_calibration,
    checked_calibration_nodes,
    floors_below_need,
    stale_record,
)
from ..compose import ComposedTree
from ..errors import ResourceConfigError
from ..resolver import ResolvedResource, build_pools, resolve
from ..units import MIB, installed_version
from .hydra_app import cuda_device, hydra_app, is_cuda_device, package_version

__all__ = ["DryRunSettings", "OutputFormat", "main"]

PROG = "mstar-resources"
_COLUMNS = (
    "path", "owner", "labels", "slots", "floor MB", "source", "workspaces", "reserved MB",
    "int MB", "int source", "int reserved MB",
)  # fmt: skip
"""The float workspaces' columns, then the int ones' (each with a host mirror as large)."""


class OutputFormat(Enum):
    """``table`` for people, ``json`` for programs: one JSON document on stdout, nothing else."""

    table = "table"
    json = "json"


@dataclass
class DryRunSettings(ComposedTree):
    """``mstar-resources``'s settings, each told in the help of its primary config."""

    format: OutputFormat = field(default=OutputFormat.table, metadata={"expects": "table or json"})
    device: str = field(default="cpu", metadata={"expects": "cpu, cuda or cuda:N"})


@hydra_app(
    PROG,
    config_name="mstar_resources",
    compose_once=True,
    version=package_version,
    settings=DryRunSettings,
)
def main(cfg: DictConfig) -> None:
    device = cfg.device
    if device != "cpu" and not is_cuda_device(device):
        raise ResourceConfigError(
            f"device={device!r} is not a device to reserve on; set device=cpu (a dry run) or "
            "device=cuda (or cuda:N) to allocate"
        )
    records = resolve(cfg.resources)
    if not records:
        raise ResourceConfigError(
            "resources declares no resource, so there is nothing to reserve; put back the "
            "shipped tree's (leave out ~resources...), or declare one under resources"
        )
    calibrated = _check_calibration_inputs(cfg, records)
    report: dict[str, Any] = {
        "resources": [record.as_json() for record in records],
        "total_reserved_bytes": sum(record.reserved_bytes for record in records),
        "total_int_reserved_bytes": sum(record.int_reserved_bytes for record in records),
    }
    if calibrated:
        report["calibrated"] = {path: asdict(c) for path, c in calibrated.items()}
        report["calibrated_on"] = str(Machine.of(cfg.calibrated))
    if device != "cpu":
        report["device"] = device
        report["allocated_bytes"] = _allocate(cfg, records, device)
    if cfg.format is OutputFormat.json:
        print(json.dumps(report))
    else:
        print(_table(records, report, calibrated))
        if calibrated:  # which calibration composed: the FlashInfer installed picks it
            print(f"calibrated on {report['calibrated_on']}")


def _check_calibration_inputs(
    cfg: DictConfig, records: list[ResolvedResource]
) -> dict[str, CalibratedFloor]:
    """Refuse an invalid calibration, warn where it no longer holds, and return its floors."""
    profile, record = checked_calibration_nodes(cfg)
    if record is not None and profile is not None:
        # The GPU is the record's (a dry run has none to compare), the FlashInfer any installed.
        machine = Machine.of(record)
        flashinfer = installed_version("flashinfer-python") or machine.flashinfer
        here = replace(machine, flashinfer=flashinfer)
        if stale := stale_record(record, profile, records, here):
            print(
                f"{PROG}: warning: deployment {stale.deployment}'s calibration was made with "
                f"other inputs than it composes now: {'; '.join(map(str, stale.differences))}. "
                "Its floors may not hold: recalibrate with `mstar-resources-calibrate "
                f"deployment={stale.deployment}`",
                file=sys.stderr,
            )
    for below in floors_below_need(record, records):
        said = f"{below}: its plans past the floor grow it, and are refused once it is sealed"
        print(f"{PROG}: warning: {said}", file=sys.stderr)
    return calibrated_floors(record, records)


def _allocate(cfg: DictConfig, records: list[ResolvedResource], device: str) -> int:
    """Make every declared workspace on ``device``; returns how many more bytes the GPU holds."""
    import torch

    target = cuda_device(device, "set device=cpu for a dry run")
    check_calibration(cfg, target, resolved=records)
    torch.cuda.synchronize(target)
    before = torch.cuda.memory_allocated(target)
    _pools = build_pools(records, target, reserve=True)  # held until measured
    torch.cuda.synchronize(target)
    return torch.cuda.memory_allocated(target) - before


def _table(
    records: list[ResolvedResource], report: dict[str, Any], calibrated: dict[str, CalibratedFloor]
) -> str:
    rows = [
        (
            record.path,
            record.owner,
            ",".join(record.labels),
            ",".join(map(str, record.cg_slots)) or "eager",
            f"{record.floor.mb:,}",
            record.floor.source,
            str(record.workspaces),
            _mb(record.reserved_bytes),
            f"{record.int_floor.mb:,}",
            record.int_floor.source,
            _mb(record.int_reserved_bytes),
        )
        for record in records
    ]
    total, int_total = report["total_reserved_bytes"], report["total_int_reserved_bytes"]
    workspaces = sum(record.workspaces for record in records)
    footer = ["total", "", "", "", "", "", str(workspaces), _mb(total), "", "", _mb(int_total)]
    lines = [format_table([_COLUMNS, None, *rows, None, footer], right={4, 6, 7, 8, 10})]
    for path, c in calibrated.items():
        line = (
            f"{path}: declared by calibration, need {c.need_bytes:,} bytes + {c.margin:.0%} "
            f"(resources.{path}.declared_mb)"
        )
        if c.int_need_bytes is not None:
            line += f"; int need {c.int_need_bytes:,} bytes (resources.{path}.int_declared_mb)"
        lines.append(line)
    if "allocated_bytes" in report:
        lines.append(
            f"allocated on {report['device']}: {report['allocated_bytes']:,} bytes "
            f"(torch.cuda.memory_allocated), reserved: {total + int_total:,} bytes (float "
            f"{total:,}, int {int_total:,})"
        )
    return "\n".join(lines)


def _mb(nbytes: int) -> str:
    return f"{nbytes // MIB:,}" if nbytes % MIB == 0 else f"{nbytes / MIB:,.2f}"


if __name__ == "__main__":
    main()
