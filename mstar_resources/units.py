"""Units and the few number rules every layer shares: one place for each."""

from __future__ import annotations

from typing import TypeGuard

__all__ = ["ALIGNMENT", "MIB", "is_int", "is_positive_int", "mb_to_hold", "plural", "round_up"]

MIB = 1 << 20
"""One MB as engines size workspaces, and as every setting here counts it: a mebibyte."""

ALIGNMENT = 16
"""FlashInfer's alignment: a workspace's first byte, and each allocation it carves from one."""


def round_up(value: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is at least ``value``."""
    return -(-value // multiple) * multiple


def mb_to_hold(nbytes: int) -> int:
    """The fewest whole MB that hold ``nbytes``: the one rounding from bytes to a setting."""
    return round_up(nbytes, MIB) // MIB


def is_int(value: object) -> TypeGuard[int]:
    """True for an int; ``True`` is a bool, not a number."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_positive_int(value: object) -> TypeGuard[int]:
    """True for an int above zero."""
    return is_int(value) and value > 0


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 workspace``, ``1,024 requests``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
