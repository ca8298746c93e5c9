"""``MSTAR_RESOURCES_VLLM``, the vLLM plugin's setting (:class:`~..setting.PluginSetting`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...resolver import ResolvedResource
from ..setting import AUTO, PluginSetting, Setting
from .plans import ROLES, Role

__all__ = ["AUTO", "ENV_VAR", "VLLM", "Setting", "read_setting", "serving_keys"]

ENV_VAR = "MSTAR_RESOURCES_VLLM"
"""The setting that enables the plugin: ``auto``, a deployment's name, or a deployment file."""

VLLM = PluginSetting(ENV_VAR, "mstar_resources_vllm", "vLLM", tuple(ROLES))
"""What the setting takes; its deployments compose with ``conf/mstar_resources_vllm.yaml``."""


def read_setting(env: Mapping[str, str] | None = None) -> Setting | None:
    """The setting in ``env`` (``os.environ`` by default), checked (:meth:`PluginSetting.read`)."""
    return VLLM.read(env)


def serving_keys(
    records: Sequence[ResolvedResource], roles: Sequence[Role], setting: str
) -> dict[Role, tuple[ResolvedResource, int | None]]:
    """:meth:`PluginSetting.serving_keys` of ``roles``, typed by vLLM's roles."""
    return VLLM.serving_keys(records, setting, roles)  # type: ignore[return-value]
