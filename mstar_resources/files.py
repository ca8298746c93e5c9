"""Files this library writes (a calibrated deployment, a replay's report): whole or not at all,
into a folder checked before any GPU work."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["folder_problem", "write_whole"]


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader, or a crash at any moment, sees the old file or
    the new one, never a part: a temporary file beside it, flushed to disk, then renamed over it
    (``os.replace`` is atomic on POSIX and Windows), and the folder synced so the rename lasts.
    A temporary file a crash leaves behind starts with a dot and ends in ``.tmp``."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "x", encoding="utf-8") as file:  # mode as umask allows, like open()
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    with contextlib.suppress(OSError):  # not every platform can open a folder
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def folder_problem(folder: Path) -> str | None:
    """Why files could not be written into ``folder``, made if missing, or None if they can. It
    makes nothing: the nearest folder that exists must be a writable folder."""
    folder = Path(folder).absolute()
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None
