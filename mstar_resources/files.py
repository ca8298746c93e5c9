"""The shipped deployments' folder, and files written whole or not at all into a folder checked
first. Imports no Hydra: a worker in ``auto`` reads it."""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["DEPLOYMENT_GROUP", "FLASHINFER_FOLDER", "calibrated_for", "folder_problem", "replacing",
           "shipped_deployments", "write_whole"]  # fmt: skip

DEPLOYMENT_GROUP = "deployment"  # its options are `# @package _global_`: keys of the whole tree
FLASHINFER_FOLDER = "flashinfer-"
"""``deployment/flashinfer-<version>/`` holds calibrations made with that FlashInfer."""


def shipped_deployments() -> Path:
    """The folder of the shipped deployments, calibrated ones included."""
    return Path(str(importlib.resources.files("mstar_resources.conf"))) / DEPLOYMENT_GROUP


def calibrated_for(deployment: str, flashinfer: str | None, folders: Sequence[Path]) -> str:
    """``flashinfer-<version>/<deployment>`` where one of ``folders`` holds it, else as given."""
    if flashinfer is None or "/" in deployment:
        return deployment
    # A build's local label (0.6.14+cu128) is the release's code.
    versioned = f"{FLASHINFER_FOLDER}{flashinfer.partition('+')[0]}/{deployment}"
    # A broken link or a folder there too: composing it says what is wrong with it.
    found = any(os.path.lexists(f / f"{versioned}.yaml") for f in folders)
    return versioned if found else deployment


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (see :func:`replacing`)."""
    with replacing(path) as temporary, open(temporary, "x", encoding="utf-8") as file:
        file.write(text)  # mode as umask allows, like open()


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write the new file to, synced and renamed over ``path``
    as the block ends, so a reader or a crash sees the old file or the new one, never a part; a
    block that raises leaves the old file."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        yield temporary
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
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
    """Why files could not be written into ``folder`` (made if missing), or None; it tries making a
    folder in the nearest that exists (``/proc`` refuses where permissions allow), leaving none."""
    folder = existing = Path(folder).absolute()
    try:
        while not existing.exists():
            if existing.is_symlink():  # dangling: making the folder would fail on it
                link = os.readlink(existing)
                return f"{existing} is a symbolic link to {link}, which does not exist"
            existing = existing.parent
    except OSError as error:  # a name too long for the file system, a loop of links, ...
        return f"{error.strerror or error} ({error.filename or existing})"
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    try:
        longest = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):  # a platform that does not say
        longest = 255
    for name in folder.relative_to(existing).parts:
        if len(os.fsencode(name)) > longest:
            return (
                f"the name {name[:40]}... has {len(name):,} characters, more than the {longest} "
                "the file system takes"
            )
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".mstar-probe-"))
    except OSError as error:
        return f"no folder can be made in {existing} ({error.strerror})"
    return None
