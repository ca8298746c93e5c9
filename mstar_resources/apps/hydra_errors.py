"""Hydra's and OmegaConf's compose errors told as one sentence, from the exceptions' fields.

Hydra reports a misspelled key with advice to append it with ``+`` (which only leads to another
error) and a bad value in OmegaConf's words over several lines. The exceptions carry what happened
as data (the full key, the value, the node it was meant for, a group's options), so the sentence is
built from that: the setting, the bad value, what it takes, and the closest valid name.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from enum import Enum

import yaml
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
    ValidationError,
)
from omegaconf.nodes import BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode

from .._internal import limits
from ..errors import did_you_mean
from ..schema import Resource

DEPLOYMENT_GROUP = "deployment"
"""The config group whose options are global (``# @package _global_``): a deployment sets keys of
the whole tree."""

OPTION_NOUNS = {"resources": "resource tree"}
"""What one option of a config group is called, where the group's name is not it."""

NO_DEPLOYMENT = "none"
"""The shipped tree's empty deployment: listed among the options, never offered as the closest to
a misspelt name (it is no deployment, and calibration and the replay refuse it)."""

__all__ = [
    "DEPLOYMENT_GROUP",
    "NO_DEPLOYMENT",
    "explain",
    "not_a_choice",
    "not_a_primary_config",
    "not_utf8",
    "not_yaml",
]

_NODE_EXPECTS: list[tuple[type, str]] = [
    (BooleanNode, "true or false"),
    (IntegerNode, "a whole number"),
    (FloatNode, "a number"),
    (StringNode, "a string"),
    (ListConfig, "a list, e.g. [a, b]"),
    (DictConfig, "a mapping, e.g. {key: value}"),
]


def explain(error: BaseException) -> str:
    """``error``, raised while composing a config, as one paragraph that names the setting."""
    if isinstance(error, MissingConfigException) and error.options is not None:
        return _missing_option(error.missing_cfg_file or "", list(error.options))
    if isinstance(error, OverrideParseException):
        told = f"{error.override!r} is not an override Hydra can read: {_paragraph(error.message)}"
        return told + _quoting_hint(error.override)
    # Hydra raises its own error from inside the handler of OmegaConf's (a value of a config file
    # the schema refuses), or ``from`` it (one on the command line): the context or the cause.
    cause = (
        error if isinstance(error, OmegaConfBaseException) else error.__cause__ or error.__context__
    )
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and cause.full_key:
        return _unknown_key(cause)
    if isinstance(cause, ValidationError) and cause.full_key:
        return _bad_value(cause)
    if isinstance(cause, OmegaConfBaseException) and cause is not error:
        # Hydra's own sentence ("Error merging override ~calibration.model") says what it was
        # doing; OmegaConf's, the first line of its cause, says why it could not.
        reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        if reason not in str(error):
            return _paragraph(f"{error}: {reason}")
    return _paragraph(str(error))


def _quoting_hint(override: str) -> str:
    """How to quote the value of ``key=value`` where it holds what Hydra reads unquoted as
    grammar (``=``, non-ASCII characters, spaces, quotes); "" where it does not."""
    key, sep, value = override.partition("=")
    if not sep or not value or value[0] in "'\"":
        return ""
    odd = [c for c in value if not c.isascii() or c in "= '\"\\"]
    if not odd:
        return ""
    if odd[0].isdigit():  # quoted, it would pass as the number int() reads in it
        return (
            f"; the value holds {odd[0]!r}, a digit of another script: write numbers in ASCII "
            "digits (0-9)"
        )
    if value.startswith("[") and value.endswith("]"):
        items = ",".join(f"'{item.strip()}'" for item in value[1:-1].split(","))
        quoted = f"{key}=[{items}]"
    else:
        quoted = f"{key}='{value}'"
    return (
        f"; the value holds {odd[0]!r}, which Hydra reads only in quotes: give it as "
        f'"{quoted}" (the double quotes for the shell)'
    )


def _missing_option(missing: str, options: list[str]) -> str:
    group, name = posixpath.split(missing)
    return not_a_choice(group, name, options)


def not_a_choice(
    group: str, name: str, options: list[str], why: str = "", *, closest: bool = True
) -> str:
    """``group=name`` picks no option of config group ``group``: the closest (where ``closest``),
    and all of them; ``why``, where given, says what is wrong with ``name``."""
    if not options:
        return (
            f"{group}={name} is not a {group}: the search path holds no {group} options to pick "
            f"from; leave {group} out, or add --config-dir DIR with a {group}/ folder"
        )
    offered = [o for o in options if not (group == DEPLOYMENT_GROUP and o == NO_DEPLOYMENT)]
    noun = OPTION_NOUNS.get(group, group)
    return (
        f"{group}={name} is not a {noun}{why}{did_you_mean(name, offered) if closest else ''}; "
        f"pick one of {', '.join(options)}"
    )


def not_a_primary_config(name: str, configs: list[str]) -> str:
    """``--config-name=name`` is no primary config of the search path, which holds ``configs``."""
    folder, _, stem = name.rstrip("/").rpartition("/")
    own = (
        f" (for the file itself: --config-dir {folder or '/'} --config-name "
        f"{stem.removesuffix('.yaml')})"
        if folder or name.startswith("/")
        else ""
    )
    there = f"pick one of {', '.join(configs)}" if configs else "it holds none"
    return (
        f"--config-name={name} is not a config of this app{did_you_mean(name, configs)}; "
        f"{there}, or add --config-dir DIR for one of your own{own}"
    )


def not_yaml(error: yaml.YAMLError) -> str:
    """A config file PyYAML can't read: the file, the line and column, and what it found."""
    mark = (
        error.problem_mark or error.context_mark
        if isinstance(error, yaml.MarkedYAMLError)
        else None
    )
    if not isinstance(error, yaml.MarkedYAMLError) or mark is None:
        return f"a config file is not valid YAML: {_paragraph(str(error))}; fix the file"
    context = f"{error.context}, " if error.context else ""
    return (
        f"{mark.name} is not valid YAML at line {mark.line + 1}, column {mark.column + 1}: "
        f"{context}{error.problem or 'not valid YAML'}; fix the file there"
    )


def not_utf8(path: str, data: bytes, error: UnicodeDecodeError) -> str:
    """Config file ``path``, whose bytes ``data`` fail to decode as ``error`` says."""
    line = data.count(b"\n", 0, error.start) + 1
    return (
        f"{path} is not UTF-8 text: byte 0x{data[error.start]:02x} at line {line} "
        f"({error.reason}); save the file as UTF-8"
    )


def _unknown_key(error: OmegaConfBaseException) -> str:
    parent = error.parent_node
    if not isinstance(parent, DictConfig):
        return _paragraph(str(error))
    prefix = _prefix(str(error.full_key))
    settings = [str(key) for key in parent if key != "hydra"]
    if str(error.full_key) == DEPLOYMENT_GROUP:
        return (
            f"{DEPLOYMENT_GROUP} is not a setting: a deployment file was composed under the key "
            f"{DEPLOYMENT_GROUP} instead of at the top of the config; its first line must be "
            "`# @package _global_`, with no byte-order mark before it, as in the shipped "
            "deployments (an empty file has no such line)"
        )
    if not settings:
        holder = prefix.rstrip(".") or "the config"
        return (
            f"{error.full_key} is not a setting: {holder} is empty as composed, so there is "
            f"nothing under it to set; compose an option that fills {holder} first "
            "(e.g. deployment=NAME)"
        )
    resource_fields = {item.name for item in dataclasses.fields(Resource)}
    if str(error.key) in resource_fields and resource_fields & set(settings):
        # A resource declared in a user's YAML without the schema has only the keys it wrote.
        return (
            f"{error.full_key} is a resource's setting, and {prefix.rstrip('.')} is declared "
            f"without it; add it with a plus: +{error.full_key}=VALUE"
        )
    return (
        f"{error.full_key} is not a setting{did_you_mean(str(error.key), settings, prefix)}; "
        f"{prefix.rstrip('.') or 'the config'} takes {', '.join(settings)}"
    )


def _bad_value(error: ValidationError) -> str:
    parent, setting = error.parent_node, _LIST_INDEX.sub("", str(error.full_key))
    if isinstance(parent, ListConfig):  # an element of a list: the list's own field says
        parent = OmegaConf.select(parent, "..")  # the node holding the list
    key = setting.rpartition(".")[2]
    takes = _expects(error, parent, key)
    return f"{error.full_key}={error.value!r} is not valid; {setting} takes {takes}"


def _expects(error: ValidationError, parent: object, key: object) -> str:
    """What ``parent.key`` takes: the schema field's own words where it has them."""
    schema = OmegaConf.get_type(parent) if isinstance(parent, DictConfig) else None
    if schema is not None and dataclasses.is_dataclass(schema):
        for field in dataclasses.fields(schema):
            if field.name == key and (said := limits.expects(field)) is not None:
                return said
    child = error.child_node
    if isinstance(child, EnumNode) and issubclass(child.enum_type, Enum):
        return "one of " + ", ".join(member.name for member in child.enum_type)
    for node_type, expects in _NODE_EXPECTS:
        if isinstance(child, node_type):
            return expects
    return _paragraph(error.msg or str(error))


_LIST_INDEX = re.compile(r"\[\d+\]$")


def _prefix(full_key: str) -> str:
    """The full key of the node holding ``full_key``, with a trailing dot; "" at the root."""
    parent = full_key.rpartition(".")[0]
    return f"{parent}." if parent else ""


def _paragraph(text: str) -> str:
    """``text``'s lines joined as one paragraph."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())
