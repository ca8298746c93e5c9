"""Measuring on the GPU what a label's plans need of the float and int workspaces, through
FlashInfer, over the plan shapes that bound that need (``docs/calibration.md``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..attn import _flashinfer
from ..attn.workspace import IntWorkspace, Workspace, install_int_workspace
from ..errors import ResourceConfigError
from .profile import CalibrationProfile, PlanKind, PlanProfile

SHORT_CONTEXT = 1024  # tokens of context in the short-context shapes
MAX_CTA_TILE_Q = 128  # the most query rows of one prefill work item (FA2DetermineCtaTileQ)
DECODE_LIKE = frozenset({PlanKind.decode, PlanKind.pod})  # POD plans its decode batch


@dataclass(frozen=True, order=True)
class Shape:
    """One plan: ``batch`` requests of ``q_len`` query tokens over ``kv_len`` tokens of context."""

    batch: int
    q_len: int
    kv_len: int
    cuda_graph: bool = False

    def __str__(self) -> str:
        graph = " graph" if self.cuda_graph else ""
        return f"bs={self.batch} q={self.q_len} kv={self.kv_len}{graph}"


def _powers_of_two_up_to(limit: int) -> list[int]:
    return sorted({1, *(1 << i for i in range(limit.bit_length())), limit})


def shapes_for(plan: PlanProfile, profile: CalibrationProfile, cuda_graph: bool) -> list[Shape]:
    """The shapes to plan for a label planned as ``plan``, under CUDA graphs or eagerly."""
    limits = profile.limits
    long = limits.max_model_len
    contexts = sorted({min(SHORT_CONTEXT, long), long})
    q = plan.q_len_per_req
    if cuda_graph and plan.kind in (PlanKind.paged_prefill, PlanKind.ragged_prefill):
        # A prefill graph of T tokens pads its work by its batch: every batch up to T requests.
        graphs = {
            Shape(batch, tokens // batch, max(long, tokens // batch), cuda_graph=True)
            for tokens in profile.cuda_graph_prefill_tokens
            for batch in _powers_of_two_up_to(min(limits.max_num_seqs, tokens))
        }
        return sorted(graphs)
    if cuda_graph:  # a graph replays one decode batch of its size
        return [Shape(b, q, max(q, long), cuda_graph=True) for b in profile.cuda_graph_batch_sizes]
    if plan.kind in DECODE_LIKE:
        batches = _powers_of_two_up_to(min(limits.max_num_seqs, limits.max_num_batched_tokens // q))
        eager = [Shape(b, q, max(q, kv)) for b in batches for kv in contexts]
        if plan.kind is PlanKind.decode and not plan.fixed_split:
            # The bounding configuration: a graph plan, padded to the most any plan splits to.
            eager.insert(0, Shape(1, q, max(q, long), cuda_graph=True))
        return eager
    budget = limits.max_num_batched_tokens
    shapes: list[Shape] = []
    for batch in _powers_of_two_up_to(min(limits.max_num_seqs, budget)):
        # From a chunked-prefill tail to the whole budget, over a short and the longest context.
        for q_len in _powers_of_two_up_to(min(budget // batch, long)):
            shapes.extend(Shape(batch, q_len, max(kv, q_len)) for kv in contexts)
    if plan.kind is not PlanKind.mla:
        # One full query tile a request over the longest context: the split fills the grid.
        tile_q = _full_tile_q(profile)
        for batch in _powers_of_two_up_to(min(limits.max_num_seqs, budget // tile_q)):
            shapes.append(Shape(batch, tile_q, long))
    return sorted(set(shapes))


def is_bounding(shape: Shape, plan: PlanProfile, profile: CalibrationProfile) -> bool:
    """Whether a floor measured without ``shape`` may fall short of what the label can need."""
    if shape.cuda_graph:
        return True
    long = profile.limits.max_model_len
    if plan.kind in (PlanKind.paged_prefill, PlanKind.ragged_prefill):
        full_tile = plan.fixed_split or shape.q_len == _full_tile_q(profile)
        return shape.kv_len == long and full_tile
    if plan.kind is PlanKind.decode and plan.fixed_split:
        return shape.kv_len >= long
    return plan.kind is PlanKind.pod and shape.kv_len == long


def _full_tile_q(profile: CalibrationProfile) -> int:
    """Query tokens a request needs to fill one prefill work item of 128 packed rows."""
    group = profile.model.num_qo_heads // profile.model.num_kv_heads
    limits = profile.limits
    return max(1, min(MAX_CTA_TILE_Q // group, limits.max_num_batched_tokens, limits.max_model_len))


@dataclass(frozen=True)
class Need:
    """The most float workspace any of a label's shapes needs."""

    bytes: int
    worst: Shape | None  # None: no shape needs any
    method: str  # workspace_size (FlashInfer's own query) or growth (on a growing buffer)
    refused: tuple[str, ...] = ()
    """Shapes FlashInfer refused for a reason of its own, with the reason (none bounds the need)."""
    int_bytes: int | None = None
    """The most int workspace any shape needs; None where it cannot be measured (FlashInfer 0.7's
    MLA wrapper makes a fresh int workspace at each plan)."""


class Planner:
    """Builds FlashInfer wrappers and plan arguments for one profile on one device."""

    def __init__(self, profile: CalibrationProfile, device: torch.device) -> None:
        self.profile, self.device = profile, device
        self.refusals = _flashinfer.refusals()  # how FlashInfer refuses a shape; others propagate
        model = profile.model
        self.dtypes = {
            "q_data_type": getattr(torch, model.q_dtype),
            "kv_data_type": getattr(torch, model.kv_dtype),
        }
        o_dtype = model.o_dtype
        self.output = {} if o_dtype is None else {"o_data_type": getattr(torch, o_dtype)}

    def _indptr(self, batch: int, step: int) -> torch.Tensor:
        return torch.arange(batch + 1, dtype=torch.int32, device=self.device) * step

    def plan_args(self, plan: PlanProfile, shape: Shape) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``plan()``'s (and ``workspace_size()``'s) arguments for ``shape`` and ``plan``."""
        kind = plan.kind
        model = self.profile.model
        heads = (model.num_qo_heads, model.num_kv_heads, model.head_dim)
        qo = self._indptr(shape.batch, shape.q_len)
        options = {**self.dtypes, **self.output, **plan.plan_options()}  # all but MLA's
        if kind is PlanKind.ragged_prefill:
            kv = self._indptr(shape.batch, shape.kv_len)
            return (qo, kv, *heads), {"causal": True, **options}
        pages = -(-shape.kv_len // model.page_size)
        kv_indptr = self._indptr(shape.batch, pages)
        indices = torch.arange(shape.batch * pages, dtype=torch.int32, device=self.device)
        if kind is PlanKind.mla:
            from flashinfer.mla import MLAPlanMetadata

            lengths = torch.full_like(kv_indptr[1:], shape.kv_len)
            return (), {
                "metadata": MLAPlanMetadata.csr(qo, kv_indptr, indices, lengths),
                "num_heads": model.num_qo_heads,
                "head_dim_ckv": model.head_dim_ckv,
                "head_dim_kpe": model.head_dim_kpe,
                "page_size": model.page_size,
                "causal": shape.q_len > 1,
                "sm_scale": 1.0,  # a kernel argument: the plan does not depend on it
                # The query and the cache each in no-PE and PE tensors, as the engines keep them.
                "query_layout": "split",
                "kv_cache_layout": "split",
                **self.dtypes,
            }
        last = shape.kv_len - (pages - 1) * model.page_size
        last_page_len = torch.full((shape.batch,), last, dtype=torch.int32, device=self.device)
        paged = (kv_indptr, indices, last_page_len, *heads, model.page_size)
        if kind in DECODE_LIKE:
            return paged, options
        return (qo, *paged), {"causal": True, **options}

    def wrapper(self, plan: PlanProfile, buffer: torch.Tensor, shape: Shape) -> Any:
        """A wrapper of ``plan``'s kind on ``buffer``; under a graph, one for ``shape``'s batch."""
        import flashinfer

        kind, backend = plan.kind, plan.backend
        if kind is PlanKind.ragged_prefill:
            return flashinfer.BatchPrefillWithRaggedKVCacheWrapper(buffer, "NHD", backend=backend)
        graph: dict[str, Any] = {}
        if shape.cuda_graph:  # the wrapper holds the plan's index buffers, at their sizes
            args, kwargs = self.plan_args(plan, shape)
            paged = ("paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len")
            if kind is PlanKind.mla:
                mla = ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")
                graph = {name: getattr(kwargs["metadata"], name) for name in mla}
            elif kind is PlanKind.paged_prefill:
                graph = dict(zip((f"{n}_buf" for n in ("qo_indptr", *paged)), args, strict=False))
            else:
                graph = dict(zip((f"{n}_buffer" for n in paged), args, strict=False))
            graph["use_cuda_graph"] = True
        if kind is PlanKind.paged_prefill:
            return flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                buffer, "NHD", backend=backend, **graph
            )
        if kind is PlanKind.mla:
            from flashinfer.mla import BatchMLAPagedAttentionWrapper

            return BatchMLAPagedAttentionWrapper(buffer, backend=backend, **graph)
        if kind is PlanKind.pod:  # fa2 only: the wrapper takes no backend
            return flashinfer.PODWithPagedKVCacheWrapper(buffer, "NHD", **graph)
        if plan.tensor_cores:
            graph["use_tensor_cores"] = True
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            buffer, "NHD", backend=backend, **graph
        )

    def wrappers(self, plan: PlanProfile, buffer: torch.Tensor) -> Callable[[Shape], Any]:
        """The wrapper on ``buffer`` that plans each shape: one eager, and one per graph shape."""
        eager = None

        def wrapper_for(shape: Shape) -> Any:
            nonlocal eager
            if shape.cuda_graph:
                return self.wrapper(plan, buffer, shape)
            eager = eager or self.wrapper(plan, buffer, shape)
            return eager

        return wrapper_for

    def need(self, plan: PlanProfile, shapes: list[Shape], progress: Any = None) -> Need:
        """The largest need over ``shapes``; ``progress`` (a tqdm bar) advances once a shape."""
        if plan.kind in (PlanKind.decode, PlanKind.paged_prefill):
            with contextlib.suppress(NotImplementedError):  # this backend has no workspace_size()
                return self.need_by_query(plan, shapes, progress)
        return self.need_by_growth(plan, shapes, progress)

    def need_by_query(self, plan: PlanProfile, shapes: list[Shape], progress: Any) -> Need:
        """The need as ``workspace_size()`` answers it (``NotImplementedError``: no such query)."""
        selector = torch.empty(0, dtype=torch.uint8, device=self.device)  # device selector only
        wrapper_for = self.wrappers(plan, selector)
        best, worst, most_int = 0, None, 0
        for shape in shapes:
            args, kwargs = self.plan_args(plan, shape)
            ask = getattr(wrapper_for(shape), "workspace_size", None)
            if ask is None:
                raise NotImplementedError("this FlashInfer's wrappers have no workspace_size()")
            need, int_need = ask(*args, **kwargs)
            if need >= best:  # of shapes that tie (graph sizes often do), name the largest
                best, worst = need, shape
            most_int = max(most_int, int_need)
            if progress is not None:
                progress.update()
        return Need(best, worst if best else None, "workspace_size", int_bytes=most_int)

    def need_by_growth(self, plan: PlanProfile, shapes: list[Shape], progress: Any) -> Need:
        """The need as planning on empty workspaces grows them."""
        empty = torch.zeros(0, dtype=torch.uint8, device=self.device)
        # No setting sizes them (floor ""): their growths are the measurement, logged at DEBUG.
        int_workspace = IntWorkspace(empty.clone(), "calibration:int", floor="")
        workspace = Workspace(empty, "calibration", floor="", int_workspace=int_workspace)
        wrapper_for = self.wrappers(plan, workspace.tensor)
        int_measured = True  # until a wrapper keeps no int workspace to replace
        worst, refused = None, []
        for shape in shapes:
            before = workspace.tensor.numel()
            args, kwargs = self.plan_args(plan, shape)
            try:
                wrapper = wrapper_for(shape)
                int_measured = int_measured and install_int_workspace(wrapper, workspace)
                workspace.plan(wrapper.plan, *args, **kwargs)
            except self.refusals as error:  # FlashInfer refuses the shape itself
                if is_bounding(shape, plan, self.profile):
                    raise ResourceConfigError(
                        f"FlashInfer refused to plan {shape}, a shape that bounds what a "
                        f"{plan.kind.value} plan on backend {plan.backend} needs ({error}); a "
                        "floor measured without it could fall short, so none is written. Lower "
                        "the profile's limits (calibration.limits) to what the engine can plan, "
                        "or plan with another backend"
                    ) from error
                refused.append(f"{shape}: {error}")
            if workspace.tensor.numel() > before:
                worst = shape
            if progress is not None:
                progress.update()
        if len(refused) == len(shapes):
            raise ResourceConfigError(
                f"FlashInfer refused every shape of a {plan.kind.value} plan on backend "
                f"{plan.backend}, so nothing was measured; the first: {refused[0]}"
            )
        int_bytes = int_workspace.tensor.numel() if int_measured else None
        return Need(workspace.tensor.numel(), worst, "growth", tuple(refused), int_bytes)
