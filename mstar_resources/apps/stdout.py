"""stdout while an app or a benchmark runs: a write that fails (``> /dev/full``, a closed stdout)
ends the run with one line and status 2, and a reader that went away (``| head``) with status 0,
rather than a traceback, here or at interpreter exit."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO, cast

__all__ = ["guarded_stdout"]


class _StdoutFailed(BaseException):
    """stdout refused a write (``args[0]``, the OSError): a BaseException, so that it passes the
    handlers of the app and of Hydra, which catch ``Exception``."""


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
    """``sys.stdout`` guarded inside, flushed on the way out (so a closed pipe shows here, not at
    interpreter exit), and as it was after; a failure of stdout ends the process as the module's
    docstring says."""
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
        sys.stdout = stream
        if stream is not None:  # what is left in its buffer goes nowhere at exit (Python's advice)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        error = failed.args[0]
        if isinstance(error, BrokenPipeError):  # the reader read all it wanted
            raise SystemExit(0) from None
        print(
            f"{prog}: error: stdout can't take the output ({error.strerror}); send it to a file "
            "or pipe that can, e.g. > output.txt",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    finally:
        sys.stdout = stream
