"""Whether a calibrated deployment was measured where it runs now.

A calibrated floor holds for the GPU (its name and SM count: FlashInfer's scheduler sizes its
split-KV work by the SMs), the FlashInfer and torch versions, and the profile it was measured
with. ``mstar-resources-calibrate`` records them under the root key ``calibrated``; when pools are
built on a GPU from a deployment whose record differs from what runs, :func:`check_calibration`
logs one WARNING naming what was recorded, what runs, and the command that recalibrates.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, cast

from omegaconf import DictConfig, OmegaConf

from .override import RECORD
from .profile import ROOT, CalibrationProfile, load_profile

if TYPE_CHECKING:
    from torch import device as Device  # a field below is named torch

__all__ = ["RunningOn", "check_calibration", "describe_profile", "stale_calibration"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningOn:
    """What a calibration depends on, as recorded or as running."""

    gpu: str
    """The GPU's name, e.g. ``NVIDIA H200``."""
    sm_count: int
    flashinfer: str
    """FlashInfer's version (``flashinfer-python``'s), or ``none`` where it is not installed."""
    torch: str
    """torch's version, e.g. ``2.11.0+cu130``."""
    profile: str
    """The calibration profile, as :func:`describe_profile` writes it."""

    @classmethod
    def here(cls, device: Device, profile: CalibrationProfile) -> RunningOn:
        """This process on ``device``, with ``profile`` (imports torch, not FlashInfer)."""
        import torch

        gpu = torch.cuda.get_device_properties(device)
        try:
            flashinfer = importlib.metadata.version("flashinfer-python")
        except importlib.metadata.PackageNotFoundError:
            flashinfer = "none"
        return cls(
            gpu.name, gpu.multi_processor_count, flashinfer, str(torch.__version__),
            describe_profile(profile),
        )  # fmt: skip

    def __str__(self) -> str:
        return f"{self.gpu} ({self.sm_count} SMs), FlashInfer {self.flashinfer}, torch {self.torch}"


def describe_profile(profile: CalibrationProfile) -> str:
    """The profile in one line, as a calibrated deployment records it."""
    model, limits = profile.model, profile.limits
    return (
        f"{model.num_qo_heads} q / {model.num_kv_heads} kv heads, head dim {model.head_dim}, "
        f"page {model.page_size}, {model.q_dtype}/{model.kv_dtype}; "
        f"max {limits.max_num_seqs} seqs, {limits.max_num_batched_tokens} batched tokens, "
        f"{limits.max_model_len} context; graph batch sizes {profile.cuda_graph_batch_sizes}"
    )


def stale_calibration(record: Mapping[str, Any], running: RunningOn) -> str | None:
    """Why the calibration ``record`` (the ``calibrated`` node) may not hold on ``running``, in
    one paragraph; None when it was measured as it runs."""
    recorded = {name: record.get(name) for name in asdict(running)}
    differs = [name for name, value in asdict(running).items() if recorded[name] != value]
    if not differs:
        return None
    was = RunningOn(**{name: recorded[name] for name in asdict(running)})  # type: ignore[arg-type]
    profile = " and a different profile" if "profile" in differs else ""
    deployment = record.get("deployment", "<deployment>")
    return (
        f"deployment {deployment}_calibrated was calibrated on {was}, and this is {running}"
        f"{profile} ({', '.join(differs)} differ); its floors may not hold here: recalibrate "
        f"with `mstar-resources-calibrate deployment={deployment}` on this machine"
    )


def check_calibration(cfg: DictConfig, device: Device) -> str | None:
    """Log one WARNING, and return it, when the composed config ``cfg`` (the root, holding
    ``calibrated`` and ``calibration``) was calibrated elsewhere than on ``device``, with other
    versions or another profile; None when it holds, or when ``cfg`` is not calibrated."""
    record = cfg.get(RECORD)
    if record is None or cfg.get(ROOT) is None:
        return None
    running = RunningOn.here(device, load_profile(cfg[ROOT]))
    plain = OmegaConf.to_container(record) if isinstance(record, DictConfig) else record
    warning = stale_calibration(cast(Mapping[str, Any], plain), running)
    if warning is not None:
        logger.warning("%s", warning)
    return warning
