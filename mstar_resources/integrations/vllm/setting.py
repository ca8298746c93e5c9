"""``MSTAR_RESOURCES_VLLM``, the vLLM plugin's setting: a :class:`~..setting.PluginSetting`
(``auto``, a shipped deployment, or a deployment file; every refusal one paragraph that starts
with the setting and its value)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...resolver import ResolvedResource
from ..setting import AUTO, PluginSetting, Setting
from .plans import ROLES, Role

__all__ = ["AUTO", "ENV_VAR", "VLLM", "Setting", "compose_setting", "read_setting", "serving_keys"]

ENV_VAR = "MSTAR_RESOURCES_VLLM"
"""The setting that enables the plugin: ``auto``, a deployment's name, or a deployment file."""

VLLM = PluginSetting(ENV_VAR, "mstar_resources_vllm", "vLLM", tuple(ROLES))
"""What the setting takes; its deployments compose with ``conf/mstar_resources_vllm.yaml``."""


def read_setting(env: Mapping[str, str] | None = None) -> Setting | None:
    """The plugin's setting in ``env`` (``os.environ`` by default), checked: None when unset or
    empty (:meth:`PluginSetting.read`)."""
    return VLLM.read(env)


def compose_setting(value: str) -> Any:
    """The shipped tree composed with deployment ``value`` (:meth:`PluginSetting.compose`)."""
    return VLLM.compose(value)


def serving_keys(
    records: Sequence[ResolvedResource], roles: Sequence[Role], setting: str
) -> dict[Role, tuple[ResolvedResource, int | None]]:
    """For each of ``roles``, the resource that serves it and the slot vLLM's wrappers take there
    (:meth:`PluginSetting.serving_keys`)."""
    return VLLM.serving_keys(records, setting, roles)  # type: ignore[return-value]
