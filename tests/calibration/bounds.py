"""Why a calibrated floor is a bound, not a sample: how FlashInfer (0.7.x, fa2) sizes its float
workspace, and the most any plan within a profile's limits can ask for.

Only plans that split the KV of a request use the float workspace. A split plan allocates, from
offset 0 and each 16-byte aligned, ``tmp_v`` (the partial outputs) then ``tmp_s`` (their
log-sum-exp), both in float32 whatever the output dtype, for ``P`` work items padded as the
scheduler (``include/flashinfer/attention/scheduler.cuh``) decides:

- **Decode** (``DecodePlan``): ``bytes = Hq * P * (4 * head_dim + 4)``. The scheduler fits the
  split work in a grid of ``max_grid = blocks_per_sm * SMs`` blocks, ``Hkv`` per work item, so
  ``P <= max_grid // Hkv`` (``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch`` picks the
  chunk so that it holds). Under CUDA graphs ``P`` is padded to exactly ``max_grid // Hkv`` for
  every batch that splits (a batch with ``B * Hkv >= max_grid`` does not split: 0 bytes), so one
  graph plan measures the most any decode plan, graph or eager, can need. ``blocks_per_sm`` comes
  from a CUDA occupancy query (9 for the bf16, head-dim-128 kernel on an H200): it is measured, not
  assumed.
- **Prefill** (``PrefillPlan``, ``PrefillSplitQOKVIndptr``): eager plans that split hold at most
  ``max_batch_size_if_split = (2 * SMs) // Hkv`` work items of ``cta_tile_q <= 128`` query rows
  each (two blocks per SM is fixed in the source), and the partials are sized by query rows:
  ``rows = ceil(P * cta_tile_q / (Hq / Hkv))``, ``bytes = Hq * rows * (4 * head_dim + 4)``. So
  ``bytes <= 4 * (head_dim + 1) * Hkv * ((2 * SMs) // Hkv) * 128``, which is 17,436,672 on an H200
  with head dim 128 for any ``Hkv`` that divides 264, and is reached by a few query rows over a
  context long enough to split into the whole grid (e.g. 1 x 32 tokens over 131,072 with 32/8
  heads). The context length and the batched-token budget don't enter the bound: a longer context
  only changes the chunk size, and more query tiles than the grid holds turn the split off.

- **Ragged prefill** plans through the same ``PrefillPlan``, and so has the same bound; so does
  **POD**'s decode batch (``PODWithPagedKVCacheWrapper`` plans it as a prefill of one row a
  request, so its work items hold a 16-row tile and it stays well below). Under CUDA graphs a
  prefill-style plan pads to ``max(grid, query tiles)`` instead, which one plan at each graph
  batch size measures.
- **Tensor-core decode** (``use_tensor_cores=True``, vLLM's and SGLang's) is ``PrefillPlan``
  with ``q_len_per_req`` query rows a request. Eagerly it splits within the same grid as prefill.
  Under CUDA graphs ``P = max(grid, query tiles)`` (``grid = (2 * SMs) // Hkv``), and how the
  tiles and partials are counted changed between versions (:func:`tensor_core_graph_bytes`):
  FlashInfer 0.6.x pads the tiles for ragged rows (``ceil(B * q * group / tile) + B - 1``) and
  sizes the partials by tiles (``P * tile`` rows), so the need grows with the graph batch ``B``
  without bound (32/2 heads, head dim 256, ``B = 512``: 538,441,728 bytes, above vLLM's default
  buffer); 0.7.2 sizes them by query rows (``ceil(P * tile / group)``); 0.7.4 counts tiles of a
  uniform query length (``B * ceil(q * group / tile)``) and turns the split off past the grid (0
  bytes). One plan per graph batch size measures it, whatever the version.
- **MLA** (``MLAPlan``; ``fa2`` and ``fa3``) sizes its partials by the grid alone:
  ``2 * clusters * cluster_tile_q`` rows (``cluster_tile_q = 64 * cluster_size``,
  ``clusters = SMs // cluster_size``) of ``2 * head_dim_ckv`` bytes of output plus 4 of
  log-sum-exp. No shape enters it, so every MLA plan on a GPU needs the same bytes, 17,369,088
  on an H200 with ``head_dim_ckv=512``, and the wrapper checks for them before it plans.

Calibration plans those bounding configurations (every graph batch size; eager prefill shapes of
a few query rows over the longest context, see ``measure.py``) through FlashInfer and records what
they need; the functions below are the same arithmetic, to check a measurement against and to say
what the bound is on another GPU. The GPU tests plan a dense sweep and random shapes within the
limits and find nothing above the recorded need.
"""

from __future__ import annotations

from mstar_resources.units import ALIGNMENT, round_up

__all__ = [
    "cta_tile_q",
    "decode_bytes",
    "mla_bytes",
    "prefill_bound_bytes",
    "prefill_bytes",
    "tensor_core_graph_bytes",
]

FLOAT32 = 4
PREFILL_BLOCKS_PER_SM = 2
"""``PrefillPlan``'s grid: two blocks per SM, fixed in the source."""
MAX_CTA_TILE_Q = 128
"""The most query rows one prefill work item holds (``FA2DetermineCtaTileQ``)."""
MLA_CTA_TILE_Q = 64
"""Query rows of one MLA block; a cluster of two blocks holds twice as many."""
MLA_OUTPUT_BYTES = 2
"""MLA's partial outputs are 16-bit, whatever the output dtype (``sizeof_dtype_o``)."""


def _align(nbytes: int) -> int:
    return round_up(nbytes, ALIGNMENT)


def _partials(qo_heads: int, rows: int, head_dim: int) -> int:
    """``tmp_v`` and ``tmp_s`` for ``rows`` rows of every query head."""
    return _align(qo_heads * rows * head_dim * FLOAT32) + _align(qo_heads * rows * FLOAT32)


def decode_bytes(qo_heads: int, head_dim: int, work_items: int) -> int:
    """A decode plan's float workspace for ``work_items`` (padded) split work items."""
    return _partials(qo_heads, work_items, head_dim)


def prefill_bytes(
    qo_heads: int, kv_heads: int, head_dim: int, work_items: int, cta_tile_q: int
) -> int:
    """A prefill plan's float workspace for ``work_items`` split work items of ``cta_tile_q``
    packed query rows (``Hq / Hkv`` heads share a row of a work item)."""
    group = qo_heads // kv_heads
    rows = -(-work_items * cta_tile_q // group)
    return _partials(qo_heads, rows, head_dim)


def prefill_bound_bytes(qo_heads: int, kv_heads: int, head_dim: int, sm_count: int) -> int:
    """The most float workspace any eager prefill plan can need on ``sm_count`` SMs."""
    work_items = (PREFILL_BLOCKS_PER_SM * sm_count) // kv_heads
    return prefill_bytes(qo_heads, kv_heads, head_dim, work_items, MAX_CTA_TILE_Q)


def mla_bytes(head_dim_ckv: int, sm_count: int) -> int:
    """What every MLA plan needs on ``sm_count`` SMs: the most of one- and two-block clusters
    (the same for an even SM count)."""
    needs = []
    for cluster_size in (1, 2):
        rows = 2 * (sm_count // cluster_size) * cluster_size * MLA_CTA_TILE_Q
        needs.append(_align(rows * MLA_OUTPUT_BYTES * head_dim_ckv) + _align(rows * FLOAT32))
    return max(needs)


def cta_tile_q(packed_rows: int, head_dim: int) -> int:
    """The query tile a prefill-style plan picks for ``packed_rows`` rows (query tokens x GQA
    group) on an SM80 or newer GPU (``FA2DetermineCtaTileQ``, head dims up to 256)."""
    if packed_rows > 64 and head_dim < 256:
        return MAX_CTA_TILE_Q
    return 64 if packed_rows > 16 else 16


def tensor_core_graph_bytes(
    qo_heads: int,
    kv_heads: int,
    head_dim: int,
    batch: int,
    sm_count: int,
    flashinfer: tuple[int, ...],
    q_len_per_req: int = 1,
) -> int:
    """What a CUDA-graph tensor-core decode plan of ``batch`` requests of ``q_len_per_req``
    tokens needs on ``sm_count`` SMs, as FlashInfer release ``flashinfer`` (e.g. ``(0, 6, 6)``)
    sizes it: the arithmetic of the module docstring, read in 0.6.6, 0.7.2 and 0.7.4."""
    group = qo_heads // kv_heads
    grid = (PREFILL_BLOCKS_PER_SM * sm_count) // kv_heads
    if flashinfer >= (0, 7, 4):
        tile = cta_tile_q(q_len_per_req * group, head_dim)
        tiles = batch * -(-q_len_per_req * group // tile)
        if tiles > grid:  # every request is one work item already: no split
            return 0
        return prefill_bytes(qo_heads, kv_heads, head_dim, grid, tile)
    rows = batch * q_len_per_req
    tile = cta_tile_q(((q_len_per_req - 1) * batch + 1) * group, head_dim)
    work_items = max(grid, -(-rows * group // tile) + batch - 1)
    if flashinfer >= (0, 7):
        return prefill_bytes(qo_heads, kv_heads, head_dim, work_items, tile)
    return _partials(qo_heads, work_items * tile, head_dim)
