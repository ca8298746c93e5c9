"""Calibrating a deployment on this GPU: the checks, each resource's labels planned on FlashInfer's
wrappers, the report of their needs, and the deployment that declares them (``_calibrated``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from .._internal.output import format_table
from ..errors import ResourceConfigError
from ..files import FLASHINFER_FOLDER, shipped_deployments, write_whole
from ..floor import INT
from ..resolver import ResolvedResource
from ..units import MIB
from .profile import GRAPH_KINDS, PROFILE_KEY, CalibrationProfile, PlanKind, check_flashinfer
from .record import RECORD_KEY, declared_mb_for

if TYPE_CHECKING:  # torch and the measuring load when a GPU measures
    import torch

    from .measure import Need

DEFAULT_MARGIN = 0.0
"""Added to a measured need before it is declared: none, since the need is the most any plan
within the profile's limits can ask for (``docs/calibration.md``); ``margin=0.1`` is for a GPU or
FlashInfer build the bound was not checked on."""

CALIBRATED_SUFFIX = "_calibrated"
# A calibration written outside the package of a deployment it ships calibrated: Hydra would find
# the shipped <name>_calibrated before a --config-dir's file of that name.
RECALIBRATED_SUFFIX = "_recalibrated"

DEFAULT_OUTPUT_DIR = Path("calibrated", "deployment")  # --config-dir calibrated, not the package


@dataclass(frozen=True)
class Measured:
    """What one resource needs: the most any of its labels' plans needs."""

    path: str
    need_bytes: int
    worst: str  # which label and shape needs it, e.g. decode: bs=64 q=1 kv=131072 graph
    method: str
    int_need_bytes: int | None = None  # None: not measured


@dataclass(frozen=True)
class OneBuffer:
    """What an engine that shares one float workspace among all its wrappers and graph sizes (vLLM,
    SGLang) must reserve: every plan carves it from offset 0, so the most any one plan needs."""

    need_bytes: int
    bytes: int  # what to reserve: the need plus the margin, in whole MB
    worst: str  # the label and shape that need it
    vllm_formula_bytes: int | None  # vLLM 0.33's own floor (None: it plans no FlashInfer for it)
    int_need_bytes: int | None = None

    def record(self) -> dict[str, Any]:
        return {
            k: v for k, v in asdict(self).items() if v is not None and k != "vllm_formula_bytes"
        }

    def advice(self) -> list[str]:
        """The engines' settings, for people."""
        lines = [
            f"One buffer for every plan and graph size (vLLM, SGLang): {self.bytes:,} bytes "
            f"(the need of {self.worst}, {self.need_bytes:,} bytes, in whole MB). Set:",
            f"  SGLANG_FLASHINFER_WORKSPACE_SIZE={self.bytes}",
            # SGLang's layers/attention/flashinfer_backend.py
            "  (SGLang 0.5.23 replaces this setting with 512 MiB for Qwen2, Qwen3, MiMo and "
            "Qwen3-VL models and with 2 GiB in deterministic mode, whatever it is set to)",
        ]
        if self.vllm_formula_bytes is not None:
            lines += [
                f"  VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE={self.bytes}",
                "  (vLLM 0.33 reserves the larger of this and max_num_batched_tokens x query heads "
                f"x head dim x 16 = {self.vllm_formula_bytes:,} bytes: the setting can raise its "
                "buffer, not lower it; the vLLM plugin, MSTAR_RESOURCES_VLLM=<this deployment>, "
                "gives vLLM these floors instead: docs/vllm.md)",
            ]
        if self.int_need_bytes is not None:
            lines.append(
                f"Int workspaces: a plan needs at most {self.int_need_bytes:,} bytes, and each "
                f"wrapper makes {INT.default_mb * MIB:,} (and as many pinned on the host); no "
                "setting of vLLM's or SGLang's changes that, and the vLLM plugin shares one per "
                "label among the decode wrappers of its graph sizes"
            )
        return lines


def declared_mbs(needs: Sequence[Measured], margin: float) -> list[tuple[int, int]]:
    """Each measured resource's ``declared_mb`` and ``int_declared_mb`` (no int need: 0)."""
    return [
        (
            declared_mb_for(need.need_bytes, margin),
            0 if need.int_need_bytes is None else declared_mb_for(need.int_need_bytes, margin),
        )
        for need in needs
    ]


@dataclass(frozen=True)
class LabelNeed:
    """One row of the calibration table."""

    resource: ResolvedResource
    label: str
    need: Need


def check_labels(records: Sequence[ResolvedResource], profile: CalibrationProfile) -> None:
    """Refuse, naming every problem, resources that cannot be calibrated as they run."""
    missing = [f"calibration.plans.{label} (for resources.{r.path})"
               for r in records for label in r.labels if label not in profile.plans]  # fmt: skip
    problems = []
    if missing:
        problems.append(
            f"the profile does not say how these labels are planned; add {', '.join(missing)} "
            f"with a kind ({', '.join(kind.value for kind in PlanKind)})"
        )
    graph_kinds = ", ".join(k.value for k in PlanKind if k in GRAPH_KINDS)
    for r in (r for r in records if r.cg_slots):
        slots = f"resources.{r.path}.cg_slots={list(r.cg_slots)}"
        for label in (label for label in r.labels if label in profile.plans):
            plan, key = profile.plans[label], f"calibration.plans.{label}"
            if plan.kind not in GRAPH_KINDS:
                problems.append(
                    f"{slots} puts {label} under CUDA graphs, but {key}.kind={plan.kind.value}: "
                    f"only {graph_kinds} plans are calibrated under graphs"
                )
            if plan.kind is PlanKind.paged_prefill and not profile.cuda_graph_prefill_tokens:
                problems.append(
                    f"{slots} puts the paged_prefill {label} under CUDA graphs, and "
                    "calibration.cuda_graph_prefill_tokens is empty; list the token counts the "
                    "engine captures prefill graphs for"
                )
            if plan.fixed_split:
                problems.append(
                    f"{key}.fixed_split_size={plan.fixed_split_size} under CUDA graphs "
                    f"(resources.{r.path} has cg_slots): FlashInfer cannot pad a fixed split to a "
                    f"graph; set {key}.disable_split_kv=true, as engines do under graphs"
                )
    owners: dict[str, dict[str, str]] = {}  # label -> owner -> the first resource of it
    for r in records:
        for label in r.labels:
            owners.setdefault(label, {}).setdefault(r.owner, r.path)
    problems += [
        f"calibration.plans.{label} would plan "
        f"{', '.join(f'resources.{p} (owner {o})' for o, p in by_owner.items())} alike; give "
        "their plans different labels"
        for label, by_owner in owners.items()
        if len(by_owner) > 1
    ]
    if problems:
        raise ResourceConfigError("cannot calibrate: " + "; ".join(problems))


def check_backends(profile: CalibrationProfile, device: torch.device) -> None:
    """Refuse a ``fa3`` plan on a GPU other than SM90 (Hopper), the only one it runs on."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    fa3 = [f"calibration.plans.{label}.backend=fa3" for label, plan in profile.plans.items()
           if plan.backend == "fa3"]  # fmt: skip
    if fa3 and (major, minor) != (9, 0):
        name = torch.cuda.get_device_name(device)
        raise ResourceConfigError(
            f"cannot calibrate on {device} ({name}, SM{major}{minor}): {', '.join(fa3)} needs "
            "an SM90 GPU; calibrate on the GPU the engine runs, or plan with fa2 or auto"
        )


def measure_all(
    records: Sequence[ResolvedResource],
    profile: CalibrationProfile,
    device: torch.device,
    show_progress: bool = True,
) -> list[LabelNeed]:
    """Plan every label's bounding shapes through FlashInfer; one row per (resource, label)."""
    from tqdm import tqdm

    from .measure import Planner, shapes_for

    check_labels(records, profile)  # before any kernel is built
    check_flashinfer(profile)
    check_backends(profile, device)
    planner = Planner(profile, device)
    work = [
        (record, label, shapes_for(profile.plans[label], profile, bool(record.cg_slots)))
        for record in records
        for label in record.labels
    ]
    rows = []
    total = sum(len(shapes) for *_, shapes in work)
    with tqdm(total=total, unit="plan", disable=not show_progress, leave=False) as bar:
        for record, label, shapes in work:
            bar.set_description(f"{record.path}/{label}")
            rows.append(LabelNeed(record, label, planner.need(profile.plans[label], shapes, bar)))
    return rows


def _hungriest(path: str, rows: Sequence[LabelNeed]) -> Measured:
    """What ``rows`` need of one floor: the most any of them needs (the first of those that tie)."""
    worst = max(rows, key=lambda row: row.need.bytes)
    ints = [row.need.int_bytes for row in rows if row.need.int_bytes is not None]
    where = f"{worst.label}: {worst.need.worst or '-'}"
    return Measured(path, worst.need.bytes, where, worst.need.method, max(ints, default=None))


def per_resource(rows: Sequence[LabelNeed]) -> list[Measured]:
    """Each resource's needs: the most any of its labels needs (they share one floor)."""
    by_path: dict[str, list[LabelNeed]] = {}
    for row in rows:
        by_path.setdefault(row.resource.path, []).append(row)
    return [_hungriest(path, its) for path, its in by_path.items()]


def vllm_formula(batched_tokens: int, heads: int, head_dim: int, per: int = 16) -> int:
    """vLLM's per-token floor of its FlashInfer buffer, in bytes; ``per``: its
    ``FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM`` (16 in vLLM 0.26 and 0.33; the vLLM plugin
    passes the running vLLM's own)."""
    return batched_tokens * heads * head_dim * per


def vllm_formula_bytes(profile: CalibrationProfile) -> int | None:
    """vLLM 0.33's per-token floor; None for MLA models, which it runs without FlashInfer."""
    if any(plan.kind is PlanKind.mla for plan in profile.plans.values()):
        return None
    model = profile.model
    return vllm_formula(profile.limits.max_num_batched_tokens, model.num_qo_heads, model.head_dim)


def one_buffer(
    rows: Sequence[LabelNeed], profile: CalibrationProfile, margin: float = DEFAULT_MARGIN
) -> OneBuffer:
    """What an engine that keeps one buffer for every wrapper and graph size must reserve."""
    most = _hungriest("", rows) if rows else Measured("", 0, "-", "")
    where = most.worst if most.need_bytes else "-"  # a need of nothing names no shape
    reserve = declared_mb_for(most.need_bytes, margin) * MIB
    return OneBuffer(
        most.need_bytes, reserve, where, vllm_formula_bytes(profile), most.int_need_bytes
    )


def table(
    rows: Sequence[LabelNeed], margin: float = DEFAULT_MARGIN, buffer: OneBuffer | None = None
) -> str:
    """The calibration table, the floors to declare and the one-buffer engines' settings."""
    head = ("resource", "label", "worst shape", "need bytes", "declared today", "waste(+)/short(-)",
            "int need bytes", "int declared today")  # fmt: skip
    body = [
        (
            row.resource.path,
            row.label,
            str(row.need.worst or "-"),
            f"{row.need.bytes:,}",
            f"{row.resource.floor.bytes:,} ({row.resource.floor.source})",
            f"{row.resource.floor.bytes - row.need.bytes:+,}",
            "-" if row.need.int_bytes is None else f"{row.need.int_bytes:,}",
            f"{row.resource.int_floor.bytes:,} ({row.resource.int_floor.source})",
        )
        for row in rows
    ]
    lines = [format_table([head, None, *body]), ""]
    lines += [
        f"{row.resource.path}/{row.label}: FlashInfer refused {len(row.need.refused)} of its "
        f"shapes (an engine cannot plan them either), e.g. {row.need.refused[0]}"
        for row in rows
        if row.need.refused
    ]
    for m in per_resource(rows):
        int_need = ("int_declared_mb", "int need", m.int_need_bytes)
        for key, what, need in (("declared_mb", "need", m.need_bytes), int_need):
            if need is not None:
                mb = declared_mb_for(need, margin)
                lines.append(
                    f"resources.{m.path}.{key} = {mb}  ({what} {need:,} bytes + {margin:.0%})"
                )
    if buffer is not None:
        lines += ["", *buffer.advice()]
    return "\n".join(lines)


def profile_settings(cfg: Any, overrides: Sequence[str]) -> dict[str, Any] | None:
    """The ``calibration`` settings the command line's ``overrides`` gave, as ``cfg`` holds them."""
    settings = OmegaConf.create({})
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+")
        if override.startswith("~") or key.split(".")[0] != PROFILE_KEY:
            continue
        value = OmegaConf.select(cfg, key)
        if isinstance(value, DictConfig | ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
        OmegaConf.update(settings, key, value, merge=True)
    found = OmegaConf.to_container(settings, resolve=True, enum_to_str=True)
    return cast(dict[str, Any], found).get(PROFILE_KEY) or None


def _is_shipped(folder: Path) -> bool:
    return folder.absolute() == shipped_deployments().absolute()


def how_to_compose(path: Path) -> str:
    """How a config composes the calibrated deployment written at ``path``."""
    name, folder = path.stem, path.parent
    if folder.name.startswith(FLASHINFER_FOLDER):  # one of several versions' calibrations
        folder = folder.parent
    if folder.name != "deployment":
        return f"move it into the deployment/ folder of a config dir, then use deployment={name}"
    if _is_shipped(folder):
        return f"use it with deployment={name}"
    return (
        f"use it with --config-dir {folder.parent} deployment={name} (or list "
        f"file://{folder.parent.absolute()} under hydra.searchpath)"
    )


def users_deployment_folder(name: str, config_dirs: Sequence[str]) -> Path | None:
    """The ``deployment/`` folder of the first of ``config_dirs`` that holds deployment ``name``."""
    folders = (Path(config_dir) / "deployment" for config_dir in config_dirs)
    return next((folder for folder in folders if (folder / f"{name}.yaml").is_file()), None)


def base_deployment(name: str) -> str:
    """Calibrating ``x_calibrated`` (or ``x_recalibrated``) again recalibrates ``x``."""
    return name.rpartition("/")[2].removesuffix(CALIBRATED_SUFFIX).removesuffix(RECALIBRATED_SUFFIX)


def calibrated_name(deployment: str, output_dir: Path) -> str:
    """``<deployment>_calibrated``, or ``_recalibrated`` where the package ships the former."""
    name = f"{deployment}{CALIBRATED_SUFFIX}"
    if (shipped_deployments() / f"{name}.yaml").is_file() and not _is_shipped(output_dir):
        return f"{deployment}{RECALIBRATED_SUFFIX}"
    return name


def recorded_flashinfer(path: Path) -> str | None:
    """The FlashInfer the calibration at ``path`` was made with; None where there is none."""
    try:
        record = yaml.safe_load(path.read_text(encoding="utf-8"))[RECORD_KEY]
        return str(record["flashinfer"])
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, KeyError):
        return None


def write_override(
    deployment: str,
    measured: Sequence[Measured],
    provenance: Mapping[str, Any],
    output_dir: Path,
    margin: float = DEFAULT_MARGIN,
    buffer: OneBuffer | None = None,
    profile: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``deployment``'s calibration (with the ``calibration`` settings ``profile``) into
    ``output_dir``, or its ``flashinfer-<version>/`` where another FlashInfer's is there."""
    name = calibrated_name(deployment, output_dir)
    path, version = output_dir / f"{name}.yaml", provenance.get("flashinfer")
    versioned = output_dir / f"{FLASHINFER_FOLDER}{version}" / path.name
    if version and (versioned.is_file() or recorded_flashinfer(path) not in (None, version)):
        path = versioned
    path.parent.mkdir(parents=True, exist_ok=True)
    base = deployment if path.parent == output_dir else f"/deployment/{deployment}"  # by its path
    in_config_dir = output_dir.name == "deployment" and not _is_shipped(output_dir)
    folder = f"--config-dir {output_dir.parent} " if in_config_dir else ""
    needs = [{k: v for k, v in asdict(m).items() if v is not None} for m in measured]
    resources: dict[str, Any] = {}  # the floors, nested by each resource's path
    for m, mbs in zip(measured, declared_mbs(measured, margin), strict=True):
        node = resources
        for part in m.path.split("."):
            node = node.setdefault(part, {})
        node["declared_mb"], node["int_declared_mb"] = mbs
    body = {
        "defaults": [base, "_self_"],
        "resources": resources,
        **({} if profile is None else {PROFILE_KEY: dict(profile)}),
        RECORD_KEY: {
            "margin": margin,
            **provenance,
            "needs": needs,
            **({"one_buffer": buffer.record()} if buffer is not None else {}),
        },
    }
    header = [
        "# @package _global_",
        f"# Calibrated {deployment}: written by",
        f"#   mstar-resources-calibrate {folder}deployment={deployment}",
        *(f"# {key}: {value}" for key, value in provenance.items()
          if isinstance(value, str | int | float | bool)),
        f"# declared_mb = need{f' x {1 + margin:g}' if margin else ''}, rounded up to a whole MB "
        "(int_declared_mb: the int need, the same way). Use it with",
        f"#   mstar-resources {folder}deployment={path.stem}"
        + (f" (with FlashInfer {version} installed)" if base != deployment else ""),
    ]  # fmt: skip
    write_whole(path, "\n".join(header) + "\n" + OmegaConf.to_yaml(OmegaConf.create(body)))
    return path
