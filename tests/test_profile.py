"""The calibration profile: its schema, defaults and bad inputs."""

from __future__ import annotations

import dataclasses

import pytest

from mstar_resources import ResourceConfigError
from mstar_resources.calibration.measure import Shape, is_bounding, shapes_for
from mstar_resources.calibration.profile import PlanKind, PlanProfile, load_profile

GOOD = {
    "model": {"num_qo_heads": 32, "num_kv_heads": 8, "head_dim_ckv": 512, "head_dim_kpe": 64},
    "limits": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 131072},
    "cuda_graph_batch_sizes": [1, 8, 64],
    "plans": {
        "decode": {"kind": "decode"},
        "prefill": {"kind": "paged_prefill"},
        "prompt": {"kind": "ragged_prefill"},
        "mla_decode": {"kind": "mla", "backend": "auto"},
        "mixed": {"kind": "pod"},
    },
}


def with_(path: str, value: object) -> dict:
    """GOOD with one value replaced (``a.b=value``)."""
    import copy

    node = copy.deepcopy(GOOD)
    *parents, leaf = path.split(".")
    target = node
    for part in parents:
        target = target[part]
    target[leaf] = value
    return node


def test_good_profile_loads_with_defaults():
    profile = load_profile(GOOD)
    assert (profile.model.head_dim, profile.model.page_size) == (128, 16)
    assert (profile.model.q_dtype, profile.model.kv_dtype) == ("bfloat16", "bfloat16")
    assert profile.plans["decode"].kind is PlanKind.decode
    assert profile.plans["prefill"].backend == "fa2"


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        ("model.num_kv_heads", 0, r"calibration\.model\.num_kv_heads=0 must be a positive"),
        ("model.num_kv_heads", 5, r"num_kv_heads=5 does not divide .*num_qo_heads=32"),
        ("model.q_dtype", "fp4", r"calibration\.model\.q_dtype='fp4' is not one of"),
        ("limits.max_model_len", -1, r"calibration\.limits\.max_model_len=-1 must be a positive"),
        ("cuda_graph_batch_sizes", [1, 1], r"cuda_graph_batch_sizes=\[1, 1\] must be distinct"),
        ("cuda_graph_batch_sizes", [512], r"has 512, more than calibration\.limits\.max_num_seqs"),
        ("plans", {}, r"calibration\.plans is empty"),
        (
            "plans.prefill.backend",
            "trtllm-gen",
            r"calibration\.plans\.prefill\.backend="
            r"'trtllm-gen' cannot be calibrated for kind paged_prefill; use one of fa2, fa3, auto",
        ),
        ("plans.mixed.backend", "fa3", r"plans\.mixed\.backend='fa3' .* kind pod; use one of fa2$"),
        (
            "model.head_dim_ckv",
            None,
            r"calibration\.model\.head_dim_ckv=None must be a positive "
            r"whole number for the mla plans \(mla_decode\)",
        ),
    ],
)
def test_bad_profile_names_the_key_and_value(path, value, match):
    with pytest.raises(ResourceConfigError, match=match):
        load_profile(with_(path, value))


# Refused by the schema while the profile is built. The problem starts with the full key and, where
# a value was refused, the value; the reason after it is OmegaConf's own, and not pinned here.
@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        pytest.param("model.num_qo_heads", "many",
                     "calibration.model.num_qo_heads='many' is not valid: ", id="wrong-type"),
        pytest.param("plans.prefill.kind", "pod_batch",
                     "calibration.plans.prefill.kind='pod_batch' is not valid: ", id="not-a-kind"),
        pytest.param("cuda_graph_batch_sizes", [1, "a"],
                     "calibration.cuda_graph_batch_sizes[1]='a' is not valid: ", id="list-item"),
        pytest.param("model.typo", 1, "calibration.model.typo=1 is not a setting; "
                     "calibration.model takes num_qo_heads, ", id="unknown-key"),
        pytest.param("modle", {}, "calibration.modle={} is not a setting (did you mean "
                     "calibration.model?); calibration takes model, ", id="misspelt-key"),
        pytest.param("plans.prefill.cuda_graph", True,
                     "calibration.plans.prefill.cuda_graph=True is not a setting; ",
                     id="key-of-another-schema"),
    ],
)  # fmt: skip
def test_a_value_the_schema_refuses_is_one_problem_naming_its_key(path, value, named):
    with pytest.raises(ResourceConfigError) as raised:
        load_profile(with_(path, value))
    (problem,) = raised.value.problems
    assert problem.startswith(named), problem
    assert raised.value.where == "the calibration profile"


def test_mla_dimensions_are_needed_only_by_mla_plans():
    plain = with_("plans", {"decode": {"kind": "decode"}})
    plain["model"] = {"num_qo_heads": 32, "num_kv_heads": 8}
    assert load_profile(plain).model.head_dim_ckv is None


def test_every_problem_is_reported_at_once():
    bad = with_("model.num_kv_heads", 0)
    bad["limits"]["max_num_seqs"] = 0
    with pytest.raises(ResourceConfigError) as raised:
        load_profile(bad)
    assert "num_kv_heads=0" in str(raised.value) and "max_num_seqs=0" in str(raised.value)


def test_problems_come_in_the_order_of_the_profile_s_fields():
    # One problem from each check, the MLA dimensions (which depend on the plans) last.
    bad = with_("model.q_dtype", "fp4")
    bad["model"]["head_dim_kpe"] = 0
    bad["limits"]["max_model_len"] = 0
    bad["cuda_graph_batch_sizes"] = [0]
    bad["plans"]["mixed"]["backend"] = "fa3"
    with pytest.raises(ResourceConfigError) as raised:
        load_profile(bad)
    assert [problem.split("=")[0] for problem in raised.value.problems] == [
        "calibration.model.q_dtype",
        "calibration.limits.max_model_len",
        "calibration.cuda_graph_batch_sizes",
        "calibration.plans.mixed.backend",
        "calibration.model.head_dim_kpe",
    ]
    assert raised.value.where == "the calibration profile"


def test_missing_limits_names_the_key_and_what_it_takes():
    bad = {k: v for k, v in GOOD.items() if k != "limits"}
    with pytest.raises(ResourceConfigError) as raised:
        load_profile(bad)
    (problem,) = raised.value.problems
    assert problem.startswith("calibration.limits is not set; set it to a mapping of "), problem
    assert "max_num_seqs, max_num_batched_tokens, max_model_len" in problem


def test_a_profile_written_from_scratch_is_told_every_value_it_lacks_at_once():
    bad = {"model": {"num_qo_heads": 8}, "limits": {"max_num_seqs": 4}, "plans": GOOD["plans"]}
    with pytest.raises(ResourceConfigError) as raised:
        load_profile(bad)
    assert sorted(problem.split(" ")[0] for problem in raised.value.problems) == [
        "calibration.limits.max_model_len",
        "calibration.limits.max_num_batched_tokens",
        "calibration.model.num_kv_heads",
    ]
    assert all("is not set; set it to a whole number" in p for p in raised.value.problems)


# --- shapes --------------------------------------------------------------------------------------


def test_graph_decode_plans_once_per_graph_batch_size_at_the_longest_context():
    profile = load_profile(GOOD)
    assert shapes_for(profile.plans["decode"], profile, cuda_graph=True) == [
        Shape(1, 1, 131072, cuda_graph=True),
        Shape(8, 1, 131072, cuda_graph=True),
        Shape(64, 1, 131072, cuda_graph=True),
    ]


def test_eager_decode_covers_batch_sizes_and_short_and_long_contexts_and_its_bound():
    profile = load_profile(GOOD)
    bounding, *eager = shapes_for(profile.plans["decode"], profile, cuda_graph=False)
    # A graph plan is padded to the most any decode plan splits to: it bounds the eager ones.
    assert bounding == Shape(1, 1, 131072, cuda_graph=True)
    assert {s.batch for s in eager} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert {s.kv_len for s in eager} == {1024, 131072}
    assert all(s.q_len == 1 and not s.cuda_graph for s in eager)


def test_paged_prefill_includes_full_query_tiles_over_the_longest_context():
    profile = load_profile(GOOD)
    shapes = set(shapes_for(profile.plans["prefill"], profile, cuda_graph=False))
    group = profile.model.num_qo_heads // profile.model.num_kv_heads
    assert Shape(1, 128 // group, 131072) in shapes and Shape(8, 128 // group, 131072) in shapes


@pytest.mark.parametrize("label", ["prefill", "prompt"])
def test_prefill_shapes_stay_within_the_engines_limits(label):
    profile = load_profile(GOOD)
    shapes = shapes_for(profile.plans[label], profile, cuda_graph=False)
    limits = profile.limits
    assert all(s.batch * s.q_len <= limits.max_num_batched_tokens for s in shapes)
    assert all(s.batch <= limits.max_num_seqs and s.kv_len <= limits.max_model_len for s in shapes)
    assert max(s.q_len for s in shapes) == limits.max_num_batched_tokens
    assert Shape(1, 1, 131072) in shapes  # the fewest query rows over the longest context


@pytest.mark.parametrize("label", ["mla_decode", "mixed"])
def test_mla_and_pod_graph_plans_are_one_decode_batch_per_graph_batch_size(label):
    profile = load_profile(GOOD)
    assert shapes_for(profile.plans[label], profile, cuda_graph=True) == [
        Shape(b, 1, 131072, cuda_graph=True) for b in (1, 8, 64)
    ]


def test_eager_pod_plans_decode_batches_without_a_graph_bound():
    profile = load_profile(GOOD)
    shapes = shapes_for(profile.plans["mixed"], profile, cuda_graph=False)
    assert not any(s.cuda_graph for s in shapes) and {s.q_len for s in shapes} == {1}
    assert Shape(1, 1, 131072) in shapes  # one request over the longest context splits most


def test_ragged_prefill_plans_short_chunks_over_long_contexts_too():
    # A ragged wrapper attends to any KV it is given (a prefix included), so its bound is
    # paged prefill's: the same bounding tiles.
    profile = load_profile(GOOD)
    ragged = shapes_for(profile.plans["prompt"], profile, cuda_graph=False)
    assert ragged == shapes_for(profile.plans["prefill"], profile, cuda_graph=False)


# --- plan options --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        pytest.param("plans.prefill.tensor_cores", True,
                     r"plans\.prefill\.tensor_cores=true is for kind decode, not paged_prefill",
                     id="tensor-cores-on-prefill"),
        pytest.param("plans.decode.q_len_per_req", 0,
                     r"plans\.decode\.q_len_per_req=0 must be a positive whole number",
                     id="q-len-zero"),
        pytest.param("plans.decode.q_len_per_req", 3,
                     r"plans\.decode\.q_len_per_req=3 needs kind decode with tensor_cores=true",
                     id="q-len-without-tensor-cores"),
        pytest.param("plans.decode.fixed_split_size", 0,
                     r"plans\.decode\.fixed_split_size=0 must be -1 \(the scheduler picks\) or a "
                     r"positive whole number", id="split-zero"),
        pytest.param("plans.decode.fixed_split_size", 2048,
                     r"plans\.decode\.fixed_split_size=2048 is taken by a prefill, or by decode "
                     r"with tensor_cores=true, not by decode without tensor cores",
                     id="split-on-plain-decode"),
        pytest.param("plans.mla_decode.fixed_split_size", 2048,
                     r"plans\.mla_decode\.fixed_split_size=2048 .* not by mla$", id="split-on-mla"),
        pytest.param("plans.mixed.disable_split_kv", True,
                     r"plans\.mixed\.disable_split_kv=true is not taken by kind pod",
                     id="no-split-on-pod"),
        pytest.param("cuda_graph_prefill_tokens", [512, 16384],
                     r"cuda_graph_prefill_tokens has 16384, more than "
                     r"calibration\.limits\.max_num_batched_tokens=8192",
                     id="prefill-graph-tokens"),
    ],
)  # fmt: skip
def test_a_plan_option_where_flashinfer_takes_none_is_named(path, value, match):
    with pytest.raises(ResourceConfigError, match=match):
        load_profile(with_(path, value))


def test_plan_options_default_to_flashinfer_s_own_defaults():
    plan = load_profile(GOOD).plans["decode"]
    assert (plan.tensor_cores, plan.q_len_per_req) == (False, 1)
    assert (plan.fixed_split_size, plan.disable_split_kv) == (-1, False)
    assert plan.plan_options() == {}  # nothing passed: every FlashInfer version takes the plan


def test_plan_options_are_passed_only_where_set():
    plan = PlanProfile(PlanKind.decode, "auto", True, 3, 2048, True)
    assert plan.plan_options() == {
        "fixed_split_size": 2048,
        "disable_split_kv": True,
        "q_len_per_req": 3,
    }


DENSE = {k: v for k, v in GOOD["plans"].items() if k in ("decode", "prefill", "prompt")}


def dense(**top: object) -> dict:
    """GOOD without its MLA and POD plans, with ``top``-level fields set."""
    import copy

    node = copy.deepcopy(GOOD)
    node["plans"] = copy.deepcopy(DENSE)
    node.update(top)
    return node


def test_the_vllm_plugin_plans_tensor_core_decode_and_the_builders_fixed_splits():
    """The splits the builder plans with (vLLM sets them under VLLM_BATCH_INVARIANT), read from
    it: none here, and whatever it set there."""
    from mstar_resources.integrations.vllm import plans as vllm_plans

    from .integrations.test_vllm_plugin import PLANS, profile_for, vllm_config

    def plan(role: str, plans: vllm_plans.BuilderPlans) -> tuple:
        p = profile_for(plans, role, vllm_config()).plans[role]
        return p.backend, p.tensor_cores, p.fixed_split_size, p.disable_split_kv

    assert plan("decode", PLANS) == ("auto", True, -1, False)
    assert plan("prefill", PLANS) == ("auto", False, -1, False)
    fixed = dataclasses.replace(
        PLANS, fixed_split_sizes={"prefill": 1024, "decode": 512}, disable_split_kv=True
    )
    assert plan("decode", fixed) == ("auto", True, 512, True)
    assert plan("prefill", fixed) == ("auto", False, 1024, True)


def test_tensor_core_decode_shapes_are_the_graph_batches_at_the_query_length():
    node = dense()
    node["plans"]["decode"] = {"kind": "decode", "tensor_cores": True, "q_len_per_req": 2}
    profile = load_profile(node)
    graph = shapes_for(profile.plans["decode"], profile, cuda_graph=True)
    assert graph == [Shape(b, 2, 131072, cuda_graph=True) for b in (1, 8, 64)]
    eager = shapes_for(profile.plans["decode"], profile, cuda_graph=False)
    assert eager[0] == Shape(1, 2, 131072, cuda_graph=True)  # the bound of eager plans
    assert all(s.q_len == 2 for s in eager)


def test_a_fixed_split_drops_the_graph_bound_and_keeps_the_largest_batch_at_the_longest_context():
    node = dense()
    node["plans"]["decode"] = {"kind": "decode", "tensor_cores": True, "fixed_split_size": 64}
    profile = load_profile(node)
    plan = profile.plans["decode"]
    eager = shapes_for(plan, profile, cuda_graph=False)
    assert not any(s.cuda_graph for s in eager)
    assert Shape(256, 1, 131072) in eager
    assert [s for s in eager if is_bounding(s, plan, profile)] == [
        s for s in eager if s.kv_len == 131072
    ]


def test_a_prefill_graph_is_planned_for_every_batch_that_fits_its_tokens():
    profile = load_profile(dense(cuda_graph_prefill_tokens=[8, 512]))
    shapes = shapes_for(profile.plans["prefill"], profile, cuda_graph=True)
    assert {(s.batch, s.q_len) for s in shapes if s.batch * s.q_len == 8} == {
        (1, 8),
        (2, 4),
        (4, 2),
        (8, 1),
    }
    assert all(s.cuda_graph and s.kv_len == 131072 for s in shapes)
    assert max(s.batch for s in shapes) == 256  # max_num_seqs caps the batch of 512 tokens
