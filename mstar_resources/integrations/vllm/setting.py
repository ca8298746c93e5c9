"""``MSTAR_RESOURCES_VLLM``, the vLLM plugin's setting (:class:`~..setting.PluginSetting`): its
deployments compose with ``conf/mstar_resources_vllm.yaml``."""

from __future__ import annotations

from ..setting import AUTO, PluginSetting, Setting
from .plans import ROLES

__all__ = ["AUTO", "ENV_VAR", "VLLM", "Setting", "read_setting"]

ENV_VAR = "MSTAR_RESOURCES_VLLM"
VLLM = PluginSetting(ENV_VAR, "mstar_resources_vllm", "vLLM", ROLES)
read_setting = VLLM.read
