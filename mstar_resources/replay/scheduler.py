"""What runs at each engine step of a trace: continuous batching with chunked prefill, decodes
first and a token budget per step, as vLLM's v1 scheduler batches.

Where it differs from vLLM: a request takes the KV-cache pages for its whole life (prompt and
every output token, which the trace gives) when it is admitted, and keeps them until it finishes;
vLLM's ``allocate_slots`` takes pages as tokens are scheduled and preempts a request when none are
left. So no request is preempted here, and the cache admits fewer requests at once than vLLM's
would; the batches an engine plans (what the workspaces are sized by) have the same shapes.

:func:`schedule` decides each step before the engine executes it, so a trace always runs the same
steps: same inputs, same batches, same pages, same generated tokens. It yields them one by one:
the dry run and the GPU path alike hold only the requests in flight.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from .._internal.limits import argument_problem
from ..errors import ResourceConfigError
from ..units import is_positive_int
from .trace import Request

__all__ = ["Arrivals", "Chunk", "Step", "pages_for", "schedule", "summary"]


@dataclass(frozen=True, eq=False)
class Chunk:
    """The tokens of one request that run in one step."""

    request: int
    """The request's id."""
    start: int
    """Position of its first token in the request's sequence (prompt, then output)."""
    length: int
    """Tokens it runs this step; 1 for a decode."""
    page_table: tuple[int, ...]
    """KV-cache page ids, in order: the request's pages for its whole life, one tuple shared by
    all its chunks (a schedule holds no copies), or with ``page_size`` 0 exactly :attr:`pages`."""
    samples: bool
    """Whether it yields an output token: a decode always does, a prefill chunk when it ends the
    prompt (that token is the request's first)."""
    page_size: int = 0
    """Tokens a page holds, which picks :attr:`pages` out of ``page_table``; 0: all of it."""

    @property
    def end(self) -> int:
        """Position one past its last token."""
        return self.start + self.length

    @property
    def num_pages(self) -> int:
        """How many pages cover positions [0, end)."""
        return -(-self.end // self.page_size) if self.page_size else len(self.page_table)

    @property
    def pages(self) -> tuple[int, ...]:
        """The request's page ids, in order, that cover positions [0, end)."""
        return self.page_table[: self.num_pages]

    def _key(self) -> tuple[int, int, int, tuple[int, ...], bool]:
        return self.request, self.start, self.length, self.pages, self.samples

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Chunk) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


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
        return Chunk(self.request.id, start, length, self.pages, samples, page_size)


class _PagePool:
    """Free KV-cache pages, handed out lowest id first so that a schedule never depends on the
    order in which pages were freed. Pages from ``never_taken`` up have never been handed out and
    are not stored; those given back wait in a heap, so the pool holds at most the pages in use
    at once, and taking or giving one costs ``log n`` whatever the cache's size."""

    def __init__(self, num_pages: int) -> None:
        self._num_pages = num_pages
        self.never_taken = 0
        """The lowest page id never handed out: the pages a schedule reached."""
        self._given_back: list[int] = []

    def __len__(self) -> int:
        return self._num_pages - self.never_taken + len(self._given_back)

    def take(self, count: int) -> tuple[int, ...]:
        """The ``count`` lowest free pages, now taken, in ascending order."""
        return tuple(self._take_one() for _ in range(count))

    def _take_one(self) -> int:
        if self._given_back:  # each is below never_taken
            return heapq.heappop(self._given_back)
        self.never_taken += 1
        return self.never_taken - 1

    def give(self, pages: Sequence[int]) -> None:
        """Return ``pages`` to the pool."""
        for page in pages:
            heapq.heappush(self._given_back, page)


def pages_for(request: Request, page_size: int) -> int:
    """Pages that hold ``request`` for its whole life (prompt and output)."""
    return math.ceil((request.prompt_len + request.output_len) / page_size)


def schedule(
    trace: Iterable[Request],
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    cuda_graph_batch_sizes: Sequence[int],
    num_pages: int,
    page_size: int,
) -> Iterator[Step]:
    """The steps that run ``trace`` to its end, made as they are asked for (``list()`` them
    to keep them).

    ``trace`` is read as the clock reaches each arrival, so a trace streamed from a file costs
    memory for the requests waiting and running only. Its requests come in arrival order with
    increasing ids, as :func:`~.trace_file.read_trace` and :func:`~.trace.synthetic_requests`
    make them.

    Each step spends a budget of ``max_num_batched_tokens`` tokens: first one decode for each
    running request past its prompt, then the next prefill chunk of each running request still in
    its prompt, then the first chunk of each request admitted now. Requests that have arrived are
    admitted first come, first served while fewer than ``max_num_seqs`` run and the pages of the
    head request's whole life are free; a head that does not fit blocks those behind it. Pages are
    freed after the step that produces a request's last token. When nothing runs and nothing has
    arrived, the clock jumps to the next arrival.

    Raises :class:`ResourceConfigError` for a bad argument at once, and for a request out of
    order, or one that could never fit ``num_pages``, when it is read.
    """
    sizes = _check_schedule_args(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        cuda_graph_batch_sizes=cuda_graph_batch_sizes,
        num_pages=num_pages,
        page_size=page_size,
    )
    return _steps(
        _check_each(trace, num_pages, page_size),
        max_num_seqs,
        max_num_batched_tokens,
        sizes,
        _PagePool(num_pages),
        page_size,
    )


def _steps(
    arrivals: Iterator[Request],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    sizes: Sequence[int],
    pool: _PagePool,
    page_size: int,
) -> Iterator[Step]:
    """The steps of :func:`schedule`, its arguments checked."""
    waiting: collections.deque[Request] = collections.deque()
    upcoming = next(arrivals, None)  # the next request not yet arrived
    running: list[_Running] = []
    index = clock = 0
    while upcoming is not None or waiting or running:
        if not running and not waiting:
            assert upcoming is not None
            clock = max(clock, upcoming.arrival_step)
        while upcoming is not None and upcoming.arrival_step <= clock:
            waiting.append(upcoming)
            upcoming = next(arrivals, None)
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
            waiting
            and len(running) < max_num_seqs
            and budget > 0
            and len(pool) >= pages_for(waiting[0], page_size)
        ):
            request = waiting.popleft()
            seq = _Running(request, pool.take(pages_for(request, page_size)))
            running.append(seq)
            budget -= _prefill(seq, budget, page_size, prefill, finished)

        yield Step(
            index=index,
            prefill=tuple(prefill),
            decode=tuple(decode),
            graph_batch=_graph_batch(len(decode), sizes),
            finished=tuple(seq.request.id for seq in finished),
            clock=clock,
        )
        # Pages come back after the step: the finished requests' KV is still read during it.
        for seq in finished:
            running.remove(seq)
            pool.give(seq.pages)
        index += 1
        clock += 1


def _check_each(trace: Iterable[Request], num_pages: int, page_size: int) -> Iterator[Request]:
    """``trace``'s requests as they are read, each refused, naming it, if it is not a request,
    comes out of order, or could never be admitted."""
    last: Request | None = None
    for request in trace:
        if not isinstance(request, Request):
            raise ResourceConfigError(f"trace holds {request!r}, which is not a Request")
        if last is not None and request.id == last.id:
            raise ResourceConfigError(f"trace holds request id {request.id!r} more than once")
        if last is not None and request.id < last.id:
            raise ResourceConfigError(
                f"trace holds request id {request.id!r} after id {last.id!r}; ids increase in "
                "arrival order"
            )
        if last is not None and request.arrival_step < last.arrival_step:
            raise ResourceConfigError(
                f"request {request.id} arrives at step {request.arrival_step}, before request "
                f"{last.id} above it (step {last.arrival_step}); a trace comes in arrival order"
            )
        need = pages_for(request, page_size)
        if need > num_pages:
            raise ResourceConfigError(
                f"request {request.id} needs {need} pages of page_size={page_size} for its "
                f"prompt_len={request.prompt_len} + output_len={request.output_len} tokens, more "
                f"than num_pages={num_pages}; it could never be admitted"
            )
        yield request
        last = request


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
    *, cuda_graph_batch_sizes: Sequence[int], num_pages: int, page_size: int, **limits: int
) -> list[int]:
    """Raise for the first unusable argument of :func:`schedule`, naming it; the graph
    batch sizes, sorted."""
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


class Arrivals(Mapping[int, Request]):
    """A trace's requests as the scheduler reads them, by id, until they finish: what an engine's
    loop looks a request's prompt up in while the schedule streams.

    Hand :meth:`stream` to :func:`schedule` as its trace; :meth:`pop` a request once its last step
    ran. It holds the requests that arrived and have not finished, never the whole trace."""

    def __init__(self, trace: Iterable[Request]) -> None:
        self._trace = iter(trace)
        self._arrived: dict[int, Request] = {}

    def stream(self) -> Iterator[Request]:
        """The trace's requests, each kept here as it is read."""
        for request in self._trace:
            self._arrived[request.id] = request
            yield request

    def pop(self, request_id: int) -> Request:
        return self._arrived.pop(request_id)

    def __getitem__(self, request_id: int) -> Request:
        return self._arrived[request_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._arrived)

    def __len__(self) -> int:
        return len(self._arrived)
