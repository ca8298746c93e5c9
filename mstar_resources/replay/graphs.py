"""A decode forward captured in a CUDA graph, one per graph batch size, replayed each step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from .attention import DUMMY_PAGE, PageTable, int_tensor, page_table, plan_input, token_slots
from .scheduler import Chunk

if TYPE_CHECKING:
    from .attention import Attention
    from .buffers import Buffers
    from .model import KVCache, Model


class Serving(Protocol):
    """What a graph needs of the setup it serves in (``engine.Setup``)."""

    model: Model
    attention: Attention
    buffers: Buffers
    kv_cache: KVCache


class DecodeGraph:
    """The decode forward of one graph batch size, captured once and replayed every step whose
    decode batch pads to it; its wrapper is planned (outside the graph) before each replay."""

    def __init__(self, setup: Serving, batch: int, max_pages: int) -> None:
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
        kv_indptr, indices, last = page_table(chunks, s.page_size)
        for _ in range(self.batch - len(chunks)):
            kv_indptr.append(kv_indptr[-1] + 1)
            indices.append(DUMMY_PAGE)
            last.append(1)
        pages: PageTable = (
            plan_input(kv_indptr, device),
            plan_input(indices, device),
            plan_input(last, device),
        )
        args, kwargs = self.setup.attention.decode_plan(pages)
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
        slot_pages, slot_offsets = token_slots(chunks, page)
        pad = self.batch - n
        self.tokens.copy_(int_tensor(inputs + [0] * pad, device))
        self.positions.copy_(int_tensor([c.start for c in chunks] + [0] * pad, device))
        self.slot_pages.copy_(int_tensor(slot_pages + [DUMMY_PAGE] * pad, device))
        self.slot_offsets.copy_(int_tensor(slot_offsets + [0] * pad, device))
        self.plan(chunks)
        self.graph.replay()
        return list(self.out[:n].tolist())
