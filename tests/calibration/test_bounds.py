"""The float-workspace arithmetic of bounds.py reproduces what FlashInfer reported on an H200."""

from __future__ import annotations

import pytest

from mstar_resources.calibration.bounds import (
    decode_bytes,
    mla_bytes,
    prefill_bound_bytes,
    prefill_bytes,
    tensor_core_graph_bytes,
)

H200_SMS = 132
DECODE_GRID = 9 * H200_SMS  # blocks per SM from the decode kernel's occupancy, times SMs


# (q heads, kv heads, padded work items) -> bytes FlashInfer's workspace_size() said (H200)
DECODE = [
    pytest.param(32, 8, DECODE_GRID // 8, 2_443_776, id="graph-32-8"),
    pytest.param(8, 1, DECODE_GRID // 1, 4_904_064, id="graph-8-1"),
    pytest.param(32, 8, 32, 528_384, id="eager-bs1-kv4096"),  # 256 pages in chunks of 8
    pytest.param(32, 8, 128, 2_113_536, id="eager-bs64-kv4096"),  # 64 requests x 2 chunks
]  # fmt: skip


@pytest.mark.parametrize(("qo", "kv", "work_items", "measured"), DECODE)
def test_decode_bytes_are_what_flashinfer_measured(qo, kv, work_items, measured):
    assert decode_bytes(qo, 128, work_items) == measured


# (q heads, kv heads, work items, cta rows) -> bytes measured
PREFILL = [
    pytest.param(32, 8, 33, 128, 17_436_672, id="1x32-over-131072-32-8"),
    pytest.param(8, 1, 264, 128, 17_436_672, id="8x16-over-131072-8-1"),
]  # fmt: skip


@pytest.mark.parametrize(("qo", "kv", "work_items", "cta", "measured"), PREFILL)
def test_prefill_bytes_are_what_flashinfer_measured(qo, kv, work_items, cta, measured):
    assert prefill_bytes(qo, kv, 128, work_items, cta) == measured


@pytest.mark.parametrize(("qo", "kv"), [(32, 8), (8, 1), (64, 8), (16, 2), (4, 4)])
def test_the_prefill_bound_does_not_depend_on_the_heads_when_they_divide_the_grid(qo, kv):
    # 2 blocks x 132 SMs = 264 work items of 128 rows, whatever the heads: 17,436,672 bytes.
    assert prefill_bound_bytes(qo, kv, 128, H200_SMS) == 17_436_672


def test_the_prefill_bound_scales_with_the_sms_and_the_head_dim():
    # An H100 PCIe's 114 SMs: 228 blocks, 28 work items of 8 KV heads (8 does not divide 228).
    assert prefill_bound_bytes(32, 8, 128, 114) == 516 * 8 * (228 // 8) * 128
    assert prefill_bound_bytes(32, 8, 64, H200_SMS) == 260 * 264 * 128


def test_mla_bytes_are_what_flashinfer_measured():
    # An MLA plan grown from 64 KiB on an H200 (compressed KV 512), on fa2, fa3 and auto alike.
    assert mla_bytes(512, H200_SMS) == 17_369_088


def test_an_odd_sm_count_needs_the_one_block_clusters_rows():
    # Clusters of two leave an SM idle: the one-block cluster's 2 x 133 x 64 rows are the most.
    rows = 2 * 133 * 64
    assert mla_bytes(512, 133) == rows * 2 * 512 + rows * 4


# A CUDA-graph tensor-core decode plan (vLLM's), 32 query and 2 KV heads, head dim 256, grown
# from a 1 MiB workspace on an H200 (132 SMs) at graph batches 392, 400 and 512 on FlashInfer
# 0.6.6: what it grew to. On 0.7.4 the same plans did not grow past 1 MiB.
@pytest.mark.parametrize(
    ("batch", "measured"),
    [(392, 412_121_088), (400, 420_542_464), (512, 538_441_728)],
)
def test_tensor_core_graph_bytes_are_what_flashinfer_0_6_6_grew_to(batch, measured):
    assert tensor_core_graph_bytes(32, 2, 256, batch, H200_SMS, (0, 6, 6)) == measured


@pytest.mark.parametrize("batch", [392, 400, 512])
def test_tensor_core_graph_plans_past_the_grid_need_nothing_on_flashinfer_0_7_4(batch):
    assert tensor_core_graph_bytes(32, 2, 256, batch, H200_SMS, (0, 7, 4)) < 1 << 20


def test_the_tensor_core_graph_need_grows_with_the_batch_before_0_7_4_only():
    def needs(version: tuple[int, ...]) -> list[int]:
        return [tensor_core_graph_bytes(32, 8, 128, b, H200_SMS, version) for b in (1, 32, 256)]

    old, rows, uniform = needs((0, 6, 6)), needs((0, 7, 2)), needs((0, 7, 4))
    assert old == sorted(old) and old[0] < old[-1]
    assert all(r < o for r, o in zip(rows, old, strict=True))  # partials by rows, not tiles
    # Up to the grid (2 x 132 // 8 = 33 requests) a split of the grid, past it none.
    assert uniform[-1] == 0 and uniform[0] == uniform[1] > 0
