"""``MSTAR_RESOURCES_SGLANG``, the SGLang plugin's setting (:class:`~..setting.PluginSetting`): its
deployments compose with ``conf/mstar_resources_sglang.yaml``."""

from __future__ import annotations

from ..setting import PluginSetting, Setting

__all__ = ["ENV_VAR", "ROLES", "SGLANG", "Setting"]

ENV_VAR = "MSTAR_RESOURCES_SGLANG"
ROLES = ("prefill", "decode")
"""The labels SGLang's FlashInfer wrappers plan as: its ragged and paged prefill (and verify)
wrappers', and its decode wrappers'."""
SGLANG = PluginSetting(ENV_VAR, "mstar_resources_sglang", "SGLang", ROLES)
