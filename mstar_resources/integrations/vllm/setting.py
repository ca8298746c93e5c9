"""``MSTAR_RESOURCES_VLLM``: what it may hold, and how a bad value is told.

Unset or empty, the plugin is off. Otherwise it holds ``auto``, the name of a shipped deployment,
or the path of a deployment file in a ``deployment/`` folder; a deployment is composed with the
rules of ``mstar-resources --config-dir DIR deployment=NAME`` (a file without its
``# @package _global_`` line, a key no deployment takes, a floor the resolver refuses: each is
refused, never dropped), and every refusal is one paragraph that starts with the setting and its
value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ResourceConfigError, did_you_mean
from ...resolver import ResolvedResource, resolve, serving
from .plans import ROLES, Role

ENV_VAR = "MSTAR_RESOURCES_VLLM"
"""The setting that enables the plugin: ``auto``, a deployment's name, or a deployment file."""

AUTO = "auto"
"""Measure each workspace's floor in the worker, on its GPU and its FlashInfer."""

CONFIG_NAME = "mstar_resources_vllm"
"""The primary config the plugin composes a deployment with (``conf/mstar_resources_vllm.yaml``)."""

OFF = f"to switch the plugin off, unset {ENV_VAR} (or set it empty)"

SHOWN_CHARACTERS = 256
"""A value longer than this is shown cut, with its length."""


@dataclass(frozen=True)
class Setting:
    """What ``MSTAR_RESOURCES_VLLM`` asks for."""

    value: str
    """As set."""
    records: tuple[ResolvedResource, ...] = ()
    """The deployment's resources, floors resolved (empty for ``auto``)."""
    root: Any = None
    """The composed config of the deployment (None for ``auto``): its calibration is checked on
    the GPU."""

    @property
    def auto(self) -> bool:
        return self.value == AUTO

    def describe(self) -> str:
        return f"{ENV_VAR}={self.value}"


def read_setting(env: Mapping[str, str] | None = None) -> Setting | None:
    """The plugin's setting in ``env`` (``os.environ`` by default), checked: None when it is unset
    or empty. A deployment is composed and its floors resolved here, so a bad one fails where
    vLLM starts, as one paragraph (:class:`~mstar_resources.ResourceConfigError`)."""
    env = os.environ if env is None else env
    value = env.get(ENV_VAR, "").strip()
    if not value:
        return None
    if value == AUTO:
        return Setting(value)
    root = compose_setting(value)
    try:
        records = tuple(resolve(root.get("resources") or {}, env=env))
    except ResourceConfigError as error:
        raise ResourceConfigError(
            f"{_named(value)}: {'; '.join(error.problems)}", where=error.where
        ) from None
    setting = Setting(value, records, root)
    serving_keys(records, ROLES, setting.describe())  # both served, or which is not
    return setting


def _named(value: str) -> str:
    """``MSTAR_RESOURCES_VLLM='value'``, a value too long to read cut with its length."""
    if len(value) > SHOWN_CHARACTERS:
        return f"{ENV_VAR}={value[:SHOWN_CHARACTERS]!r}... ({len(value):,} characters)"
    return f"{ENV_VAR}={value!r}"


def _looks_like_a_path(value: str) -> bool:
    return os.sep in value or "/" in value or value.endswith((".yaml", ".yml"))


def compose_setting(value: str) -> Any:
    """The shipped tree composed with deployment ``value``: a name of the shipped deployments, or
    the path of a deployment file in a ``deployment/`` folder of a config dir."""
    from ...apps.hydra_app import compose_deployment, deployment_options
    from ...apps.hydra_errors import NO_DEPLOYMENT
    from ...apps.settings import ComposedTree

    named = _named(value)
    if _looks_like_a_path(value):
        config_dir, name = _deployment_file(value, named)
    else:
        options = deployment_options(CONFIG_NAME)
        if value == NO_DEPLOYMENT:
            raise ResourceConfigError(
                f"{named} names the shipped tree's empty deployment, which declares no floor (each "
                f"would be MSTAR_WORKSPACE_BUFFER_MB, else 512 MB); set {AUTO} to measure vLLM's "
                f"plans, or name a deployment with floors; {OFF}"
            )
        if value not in options:
            choices = [AUTO, *(o for o in options if o != NO_DEPLOYMENT)]
            close = did_you_mean(value.lower(), choices) or did_you_mean(value, choices)
            raise ResourceConfigError(
                f"{named} is not a setting the plugin takes{close}: it takes {AUTO} (measure "
                f"vLLM's plans), a shipped deployment ({', '.join(choices[1:])}) or the path of a "
                f"deployment file (e.g. calibrated/deployment/mine.yaml); {OFF}"
            )
        config_dir, name = None, value
    try:
        return compose_deployment(CONFIG_NAME, name, config_dir, settings=ComposedTree)
    except ResourceConfigError as error:
        raise ResourceConfigError(f"{named}: {error}") from None


def _deployment_file(value: str, named: str) -> tuple[Path, str]:
    """The config dir and the deployment name of the deployment file ``value``."""
    path = Path(value).expanduser()
    try:
        is_file = path.is_file()
    except OSError as error:  # a name too long for the file system, ...
        is_file, reason = False, error.strerror
    else:
        reason = "no such file" if not path.exists() else "not a file"
    if path.suffix not in (".yaml", ".yml"):
        is_file, reason = False, f"a deployment file ends in .yaml, and this one in {path.suffix!r}"
    if not is_file:
        raise ResourceConfigError(
            f"{named} is not a deployment file ({reason}); give the path of one (e.g. "
            f"calibrated/deployment/llama3-8b-h200_calibrated.yaml), the name of a shipped "
            f"deployment, or {AUTO}; {OFF}"
        )
    if path.parent.name != "deployment":
        raise ResourceConfigError(
            f"{named}: a deployment file lives in the deployment/ folder of a config dir (as "
            f"mstar-resources-calibrate writes it), and this one is in "
            f"{path.parent.name or '/'}/; move it into a deployment/ folder"
        )
    return path.resolve().parent.parent, path.stem


def serving_keys(
    records: Sequence[ResolvedResource], roles: Sequence[Role], setting: str
) -> dict[Role, tuple[ResolvedResource, int | None]]:
    """For each of ``roles``, the resource that serves its label and the slot vLLM's wrappers take
    there: the first CUDA-graph slot it declares (vLLM captures one graph context), else eager."""
    found: dict[Role, tuple[ResolvedResource, int | None]] = {}
    for role in roles:
        record = serving(records, role)
        if record is None:
            raise ResourceConfigError(
                f"{setting}: no resource under resources serves the label {role!r}, "
                f"and vLLM plans its FlashInfer wrappers as prefill and decode; declare both "
                "(the shipped tree's resources.attn.prefill and resources.attn.decode do)"
            )
        found[role] = (record, record.cg_slots[0] if record.cg_slots else None)
    return found
