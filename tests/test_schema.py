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
        pytest.param({"labels": [], "cg_slots": [3, 3]}, r"^labels=\[\] is empty.*\ncg_slots=",
                     id="each-problem-a-line"),
    ],
)  # fmt: skip
def test_post_init_names_the_field_and_value(kwargs, match):
    with pytest.raises(ResourceConfigError, match=match):
        Resource(**kwargs)


def test_schema_is_in_the_config_store():
    node = ConfigStore.instance().load("mstar_resources/resource.yaml").node
    assert OmegaConf.get_type(node) is Resource
    assert schema.Resource is Resource


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_every_shipped_deployment_composes_and_resolves(deployment):
    records = resolve(compose_shipped([f"deployment={deployment}"]).resources, {})
    assert [r.path for r in records] == ["attn.prefill", "attn.decode"]
    if deployment != "none":
        assert {r.floor_source for r in records} == {"declared"}


def test_the_shipped_deployments_are_the_documented_ones():
    assert DEPLOYMENTS == [
        "llama3-70b-tp8-h200",
        "llama3-70b-tp8-h200_calibrated",  # written on an H200 by mstar-resources-calibrate
        "llama3-8b-h200",
        "llama3-8b-h200_calibrated",
        "none",
    ]


@pytest.mark.parametrize("path", sorted(CONF.rglob("*.yaml")), ids=lambda p: p.name)
def test_every_yaml_starts_with_the_command_that_uses_it_and_an_override(path):
    comments = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comments.append(line)
    assert comments, f"{path} starts with no comment"
    commands = [line for line in comments if re.match(r"#   mstar-resources(-calibrate)? ", line)]
    assert commands and "=" in commands[0], f"{path}: no `mstar-resources key=value` example"


# (overrides, error type, message)
COMPOSE_ERRORS = [
    pytest.param(
        ["deployment=llama3-8b-h100"], MissingConfigException,
        r"Could not find 'deployment/llama3-8b-h100'\n\nAvailable options in 'deployment':\n"
        r"\tllama3-70b-tp8-h200\n\tllama3-70b-tp8-h200_calibrated\n\tllama3-8b-h200\n"
        r"\tllama3-8b-h200_calibrated\n\tnone",
        id="misspelled-deployment",
    ),
    pytest.param(
        ["resources.attn.decode.declared_mb=lots"], ConfigCompositionException,
        r"Error merging override resources\.attn\.decode\.declared_mb=lots", id="wrong-type",
    ),
    pytest.param(
        ["resources.attn.decode.size_mb=1"], ConfigCompositionException,
        r"Could not override 'resources\.attn\.decode\.size_mb'", id="unknown-key",
    ),
    pytest.param(
        ["resources.attn.decode.cg_slots=[x]"], ConfigCompositionException,
        r"Error merging override resources\.attn\.decode\.cg_slots=\[x\]", id="slot-wrong-type",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), COMPOSE_ERRORS)
def test_the_schema_fails_bad_overrides_at_compose(overrides, error, match):
    with pytest.raises(error, match=match):
        compose_shipped(overrides)
