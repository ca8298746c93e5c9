"""Composing the config tree as a Hydra command line does, a mistake raised as one paragraph: the
setting, the bad value, what it takes and the closest valid name."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import importlib
import inspect
import json
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.singleton import Singleton
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf, ValidationError
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException
from omegaconf.nodes import BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode

from .errors import ResourceConfigError, did_you_mean
from .files import DEPLOYMENT_GROUP, calibrated_for, shipped_deployments
from .schema import FIELDS
from .units import installed_version

__all__ = ["DEPLOYMENT_GROUP", "NO_DEPLOYMENT", "SHIPPED_CONF", "ComposedTree", "Composition",
           "compose_deployment", "deployment_options", "group_options", "hydra_on",
           "not_a_choice", "register_settings", "shipped_deployments"]  # fmt: skip

SHIPPED_CONF = "pkg://mstar_resources.conf"
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, yaml.YAMLError, ValueError, OSError,
                  RecursionError)  # fmt: skip
NO_DEPLOYMENT = "none"
"""The shipped tree's empty deployment: never offered as the closest to a misspelt name."""
NODE_EXPECTS: dict[type, str] = {BooleanNode: "true or false", IntegerNode: "a whole number",
                                 FloatNode: "a number", StringNode: "a string",
                                 ListConfig: "a list, e.g. [a, b]",
                                 DictConfig: "a mapping, e.g. {key: value}"}  # fmt: skip


@dataclasses.dataclass
class ComposedTree:
    """The top keys of the tree: the schema a plugin composes, the base of each app's settings."""

    resources: Any = None  # conf/resources, each resource typed as Resource
    calibration: Any = None  # the deployment's CalibrationProfile, if it has one
    calibrated: Any = None  # what calibration measured, in a ..._calibrated deployment


def register_settings(config_name: str, settings: type) -> None:
    """Store an app's settings schema as ``<config_name>_settings``, listed first by its config."""
    ConfigStore.instance().store(f"{config_name}_settings", settings, provider="mstar-resources")


def compose_deployment(
    config_name: str, deployment: str, config_dir: Path | None = None, *, by_flashinfer: bool = True
) -> DictConfig:
    """``config_name`` composed as ``mstar-resources deployment=<name>`` does, for an engine's
    plugin (``by_flashinfer=False``: that very file, not the installed FlashInfer's)."""
    register_settings(config_name, ComposedTree)
    with hydra_on(SHIPPED_CONF, compose_deployment):
        # Quoted: a file named inf.yaml, null.yaml or x,y.yaml is a name, not a number or a sweep.
        texts = [f"{DEPLOYMENT_GROUP}={quoted(deployment)}"]
        on = Composition(config_name, texts, config_dir, by_flashinfer=by_flashinfer)
        return on.config(hydra=False)


def quoted(text: str) -> str:
    """``text`` as a quoted value of Hydra's override grammar, read back as ``text``."""
    escaped = re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), text)
    return "'" + escaped.replace("${", "\\${") + "'"


def deployment_options(config_name: str) -> list[str]:
    """The shipped deployments, by name (those starting with ``_`` left out)."""
    with hydra_on(SHIPPED_CONF, compose_deployment):
        return group_options(DEPLOYMENT_GROUP, config_name)


@contextmanager
def hydra_on(config_path: str, run: Callable[..., object]) -> Iterator[None]:
    """Hydra initialised on ``config_path`` as ``@hydra.main`` over ``run`` finds it; a program's
    own Hydra (``initialize_*`` refuse to run beside it) is saved and given back after."""
    pkg = config_path.removeprefix("pkg://")
    if pkg != config_path:  # imported first, as Hydra would: what it registers stays after
        importlib.import_module(pkg)
    program = Singleton.get_state() if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    folder = str((Path(inspect.getfile(run)).parent / config_path).resolve())
    try:
        with initialize_config_module(pkg, version_base="1.3") if pkg != config_path else (
            initialize_config_dir(folder, version_base="1.3")
        ):  # fmt: skip
            yield
    finally:
        if program is not None:
            Singleton.set_state(program)


def group_options(group: str, config_name: str | None, searchpath: Sequence[str] = ()) -> list[str]:
    """The options of config group ``group`` ("": primary configs) that do not start with ``_``."""
    try:
        loader = GlobalHydra.instance().config_loader()
        names = loader.get_group_options(group, config_name=config_name, overrides=[*searchpath])
    except (HydraException, OSError):  # a key too long for a folder's name, ...
        return []
    return sorted(name for name in names if not name.startswith("_"))


class Composition:
    """Overrides as a command line gives them (``texts``), composed over the primary config
    ``config_name`` (or ``given_name``, from ``--config-name``) with ``config_dir`` searched."""

    def __init__(
        self, config_name: str, texts: Sequence[str], config_dir: str | Path | None = None,
        given_name: str | None = None, settings: type | None = None, *, by_flashinfer: bool = True,
    ) -> None:  # fmt: skip
        self.config_name, self.texts, self.given_name = config_name, list(texts), given_name
        self.by_flashinfer = by_flashinfer  # a deployment as measured with the FlashInfer installed
        self.composed_name = given_name or config_name
        self.settings = settings
        self.folder = Path(config_dir).resolve() if config_dir else None
        try:
            self.overrides = OverridesParser.create().parse_overrides(self.texts)
        except (HydraException, ValueError):  # no override Hydra can read: composing says so
            self.overrides = []

    def options(self, group: str) -> list[str]:
        return group_options(group, self.config_name, self.searchpath)

    def measured_here(self, name: str) -> str:
        """``name``, or its calibration with the FlashInfer installed (:func:`calibrated_for`)."""
        if not self.by_flashinfer:
            return name
        folders = [shipped_deployments()]
        if self.folder:
            folders.append(self.folder / DEPLOYMENT_GROUP)
        return calibrated_for(name, installed_version("flashinfer-python"), folders)

    @functools.cached_property
    def composed_texts(self) -> list[str]:
        """The overrides as composed: each deployment as :meth:`measured_here` picks it."""
        texts = list(self.texts)
        for i, override in enumerate(self.overrides):
            name = override.value()
            if override.key_or_group != DEPLOYMENT_GROUP or not isinstance(name, str):
                continue
            if (chosen := self.measured_here(name)) != name:
                texts[i] = f"{DEPLOYMENT_GROUP}={quoted(chosen)}"
        return texts

    @functools.cached_property
    def primary(self) -> Any:
        """Hydra's settings of the primary config composed alone (None: it does not compose)."""
        try:
            return compose(self.config_name, return_hydra_config=True).hydra
        except COMPOSE_ERRORS:
            return None

    @functools.cached_property
    def searchpath(self) -> tuple[str, ...]:
        """The override that adds ``--config-dir`` to the primary config's search path."""
        if not self.folder:
            return ()
        path = [*self.primary.searchpath] if self.primary else []
        entries = ",".join(quoted(entry) for entry in [*path, f"file://{self.folder}"])
        return (f"hydra.searchpath=[{entries}]",)

    @functools.cached_property
    def choices(self) -> frozenset[str]:
        """The config groups the primary config picks an option of by default."""
        return frozenset(map(str, self.primary.runtime.choices if self.primary else ()))

    def deletion_problem(self, override: Override) -> str | None:
        """Why ``~KEY`` (``override``) deletes nothing; None where it deletes a value."""
        others = [text for text in self.texts if text != override.input_line]
        try:
            composed = compose(self.composed_name, [*others, *self.searchpath])
        except COMPOSE_ERRORS:  # composing with the deletion says what is wrong
            return None
        key = override.key_or_group
        holder, _, name = key.rpartition(".")
        parent = OmegaConf.select(composed, holder) if holder else composed
        if not isinstance(parent, DictConfig):
            return None
        if name not in parent:
            settings = [str(k) for k in parent]
            close = did_you_mean(name, settings, f"{holder}." if holder else "")
            return (f"{override.input_line} deletes {key}, which is not a setting{close}; "
                    f"{holder or 'the config'} takes {', '.join(settings)}")  # fmt: skip
        if not OmegaConf.is_missing(parent, name) and parent[name] is None:
            return (f"{override.input_line} deletes {key}, which is unset (null) already; leave "
                    "the deletion out")  # fmt: skip
        if not dataclasses.is_dataclass(OmegaConf.get_type(parent)):
            return None
        return (f"{override.input_line} deletes {key}, a setting of the schema, which stays; "
                f"leave the deletion out, or give {key} another value")  # fmt: skip

    @functools.cached_property
    def deployment_files(self) -> list[Path]:
        """Where the ``--config-dir`` would hold the deployment the overrides pick: the file
        composed, then the one of the name given where that differs."""
        picks = (o.value() for o in reversed(self.overrides) if o.key_or_group == DEPLOYMENT_GROUP)
        given = next(picks, None)
        if not (self.folder and isinstance(given, str) and given):
            return []
        picked = dict.fromkeys([self.measured_here(given), given])
        return [self.folder / DEPLOYMENT_GROUP / f"{name}.yaml" for name in picked]

    def _check_file(self, path: Path) -> None:
        """Refuse deployment file ``path`` where Hydra would fail on it, read it without end,
        ignore it or compose it changed without a word."""
        assert self.folder is not None
        try:
            mode = path.stat().st_mode
        except OSError as error:  # not there (another folder may have it), or a broken link
            if not path.is_symlink():
                return
            why = "loops back to itself" if error.errno == errno.ELOOP else "does not exist"
            raise ResourceConfigError(f"{DEPLOYMENT_GROUP}={path.stem} picks {path}, a symbolic "
                                      f"link to {os.readlink(path)}, which {why}; point it at a "
                                      "deployment file, or remove it") from None  # fmt: skip
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO or a device?)"
            raise ResourceConfigError(f"{DEPLOYMENT_GROUP}={path.stem} picks {path}, which is "
                                      f"{what}; a deployment is a YAML file: replace it with "
                                      "one")  # fmt: skip
        within = path.relative_to(self.folder / DEPLOYMENT_GROUP)
        shipped = shipped_deployments() / within
        if shipped.is_file() and shipped.resolve() != path.resolve():
            name = within.with_suffix("").as_posix()  # flashinfer-<version>/NAME: the version's
            raise ResourceConfigError(f"{DEPLOYMENT_GROUP}={name} picks the shipped deployment "
                                      f"of that name, not {path}: Hydra finds the package's "
                                      "configs before a --config-dir's, so the file would be "
                                      f"ignored; rename it (e.g. to {path.stem}_mine.yaml) and "
                                      "use the new name")  # fmt: skip
        named = f"{DEPLOYMENT_GROUP}={path.stem} ({path})"
        if (read := _read_bounded(path, named)) is None:
            return
        body, text = read
        # The deployments its defaults list from the same folder, read within the same bounds.
        seen, listed = {path}, _listed_beside(body, path)
        while listed:
            if (other := listed.pop()) not in seen:
                seen.add(other)
                found = _read_bounded(other, f"{named} lists {other.stem}, whose file {other}")
                listed += _listed_beside(found[0], other) if found else []
        if problem := _body_problem(body, text, self.settings or ComposedTree):
            raise ResourceConfigError(f"{named} {problem}")

    def config(self, full_error: bool = False, hydra: bool = True) -> DictConfig:
        """The overrides composed, a mistake in them or in a config file raised as
        ResourceConfigError (where ``full_error``, as Hydra raised it)."""
        for path in self.deployment_files:
            self._check_file(path)
        try:
            overrides = [*self.composed_texts, *self.searchpath]
            return compose(self.composed_name, overrides, return_hydra_config=hydra)
        except COMPOSE_ERRORS as error:
            if full_error or (paragraph := self.paragraph(error)) is None:
                raise
            raise ResourceConfigError(paragraph) from None

    def paragraph(self, error: BaseException) -> str | None:
        """``error``, raised composing the overrides, as one paragraph; None where it is no mistake
        in them or in a config file."""
        if isinstance(error, yaml.YAMLError):
            return not_yaml(error)
        if isinstance(error, RecursionError):
            given = " ".join(self.texts) or "the config"
            return (f"composing {given} never ends: a defaults list names a config that lists it "
                    "again, itself or through others (a deployment whose defaults list names that "
                    "deployment, say); remove the name from that list")  # fmt: skip
        if name := self.given_name:  # not the other apps' configs, nor the settings'
            mine = {p.stem for p in self.folder.glob("*.yaml")} if self.folder else set()
            configs = [c for c in self.options("") if c == self.config_name or c in mine]
            if name.removesuffix(".yaml") not in configs:  # not there, or another app's
                return not_a_primary_config(name, configs)
        if isinstance(error, UnicodeDecodeError) and self.folder:  # not the deployment's file
            for path in sorted(self.folder.rglob("*.yaml")):
                data = path.read_bytes() if path.is_file() else b""  # no FIFO, device or folder
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError as found:
                    return not_utf8(path, data, found)
        if isinstance(error, MissingConfigException):
            group, _, name = (error.missing_cfg_file or "").rpartition("/")
            if error.options is not None:
                return not_a_choice(group, name, list(error.options), config_dir=self.folder)
            if group and (options := self.options(group)):  # in a defaults list: none listed
                where = str(error).splitlines()[0].rstrip(".")  # the file that lists it
                close = did_you_mean(name, options, f"/{group}/")
                return f"{where}{close}; {group}/ holds {', '.join(options)}"
        if isinstance(error, OverrideParseException):
            why = _paragraph(error.message) + _quoting_hint(error.override)
            return f"{error.override!r} is not an override Hydra can read: {why}"
        if isinstance(error, HydraException | OmegaConfBaseException):
            # Hydra raises its own error in OmegaConf's handler (a file's value), or from it.
            cause = error if isinstance(error, OmegaConfBaseException) else (
                error.__cause__ or error.__context__)  # fmt: skip
            if isinstance(cause, ConfigKeyError | ConfigAttributeError) and cause.full_key:
                return self._unknown_key(cause)
            if isinstance(cause, ValidationError) and cause.full_key:
                return _bad_value(cause)
            if isinstance(cause, OmegaConfBaseException) and cause is not error:
                # Hydra's says what it was doing; its cause's first line, why it could not.
                reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
                if reason not in str(error):
                    return _paragraph(f"{error}: {reason}")
            return _paragraph(str(error))
        if type(error) is ValueError:  # OmegaConf's int() of a list's index
            return self.list_index_problem()
        filename = str(error.filename) if isinstance(error, OSError) and error.filename else ""
        for override in self.overrides if filename else []:
            # Hydra looks a key up as a config group on disk first, and a group's value as a file.
            key, value = override.key_or_group, override.value()
            if isinstance(value, str) and len(value) > 80 and value in filename:
                shown = f"{value[:80]}... ({len(value):,} characters)"
                why = ": no option has so long a name"
                return not_a_choice(key, shown, self.options(key), why, closest=False)
            if key in filename:
                shown = key if len(key) <= 80 else f"{key[:80]}... ({len(key):,} characters)"
                return f"{shown} is not a setting: no setting or config group has so long a name"
        return None

    def _unknown_key(self, error: OmegaConfBaseException) -> str:
        parent, full_key = error.parent_node, str(error.full_key)
        if not isinstance(parent, DictConfig):
            return _paragraph(str(error))
        holder = full_key.rpartition(".")[0]
        prefix, at = f"{holder}." if holder else "", holder or "the config"
        settings = [str(key) for key in parent if key != "hydra"]
        if full_key == DEPLOYMENT_GROUP:
            picked = [path for path in self.deployment_files[:1] if path.is_file()]
            file = f"the deployment file {picked[0]}" if picked else "a deployment file"
            return (f"{DEPLOYMENT_GROUP} is not a setting: {file} was composed under the key "
                    f"{DEPLOYMENT_GROUP} instead of at the top of the config; its first line "
                    "must be `# @package _global_`, with no byte-order mark before it, as in the "
                    "shipped deployments (an empty file has no such line)")  # fmt: skip
        if not settings:
            return (f"{full_key} is not a setting: {at} is empty as composed, so there is nothing "
                    f"under it to set; compose an option that fills {at} first (e.g. "
                    "deployment=NAME)")  # fmt: skip
        if str(error.key) in FIELDS and FIELDS.keys() & set(settings):
            # A resource declared in a user's YAML without the schema has only the keys it wrote.
            return (f"{full_key} is a resource's setting, and {holder} is declared without it; add "
                    f"it with a plus: +{full_key}=VALUE")  # fmt: skip
        # A config group (deployment=NAME) is no key of the config, but as likely meant.
        groups = [] if holder else [g for g in self.choices if not g.startswith("hydra/")]
        close = did_you_mean(str(error.key), settings, prefix) or did_you_mean(
            str(error.key), groups
        )
        in_resource = bool(FIELDS.keys() & set(settings))  # a resource's own fields
        new = "" if close or in_resource or not holder.startswith("resources") else (
            f"; a resource of your own is added with a plus: +{full_key}.labels=[LABEL]"
        )  # fmt: skip
        return f"{full_key} is not a setting{close}; {at} takes {', '.join(settings)}{new}"

    def list_index_problem(self) -> str | None:
        """The first override that sets an item of a list by a name, not a position."""
        for i, override in enumerate(self.overrides):
            parts = override.key_or_group.split(".")
            try:
                cfg = compose(self.composed_name, [*self.texts[:i], *self.searchpath])
            except COMPOSE_ERRORS:
                return None
            for depth, part in enumerate(parts[1:], 1):
                path = ".".join(parts[:depth])
                if isinstance(OmegaConf.select(cfg, path), ListConfig) and not part.isdigit():
                    return (f"{override.input_line} is not a setting: {path} is a list, whose "
                            f"items are set by position ({path}.0=...) or all at once "
                            f"({path}=[...])")  # fmt: skip
        return None


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML has it
MAX_FILE_BYTES = 1 << 20  # the shipped deployments hold under 4 KB
# Values, aliases followed: the shipped deployments hold under 300; composing 10,000 takes a second.
MAX_VALUES = 10_000
MAX_NESTING = 64  # levels of YAML: OmegaConf walks them recursively
TOO_DEEP = f"nests more than {MAX_NESTING} levels deep; write the deployment out plainly"


def _read_bounded(path: Path, named: str) -> tuple[Any, str] | None:
    """``path``'s YAML (its body and text), or None where Hydra's own error says more."""
    if (size := path.stat().st_size) > MAX_FILE_BYTES:
        raise ResourceConfigError(f"{named} is {size:,} bytes, more than the {MAX_FILE_BYTES:,} a "
                                  "deployment file may hold (a deployment is a few dozen lines); "
                                  "give one of its own size")  # fmt: skip
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
        too_large = _too_large(yaml.compose(text, Loader=SAFE_LOADER))
        body = None if too_large else yaml.load(text, Loader=SAFE_LOADER)
    except OSError as error:
        raise ResourceConfigError(f"{named} can't be read ({error.strerror or error}); make it "
                                  "readable to this user, or pick another") from None  # fmt: skip
    except UnicodeDecodeError as error:
        raise ResourceConfigError(not_utf8(path, data, error)) from None
    except (RecursionError, yaml.YAMLError) as error:
        # Too deep (a RecursionError, or libyaml's message); else composing says what is wrong.
        if not (isinstance(error, RecursionError) or "maximum nesting depth" in str(error)):
            return None
        too_large = TOO_DEEP
    if too_large:
        raise ResourceConfigError(f"{named} {too_large}")
    return body, text


def not_utf8(path: Path, data: bytes, error: UnicodeDecodeError) -> str:
    """Config file ``path``, whose bytes ``data`` are no UTF-8: the byte and its line."""
    line = data.count(b"\n", 0, error.start) + 1
    return (f"{path} is not UTF-8 text: byte 0x{data[error.start]:02x} at line {line} "
            f"({error.reason}); save the file as UTF-8")  # fmt: skip


def _listed_beside(body: Any, path: Path) -> list[Path]:
    """The deployment files the defaults of ``body`` (``path``'s) name."""
    defaults = body.get("defaults") if isinstance(body, dict) else None
    group = path.parent if path.parent.name == DEPLOYMENT_GROUP else path.parent.parent
    found = []
    for listed in defaults if isinstance(defaults, list) else []:
        if not isinstance(listed, str) or not listed.strip():
            continue
        name = listed.removeprefix(f"/{DEPLOYMENT_GROUP}/")
        if not set(name) & set("/@:\\"):
            found.append((group if name != listed else path.parent) / f"{name}.yaml")
    return [p for p in found if p.is_file()]


def _too_large(root: yaml.Node | None) -> str | None:
    """What makes a YAML document too large to compose (None: nothing)."""
    for values, depth in enumerate(_depths(root), 1):  # a node each time an alias leads to it
        if values > MAX_VALUES:
            if sum(1 for _ in _depths(root, once=True)) > MAX_VALUES:  # as many without aliases
                return (f"holds more than {MAX_VALUES:,} values, where a deployment holds a few "
                        "dozen; declare what it needs")  # fmt: skip
            return (f"holds more than {MAX_VALUES:,} values, its YAML aliases followed (a "
                    "deployment holds a few dozen; nested anchors multiply them); write the "
                    "deployment out plainly")  # fmt: skip
        if depth > MAX_NESTING:
            return TOO_DEEP
    return None


def _depths(root: yaml.Node | None, once: bool = False) -> Iterator[int]:
    """The depth of each node of ``root``: each time an alias leads to it, or (``once``) once."""
    seen: set[int] = set()
    stack = [] if root is None else [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if once:
            if id(node) in seen:
                continue
            seen.add(id(node))
        yield depth
        if isinstance(node, yaml.MappingNode):
            stack += [(child, depth + 1) for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(child, depth + 1) for child in node.value]


def _body_problem(body: Any, text: str, settings: type) -> str | None:
    """What a deployment file sets that composing would refuse, drop or change without a word."""
    if not body and text.startswith("# @package _global_"):  # else Hydra's error says so
        return ("declares nothing: a deployment sets resources (or lists another deployment under "
                "defaults), and without them every floor would be MSTAR_WORKSPACE_BUFFER_MB, else "
                "512 MB; write the deployment's settings into the file, or pick "
                "another")  # fmt: skip
    if not isinstance(body, dict):
        return None
    if not isinstance(body.get("resources", {}), dict | type(None)):
        return (f"sets resources to {json.dumps(body['resources'])}; resources maps each "
                "resource's name to its fields (e.g. resources: {attn: {decode: {labels: "
                "[decode]}}})")  # fmt: skip
    stack: list[tuple[str, Any]] = [(str(key), value) for key, value in body.items()]
    while stack:
        key, value = stack.pop()
        digits = isinstance(value, str) and value.strip().isdigit()
        if key.endswith("declared_mb") and digits and not value.strip().isascii():
            return (f"sets {key} to {value!r}, digits other than 0-9, which "
                    "MSTAR_WORKSPACE_BUFFER_MB refuses; write the number in 0-9")  # fmt: skip
        if value == "???":
            return (f"sets {key} to ???, which leaves the value composed before it as it was; "
                    f"give {key} a value, or leave it out")  # fmt: skip
        names = [value] if key.endswith(".owner") else value if key.endswith(".labels") else []
        if isinstance(names, list) and (odd := [n for n in names if not isinstance(n, str)]):
            written = json.dumps(odd[0])  # as YAML writes a boolean, a number or null
            return (f"sets {key} to {json.dumps(value)}, and {written} would become the name "
                    f"{str(odd[0])!r}; quote it ('{written}') if a name is meant")  # fmt: skip
        if isinstance(value, dict):
            stack += [(f"{key}.{k}", v) for k, v in value.items()]
    if "hydra" in body:
        return ("sets hydra, Hydra's own settings, which a deployment does not take (an app's "
                "Hydra settings are its primary config's); take the hydra: block out of the "
                "file")  # fmt: skip
    tree = [field.name for field in dataclasses.fields(ComposedTree)]
    own = [field.name for field in dataclasses.fields(settings)]
    if extra := [str(key) for key in body if key in own and key not in tree]:
        return (f"sets {', '.join(extra)}, the app's own settings, which its primary config "
                f"would override without a word: give them on the command line ({extra[0]}=...), "
                f"and declare only {', '.join(tree)} in a deployment; take them out of the "
                "file")  # fmt: skip
    return None


def _quoting_hint(override: str) -> str:
    """How to write ``key=value`` where it is no override but is meant as one (no ``=``, spaces
    around it, two of them), or to quote a value holding Hydra's grammar, else ""."""
    key, equals, value = override.partition("=")
    if not equals:
        return f"; a setting is one word, KEY=VALUE: {key.strip() or 'KEY'}=VALUE"
    if key != key.rstrip() or value.startswith((" ", "=")):
        return f"; write it as one KEY=VALUE: {key.strip()}={value.lstrip(' =')}"
    odd = [c for c in value if not c.isascii() or c in "= '\"\\"]
    if not odd or value[0] in "'\"":
        return ""
    if odd[0].isdigit():  # quoted, it would pass as the number int() reads in it
        return (f"; the value holds {odd[0]!r}, a digit of another script: write numbers in "
                "ASCII digits (0-9)")  # fmt: skip
    items = ",".join(f"'{item.strip()}'" for item in value[1:-1].split(","))
    quoted = f"{key}=[{items}]" if value[0] + value[-1] == "[]" else f"{key}='{value}'"
    return (f"; the value holds {odd[0]!r}, which Hydra reads only in quotes: give it as "
            f'"{quoted}" (the double quotes for the shell)')  # fmt: skip


def not_a_choice(
    group: str, name: str, options: list[str], why: str = "", *, closest: bool = True,
    config_dir: Path | None = None,
) -> str:  # fmt: skip
    """``group=name`` picks no option of ``group``: the closest (where ``closest``), and all
    (``config_dir``: the ``--config-dir`` given, which calibrating takes too)."""
    if not options:
        return (f"{group}={name} is not a {group}: the search path holds no {group} options to "
                f"pick from; leave {group} out, or add --config-dir DIR with a {group}/ "
                "folder")  # fmt: skip
    offered = [o for o in options if not (group == DEPLOYMENT_GROUP and o == NO_DEPLOYMENT)]
    base = name.removesuffix("_calibrated")
    if group == DEPLOYMENT_GROUP and base != name and base in options:  # not calibrated yet
        given = f"--config-dir {config_dir} " if config_dir else ""
        return (f"{group}={name} is not a {group} yet: `mstar-resources-calibrate {given}"
                f"{group}={base}` writes it, on the GPU {base} runs on; pick one of "
                f"{', '.join(options)}")  # fmt: skip
    close = did_you_mean(name, offered) if closest else ""
    with contextlib.suppress(OSError):  # a name too long for a file's
        if config_dir and (config_dir / group / f"{name}.yml").is_file():
            close = f" (Hydra reads a {group} as NAME.yaml: rename {name}.yml {name}.yaml)"
    noun = "resource tree" if group == "resources" else group
    return (f"{group}={name} is not a {noun}{why}{close}; "
            f"pick one of {', '.join(options)}")  # fmt: skip


def not_a_primary_config(name: str, configs: list[str]) -> str:
    """``--config-name=name`` is no primary config of the search path, which holds ``configs``."""
    folder, _, stem = name.rstrip("/").rpartition("/")
    own = (f" (for the file itself: --config-dir {folder or '/'} --config-name "
           f"{stem.removesuffix('.yaml')})") if folder or name.startswith("/") else ""  # fmt: skip
    there = f"pick one of {', '.join(configs)}" if configs else "it holds none"
    return (f"--config-name={name} is not a config of this app{did_you_mean(name, configs)}; "
            f"{there}, or add --config-dir DIR for one of your own{own}")  # fmt: skip


def not_yaml(error: yaml.YAMLError) -> str:
    """A config file PyYAML can't read: the file, the line and column, and what it found."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if not isinstance(error, yaml.MarkedYAMLError) or not isinstance(mark, yaml.Mark):
        return f"a config file is not valid YAML: {_paragraph(str(error))}; fix the file"
    return (f"{mark.name} is not valid YAML at line {mark.line + 1}, column {mark.column + 1}: "
            f"{f'{error.context}, ' if error.context else ''}{error.problem or 'not valid YAML'}; "
            "fix the file there")  # fmt: skip


def _bad_value(error: ValidationError) -> str:
    parent, setting = error.parent_node, re.sub(r"\[\d+\]$", "", str(error.full_key))
    if isinstance(parent, ListConfig):  # an element of a list: the list's own field says
        parent = OmegaConf.select(parent, "..")
    schema = OmegaConf.get_type(parent) if isinstance(parent, DictConfig) else None
    fields = dataclasses.fields(schema) if dataclasses.is_dataclass(schema) else ()
    name = setting.rpartition(".")[2]
    said = next((f.metadata.get("expects") for f in fields if f.name == name), None)
    child = error.child_node
    if said is None and isinstance(child, EnumNode):
        said = "one of " + ", ".join(member.name for member in child.enum_type)
    found = (text for node_type, text in NODE_EXPECTS.items() if isinstance(child, node_type))
    takes = said or next(found, None) or _paragraph(error.msg or str(error))
    return f"{error.full_key}={error.value!r} is not valid; {setting} takes {takes}"


def _paragraph(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())
