"""Which FlashInfer versions can plan what a profile asks for. Torch-free: checked before any GPU
work, naming the feature, the version it needs and the version installed.

Calibration and the replay run on FlashInfer 0.6.6 and newer: every kind but ``mla`` plans there
(measured by growth, as 0.6.x wrappers have no ``workspace_size()`` query). FlashInfer 0.7.2 brought
the MLA planning API this project uses (``MLAPlanMetadata``) and ``q_len_per_req`` on the decode
wrapper's ``plan()``.
"""

from __future__ import annotations

import importlib.metadata
import re

from ..errors import ResourceConfigError
from .profile import CalibrationProfile, PlanKind

__all__ = ["OLDEST", "check_flashinfer", "installed_flashinfer", "version_problems"]

OLDEST = (0, 6, 6)
"""The oldest FlashInfer calibration and the replay are checked on."""

MLA_SINCE = (0, 7, 2)
"""FlashInfer's MLA wrapper takes an ``MLAPlanMetadata`` from this version on."""

MULTI_TOKEN_DECODE_SINCE = (0, 7, 2)
"""The decode wrapper's ``plan()`` takes ``q_len_per_req`` from this version on."""


def installed_flashinfer() -> str | None:
    """The installed ``flashinfer-python``'s version, or None."""
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, ...]:
    """The release numbers at the start of ``version`` (``0.7.2.post1`` -> ``(0, 7, 2)``)."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def _dotted(numbers: tuple[int, ...]) -> str:
    return ".".join(map(str, numbers))


def version_problems(profile: CalibrationProfile, version: str) -> list[str]:
    """What FlashInfer ``version`` cannot plan of ``profile``, one line a feature."""
    have = release(version)
    problems = []
    if have < OLDEST:
        oldest = _dotted(OLDEST)
        problems.append(f"FlashInfer {version} is older than {oldest}, the oldest supported")
    mla = [label for label, plan in profile.plans.items() if plan.kind is PlanKind.mla]
    if mla and have < MLA_SINCE:
        problems.append(
            f"mla plans ({', '.join(f'calibration.plans.{x}' for x in mla)}) need FlashInfer "
            f"{_dotted(MLA_SINCE)} or newer (installed: {version})"
        )
    multi = [
        f"calibration.plans.{label}.q_len_per_req={plan.q_len_per_req}"
        for label, plan in profile.plans.items()
        if plan.q_len_per_req > 1
    ]
    if multi and have < MULTI_TOKEN_DECODE_SINCE:
        problems.append(
            f"{', '.join(multi)} needs FlashInfer {_dotted(MULTI_TOKEN_DECODE_SINCE)} or newer "
            f"(installed: {version})"
        )
    return problems


def check_flashinfer(profile: CalibrationProfile, version: str | None = None) -> None:
    """Refuse, naming each feature and the version it needs, a profile that the installed
    FlashInfer (or ``version``) cannot plan."""
    version = version if version is not None else installed_flashinfer()
    if version is None:
        raise ResourceConfigError(
            "FlashInfer is not installed: pip install 'mstar-resources[calibrate]'"
        )
    problems = version_problems(profile, version)
    if problems:
        raise ResourceConfigError(*problems, where=f"what FlashInfer {version} can plan")
