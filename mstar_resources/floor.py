"""Where a workspace's floor comes from: its declared size, else the environment, else a default
(the float workspace's and the int workspace's, each a :class:`Buffer`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from .errors import Problem, ResourceConfigError
from .units import MIB, is_int

ENV_VAR = "MSTAR_WORKSPACE_BUFFER_MB"

MAX_MB = 1 << 20
"""The largest floor a setting may declare: 1 TiB, more than any GPU holds, so a larger value is a
typo (and would overflow the float that a report divides it by)."""

WHOLE_NUMBER = re.compile(r"\+?[0-9]+(?:_[0-9]+)*")
"""A floor given as text, by Hydra's grammar for an integer (``+8``, ``1_000``, ``012``)."""


@dataclass(frozen=True)
class Buffer:
    """One kind of workspace buffer: where its floor is read when its resource declares none."""

    kind: Literal["float", "int"]
    env_var: str
    default_mb: int
    declared_key: str  # the resource field that declares it
    size_query_index: int  # its place in FlashInfer's ``workspace_size()`` answer (float, int)


FLOAT = Buffer("float", ENV_VAR, 512, "declared_mb", 0)
INT = Buffer("int", "MSTAR_INT_WORKSPACE_BUFFER_MB", 8, "int_declared_mb", 1)
"""8 MB: what each FlashInfer wrapper allocates itself (``torch.empty(8 * 1024 * 1024)``)."""


@dataclass(frozen=True)
class Floor:
    """A workspace floor, where it came from, and the setting that controls it."""

    mb: int
    source: Literal["declared", "env", "default"]
    setting: str  # what to change to move this floor: the declaring setting, or the variable

    @property
    def bytes(self) -> int:
        return self.mb * MIB


def mb_problem(
    setting: str, value: object, buffer: Buffer = FLOAT, *, given: object = None
) -> Problem | None:
    """What is wrong with ``value`` as a floor in MB for ``setting`` (``given``: the text it was
    read from), or None. An int floor may be 0, but not through its variable."""
    variable = setting == buffer.env_var
    lowest = 0 if buffer is INT and not variable else 1
    if value is None or (is_int(value) and lowest <= value <= MAX_MB):
        return None
    default = f"the default of {buffer.default_mb}"
    fallback = default if variable else f"{buffer.env_var} or {default}"
    advice = "set it to one" if variable else "declare the workspace's floor in MB"
    if is_int(value) and value > MAX_MB:
        text = (
            f"{setting}={number_text(value)} MB is more than {MAX_MB:,} (1 TiB, more than any GPU "
            f"holds); {advice}, e.g. {setting}=256"
        )
    else:
        what = "a positive whole number of MB" if lowest else "a whole number of MB (0: none)"
        shown = repr(value)
        if isinstance(value, str) and len(value) > 40:  # cut, with its length
            shown = f"{value[:40]!r}... ({len(value):,} characters)"
        text = (
            f"{setting}={shown} is not {what}; {advice}, at most {MAX_MB:,} (1 TiB, more than any "
            f"GPU holds; e.g. {setting}=256), or {'unset it' if variable else 'leave it unset'} "
            f"for {fallback}"
        )
    return Problem(
        text,
        setting=setting,
        value=value if given is None else given,
        expects=f"a whole number of MB from {lowest} to {MAX_MB:,}",
        fix=f"unset {setting} for {fallback}",
    )


MAX_DIGITS = 60
"""More digits than this are past any floor (and past what Python prints of an int)."""


def read_mb(setting: str, text: str, buffer: Buffer = FLOAT) -> int:
    """The whole number of MB ``text`` spells by :data:`WHOLE_NUMBER`, spaces around it left out."""
    stripped, number = text.strip(), None
    if WHOLE_NUMBER.fullmatch(stripped):
        digits = stripped.lstrip("+").replace("_", "").lstrip("0") or "0"
        # Past MAX_DIGITS only the count of digits is told (int() refuses 4,300 and more).
        number = int(digits) if len(digits) <= MAX_DIGITS else 10 ** (len(digits) - 1)
    if problem := mb_problem(setting, text if number is None else number, buffer, given=text):
        raise ResourceConfigError(problem)
    return cast(int, number)


def resolve_floor(
    declared_mb: int | str | None = None,
    env: Mapping[str, str] | None = None,
    declared_setting: str | None = None,
    buffer: Buffer = FLOAT,
) -> Floor:
    """The floor of a ``buffer`` for ``declared_mb`` under ``env`` (``os.environ`` by default)."""
    setting = declared_setting or buffer.declared_key
    if isinstance(declared_mb, str):
        declared_mb = read_mb(setting, declared_mb, buffer)
    if declared_mb is not None:
        if problem := mb_problem(setting, declared_mb, buffer):
            raise ResourceConfigError(problem)
        return Floor(declared_mb, "declared", setting)
    var = buffer.env_var
    raw = (os.environ if env is None else env).get(var, "")
    if not isinstance(raw, str):
        text = (
            f"{var}={raw!r} is not a string; the environment holds strings, so give it as one "
            f"(e.g. {{{var!r}: '{raw}'}})"
        )
        raise ResourceConfigError(Problem(text, setting=var, value=raw, expects="a string"))
    if raw.strip() == "":
        return Floor(buffer.default_mb, "default", var)
    return Floor(read_mb(var, raw, buffer), "env", var)


def number_text(value: int) -> str:
    """``value`` with thousands separators, or its length where it is too long to read (or for
    Python to print: ints of more than 4,300 digits refuse ``str``)."""
    if value.bit_length() <= 200:  # up to 60 digits
        return f"{value:,}"
    digits = int(value.bit_length() * 0.30103) - 1  # log10(2): at most the count
    while 10**digits <= value:
        digits += 1
    return f"<a number of {digits:,} digits>"
