"""The plan shapes that bound what a label's workspace can need under a profile
(``docs/calibration.md``, "Why the need is a bound")."""

from __future__ import annotations

from dataclasses import dataclass

from .profile import CalibrationProfile, PlanKind, PlanProfile

SHORT_CONTEXT = 1024
"""Tokens of context in the short-context shapes (or the model's limit, if lower)."""

MAX_CTA_TILE_Q = 128
"""The most query rows one prefill work item holds (FlashInfer's ``FA2DetermineCtaTileQ``)."""

DECODE_LIKE = frozenset({PlanKind.decode, PlanKind.pod})
"""Kinds whose plans have one query token a request (POD plans its decode batch)."""


@dataclass(frozen=True)
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
    values = [1]
    while values[-1] * 2 < limit:
        values.append(values[-1] * 2)
    return sorted({*values, limit})


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
        return sorted(graphs, key=lambda s: (s.batch, s.q_len))
    if cuda_graph:  # a graph replays one decode batch of its size
        return [Shape(b, q, max(q, long), cuda_graph=True) for b in profile.cuda_graph_batch_sizes]
    if plan.kind in DECODE_LIKE:
        batches = _powers_of_two_up_to(min(limits.max_num_seqs, limits.max_num_batched_tokens // q))
        eager = [Shape(b, q, max(q, kv)) for b in batches for kv in contexts]
        if plan.kind is PlanKind.decode and not _fixed_split(plan):
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
    return sorted(set(shapes), key=lambda s: (s.batch, s.q_len, s.kv_len, s.cuda_graph))


def _fixed_split(plan: PlanProfile) -> bool:
    """Whether ``plan`` splits KV in chunks of a fixed size, unbounded by the grid."""
    return plan.fixed_split_size > 0 and not plan.disable_split_kv


def is_bounding(shape: Shape, plan: PlanProfile, profile: CalibrationProfile) -> bool:
    """Whether ``shape`` reaches the most a label can need, so that a floor measured without it
    may fall short: every graph plan, a prefill's full query tiles (or, with a fixed split, any
    shape) over the longest context, a POD or fixed-split decode batch over it. No MLA shape is."""
    if shape.cuda_graph:
        return True
    long = profile.limits.max_model_len
    if plan.kind in (PlanKind.paged_prefill, PlanKind.ragged_prefill):
        full_tile = _fixed_split(plan) or shape.q_len == _full_tile_q(profile)
        return shape.kv_len == long and full_tile
    if plan.kind is PlanKind.decode and _fixed_split(plan):
        return shape.kv_len >= long
    return plan.kind is PlanKind.pod and shape.kv_len == long


def _full_tile_q(profile: CalibrationProfile) -> int:
    """Query tokens a request needs to fill one prefill work item of 128 packed rows."""
    group = profile.model.num_qo_heads // profile.model.num_kv_heads
    limits = profile.limits
    return max(1, min(MAX_CTA_TILE_Q // group, limits.max_num_batched_tokens, limits.max_model_len))
