"""A setting's limits, stated once on its schema field and checked by one routine.

A field says what it takes in its metadata: ``expects`` (what an error calls a good value, e.g.
``a whole number of layers``) and any of the bounds ``gt``, ``ge``, ``lt``, ``le`` (as vLLM's config
fields do). :func:`problems` checks values against every bounded field of a schema, and
:func:`expects` is how an error describes a field, its bounds included.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping
from typing import Any

from ..errors import Problem
from .floor import number_text

__all__ = ["MAX_NAME", "bounds", "expects", "name_problem", "problems"]

MAX_NAME = 128
"""The most characters an owner or a label may have: each is printed in every table row, log line
and error that names a workspace."""

_BOUNDS = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le}


def bounds(expects: str, **limits: float) -> dict[str, Any]:
    """A field's metadata: what it takes and its bounds (``bounds("a whole number", ge=1)``)."""
    unknown = set(limits) - set(_BOUNDS)
    if unknown:
        raise TypeError(f"unknown bounds {sorted(unknown)}; use {', '.join(_BOUNDS)}")
    return {"expects": expects, **limits}


def _text(number: float) -> str:
    """A bound or a value as a message writes it: a whole number with thousands separators."""
    if isinstance(number, int) and not isinstance(number, bool):
        return number_text(number)
    return repr(number)


def _bounds_text(metadata: Mapping[str, Any]) -> str:
    low = ("above", metadata["gt"]) if "gt" in metadata else ("at least", metadata.get("ge"))
    high = ("below", metadata["lt"]) if "lt" in metadata else ("at most", metadata.get("le"))
    if low[1] is not None and high[1] is not None:
        if "gt" in metadata and "lt" in metadata:
            return f"between {_text(low[1])} and {_text(high[1])}"
        return f"{low[0]} {_text(low[1])} and {high[0]} {_text(high[1])}"
    word, value = low if low[1] is not None else high
    return "" if value is None else f"{word} {_text(value)}"


def expects(field: dataclasses.Field[Any]) -> str | None:
    """What ``field`` takes, in words, its bounds included; None where it does not say."""
    if "expects" not in field.metadata:
        return None
    bounds = _bounds_text(field.metadata)
    return f"{field.metadata['expects']}, {bounds}" if bounds else str(field.metadata["expects"])


def problems(values: Any, schema: type, prefix: str = "") -> list[str]:
    """One sentence for each bounded field of the dataclass ``schema`` whose value in ``values``
    (an instance, or a mapping such as a DictConfig) is out of its bounds, in field order; a null
    is the field type's business."""
    found: list[str] = []
    for field in dataclasses.fields(schema):
        limits = {name: field.metadata[name] for name in _BOUNDS if name in field.metadata}
        value = values[field.name] if isinstance(values, Mapping) else getattr(values, field.name)
        if not limits or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        setting, bounds = f"{prefix}{field.name}", _bounds_text(field.metadata)
        if not math.isfinite(value):
            text = f"{setting}={value!r} is not a finite number; it must be {bounds}"
        elif not all(_BOUNDS[name](value, limit) for name, limit in limits.items()):
            text = f"{setting}={_text(value)} must be {bounds}"
        else:
            continue
        found.append(
            Problem(
                f"{text} ({field.metadata['expects']})",
                setting=setting,
                value=value,
                expects=expects(field),
            )
        )
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
