"""A setting's limits, stated once in its schema field's metadata (``expects``: what an error
calls a good value; the bounds ``ge``, ``le``) and checked by one routine."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from ..errors import Problem
from ..units import is_int
from .floor import number_text

__all__ = ["MAX_NAME", "bounds", "expects", "name_problem", "problems"]

MAX_NAME = 128
"""The most characters an owner or a label may have: each is printed in every table row, log line
and error that names a workspace."""


def bounds(expects: str, *, ge: float | None = None, le: float | None = None) -> dict[str, Any]:
    """A field's metadata: what it takes and its bounds (``bounds("a whole number", ge=1)``)."""
    return {"expects": expects, "ge": ge, "le": le}


def _text(number: float) -> str:
    """A bound or a value as a message writes it: a whole number with thousands separators."""
    return number_text(number) if is_int(number) else repr(number)


def _bounds_text(metadata: Mapping[str, Any]) -> str:
    words = {"ge": "at least", "le": "at most"}
    said = [f"{words[k]} {_text(metadata[k])}" for k in words if metadata.get(k) is not None]
    return " and ".join(said)


def expects(field: dataclasses.Field[Any]) -> str | None:
    """What ``field`` takes, in words, its bounds included; None where it does not say."""
    if "expects" not in field.metadata:
        return None
    bounds = _bounds_text(field.metadata)
    return f"{field.metadata['expects']}, {bounds}" if bounds else str(field.metadata["expects"])


def problems(values: Any, schema: type) -> list[str]:
    """One sentence for each bounded field of the dataclass ``schema`` whose value in ``values``
    (an instance, or a mapping such as a DictConfig) is out of its bounds, in field order; a null
    is the field type's business."""
    found: list[str] = []
    for field in dataclasses.fields(schema):
        setting, bounds = field.name, _bounds_text(field.metadata)
        ge, le = field.metadata.get("ge"), field.metadata.get("le")
        value = values[setting] if isinstance(values, Mapping) else getattr(values, setting)
        if not bounds or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isfinite(value):
            text = f"{setting}={value!r} is not a finite number; it must be {bounds}"
        elif (ge is not None and value < ge) or (le is not None and value > le):
            text = f"{setting}={_text(value)} must be {bounds}"
        else:
            continue
        text += f" ({field.metadata['expects']})"
        found.append(Problem(text, setting=setting, value=value, expects=expects(field)))
    return found


def name_problem(setting: str, value: object) -> str | None:
    """What is wrong with ``value`` as a name (an owner, a label) that tables and logs print: it
    must be a string of printable characters, not blank, at most :data:`MAX_NAME` long; None if it
    is fine. ``setting`` is how the message names it (``owner``, ``labels[1]``)."""
    if not isinstance(value, str) or not value.strip():
        return None  # blank or not a string: the callers' own checks say how to fill it in
    if len(value) > MAX_NAME:
        return (
            f"{setting} has {len(value):,} characters ({value[:20]!r}...); a name has at most "
            f"{MAX_NAME}"
        )
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return (
            f"{setting}={value!r} holds the control character {bad!r}, which would break the "
            "tables and logs that print it; use letters, digits and punctuation"
        )
    return None
