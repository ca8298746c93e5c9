"""Reading FlashInfer's overflow errors, their text rendered from FlashInfer's own headers as the
fixture holds them, and the fixture checked against the installed FlashInfer where there is one."""

from __future__ import annotations

import json

import pytest

from mstar_resources.attn._overflow import MLA_PARTIALS, Overflow, parse_overflow

from ..flashinfer_sources import flashinfer_package, flashinfer_version
from .fake_allocator import (
    FIXTURE,
    StreamText,
    fixture,
    flashinfer_overflow_message,
    header_file,
    installed_flashinfer_file,
    mla_preflight_message,
    overflow_text,
)

# Not imported: FlashInfer's import needs CUDA, and its headers are all this needs.
NO_FLASHINFER = flashinfer_package() is None


def parse_float_overflow(error: BaseException) -> Overflow | None:
    """The float-workspace overflow ``error`` reports, or None (an int one included)."""
    overflow = parse_overflow(error)
    return overflow if overflow is not None and overflow.kind == "float" else None


def test_fixture_has_the_fields_the_library_reads():
    # parse_overflow reads these four; the contract test below ties them to FlashInfer's.
    assert overflow_text().variables == {"name", "size", "alignment", "remaining_space"}


def test_fixture_renders_the_text_seen_on_an_h200():
    # What FlashInfer 0.7.2.post1 and 0.7.4 threw on an H200, its header's path aside.
    assert flashinfer_overflow_message("batch_decode_tmp_v", 2_097_152, 16, 1_048_576) == (
        f"Error in function 'aligned_alloc' at {header_file('allocator.h')}:71: Buffer overflow "
        "when allocating memory for batch_decode_tmp_v with size 2097152 and alignment 16, but "
        "only 1048576 bytes available in AlignedAllocator. Increase the workspace buffer size."
    )


def _what_the_error_says(text: StreamText) -> dict[str, object]:
    """What of an expression reaches the error's text: its parts, and the line its throw reports.
    Not where the expression begins, which appears in no error and moves whenever a macro is added
    above it (exception.h's is at line 31 in one FlashInfer commit, 50 in a later one)."""
    return {"parts": text.parts, "throw_line": text.throw_line}


@pytest.mark.flashinfer
@pytest.mark.skipif(
    NO_FLASHINFER,
    reason=f"needs FlashInfer installed or its wheel in .venv/wheels, to check {FIXTURE.name} "
    "against its headers",
)
def test_fixture_matches_the_installed_flashinfers_headers():
    expressions = fixture()["expressions"]
    installed: dict[str, StreamText] = {}
    for key, expression in expressions.items():
        path = installed_flashinfer_file(expression)
        assert path is not None
        installed[key] = StreamText.find(path, expression["opening"])
    says = {key: _what_the_error_says(text) for key, text in installed.items()}
    held = {key: _what_the_error_says(StreamText.from_record(e)) for key, e in expressions.items()}
    assert says == held, (
        f"{flashinfer_version()}'s headers build another text than {FIXTURE.name} holds (from "
        f"FlashInfer {fixture()['flashinfer']}); theirs, for the fixture:\n"
        + json.dumps({key: text.record() for key, text in installed.items()}, indent=2)
    )


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


def test_reads_mlas_check_before_it_plans_as_a_need_for_the_whole_buffer():
    overflow = parse_float_overflow(ValueError(mla_preflight_message("fa2", 17_369_088)))
    assert overflow == Overflow(MLA_PARTIALS, 17_369_088, 1, 0, whole_buffer=True)
    assert overflow.bytes_needed(65_536) == 17_369_088  # whatever the buffer holds now


def test_reads_the_most_any_backend_asked_for_under_auto():
    # backend="auto" tries each candidate and joins their refusals (mla/_batch_mla/_auto_policy.py).
    refusals = [f"fa3: {mla_preflight_message('fa3', 9_000_000)}",
                f"fa2: {mla_preflight_message('fa2', 17_369_088)}"]  # fmt: skip
    error = ValueError("No supported planned MLA backend: " + "; ".join(refusals))
    assert parse_float_overflow(error).size == 17_369_088


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(
            flashinfer_overflow_message("batch_prefill_request_indices", 4096, 16, 0), id="int-now"
        ),
        pytest.param(flashinfer_overflow_message("mla_q_indptr", 64, 16, 8), id="int-mla"),
        pytest.param("CUDA error: an illegal memory access was encountered", id="cuda"),
        pytest.param("Expected q to have dtype bfloat16, got float16", id="shapes"),
        pytest.param("", id="empty"),
        pytest.param(
            "fa2 MLA needs 232448 shared-memory bytes per block, but this device supports 101376.",
            id="mla-shared-memory",
        ),
        pytest.param(
            "FA MLA needs 20000 work items including KV splits; native capacity is 16384.",
            id="mla-work-items",
        ),
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
