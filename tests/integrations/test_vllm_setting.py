"""``MSTAR_RESOURCES_VLLM``: every bad value is one paragraph naming the setting and the value, a
deployment file is read with the rules of ``mstar-resources --config-dir``, nothing is dropped
without a word, and the plugin reaches every process that runs the model."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import MissingConfigException

from mstar_resources.errors import ResourceConfigError
from mstar_resources.integrations import plugin as engine_plugin
from mstar_resources.integrations import vllm as plugin
from tests.apps import run_app

ENV = plugin.ENV_VAR
OVER_LLAMA3_8B = "defaults:\n  - llama3-8b-h200\n  - _self_\n"
DECODE_MB = "resources:\n  attn:\n    decode:\n      declared_mb: {}\n"
HEADER = "# @package _global_\n"


def deployment_file(tmp_path: Path, body: str, name: str = "mine", header: str = HEADER) -> Path:
    """``calibrated/deployment/<name>.yaml`` under ``tmp_path``: a deployment file of the user's,
    ``header`` then ``body``."""
    folder = tmp_path / "calibrated" / "deployment"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(header + body)
    return path


def refusal(value: str, env: dict[str, str] | None = None) -> str:
    """The paragraph the plugin refuses ``MSTAR_RESOURCES_VLLM=value`` with."""
    with pytest.raises(ResourceConfigError) as raised:
        plugin.VLLM.read({ENV: value, **(env or {})})
    text = str(raised.value)
    assert "\n" not in text
    return text


# -- what it takes --------------------------------------------------------------------------------


def test_unset_or_empty_is_off_and_auto_composes_nothing():
    assert plugin.VLLM.read({}) is None
    assert plugin.VLLM.read({ENV: "  "}) is None
    setting = plugin.VLLM.read({ENV: " auto "})
    assert setting is not None and setting.auto and setting.records == ()


def test_a_shipped_calibrated_deployment_gives_its_floors_and_where_they_came_from():
    setting = plugin.VLLM.read({ENV: "llama3-8b-h200_calibrated"})
    assert setting is not None and not setting.auto
    floors = {r.path: (r.floor.mb, r.floor.source, r.floor.setting) for r in setting.records}
    assert floors == {
        "attn.prefill": (17, "declared", "resources.attn.prefill.declared_mb"),
        "attn.decode": (3, "declared", "resources.attn.decode.declared_mb"),
    }


def test_a_deployment_file_of_the_users_composes_over_the_shipped_tree(tmp_path):
    path = deployment_file(tmp_path, OVER_LLAMA3_8B + DECODE_MB.format(41))
    setting = plugin.VLLM.read({ENV: str(path)})
    assert {r.path: r.floor.mb for r in setting.records} == {"attn.prefill": 256, "attn.decode": 41}


def test_the_floor_variable_sizes_what_a_deployment_file_leaves_undeclared(tmp_path):
    path = deployment_file(tmp_path, DECODE_MB.format(41))
    setting = plugin.VLLM.read({ENV: str(path), "MSTAR_WORKSPACE_BUFFER_MB": "64"})
    floors = {r.path: (r.floor.mb, r.floor.source) for r in setting.records}
    assert floors == {"attn.prefill": (64, "env"), "attn.decode": (41, "declared")}


# -- what it refuses ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "named"),
    [
        pytest.param("llama3-8b", "(did you mean llama3-8b-h200?)", id="misspelled"),
        pytest.param("AUTO", "(did you mean auto?)", id="auto-in-capitals"),
        pytest.param("0", "unset MSTAR_RESOURCES_VLLM", id="zero"),
        pytest.param("1", "unset MSTAR_RESOURCES_VLLM", id="one"),
        pytest.param("true", "unset MSTAR_RESOURCES_VLLM", id="true"),
        pytest.param("false", "unset MSTAR_RESOURCES_VLLM", id="false"),
        pytest.param("null", "unset MSTAR_RESOURCES_VLLM", id="null"),
        pytest.param("8.5", "unset MSTAR_RESOURCES_VLLM", id="a-number"),
        pytest.param("[a,b]", "a shipped deployment (glm-4.5-air-h200,", id="a-list"),
        pytest.param("none", "declares no floor", id="none"),
        pytest.param("no/such/file.yaml", "no such file", id="missing-file"),
        pytest.param("llama3-8b-h200.json", "(did you mean llama3-8b-h200?)", id="not-yaml"),
        pytest.param("mine/llama3-8b-h200.json", "ends in .yaml", id="a-path-not-yaml"),
    ],
)
def test_a_bad_value_is_one_paragraph_naming_the_setting_and_the_value(value, named):
    text = refusal(value)
    assert text.startswith(f"{ENV}={value!r}")
    assert named in text


def test_a_value_too_long_for_a_name_or_a_file_is_shown_cut_with_its_length():
    for value in ("x" * 5000, "/" + "y" * 5000 + ".yaml"):
        text = refusal(value)
        assert text.startswith(f"{ENV}={value[:256]!r}... ({len(value):,} characters)")
        assert len(text) < 1400


def test_a_deployment_file_outside_a_deployment_folder_is_refused(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(HEADER)
    assert "deployment/ folder" in refusal(str(path))


BAD_FILES = {
    "no-header": ("", DECODE_MB.format(7), "its first line must be `# @package _global_`"),
    "byte-order-mark": ("\ufeff" + HEADER, DECODE_MB.format(7), "no byte-order mark"),
    "empty": ("", "", "an empty file has no such line"),
    "negative": (HEADER, DECODE_MB.format(-5), "resources.attn.decode.declared_mb=-5"),
    "misspelt-key": (
        HEADER,
        "resources:\n  attn:\n    decode:\n      declard_mb: 7\n",
        "resources.attn.decode.declard_mb is not a setting (did you mean "
        "resources.attn.decode.declared_mb?)",
    ),
    "unknown-key": (HEADER, "foo: 1\n", "foo is not a setting"),
    "wrong-type": (HEADER, DECODE_MB.format("lots"), "declared_mb='lots' is not valid"),
    "lists-itself": (HEADER, "defaults:\n  - mine\n", "never ends"),
}


@pytest.mark.parametrize(("header", "body", "named"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_bad_deployment_file_is_refused_as_mstar_resources_refuses_it(
    tmp_path, header, body, named
):
    path = deployment_file(tmp_path, body, header=header)
    text = refusal(str(path))
    assert text.startswith(f"{ENV}={str(path)!r}: ")
    assert named in text
    # The same file, through the dry run's --config-dir: refused too, exit status 2, in one line.
    done = run_app("--config-dir", str(path.parent.parent), "deployment=mine", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_deployment_whose_resources_are_wrong_names_the_setting_and_the_key(tmp_path):
    path = deployment_file(tmp_path, OVER_LLAMA3_8B + DECODE_MB.format(0))
    text = refusal(str(path))
    assert text.startswith(f"{ENV}={str(path)!r}: ")
    assert "resources.attn.decode.declared_mb=0" in text


def test_a_deployment_that_serves_no_decode_label_says_which(tmp_path):
    body = "resources:\n  attn:\n    decode:\n      labels: [verify]\n"
    assert "serves the label 'decode'" in refusal(str(deployment_file(tmp_path, body)))


# -- the processes it reaches ---------------------------------------------------------------------


def test_a_program_that_initialised_hydra_keeps_it_and_the_plugin_composes_its_own(tmp_path):
    (tmp_path / "program.yaml").write_text("served_by: the program\n")
    with initialize_config_dir(str(tmp_path), version_base="1.3"):
        setting = plugin.VLLM.read({ENV: "llama3-8b-h200"})
        assert GlobalHydra.instance().is_initialized()
        # The program's Hydra still composes from its own search path, which has no deployments.
        assert compose("program") == {"served_by": "the program"}
        with pytest.raises(MissingConfigException):
            compose("resources/default")
    assert {r.floor.mb for r in setting.records} == {256, 128}


def test_the_plugins_settings_are_copied_to_vllms_ray_workers(monkeypatch):
    """vLLM copies ``VLLM_*``, ``NCCL_*``, ``HF_*``... and ``DEFAULT_EXTRA_ENV_VARS`` to its Ray
    workers; enabled, the plugin adds its own settings to those names."""
    ray_env = types.ModuleType(plugin.RAY_ENV)
    ray_env.DEFAULT_EXTRA_ENV_VARS = {"PYTHONHASHSEED"}
    monkeypatch.setitem(__import__("sys").modules, plugin.RAY_ENV, ray_env)
    monkeypatch.setenv(ENV, "auto")
    monkeypatch.setattr(engine_plugin, "installed_version", lambda distribution: "0.26.0")
    monkeypatch.setattr(plugin.PLUGIN, "_active", None)
    plugin.register()
    assert plugin.active() is not None
    assert {
        "PYTHONHASHSEED", "MSTAR_RESOURCES_VLLM", "MSTAR_WORKSPACE_BUFFER_MB"
    } == ray_env.DEFAULT_EXTRA_ENV_VARS  # fmt: skip


def test_without_vllm_the_warning_says_vllm_is_not_installed(monkeypatch, caplog):
    monkeypatch.setenv(ENV, "auto")
    monkeypatch.setattr(engine_plugin, "installed_version", lambda distribution: None)
    monkeypatch.setattr(plugin.PLUGIN, "_active", None)
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.mstar_resources"):
        plugin.register()
    assert plugin.active() is None
    assert "vLLM is not installed here" in caplog.text
    assert "None" not in caplog.text


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("calibrated: hello\n", "calibrated='hello' is not valid"),
        ("calibration:\n  modle: {}\n", "calibration.modle"),
        ("calibrated:\n  foo: bar\n", "calibrated.foo is not a field of what calibration records"),
    ],
)
def test_a_calibration_the_dry_run_refuses_the_plugins_refuse(tmp_path, body, named):
    from mstar_resources.integrations import sglang

    path = deployment_file(tmp_path, OVER_LLAMA3_8B + body)
    assert named in refusal(str(path))
    with pytest.raises(ResourceConfigError) as refused:
        sglang.SGLANG.read({sglang.ENV_VAR: str(path)})
    assert named in str(refused.value)
    done = run_app(f"--config-dir={path.parent.parent}", f"deployment={path.stem}", cwd=tmp_path)
    assert done.returncode == 2 and named in done.stderr


def test_a_yml_deployment_file_is_named_with_the_name_hydra_reads(tmp_path):
    path = deployment_file(tmp_path, OVER_LLAMA3_8B, name="mine")
    yml = path.rename(path.with_suffix(".yml"))
    text = refusal(str(yml))
    assert "Hydra reads a deployment as NAME.yaml: rename it mine.yaml" in text
    assert "pick one of" not in text
