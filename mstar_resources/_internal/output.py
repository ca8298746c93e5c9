"""What the apps and benchmarks print (plain-text tables, one-line errors), and the stdout."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import unicodedata
from collections.abc import Container, Iterator, Sequence
from typing import Any, NoReturn, TextIO, cast


def display_width(text: str) -> int:
    """Terminal columns of ``text``: wide and fullwidth characters two, combining marks none."""
    return sum(
        2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
        for char in text
        if unicodedata.category(char) not in ("Mn", "Me")  # drawn over the character before it
    )


def format_table(rows: Sequence[Sequence[str] | None], right: Container[int] = ()) -> str:
    """``rows`` in columns two spaces apart, a rule for None; columns in ``right`` right-aligned."""
    cells = [row for row in rows if row is not None]
    widths = [max(display_width(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for row in rows:
        line = ["-" * width for width in widths] if row is None else row
        padded = []
        for i, (cell, width) in enumerate(zip(line, widths, strict=True)):
            # str.ljust counts characters, and a CJK character takes two columns.
            pad = " " * (width - display_width(cell))
            padded.append(pad + cell if i in right else cell + pad)
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def fail(prog: str, message: str) -> NoReturn:
    """Print ``prog: error: message`` on stderr and exit with status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class _StdoutFailed(BaseException):
    """stdout refused a write (``args[0]``): it passes the app's and Hydra's handlers."""


class _Stdout:
    """``sys.stdout``, whose failing writes and flushes raise :class:`_StdoutFailed`."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream  # None where Python started with file descriptor 1 closed

    def write(self, text: str) -> int:
        try:
            if self._stream is None:
                raise OSError(errno.EBADF, "stdout is closed")
            return self._stream.write(text)
        except OSError as error:
            raise _StdoutFailed(error) from error

    def flush(self) -> None:
        try:
            if self._stream is not None:
                self._stream.flush()
        except OSError as error:
            raise _StdoutFailed(error) from error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout(prog: str) -> Iterator[None]:
    """``sys.stdout`` guarded inside and flushed on the way out: a stdout that fails ends an app in
    one line, status 2, and a reader that went away (``| head``) with status 0."""
    stream = sys.stdout
    sys.stdout = cast(TextIO, _Stdout(stream))
    try:
        try:
            yield
        except SystemExit:  # an error told on stderr, or Hydra's help printed
            sys.stdout.flush()
            raise
        sys.stdout.flush()
    except _StdoutFailed as failed:
        if stream is not None:  # what is left in its buffer goes nowhere at exit (Python's advice)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        error = failed.args[0]
        if isinstance(error, BrokenPipeError):  # the reader read all it wanted
            raise SystemExit(0) from None
        fail(
            prog,
            f"stdout can't take the output ({error.strerror}); send it to a file or pipe that "
            "can, e.g. > output.txt",
        )
    finally:
        sys.stdout = stream
