"""The scheduler: token budget, sequence limit, chunked prefill, CUDA-graph padding, pages, FCFS
admission and determinism."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

from mstar_resources.errors import ResourceConfigError
from mstar_resources.replay.scheduler import Chunk, Step, schedule, summary
from mstar_resources.replay.trace import Request, synthetic_requests

LIMITS = {
    "max_num_seqs": 8,
    "max_num_batched_tokens": 4,
    "cuda_graph_batch_sizes": (1, 2, 4),
    "num_pages": 16,
    "page_size": 4,
}


def req(id: int, prompt_len: int, output_len: int, arrival: int = 0) -> Request:
    """A request whose tokens don't matter, only its lengths."""
    return Request(id=id, arrival_step=arrival, prompt_len=prompt_len, output_len=output_len)


def run(trace: list[Request], **overrides: object) -> list[Step]:
    """The schedule of ``trace`` under LIMITS with ``overrides``."""
    return list(schedule(trace, **{**LIMITS, **overrides}))


def P(
    request: int, start: int, length: int, pages: tuple[int, ...], samples: bool = False
) -> Chunk:
    """An expected prefill chunk."""
    return Chunk(request, start, length, pages, samples)


def D(request: int, start: int, pages: tuple[int, ...]) -> Chunk:
    """An expected decode."""
    return Chunk(request, start, 1, pages, True)


def S(
    index: int,
    prefill: tuple[Chunk, ...] = (),
    decode: tuple[Chunk, ...] = (),
    finished: tuple[int, ...] = (),
    clock: int | None = None,
) -> Step:
    """An expected step under LIMITS (graph sizes 1, 2, 4); its clock is its index unless given."""
    graph = {0: None, 1: 1, 2: 2, 3: 4, 4: 4}[len(decode)]
    return Step(index, prefill, decode, graph, finished, index if clock is None else clock)


@pytest.mark.parametrize(
    ("trace", "overrides", "expected"),
    [
        pytest.param(
            [req(0, prompt_len=10, output_len=3)],
            {},
            [
                S(0, prefill=(P(0, 0, 4, (0,)),)),
                S(1, prefill=(P(0, 4, 4, (0, 1)),)),
                S(2, prefill=(P(0, 8, 2, (0, 1, 2), samples=True),)),
                S(3, decode=(D(0, 10, (0, 1, 2)),)),
                S(4, decode=(D(0, 11, (0, 1, 2)),), finished=(0,)),
            ],
            id="long-prompt-in-chunks-of-the-budget",
        ),
        pytest.param(
            [req(0, 3, 3), req(1, 6, 1, arrival=1), req(2, 2, 2, arrival=1)],
            {},
            [
                S(0, prefill=(P(0, 0, 3, (0,), True),)),
                S(1, prefill=(P(1, 0, 3, (2,)),), decode=(D(0, 3, (0,)),)),
                S(
                    2,
                    prefill=(P(1, 3, 3, (2, 3), True),),
                    decode=(D(0, 4, (0, 1)),),
                    finished=(0, 1),
                ),
                S(3, prefill=(P(2, 0, 2, (0,), True),)),
                S(4, decode=(D(2, 2, (0,)),), finished=(2,)),
            ],
            id="decode-then-prefill-then-admit-reusing-freed-pages",
        ),
        pytest.param(
            [req(0, 1, 3), req(1, 2, 1)],
            {"max_num_batched_tokens": 1},
            [
                S(0, prefill=(P(0, 0, 1, (0,), True),)),
                S(1, decode=(D(0, 1, (0,)),)),
                S(2, decode=(D(0, 2, (0,)),), finished=(0,)),
                S(3, prefill=(P(1, 0, 1, (0,)),)),
                S(4, prefill=(P(1, 1, 1, (0,), True),), finished=(1,)),
            ],
            id="decodes-spend-the-budget-first",
        ),
        pytest.param(
            [req(0, 2, 2), req(1, 2, 2)],
            {"max_num_seqs": 1, "max_num_batched_tokens": 8},
            [
                S(0, prefill=(P(0, 0, 2, (0,), True),)),
                S(1, decode=(D(0, 2, (0,)),), finished=(0,)),
                S(2, prefill=(P(1, 0, 2, (0,), True),)),
                S(3, decode=(D(1, 2, (0,)),), finished=(1,)),
            ],
            id="max-num-seqs-holds-the-second-until-the-first-is-freed",
        ),
        pytest.param(
            [req(0, 1, 1), req(1, 1, 2, arrival=10)],
            {},
            [
                S(0, prefill=(P(0, 0, 1, (0,), True),), finished=(0,)),
                S(1, prefill=(P(1, 0, 1, (0,), True),), clock=10),
                S(2, decode=(D(1, 1, (0,)),), finished=(1,), clock=11),
            ],
            id="idle-steps-skipped-to-the-next-arrival",
        ),
    ],
)
def test_exact_steps(trace, overrides, expected):
    assert run(trace, **overrides) == expected


@pytest.mark.parametrize(
    ("sizes", "batch", "graph_batch"),
    [
        pytest.param((1, 2, 4, 8), 1, 1, id="1-in-1"),
        pytest.param((1, 2, 4, 8), 3, 4, id="3-padded-to-4"),
        pytest.param((1, 2, 4, 8), 5, 8, id="5-padded-to-8"),
        pytest.param((1, 2, 4, 8), 8, 8, id="8-in-8"),
        pytest.param((1, 2, 4, 8), 9, None, id="9-eager"),
        pytest.param((8, 1, 4), 2, 4, id="unsorted-sizes"),
        pytest.param((16,), 3, 16, id="one-size"),
        pytest.param((), 1, None, id="no-graphs-eager"),
    ],
)
def test_decode_padded_to_graph_batch(sizes, batch, graph_batch):
    trace = [req(i, 1, 2) for i in range(batch)]
    steps = run(trace, cuda_graph_batch_sizes=sizes, max_num_seqs=16, max_num_batched_tokens=16)
    prefill, decode = steps
    assert (len(prefill.decode), prefill.graph_batch) == (0, None)
    assert (len(decode.decode), decode.graph_batch) == (batch, graph_batch)


CONFIGS = [
    pytest.param(
        {"num_requests": 60, "prompt_median": 128, "output_median": 16},
        {"max_num_seqs": 8, "max_num_batched_tokens": 64, "num_pages": 600, "page_size": 16},
        id="tight-budget",
    ),
    pytest.param(
        {"num_requests": 60, "prompt_median": 128, "output_median": 32},
        {"max_num_seqs": 32, "max_num_batched_tokens": 256, "num_pages": 70, "page_size": 16},
        id="few-pages",
    ),
    pytest.param(
        {"num_requests": 80, "prompt_median": 64, "output_median": 64, "arrivals_per_step": 4.0},
        {"max_num_seqs": 48, "max_num_batched_tokens": 512, "num_pages": 4096, "page_size": 1},
        id="burst-page-size-1",
    ),
    pytest.param(
        {"num_requests": 40, "prompt_median": 32, "output_median": 8, "arrivals_per_step": 0.02},
        {"max_num_seqs": 4, "max_num_batched_tokens": 16, "num_pages": 100, "page_size": 32},
        id="sparse-arrivals",
    ),
]


def simulate(trace_args: dict, limits: dict) -> tuple[list[Request], list[Step]]:
    """A synthetic trace and its schedule."""
    trace = list(synthetic_requests(seed=1, max_model_len=1024, vocab_size=100, **trace_args))
    return trace, list(schedule(trace, cuda_graph_batch_sizes=(1, 2, 4, 8, 16), **limits))


def lifetimes(steps: list[Step]) -> dict[int, range]:
    """For each request, the steps from its first chunk to its last token."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for step in steps:
        for chunk in step.prefill + step.decode:
            first.setdefault(chunk.request, step.index)
        for request in step.finished:
            last[request] = step.index
    return {request: range(first[request], last[request] + 1) for request in first}


@pytest.mark.parametrize(("trace_args", "limits"), CONFIGS)
def test_budget_and_sequence_limit_hold(trace_args, limits):
    _, steps = simulate(trace_args, limits)
    assert all(1 <= step.num_tokens <= limits["max_num_batched_tokens"] for step in steps)
    running = Counter(i for life in lifetimes(steps).values() for i in life)
    assert max(running.values()) <= limits["max_num_seqs"]


@pytest.mark.parametrize(("trace_args", "limits"), CONFIGS)
def test_every_request_generates_exactly_its_output(trace_args, limits):
    trace, steps = simulate(trace_args, limits)
    samples = Counter(c.request for s in steps for c in s.prefill + s.decode if c.samples)
    assert samples == {r.id: r.output_len for r in trace}
    finished = [request for step in steps for request in step.finished]
    assert sorted(finished) == [r.id for r in trace]
    for step in steps:
        sampled_last = {c.request for c in step.prefill + step.decode if c.samples}
        assert set(step.finished) <= sampled_last


@pytest.mark.parametrize(("trace_args", "limits"), CONFIGS)
def test_chunks_walk_each_sequence_in_order(trace_args, limits):
    trace, steps = simulate(trace_args, limits)
    by_id = {r.id: r for r in trace}
    ends: dict[int, int] = {}
    pages: dict[int, tuple[int, ...]] = {}
    for step in steps:
        assert all(chunk.length == 1 for chunk in step.decode)
        for chunk in step.decode + step.prefill:
            request = by_id[chunk.request]
            assert chunk.start == ends.get(chunk.request, 0)
            assert chunk.samples == (chunk.end >= request.prompt_len)
            assert len(chunk.pages) == math.ceil(chunk.end / limits["page_size"])
            held = pages.get(chunk.request, ())
            assert chunk.pages[: len(held)] == held
            ends[chunk.request], pages[chunk.request] = chunk.end, chunk.pages
    # The last decode feeds back the token before the last one.
    assert ends == {r.id: r.prompt_len + r.output_len - 1 for r in trace}


@pytest.mark.parametrize(("trace_args", "limits"), CONFIGS)
def test_no_page_held_by_two_running_requests(trace_args, limits):
    _, steps = simulate(trace_args, limits)
    lives = lifetimes(steps)
    held: dict[int, set[int]] = {}
    for step in steps:
        for chunk in step.prefill + step.decode:
            held.setdefault(chunk.request, set()).update(chunk.pages)
    assert set().union(*held.values()) <= set(range(limits["num_pages"]))
    for a in held:
        for b in held:
            overlap = set(lives[a]) & set(lives[b])
            if a < b and overlap:
                assert not held[a] & held[b], f"requests {a} and {b} share pages"


@pytest.mark.parametrize(("trace_args", "limits"), CONFIGS)
def test_admitted_after_arrival_in_arrival_order(trace_args, limits):
    trace, steps = simulate(trace_args, limits)
    assert [step.index for step in steps] == list(range(len(steps)))
    assert all(a.clock < b.clock for a, b in itertools.pairwise(steps))
    admitted = []
    for step in steps:
        for chunk in step.prefill:
            if chunk.start == 0:
                admitted.append(chunk.request)
                assert step.clock >= trace[chunk.request].arrival_step
    assert admitted == [r.id for r in trace]


@pytest.mark.parametrize(
    ("num_pages", "first_steps"),
    [
        pytest.param(6, [0, 0, 0], id="all-fit"),
        pytest.param(5, [0, 0, 2], id="third-waits-for-second"),
        pytest.param(4, [0, 4, 4], id="small-third-waits-behind-second"),
    ],
)
def test_fcfs_admission_when_pages_are_short(num_pages, first_steps):
    # Pages of a whole life at page_size 4: 3, 2 and 1.
    trace = [req(0, 8, 4), req(1, 4, 2), req(2, 2, 1)]
    lives = lifetimes(run(trace, num_pages=num_pages, max_num_batched_tokens=64))
    assert [lives[r.id].start for r in trace] == first_steps


def test_freed_pages_are_reused_lowest_first():
    trace = [req(i, 4, 4) for i in range(3)]  # 2 pages each
    steps = run(trace, num_pages=2, max_num_batched_tokens=64)
    lives = lifetimes(steps)
    assert [lives[i].start for i in range(3)] == [0, 4, 8]
    last_pages = {c.request: c.pages for s in steps for c in s.decode}
    assert last_pages == {0: (0, 1), 1: (0, 1), 2: (0, 1)}


@pytest.mark.parametrize(
    ("too_big", "limits", "match"),
    [
        pytest.param(
            req(5, 8, 2),
            {"num_pages": 2},
            r"request 5 needs 3 pages of page_size=4 .*prompt_len=8 \+ output_len=2.*num_pages=2",
            id="pages-too-few",
        ),
        pytest.param(
            req(2, 100, 100),
            {"num_pages": 10, "page_size": 16},
            r"request 2 needs 13 pages of page_size=16",
            id="pages-too-small",
        ),
    ],
)
def test_request_that_can_never_fit_raises(too_big, limits, match):
    with pytest.raises(ResourceConfigError, match=match):
        run([req(1, 1, 1), too_big], **limits)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        pytest.param({"max_num_seqs": 0}, r"max_num_seqs=0 must be a positive", id="seqs"),
        pytest.param({"max_num_batched_tokens": -1}, r"max_num_batched_tokens=-1", id="tokens"),
        pytest.param({"num_pages": 1.5}, r"num_pages=1\.5 must be a positive", id="pages"),
        pytest.param({"page_size": None}, r"page_size=None must be a positive", id="page-size"),
        pytest.param({"cuda_graph_batch_sizes": (1, 0)}, r"=\[1, 0\] must hold pos", id="zero"),
        pytest.param({"cuda_graph_batch_sizes": (4, 1, 4)}, r"=\[4, 1, 4\] must be dist", id="dup"),
    ],
)
def test_bad_argument_is_named(overrides, match):
    with pytest.raises(ResourceConfigError, match=match):
        run([req(0, 1, 1)], **overrides)


@pytest.mark.parametrize(
    ("trace", "match"),
    [
        pytest.param([req(0, 1, 1), req(0, 2, 1)], r"request id 0 more than once", id="dup-id"),
        pytest.param([req(0, 1, 1), "req"], r"trace holds 'req', which is not a Request", id="str"),
        pytest.param([req(1, 1, 1), req(0, 1, 1)], r"id 0 after id 1; ids increase", id="id-down"),
        pytest.param(
            [req(0, 1, 1, arrival=5), req(1, 1, 1, arrival=4)],
            r"request 1 arrives at step 4, before request 0 above it \(step 5\)",
            id="out-of-order",
        ),
    ],
)
def test_bad_trace_is_named(trace, match):
    with pytest.raises(ResourceConfigError, match=match):
        run(trace)


def test_empty_trace_has_no_steps():
    assert run([]) == []


@pytest.mark.parametrize(("trace_args", "limits"), CONFIGS)
def test_same_input_same_steps(trace_args, limits):
    assert simulate(trace_args, limits) == simulate(trace_args, limits)


def test_summary_counts_tokens_and_graph_steps():
    steps = run([req(0, 3, 3), req(1, 6, 1, arrival=1), req(2, 2, 2, arrival=1)])
    assert summary(steps) == {
        "steps": 5,
        "requests": 3,
        "prefill_tokens": 11,
        "decode_tokens": 3,
        "max_decode_batch": 1,
        "graph_decode_steps": 3,
        "eager_decode_steps": 0,
        "padding_tokens": 0,
    }
