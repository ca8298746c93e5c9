"""Which labels the replay plans, and with which wrappers: decided from the tree and the profile,
before any GPU work."""

from __future__ import annotations

import pytest

from mstar_resources import ResourceConfigError, resolve
from mstar_resources.calibration.profile import load_profile
from mstar_resources.replay.roles import Roles, is_mla, roles_of

from ..conftest import compose_shipped


def roles(*overrides: str) -> Roles:
    cfg = compose_shipped(list(overrides))
    return roles_of(resolve(cfg.resources, {}), load_profile(cfg.calibration))


@pytest.mark.parametrize(
    ("deployment", "expected", "mla"),
    [
        ("llama3-8b-h200_calibrated", Roles("prefill", "decode"), False),
        ("llama3-70b-tp8-h200_calibrated", Roles("prefill", "decode"), False),
        ("deepseek-v3-tp8-h200_calibrated", Roles("mla_prefill", "mla_decode"), True),
    ],
)
def test_every_shipped_deployment_replays(deployment, expected, mla):
    assert roles(f"deployment={deployment}") == expected
    cfg = compose_shipped([f"deployment={deployment}"])
    assert is_mla(load_profile(cfg.calibration)) is mla


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(["resources.attn.prefill.cg_slots=[0]"],
                     r"one label eagerly \(prefill\) and one under CUDA graphs \(decode\), and "
                     r"the resources serve none eagerly", id="no-eager-label"),
        pytest.param(["resources.attn.decode.labels=[decode,prefill]"],
                     r"serve \['prefill'\] eagerly and \['decode', 'prefill'\] in cg slots",
                     id="two-graph-labels"),
        pytest.param(["calibration.plans.decode.kind=paged_prefill"],
                     r"calibration\.plans\.decode\.kind=paged_prefill: the replay's model runs "
                     r"paged_prefill then decode \(grouped-query attention\); mla then mla \(MLA\)",
                     id="unreplayed-kinds"),
    ],
)  # fmt: skip
def test_what_the_replay_cannot_plan_is_refused_naming_it(overrides, message):
    with pytest.raises(ResourceConfigError, match=message):
        roles("deployment=llama3-8b-h200_calibrated", *overrides)
