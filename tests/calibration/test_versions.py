"""Which FlashInfer versions calibration and the replay take, and what they refuse on older ones:
checked before any GPU work, naming the setting, the version it needs and the one installed."""

from __future__ import annotations

import pytest

from mstar_resources import ResourceConfigError
from mstar_resources.calibration.profile import load_profile
from mstar_resources.calibration.versions import check_flashinfer, release, version_problems

from ..test_profile import GOOD, dense

TENSOR_CORES = dense()
TENSOR_CORES["plans"]["decode"] = {"kind": "decode", "tensor_cores": True, "q_len_per_req": 3}


@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.7.2.post1", (0, 7, 2)), ("0.6.6", (0, 6, 6)), ("0.8.0rc1", (0, 8, 0)), ("dev", ())],
)
def test_a_release_is_the_numbers_a_version_starts_with(version, expected):
    assert release(version) == expected


@pytest.mark.parametrize("version", ["0.7.2", "0.7.2.post1", "0.7.4"])
def test_the_versions_engines_pin_plan_everything(version):
    assert version_problems(load_profile(GOOD), version) == []
    assert version_problems(load_profile(TENSOR_CORES), version) == []


def test_flashinfer_0_6_plans_every_dense_kind_with_tensor_cores_and_splits():
    node = dense(engine="vllm", deterministic=True)
    assert version_problems(load_profile(node), "0.6.6") == []


@pytest.mark.parametrize(
    ("node", "named"),
    [
        pytest.param(GOOD, "mla plans (calibration.plans.mla_decode) need FlashInfer 0.7.2 or "
                     "newer (installed: 0.6.6)", id="mla"),
        pytest.param(TENSOR_CORES, "calibration.plans.decode.q_len_per_req=3 needs FlashInfer "
                     "0.7.2 or newer (installed: 0.6.6)", id="several-query-tokens"),
    ],
)  # fmt: skip
def test_what_needs_0_7_is_refused_on_0_6_naming_the_setting(node, named):
    with pytest.raises(ResourceConfigError) as raised:
        check_flashinfer(load_profile(node), "0.6.6")
    assert raised.value.problems == (named,)


def test_a_flashinfer_older_than_the_oldest_checked_is_named():
    (problem,) = version_problems(load_profile(dense()), "0.5.3")
    assert problem == "FlashInfer 0.5.3 is older than 0.6.6, the oldest supported"


def test_no_flashinfer_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr("mstar_resources.calibration.versions.installed_flashinfer", lambda: None)
    with pytest.raises(ResourceConfigError, match=r"pip install 'mstar-resources\[calibrate\]'"):
        check_flashinfer(load_profile(GOOD))
