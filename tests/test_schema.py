"""The Resource schema and the shipped conf/ tree it types."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re
from importlib.resources import files
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mstar_resources import ResourceConfigError, resolve, schema
from mstar_resources.schema import Resource

from .conftest import compose_shipped

CONF = Path(str(files("mstar_resources.conf")))
DEPLOYMENTS = sorted(path.stem for path in (CONF / "deployment").glob("*.yaml"))


def test_defaults_are_eager_with_the_floor_left_to_the_environment():
    resource = Resource(labels=["decode"])
    assert (resource.owner, resource.declared_mb, resource.cg_slots) == ("attention", None, [])


def test_every_field_has_a_docstring_and_says_what_it_expects():
    tree = ast.parse(inspect.getsource(Resource))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {
        node.target.id
        for node, after in itertools.pairwise(body)
        if isinstance(node, ast.AnnAssign)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
    }
    names = {f.name for f in dataclasses.fields(Resource)}
    assert documented == names
    assert all(f.metadata["expects"] for f in dataclasses.fields(Resource))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"labels": []}, r"^labels=\[\] is empty", id="labels-empty"),
        pytest.param({"labels": ["a", "a"]}, r"^labels=\['a', 'a'\] repeats", id="labels-dup"),
        pytest.param({"labels": ["a"], "declared_mb": 0}, r"^declared_mb=0 is not", id="mb-zero"),
        pytest.param({"labels": ["a"], "declared_mb": True}, r"^declared_mb=True", id="mb-bool"),
        pytest.param({"labels": ["a"], "cg_slots": [-2]}, r"^cg_slots=\[-2\] has negative",
                     id="slot-negative"),
        pytest.param({"labels": ["a"], "owner": " "}, r"^owner=' ' is empty", id="owner-blank"),
        pytest.param({"labels": ["a"], "owner": "x" * 5000},
                     r"^owner has 5,000 characters .*at most 128", id="owner-too-long"),
        pytest.param({"labels": ["a"], "owner": "a\x1b[31m"},
                     r"^owner='a\\x1b\[31m' holds the control character", id="owner-escape"),
        pytest.param({"labels": ["ok", "a\nb"]},
                     r"^labels\[1\]='a\\nb' holds the control character '\\n'",
                     id="label-newline"),
    ],
)  # fmt: skip
def test_post_init_names_the_field_and_value(kwargs, match):
    with pytest.raises(ResourceConfigError, match=match):
        Resource(**kwargs)


def test_every_problem_is_a_field_of_the_error_in_the_order_found():
    with pytest.raises(ResourceConfigError) as raised:
        Resource(labels=[], cg_slots=[3, 3], declared_mb=1 << 21)
    problems = raised.value.problems
    assert [problem.split("=")[0] for problem in problems] == ["declared_mb", "labels", "cg_slots"]
    assert problems[0].startswith(f"declared_mb={1 << 21:,} MB is more than 1,048,576 (1 TiB")


def test_schema_is_in_the_config_store():
    node = ConfigStore.instance().load("mstar_resources/resource.yaml").node
    assert OmegaConf.get_type(node) is Resource
    assert schema.Resource is Resource


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_every_shipped_deployment_composes_and_resolves(deployment):
    records = resolve(compose_shipped([f"deployment={deployment}"]).resources, {})
    # vLLM's WorkspaceManager beside attention: in the deployment of vLLM's plans for a MoE model.
    manager = ["vllm.workspace_manager"] if deployment.startswith("qwen3.5") else []
    assert [r.path for r in records] == ["attn.prefill", "attn.decode", *manager]
    if deployment != "none":
        assert {r.floor.source for r in records} == {"declared"}


def test_the_shipped_deployments_are_the_documented_ones():
    assert DEPLOYMENTS == [
        "deepseek-v3-tp8-h200",  # MLA
        "deepseek-v3-tp8-h200_calibrated",
        "glm-4.5-air-h200",  # SGLang's plans
        "glm-4.5-air-h200_calibrated",
        "llama3-70b-tp8-h200",  # SGLang's plans
        "llama3-70b-tp8-h200_calibrated",  # written on an H200 by mstar-resources-calibrate
        "llama3-8b-h200",  # vLLM's plans
        "llama3-8b-h200_calibrated",
        "none",
        "qwen3.5-122b-a10b-h200",  # vLLM's plans, a GQA group of 16
        "qwen3.5-122b-a10b-h200_calibrated",
    ]


@pytest.mark.parametrize("path", sorted(CONF.rglob("*.yaml")), ids=lambda p: p.name)
def test_every_yaml_starts_with_the_command_that_uses_it_and_an_override(path):
    comments = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comments.append(line)
    assert comments, f"{path} starts with no comment"
    command = (
        r"#   (mstar-resources(-calibrate)?|python scripts/\w+\.py|MSTAR_RESOURCES_VLLM=\S+ vllm"
        r"|MSTAR_RESOURCES_SGLANG=\S+ python -m sglang\.launch_server) "
    )
    commands = [line for line in comments if re.match(command, line)]
    assert commands and "=" in commands[0], f"{path}: no `<command> key=value` example"


# (overrides, the key the schema refuses, its value): told from Hydra's and OmegaConf's fields
COMPOSE_ERRORS = [
    pytest.param(["resources.attn.decode.declared_mb=lots"],
                 "resources.attn.decode.declared_mb", "lots", id="wrong-type"),
    pytest.param(["resources.attn.decode.size_mb=1"], "resources.attn.decode.size_mb", None,
                 id="unknown-key"),
    pytest.param(["resources.attn.decode.cg_slots=[x]"], "resources.attn.decode.cg_slots[0]", "x",
                 id="slot-wrong-type"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "key", "value"), COMPOSE_ERRORS)
def test_the_schema_fails_bad_overrides_at_compose(overrides, key, value):
    with pytest.raises(ConfigCompositionException) as raised:
        compose_shipped(overrides)
    cause = raised.value.__cause__
    assert isinstance(cause, OmegaConfBaseException)
    assert (cause.full_key, cause.value) == (key, value)


def test_a_misspelled_deployment_fails_at_compose_with_the_options():
    with pytest.raises(MissingConfigException) as raised:
        compose_shipped(["deployment=llama3-8b-h100"])
    assert raised.value.missing_cfg_file == "deployment/llama3-8b-h100"
    assert list(raised.value.options or []) == DEPLOYMENTS
