"""Which plan labels the replay plans, and with which FlashInfer wrappers. Torch-free: the replay
checks them before it touches a GPU."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..calibration.profile import CalibrationProfile, PlanKind
from ..errors import ResourceConfigError
from ..resolver import ResolvedResource

REPLAYED_KINDS = {
    (PlanKind.paged_prefill, PlanKind.decode): "grouped-query attention",
    (PlanKind.mla, PlanKind.mla): "MLA",
}
"""The (prefill, decode) plan kinds the replay's model runs, and the attention each stands for."""


Role = Literal["prefill", "decode"]
"""A wrapper's part in the replay's engine: its prefill wrapper, or its decode wrappers (every
graph batch size). :class:`Roles` names the plan label each plays."""


@dataclass(frozen=True)
class Roles:
    """The plan labels the replay plans: ``prefill`` eagerly, ``decode`` in CUDA-graph slot 0
    (or eagerly without graphs)."""

    prefill: str
    decode: str


def roles_of(records: Sequence[ResolvedResource], profile: CalibrationProfile) -> Roles:
    """The tree's one eager label (prefill) and one graph label (decode), checked against the
    kinds their plans have."""
    roles = _labels(records)
    missing = [label for label in (roles.prefill, roles.decode) if label not in profile.plans]
    if missing:
        raise ResourceConfigError(
            f"the profile does not say how {', '.join(missing)} is planned; add "
            + ", ".join(f"calibration.plans.{label}" for label in missing)
        )
    _check_kinds(roles, profile)
    q_len = profile.plans[roles.decode].q_len_per_req
    if q_len != 1:
        raise ResourceConfigError(
            f"calibration.plans.{roles.decode}.q_len_per_req={q_len}: the replay's model decodes "
            "one token a request a step; replay with q_len_per_req=1"
        )
    return roles


def _labels(records: Sequence[ResolvedResource]) -> Roles:
    eager = [label for r in records if not r.cg_slots for label in r.labels]
    graphed = [label for r in records if r.cg_slots for label in r.labels]
    if len(eager) != 1 or len(graphed) != 1:
        raise ResourceConfigError(
            f"the replay plans one label eagerly (prefill) and one under CUDA graphs (decode), "
            f"and the resources serve {eager or 'none'} eagerly and {graphed or 'none'} in "
            "cg slots; give it a tree with one of each"
        )
    return Roles(prefill=eager[0], decode=graphed[0])


def _check_kinds(roles: Roles, profile: CalibrationProfile) -> None:
    kinds = (profile.plans[roles.prefill].kind, profile.plans[roles.decode].kind)
    if kinds in REPLAYED_KINDS:
        return
    runs = "; ".join(
        f"{prefill.value} then {decode.value} ({what})"
        for (prefill, decode), what in REPLAYED_KINDS.items()
    )
    raise ResourceConfigError(
        f"calibration.plans.{roles.prefill}.kind={kinds[0].value} and "
        f"calibration.plans.{roles.decode}.kind={kinds[1].value}: the replay's model runs {runs}"
    )


def is_mla(profile: CalibrationProfile) -> bool:
    """Whether the deployment's attention is MLA (its plans are MLA's)."""
    return any(plan.kind is PlanKind.mla for plan in profile.plans.values())
