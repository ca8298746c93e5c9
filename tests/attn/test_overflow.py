"""Reading FlashInfer's overflow errors, their text rebuilt from the installed FlashInfer."""

from __future__ import annotations

import pytest

from mstar_resources.attn._overflow import Overflow, parse_float_overflow

from .fake_allocator import flashinfer_overflow_message, legacy_overflow_message, overflow_text


def test_allocator_header_still_has_the_fields_we_read():
    # A FlashInfer release that renames or drops one of these changes what its error says.
    assert overflow_text().variables == {"name", "size", "alignment", "remaining_space"}


@pytest.mark.parametrize(
    "allocation",
    [
        "batch_decode_tmp_v",
        "batch_decode_tmp_s",
        "batch_prefill_tmp_v",
        "batch_prefill_tmp_s",
        "mla_partial_o",
        "mla_partial_lse",
        "holistic_partial_o",
        "holistic_partial_lse",
        "pod_decode_tmp_v",  # not a name FlashInfer uses today: recognised by its form
    ],
)
def test_reads_float_allocations_from_todays_text(allocation):
    error = RuntimeError(flashinfer_overflow_message(allocation, 2_097_152, 16, 1_048_576))
    assert parse_float_overflow(error) == Overflow(allocation, 2_097_152, 16, 1_048_576)


def test_reads_text_from_before_0_2_9():
    error = RuntimeError(legacy_overflow_message("batch_decode_tmp_v", 4096, 16))
    assert parse_float_overflow(error) == Overflow("batch_decode_tmp_v", 4096, 16, None)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(
            flashinfer_overflow_message("batch_prefill_request_indices", 4096, 16, 0), id="int-now"
        ),
        pytest.param(legacy_overflow_message("batch_decode_kv_chunk_size_ptr", 4, 1), id="int-old"),
        pytest.param(flashinfer_overflow_message("mla_q_indptr", 64, 16, 8), id="int-mla"),
        pytest.param("CUDA error: an illegal memory access was encountered", id="cuda"),
        pytest.param("Expected q to have dtype bfloat16, got float16", id="shapes"),
        pytest.param("", id="empty"),
    ],
)
def test_ignores_everything_else(message):
    assert parse_float_overflow(RuntimeError(message)) is None


@pytest.mark.parametrize(
    ("taken", "alignment", "size", "need"),
    [
        (0, 16, 100, 100),
        (1000, 16, 100, 1108),  # 1000 rounds up to 1008 before the allocation
        (1008, 16, 100, 1108),
        (1001, 1, 7, 1008),
    ],
)
def test_bytes_needed_is_taken_rounded_to_alignment_plus_size(taken, alignment, size, need):
    buffer = 4096
    overflow = Overflow("batch_decode_tmp_s", size, alignment, available=buffer - taken)
    assert overflow.bytes_needed(buffer) == need


def test_bytes_needed_without_available_counts_the_whole_buffer_as_taken():
    assert Overflow("batch_decode_tmp_v", 100, 16, None).bytes_needed(1000) == 1108
