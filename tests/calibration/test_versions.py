"""Which FlashInfer versions calibration takes, and what they refuse on older ones:
checked before any GPU work, naming the setting, the version it needs and the one installed."""

from __future__ import annotations

import pytest

from mstar_resources import ResourceConfigError
from mstar_resources.attn._flashinfer import plain_decode_groups
from mstar_resources.calibration.profile import (
    check_flashinfer,
    load_profile,
    release,
    version_problems,
)

from ..flashinfer_sources import flashinfer_package
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
    split = {"fixed_split_size": 2048, "disable_split_kv": True}
    node = dense()
    for plan in node["plans"].values():
        plan.update(split)
    node["plans"]["decode"]["tensor_cores"] = True
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
def test_what_needs_0_7_is_refused_on_0_6_naming_the_setting(monkeypatch, node, named):
    monkeypatch.setattr("mstar_resources.calibration.profile.installed_flashinfer", lambda: "0.6.6")
    with pytest.raises(ResourceConfigError) as raised:
        check_flashinfer(load_profile(node))
    assert raised.value.problems == (named,)


def test_a_flashinfer_older_than_the_oldest_checked_is_named():
    (problem,) = version_problems(load_profile(dense()), "0.5.3")
    assert problem == "FlashInfer 0.5.3 is older than 0.6.6, the oldest supported"


def test_no_flashinfer_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr("mstar_resources.calibration.profile.installed_flashinfer", lambda: None)
    with pytest.raises(ResourceConfigError, match=r"pip install 'mstar-resources\[calibrate\]'"):
        check_flashinfer(load_profile(GOOD))


def heads(qo: int, kv: int, tensor_cores: bool = False) -> dict:
    """The dense profile with ``qo`` query and ``kv`` KV heads, its decode plain or not."""
    node = dense()
    node["model"] = {**node["model"], "num_qo_heads": qo, "num_kv_heads": kv}
    node["plans"]["decode"]["tensor_cores"] = tensor_cores
    return node


GROUPS_0_6_6 = frozenset({1, 2, 3, 4, 8})
"""The plain decode kernels' GQA group sizes in FlashInfer 0.6.6's utils.cuh, as read there."""


def test_plain_decode_of_a_group_the_kernels_lack_is_refused_naming_the_fix():
    problems = version_problems(load_profile(heads(32, 2)), "0.6.6", plain_groups=GROUPS_0_6_6)
    assert problems == [
        "plain decode (calibration.plans.decode) with 32 query heads on 2 KV heads, a group of "
        "16: FlashInfer 0.6.6's plain decode kernels take groups of 1, 2, 3, 4, 8; set "
        "calibration.plans.decode.tensor_cores=true (as vLLM and SGLang plan such models), or "
        "install a FlashInfer whose kernels take it"
    ]


@pytest.mark.parametrize(
    "node",
    [
        pytest.param(heads(32, 8), id="group-4"),
        pytest.param(heads(32, 2, tensor_cores=True), id="tensor-cores"),
    ],
)
def test_plain_decode_of_a_compiled_group_or_tensor_core_decode_passes(node):
    assert version_problems(load_profile(node), "0.6.6", plain_groups=GROUPS_0_6_6) == []


DISPATCH = """\
#define DISPATCH_GQA_GROUP_SIZE(group_size, GROUP_SIZE, ...) \\
  if (group_size == 1) {                                     \\
    constexpr size_t GROUP_SIZE = 1;                         \\
  } else if (group_size == 8) {                              \\
    constexpr size_t GROUP_SIZE = 8;                         \\
  } else {                                                   \\
    FLASHINFER_ERROR("Unsupported group_size");              \\
  }

#define DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, ...) \\
  if (head_dim == 64) {                           \\
  }
"""


def test_the_group_sizes_are_read_from_the_dispatch_macro_alone(tmp_path):
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "utils.cuh").write_text(DISPATCH)
    assert plain_decode_groups(tmp_path) == {1, 8}
    (tmp_path / "flashinfer" / "utils.cuh").write_text("// no dispatch here\n")
    assert plain_decode_groups(tmp_path) is None
    assert plain_decode_groups(tmp_path / "missing") is None


@pytest.mark.flashinfer
@pytest.mark.skipif(
    flashinfer_package() is None,
    reason="needs FlashInfer's headers: installed, or its wheel in .venv/wheels",
)
def test_flashinfers_headers_give_its_group_sizes():
    package = flashinfer_package()
    assert package is not None
    groups = plain_decode_groups(package / "data" / "include")
    assert groups is not None and {1, 2, 4, 8} <= groups
