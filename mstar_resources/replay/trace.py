"""A serving trace's requests: the request model, and a synthetic trace (long-tailed prompt and
output lengths). A production trace file is read by ``trace_file``. Seeded, so the same arguments
always give the same trace."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from .._internal.limits import argument_problem
from ..errors import ResourceConfigError
from ..units import is_int, is_positive_int

__all__ = ["BOTH_TOKENS", "Request", "synthetic_requests"]


@dataclass(frozen=True)
class Request:
    """One request of a trace: its prompt's length, how many tokens it generates, and when it
    arrives. Its prompt's token ids are drawn only when asked for (:meth:`prompt`), so a trace of
    any length holds no tokens."""

    id: int
    """Unique within a trace; traces number their requests 0..n-1 in arrival order."""
    arrival_step: int
    """The engine step at which it arrives (it can be admitted from that step on)."""
    prompt_len: int
    """Tokens in its prompt."""
    output_len: int
    """Tokens it generates; it ends after exactly that many (there is no EOS)."""
    vocab_size: int = 1
    """Its prompt's token ids are in [0, vocab_size)."""
    prompt_seed: int = 0
    """Seeds the draw of its prompt's token ids."""

    def __post_init__(self) -> None:
        if not is_int(self.arrival_step) or self.arrival_step < 0:
            raise ResourceConfigError(
                f"request {self.id}: arrival_step={self.arrival_step!r} must be a whole number >= 0"
            )
        for name in ("prompt_len", "output_len", "vocab_size"):
            value = getattr(self, name)
            if not is_positive_int(value):
                raise ResourceConfigError(
                    f"request {self.id}: {name}={value!r} must be a positive whole number"
                )

    def prompt(self) -> tuple[int, ...]:
        """Its prompt's ``prompt_len`` token ids, drawn from ``random.Random(prompt_seed)``: the
        same ids at every call."""
        draw = random.Random(self.prompt_seed)
        return tuple(draw.choices(range(self.vocab_size), k=self.prompt_len))


def synthetic_requests(
    num_requests: int,
    seed: int,
    max_model_len: int,
    vocab_size: int,
    *,
    prompt_median: int = 512,
    output_median: int = 64,
    sigma: float = 1.5,
    arrivals_per_step: float = 0.5,
) -> Iterator[Request]:
    """``num_requests`` requests drawn from ``random.Random(seed)``, one at a time (the same ones
    at every call), so a long synthetic trace is streamed as a trace file is.

    Prompt and output lengths are log-normal around their medians (``sigma`` is the spread of their
    logarithm), clipped so each is at least 1 and together they fit ``max_model_len``. Gaps between
    arrivals are exponential with mean ``1 / arrivals_per_step`` steps; the first request arrives at
    step 0 and arrival steps are the running sum rounded down. Each prompt's seed is the next
    64 bits of the same generator. The arguments are checked when it is called, not when the first
    request is asked for.
    """
    _check_trace_args(
        num_requests=num_requests,
        seed=seed,
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        prompt_median=prompt_median,
        output_median=output_median,
        sigma=sigma,
        arrivals_per_step=arrivals_per_step,
    )

    def drawn() -> Iterator[Request]:  # a generator of its own, so the checks above run now
        rng = random.Random(seed)
        clock = 0.0
        for index in range(num_requests):
            if index:
                clock += rng.expovariate(arrivals_per_step)
            prompt_len = _lognormal_len(rng, prompt_median, sigma)
            output_len = _lognormal_len(rng, output_median, sigma)
            # The prompt keeps its tail (long prompts are what chunked prefill is for); the
            # output gives way to it.
            prompt_len = min(prompt_len, max_model_len - 1)
            output_len = min(output_len, max_model_len - prompt_len)
            yield Request(
                id=index,
                arrival_step=math.floor(clock),
                prompt_len=prompt_len,
                output_len=output_len,
                vocab_size=vocab_size,
                prompt_seed=rng.getrandbits(64),
            )

    return drawn()


def _lognormal_len(rng: random.Random, median: int, sigma: float) -> int:
    """A length of at least 1 whose logarithm is normal around ``log(median)``."""
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


def _check_trace_args(**args: object) -> None:
    """Raise for the first unusable argument of :func:`synthetic_requests`, naming it."""
    checks = [
        *(
            argument_problem(name, args[name], whole=True, ge=1)
            for name in ("num_requests", "vocab_size", "prompt_median", "output_median")
        ),
        argument_problem("seed", args["seed"], whole=True),
        argument_problem(
            "max_model_len", args["max_model_len"], whole=True, ge=2, note=BOTH_TOKENS
        ),
        argument_problem("sigma", args["sigma"], ge=0),
        argument_problem("arrivals_per_step", args["arrivals_per_step"], gt=0),
    ]
    first = next((problem for problem in checks if problem is not None), None)
    if first is not None:
        raise ResourceConfigError(first)


BOTH_TOKENS = " (a prompt token and an output token)"
