"""What the benchmarks share: the ``--png`` option, pyplot without a display, saving a figure.

A benchmark draws only when asked (``--png PATH``): without it, matplotlib is never imported, so
the benchmarks run where only the ``test`` extra is installed (plotting needs the ``bench`` extra).
No folder is ever created: PATH's folder must exist.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mstar_resources.files import folder_problem, replacing

from _args import refuse


def add_png_option(parser: argparse.ArgumentParser) -> None:
    """Adds ``--png PATH``, the file to draw the figure into (none by default)."""
    parser.add_argument(
        "--png",
        type=Path,
        metavar="PATH",
        help="also draw the figure into this PNG file; its folder must exist "
        "(needs matplotlib: pip install 'mstar-resources[bench]')",
    )


def check_png(parser: argparse.ArgumentParser, png: Path | None) -> None:
    """Ends the run with status 2 and one line on stderr, before anything is measured, when the
    figure could not be written to ``png``."""
    if png is None:
        return
    problem = None
    if not png.parent.is_dir():
        problem = f"the folder {png.parent} does not exist (no folder is created)"
    elif png.is_dir():
        problem = "that is a folder, not a file"
    elif png.suffix.lower() != ".png":
        problem = f"the figure is a PNG: give a path ending in .png, not {png.suffix or png.name!r}"
    elif png.exists() and not png.is_file():
        problem = "that is not a regular file (a device, a pipe)"
    elif (unwritable := folder_problem(png.parent)) is not None:
        problem = unwritable
    else:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            problem = "drawing needs matplotlib: pip install 'mstar-resources[bench]'"
    if problem:
        refuse(parser, "--png", png, problem)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, which needs no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, png: Path) -> None:
    """Writes ``fig`` to ``png`` (whose folder exists: see check_png), whole or not at all, and
    says where; a write that fails (a full disk) ends the run with one line and status 1, the old
    file, if any, left as it was."""
    fig.tight_layout()
    try:
        with replacing(png) as temporary:
            fig.savefig(temporary, dpi=120, format="png")
    except OSError as error:
        sys.exit(f"{Path(sys.argv[0]).name}: error: --png {png}: the figure was not written "
                 f"({error.strerror or error})")  # fmt: skip
    print(f"plot: {png}")
