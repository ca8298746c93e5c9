"""resolve and build_pools: from a composed resources tree to records and pools."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from mstar_resources import (
    ResourceConfigError,
    ResourceUsageError,
    Workspace,
    WorkspacePool,
    WorkspaceSealedError,
    build_pools,
    check_calibration,
    resolve,
)
from mstar_resources.floor import Floor
from mstar_resources.integrations import vllm
from mstar_resources.resolver import declared
from mstar_resources.units import MIB

from .attn.fake_allocator import FakePlanner
from .conftest import INT_VAR, VAR, compose_shipped

PREFILL = "resources.attn.prefill.declared_mb"
DECODE = "resources.attn.decode.declared_mb"
JSON_KEYS = [
    "path", "owner", "labels", "cg_slots", "declared_mb", "floor_mb", "floor_bytes",
    "floor_source", "floor_setting", "workspaces", "reserved_bytes", "int_declared_mb",
    "int_floor_mb", "int_floor_bytes", "int_floor_source", "int_floor_setting",
    "int_reserved_bytes",
]  # fmt: skip


def test_floors_come_from_the_composed_tree_then_the_environment():
    # The precedence itself is tested once, in test_floor.py; this is the one end-to-end row:
    # a deployment's value, a command-line override that unsets another, the variable behind it.
    cfg = compose_shipped(["deployment=llama3-70b-tp8-h200", f"{DECODE}=null"])
    records = resolve(cfg.resources, {VAR: "8"})
    got = [(r.path, r.floor.mb, r.floor.source, r.floor.setting) for r in records]
    assert got == [("attn.prefill", 128, "declared", PREFILL), ("attn.decode", 8, "env", VAR)]


def test_env_defaults_to_the_process_environment(monkeypatch):
    monkeypatch.setenv(VAR, "48")
    (prefill, _) = resolve(compose_shipped().resources)
    assert (prefill.floor.mb, prefill.floor.source) == (48, "env")


def test_a_record_carries_each_floor_whole_and_gives_the_json_keys_flat():
    (prefill, decode) = resolve(compose_shipped(["deployment=llama3-8b-h200"]).resources, {})
    assert (decode.floor, decode.int_floor) == (
        Floor(128, "declared", DECODE),
        Floor(8, "default", "MSTAR_INT_WORKSPACE_BUFFER_MB"),
    )
    assert list(decode.as_json()) == JSON_KEYS
    assert decode.as_json() == {
        "path": "attn.decode",
        "owner": "attention",
        "labels": ["decode"],
        "cg_slots": [0, 1],
        "declared_mb": 128,
        "floor_mb": 128,
        "floor_bytes": 128 * MIB,
        "floor_source": "declared",
        "floor_setting": DECODE,
        "workspaces": 2,
        "reserved_bytes": 256 * MIB,
        "int_declared_mb": None,
        "int_floor_mb": 8,
        "int_floor_bytes": 8 * MIB,
        "int_floor_source": "default",
        "int_floor_setting": "MSTAR_INT_WORKSPACE_BUFFER_MB",
        "int_reserved_bytes": 16 * MIB,
    }
    assert (prefill.workspaces, prefill.reserved_bytes) == (1, 256 * MIB)  # eager: one per label
    with pytest.raises(dataclasses.FrozenInstanceError):
        decode.floor = Floor(1, "declared", DECODE)  # type: ignore[misc]


def test_nested_tree_in_order_from_a_plain_mapping():
    tree = {
        "attn": {"decode": {"labels": ["decode", "verify"], "cg_slots": [0, 1, 2]}},
        "mla": {"deep": {"er": {"owner": "mla", "labels": ["decode"], "declared_mb": 8}}},
        "sampler": {"labels": ["topk"]},
    }
    records = resolve(tree, {})
    assert [(r.path, r.owner, r.workspaces) for r in records] == [
        ("attn.decode", "attention", 6),
        ("mla.deep.er", "mla", 1),
        ("sampler", "attention", 1),
    ]
    assert records[1].floor.setting == "resources.mla.deep.er.declared_mb"


def test_an_empty_tree_resolves_to_nothing():
    assert resolve({}, {}) == []


# (tree, env, every text the one error must hold)
BAD_TREES = [
    pytest.param(
        {"d": {"labels": ["x"], "declared_mb": 0}}, {},
        [r"resources\.d\.declared_mb=0 is not a positive whole number of MB; declare"],
        id="declared-zero",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "declared_mb": -3}}, {},
        [r"resources\.d\.declared_mb=-3 is not a positive"], id="declared-negative",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "declared_mb": "big"}}, {},
        [r"resources\.d\.declared_mb='big' is not a positive whole number of MB; declare"],
        id="declared-wrong-type",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "declared_mb": 1.5}}, {},
        [r"resources\.d\.declared_mb=1\.5 has the wrong type"], id="declared-float",
    ),
    pytest.param(
        {"d": {"labels": "decode"}}, {},
        [r"resources\.d\.labels='decode' has the wrong type; set it to a list of plan labels"],
        id="labels-not-a-list",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "cg_slots": ["a"]}}, {},
        [r"resources\.d\.cg_slots=\['a'\] has the wrong type"], id="slots-wrong-type",
    ),
    pytest.param(
        {"d": {"labels": []}}, {}, [r"resources\.d\.labels=\[\] is empty; list the plan labels"],
        id="labels-empty",
    ),
    pytest.param(
        {"d": {"labels": ["x", ""]}}, {}, [r"resources\.d\.labels=\['x', ''\] has an empty label"],
        id="label-empty",
    ),
    pytest.param(
        {"d": {"labels": ["x", "y", "x"]}}, {},
        [r"resources\.d\.labels=\['x', 'y', 'x'\] repeats \['x'\]; list each label once"],
        id="labels-duplicate",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "cg_slots": [0, -1]}}, {},
        [r"resources\.d\.cg_slots=\[0, -1\] has negative slots \[-1\]; slots are numbered from 0"],
        id="slot-negative",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "cg_slots": [1, 1]}}, {},
        [r"resources\.d\.cg_slots=\[1, 1\] repeats \[1\]; list each slot once"],
        id="slots-duplicate",
    ),
    pytest.param(
        {"d": {"owner": "attention"}}, {},
        [r"resources\.d\.labels is not set; set it to a list of plan labels"], id="missing-field",
    ),
    pytest.param(
        {"d": {"labels": "???"}}, {}, [r"resources\.d\.labels is not set"], id="missing-value",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "size_mb": 8}}, {},
        [r"resources\.d\.size_mb is not a resource setting; a resource takes owner, declared_mb, "
         r"int_declared_mb, labels, cg_slots"],
        id="unknown-key",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "declard_mb": 8}}, {},
        [r"resources\.d\.declard_mb is not a resource setting \(did you mean declared_mb\?\); "
         r"a resource takes owner"],
        id="misspelled-key",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "owner": ""}}, {}, [r"resources\.d\.owner='' is empty"],
        id="owner-empty",
    ),
    pytest.param(
        {"attn": {"decode": 5}}, {},
        [r"resources\.attn\.decode=5 is neither a resource nor a group of them"],
        id="not-a-mapping",
    ),
    pytest.param(
        {"attn": {"lables": ["decode"]}}, {},
        [r"resources\.attn\.lables=\['decode'\] is neither a resource"], id="misspelled-field",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "declared_mb": "${nowhere}"}}, {},
        [r"resources\.d\.declared_mb can't be read: "],
        id="broken-interpolation",
    ),
    pytest.param(
        {"d": {"labels": ["x"]}}, {VAR: "lots"},
        [r"MSTAR_WORKSPACE_BUFFER_MB='lots' is not a positive whole number of MB"],
        id="bad-variable",
    ),
    pytest.param(
        {"d": {"labels": ["x"], "declared_mb": 0}, "e": {"labels": []}, "f": {"labels": ["y"]},
         "g": {"labels": ["z"]}},
        {VAR: "0"},
        [r"^3 problems in the resources config:\n",
         r"\n  - resources\.d\.declared_mb=0 is not",
         r"\n  - resources\.e\.labels=\[\] is empty",
         r"\n  - MSTAR_WORKSPACE_BUFFER_MB=0 is not a positive whole number of MB; set it"],
        id="all-problems-at-once",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("tree", "env", "texts"), BAD_TREES)
def test_bad_tree_names_key_value_and_fix(tree, env, texts):
    with pytest.raises(ResourceConfigError, match=texts[0]) as raised:
        resolve(tree, env)
    for text in texts[1:]:
        assert raised.match(text)
    assert isinstance(raised.value, ValueError)


def test_every_problem_of_a_composed_tree_in_one_error():
    cfg = compose_shipped(
        [
            "resources.attn.prefill.declared_mb=0",
            "resources.attn.prefill.labels=[]",
            "resources.attn.decode.cg_slots=[-1,-1]",
        ]
    )
    with pytest.raises(ResourceConfigError, match=r"^4 problems") as raised:
        resolve(cfg.resources, {})
    assert str(raised.value).count("\n  - resources.attn.") == 4


TARGET = "tests.test_resolver.record_call"


@pytest.mark.parametrize(
    "tree",
    [
        pytest.param({"d": {"labels": ["x"], "_target_": TARGET}},
                     id="in-a-resource"),
        pytest.param({"_target_": TARGET, "d": {"labels": ["x"]}},
                     id="in-a-group"),
        pytest.param({"d": {"labels": ["x"], "owner": {"_target_": TARGET}}}, id="as-a-value"),
    ],
)  # fmt: skip
def test_a_target_in_the_tree_runs_nothing(tree):
    CALLS.clear()
    with pytest.raises(ResourceConfigError, match=r"resources\.(d\.)?(_target_|owner)"):
        resolve(tree, {})
    with pytest.raises(ResourceConfigError):
        build_pools(tree, "cpu", {})
    assert CALLS == []


CALLS: list[object] = []


def record_call(*args: object, **kwargs: object) -> None:
    """What a ``_target_`` in these tests names: it must never be called."""
    CALLS.append((args, kwargs))


def test_a_node_that_is_not_a_mapping_is_refused():
    with pytest.raises(ResourceConfigError, match=r"resources=\['x'\] is not a mapping"):
        resolve(["x"], {})  # type: ignore[arg-type]


def test_build_pools_one_pool_per_resource_with_its_floor_and_owner():
    tree = {"a": {"owner": "mla", "labels": ["decode"], "declared_mb": 1}, "b": {"labels": ["p"]}}
    pools = build_pools(OmegaConf.create(tree), "cpu", {VAR: "2"})
    assert list(pools) == ["a", "b"]
    assert all(isinstance(pool, WorkspacePool) for pool in pools.values())
    workspace = pools["a"].get("decode")
    assert (workspace.name, workspace.tensor.numel()) == ("mla:decode", MIB)
    assert workspace.floor == "resources.a.declared_mb"
    assert pools["b"].get("p").tensor.numel() == 2 * MIB
    assert pools["b"].get("p").floor == VAR


# (cg_slots declared, key asked for) -> served?
KEYS = [
    pytest.param([], ("decode", None), True, id="eager-served"),
    pytest.param([], ("decode", 0), False, id="eager-has-no-slot-0"),
    pytest.param([0, 1], ("decode", 1), True, id="slot-served"),
    pytest.param([0, 1], ("decode", None), False, id="slotted-has-no-eager"),
    pytest.param([0, 1], ("decode", 2), False, id="undeclared-slot"),
    pytest.param([0, 1], ("prefill", 0), False, id="undeclared-label"),
]


@pytest.mark.parametrize(("slots", "key", "served"), KEYS)
def test_a_pool_from_config_serves_only_what_it_declares(slots, key, served):
    tree = {"attn": {"decode": {"labels": ["decode", "verify"], "cg_slots": slots}}}
    pool = build_pools(tree, "cpu", {VAR: "1"})["attn.decode"]
    if served:
        assert pool.get(*key).tensor.numel() == MIB
        return
    serves = r"in cg slots \[0, 1\]" if slots else r"eagerly only \(cg_slot=None\)"
    asked = rf"\({key[0]!r}, cg_slot={key[1]}\)"
    with pytest.raises(
        ResourceUsageError,
        match=rf"^resources\.attn\.decode does not serve {asked}; it serves labels "
        rf"\['decode', 'verify'\] {serves}\. Add the label to resources\.attn\.decode\.labels",
    ):
        pool.get(*key)
    assert pool.workspaces() == {}


@pytest.mark.parametrize(
    ("declared", "env", "setting"),
    [
        pytest.param(1, {}, "resources.attn.decode.declared_mb", id="declared"),
        pytest.param(None, {VAR: "1"}, VAR, id="env"),
    ],
)
def test_sealed_errors_name_the_setting_that_sized_the_pool(declared, env, setting):
    tree = {"attn": {"decode": {"labels": ["decode"], "cg_slots": [0], "declared_mb": declared}}}
    pool = build_pools(tree, "cpu", env)["attn.decode"]
    workspace = pool.get("decode", 0)
    pool.seal()
    planner = FakePlanner(workspace.tensor, [("batch_decode_tmp_v", 2 * MIB, 16)])
    with pytest.raises(WorkspaceSealedError, match=rf"set {setting}=2 or more"):
        workspace.plan(planner)


def test_build_pools_reads_the_env_it_is_given_not_the_process(monkeypatch):
    monkeypatch.setenv(VAR, "not a number")
    pool = build_pools({"d": {"labels": ["x"]}}, torch.device("cpu"), {VAR: "1"})["d"]
    assert pool.get("x").tensor.numel() == MIB


@pytest.mark.parametrize(
    "node",
    [
        pytest.param({"labels": ["decode"], "cg_slots": [0], "declared_mb": 64}, id="typed"),
        pytest.param({"labels": ["decode"], "cg_slots": ["0"], "declared_mb": "64"},
                     id="strings-converted-as-omegaconf-does"),
    ],
)  # fmt: skip
def test_typed_and_converted_values_resolve_alike(node):
    (record,) = resolve({"attn": {"decode": node}}, env={})
    assert (record.declared_mb, record.cg_slots, record.floor.source) == (64, (0,), "declared")


def test_a_dotted_key_and_the_nested_path_it_spells_are_refused_by_name():
    tree = {"a.b": {"labels": ["x"]}, "a": {"b": {"labels": ["y"]}}}
    with pytest.raises(ResourceConfigError) as raised:
        resolve(tree, env={})
    assert raised.value.problems == (
        "resources.a.b is declared twice (a dotted key and a nested path both spell it), and one "
        "pool would serve only one of them; declare it once",
    )


def test_an_environment_value_that_is_no_string_is_a_config_error():
    with pytest.raises(ResourceConfigError, match=r"MSTAR_WORKSPACE_BUFFER_MB=8 is not a string"):
        build_pools({"a": {"labels": ["x"]}}, "cpu", env={"MSTAR_WORKSPACE_BUFFER_MB": 8})


API_MISUSE = [
    pytest.param(lambda: build_pools({"a": {"labels": ["x"]}}, "gpu", env={}),
                 r"device='gpu' is not a torch device", id="device-misspelled"),
    pytest.param(lambda: build_pools({"a": {"labels": ["x"]}}, None, env={}),
                 r"device=None is not a torch device", id="device-none"),
    pytest.param(lambda: build_pools(["x"], "cpu"),
                 r"build_pools takes the resources tree or the list resolve\(\) returns",
                 id="pools-of-strings"),
    pytest.param(lambda: WorkspacePool("cpu", 1, serves="decode"),
                 r"serves='decode' must be \(label, cg slot\) pairs", id="serves-a-string"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "match"), API_MISUSE)
def test_the_python_api_refuses_wrong_types_with_its_own_error(call, match):
    with pytest.raises(ResourceUsageError, match=match) as raised:
        call()
    assert not isinstance(raised.value, ResourceConfigError)  # a bug, not a user's mistake


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_pools_on_cuda_without_a_gpu_say_so_when_they_allocate():
    pools = build_pools({"a": {"labels": ["x"]}}, "cuda", env={})  # nothing allocated yet
    with pytest.raises(ResourceConfigError, match=r"made on cuda, and torch sees no CUDA device"):
        pools["a"].reserve()


@pytest.mark.parametrize("plain", [True, False], ids=["mapping", "config"])
def test_a_tree_nested_beyond_32_levels_is_one_problem_naming_where(plain):
    tree: dict = {}
    node = tree
    for _ in range(500):
        node["g"] = {}
        node = node["g"]
    node["r"] = {"labels": ["x"]}
    with pytest.raises(ResourceConfigError) as raised:
        resolve(tree if plain else _deep_config(40), {})
    (problem,) = raised.value.problems
    assert problem.startswith("resources.g.g.g") and "nested more than 32 levels" in problem


def _deep_config(levels: int):
    node: dict = {"r": {"labels": ["x"]}}
    for _ in range(levels):
        node = {"g": node}
    return OmegaConf.create(node)


def test_a_tree_32_levels_deep_resolves():
    node: dict = {"r": {"labels": ["x"]}}
    for _ in range(31):
        node = {"g": node}
    (record,) = resolve(node, {})
    assert record.path == ".".join(["g"] * 31 + ["r"])


def test_a_resource_is_known_by_its_schema_not_by_a_child_s_name():
    """A group may hold a resource named like a schema field: ``owner`` below is a resource."""
    (record,) = resolve({"layers": {"owner": {"labels": ["x"]}}}, env={})
    assert (record.path, record.labels) == ("layers.owner", ("x",))


def test_a_mapping_setting_a_field_but_no_labels_is_a_resource_missing_its_labels():
    with pytest.raises(ResourceConfigError) as caught:
        resolve({"a": {"declared_mb": 64}}, env={})
    (problem,) = caught.value.problems
    assert problem.setting == "resources.a.labels"
    assert problem.expects == "a list of plan labels, e.g. [decode]"


def test_problems_carry_their_setting_value_and_what_it_expects():
    tree = {"a": {"labels": ["x"], "declared_mb": "big", "owner": " "}, "b": {"labelz": [1]}}
    with pytest.raises(ResourceConfigError) as caught:
        resolve(tree, env={"MSTAR_WORKSPACE_BUFFER_MB": "lots"})
    found = {problem.setting: problem for problem in caught.value.problems}
    assert found["resources.a.declared_mb"].value == "big"
    assert "whole number of MB" in found["resources.a.declared_mb"].expects
    assert found["MSTAR_WORKSPACE_BUFFER_MB"].value == "lots"
    assert found["MSTAR_WORKSPACE_BUFFER_MB"].fix.startswith("unset MSTAR_WORKSPACE_BUFFER_MB")
    # What a person reads is unchanged: each problem is its sentence.
    assert all(str(p) in str(caught.value) for p in caught.value.problems)


def test_a_resource_s_own_check_names_the_full_key():
    with pytest.raises(ResourceConfigError) as caught:
        resolve({"a": {"labels": ["x"], "owner": "bad\nname"}}, env={})
    (problem,) = caught.value.problems
    assert (problem.setting, problem.value) == ("resources.a.owner", "bad\nname")
    assert problem.startswith("resources.a.owner=")


def test_the_pools_built_from_records_are_the_floors_they_resolved_not_the_environment_now():
    """What resolve() said is what is built: records resolved under one environment build the
    same floors under another, each naming the setting that won."""
    tree = {"a": {"labels": ["x"]}, "b": {"labels": ["y"], "declared_mb": 3}}
    records = resolve(tree, env={VAR: "2", INT_VAR: "1"})
    assert [(r.floor.mb, r.floor.source) for r in records] == [(2, "env"), (3, "declared")]
    pools = build_pools(records, "cpu", env={VAR: "64", INT_VAR: "16"})
    assert pools["a"].get("x").tensor.numel() == 2 * MIB
    assert pools["a"].int_floor_bytes == MIB
    assert pools["b"].get("y").tensor.numel() == 3 * MIB
    pools["a"].seal()
    planner = FakePlanner(pools["a"].get("x").tensor, [("batch_decode_tmp_v", 5 * MIB, 16)])
    with pytest.raises(WorkspaceSealedError) as raised:
        pools["a"].get("x").plan(planner)
    assert raised.value.setting == VAR and raised.value.suggested_mb == 5


def test_build_pools_takes_the_tree_or_the_records_resolve_gave():
    tree = {"a": {"labels": ["x"], "declared_mb": 1}}
    from_tree = build_pools(tree, "cpu", env={})
    from_records = build_pools(resolve(tree, env={}), "cpu", env={})
    assert from_tree.keys() == from_records.keys() == {"a"}
    assert from_tree["a"].get("x").tensor.numel() == from_records["a"].get("x").tensor.numel()


def test_serving_finds_the_resource_of_a_label():
    """The one lookup of which resource serves a plan (the engines' plugins')."""
    from mstar_resources.integrations.setting import serving

    records = resolve(
        {
            "attn": {
                "prefill": {"owner": "o", "labels": ["prefill"], "cg_slots": []},
                "decode": {"owner": "o", "labels": ["decode"], "cg_slots": [0, 2]},
            }
        },
        {},
    )
    assert serving(records, "decode").path == "attn.decode"
    assert serving(records, "prefill").path == "attn.prefill"
    assert serving(records, "verify") is None


@pytest.mark.parametrize("text", ["12", "+12", "1_2", " 12 ", "012"])
def test_a_floor_given_as_text_is_read_by_the_command_lines_rule_in_both_apis(text):
    """One rule for a number written as text: a config value (an interpolation gives text) and
    the Python API's size_mb alike, as the command line and the variables take it."""
    from mstar_resources import WorkspacePool

    (record,) = resolve({"d": {"labels": ["x"], "declared_mb": text, "int_declared_mb": text}}, {})
    assert (record.floor.mb, record.int_floor.mb) == (12, 12)
    pool = WorkspacePool("cpu", size_mb=text, int_size_mb=text)
    assert pool.get("x").tensor.numel() == pool.get("x").int_workspace.tensor.numel() == 12 * MIB


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "\u0661\u0662",
            "is not a positive whole number of MB",
        ),  # Arabic-Indic
        ("\uff11\uff12", "is not a positive whole number of MB"),  # fullwidth
        ("12 MB", "is not a positive whole number of MB"),
        ("9" * 70, "=<a number of 70 digits> MB is more than 1,048,576"),
    ],
)
def test_a_floor_as_text_that_spells_no_floor_is_refused_in_both_apis(text, problem):
    from mstar_resources import WorkspacePool

    with pytest.raises(ResourceConfigError) as caught:
        resolve({"d": {"labels": ["x"], "declared_mb": text}}, {})
    (found,) = caught.value.problems
    assert found.setting == "resources.d.declared_mb" and found.value == text
    assert problem in found
    with pytest.raises(ResourceConfigError) as caught:
        WorkspacePool("cpu", size_mb=text)
    assert caught.value.problems[0].setting == "size_mb"


@pytest.mark.parametrize(
    ("call", "setting", "value"),
    [
        pytest.param(lambda: resolve({}, env=5), "env", 5, id="resolve-env"),
        pytest.param(lambda: build_pools({}, "cpu", reserve="no"), "reserve", "no",
                     id="build-pools-reserve"),
    ],
)  # fmt: skip
def test_an_argument_of_the_wrong_type_is_refused_by_name(call, setting, value):
    with pytest.raises(ResourceUsageError) as raised:
        call()
    (problem,) = raised.value.problems
    assert (problem.setting, problem.value) == (setting, value)


def test_measured_floors_are_declared_as_a_trees_are_resolved():
    """``auto`` declares what it measured with no tree in between: the same record as a tree
    declaring those floors resolves to, the environment's floor ignored as a declared one ignores
    it, and taken where none is declared."""
    tree = {"attn": {"decode": {"owner": "attention", "labels": ["decode"], "cg_slots": [0]}}}
    env = {VAR: "64", INT_VAR: "16"}
    (undeclared,) = resolve(tree, env)
    assert declared("attn.decode", "attention", ["decode"], [0], env=env) == undeclared
    assert (undeclared.floor.source, undeclared.floor.mb) == ("env", 64)
    tree["attn"]["decode"] |= {"declared_mb": 3, "int_declared_mb": 1}
    (from_tree,) = resolve(tree, env)
    assert declared("attn.decode", "attention", ["decode"], [0], 3, 1, env) == from_tree
    assert (from_tree.floor.source, from_tree.floor.setting) == (
        "declared", "resources.attn.decode.declared_mb"
    )  # fmt: skip


def test_a_pool_takes_its_floors_one_way():
    (record,) = resolve({"attn": {"decode": {"owner": "attention", "labels": ["decode"]}}}, {})
    floors = build_pools([record], "cpu")["attn.decode"]
    assert floors.floor_bytes == 512 * MIB
    with pytest.raises(ResourceUsageError) as refused:
        WorkspacePool("cpu", 4, floors=(floors._floor, floors._int_floor))
    assert "size_mb=4" in str(refused.value) and "floors=" in str(refused.value)


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: WorkspacePool(2**64, 1), "device=18446744073709551616"),
        (lambda: WorkspacePool("mps", 1), "device='mps' is not one FlashInfer runs on"),
        (lambda: WorkspacePool("cpu", 1, serves=torch.tensor(8)), "serves=tensor(8)"),
        (lambda: WorkspacePool("cpu", 1, serves=[("d", 2**40)]), "cg_slot=1099511627776"),
        (lambda: WorkspacePool("cpu", 1).get("d", cg_slot=2**63), "an int from 0 to 255"),
        (lambda: WorkspacePool("cpu", 1).build(int, label="d"), "wrapper_class=<class 'int'>"),
        (lambda: Workspace(torch.zeros(8, dtype=torch.uint8), "a\nb"), "control character"),
        (lambda: check_calibration(None, "cpu"), "cfg=None must be the composed config"),
        (lambda: vllm.version_problem(5), "version=5 must be vLLM's version as a string"),
    ],
)  # fmt: skip
def test_the_python_api_names_the_bad_argument(make, named):
    with pytest.raises(ResourceUsageError) as refused:
        make()
    assert named in str(refused.value)


@pytest.mark.parametrize("groups", [31, 32])
def test_a_tree_as_a_dict_and_as_a_config_is_as_deep_as_it_may_be(groups):
    """One answer for one tree: as YAML composes it and as a plain mapping, a resource at the
    deepest level allowed resolves, and one a level deeper is refused."""

    def tree(depth: int) -> dict:
        node: dict = {"labels": ["x"]}
        for i in range(depth):
            node = {f"g{i}": node}
        return node

    for given in (tree(groups + 1), OmegaConf.create(tree(groups + 1))):
        if groups + 1 <= 32:
            assert len(resolve(given, {})) == 1
        else:
            with pytest.raises(ResourceConfigError, match="nested more than 32 levels"):
                resolve(given, {})


def test_a_list_past_the_cap_in_a_plain_mapping_is_refused_before_it_is_converted():
    """Found in the mapping itself ("items", where the schema's own check says "slots"): a
    config of 100,000 slots takes seconds to make before the schema refuses it."""
    tree = {"attn": {"decode": {"labels": ["d"], "cg_slots": list(range(100_000))}}}
    with pytest.raises(ResourceConfigError, match=r"cg_slots has 100,000 items; at most 256"):
        resolve(tree, {})
