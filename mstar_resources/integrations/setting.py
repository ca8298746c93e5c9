"""An engine plugin's setting (``MSTAR_RESOURCES_VLLM`` for vLLM's): unset or empty, the plugin is
off; else ``auto``, a shipped deployment's name, or the path of a deployment file in a
``deployment/`` folder. Every refusal is one paragraph that starts with the setting and value."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ResourceConfigError, did_you_mean
from ..files import FLASHINFER_FOLDER
from ..resolver import ResolvedResource, build_pools, resolve

if TYPE_CHECKING:
    from ..attn.workspace import WorkspacePool

Keys = dict[str, tuple[ResolvedResource, int | None]]
"""By role: the resource serving it and the slot the engine's wrappers take there."""

AUTO = "auto"  # measure each workspace's floor in the worker, on its GPU and its FlashInfer
EXAMPLE_FILE = "my-conf/deployment/mine_calibrated.yaml"  # where calibration writes ``mine``'s
SHOWN_CHARACTERS = 256  # a value longer than this is shown cut, with its length


def serving(records: Iterable[ResolvedResource], label: str) -> ResolvedResource | None:
    """The first of ``records`` that serves ``label`` (in any slot, or eagerly), or None."""
    return next((record for record in records if label in record.labels), None)


@dataclass(frozen=True)
class Setting:
    """What a plugin's setting asks for."""

    name: str  # e.g. MSTAR_RESOURCES_VLLM
    value: str
    records: tuple[ResolvedResource, ...] = ()  # the deployment's resources (none for auto)
    root: Any = None  # the composed deployment (None for auto)

    @property
    def auto(self) -> bool:
        return self.value == AUTO

    def describe(self) -> str:
        return f"{self.name}={self.value}"


@dataclass(frozen=True)
class PluginSetting:
    """The setting that switches an engine's plugin on, and what it takes."""

    env_var: str
    config_name: str  # the primary config a deployment is composed with (conf/<config_name>)
    engine: str  # as errors name it (vLLM)
    roles: tuple[str, ...]  # the labels the engine's wrappers plan as: each must be served

    @property
    def off(self) -> str:
        return f"to switch the plugin off, unset {self.env_var} (or set it empty)"

    def read(self, env: Mapping[str, str] | None = None) -> Setting | None:
        """The setting in ``env`` (default ``os.environ``), None when unset or empty."""
        env = os.environ if env is None else env
        value = env.get(self.env_var, "").strip()
        if not value:
            return None
        if value == AUTO:
            return Setting(self.env_var, value)
        root = self.compose(value)
        from ..calibration.record import checked_calibration_nodes  # composing loaded OmegaConf

        try:
            checked_calibration_nodes(root)  # as the dry run checks it
            records = tuple(resolve(root.get("resources") or {}, env=env))
        except ResourceConfigError as error:
            raise ResourceConfigError(
                f"{self.assignment(value)}: {'; '.join(error.problems)}", where=error.where
            ) from None
        setting = Setting(self.env_var, value, records, root)
        if mla := _mla_labels(root, records, self.roles):
            raise ResourceConfigError(
                f"{self.assignment(value)} is an MLA deployment (its resources serve "
                f"{', '.join(mla)}, which FlashInfer's MLA wrapper plans), and the plugin leaves "
                f"{self.engine}'s MLA attention to {self.engine}: it sizes the workspaces of "
                f"{self.engine}'s {' and '.join(self.roles)} wrappers only; for an MLA model set "
                f"{AUTO} (which leaves {self.engine}'s MLA buffers as they are), or name a "
                f"deployment it takes ({', '.join(self.deployments_served())}); {self.off}"
            )
        self.serving_keys(records, setting.describe())  # every role served, or which is not
        return setting

    def deployments_served(self) -> list[str]:
        """The shipped deployments whose resources serve every one of the engine's roles."""
        from ..compose import NO_DEPLOYMENT, deployment_options

        served = []
        for name in deployment_options(self.config_name):
            if name == NO_DEPLOYMENT:
                continue
            records = resolve(self.compose(name).get("resources") or {}, env={})
            if all(serving(records, role) is not None for role in self.roles):
                served.append(name)
        return served

    def assignment(self, value: str) -> str:
        """``NAME='value'``, a value too long to read cut with its length."""
        if len(value) > SHOWN_CHARACTERS:
            return f"{self.env_var}={value[:SHOWN_CHARACTERS]!r}... ({len(value):,} characters)"
        return f"{self.env_var}={value!r}"

    def compose(self, value: str) -> Any:
        """The shipped tree composed with deployment ``value``: a shipped name, or a file's path."""
        from ..compose import NO_DEPLOYMENT, compose_deployment, deployment_options

        named, off = self.assignment(value), self.off
        if os.sep in value or "/" in value or value.endswith((".yaml", ".yml")):
            config_dir, name = _deployment_file(value, named, off)
        else:
            if value == NO_DEPLOYMENT:
                raise ResourceConfigError(
                    f"{named} names the shipped tree's empty deployment, which declares no floor "
                    f"(each would be MSTAR_WORKSPACE_BUFFER_MB, else 512 MB); set {AUTO} to "
                    f"measure {self.engine}'s plans, or name a deployment with floors; {off}"
                )
            if value not in deployment_options(self.config_name):
                shipped = self.deployments_served()
                choices = [AUTO, *shipped]
                close = did_you_mean(value.lower(), choices) or did_you_mean(value, choices)
                raise ResourceConfigError(
                    f"{named} is not a setting the plugin takes{close}: it takes {AUTO} (measure "
                    f"{self.engine}'s plans), a shipped deployment ({', '.join(shipped)}) or the "
                    f"path of a deployment file (e.g. {EXAMPLE_FILE}); {off}"
                )
            config_dir, name = None, value
        try:  # a name: as measured with the FlashInfer installed; a path: its file
            return compose_deployment(
                self.config_name, name, config_dir, by_flashinfer=config_dir is None
            )
        except ResourceConfigError as error:
            raise ResourceConfigError(f"{named}: {error}") from None

    def serving_keys(
        self, records: Sequence[ResolvedResource], setting: str, roles: Sequence[str] = ()
    ) -> Keys:
        """For each of ``roles`` (default: the engine's), the resource serving it and the slot the
        engine's wrappers take there: its first CUDA-graph slot, else None."""
        found: Keys = {}
        for role in roles or self.roles:
            record = serving(records, role)
            if record is None:
                raise ResourceConfigError(
                    f"{setting}: no resource under resources serves the label {role!r}, and "
                    f"{self.engine} plans its FlashInfer wrappers as {' and '.join(self.roles)}; "
                    "declare each (the shipped tree's resources.attn."
                    f"{' and resources.attn.'.join(self.roles)} do)"
                )
            found[role] = (record, record.cg_slots[0] if record.cg_slots else None)
        return found

    def pools(
        self, records: Sequence[ResolvedResource], setting: str, device: Any, roles: Sequence[str]
    ) -> tuple[dict[str, WorkspacePool], Keys]:
        """The pools of the resources serving ``roles`` (none made yet), and their keys."""
        keys = self.serving_keys(records, setting, roles)
        return build_pools(list({r.path: r for r, _ in keys.values()}.values()), device), keys


def _mla_labels(root: Any, records: Sequence[ResolvedResource], roles: Sequence[str]) -> list[str]:
    """The labels of ``root``'s resources that its calibration profile plans with FlashInfer's
    MLA wrapper, where its resources serve none of ``roles``; [] otherwise."""
    if any(serving(records, role) is not None for role in roles):
        return []
    plans = (root.get("calibration") or {}).get("plans") or {}
    served = {label for record in records for label in record.labels}
    return [
        label
        for label, plan in plans.items()
        if label in served and getattr(plan.get("kind"), "value", plan.get("kind")) == "mla"
    ]


def _deployment_file(value: str, named: str, off: str) -> tuple[Path, str]:
    """The config dir and the deployment name of the deployment file ``value``."""
    path = Path(value).expanduser()
    reason = ""
    if path.suffix == ".yml":  # Hydra looks for NAME.yaml only
        reason = f"Hydra reads a deployment as NAME.yaml: rename it {path.stem}.yaml"
    elif path.suffix != ".yaml":
        reason = f"a deployment file ends in .yaml, and this one in {path.suffix!r}"
    else:
        try:
            if not path.is_file():
                # a relative path is read from the working directory: say which one that was
                reason = "not a file" if path.exists() else f"no such file as {path.absolute()}"
        except OSError as error:  # a name too long for the file system, ...
            reason = str(error.strerror)
    if reason:
        raise ResourceConfigError(
            f"{named} is not a deployment file ({reason}); give the path of one (e.g. "
            f"{EXAMPLE_FILE}, as mstar-resources-calibrate writes it), the name of a shipped "
            f"deployment, or {AUTO}; {off}"
        )
    measured = path.parent.name.startswith(FLASHINFER_FOLDER)  # one FlashInfer's calibration
    if (path.parent.parent if measured else path.parent).name != "deployment":
        raise ResourceConfigError(
            f"{named}: a deployment file lives in the deployment/ folder of a config dir (as "
            f"mstar-resources-calibrate writes it; one measured with a FlashInfer of its own in "
            f"deployment/{FLASHINFER_FOLDER}<version>/), and this one is in "
            f"{path.parent.name or '/'}/; move it into a deployment/ folder"
        )
    if measured:
        return path.resolve().parents[2], f"{path.parent.name}/{path.stem}"
    return path.resolve().parent.parent, path.stem
