"""The replay's engine on the CPU: a setup's workspaces, warm-up, seal and serving loop, with a
reference attention (plain torch over the paged KV cache) standing in for FlashInfer's wrappers,
which need a GPU. Both setups serve one schedule and must generate the same tokens, as on the GPU;
a plan that does not fit a sealed workspace stops the setup, recorded. FlashInfer's own wrappers
are checked for how they are built, planned and run against a fake ``flashinfer`` module, and the
decode graphs are captured and replayed by a CPU stand-in for CUDA graphs."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from mstar_resources.calibration.profile import CalibrationProfile, load_profile
from mstar_resources.errors import ResourceConfigError, WorkspaceSealedError
from mstar_resources.replay.attention import (
    DUMMY_PAGE,
    Attention,
    MLAAttention,
    PagedAttention,
    PageTable,
    page_table,
    page_tensors,
    token_slots,
)
from mstar_resources.replay.buffers import Buffers, FixedBuffer, LibraryBuffers
from mstar_resources.replay.engine import SealedOverflow, Setup, SetupResult
from mstar_resources.replay.model import KVCache, Model, ModelSizes, Query
from mstar_resources.replay.roles import Roles, roles_of
from mstar_resources.replay.scheduler import Chunk, Step, schedule
from mstar_resources.replay.trace import Request, synthetic_requests
from mstar_resources.resolver import resolve
from mstar_resources.units import MIB, mb_to_hold

from ..conftest import compose_shipped

CPU = torch.device("cpu")
SMALL = [
    "calibration.limits.max_model_len=256",
    "calibration.limits.max_num_batched_tokens=64",
    "calibration.limits.max_num_seqs=4",
    "calibration.cuda_graph_batch_sizes=[1,2,4]",
]
"""A profile small enough for the CPU: warm-up plans every bounding shape of it."""
GQA, MLA = "llama3-8b-h200_calibrated", "deepseek-v3-tp8-h200_calibrated"
FIXED_BYTES = 8 * MIB
"""The fixed buffer's size: the reference wrappers take nothing from it, so any size serves."""


# --- the reference attention: FlashInfer's wrappers, in plain torch on the CPU -----------------


@dataclass(frozen=True)
class ReferencePlan:
    """What one ``plan()`` of a reference wrapper recorded: FlashInfer's paged page table."""

    qo_indptr: tuple[int, ...]
    kv_indptr: tuple[int, ...]
    indices: tuple[int, ...]
    last_page_len: tuple[int, ...]
    causal: bool

    def requests(self, page: int) -> Iterator[tuple[slice, tuple[int, ...], int]]:
        """Each request's query rows, KV page ids and KV length, read as FlashInfer reads them."""
        for i, last in enumerate(self.last_page_len):
            pages = self.indices[self.kv_indptr[i] : self.kv_indptr[i + 1]]
            rows = slice(self.qo_indptr[i], self.qo_indptr[i + 1])
            yield rows, pages, (len(pages) - 1) * page + last

    def reads(self, page: int) -> list[tuple[int, tuple[int, ...], int]]:
        """(query tokens, page ids, KV length) of each request: what attention reads."""
        return [(rows.stop - rows.start, pages, kv) for rows, pages, kv in self.requests(page)]


class ReferenceWrapper:
    """A stand-in for one FlashInfer wrapper: built on a float workspace, it records each plan's
    page table, and takes ``need(plan)`` bytes of that workspace the way FlashInfer's allocator
    does, failing with the allocator's own message when they are not there."""

    def __init__(
        self, buffer: torch.Tensor, role: str, graph_batch: int | None, pages: int, need: Need,
        page: int,
    ) -> None:  # fmt: skip
        self.buffer, self.role, self.need, self.page = buffer, role, need, page
        self.graph_batch, self.pages = graph_batch, pages
        """The batch of the CUDA graph it serves (None: eager), over at most ``pages`` pages."""
        self.plans: list[ReferencePlan] = []
        self.table: tuple[torch.Tensor, ...] = ()
        """Under a graph, as FlashInfer's: the page table's buffers, which each plan fills and
        the graph's run reads (kv indptr, page ids, last page lengths)."""
        if graph_batch is not None:
            self.table = tuple(
                torch.zeros(n, dtype=torch.int64) for n in (graph_batch + 1, pages, graph_batch)
            )

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        *,
        causal: bool,
    ) -> None:
        plan = ReferencePlan(
            *(tuple(t.tolist()) for t in (qo_indptr, kv_indptr, indices, last_page_len)), causal
        )
        need, have = self.need(self.role, plan, self.page), self.buffer.numel()
        if need > have:
            raise RuntimeError(
                f"Buffer overflow when allocating memory for batch_{self.role}_tmp_v with size "
                f"{need} and alignment 16, but only {have} bytes available in AlignedAllocator. "
                "Increase the workspace buffer size."
            )
        self.plans.append(plan)
        if self.table:
            kv_indptr_buffer, indices_buffer, last_buffer = self.table
            kv_indptr_buffer.copy_(kv_indptr)
            indices_buffer.fill_(DUMMY_PAGE)[: indices.numel()].copy_(indices)
            last_buffer.copy_(last_page_len)


Need = Callable[[str, ReferencePlan, int], int]
"""Float-workspace bytes a reference wrapper's plan takes: (role, plan, page size) -> bytes."""


def no_need(role: str, plan: ReferencePlan, page: int) -> int:
    return 0


def context_need(per_token: int) -> Need:
    """A need that grows with the plan's context, as FlashInfer's split-KV partials do."""

    def need(role: str, plan: ReferencePlan, page: int) -> int:
        return per_token * sum(kv for _, _, kv in plan.requests(page))

    return need


def read(cache: torch.Tensor, pages: list[int], kv_len: int) -> torch.Tensor:
    """A request's first ``kv_len`` tokens in ``pages`` of one layer's ``cache`` [pages, page,
    ...]. Each must have been written: the tests fill the cache with NaN (see :func:`setup_of`),
    so that a slot no token was written to fails here, whatever memory it held."""
    context = cache[pages].flatten(0, 1)[:kv_len].float()
    if context.isnan().any():
        raise AssertionError(f"attention read KV-cache slots no token was written to: {pages}")
    return context


class ReferenceAttention(Attention):
    """FlashInfer's paged and MLA wrappers, honestly replaced on the CPU: each wrapper records its
    plans (``ReferenceWrapper``), and ``run`` computes paged attention in plain torch from the last
    page table planned: each request's pages gathered from the KV cache, causal softmax(q k^T *
    scale) v; for MLA, scores of q_nope . ckv + q_pe . kpe, weights over ckv."""

    def __init__(
        self, model: Model, profile: CalibrationProfile, roles: Roles, need: Need = no_need
    ) -> None:
        super().__init__(model, profile, roles)
        self.need = need
        self.wrappers: list[ReferenceWrapper] = []
        s = self.shape
        # FlashInfer's default scale, and MLAAttention's (the query-key width before absorption).
        self.scale = (s.head_dim + s.head_dim_kpe) ** -0.5 if s.mla else s.head_dim**-0.5
        self.max_pages = math.ceil(profile.limits.max_model_len / s.page_size)
        """The most pages one request holds."""

    def prefill_wrapper(self, buffer: torch.Tensor) -> ReferenceWrapper:
        return self._wrapper(buffer, "prefill", None, 0)

    def decode_wrapper(
        self, buffer: torch.Tensor, graph_batch: int | None, pages: int
    ) -> ReferenceWrapper:
        return self._wrapper(buffer, "decode", graph_batch, pages)

    def prefill_plan(
        self, qo: torch.Tensor, pages: PageTable
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (qo, *pages), {"causal": True}

    def decode_plan(self, pages: PageTable) -> tuple[tuple[Any, ...], dict[str, Any]]:
        qo = torch.arange(pages[2].numel() + 1, dtype=torch.int32)
        return (qo, *pages), {"causal": False}

    def run(self, wrapper: Any, kv_cache: KVCache, layer: int, q: Query) -> torch.Tensor:
        if wrapper.table:
            return self._graph_decode(wrapper, kv_cache, layer, q)
        s, plan = self.shape, wrapper.plans[-1]
        out = []
        for rows, pages, kv_len in plan.requests(s.page_size):
            ids, n = list(pages), rows.stop - rows.start
            if s.mla:
                assert isinstance(q, tuple)
                q_nope, q_pe = (part[rows].float() for part in q)
                ckv, kpe = (read(cache[layer], ids, kv_len) for cache in kv_cache)
                scores = torch.einsum("qhc,kc->hqk", q_nope, ckv)
                scores += torch.einsum("qhr,kr->hqk", q_pe, kpe)
                weights = self._softmax(scores, n, kv_len, plan.causal)
                out.append(torch.einsum("hqk,kc->qhc", weights, ckv))
            else:
                assert isinstance(q, torch.Tensor)
                group = s.qo_heads // s.kv_heads  # query heads that share a KV head
                k, v = (
                    read(kv_cache[0][layer][:, i], ids, kv_len).repeat_interleave(group, dim=1)
                    for i in (0, 1)
                )
                scores = torch.einsum("qhd,khd->hqk", q[rows].float(), k)
                weights = self._softmax(scores, n, kv_len, plan.causal)
                out.append(torch.einsum("hqk,khd->qhd", weights, v))
        return torch.cat(out).to(s.dtype)

    def _graph_decode(
        self, wrapper: ReferenceWrapper, kv_cache: KVCache, layer: int, q: Query
    ) -> torch.Tensor:
        """The same attention for one query a request, from the page table's buffers, in tensor
        operations only: a CUDA graph replays them on whatever the last plan wrote there. Each
        request's pages are gathered up to the most a request holds, the tail masked (and
        zeroed: the cache past a request's context was never written)."""
        s = self.shape
        kv_indptr, indices, last = wrapper.table
        counts = kv_indptr[1:] - kv_indptr[:-1]
        slot = torch.arange(self.max_pages)
        at = (kv_indptr[:-1, None] + slot).clamp(max=indices.numel() - 1)
        ids = torch.where(slot < counts[:, None], indices[at], DUMMY_PAGE)  # [batch, pages]
        kv_len = (counts - 1) * s.page_size + last
        hidden = torch.arange(self.max_pages * s.page_size) >= kv_len[:, None]  # [batch, tokens]

        def keys(pages: torch.Tensor) -> torch.Tensor:
            """[batch, pages, page, ...] as [batch, tokens, ...], zero past each context."""
            flat = pages.flatten(1, 2).float()
            return flat.masked_fill(hidden.view(*hidden.shape, *[1] * (flat.dim() - 2)), 0)

        if s.mla:
            assert isinstance(q, tuple)
            ckv, kpe = (keys(cache[layer][ids]) for cache in kv_cache)
            scores = torch.einsum("bhc,btc->bht", q[0].float(), ckv)
            scores += torch.einsum("bhr,btr->bht", q[1].float(), kpe)
            weights = (scores.masked_fill(hidden[:, None], float("-inf")) * self.scale).softmax(-1)
            return torch.einsum("bht,btc->bhc", weights, ckv).to(s.dtype)
        assert isinstance(q, torch.Tensor)
        group = s.qo_heads // s.kv_heads
        k, v = (
            keys(kv_cache[0][layer][ids][:, :, i]).repeat_interleave(group, dim=2) for i in (0, 1)
        )
        scores = torch.einsum("bhd,bthd->bht", q.float(), k)
        weights = (scores.masked_fill(hidden[:, None], float("-inf")) * self.scale).softmax(-1)
        return torch.einsum("bht,bthd->bhd", weights, v).to(s.dtype)

    def _softmax(self, scores: torch.Tensor, n: int, kv_len: int, causal: bool) -> torch.Tensor:
        """Softmax over the keys; causal: query j sits at position kv_len - n + j and sees the
        keys up to it."""
        if causal:
            hidden = torch.arange(kv_len)[None, :] > torch.arange(n)[:, None] + (kv_len - n)
            scores = scores.masked_fill(hidden, float("-inf"))
        return (scores * self.scale).softmax(-1)

    def _wrapper(
        self, buffer: torch.Tensor, role: str, graph_batch: int | None, pages: int
    ) -> ReferenceWrapper:
        wrapper = ReferenceWrapper(
            buffer, role, graph_batch, pages, self.need, self.shape.page_size
        )
        self.wrappers.append(wrapper)
        return wrapper


# --- a shipped deployment made small, its trace and schedule -----------------------------------


@dataclass(frozen=True)
class Deployment:
    """A shipped deployment with :data:`SMALL` limits, a tiny model, a trace and its schedule."""

    name: str
    cfg: Any
    profile: CalibrationProfile
    roles: Roles
    model: Model
    trace: list[Request]
    steps: list[Step]
    pages: int
    """KV-cache pages, the dummy page included: room for ``max_num_seqs`` whole requests."""


def small_model(profile: CalibrationProfile, *, float32: bool = True) -> Model:
    """The deployment's attention (heads, head dims, page size, KV dtype) in one layer, over a
    64-token vocabulary. The residual and the MLP, which attention never sees, are narrowed to
    256 and 512 so that the CPU runs a step in milliseconds; so are the weights and queries
    computed in float32 where ``float32`` (a CPU's bf16 matmul is some 60 times slower)."""
    shape = ModelSizes.of(profile, layers=1, vocab_size=64, tp=1)
    shape = dataclasses.replace(shape, hidden=256, mlp=512)
    return Model(dataclasses.replace(shape, dtype=torch.float32) if float32 else shape, CPU, seed=0)


_DEPLOYMENTS: dict[tuple[str, ...], Deployment] = {}


def deployment(name: str, *overrides: str) -> Deployment:
    """``name`` composed with :data:`SMALL` and ``overrides``; made once a module."""
    key = (name, *overrides)
    if key not in _DEPLOYMENTS:
        cfg = compose_shipped([f"deployment={name}", *SMALL, *overrides])
        profile = load_profile(cfg.calibration)
        roles = roles_of(resolve(cfg.resources, {}), profile)
        model = small_model(profile)
        limits, page = profile.limits, model.shape.page_size
        # Five short requests (see test_the_schedule_chunks_a_prompt_and_fills_a_decode_batch).
        trace = list(synthetic_requests(
            5, 3, limits.max_model_len, model.shape.vocab_size, prompt_median=40,
            output_median=5, sigma=0.6, arrivals_per_step=1.0,
        ))  # fmt: skip
        pages = limits.max_num_seqs * math.ceil(limits.max_model_len / page)
        steps = list(schedule(
            trace, max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            cuda_graph_batch_sizes=profile.cuda_graph_batch_sizes, num_pages=pages,
            page_size=page,
        ))  # fmt: skip
        _DEPLOYMENTS[key] = Deployment(name, cfg, profile, roles, model, trace, steps, pages + 1)
    return _DEPLOYMENTS[key]


def setup_of(
    dep: Deployment, buffers: Buffers, attention: ReferenceAttention, cuda_graphs: bool = False,
    group: Any = None,
) -> Setup:  # fmt: skip
    """A setup over ``dep`` whose KV cache reads as never written (NaN) but for the dummy page."""
    setup = Setup(
        dep.model, dep.profile, buffers, dep.pages, group, cuda_graphs, dep.roles,
        attention=attention,
    )  # fmt: skip
    for cache in setup.kv_cache:
        cache[:, DUMMY_PAGE + 1 :].fill_(float("nan"))
    return setup


def library_buffers(dep: Deployment) -> LibraryBuffers:
    return LibraryBuffers(resolve(dep.cfg.resources, {}), torch.device("cpu"), dep.roles)


@dataclass(frozen=True)
class Run:
    """One setup, warmed up (or not), sealed and served over its deployment's schedule."""

    setup: Setup
    attention: ReferenceAttention
    result: SetupResult
    warm_plans: list[int]
    """Plans each wrapper had made when warm-up ended, in the order they were built."""
    progress: Progress


class Progress:
    """Counts the steps a setup reports served, as the app's progress bar does."""

    def __init__(self) -> None:
        self.steps = 0

    def update(self) -> None:
        self.steps += 1


def run(dep: Deployment, buffers: Buffers, *, warm_up: bool = True, need: Need = no_need) -> Run:
    attention = ReferenceAttention(dep.model, dep.profile, dep.roles, need)
    setup = setup_of(dep, buffers, attention)
    if warm_up:
        setup.warm_up()
    warm = [len(wrapper.plans) for wrapper in attention.wrappers]
    setup.seal_and_capture()
    progress = Progress()
    return Run(setup, attention, setup.serve(dep.steps, dep.trace, progress), warm, progress)


_SERVED: dict[str, tuple[Run, Run]] = {}


def served_runs(name: str) -> tuple[Run, Run]:
    """The library's setup and the fixed buffer's, each served once a module."""
    if name not in _SERVED:
        dep = deployment(name)
        _SERVED[name] = (run(dep, library_buffers(dep)), run(dep, FixedBuffer(FIXED_BYTES, CPU)))
    return _SERVED[name]


@pytest.fixture(scope="module", autouse=True)
def _forget_at_the_end():
    """The deployments and runs are shared by this module's tests, and freed after them."""
    yield
    _DEPLOYMENTS.clear()
    _SERVED.clear()


@pytest.fixture(params=[GQA, MLA], ids=["gqa", "mla"])
def dep(request: pytest.FixtureRequest) -> Deployment:
    return deployment(request.param)


@pytest.fixture
def runs(dep: Deployment) -> tuple[Run, Run]:
    return served_runs(dep.name)


def workspace_of(buffers: Buffers, label: str, cg_slot: int | None) -> torch.Tensor:
    """The tensor of the library's workspace for (``label``, ``cg_slot``)."""
    assert isinstance(buffers, LibraryBuffers)
    (found,) = [
        pool.get(label, cg_slot)
        for pool in buffers.pools.values()
        if (label, cg_slot) in (pool.serves or ())
    ]
    return found.tensor


def expected_reads(chunks: Sequence[Chunk]) -> list[tuple[int, tuple[int, ...], int]]:
    """What attention must read for ``chunks``: each one's query tokens, its pages (past the
    dummy page, so each id one up) and its context, the chunk's own tokens included."""
    return [(c.length, tuple(p + 1 for p in c.pages), c.end) for c in chunks]


# --- both setups over one schedule ------------------------------------------------------------


def test_the_schedule_chunks_a_prompt_and_fills_a_decode_batch(dep):
    limits = dep.profile.limits
    assert any(not chunk.samples for step in dep.steps for chunk in step.prefill)
    assert any(step.prefill and step.decode for step in dep.steps)
    assert max(len(step.decode) for step in dep.steps) == limits.max_num_seqs
    assert max(request.prompt_len for request in dep.trace) > limits.max_num_batched_tokens


def test_both_setups_generate_the_same_tokens_each_request_its_output_len(dep, runs):
    ours, theirs = (r.result for r in runs)
    assert ours.tokens == theirs.tokens
    assert {request: len(tokens) for request, tokens in ours.tokens.items()} == {
        request.id: request.output_len for request in dep.trace
    }
    assert ours.tokens_out == sum(request.output_len for request in dep.trace)
    generated = [token for tokens in ours.tokens.values() for token in tokens]
    assert all(0 <= token < dep.model.shape.vocab_size for token in generated)
    assert len(set(generated)) > 1  # the prompts, not a constant, decide what comes out


def test_the_result_says_what_each_setup_held_and_did(dep, runs):
    shape, decode_steps = dep.model.shape, sum(bool(step.decode) for step in dep.steps)
    # The calibrated floors: 17 MB of prefill, and 3 MB (MLA: 17) in each of decode's two slots.
    floors = {GQA: (17 + 2 * 3) * MIB, MLA: 3 * 17 * MIB}[dep.name]
    for (name, workspace), done in zip(
        [("mstar-resources", floors), ("fixed 8 MiB", FIXED_BYTES)], runs, strict=True
    ):
        result = done.result
        assert (result.name, result.workspace_bytes) == (name, workspace)
        assert (result.kv_pages, result.kv_tokens) == (
            dep.pages - 1, (dep.pages - 1) * shape.page_size,
        )  # fmt: skip
        assert result.kv_bytes == dep.pages * shape.page_size * shape.kv_bytes_per_token
        assert result.weights_bytes == dep.model.bytes
        assert (result.steps_served, len(result.decode_step_s)) == (len(dep.steps), decode_steps)
        assert done.progress.steps == len(dep.steps)
        assert (result.growths_before_seal, result.growths_after_seal) == (0, 0)
        assert result.sealed_overflow is None


def test_the_dummy_page_is_zeroed_and_no_eager_step_writes_it(dep, runs):
    for done in runs:
        for cache in done.setup.kv_cache:
            assert not cache[:, DUMMY_PAGE].any()


def test_prefill_plans_on_its_workspace_and_decode_on_its_label_s_cg_slot_0(dep, runs):
    ours, theirs = runs
    prefill, decode = ours.attention.wrappers  # no graphs: one prefill, one eager decode
    assert (prefill.role, decode.role) == ("prefill", "decode")
    assert prefill.buffer is workspace_of(ours.setup.buffers, dep.roles.prefill, None)
    assert decode.buffer is workspace_of(ours.setup.buffers, dep.roles.decode, 0)
    assert prefill.buffer is not decode.buffer
    fixed = theirs.setup.buffers
    assert isinstance(fixed, FixedBuffer)
    assert all(wrapper.buffer is fixed.tensor for wrapper in theirs.attention.wrappers)
    pools = ours.setup.buffers.pools
    assert all(s.sealed for pool in pools.values() for s in pool.stats())


def test_each_step_plans_its_chunks_pages_past_the_dummy_page(dep, runs):
    page = dep.model.shape.page_size
    for done in runs:
        prefill, decode = done.attention.wrappers
        warm_prefill, warm_decode = done.warm_plans
        assert [p.reads(page) for p in prefill.plans[warm_prefill:]] == [
            expected_reads(step.prefill) for step in dep.steps if step.prefill
        ]
        assert [p.reads(page) for p in decode.plans[warm_decode:]] == [
            expected_reads(step.decode) for step in dep.steps if step.decode
        ]
        assert all(p.causal for p in prefill.plans)
        assert not any(p.causal for p in decode.plans)


def test_warm_up_plans_each_label_s_bounding_shapes_on_the_dummy_page(dep, runs):
    from mstar_resources.calibration.shapes import shapes_for

    profile, page = dep.profile, dep.model.shape.page_size
    ours, _ = runs
    for wrapper, warm, label in zip(
        ours.attention.wrappers, ours.warm_plans, (dep.roles.prefill, dep.roles.decode), strict=True
    ):
        shapes = shapes_for(profile.plans[label], profile, cuda_graph=False)
        q_len = (lambda shape: shape.q_len) if wrapper.role == "prefill" else (lambda shape: 1)
        assert [p.reads(page) for p in wrapper.plans[:warm]] == [
            [(q_len(s), (DUMMY_PAGE,) * math.ceil(s.kv_len / page), s.kv_len)] * s.batch
            for s in shapes
        ]
        # The longest context, and the most requests, are among them.
        assert max(s.kv_len for s in shapes) == profile.limits.max_model_len
        assert max(s.batch for s in shapes) == profile.limits.max_num_seqs


# --- growth before sealing, and a sealed workspace's refusal -----------------------------------

PER_TOKEN = 32 * 1024
"""The reference wrappers' stand-in need: 32 KiB of float workspace a token of context."""


def test_warm_up_grows_each_workspace_to_its_largest_plan_and_serving_grows_none():
    dep = deployment(GQA)
    grown = run(dep, library_buffers(dep), need=context_need(PER_TOKEN))
    limits = dep.profile.limits
    largest = PER_TOKEN * limits.max_num_seqs * limits.max_model_len  # 32 MiB
    stats = {s.name: s for pool in grown.setup.buffers.pools.values() for s in pool.stats()}
    assert {name: s.bytes for name, s in stats.items()} == {
        "attention:prefill": largest, "attention:decode:cg0": largest,
        "attention:decode:cg1": 3 * MIB,  # no plan of the replay's is made in slot 1
    }  # fmt: skip
    result = grown.result
    assert result.growths_before_seal == sum(s.times_grown for s in stats.values()) >= 2
    assert (result.growths_after_seal, result.sealed_overflow) == (0, None)
    assert result.steps_served == len(dep.steps)
    # The workspaces' sizes change nothing the model computes.
    assert result.tokens == served_runs(GQA)[0].result.tokens


def test_a_plan_past_a_sealed_floor_stops_the_setup_and_is_recorded():
    dep = deployment(GQA)
    stopped = run(dep, library_buffers(dep), warm_up=False, need=context_need(PER_TOKEN))
    floors = {"prefill": 17 * MIB, "decode": 3 * MIB}
    # The first plan whose context needs more than its workspace holds.
    at, role, need = next(
        (step.index, role, need)
        for step in dep.steps
        for role, chunks in (("prefill", step.prefill), ("decode", step.decode))
        for need in [PER_TOKEN * sum(c.end for c in chunks)]
        if need > floors[role]
    )
    assert at > 0
    workspace = {"prefill": "attention:prefill", "decode": "attention:decode:cg0"}[role]
    setting = f"resources.attn.{role}.declared_mb"
    overflow = stopped.result.sealed_overflow
    assert overflow is not None
    assert dataclasses.astuple(overflow)[:5] == (
        workspace, floors[role], need, setting, mb_to_hold(need),
    )  # fmt: skip
    assert f"is sealed at {floors[role]:,} bytes" in overflow.message
    assert f"set {setting}={mb_to_hold(need)} or more" in overflow.message
    assert stopped.result.steps_served == stopped.progress.steps == at  # not the one it stopped at
    assert stopped.result.growths_after_seal == 0
    # What it generated before is kept: each request's tokens so far, as the full run began.
    full = served_runs(GQA)[0].result.tokens
    assert stopped.result.tokens
    for request, tokens in stopped.result.tokens.items():
        assert tokens == full[request][: len(tokens)]


def test_a_sealed_overflow_keeps_the_error_s_figures_and_text():
    error = WorkspaceSealedError(
        "workspace 'w' is sealed", workspace="w", held_bytes=1, needed_bytes=2,
        setting="resources.attn.decode.declared_mb", suggested_mb=1,
    )  # fmt: skip
    assert SealedOverflow.of(error) == SealedOverflow(
        "w", 1, 2, "resources.attn.decode.declared_mb", 1, "workspace 'w' is sealed"
    )


# --- with CUDA graphs: one decode wrapper a graph batch size, planned padded ------------------


def test_graph_decodes_plan_padding_rows_on_the_dummy_page_at_warm_up():
    dep = deployment(GQA)
    attention = ReferenceAttention(dep.model, dep.profile, dep.roles)
    setup = setup_of(dep, FixedBuffer(MIB, CPU), attention, cuda_graphs=True)
    setup.warm_up()
    prefill, eager, *graphs = attention.wrappers
    assert eager.plans == []  # with graphs, decode plans only the graph batches
    assert prefill.plans
    max_pages = math.ceil(dep.profile.limits.max_model_len / dep.model.shape.page_size)
    assert [(w.graph_batch, w.pages) for w in graphs] == [
        (batch, min(dep.pages, batch * max_pages)) for batch in (1, 2, 4)
    ]
    for wrapper in graphs:
        padding = [(1, (DUMMY_PAGE,), 1)] * (wrapper.graph_batch or 0)
        assert [p.reads(dep.model.shape.page_size) for p in wrapper.plans] == [padding]


def test_a_graph_plans_its_decodes_padded_to_its_batch():
    dep = deployment(GQA)
    attention = ReferenceAttention(dep.model, dep.profile, dep.roles)
    setup = setup_of(dep, FixedBuffer(MIB, CPU), attention, cuda_graphs=True)
    step = next(step for step in dep.steps if len(step.decode) == 3)
    assert step.graph_batch == 4
    setup.graphs[4].plan(step.decode)
    (plan,) = setup.graphs[4].wrapper.plans
    assert plan.reads(dep.model.shape.page_size) == [
        *expected_reads(step.decode),
        (1, (DUMMY_PAGE,), 1),
    ]
    assert not plan.causal


def test_a_tree_that_does_not_serve_decode_in_cg_slot_0_is_refused_naming_the_setting():
    dep = deployment(GQA)
    cfg = compose_shipped([f"deployment={GQA}", *SMALL, "resources.attn.decode.cg_slots=[1]"])
    with pytest.raises(ResourceConfigError, match=r"serves label 'decode' in cg slot 0; .* "
                       r"resources\.attn\.decode\.cg_slots=\[0\]"):  # fmt: skip
        LibraryBuffers(resolve(cfg.resources, {}), torch.device("cpu"), dep.roles)


# --- the pure helpers: FlashInfer's page table and the KV slots of new tokens ------------------

PAGE = 16


@pytest.mark.parametrize(
    ("chunks", "table"),
    [
        pytest.param([], ([0], [], []), id="none"),
        pytest.param([Chunk(0, 0, 20, (3, 7), True)], ([0, 2], [4, 8], [4]), id="prefill"),
        pytest.param([Chunk(0, 16, 1, (3, 7), True)], ([0, 2], [4, 8], [1]),
                     id="decode-first-of-a-page"),
        pytest.param([Chunk(0, 15, 1, (3,), True)], ([0, 1], [4], [16]),
                     id="decode-fills-the-page"),
        pytest.param([Chunk(0, 32, 8, (0, 1, 2), False), Chunk(5, 3, 1, (9,), True)],
                     ([0, 3, 4], [1, 2, 3, 10], [8, 4]), id="two-requests"),
    ],
)  # fmt: skip
def test_the_page_table_shifts_page_ids_past_the_dummy_page(chunks, table):
    assert page_table(chunks, PAGE) == table
    tensors = page_tensors(chunks, PAGE, CPU)
    assert [t.tolist() for t in tensors] == list(table)
    assert all(t.dtype == torch.int32 and t.device == CPU for t in tensors)


@pytest.mark.parametrize(
    ("chunks", "slots"),
    [
        pytest.param([Chunk(0, 14, 4, (3, 7), False)], ([4, 4, 8, 8], [14, 15, 0, 1]),
                     id="across-a-page"),
        pytest.param([Chunk(0, 16, 1, (3, 7), True), Chunk(1, 0, 2, (0,), True)],
                     ([8, 1, 1], [0, 0, 1]), id="a-decode-and-a-prefill"),
        pytest.param([], ([], []), id="none"),
    ],
)  # fmt: skip
def test_each_new_token_goes_to_its_page_and_offset(chunks, slots):
    assert token_slots(chunks, PAGE) == slots


# --- FlashInfer's wrappers, as the setup builds, plans and runs them (a fake module) -----------


class FakeFlashInferWrapper:
    """Stands in for one of FlashInfer's wrapper classes in a fake ``flashinfer`` module: it
    records how it was built and run, and runs to :data:`FAKE_OUTPUT`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs
        self.runs: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def run(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.runs.append((args, kwargs))
        return FAKE_OUTPUT


FAKE_OUTPUT = torch.zeros(1)


@pytest.fixture
def recording_flashinfer(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Stand-ins for ``flashinfer`` and ``flashinfer.mla`` in ``sys.modules``, whose wrapper
    classes only record how they were built. Not FlashInfer: the tests using them check what the
    replay asks for (which class, which arguments); that FlashInfer takes it is checked on a GPU
    (``test_replay_gpu.py``)."""
    flashinfer, mla = types.ModuleType("flashinfer"), types.ModuleType("flashinfer.mla")
    for module, name in [
        (flashinfer, "BatchPrefillWithPagedKVCacheWrapper"),
        (flashinfer, "BatchDecodeWithPagedKVCacheWrapper"),
        (mla, "BatchMLAPagedAttentionWrapper"),
    ]:
        setattr(module, name, type(name, (FakeFlashInferWrapper,), {}))

    class MLAPlanMetadata:
        @staticmethod
        def csr(*tensors: torch.Tensor) -> tuple[str, tuple[torch.Tensor, ...]]:
            return "csr", tensors

    mla.MLAPlanMetadata = MLAPlanMetadata  # type: ignore[attr-defined]
    flashinfer.mla = mla  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer)
    monkeypatch.setitem(sys.modules, "flashinfer.mla", mla)
    return flashinfer


def zeros_of(*sizes: int) -> list[tuple[int, torch.dtype, bool]]:
    return [(size, torch.int32, True) for size in sizes]


def summary(tensor: torch.Tensor) -> tuple[int, torch.dtype, bool]:
    return tensor.numel(), tensor.dtype, not tensor.any().item()


def test_the_setup_picks_paged_or_mla_attention_by_the_model(recording_flashinfer):
    for name, kind in ((GQA, PagedAttention), (MLA, MLAAttention)):
        dep = deployment(name)
        setup = Setup(dep.model, dep.profile, FixedBuffer(MIB, CPU), 3, None, False, dep.roles)
        assert type(setup.attention) is kind
        assert setup.prefill_wrapper.args[0] is setup.buffers.prefill()


def test_paged_attention_asks_for_wrappers_on_the_buffer_with_the_profile_s_backends(
    recording_flashinfer,
):
    dep = deployment(GQA)  # served with vLLM's plans: tensor-core decode, backend auto
    attention = PagedAttention(dep.model, dep.profile, dep.roles)
    buffer = torch.zeros(64, dtype=torch.uint8)
    prefill = attention.prefill_wrapper(buffer)
    eager = attention.decode_wrapper(buffer, None, 0)
    graph = attention.decode_wrapper(buffer, 4, 40)
    assert type(prefill) is recording_flashinfer.BatchPrefillWithPagedKVCacheWrapper
    assert type(eager) is type(graph) is recording_flashinfer.BatchDecodeWithPagedKVCacheWrapper
    assert (prefill.args, prefill.kwargs) == ((buffer, "NHD"), {"backend": "fa2"})
    tensor_cores = {"backend": "auto", "use_tensor_cores": True}
    assert (eager.args, eager.kwargs) == ((buffer, "NHD"), tensor_cores)
    # Under a graph, index buffers of the graph's batch and page count, which plans fill.
    assert graph.args == (buffer, "NHD")
    assert graph.kwargs.pop("use_cuda_graph") is True
    assert {name: graph.kwargs.pop(name) for name in tensor_cores} == tensor_cores
    names = ["paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer"]
    assert {name: summary(t) for name, t in graph.kwargs.items()} == dict(
        zip(names, zeros_of(5, 40, 4), strict=True)
    )


def test_decode_as_declared_is_planned_without_tensor_cores(recording_flashinfer):
    dep = deployment(GQA, "calibration.engine=null")
    attention = PagedAttention(dep.model, dep.profile, dep.roles)
    eager = attention.decode_wrapper(torch.zeros(64, dtype=torch.uint8), None, 0)
    assert eager.kwargs == {"backend": "fa2"}


def test_mla_attention_asks_for_the_mla_wrapper_class_for_both_roles(recording_flashinfer):
    dep = deployment(MLA)
    attention = MLAAttention(dep.model, dep.profile, dep.roles)
    buffer = torch.zeros(64, dtype=torch.uint8)
    prefill = attention.prefill_wrapper(buffer)
    eager = attention.decode_wrapper(buffer, None, 0)
    graph = attention.decode_wrapper(buffer, 4, 40)
    kind = recording_flashinfer.mla.BatchMLAPagedAttentionWrapper
    assert type(prefill) is type(eager) is type(graph) is kind
    for wrapper in (prefill, eager):
        assert (wrapper.args, wrapper.kwargs) == ((buffer,), {"backend": "auto"})
    assert graph.args == (buffer,)
    assert graph.kwargs.pop("backend") == "auto" and graph.kwargs.pop("use_cuda_graph") is True
    assert {name: summary(t) for name, t in graph.kwargs.items()} == dict(
        zip(["qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"], zeros_of(5, 5, 40, 4),
            strict=True)
    )  # fmt: skip


def test_paged_plans_pass_the_page_table_then_the_heads():
    dep = deployment(GQA)
    attention = PagedAttention(small_model(dep.profile, float32=False), dep.profile, dep.roles)
    pages = page_tensors([Chunk(0, 0, 20, (3, 7), True)], PAGE, CPU)
    qo = torch.tensor([0, 20], dtype=torch.int32)
    dtypes = {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    # Query heads, KV heads, head dim, page size: Llama 3 8B's.
    assert attention.prefill_plan(qo, pages) == (
        (qo, *pages, 32, 8, 128, 16), {"causal": True, **dtypes},
    )  # fmt: skip
    assert attention.decode_plan(pages) == ((*pages, 32, 8, 128, 16), dtypes)
    assert attention.backends == {"prefill": "fa2", "decode": "auto"}


def test_paged_plans_carry_the_plans_kv_split_options():
    dep = deployment(GQA, "calibration.deterministic=true")  # vLLM's batch-invariant mode
    attention = PagedAttention(dep.model, dep.profile, dep.roles)
    pages = page_tensors([Chunk(0, 0, 20, (3, 7), True)], PAGE, CPU)
    qo = torch.tensor([0, 20], dtype=torch.int32)
    prefill_split = {"fixed_split_size": 4096, "disable_split_kv": True}
    assert prefill_split.items() <= attention.prefill_plan(qo, pages)[1].items()
    decode_split = {"fixed_split_size": 2048, "disable_split_kv": True}
    assert decode_split.items() <= attention.decode_plan(pages)[1].items()


@pytest.mark.parametrize(
    ("role", "chunks", "qo", "lengths"),
    [
        pytest.param("prefill", [Chunk(0, 0, 70, (2, 5), True), Chunk(1, 10, 3, (0,), True)],
                     [0, 70, 73], [70, 13], id="prefill"),
        pytest.param("decode", [Chunk(0, 70, 1, (2, 5), True), Chunk(1, 13, 1, (0,), True)],
                     [0, 1, 2], [71, 14], id="decode"),
    ],
)  # fmt: skip
def test_mla_plans_take_the_page_table_as_csr_metadata(
    recording_flashinfer, role, chunks, qo, lengths
):
    dep = deployment(MLA)
    attention = MLAAttention(small_model(dep.profile, float32=False), dep.profile, dep.roles)
    pages = page_tensors(chunks, 64, CPU)
    if role == "prefill":
        args, kwargs = attention.prefill_plan(torch.tensor(qo, dtype=torch.int32), pages)
    else:
        args, kwargs = attention.decode_plan(pages)
    form, (qo_indptr, kv_indptr, indices, kv_lengths) = kwargs.pop("metadata")
    assert (args, form, kv_indptr, indices) == ((), "csr", pages[0], pages[1])
    assert (qo_indptr.tolist(), kv_lengths.tolist()) == (qo, lengths)
    assert kwargs == {
        "num_heads": 16, "head_dim_ckv": 512, "head_dim_kpe": 64, "page_size": 64,
        "causal": role == "prefill", "sm_scale": (128 + 64) ** -0.5, "query_layout": "split",
        "kv_cache_layout": "split", "q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16,
    }  # fmt: skip


def attention_of(kind: type[Attention], name: str) -> Attention:
    dep = deployment(name)
    return kind(dep.model, dep.profile, dep.roles)


def test_run_hands_the_wrapper_the_queries_and_that_layer_s_cache():
    layers = 2
    wrapper = FakeFlashInferWrapper()
    gqa = attention_of(PagedAttention, GQA)
    cache = (torch.zeros(layers, 3, 2, 16, 8, 128),)
    q = torch.zeros(5, 32, 128)
    assert gqa.run(wrapper, cache, 1, q) is FAKE_OUTPUT
    ((args, kwargs),) = wrapper.runs
    assert args[0] is q and kwargs == {}
    assert args[1].data_ptr() == cache[0][1].data_ptr() and args[1].shape == cache[0][1].shape

    wrapper = FakeFlashInferWrapper()
    mla = attention_of(MLAAttention, MLA)
    ckv, kpe = torch.zeros(layers, 3, 64, 512), torch.zeros(layers, 3, 64, 64)
    q_mla = (torch.zeros(5, 16, 512), torch.zeros(5, 16, 64))
    assert mla.run(wrapper, (ckv, kpe), 1, q_mla) is FAKE_OUTPUT
    ((args, kwargs),) = wrapper.runs
    assert args == () and kwargs["query"] is q_mla
    assert [t.data_ptr() for t in kwargs["kv_cache"]] == [ckv[1].data_ptr(), kpe[1].data_ptr()]


# --- CUDA graphs, faked on the CPU: captured, replayed, padded ---------------------------------


class FakeCUDAGraph:
    """Stands in for ``torch.cuda.CUDAGraph`` on the CPU. Capturing records every aten operation
    run on tensors; replaying runs them again on the same tensors, as a graph replays its kernels
    on the same memory. What the host decided at capture (a number, a shape, which tensors) stays
    as it was, as in a real graph: between replays only the tensors' contents change."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = []
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for op, args, kwargs, out in self.ops:
            again = op(*args, **kwargs)
            if op._schema.is_mutable:  # it wrote into its arguments again
                continue
            for old, new in zip(_flat(out), _flat(again), strict=True):
                # A view is the same memory again; a fresh result goes where its readers read.
                if isinstance(old, torch.Tensor) and old.data_ptr() != new.data_ptr():
                    old.copy_(new)


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple | list) else [out]


class _Capture(TorchDispatchMode):
    """Records each operation into ``graph`` as it runs (a real capture runs nothing)."""

    def __init__(self, graph: FakeCUDAGraph) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(
        self, op: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = op(*args, **kwargs)
        self.graph.ops.append((op, args, kwargs, out))
        return out


class FakeStream:
    """Stands in for ``torch.cuda.Stream``: the CPU runs one operation at a time."""

    def wait_stream(self, stream: FakeStream) -> None:
        pass


@pytest.fixture
def fake_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.cuda``'s graphs and streams as their CPU stand-ins, for this test."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", _Capture)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())


@pytest.mark.parametrize(
    ("name", "sizes", "graphed"),
    [
        pytest.param(GQA, "[1,2,4]", (1, 2, 4), id="gqa-every-batch-in-a-graph"),
        pytest.param(GQA, "[1,2]", (1, 2), id="gqa-larger-batches-eager"),
        pytest.param(MLA, "[1,2,4]", (1, 2, 4), id="mla-every-batch-in-a-graph"),
    ],
)
def test_graph_replays_generate_the_eager_tokens(fake_cuda_graphs, name, sizes, graphed):
    # Plans as declared, so that the graph sizes are the test's, not an engine's.
    dep = deployment(name, "calibration.engine=null", f"calibration.cuda_graph_batch_sizes={sizes}")
    attention = ReferenceAttention(dep.model, dep.profile, dep.roles)
    setup = setup_of(dep, library_buffers(dep), attention, cuda_graphs=True)
    setup.warm_up()
    setup.seal_and_capture()
    result = setup.serve(dep.steps, dep.trace)
    assert result.tokens == served_runs(name)[0].result.tokens
    assert (result.growths_after_seal, result.sealed_overflow) == (0, None)
    # Each graph is replayed once for every step whose decodes pad to its batch.
    assert {batch: graph.graph.replays for batch, graph in setup.graphs.items()} == {
        batch: sum(step.graph_batch == batch for step in dep.steps) for batch in graphed
    }
    eager = [step for step in dep.steps if step.decode and step.graph_batch is None]
    assert len(setup.eager_decode.plans) == len(eager)
    assert bool(eager) is (max(graphed) < dep.profile.limits.max_num_seqs)


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of this process alone, destroyed after the test."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_with_a_group_the_pools_seal_with_it_and_a_collective_runs_before_capture(
    fake_cuda_graphs, one_rank_group, monkeypatch
):
    dep = deployment(GQA)
    attention = ReferenceAttention(dep.model, dep.profile, dep.roles)
    setup = setup_of(dep, library_buffers(dep), attention, cuda_graphs=True, group=one_rank_group)
    reduced: list[tuple[list[float], bool]] = []  # what each all-reduce summed; before capture?
    all_reduce = dist.all_reduce

    def spy(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        reduced.append((tensor.tolist(), all(g.graph is None for g in setup.graphs.values())))
        return all_reduce(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", spy)
    setup.warm_up()
    setup.seal_and_capture()
    assert isinstance(setup.buffers, LibraryBuffers)
    assert all(pool.sealed for pool in setup.buffers.pools.values())
    assert reduced == [([0.0], True)]  # NCCL captures a collective only after an eager one
    assert all(graph.graph is not None and graph.graph.ops for graph in setup.graphs.values())
