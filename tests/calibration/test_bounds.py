"""The float-workspace arithmetic of bounds.py reproduces what FlashInfer reported on an H200."""

from __future__ import annotations

import pytest

from .bounds import (
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
    # Measured on the H200 for 32/8 and 8/1 (PREFILL above) and 96/8 (the README's GLM-4.5-Air
    # row). By hand for 4/4: 2 blocks x 132 SMs // 4 = 66 work items of 128 rows, group 1, so
    # 8,448 rows; 4 heads x 8,448 rows x (128 x 4 + 4) B = 33,792 x 516 = 17,436,672.
    assert prefill_bound_bytes(qo, kv, 128, H200_SMS) == 17_436_672


@pytest.mark.parametrize(
    ("head_dim", "sms", "expected"),
    [
        # An H100 PCIe's 114 SMs: 2 x 114 = 228 blocks, 228 // 8 = 28 work items (8 does not
        # divide 228) of 128 rows for a group of 32 / 8 = 4 heads: 28 x 128 / 4 = 896 rows.
        # tmp_v 32 x 896 x 128 x 4 = 14,680,064 + tmp_s 32 x 896 x 4 = 114,688 = 14,794,752.
        pytest.param(128, 114, 14_794_752, id="h100-pcie-114-sms"),
        # The H200's 264 // 8 = 33 work items: 33 x 128 / 4 = 1,056 rows. tmp_v 32 x 1,056 x
        # 64 x 4 = 8,650,752 + tmp_s 32 x 1,056 x 4 = 135,168 = 8,785,920.
        pytest.param(64, H200_SMS, 8_785_920, id="h200-head-dim-64"),
    ],
)
def test_the_prefill_bound_scales_with_the_sms_and_the_head_dim(head_dim, sms, expected):
    assert prefill_bound_bytes(32, 8, head_dim, sms) == expected


def test_mla_bytes_are_what_flashinfer_measured():
    # An MLA plan grown from 64 KiB on an H200 (compressed KV 512), on fa2, fa3 and auto alike.
    assert mla_bytes(512, H200_SMS) == 17_369_088


def test_an_odd_sm_count_needs_the_one_block_clusters_rows():
    # Clusters of two leave an SM idle: 133 // 2 = 66 clusters x 128 rows x 2 = 16,896 rows, the
    # H200's 17,369,088 bytes. One-block clusters: 133 x 64 x 2 = 17,024 rows, of 2 x 512
    # bytes of output (17,432,576) and 4 of log-sum-exp (68,096): 17,500,672, the most.
    assert mla_bytes(512, 133) == 17_500_672


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
    # Measured: under 1 MiB. By hand: a group of 16 heads is one 16-row tile a request, and
    # 392, 400 or 512 tiles are more than the grid's 264 // 2 = 132: no split, 0 bytes.
    assert tensor_core_graph_bytes(32, 2, 256, batch, H200_SMS, (0, 7, 4)) == 0


# The shipped deployments' decode needs at their worst graph batch, measured on an H200 with
# the engine's tensor-core plans (the README's table): (q heads, kv heads, head dim, batch).
@pytest.mark.parametrize(
    ("qo", "kv", "head_dim", "batch", "version", "measured"),
    [
        pytest.param(32, 2, 256, 128, (0, 7, 4), 4_342_272, id="qwen3.5-0.7.4"),
        pytest.param(96, 8, 128, 32, (0, 7, 4), 2_179_584, id="glm-4.5-air-0.7.4"),
        pytest.param(32, 8, 128, 32, (0, 7, 4), 2_179_584, id="llama3-8b-0.7.4"),
        pytest.param(8, 1, 128, 256, (0, 7, 4), 2_179_584, id="llama3-70b-tp8-0.7.4"),
        pytest.param(96, 8, 128, 256, (0, 6, 6), 354_281_472, id="glm-4.5-air-0.6.6"),
        pytest.param(32, 8, 128, 256, (0, 6, 6), 84_277_248, id="llama3-8b-0.6.6"),
        pytest.param(8, 1, 128, 512, (0, 6, 6), 50_658_816, id="llama3-70b-tp8-0.6.6"),
    ],
)
def test_tensor_core_graph_bytes_are_the_shipped_deployments_measured_needs(
    qo, kv, head_dim, batch, version, measured
):
    assert tensor_core_graph_bytes(qo, kv, head_dim, batch, H200_SMS, version) == measured


# 32/8 heads of 128 on the H200: a group of 4, one 16-row tile (4 rows is <= 16), a grid of
# 264 // 8 = 33 work items, 32 x (128 x 4 + 4) = 16,512 bytes a partial row.
# 0.6.6 pads the tiles for ragged rows, ceil(B x 4 / 16) + B - 1, takes the most of that and 33,
# and sizes the partials by tiles (x 16 rows):
#   B=1:   max(33, 1 + 0)     = 33  -> 528 rows   -> 8,718,336
#   B=32:  max(33, 8 + 31)    = 39  -> 624 rows   -> 10,303,488
#   B=256: max(33, 64 + 255)  = 319 -> 5,104 rows -> 84,277,248 (measured, above)
# 0.7.2 has the same work items but sizes the partials by query rows, ceil(P x 16 / 4):
#   33 -> 132 rows -> 2,179,584; 39 -> 156 rows -> 2,575,872; 319 -> 1,276 rows -> 21,069,312
# 0.7.4 counts B x 1 tiles: up to 33 requests a split of the grid (132 rows, 2,179,584,
# measured at B=32), past it none.
@pytest.mark.parametrize(
    ("version", "needs"),
    [
        pytest.param((0, 6, 6), [8_718_336, 10_303_488, 84_277_248], id="0.6.6-tiles"),
        pytest.param((0, 7, 2), [2_179_584, 2_575_872, 21_069_312], id="0.7.2-rows"),
        pytest.param((0, 7, 4), [2_179_584, 2_179_584, 0], id="0.7.4-uniform"),
    ],
)
def test_the_tensor_core_graph_need_grows_with_the_batch_before_0_7_4_only(version, needs):
    batches = (1, 32, 256)
    assert [tensor_core_graph_bytes(32, 8, 128, b, H200_SMS, version) for b in batches] == needs
