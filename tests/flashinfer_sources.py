"""FlashInfer's files the CPU tests read (its headers and one Python source), found without
importing FlashInfer, which needs CUDA: the installed package's, else those of the wheel that
``scripts/test.sh`` downloads into ``.venv/wheels`` (not installed, so that no FlashInfer that
cannot be imported is installed), extracted once beside it."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

WHEELS = Path(__file__).parents[1] / ".venv" / "wheels"
"""Where ``scripts/test.sh`` puts FlashInfer's wheel (``MSTAR_FLASHINFER_WHEELS`` for another)."""

NEEDED = ("data/include/flashinfer/", "mla/_batch_mla/_backends/", "data/csrc/xqa/",
          "data/csrc/trtllm_fmha_kernel_launcher.cu", "decode.py")  # fmt: skip
"""What of the package the tests read: the headers, MLA's check of its whole buffer, and what the
TRT-LLM kernels' workspace model is read from (XQA's sources, trtllm-gen's launcher, decode.py)."""


def flashinfer_package() -> Path | None:
    """The ``flashinfer`` package folder: the installed one, else the downloaded wheel's, or None
    where there is neither."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    wheel = _wheel()
    return None if wheel is None else _extract(wheel) / "flashinfer"


def flashinfer_version() -> str:
    """Which FlashInfer :func:`flashinfer_package` is, for messages."""
    for distribution in importlib.metadata.packages_distributions().get("flashinfer", []):
        return f"{distribution} {importlib.metadata.version(distribution)}"
    wheel = _wheel()
    return wheel.name if wheel is not None else "FlashInfer of an unknown version"


def _wheel() -> Path | None:
    folder = Path(os.environ.get("MSTAR_FLASHINFER_WHEELS", WHEELS))
    wheels = sorted(folder.glob("flashinfer_python-*.whl"))
    return wheels[-1] if wheels else None


def _extract(wheel: Path) -> Path:
    """The needed members of ``wheel``, extracted once into a folder named for it (made whole in
    a temporary folder and renamed, so test workers that extract at once do not mix)."""
    target = wheel.with_suffix("")
    if target.is_dir() and all((target / "flashinfer" / part).exists() for part in NEEDED):
        return target
    shutil.rmtree(target, ignore_errors=True)  # extracted when fewer members were needed
    partial = Path(tempfile.mkdtemp(dir=wheel.parent, prefix=f".{target.name}."))
    try:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                inside = name.removeprefix("flashinfer/")
                if inside != name and inside.startswith(NEEDED):
                    archive.extract(name, partial)
        with contextlib.suppress(OSError):  # another worker renamed its copy first
            partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target
