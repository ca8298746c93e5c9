"""Where a workspace's floor comes from: its declared size, else the environment, else 512 MB."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..errors import ResourceConfigError
from ..units import MIB, is_int

ENV_VAR = "MSTAR_WORKSPACE_BUFFER_MB"
"""The variable that sets the floor of every workspace whose resource declares none."""

DEFAULT_MB = 512
"""The floor when neither a resource nor the environment sets one."""

MAX_MB = 1 << 20
"""The largest floor a setting may declare: 1 TiB, more than any GPU holds, so a larger value is a
typo (and would overflow the float that a report divides it by)."""

FloorSource = Literal["declared", "env", "default"]


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


def mb_problem(setting: str, value: object) -> str | None:
    """What is wrong with ``value`` as a floor in MB for ``setting``, or None if it is usable."""
    if is_int(value) and 0 < value <= MAX_MB:
        return None
    if is_int(value) and value > MAX_MB:
        return (
            f"{setting}={_shown(value)} MB is more than {MAX_MB:,} (1 TiB, more than any GPU "
            f"holds); declare the workspace's floor in MB, e.g. {setting}=256"
        )
    return (
        f"{setting}={value!r} is not a positive whole number of MB; declare the workspace's floor "
        f"in MB, at most {MAX_MB:,} (1 TiB, more than any GPU holds; e.g. {setting}=256), or "
        f"leave it unset for {ENV_VAR} or the default of {DEFAULT_MB}"
    )


def resolve_floor(
    declared_mb: int | None = None,
    env: Mapping[str, str] | None = None,
    declared_setting: str = "declared_mb",
) -> Floor:
    """The floor for ``declared_mb`` under ``env`` (``os.environ`` by default).

    ``declared_setting`` names the setting that declared it, for messages and provenance.
    """
    if declared_mb is not None:
        problem = mb_problem(declared_setting, declared_mb)
        if problem is not None:
            raise ResourceConfigError(problem)
        return Floor(declared_mb, "declared", declared_setting)
    raw = (os.environ if env is None else env).get(ENV_VAR, "")
    if not isinstance(raw, str):
        raise ResourceConfigError(
            f"{ENV_VAR}={raw!r} is not a string; the environment holds strings, so give it as "
            f"one (e.g. {{{ENV_VAR!r}: '{raw}'}})"
        )
    if raw.strip() == "":
        return Floor(DEFAULT_MB, "default", ENV_VAR)
    text = raw.strip()
    # Digits only, and few enough that int() stays cheap: a longer number is out of range anyway.
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None
    if value is None or not 0 < value <= MAX_MB:
        raise ResourceConfigError(
            f"{ENV_VAR}={raw!r} is not a positive whole number of MB; set it to one, at most "
            f"{MAX_MB:,} (1 TiB, more than any GPU holds; e.g. {ENV_VAR}=256), or unset it for "
            f"the default of {DEFAULT_MB}"
        )
    return Floor(value, "env", ENV_VAR)


def _shown(value: int) -> str:
    """``value`` with thousands separators, or its length where it is too long to read (or for
    Python to print: ints of more than 4,300 digits refuse ``str``)."""
    if value.bit_length() <= 200:  # up to 60 digits
        return f"{value:,}"
    digits = max(1, int(value.bit_length() * 0.30103) - 1)  # log10(2): at most the count
    while 10**digits <= value:
        digits += 1
    return f"<a number of {digits:,} digits>"
