"""Units, and the few number and version rules every layer shares: one place for each."""

from __future__ import annotations

import importlib.metadata
import re
from typing import TypeGuard

__all__ = ["ALIGNMENT", "MAX_SLOTS", "MIB", "installed_version", "is_int", "mb_to_hold", "plural",
           "release", "round_up"]  # fmt: skip

MIB = 1 << 20  # one MB as engines size workspaces, and as every setting here counts it
ALIGNMENT = 16  # FlashInfer's: a workspace's first byte, and each allocation it carves from one
MAX_SLOTS = 256  # CUDA-graph slots are numbered from 0 to 255


def round_up(value: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is at least ``value``."""
    return -(-value // multiple) * multiple


def mb_to_hold(nbytes: int) -> int:
    """The fewest whole MB that hold ``nbytes``: the one rounding from bytes to a setting."""
    return round_up(nbytes, MIB) // MIB


def is_int(value: object) -> TypeGuard[int]:
    """True for an int; ``True`` is a bool, not a number."""
    return isinstance(value, int) and not isinstance(value, bool)


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 workspace``, ``1,024 requests``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def release(version: str) -> tuple[int, ...]:
    """The release numbers at the start of ``version``: ``0.35.0rc1+cu130`` is ``(0, 35, 0)``."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def installed_version(distribution: str) -> str | None:
    """The installed ``distribution``'s version (FlashInfer's, an engine's), None where absent."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
