"""``MSTAR_RESOURCES_VLLM``, the vLLM plugin's setting (:class:`~..setting.PluginSetting`)."""

from __future__ import annotations

from ..setting import AUTO, PluginSetting, Setting
from .plans import ROLES

__all__ = ["AUTO", "ENV_VAR", "VLLM", "Setting", "read_setting"]

ENV_VAR = "MSTAR_RESOURCES_VLLM"
"""The setting that enables the plugin: ``auto``, a deployment's name, or a deployment file."""

VLLM = PluginSetting(ENV_VAR, "mstar_resources_vllm", "vLLM", ROLES)
"""What the setting takes; its deployments compose with ``conf/mstar_resources_vllm.yaml``."""

read_setting = VLLM.read
"""The setting in ``env`` (``os.environ`` by default), checked (:meth:`PluginSetting.read`)."""
