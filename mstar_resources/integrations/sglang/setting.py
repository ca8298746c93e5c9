"""``MSTAR_RESOURCES_SGLANG``, the SGLang plugin's setting (:class:`~..setting.PluginSetting`)."""

from __future__ import annotations

from ..setting import PluginSetting, Setting

__all__ = ["ENV_VAR", "ROLES", "SGLANG", "Setting"]

ENV_VAR = "MSTAR_RESOURCES_SGLANG"
"""The setting that enables the plugin: ``auto``, a deployment's name, or a deployment file."""

ROLES = ("prefill", "decode")
"""The labels SGLang's FlashInfer wrappers plan as: the ragged and paged prefill (and verify)
wrappers, and the decode wrappers."""

SGLANG = PluginSetting(ENV_VAR, "mstar_resources_sglang", "SGLang", ROLES)
"""What the setting takes; its deployments compose with ``conf/mstar_resources_sglang.yaml``."""
