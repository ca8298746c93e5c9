"""The requests a replay serves: the seeded synthetic trace, or a slice of a production trace file,
made (and a bad file refused) while the settings are checked, before any GPU work."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import ResourceConfigError
from .trace import Request, synthetic_requests
from .trace_file import read_trace

__all__ = ["Workload", "load_workload"]


@dataclass(frozen=True)
class Workload:
    """The requests to replay, where they came from, and what they add up to."""

    source: dict[str, Any]
    """What report.json's ``trace`` entry says of their origin: ``source`` (``synthetic`` or
    ``file``), ``seed``, ``max_model_len``, ``refused`` and ``clipped``; for a file also ``path``,
    ``offset``, ``rows`` (read), ``rows_in_file``, ``requested``, ``span_s`` and ``step_ms``."""
    served: int
    """Requests to serve."""
    prompt_tokens: int
    """Their prompts' tokens."""
    generated_tokens: int
    """The tokens they generate."""
    _requests: Callable[[], Iterable[Request]]

    def requests(self) -> Iterator[Request]:
        """The requests, in arrival order, with ids 0..n-1; a file is read again at each call, so
        a workload holds none of them."""
        return iter(self._requests())


def load_workload(
    trace: str | None,
    *,
    requests: int,
    trace_offset: int,
    step_ms: float,
    seed: int,
    vocab_size: int,
    max_model_len: int,
    progress: bool = False,
) -> Workload:
    """The replay's requests, named by its settings of the same names.

    ``trace=None``: ``requests`` synthetic requests (:func:`synthetic_requests`), whose lengths are
    drawn to fit ``max_model_len``, so none is refused or clipped. A path: rows ``trace_offset`` ..
    ``trace_offset + requests - 1`` of that file (:func:`read_trace`), arrivals mapped to steps of
    ``step_ms``; prompts of ``max_model_len`` tokens or more are refused, and outputs cut to fit.
    The file is checked whole now and streamed again whenever its requests are asked for;
    ``progress`` shows a bar while a large one is read. Raises :class:`ResourceConfigError` for
    a file that can't be read as a trace, or a slice that leaves nothing to serve.
    """
    if trace is None:
        return _synthetic_workload(requests, seed, vocab_size, max_model_len)
    try:
        read = read_trace(
            trace,
            max_model_len=max_model_len,
            vocab_size=vocab_size,
            seed=seed,
            step_ms=step_ms,
            offset=trace_offset,
            limit=requests,
            progress=progress,
        )
    except ResourceConfigError as error:
        raise _in_the_replay_s_settings(error) from None
    if not read.served:
        raise ResourceConfigError(
            f"trace file {read.path}: none of the {read.rows_read} rows read (trace_offset="
            f"{trace_offset}, requests={requests}) has a prompt shorter than "
            f"calibration.limits.max_model_len={max_model_len} tokens (an engine refuses any "
            "other), so nothing is left to serve; read other rows, or pick a deployment with a "
            "longer max_model_len"
        )
    return Workload(
        {
            "source": "file",
            "path": str(read.path),
            "offset": read.offset,
            "rows": read.rows_read,
            "rows_in_file": read.rows_in_file,
            "requested": requests,
            "span_s": read.span_s,
            "step_ms": read.step_ms,
            "seed": seed,
            "max_model_len": max_model_len,
            "refused": read.refused,
            "clipped": read.clipped,
        },
        served=read.served,
        prompt_tokens=read.prompt_tokens,
        generated_tokens=read.output_tokens,
        _requests=read.requests,
    )


def _in_the_replay_s_settings(error: ResourceConfigError) -> ResourceConfigError:
    """``error`` of :func:`read_trace`, which names its own arguments (an offset past the end),
    naming the replay's setting instead."""
    return ResourceConfigError(
        *(
            problem.replace("offset=", "trace_offset=").replace("set offset", "set trace_offset")
            for problem in error.problems
        ),
        where=error.where,
    )


def _synthetic_workload(requests: int, seed: int, vocab_size: int, max_model_len: int) -> Workload:
    """``requests`` synthetic requests, counted once by streaming them, as a file is: none held."""

    def synthetic() -> Iterator[Request]:
        return synthetic_requests(requests, seed, max_model_len, vocab_size)

    served = prompt_tokens = generated_tokens = 0
    for request in synthetic():
        served += 1
        prompt_tokens += request.prompt_len
        generated_tokens += request.output_len
    return Workload(
        {
            "source": "synthetic",
            "seed": seed,
            "max_model_len": max_model_len,
            "refused": 0,
            "clipped": 0,
        },
        served=served,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        _requests=synthetic,
    )
