"""FlashInfer's attention wrappers as the replay drives them, and the plan inputs it gives them.

:class:`PagedAttention` is FlashInfer's paged prefill and decode wrappers; :class:`MLAAttention` its
MLA wrapper for both. Each builds its wrappers on the buffers it is handed and turns a batch's page
table into a plan's arguments. Plan inputs live in pinned host memory, as vLLM's do
(:func:`plan_input`).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, cast

import torch

from ..calibration.profile import CalibrationProfile
from .model import KVCache, Model, Query
from .roles import Roles
from .scheduler import Chunk

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
        qo = plan_input(range(batch + 1), self.device)  # one query token a request
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


def page_table(chunks: Sequence[Chunk], page: int) -> tuple[list[int], list[int], list[int]]:
    """FlashInfer's (kv indptr, page indices, last page lengths) for ``chunks``."""
    kv_indptr, indices, last = [0], [], []
    for chunk in chunks:
        pages = [p + 1 for p in chunk.pages]  # page 0 is the dummy page
        kv_indptr.append(kv_indptr[-1] + len(pages))
        indices.extend(pages)
        last.append(chunk.start + chunk.length - (len(pages) - 1) * page)
    return kv_indptr, indices, last


def page_tensors(chunks: Sequence[Chunk], page: int, device: torch.device) -> PageTable:
    """``chunks``' page table as plan inputs (:func:`plan_input`)."""
    kv_indptr, indices, last = page_table(chunks, page)
    return plan_input(kv_indptr, device), plan_input(indices, device), plan_input(last, device)


def plan_input(values: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A plan's int32 input (``values``, or a host tensor of them) on the host, pinned where the
    model runs on a GPU, as vLLM plans: FlashInfer's ``plan()`` reads its indptrs there without a
    device-to-host copy and sync, and queues the copies of what the run reads (the page indices)
    without waiting."""
    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.int32)
    return tensor.pin_memory() if device.type == "cuda" else tensor


def token_slots(chunks: Sequence[Chunk], page: int) -> tuple[list[int], list[int]]:
    """The (page, offset) each new token's K and V go to."""
    slot_pages, slot_offsets = [], []
    for chunk in chunks:
        for position in range(chunk.start, chunk.start + chunk.length):
            slot_pages.append(chunk.pages[position // page] + 1)
            slot_offsets.append(position % page)
    return slot_pages, slot_offsets


def int_tensor(
    values: Sequence[int], device: torch.device, dtype: Any = torch.int32
) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)
