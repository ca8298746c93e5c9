"""Where a workspace's floor comes from: its declared size, else the environment, else a default.

Two buffers of a FlashInfer wrapper have floors: the float workspace (``declared_mb``, else
``MSTAR_WORKSPACE_BUFFER_MB``, else 512 MB) and the int workspace with its host mirror
(``int_declared_mb``, else ``MSTAR_INT_WORKSPACE_BUFFER_MB``, else 8 MB, FlashInfer's own size).
Each :class:`Buffer` says which variable and default are its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..errors import Problem, ResourceConfigError
from ..units import MIB, is_int

ENV_VAR = "MSTAR_WORKSPACE_BUFFER_MB"
"""The variable that sets the floor of every float workspace whose resource declares none."""

DEFAULT_MB = 512
"""The float floor when neither a resource nor the environment sets one."""

INT_ENV_VAR = "MSTAR_INT_WORKSPACE_BUFFER_MB"
"""The variable that sets the floor of every int workspace whose resource declares none."""

INT_DEFAULT_MB = 8
"""The int floor when neither a resource nor the environment sets one: what each FlashInfer
wrapper allocates for itself (``torch.empty(8 * 1024 * 1024)`` in its ``__init__``)."""

MAX_MB = 1 << 20
"""The largest floor a setting may declare: 1 TiB, more than any GPU holds, so a larger value is a
typo (and would overflow the float that a report divides it by)."""

FloorSource = Literal["declared", "env", "default"]

WHOLE_NUMBER = re.compile(r"\+?[0-9]+(?:_[0-9]+)*")
"""A floor given as text, by the command line's rule (Hydra's grammar for an integer): ASCII
digits, an optional ``+``, ``_`` between digits (``+8``, ``1_000``, ``012``)."""


@dataclass(frozen=True)
class Buffer:
    """One kind of workspace buffer: where its floor is read when its resource declares none."""

    kind: Literal["float", "int"]
    env_var: str
    default_mb: int
    declared_key: str
    """The resource field that declares it."""
    size_query_index: int
    """Where its bytes are in the answer of FlashInfer's ``workspace_size()`` (float, int)."""


FLOAT = Buffer("float", ENV_VAR, DEFAULT_MB, "declared_mb", 0)
INT = Buffer("int", INT_ENV_VAR, INT_DEFAULT_MB, "int_declared_mb", 1)


@dataclass(frozen=True)
class Floor:
    """A workspace floor, where it came from, and the setting that controls it."""

    mb: int
    source: FloorSource
    setting: str
    """What to change to move this floor: the declaring setting's name, or ``ENV_VAR``."""

    @property
    def bytes(self) -> int:
        return self.mb * MIB


def mb_problem(setting: str, value: object, buffer: Buffer = FLOAT) -> Problem | None:
    """What is wrong with ``value`` as a floor in MB for ``setting``, or None if it is usable."""
    lowest = 0 if buffer.kind == "int" else 1  # an int floor of 0: the wrappers keep their own
    if is_int(value) and lowest <= value <= MAX_MB:
        return None
    expects = f"a whole number of MB from {lowest} to {MAX_MB:,}"
    if is_int(value) and value > MAX_MB:
        return Problem(
            f"{setting}={number_text(value)} MB is more than {MAX_MB:,} (1 TiB, more than any GPU "
            f"holds); declare the workspace's floor in MB, e.g. {setting}=256",
            setting=setting,
            value=value,
            expects=expects,
        )
    what = "a positive whole number of MB" if lowest else "a whole number of MB (0: none)"
    return Problem(
        f"{setting}={value!r} is not {what}; declare the workspace's floor in MB, at most "
        f"{MAX_MB:,} (1 TiB, more than any GPU holds; e.g. {setting}=256), or leave it unset "
        f"for {buffer.env_var} or the default of {buffer.default_mb}",
        setting=setting,
        value=value,
        expects=expects,
        fix=f"unset {setting} for {buffer.env_var} or the default of {buffer.default_mb}",
    )


def _digits(text: str) -> str | None:
    """The digits ``text`` spells by the command line's rule (:data:`WHOLE_NUMBER`; spaces
    around it, the ``+``, the ``_`` and leading zeros left out), or None where it spells none."""
    stripped = text.strip()
    if not WHOLE_NUMBER.fullmatch(stripped):
        return None
    return stripped.lstrip("+").replace("_", "").lstrip("0") or "0"


def _quote(text: str) -> str:
    """``text`` as a message quotes it: cut, with its length, where it is too long to read."""
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text):,} characters)"


MAX_DIGITS = 60
"""More digits than this are past any floor (and past what Python prints of an int)."""


def declared_text(setting: str, text: str) -> int:
    """A floor declared as text (a config value from an interpolation, ``size_mb="8"``) as the
    whole number it spells by the command line's rule (:data:`WHOLE_NUMBER`, surrounding spaces
    left out), the rule the variables follow too; else :class:`ResourceConfigError` naming
    ``setting``. Arabic-Indic or fullwidth digits spell no number here, as on the command line."""
    digits = _digits(text)
    expects = f"a whole number of MB from 1 to {MAX_MB:,}"
    if digits is None:
        raise ResourceConfigError(
            Problem(
                f"{setting}={_quote(text)} is not a whole number of MB as the command line "
                "writes one (ASCII digits, an optional + and _ between digits); declare the "
                f"floor in MB, e.g. {setting}=256",
                setting=setting,
                value=text,
                expects=expects,
            )
        )
    if len(digits) > MAX_DIGITS:
        raise ResourceConfigError(
            Problem(
                f"{setting}=<a number of {len(digits):,} digits> MB is more than {MAX_MB:,} (1 "
                f"TiB, more than any GPU holds); declare the floor in MB, e.g. {setting}=256",
                setting=setting,
                value=text,
                expects=expects,
            )
        )
    return int(digits)


def resolve_floor(
    declared_mb: int | None = None,
    env: Mapping[str, str] | None = None,
    declared_setting: str | None = None,
    buffer: Buffer = FLOAT,
) -> Floor:
    """The floor of a ``buffer`` (the float workspace by default) for ``declared_mb`` under
    ``env`` (``os.environ`` by default).

    ``declared_setting`` names the setting that declared it (by default the resource field,
    ``declared_mb`` or ``int_declared_mb``), for messages and provenance.
    """
    declared_setting = declared_setting or buffer.declared_key
    var = buffer.env_var
    if isinstance(declared_mb, str):
        declared_mb = declared_text(declared_setting, declared_mb)
    if declared_mb is not None:
        problem = mb_problem(declared_setting, declared_mb, buffer)
        if problem is not None:
            raise ResourceConfigError(problem)
        return Floor(declared_mb, "declared", declared_setting)
    raw = (os.environ if env is None else env).get(var, "")
    if not isinstance(raw, str):
        raise ResourceConfigError(
            Problem(
                f"{var}={raw!r} is not a string; the environment holds strings, so give it as "
                f"one (e.g. {{{var!r}: '{raw}'}})",
                setting=var,
                value=raw,
                expects="a string",
            )
        )
    if raw.strip() == "":
        return Floor(buffer.default_mb, "default", var)
    digits = _digits(raw)
    expects = f"a whole number of MB from 1 to {MAX_MB:,}"
    if digits is None:
        raise ResourceConfigError(
            Problem(
                f"{var}={_quote(raw)} is not a positive whole number of MB; set it to one, "
                f"at most {MAX_MB:,} (1 TiB, more than any GPU holds; e.g. {var}=256), or unset "
                f"it for the default of {buffer.default_mb}",
                setting=var,
                value=raw,
                expects=expects,
                fix=f"unset {var} for the default of {buffer.default_mb}",
            )
        )
    value = int(digits) if len(digits) <= MAX_DIGITS else None
    if value is None or not 0 < value <= MAX_MB:
        size = number_text(value) if value is not None else f"<a number of {len(digits):,} digits>"
        raise ResourceConfigError(
            Problem(
                f"{var}={size} MB is "
                + (
                    "not positive"
                    if value == 0
                    else f"more than {MAX_MB:,} (1 TiB, more than any GPU holds)"
                )
                + f"; set it to a whole number of MB from 1 to {MAX_MB:,} (e.g. {var}=256), or "
                f"unset it for the default of {buffer.default_mb}",
                setting=var,
                value=raw,
                expects=expects,
                fix=f"unset {var} for the default of {buffer.default_mb}",
            )
        )
    return Floor(value, "env", var)


def number_text(value: int) -> str:
    """``value`` with thousands separators, or its length where it is too long to read (or for
    Python to print: ints of more than 4,300 digits refuse ``str``)."""
    if value.bit_length() <= 200:  # up to 60 digits
        return f"{value:,}"
    digits = max(1, int(value.bit_length() * 0.30103) - 1)  # log10(2): at most the count
    while 10**digits <= value:
        digits += 1
    return f"<a number of {digits:,} digits>"
