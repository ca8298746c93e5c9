"""The console scripts' Hydra apps over ``pkg://mstar_resources.conf``, whose bad input ends in one
paragraph on stderr and exit status 2.

Hydra prints compose errors itself and exits 1 unless ``HYDRA_FULL_ERROR=1`` is set, in which case
it raises them; so :func:`run_app` sets that variable for the duration of the app, reports what it
catches, and restores it. Set ``HYDRA_FULL_ERROR=1`` yourself to get the full traceback instead.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, NoReturn

import hydra
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from .errors import ResourceConfigError

if TYPE_CHECKING:
    import torch


def one_paragraph(error: BaseException) -> str:
    """``error``'s text and its config cause's, as one paragraph: Hydra's list of options and
    OmegaConf's ``full_key`` lines joined onto it."""
    texts = [str(error)]
    if isinstance(error, OverrideParseException):  # its text quotes no override
        texts[0] = f"{error.override}: {error}"
    if isinstance(error.__cause__, OmegaConfBaseException):
        texts.append(str(error.__cause__))
    lines = [line.strip() for text in texts for line in text.splitlines() if line.strip()]
    # Where the search path is helps no one who misspelled an option.
    if "Config search path:" in lines:
        lines = lines[: lines.index("Config search path:")]
    paragraph, listing = lines[0], False
    for line in lines[1:]:
        if paragraph.endswith(":"):
            paragraph += " " + line
        elif listing:
            paragraph += ", " + line
        else:
            paragraph += (" " if paragraph.endswith((".", ";")) else "; ") + line
        listing = listing or paragraph.endswith(":")
    return paragraph


def fail(prog: str, error: BaseException) -> NoReturn:
    """Report ``error`` as ``prog: error: ...`` on stderr and exit with status 2."""
    text = one_paragraph(error)
    if not isinstance(error, ResourceConfigError):
        text += f". `{prog} --cfg job` prints the composed config, `{prog} --help` its groups"
    print(f"{prog}: error: {text}", file=sys.stderr)
    raise SystemExit(2)


def run_app(app: Callable[[], None], prog: str) -> None:
    """Run the ``@hydra.main`` function ``app``, turning Hydra's own errors into :func:`fail`."""
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    except (HydraException, OmegaConfBaseException) as error:
        if before == "1":
            raise
        fail(prog, error)
    finally:
        if before is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


def console_script(
    prog: str, config_name: str, run: Callable[[DictConfig], None]
) -> Callable[[], None]:
    """The ``main`` of a console script: ``run`` on the config composed from ``config_name``."""

    @hydra.main(
        version_base="1.3", config_path="pkg://mstar_resources.conf", config_name=config_name
    )
    def app(cfg: DictConfig) -> None:
        # Raised out of here, an error would reach Hydra's job runner, which prints its own line
        # about it first; SystemExit passes through it.
        try:
            run(cfg)
        except ResourceConfigError as error:
            fail(prog, error)
        except BrokenPipeError:  # the reader went away (`| head`): nothing left to tell anyone
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None

    def main() -> None:
        run_app(app, prog)

    main.__doc__ = f"The console script {prog}."
    return main


CUDA_DEVICE = re.compile(r"cuda(:\d+)?")
"""How a CUDA device is written in the ``device`` setting."""


def cuda_device(device: object, without_gpu: str) -> torch.device:
    """The ``device`` setting as a CUDA device that is here; ``without_gpu`` says what to do
    instead when there is none."""
    import torch

    if not isinstance(device, str) or not CUDA_DEVICE.fullmatch(device):
        raise ResourceConfigError(f"device={device!r} is not a CUDA device; set device=cuda:N")
    if not torch.cuda.is_available():
        raise ResourceConfigError(
            f"device={device!r}, but torch sees no CUDA device (torch.cuda.is_available() is "
            f"False); {without_gpu}"
        )
    target = torch.device(device)
    if target.index is not None and target.index >= torch.cuda.device_count():
        raise ResourceConfigError(
            f"device={device!r}, but there are {torch.cuda.device_count()} CUDA devices; "
            f"set device=cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return target


def format_table(rows: Sequence[Sequence[str] | None], right: Container[int] = ()) -> str:
    """``rows`` as aligned columns, two spaces apart; None draws a rule across them, and the
    columns numbered in ``right`` are right-aligned."""
    cells = [row for row in rows if row is not None]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for row in rows:
        line = ["-" * width for width in widths] if row is None else row
        lines.append(
            "  ".join(
                cell.rjust(width) if i in right else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(lines)
