"""stdout while an app or a benchmark runs: a write that fails (``> /dev/full``, a closed stdout)
ends the run with one line and status 2, and a reader that went away (``| head``) with status 0,
rather than a traceback, here or at interpreter exit."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn, TextIO, cast

__all__ = ["StdoutFailed", "guarded_stdout"]


class StdoutFailed(BaseException):
    """stdout refused what was written (``error``): a BaseException, so that it passes the app's
    own handlers and Hydra's, which catch ``Exception``."""

    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error

    def end(self, prog: str) -> NoReturn:
        """End the process as the module's docstring says."""
        _stdout_to_devnull()
        if isinstance(self.error, BrokenPipeError):
            # The reader went away (`| head`): what it read was all it wanted.
            raise SystemExit(0) from None
        print(
            f"{prog}: error: stdout can't take the output ({self.error.strerror}); send it to a "
            "file or pipe that can, e.g. > output.txt",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


class _Stdout:
    """``sys.stdout`` while an app runs: a write or flush that fails raises :class:`StdoutFailed`,
    so that the entry point tells stdout's failures from the app's other ``OSError``\\ s."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream  # None where Python started with file descriptor 1 closed

    def write(self, text: str) -> int:
        with self._failures():
            if self._stream is None:
                raise OSError(errno.EBADF, "stdout is closed")
            return self._stream.write(text)

    def flush(self) -> None:
        if self._stream is not None:
            with self._failures():
                self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    @staticmethod
    @contextlib.contextmanager
    def _failures() -> Iterator[None]:
        try:
            yield
        except OSError as error:
            raise StdoutFailed(error) from error


def _stdout_to_devnull() -> None:
    """What is left in stdout's buffer goes nowhere at interpreter exit, rather than failing
    again there: Python's own advice for a closed pipe (the ``signal`` module's notes on
    SIGPIPE). Called only on the way out of a process whose stdout failed."""
    if sys.stdout is not None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)


@contextlib.contextmanager
def guarded_stdout(prog: str) -> Iterator[None]:
    """``sys.stdout`` as :class:`_Stdout` inside, flushed on the way out (a closed pipe shows
    here, not at interpreter exit), and as it was after; a failure of stdout ends the process as
    the module's docstring says."""
    stream = sys.stdout
    sys.stdout = cast(TextIO, _Stdout(stream))
    try:
        try:
            yield
        except SystemExit:  # an error told on stderr, or Hydra's help printed
            sys.stdout.flush()
            raise
        sys.stdout.flush()
    except StdoutFailed as failed:
        sys.stdout = stream
        failed.end(prog)
    finally:
        sys.stdout = stream
