"""The engine-independent part of a plugin's setting (``integrations/setting.py``): another
engine's plugin reads its own variable, and every refusal names that variable and that engine."""

from __future__ import annotations

import os

import pytest

from mstar_resources.errors import ResourceConfigError
from mstar_resources.integrations.setting import AUTO, PluginSetting

OTHER = PluginSetting("MSTAR_RESOURCES_OTHER", "mstar_resources_vllm", "Other", ("prefill",))
"""An engine of one role, composing deployments with the shipped plugin's primary config."""


def test_another_engines_setting_reads_its_own_variable():
    assert OTHER.read({}) is None
    assert OTHER.read({"MSTAR_RESOURCES_VLLM": AUTO}) is None
    setting = OTHER.read({"MSTAR_RESOURCES_OTHER": f" {AUTO} "})
    assert setting is not None and setting.auto
    assert setting.describe() == "MSTAR_RESOURCES_OTHER=auto"


def test_a_shipped_deployment_is_composed_and_its_roles_served():
    setting = OTHER.read({"MSTAR_RESOURCES_OTHER": "llama3-8b-h200_calibrated"})
    assert setting is not None and not setting.auto
    keys = OTHER.serving_keys(setting.records, setting.describe())
    assert list(keys) == ["prefill"]
    assert keys["prefill"][0].path == "attn.prefill"


@pytest.mark.parametrize("value", ["nope", "none", "missing/deployment/x.yaml"])
def test_a_refusal_names_the_engines_variable_and_the_engine(value):
    with pytest.raises(ResourceConfigError) as caught:
        OTHER.read({"MSTAR_RESOURCES_OTHER": value})
    text = str(caught.value)
    assert text.startswith(f"MSTAR_RESOURCES_OTHER={value!r}")
    assert "unset MSTAR_RESOURCES_OTHER" in text
    assert "MSTAR_RESOURCES_VLLM" not in text


def test_a_role_no_resource_serves_is_named_with_the_engines_roles():
    verify = PluginSetting("MSTAR_RESOURCES_OTHER", "mstar_resources_vllm", "Other", ("verify",))
    with pytest.raises(ResourceConfigError, match=r"'verify', and Other plans its FlashInfer"):
        verify.read({"MSTAR_RESOURCES_OTHER": "llama3-8b-h200_calibrated"})


# A deployment file's name that Hydra's grammar would read as a value or a sweep, and a config
# dir whose path holds what the grammar reads: composed as written (the decode floor declared).
ODD_NAMES = ["inf", "nan", "true", "1", "null", "1e3", "x,y"]
ODD_FOLDERS = ["dë", "a,b", "a=b", "it's", "a]b"]


@pytest.mark.parametrize(
    ("folder", "name"),
    [*((f"conf-{n}", n) for n in ODD_NAMES), *((f, "mine") for f in ODD_FOLDERS)],
)
def test_a_deployment_file_is_composed_whatever_its_path_holds(tmp_path, folder, name):
    path = tmp_path / folder / "deployment" / f"{name}.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("# @package _global_\nresources: {attn: {decode: {declared_mb: 33}}}\n")
    setting = OTHER.read({"MSTAR_RESOURCES_OTHER": str(path)})
    assert setting is not None
    floors = {record.key: record.floor.mb for record in setting.records}
    assert floors["resources.attn.decode"] == 33


@pytest.mark.parametrize("deployment", ["deepseek-v3-tp8-h200", "deepseek-v3-tp8-h200_calibrated"])
def test_an_mla_deployment_is_refused_saying_mla_is_left_to_the_engine(deployment):
    both = PluginSetting("MSTAR_RESOURCES_OTHER", "mstar_resources_sglang", "Other",
                         ("prefill", "decode"))  # fmt: skip
    with pytest.raises(ResourceConfigError) as caught:
        both.read({"MSTAR_RESOURCES_OTHER": deployment})
    (problem,) = caught.value.problems
    assert problem.startswith(f"MSTAR_RESOURCES_OTHER={deployment!r} is an MLA deployment")
    assert "mla_prefill, mla_decode" in problem
    assert "leaves Other's MLA attention to Other" in problem
    taken = problem.partition("name a deployment it takes (")[2].partition(")")[0].split(", ")
    assert "llama3-8b-h200_calibrated" in taken
    assert not any(name.startswith("deepseek") for name in taken)
    for name in taken:  # each is one the plugin takes
        assert both.read({"MSTAR_RESOURCES_OTHER": name}) is not None


def test_a_value_that_is_no_setting_offers_only_deployments_the_plugin_takes():
    """The list a bad value gets holds the deployments that serve the engine's roles: no MLA one
    (refused when named) and not the empty one."""
    with pytest.raises(ResourceConfigError) as caught:
        OTHER.read({"MSTAR_RESOURCES_OTHER": "nope"})
    (problem,) = caught.value.problems
    offered = problem.partition("a shipped deployment (")[2].partition(")")[0].split(", ")
    assert "llama3-8b-h200" in offered and "none" not in offered
    for name in offered:
        assert OTHER.read({"MSTAR_RESOURCES_OTHER": name}) is not None


def test_a_missing_deployment_file_is_named_as_the_path_read(tmp_path, monkeypatch):
    """A relative path is read from the working directory, which the refusal names."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ResourceConfigError) as caught:
        OTHER.read({"MSTAR_RESOURCES_OTHER": "my-conf/deployment/nothere.yaml"})
    (problem,) = caught.value.problems
    assert f"no such file as {tmp_path / 'my-conf/deployment/nothere.yaml'}" in problem


def test_a_file_that_is_not_utf8_beside_a_fifo_is_named_without_reading_the_fifo(tmp_path):
    folder = tmp_path / "c" / "deployment"
    folder.mkdir(parents=True)
    (folder / "bin.yaml").write_bytes(b"# @package _global_\n# caf\xe9\n")
    os.mkfifo(folder / "fifo.yaml")  # read, it would never end
    (folder / "zero.yaml").symlink_to("/dev/zero")
    path = folder / "bin.yaml"
    with pytest.raises(ResourceConfigError) as caught:
        OTHER.read({"MSTAR_RESOURCES_OTHER": str(path)})
    (problem,) = caught.value.problems
    assert problem.startswith(f"MSTAR_RESOURCES_OTHER={str(path)!r}: {path} is not UTF-8 text")
