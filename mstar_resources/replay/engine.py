"""One setup of the replay: its workspaces, KV cache, wrappers and CUDA graphs, serving a schedule.

The order is an engine's: make the workspaces (the library's pools, reserved; or the engines' one
fixed buffer), size the KV cache from the free memory left, warm up (plans may grow), seal (with
the group, across ranks), capture the decode graphs, then serve the schedule step by step: one
prefill plan and one decode plan a step, each run by every layer.

Two plan labels do the work (:class:`Roles`): one planned eagerly for the prefill chunks, one for
the decodes (in CUDA-graph slot 0 under graphs). Their wrappers are FlashInfer's paged prefill and
decode wrappers (:class:`PagedAttention`), or its MLA wrapper for both (:class:`MLAAttention`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.distributed as dist

from ..attn.workspace import Workspace, WorkspacePool, install_int_workspace, int_buffers
from ..calibration.profile import CalibrationProfile
from ..calibration.shapes import shapes_for
from ..errors import ResourceConfigError, WorkspaceSealedError
from ..units import MIB
from .model import KVCache, Model, Query
from .roles import Role, Roles
from .scheduler import Arrivals, Chunk, Step
from .trace import Request

DUMMY_PAGE = 0
"""A page no request owns: the padded rows of a graph batch attend to it and write to it."""


PageTable = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""A batch's KV pages as FlashInfer's paged wrappers take them: (kv indptr, page ids, tokens in
each request's last page)."""


class Attention(abc.ABC):
    """How one kind of attention builds, plans and runs FlashInfer's wrappers for a setup."""

    def __init__(self, model: Model, profile: CalibrationProfile, roles: Roles) -> None:
        self.shape, self.device = model.shape, model.device
        self.plans = {role: profile.plans[label] for role, label in vars(roles).items()}
        self.backends = {role: plan.backend for role, plan in self.plans.items()}
        self.dtypes = {"q_data_type": self.shape.dtype, "kv_data_type": self.shape.kv_dtype}

    @abc.abstractmethod
    def prefill_wrapper(self, buffer: torch.Tensor) -> Any:
        """The wrapper that plans and runs prefill chunks, on ``buffer``."""

    @abc.abstractmethod
    def decode_wrapper(self, buffer: torch.Tensor, graph_batch: int | None, pages: int) -> Any:
        """A decode wrapper on ``buffer``: eager (``graph_batch`` None) or for a CUDA graph of
        that batch over at most ``pages`` pages."""

    @abc.abstractmethod
    def prefill_plan(
        self, qo: torch.Tensor, pages: PageTable
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``plan()``'s arguments for prefill chunks of query offsets ``qo`` over ``pages``."""

    @abc.abstractmethod
    def decode_plan(self, pages: PageTable) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``plan()``'s arguments for one decode token a request over ``pages``."""

    @abc.abstractmethod
    def run(self, wrapper: Any, kv_cache: KVCache, layer: int, q: Query) -> torch.Tensor:
        """``layer``'s attention output for queries ``q``, as ``wrapper`` was planned."""


class PagedAttention(Attention):
    """FlashInfer's paged prefill and decode wrappers: grouped-query attention."""

    def prefill_wrapper(self, buffer: torch.Tensor) -> Any:
        import flashinfer

        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            buffer, "NHD", backend=self.backends["prefill"]
        )

    def decode_wrapper(self, buffer: torch.Tensor, graph_batch: int | None, pages: int) -> Any:
        import flashinfer

        graph: dict[str, Any] = {}
        if graph_batch is not None:
            graph = {
                "use_cuda_graph": True,
                "paged_kv_indptr_buffer": self._zeros(graph_batch + 1),
                "paged_kv_indices_buffer": self._zeros(pages),
                "paged_kv_last_page_len_buffer": self._zeros(graph_batch),
            }
        if self.plans["decode"].tensor_cores:  # as vLLM, and SGLang for GQA groups of 4+
            graph["use_tensor_cores"] = True
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            buffer, "NHD", backend=self.backends["decode"], **graph
        )

    def prefill_plan(
        self, qo: torch.Tensor, pages: PageTable
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        options = self.plans["prefill"].plan_options()
        return (qo, *pages, *self._heads()), {"causal": True, **self.dtypes, **options}

    def decode_plan(self, pages: PageTable) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (*pages, *self._heads()), {**self.dtypes, **self.plans["decode"].plan_options()}

    def run(self, wrapper: Any, kv_cache: KVCache, layer: int, q: Query) -> torch.Tensor:
        return cast(torch.Tensor, wrapper.run(q, kv_cache[0][layer]))

    def _heads(self) -> tuple[int, int, int, int]:
        s = self.shape
        return s.qo_heads, s.kv_heads, s.head_dim, s.page_size

    def _zeros(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.int32, device=self.device)


class MLAAttention(PagedAttention):
    """FlashInfer's MLA wrapper, for prefill and decode alike, on the split query and cache."""

    def prefill_wrapper(self, buffer: torch.Tensor) -> Any:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        return BatchMLAPagedAttentionWrapper(buffer, backend=self.backends["prefill"])

    def decode_wrapper(self, buffer: torch.Tensor, graph_batch: int | None, pages: int) -> Any:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        graph: dict[str, Any] = {}
        if graph_batch is not None:
            graph = {
                "use_cuda_graph": True,
                "qo_indptr": self._zeros(graph_batch + 1),
                "kv_indptr": self._zeros(graph_batch + 1),
                "kv_indices": self._zeros(pages),
                "kv_len_arr": self._zeros(graph_batch),
            }
        return BatchMLAPagedAttentionWrapper(buffer, backend=self.backends["decode"], **graph)

    def prefill_plan(
        self, qo: torch.Tensor, pages: PageTable
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), self._plan(qo, pages, causal=True)

    def decode_plan(self, pages: PageTable) -> tuple[tuple[Any, ...], dict[str, Any]]:
        batch = pages[2].numel()
        qo = _plan_input(range(batch + 1), self.device)  # one query token a request
        return (), self._plan(qo, pages, causal=False)

    def run(self, wrapper: Any, kv_cache: KVCache, layer: int, q: Query) -> torch.Tensor:
        out = wrapper.run(query=q, kv_cache=(kv_cache[0][layer], kv_cache[1][layer]))
        return cast(torch.Tensor, out)

    def _plan(self, qo: torch.Tensor, pages: PageTable, causal: bool) -> dict[str, Any]:
        from flashinfer.mla import MLAPlanMetadata

        s = self.shape
        kv_indptr, indices, last = pages
        lengths = (kv_indptr[1:] - kv_indptr[:-1] - 1) * s.page_size + last
        return {
            "metadata": MLAPlanMetadata.csr(qo, kv_indptr, indices, lengths),
            "num_heads": s.qo_heads,
            "head_dim_ckv": s.head_dim_ckv,
            "head_dim_kpe": s.head_dim_kpe,
            "page_size": s.page_size,
            "causal": causal,
            # The query-key width before absorption: DeepSeek-V3's 128 + 64.
            "sm_scale": (s.head_dim + s.head_dim_kpe) ** -0.5,
            "query_layout": "split",
            "kv_cache_layout": "split",
            **self.dtypes,
        }


class Buffers(abc.ABC):
    """Where a setup's wrappers get their float workspaces, and how their plans are made."""

    name: str

    @abc.abstractmethod
    def prefill(self) -> torch.Tensor:
        """The buffer the prefill wrapper is built on."""

    @abc.abstractmethod
    def decode(self) -> torch.Tensor:
        """The buffer the decode wrappers (every graph batch size) are built on."""

    @abc.abstractmethod
    def plan(self, role: Role, plan: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``plan(*args, **kwargs)`` for the wrapper playing ``role``."""

    def adopt(self, wrapper: Any, role: Role) -> Any:
        """``wrapper``, just built on this role's buffer, given whatever else the buffers hold
        for it (the library's: the role's int workspace); a fixed buffer leaves it its own."""
        return wrapper

    def int_tensors(self) -> list[torch.Tensor]:
        """The int workspaces and host mirrors the buffers hold themselves, used or not."""
        return []

    def seal(self, group: Any) -> None:  # noqa: B027 (a fixed buffer has nothing to seal)
        """Before graphs are captured over the buffers."""

    @property
    @abc.abstractmethod
    def bytes(self) -> int:
        """The bytes the buffers hold."""

    def growths(self) -> int:
        """Times a workspace grew, so far (0 for a fixed buffer, which never grows)."""
        return 0


class LibraryBuffers(Buffers):
    """The library's way: pools built from the composed config and reserved before the KV cache
    is sized; plans go through :meth:`Workspace.plan`, and the pools are sealed with the group."""

    name = "mstar-resources"

    def __init__(self, pools: dict[str, WorkspacePool], roles: Roles) -> None:
        self.pools = pools
        self.reserved = sum(pool.reserve() for pool in pools.values())
        self._prefill = _served(pools, roles.prefill, None)
        self._decode = _served(pools, roles.decode, 0)

    def adopt(self, wrapper: Any, role: Role) -> Any:
        """Every wrapper of a role shares its int workspace: each is planned right before it
        runs (or its graph replays), one a step. FlashInfer 0.7's MLA wrapper, which makes its
        own at each plan, keeps its own."""
        workspace = self._prefill if role == "prefill" else self._decode
        install_int_workspace(wrapper, workspace, workspace.name)
        return wrapper

    def int_tensors(self) -> list[torch.Tensor]:
        return [
            t for pool in self.pools.values() for w in pool.int_workspaces().values()
            for t in (w.tensor, w.mirror)
        ]  # fmt: skip

    def prefill(self) -> torch.Tensor:
        return self._prefill.tensor

    def decode(self) -> torch.Tensor:
        return self._decode.tensor

    def plan(self, role: Role, plan: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        (self._prefill if role == "prefill" else self._decode).plan(plan, *args, **kwargs)

    def seal(self, group: Any) -> None:
        for pool in self.pools.values():
            pool.seal(group=group)

    @property
    def bytes(self) -> int:
        return sum(pool.held_bytes for pool in self.pools.values())

    def growths(self) -> int:
        """Times a float or int workspace grew."""
        return sum(
            s.times_grown
            for pool in self.pools.values()
            for s in [*pool.stats(), *pool.int_stats()]
        )


def _served(pools: dict[str, WorkspacePool], label: str, cg_slot: int | None) -> Workspace:
    for pool in pools.values():
        if pool.serves is not None and (label, cg_slot) in pool.serves:
            return pool.get(label, cg_slot)
    slot = "eagerly" if cg_slot is None else f"in cg slot {cg_slot}"
    raise ResourceConfigError(
        f"no resource under resources serves label {label!r} {slot}; the replay plans its "
        "prefill label eagerly and its decode label in cg slot 0 (e.g. "
        "resources.attn.decode.cg_slots=[0])"
    )


class FixedBuffer(Buffers):
    """The engines' way: one buffer of a fixed size for every wrapper and graph, planned on
    directly."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.name = f"fixed {nbytes / MIB:,.0f} MiB"

    def prefill(self) -> torch.Tensor:
        return self.tensor

    def decode(self) -> torch.Tensor:
        return self.tensor

    def plan(self, role: Role, plan: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        plan(*args, **kwargs)

    @property
    def bytes(self) -> int:
        return self.tensor.numel()


@dataclass(frozen=True)
class SealedOverflow:
    """What a sealed workspace refused: the error's figures and text, kept without the error
    itself, whose traceback would keep the setup (its KV cache) in memory."""

    workspace: str
    held_bytes: int
    needed_bytes: int
    setting: str
    suggested_mb: int
    message: str

    @classmethod
    def of(cls, error: WorkspaceSealedError) -> SealedOverflow:
        return cls(
            error.workspace, error.held_bytes, error.needed_bytes, error.setting,
            error.suggested_mb, str(error),
        )  # fmt: skip


@dataclass
class SetupResult:
    """What one setup did, for the report."""

    name: str
    workspace_bytes: int
    kv_pages: int
    kv_tokens: int
    kv_bytes: int
    weights_bytes: int
    decode_step_s: list[float] = field(default_factory=list)
    tokens: dict[int, list[int]] = field(default_factory=dict)
    growths_before_seal: int = 0
    growths_after_seal: int = 0
    sealed_overflow: SealedOverflow | None = None
    """The sealed error a plan raised while serving, if any (the run stops there)."""
    steps_served: int = 0
    int_workspace_bytes: int = 0
    """GPU bytes of the distinct int workspaces the wrappers plan on (and the pools hold)."""
    pinned_bytes: int = 0
    """Host bytes of their distinct pinned mirrors."""

    @property
    def tokens_out(self) -> int:
        return sum(len(t) for t in self.tokens.values())


class Setup:
    """One setup's run over ``model``: KV cache, wrappers, warm-up, seal, graphs, serving.

    ``pages`` is the KV cache's size in pages, page 0 (the dummy page) included: the caller sizes
    it from the free memory left once ``buffers`` are made (see ``cli.kv_pages_for``). ``attention``
    builds, plans and runs the wrappers: by default FlashInfer's, MLA's where the shape is MLA.
    """

    def __init__(
        self,
        model: Model,
        profile: CalibrationProfile,
        buffers: Buffers,
        pages: int,
        group: Any,
        cuda_graphs: bool,
        roles: Roles,
        *,
        attention: Attention | None = None,
    ) -> None:
        self.model, self.profile, self.buffers = model, profile, buffers
        self.group, self.cuda_graphs, self.roles = group, cuda_graphs, roles
        shape = model.shape
        self.pages = pages
        self.kv_cache = model.empty_kv_cache(pages)
        for layers in self.kv_cache:
            layers[:, DUMMY_PAGE].zero_()
        self.result = SetupResult(
            name=buffers.name,
            workspace_bytes=buffers.bytes,
            kv_pages=self.pages - 1,
            kv_tokens=(self.pages - 1) * shape.page_size,
            kv_bytes=sum(t.numel() * t.element_size() for t in self.kv_cache),
            weights_bytes=model.bytes,
        )
        if attention is None:
            attention = (MLAAttention if shape.mla else PagedAttention)(model, profile, roles)
        self.attention = attention
        self.prefill_wrapper = buffers.adopt(
            self.attention.prefill_wrapper(buffers.prefill()), "prefill"
        )
        self.eager_decode = buffers.adopt(
            self.attention.decode_wrapper(buffers.decode(), None, 0), "decode"
        )
        max_pages = -(-profile.limits.max_model_len // shape.page_size)
        self.graphs: dict[int, _DecodeGraph] = {}
        if cuda_graphs:
            for batch in sorted(profile.cuda_graph_batch_sizes):
                self.graphs[batch] = _DecodeGraph(self, batch, min(self.pages, batch * max_pages))

    # --- warm-up, seal, capture -------------------------------------------------------------

    def warm_up(self) -> None:
        """Plan every label's bounding shapes (calibration's), so workspaces grow before sealing."""
        device, profile = self.model.device, self.profile
        roles = [("prefill", self.roles.prefill)]
        if not self.graphs:  # with graphs, decode plans only graph batches (below)
            roles.append(("decode", self.roles.decode))
        for role, label in roles:
            plan = profile.plans[label]
            for shape in shapes_for(plan, profile, cuda_graph=False):
                pages = -(-shape.kv_len // self.model.shape.page_size)
                kv_indptr = _arange(shape.batch + 1, pages, device)
                indices = torch.zeros(shape.batch * pages, dtype=torch.int32, device=device)
                last = torch.full(
                    (shape.batch,), shape.kv_len - (pages - 1) * self.model.shape.page_size,
                    dtype=torch.int32, device=device,
                )  # fmt: skip
                if role == "prefill":
                    qo = _arange(shape.batch + 1, shape.q_len, device)
                    self._plan_prefill(qo, (kv_indptr, indices, last))
                else:
                    self._plan_eager_decode((kv_indptr, indices, last))
        for graph in self.graphs.values():
            graph.plan_padding()

    def seal_and_capture(self) -> None:
        self.result.growths_before_seal = self.buffers.growths()
        self.buffers.seal(self.group)
        if self.group is not None and self.graphs:
            # NCCL collectives are captured only after one has run eagerly on the stream.
            dist.all_reduce(torch.zeros(1, device=self.model.device))
        for graph in self.graphs.values():
            graph.capture()

    # --- serving ------------------------------------------------------------------------------

    def serve(
        self, steps: Iterable[Step], requests: Mapping[int, Request], progress: Any = None
    ) -> SetupResult:
        """Run ``steps``, each request's prompt looked up in ``requests`` by id when its first
        chunk runs (an :class:`~.scheduler.Arrivals` the steps stream from, whose finished
        requests are dropped here, or any mapping)."""
        prompts: dict[int, tuple[int, ...]] = {}  # drawn when a request starts, dropped at its end
        tokens = self.result.tokens
        try:
            for step in steps:
                for chunk in step.prefill:
                    if chunk.start == 0:
                        prompts[chunk.request] = requests[chunk.request].prompt()
                if step.prefill:
                    self._prefill_step(step.prefill, prompts, tokens)
                if step.decode:
                    self._decode_step(step, tokens)
                for request in step.finished:
                    del prompts[request]
                    if isinstance(requests, Arrivals):
                        requests.pop(request)
                self.result.steps_served += 1
                if progress is not None:
                    progress.update()
        except WorkspaceSealedError as error:
            self.result.sealed_overflow = SealedOverflow.of(error)
        self.result.growths_after_seal = self.buffers.growths() - self.result.growths_before_seal
        self.result.int_workspace_bytes, self.result.pinned_bytes = self.int_bytes()
        return self.result

    def int_bytes(self) -> tuple[int, int]:
        """GPU bytes of the distinct int workspaces the wrappers plan on and the buffers hold,
        and host bytes of their distinct mirrors (after a plan: FlashInfer 0.7's MLA wrapper makes
        its own at each)."""
        wrappers = [
            self.prefill_wrapper,
            self.eager_decode,
            *(g.wrapper for g in self.graphs.values()),
        ]
        tensors = [*self.buffers.int_tensors()]
        for wrapper in wrappers:
            tensors += int_buffers(wrapper) or ()
        distinct = {t.untyped_storage().data_ptr(): t for t in tensors}.values()
        gpu = sum(t.numel() for t in distinct if t.is_cuda)
        return gpu, sum(t.numel() for t in distinct if not t.is_cuda)

    def _prefill_step(
        self,
        chunks: Sequence[Chunk],
        prompts: dict[int, tuple[int, ...]],
        tokens: dict[int, list[int]],
    ) -> None:
        device, page = self.model.device, self.model.shape.page_size
        ids: list[int] = []
        positions: list[int] = []
        qo, samples = [0], []
        for chunk in chunks:
            ids.extend(prompts[chunk.request][chunk.start : chunk.start + chunk.length])
            positions.extend(range(chunk.start, chunk.start + chunk.length))
            qo.append(qo[-1] + chunk.length)
            if chunk.samples:
                samples.append(qo[-1] - 1)
        slot_pages, slot_offsets = _slots(chunks, page)
        self._plan_prefill(_plan_input(qo, device), _page_tensors(chunks, page, device))
        out = self.model.forward(
            _tensor(ids, device), _tensor(positions, device), _tensor(slot_pages, device),
            _tensor(slot_offsets, device), _tensor(samples, device, torch.int64), self.kv_cache,
            lambda layer, q: self.attention.run(self.prefill_wrapper, self.kv_cache, layer, q),
        )  # fmt: skip
        sampled = [chunk.request for chunk in chunks if chunk.samples]
        for request, token in zip(sampled, out.tolist(), strict=True):
            tokens.setdefault(request, []).append(token)

    def _decode_step(self, step: Step, tokens: dict[int, list[int]]) -> None:
        if self.model.device.type == "cuda":  # the step's clock starts with the GPU idle
            torch.cuda.synchronize(self.model.device)
        start = time.perf_counter()
        chunks = step.decode
        inputs = [tokens[chunk.request][-1] for chunk in chunks]
        graph = self.graphs.get(step.graph_batch or 0)
        out = graph.run(chunks, inputs) if graph else self._eager_decode(chunks, inputs)
        for chunk, token in zip(chunks, out, strict=True):
            tokens[chunk.request].append(token)
        self.result.decode_step_s.append(time.perf_counter() - start)  # .tolist() synchronised

    def _eager_decode(self, chunks: Sequence[Chunk], inputs: list[int]) -> list[int]:
        device, page = self.model.device, self.model.shape.page_size
        slot_pages, slot_offsets = _slots(chunks, page)
        self._plan_eager_decode(_page_tensors(chunks, page, device))
        out = self.model.forward(
            _tensor(inputs, device), _tensor([c.start for c in chunks], device),
            _tensor(slot_pages, device), _tensor(slot_offsets, device),
            torch.arange(len(chunks), device=device), self.kv_cache,
            lambda layer, q: self.attention.run(self.eager_decode, self.kv_cache, layer, q),
        )  # fmt: skip
        return list(out.tolist())

    def _plan_prefill(self, qo: torch.Tensor, pages: PageTable) -> None:
        args, kwargs = self.attention.prefill_plan(qo, pages)
        self.buffers.plan("prefill", self.prefill_wrapper.plan, *args, **kwargs)

    def _plan_eager_decode(self, pages: PageTable) -> None:
        args, kwargs = self.attention.decode_plan(pages)
        self.buffers.plan("decode", self.eager_decode.plan, *args, **kwargs)


class _DecodeGraph:
    """The decode forward of one graph batch size, captured once and replayed every step whose
    decode batch pads to it; its wrapper is planned (outside the graph) before each replay."""

    def __init__(self, setup: Setup, batch: int, max_pages: int) -> None:
        self.setup, self.batch = setup, batch
        device = setup.model.device
        self.wrapper = setup.buffers.adopt(
            setup.attention.decode_wrapper(setup.buffers.decode(), batch, max_pages), "decode"
        )
        self.tokens, self.positions, self.slot_pages, self.slot_offsets = (
            torch.zeros(batch, dtype=torch.int32, device=device) for _ in range(4)
        )
        self.rows = torch.arange(batch, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None

    def plan(self, chunks: Sequence[Chunk]) -> None:
        """Plan ``chunks``, padded to the graph's batch with rows on the dummy page."""
        s, device = self.setup.model.shape, self.setup.model.device
        kv_indptr, indices, last = _page_table(chunks, s.page_size)
        for _ in range(self.batch - len(chunks)):
            kv_indptr.append(kv_indptr[-1] + 1)
            indices.append(DUMMY_PAGE)
            last.append(1)
        pages = tuple(_plan_input(values, device) for values in (kv_indptr, indices, last))
        args, kwargs = self.setup.attention.decode_plan(cast(PageTable, pages))
        self.setup.buffers.plan("decode", self.wrapper.plan, *args, **kwargs)

    def plan_padding(self) -> None:
        """A plan of padding rows only: what the graph's plans need, for warm-up and capture."""
        self.plan([])

    def capture(self) -> None:
        setup = self.setup
        self.plan_padding()
        self.slot_pages.fill_(DUMMY_PAGE)
        self.slot_offsets.zero_()

        def forward() -> torch.Tensor:
            return setup.model.forward(
                self.tokens, self.positions, self.slot_pages, self.slot_offsets, self.rows,
                setup.kv_cache,
                lambda layer, q: setup.attention.run(self.wrapper, setup.kv_cache, layer, q),
            )  # fmt: skip

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()  # warm-up outside capture
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = forward()

    def run(self, chunks: Sequence[Chunk], inputs: list[int]) -> list[int]:
        assert self.graph is not None and self.out is not None
        n, device = len(chunks), self.setup.model.device
        page = self.setup.model.shape.page_size
        slot_pages, slot_offsets = _slots(chunks, page)
        pad = self.batch - n
        self.tokens.copy_(_tensor(inputs + [0] * pad, device))
        self.positions.copy_(_tensor([c.start for c in chunks] + [0] * pad, device))
        self.slot_pages.copy_(_tensor(slot_pages + [DUMMY_PAGE] * pad, device))
        self.slot_offsets.copy_(_tensor(slot_offsets + [0] * pad, device))
        self.plan(chunks)
        self.graph.replay()
        return list(self.out[:n].tolist())


def _page_table(chunks: Sequence[Chunk], page: int) -> tuple[list[int], list[int], list[int]]:
    """FlashInfer's (kv indptr, page indices, last page lengths) for ``chunks``."""
    kv_indptr, indices, last = [0], [], []
    for chunk in chunks:
        pages = [p + 1 for p in chunk.pages]  # page 0 is the dummy page
        kv_indptr.append(kv_indptr[-1] + len(pages))
        indices.extend(pages)
        last.append(chunk.start + chunk.length - (len(pages) - 1) * page)
    return kv_indptr, indices, last


def _page_tensors(chunks: Sequence[Chunk], page: int, device: torch.device) -> PageTable:
    """``chunks``' page table as plan inputs (:func:`_plan_input`)."""
    kv_indptr, indices, last = _page_table(chunks, page)
    return _plan_input(kv_indptr, device), _plan_input(indices, device), _plan_input(last, device)


def _plan_input(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """A plan's int32 input on the host, pinned where the model runs on a GPU, as vLLM plans:
    FlashInfer's ``plan()`` reads its indptrs there without a device-to-host copy and sync, and
    queues the copies of what the run reads (the page indices) without waiting."""
    tensor = torch.tensor(values, dtype=torch.int32)
    return tensor.pin_memory() if device.type == "cuda" else tensor


def _slots(chunks: Sequence[Chunk], page: int) -> tuple[list[int], list[int]]:
    """The (page, offset) each new token's K and V go to."""
    slot_pages, slot_offsets = [], []
    for chunk in chunks:
        for position in range(chunk.start, chunk.start + chunk.length):
            slot_pages.append(chunk.pages[position // page] + 1)
            slot_offsets.append(position % page)
    return slot_pages, slot_offsets


def _tensor(values: Sequence[int], device: torch.device, dtype: Any = torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _arange(n: int, step: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int32, device=device) * step
