"""Hydra's, OmegaConf's and PyYAML's compose errors as one sentence built from the exceptions'
fields: the setting, the bad value, what it takes and the closest valid name."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf, ValidationError
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException
from omegaconf.nodes import BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode

from .errors import did_you_mean
from .schema import FIELDS

__all__ = ["DEPLOYMENT_GROUP", "NO_DEPLOYMENT", "explain", "not_a_choice", "not_a_primary_config",
           "not_utf8", "not_yaml"]  # fmt: skip

DEPLOYMENT_GROUP = "deployment"  # its options are `# @package _global_`: keys of the whole tree
NO_DEPLOYMENT = "none"
"""The shipped tree's empty deployment: listed among the options, never offered as the closest to
a misspelt name (it is no deployment, and calibration refuses it)."""
NODE_EXPECTS: dict[type, str] = {BooleanNode: "true or false", IntegerNode: "a whole number",
                                 FloatNode: "a number", StringNode: "a string",
                                 ListConfig: "a list, e.g. [a, b]",
                                 DictConfig: "a mapping, e.g. {key: value}"}  # fmt: skip


def explain(error: BaseException, deployment_file: Path | None = None) -> str:
    """``error``, raised while composing a config, as one paragraph that names the setting;
    ``deployment_file``, the file of the deployment the line picks, where there is one."""
    if isinstance(error, MissingConfigException) and error.options is not None:
        group, _, name = (error.missing_cfg_file or "").rpartition("/")
        return not_a_choice(group, name, list(error.options))
    if isinstance(error, OverrideParseException):
        text = f"{error.override!r} is not an override Hydra can read: {_paragraph(error.message)}"
        return text + _quoting_hint(error.override)
    # Hydra raises its own error from inside the handler of OmegaConf's (a value of a config file
    # the schema refuses), or ``from`` it (one on the command line): the context or the cause.
    cause = error if isinstance(error, OmegaConfBaseException) else (
        error.__cause__ or error.__context__)  # fmt: skip
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and cause.full_key:
        return _unknown_key(cause, deployment_file)
    if isinstance(cause, ValidationError) and cause.full_key:
        return _bad_value(cause)
    if isinstance(cause, OmegaConfBaseException) and cause is not error:
        # Hydra's sentence ("Error merging override ~calibration.model") says what it was doing;
        # the first line of OmegaConf's, its cause, says why it could not.
        reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        if reason not in str(error):
            return _paragraph(f"{error}: {reason}")
    return _paragraph(str(error))


def _quoting_hint(override: str) -> str:
    """How to quote the value of ``key=value`` where it holds what Hydra reads as grammar, else
    ""."""
    key, _, value = override.partition("=")
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
    group: str, name: str, options: list[str], why: str = "", *, closest: bool = True
) -> str:
    """``group=name`` picks no option of config group ``group``: the closest (where ``closest``),
    and all of them; ``why``, where given, says what is wrong with ``name``."""
    if not options:
        return (f"{group}={name} is not a {group}: the search path holds no {group} options to "
                f"pick from; leave {group} out, or add --config-dir DIR with a {group}/ "
                "folder")  # fmt: skip
    offered = [o for o in options if not (group == DEPLOYMENT_GROUP and o == NO_DEPLOYMENT)]
    close = did_you_mean(name, offered) if closest else ""
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


def not_utf8(path: Path, data: bytes, error: UnicodeDecodeError) -> str:
    """Config file ``path``, whose bytes ``data`` are no UTF-8: the byte and its line."""
    line = data.count(b"\n", 0, error.start) + 1
    return (f"{path} is not UTF-8 text: byte 0x{data[error.start]:02x} at line {line} "
            f"({error.reason}); save the file as UTF-8")  # fmt: skip


def _unknown_key(error: OmegaConfBaseException, deployment_file: Path | None) -> str:
    parent, full_key = error.parent_node, str(error.full_key)
    if not isinstance(parent, DictConfig):
        return _paragraph(str(error))
    holder = full_key.rpartition(".")[0]
    prefix, at = f"{holder}." if holder else "", holder or "the config"
    settings = [str(key) for key in parent if key != "hydra"]
    if full_key == DEPLOYMENT_GROUP:
        file = f"the deployment file {deployment_file}" if deployment_file else "a deployment file"
        return (f"{DEPLOYMENT_GROUP} is not a setting: {file} was composed under the key "
                f"{DEPLOYMENT_GROUP} instead of at the top of the config; its first line must be "
                "`# @package _global_`, with no byte-order mark before it, as in the shipped "
                "deployments (an empty file has no such line)")  # fmt: skip
    if not settings:
        return (f"{full_key} is not a setting: {at} is empty as composed, so there is nothing "
                f"under it to set; compose an option that fills {at} first (e.g. "
                "deployment=NAME)")  # fmt: skip
    if str(error.key) in FIELDS and FIELDS.keys() & set(settings):
        # A resource declared in a user's YAML without the schema has only the keys it wrote.
        return (f"{full_key} is a resource's setting, and {holder} is declared without it; add "
                f"it with a plus: +{full_key}=VALUE")  # fmt: skip
    return (f"{full_key} is not a setting{did_you_mean(str(error.key), settings, prefix)}; "
            f"{at} takes {', '.join(settings)}")  # fmt: skip


def _bad_value(error: ValidationError) -> str:
    """``error.value`` refused for its setting, and what the setting takes."""
    parent, setting = error.parent_node, re.sub(r"\[\d+\]$", "", str(error.full_key))
    if isinstance(parent, ListConfig):  # an element of a list: the list's own field says
        parent = OmegaConf.select(parent, "..")
    schema = OmegaConf.get_type(parent) if isinstance(parent, DictConfig) else None
    fields = dataclasses.fields(schema) if dataclasses.is_dataclass(schema) else ()
    said = next(
        (f.metadata.get("expects") for f in fields if f.name == setting.rpartition(".")[2]), None
    )
    child = error.child_node
    if said is None and isinstance(child, EnumNode):
        said = "one of " + ", ".join(member.name for member in child.enum_type)
    found = (text for node_type, text in NODE_EXPECTS.items() if isinstance(child, node_type))
    takes = said or next(found, None) or _paragraph(error.msg or str(error))
    return f"{error.full_key}={error.value!r} is not valid; {setting} takes {takes}"


def _paragraph(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())
