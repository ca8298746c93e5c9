"""The benchmarks' argument rules, one each, as argparse types, their one-line refusal, and their
entry point (:func:`run_main`).

A bad value given to a type ends the run before anything is measured, as the apps do: argparse
prints ``prog: error: argument --flag: ...`` (after the usage line) on stderr and exits with 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import NoReturn

from mstar_resources.apps.stdout import guarded_stdout
from mstar_resources.errors import did_you_mean


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """A benchmark's entry point: ``main()``'s status, and a stdout that fails (``> /dev/full``,
    ``| head``) ended in one line, as the apps end it (``mstar_resources/apps/stdout.py``)."""
    with guarded_stdout(Path(sys.argv[0]).name):
        status = main()
    sys.exit(status)


def positive_int(text: str) -> int:
    """A count (rounds, repeats, resources, ranks): a whole number of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value


def non_negative_float(text: str) -> float:
    """A duration or size that may be zero: a finite number of 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of 0 or more")
    return value


def one_of(options: Collection[str], what: str, fix: str = "") -> Callable[[str], str]:
    """A type taking only one of ``options`` (each a ``what``); a refusal lists them, suggests
    the closest, and ends with ``fix`` (how to make another) when given."""
    listed = ", ".join(sorted(options)) or "none"

    def one(text: str) -> str:
        if text in options:
            return text
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a {what}{did_you_mean(text, options)}; the {what}s here: {listed}"
            + (f"; {fix}" if fix else "")
        )

    return one


def refuse(parser: argparse.ArgumentParser, flag: str, value: object, problem: str) -> NoReturn:
    """Ends the run with ``prog: error: FLAG VALUE: PROBLEM`` on stderr and status 2, for a value
    that only this machine refuses (a folder, a GPU), which a type cannot tell."""
    parser.exit(2, f"{parser.prog}: error: {flag} {value}: {problem}\n")
