"""The engine-independent part of a plugin's setting (``integrations/setting.py``): another
engine's plugin reads its own variable, and every refusal names that variable and that engine."""

from __future__ import annotations

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
