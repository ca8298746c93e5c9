"""A synthetic serving trace: requests with long-tailed prompt and output lengths, arriving over
engine steps. Seeded, so the same arguments always give the same trace."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TypeGuard

from .._floor import is_int, is_positive_int
from ..errors import ResourceConfigError

__all__ = ["Request", "synthetic_trace"]


@dataclass(frozen=True)
class Request:
    """One request of a trace: its prompt, how many tokens it generates, and when it arrives."""

    id: int
    """Unique within a trace; a synthetic trace numbers its requests 0..n-1 in arrival order."""
    arrival_step: int
    """The engine step at which it arrives (it can be admitted from that step on)."""
    prompt: tuple[int, ...]
    """Its token ids, each in [0, vocab_size)."""
    output_len: int
    """Tokens it generates; it ends after exactly that many (there is no EOS)."""

    def __post_init__(self) -> None:
        if not is_int(self.arrival_step) or self.arrival_step < 0:
            raise ResourceConfigError(
                f"request {self.id}: arrival_step={self.arrival_step!r} must be a whole number >= 0"
            )
        if not self.prompt:
            raise ResourceConfigError(f"request {self.id}: prompt is empty; it needs a token")
        if not is_positive_int(self.output_len):
            raise ResourceConfigError(
                f"request {self.id}: output_len={self.output_len!r} must be a positive whole number"
            )

    @property
    def prompt_len(self) -> int:
        """Tokens in its prompt."""
        return len(self.prompt)


def synthetic_trace(
    num_requests: int,
    seed: int,
    max_model_len: int,
    vocab_size: int,
    *,
    prompt_median: int = 512,
    output_median: int = 64,
    sigma: float = 1.5,
    arrivals_per_step: float = 0.5,
) -> list[Request]:
    """``num_requests`` requests drawn from ``random.Random(seed)``.

    Prompt and output lengths are log-normal around their medians (``sigma`` is the spread of their
    logarithm), clipped so each is at least 1 and together they fit ``max_model_len``. Gaps between
    arrivals are exponential with mean ``1 / arrivals_per_step`` steps; the first request arrives at
    step 0 and arrival steps are the running sum rounded down.
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
    rng = random.Random(seed)
    tokens = range(vocab_size)
    requests = []
    clock = 0.0
    for index in range(num_requests):
        if index:
            clock += rng.expovariate(arrivals_per_step)
        prompt_len = _lognormal_len(rng, prompt_median, sigma)
        output_len = _lognormal_len(rng, output_median, sigma)
        # The prompt keeps its tail (long prompts are what chunked prefill is for); the output
        # gives way to it.
        prompt_len = min(prompt_len, max_model_len - 1)
        output_len = min(output_len, max_model_len - prompt_len)
        requests.append(
            Request(
                id=index,
                arrival_step=math.floor(clock),
                prompt=tuple(rng.choices(tokens, k=prompt_len)),
                output_len=output_len,
            )
        )
    return requests


def _lognormal_len(rng: random.Random, median: int, sigma: float) -> int:
    """A length of at least 1 whose logarithm is normal around ``log(median)``."""
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


def _check_trace_args(**args: object) -> None:
    """Raise for the first unusable argument of :func:`synthetic_trace`, naming it."""
    for name in ("num_requests", "vocab_size", "prompt_median", "output_median"):
        if not is_positive_int(args[name]):
            raise ResourceConfigError(f"{name}={args[name]!r} must be a positive whole number")
    if not is_int(args["seed"]):
        raise ResourceConfigError(f"seed={args['seed']!r} must be a whole number")
    max_model_len = args["max_model_len"]
    if not is_int(max_model_len) or max_model_len < 2:
        raise ResourceConfigError(
            f"max_model_len={max_model_len!r} must be a whole number >= 2 "
            "(a prompt token and an output token)"
        )
    sigma = args["sigma"]
    if not _is_real(sigma) or not 0 <= sigma < math.inf:
        raise ResourceConfigError(f"sigma={sigma!r} must be a finite number >= 0")
    rate = args["arrivals_per_step"]
    if not _is_real(rate) or not 0 < rate < math.inf:
        raise ResourceConfigError(f"arrivals_per_step={rate!r} must be a finite number > 0")


def _is_real(value: object) -> TypeGuard[float]:
    """True for an int or float that is not a bool (``True`` is not a rate)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
