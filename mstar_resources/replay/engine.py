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

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..attn.workspace import int_buffers
from ..calibration.profile import CalibrationProfile
from ..calibration.shapes import shapes_for
from ..errors import WorkspaceSealedError
from .attention import (
    DUMMY_PAGE,
    Attention,
    MLAAttention,
    PagedAttention,
    PageTable,
    int_tensor,
    page_tensors,
    plan_input,
    token_slots,
)
from .buffers import Buffers
from .graphs import DecodeGraph
from .model import Model
from .roles import Roles
from .scheduler import Chunk, Step
from .trace import Request


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
        self.graphs: dict[int, DecodeGraph] = {}
        if cuda_graphs:
            for batch in sorted(profile.cuda_graph_batch_sizes):
                self.graphs[batch] = DecodeGraph(self, batch, min(self.pages, batch * max_pages))

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
                last_page = shape.kv_len - (pages - 1) * self.model.shape.page_size
                table = (
                    plan_input(torch.arange(shape.batch + 1, dtype=torch.int32) * pages, device),
                    plan_input(torch.zeros(shape.batch * pages, dtype=torch.int32), device),
                    plan_input(torch.full((shape.batch,), last_page, dtype=torch.int32), device),
                )
                if role == "prefill":
                    qo = torch.arange(shape.batch + 1, dtype=torch.int32) * shape.q_len
                    self._plan_prefill(plan_input(qo, device), table)
                else:
                    self._plan_eager_decode(table)
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
        chunk runs (the :class:`~.scheduler.Arrivals` the steps stream from, or any mapping)."""
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
        slot_pages, slot_offsets = token_slots(chunks, page)
        self._plan_prefill(plan_input(qo, device), page_tensors(chunks, page, device))
        out = self.model.forward(
            int_tensor(ids, device), int_tensor(positions, device),
            int_tensor(slot_pages, device), int_tensor(slot_offsets, device),
            int_tensor(samples, device, torch.int64), self.kv_cache,
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
        slot_pages, slot_offsets = token_slots(chunks, page)
        self._plan_eager_decode(page_tensors(chunks, page, device))
        out = self.model.forward(
            int_tensor(inputs, device), int_tensor([c.start for c in chunks], device),
            int_tensor(slot_pages, device), int_tensor(slot_offsets, device),
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
