"""What runs at each engine step of a trace: continuous batching with chunked prefill, the way
vLLM's v1 scheduler does it.

:func:`schedule` decides every step up front and the engine only executes them, so a trace always
runs the same steps: same inputs, same batches, same pages, same generated tokens.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .._limits import argument_problem
from ..errors import ResourceConfigError
from ..units import is_positive_int
from .trace import Request

__all__ = ["Chunk", "Step", "pages_for", "schedule", "summary"]


@dataclass(frozen=True)
class Chunk:
    """The tokens of one request that run in one step."""

    request: int
    """The request's id."""
    start: int
    """Position of its first token in the request's sequence (prompt, then output)."""
    length: int
    """Tokens it runs this step; 1 for a decode."""
    pages: tuple[int, ...]
    """The request's KV-cache page ids, in order, that cover positions [0, start + length)."""
    samples: bool
    """Whether it yields an output token: a decode always does, a prefill chunk when it ends the
    prompt (that token is the request's first)."""

    @property
    def end(self) -> int:
        """Position one past its last token."""
        return self.start + self.length


@dataclass(frozen=True)
class Step:
    """One engine step: the prefill chunks and decodes it runs, and how the decodes run."""

    index: int
    """Steps executed before it; idle steps are skipped, so indices are 0, 1, 2, ..."""
    prefill: tuple[Chunk, ...]
    """Prefill chunks, running requests first (in admission order), then those admitted now."""
    decode: tuple[Chunk, ...]
    """Decodes, one token each, in admission order."""
    graph_batch: int | None
    """The CUDA-graph batch size the decodes are padded to: the smallest that holds them. None when
    there is no decode, or more than the largest graph size (they run eagerly)."""
    finished: tuple[int, ...]
    """Ids of the requests that produced their last token this step."""
    clock: int
    """The step clock it ran at, which arrival steps are compared against; it runs ahead of
    ``index`` by the idle steps skipped while waiting for an arrival."""

    @property
    def num_tokens(self) -> int:
        """Tokens it runs (prefill and decode), which the token budget bounds."""
        return sum(chunk.length for chunk in self.prefill) + len(self.decode)


@dataclass(eq=False)
class _Running:
    """A request admitted and not yet finished, and how far it has got."""

    request: Request
    """The request."""
    pages: tuple[int, ...]
    """Every page of its life, allocated at admission."""
    computed: int = 0
    """Prompt tokens prefilled so far."""
    generated: int = 0
    """Output tokens produced so far."""

    def chunk(self, start: int, length: int, page_size: int, samples: bool) -> Chunk:
        """The chunk of ``length`` tokens from ``start``, with the pages that cover it."""
        covered = math.ceil((start + length) / page_size)
        return Chunk(self.request.id, start, length, self.pages[:covered], samples)


class _PagePool:
    """Free KV-cache pages, handed out lowest id first so that a schedule never depends on the
    order in which pages were freed. A heap: taking or giving a page costs ``log n`` whatever the
    cache's size (a sorted list cost ``n``, which hundreds of thousands of pages made slow)."""

    def __init__(self, num_pages: int) -> None:
        self._free = list(range(num_pages))  # sorted: already a heap

    def __len__(self) -> int:
        return len(self._free)

    def take(self, count: int) -> tuple[int, ...]:
        """The ``count`` lowest free pages, now taken, in ascending order."""
        return tuple(heapq.heappop(self._free) for _ in range(count))

    def give(self, pages: Sequence[int]) -> None:
        """Return ``pages`` to the pool."""
        for page in pages:
            heapq.heappush(self._free, page)


def pages_for(request: Request, page_size: int) -> int:
    """Pages that hold ``request`` for its whole life (prompt and output)."""
    return math.ceil((request.prompt_len + request.output_len) / page_size)


def schedule(
    trace: Sequence[Request],
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    cuda_graph_batch_sizes: Sequence[int],
    num_pages: int,
    page_size: int,
) -> list[Step]:
    """Every step that runs ``trace`` to its end.

    Each step spends a budget of ``max_num_batched_tokens`` tokens: first one decode for each
    running request past its prompt, then the next prefill chunk of each running request still in
    its prompt, then the first chunk of each request admitted now. Requests that have arrived are
    admitted first come, first served while fewer than ``max_num_seqs`` run and the pages of the
    head request's whole life are free; a head that does not fit blocks those behind it. Pages are
    freed after the step that produces a request's last token. When nothing runs and nothing has
    arrived, the clock jumps to the next arrival.
    """
    sizes = _check_schedule_args(
        trace,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        cuda_graph_batch_sizes=cuda_graph_batch_sizes,
        num_pages=num_pages,
        page_size=page_size,
    )
    # Stable, so requests arriving at the same step keep their order in the trace.
    queue = sorted(trace, key=lambda request: request.arrival_step)
    head = 0
    pool = _PagePool(num_pages)
    running: list[_Running] = []
    steps: list[Step] = []
    clock = 0
    while head < len(queue) or running:
        if not running:
            clock = max(clock, queue[head].arrival_step)
        budget = max_num_batched_tokens
        decode: list[Chunk] = []
        prefill: list[Chunk] = []
        finished: list[_Running] = []

        for seq in running:
            if budget == 0:
                break
            prompt_len = seq.request.prompt_len
            if seq.computed < prompt_len:
                continue
            # It feeds back the token it produced last, at the position after the one before it.
            decode.append(seq.chunk(prompt_len + seq.generated - 1, 1, page_size, True))
            budget -= 1
            seq.generated += 1
            if seq.generated == seq.request.output_len:
                finished.append(seq)

        for seq in running:
            if budget == 0:
                break
            if seq.computed < seq.request.prompt_len:
                budget -= _prefill(seq, budget, page_size, prefill, finished)

        while (
            head < len(queue)
            and queue[head].arrival_step <= clock
            and len(running) < max_num_seqs
            and budget > 0
            and len(pool) >= pages_for(queue[head], page_size)
        ):
            request = queue[head]
            head += 1
            seq = _Running(request, pool.take(pages_for(request, page_size)))
            running.append(seq)
            budget -= _prefill(seq, budget, page_size, prefill, finished)

        steps.append(
            Step(
                index=len(steps),
                prefill=tuple(prefill),
                decode=tuple(decode),
                graph_batch=_graph_batch(len(decode), sizes),
                finished=tuple(seq.request.id for seq in finished),
                clock=clock,
            )
        )
        # Pages come back after the step: the finished requests' KV is still read during it.
        for seq in finished:
            running.remove(seq)
            pool.give(seq.pages)
        clock += 1
    return steps


def _prefill(
    seq: _Running, budget: int, page_size: int, prefill: list[Chunk], finished: list[_Running]
) -> int:
    """Schedule ``seq``'s next prompt chunk within ``budget``; the tokens it takes."""
    prompt_len = seq.request.prompt_len
    length = min(prompt_len - seq.computed, budget)
    start = seq.computed
    seq.computed += length
    done = seq.computed == prompt_len
    prefill.append(seq.chunk(start, length, page_size, done))
    if done:
        seq.generated = 1
        if seq.request.output_len == 1:
            finished.append(seq)
    return length


def _graph_batch(batch: int, sizes: Sequence[int]) -> int | None:
    """The smallest of the sorted ``sizes`` that holds ``batch`` decodes, None if none does."""
    if batch == 0:
        return None
    at = bisect.bisect_left(sizes, batch)
    return sizes[at] if at < len(sizes) else None


def _check_schedule_args(
    trace: Sequence[Request],
    *,
    cuda_graph_batch_sizes: Sequence[int],
    num_pages: int,
    page_size: int,
    **limits: int,
) -> list[int]:
    """Raise for the first unusable argument of :func:`schedule`, naming it; the graph batch
    sizes, sorted."""
    for name, value in {**limits, "num_pages": num_pages, "page_size": page_size}.items():
        if (problem := argument_problem(name, value, whole=True, ge=1)) is not None:
            raise ResourceConfigError(problem)
    sizes = list(cuda_graph_batch_sizes)
    if not all(is_positive_int(size) for size in sizes):
        raise ResourceConfigError(
            f"cuda_graph_batch_sizes={sizes!r} must hold positive whole numbers"
        )
    if len(set(sizes)) != len(sizes):
        raise ResourceConfigError(f"cuda_graph_batch_sizes={sizes!r} must be distinct")
    ids = set()
    for request in trace:
        if not isinstance(request, Request):
            raise ResourceConfigError(f"trace holds {request!r}, which is not a Request")
        if request.id in ids:
            raise ResourceConfigError(f"trace holds request id {request.id!r} more than once")
        ids.add(request.id)
        need = pages_for(request, page_size)
        if need > num_pages:
            raise ResourceConfigError(
                f"request {request.id} needs {need} pages of page_size={page_size} for its "
                f"prompt_len={request.prompt_len} + output_len={request.output_len} tokens, more "
                f"than num_pages={num_pages}; it could never be admitted"
            )
    return sorted(sizes)


def summary(steps: Sequence[Step]) -> dict[str, int]:
    """Totals of a schedule: steps, tokens by kind, the largest decode batch, and how many
    decode steps run under a CUDA graph or eagerly."""
    batches = [len(step.decode) for step in steps if step.decode]
    return {
        "steps": len(steps),
        "requests": sum(len(step.finished) for step in steps),
        "prefill_tokens": sum(chunk.length for step in steps for chunk in step.prefill),
        "decode_tokens": sum(batches),
        "max_decode_batch": max(batches, default=0),
        "graph_decode_steps": sum(step.graph_batch is not None for step in steps),
        "eager_decode_steps": sum(bool(step.decode) and step.graph_batch is None for step in steps),
        "padding_tokens": sum(
            step.graph_batch - len(step.decode) for step in steps if step.graph_batch is not None
        ),
    }
