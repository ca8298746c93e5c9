"""The rule for a name (an owner, a label) that tables, logs and errors print."""

from __future__ import annotations

MAX_NAME = 128
"""The most characters an owner or a label may have: tables, logs and errors print each."""


def name_problem(setting: str, value: object) -> str | None:
    """What is wrong with ``value`` as a name that tables and logs print (printable, at most
    :data:`MAX_NAME` long), or None; ``setting`` is how the message names it (``labels[1]``)."""
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
