"""The requests a replay serves: the seeded synthetic trace, or a slice of a production trace file,
made (and a bad file refused) while the settings are checked, before any GPU work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ResourceConfigError
from .trace import Request, read_trace, synthetic_trace

__all__ = ["Workload", "load_workload"]


@dataclass(frozen=True)
class Workload:
    """The requests to replay, and where they came from."""

    requests: list[Request]
    """In arrival order, with ids 0..n-1."""
    source: dict[str, Any]
    """What report.json's ``trace`` entry says of their origin: ``source`` (``synthetic`` or
    ``file``), ``seed``, ``max_model_len``, ``refused`` and ``clipped``; for a file also ``path``,
    ``offset``, ``rows`` (read), ``rows_in_file``, ``span_s`` and ``step_ms``."""


def load_workload(
    trace: str | None,
    *,
    requests: int,
    trace_offset: int,
    step_ms: float,
    seed: int,
    vocab_size: int,
    max_model_len: int,
) -> Workload:
    """The replay's requests, named by its settings of the same names.

    ``trace=None``: ``requests`` synthetic requests (:func:`synthetic_trace`), whose lengths are
    drawn to fit ``max_model_len``, so none is refused or clipped. A path: rows ``trace_offset`` ..
    ``trace_offset + requests - 1`` of that file (:func:`read_trace`), arrivals mapped to steps of
    ``step_ms``; prompts of ``max_model_len`` tokens or more are refused, and outputs cut to fit.
    Raises :class:`ResourceConfigError` for a file that can't be read as a trace, or a slice that
    leaves nothing to serve.
    """
    common = {"seed": seed, "max_model_len": max_model_len}
    if trace is None:
        return Workload(
            synthetic_trace(requests, seed, max_model_len, vocab_size),
            {"source": "synthetic", **common, "refused": 0, "clipped": 0},
        )
    try:
        read = read_trace(
            trace,
            max_model_len=max_model_len,
            vocab_size=vocab_size,
            seed=seed,
            step_ms=step_ms,
            offset=trace_offset,
            limit=requests,
        )
    except ResourceConfigError as error:
        # read_trace names its own arguments (an offset past the end); say which setting it is.
        raise ResourceConfigError(
            *(
                problem.replace("offset=", "trace_offset=").replace(
                    "set offset", "set trace_offset"
                )
                for problem in error.problems
            ),
            where=error.where,
        ) from None
    if not read.requests:
        raise ResourceConfigError(
            f"trace file {read.path}: none of the {read.rows_read} rows read (trace_offset="
            f"{trace_offset}, requests={requests}) has a prompt shorter than "
            f"calibration.limits.max_model_len={max_model_len} tokens (an engine refuses any "
            "other), so nothing is left to serve; read other rows, or pick a deployment with a "
            "longer max_model_len"
        )
    return Workload(
        read.requests,
        {
            "source": "file",
            "path": str(read.path),
            "offset": read.offset,
            "rows": read.rows_read,
            "rows_in_file": read.rows_in_file,
            "requested": requests,
            "span_s": read.span_s,
            "step_ms": read.step_ms,
            **common,
            "refused": read.refused,
            "clipped": read.clipped,
        },
    )
