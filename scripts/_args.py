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

from mstar_resources._internal.output import guarded_stdout
from mstar_resources.errors import did_you_mean
from mstar_resources.files import folder_problem

DAY = 86_400.0
"""The longest a run may be given (``--timeout``), in seconds."""
INTERRUPTED = 130
"""The status of a run that Ctrl-C ended: 128 + SIGINT, as a shell reports it (and the apps)."""


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """A benchmark's entry point: ``main()``'s status; a stdout that fails (``> /dev/full``,
    ``| head``) ended in one line, as the apps end it (``mstar_resources/apps/hydra_app.py``), and
    Ctrl-C in one line too, status 130, once the temporary files are gone (each benchmark keeps
    them in a ``with`` block, which an interruption leaves as any exception does)."""
    prog = Path(sys.argv[0]).name
    try:
        with guarded_stdout(prog):
            status = main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    sys.exit(status)


def count(most: int) -> Callable[[str], int]:
    """A count (rounds, repeats, resources, ranks): a whole number from 1 to ``most``, the bound
    that keeps a typo from running for hours or filling the memory."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {most:,}")
        return value

    return whole


def seconds(most: float) -> Callable[[str], float]:
    """A duration: a number of seconds from 0 to ``most`` (``inf``: no bound, and ``inf`` too)."""

    def duration(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 <= value <= most:  # nan is in no range
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of seconds from 0 to {most:g}"
            )
        return value

    return duration


def output_folder(parser: argparse.ArgumentParser, flag: str, folder: Path) -> None:
    """Ends the run (:func:`refuse`) where files could not be written into ``folder``, made if
    missing, before anything runs; it leaves nothing behind."""
    problem = folder_problem(folder)
    if problem is not None:
        refuse(parser, flag, folder, problem)


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
