"""Which FlashInfer versions can plan what a profile asks for, checked before any GPU work.
Calibration runs on FlashInfer 0.6.6 and newer (0.6.x measured by growth: its wrappers have no
``workspace_size()``); 0.7.2 brought ``MLAPlanMetadata`` and ``q_len_per_req``. FlashInfer's
plain decode kernels are compiled for a fixed set of GQA groups (``DISPATCH_GQA_GROUP_SIZE``: 1,
2, 3, 4 and 8 in 0.6.6; 0.7.4 adds 6 and 16), read from the installed headers."""

from __future__ import annotations

import importlib.metadata

from ..attn._flashinfer import plain_decode_groups
from ..errors import ResourceConfigError
from ..units import release
from .profile import CalibrationProfile, PlanKind

OLDEST = (0, 6, 6)
MLA_SINCE = (0, 7, 2)
MULTI_TOKEN_DECODE_SINCE = (0, 7, 2)


def installed_flashinfer() -> str | None:
    """The installed ``flashinfer-python``'s version, or None."""
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(numbers: tuple[int, ...]) -> str:
    return ".".join(map(str, numbers))


def version_problems(
    profile: CalibrationProfile, version: str, *, plain_groups: frozenset[int] | None = None
) -> list[str]:
    """What FlashInfer ``version`` cannot plan of ``profile``, one line a feature;
    ``plain_groups``: the GQA group sizes its plain decode kernels take (unchecked if None)."""
    have = release(version)
    problems = []
    if have < OLDEST:
        problems.append(
            f"FlashInfer {version} is older than {_release(OLDEST)}, the oldest supported"
        )
    mla = [label for label, plan in profile.plans.items() if plan.kind is PlanKind.mla]
    if mla and have < MLA_SINCE:
        problems.append(
            f"mla plans ({', '.join(f'calibration.plans.{x}' for x in mla)}) need FlashInfer "
            f"{_release(MLA_SINCE)} or newer (installed: {version})"
        )
    multi = [
        f"calibration.plans.{label}.q_len_per_req={plan.q_len_per_req}"
        for label, plan in profile.plans.items()
        if plan.q_len_per_req > 1
    ]
    if multi and have < MULTI_TOKEN_DECODE_SINCE:
        problems.append(
            f"{', '.join(multi)} needs FlashInfer {_release(MULTI_TOKEN_DECODE_SINCE)} or newer "
            f"(installed: {version})"
        )
    model = profile.model
    group = model.num_qo_heads // model.num_kv_heads
    plain = [
        label
        for label, plan in profile.plans.items()
        if plan.kind is PlanKind.decode and not plan.tensor_cores
    ]
    if plain and plain_groups is not None and group not in plain_groups:
        keys = " and ".join(f"calibration.plans.{label}.tensor_cores=true" for label in plain)
        problems.append(
            f"plain decode ({', '.join(f'calibration.plans.{x}' for x in plain)}) with "
            f"{model.num_qo_heads} query heads on {model.num_kv_heads} KV heads, a group of "
            f"{group}: FlashInfer {version}'s plain decode kernels take groups of "
            f"{', '.join(map(str, sorted(plain_groups)))}; set {keys} (as vLLM and SGLang "
            "plan such models), or install a FlashInfer whose kernels take it"
        )
    return problems


def check_flashinfer(profile: CalibrationProfile) -> None:
    """Refuse, naming each feature and the version it needs, a profile that the installed
    FlashInfer cannot plan."""
    version = installed_flashinfer()
    if version is None:
        raise ResourceConfigError(
            "FlashInfer is not installed: pip install 'mstar-resources[calibrate]'"
        )
    problems = version_problems(profile, version, plain_groups=plain_decode_groups())
    if problems:
        raise ResourceConfigError(*problems, where=f"what FlashInfer {version} can plan")
