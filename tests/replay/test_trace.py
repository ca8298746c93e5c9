"""The synthetic trace: seeded, long-tailed, within the model's length, arriving in order."""

from __future__ import annotations

import statistics

import pytest

from mstar_resources.errors import ResourceConfigError
from mstar_resources.replay.trace import Request, synthetic_requests

VOCAB = 1000


def trace(**overrides: object) -> list[Request]:
    """A small trace, with ``overrides`` of its arguments."""
    args: dict = {"num_requests": 50, "seed": 0, "max_model_len": 2048, "vocab_size": VOCAB}
    return list(synthetic_requests(**{**args, **overrides}))


@pytest.mark.parametrize(
    "seed", [pytest.param(0, id="seed-0"), pytest.param(7, id="seed-7"), pytest.param(-3, id="neg")]
)
def test_same_seed_same_trace(seed):
    assert trace(seed=seed) == trace(seed=seed)


@pytest.mark.parametrize(
    ("seed", "other"),
    [
        pytest.param(0, 1, id="0-vs-1"),
        pytest.param(7, 8, id="7-vs-8"),
        pytest.param(1, 2**40, id="big"),
    ],
)
def test_other_seed_other_trace(seed, other):
    first, second = trace(seed=seed), trace(seed=other)
    assert [r.prompt_len for r in first] != [r.prompt_len for r in second]
    assert [r.arrival_step for r in first] != [r.arrival_step for r in second]


@pytest.mark.parametrize(
    ("max_model_len", "medians"),
    [
        pytest.param(2048, (512, 64), id="defaults"),
        pytest.param(256, (512, 64), id="prompt-median-above-limit"),
        pytest.param(128, (16, 4096), id="output-median-above-limit"),
        pytest.param(2, (512, 64), id="one-token-each"),
        pytest.param(100_000, (1, 1), id="tiny-medians"),
    ],
)
def test_lengths_and_tokens_within_limits(max_model_len, medians):
    prompt_median, output_median = medians
    requests = trace(
        num_requests=200,
        max_model_len=max_model_len,
        prompt_median=prompt_median,
        output_median=output_median,
    )
    for request in requests:
        assert request.prompt_len >= 1
        assert request.output_len >= 1
        assert request.prompt_len + request.output_len <= max_model_len
        assert all(0 <= token < VOCAB for token in request.prompt())


@pytest.mark.parametrize(
    "rate",
    [
        pytest.param(0.1, id="sparse"),
        pytest.param(0.5, id="default"),
        pytest.param(8.0, id="burst"),
    ],
)
def test_arrivals_in_order_at_about_the_rate(rate):
    requests = trace(num_requests=400, arrivals_per_step=rate)
    assert [r.id for r in requests] == list(range(400))
    arrivals = [r.arrival_step for r in requests]
    assert arrivals[0] == 0
    assert arrivals == sorted(arrivals)
    # 399 exponential gaps of mean 1/rate: their sum is within a few percent of 399/rate.
    assert 0.8 * 399 / rate <= arrivals[-1] + 1 <= 1.2 * 399 / rate


@pytest.mark.parametrize("seed", [pytest.param(seed, id=f"seed-{seed}") for seed in (0, 1, 2)])
def test_prompt_lengths_have_a_long_tail(seed):
    requests = trace(num_requests=300, seed=seed, max_model_len=1 << 20)
    lengths = [r.prompt_len for r in requests]
    assert max(lengths) >= 5 * statistics.median(lengths)
    assert 256 <= statistics.median(lengths) <= 1024


@pytest.mark.parametrize(
    ("override", "match"),
    [
        pytest.param({"num_requests": 0}, r"num_requests=0 must be a positive", id="no-requests"),
        pytest.param({"num_requests": 2.0}, r"num_requests=2\.0 must be", id="float-count"),
        pytest.param({"seed": "a"}, r"seed='a' must be a whole number", id="str-seed"),
        pytest.param(
            {"max_model_len": 1}, r"max_model_len=1 must be a whole number >= 2", id="mml"
        ),
        pytest.param({"vocab_size": -5}, r"vocab_size=-5 must be a positive", id="vocab"),
        pytest.param({"prompt_median": 0}, r"prompt_median=0 must be a positive", id="prompt"),
        pytest.param({"output_median": True}, r"output_median=True must be", id="bool-output"),
        pytest.param({"sigma": -0.1}, r"sigma=-0\.1 must be a finite number >= 0", id="sigma"),
        pytest.param({"sigma": float("nan")}, r"sigma=nan must be", id="nan-sigma"),
        pytest.param({"arrivals_per_step": 0}, r"arrivals_per_step=0 must be", id="zero-rate"),
        pytest.param(
            {"arrivals_per_step": float("inf")}, r"arrivals_per_step=inf must be", id="inf-rate"
        ),
    ],
)
def test_bad_argument_is_named(override, match):
    with pytest.raises(ResourceConfigError, match=match):
        trace(**override)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        pytest.param({"prompt_len": 0}, r"request 3: prompt_len=0 must be", id="empty-prompt"),
        pytest.param({"vocab_size": 0}, r"request 3: vocab_size=0 must be", id="no-vocab"),
        pytest.param({"output_len": 0}, r"request 3: output_len=0 must be", id="no-output"),
        pytest.param({"arrival_step": -1}, r"request 3: arrival_step=-1 must be", id="negative"),
    ],
)
def test_bad_request_is_named(fields, match):
    with pytest.raises(ResourceConfigError, match=match):
        Request(**{"id": 3, "arrival_step": 0, "prompt_len": 2, "output_len": 1, **fields})


def test_prompt_is_drawn_when_asked_the_same_each_time():
    request = Request(id=0, arrival_step=0, prompt_len=300, output_len=2, vocab_size=7,
                      prompt_seed=11)  # fmt: skip
    prompt = request.prompt()
    assert len(prompt) == 300 and set(prompt) <= set(range(7)) and len(set(prompt)) > 1
    assert request.prompt() == prompt
    other = Request(id=0, arrival_step=0, prompt_len=300, output_len=2, vocab_size=7,
                    prompt_seed=12)  # fmt: skip
    assert other.prompt() != prompt


def test_synthetic_prompts_have_distinct_seeds():
    requests = trace(num_requests=50)
    assert len({r.prompt_seed for r in requests}) == 50
