"""The replay's requests: the synthetic trace by default, or a slice of a trace file named by the
replay's settings, with what the report says of their source."""

from __future__ import annotations

import pytest

from mstar_resources.errors import ResourceConfigError
from mstar_resources.replay.trace import synthetic_requests
from mstar_resources.replay.workload import load_workload

SETTINGS = {"requests": 3, "trace_offset": 0, "step_ms": 10.0, "seed": 0, "vocab_size": 100}
CSV = """\
TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:51.3910170,91,16
"""


def test_no_file_is_the_synthetic_trace():
    workload = load_workload(None, **SETTINGS, max_model_len=4096)
    assert list(workload.requests()) == list(synthetic_requests(3, 0, 4096, 100))
    assert workload.source == {
        "source": "synthetic", "seed": 0, "max_model_len": 4096, "refused": 0, "clipped": 0,
    }  # fmt: skip


def test_a_file_s_slice_is_trace_offset_and_requests(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(CSV)
    settings = {**SETTINGS, "requests": 2, "trace_offset": 1}
    workload = load_workload(str(path), **settings, max_model_len=500)
    # Rows 1 and 2: 396 + 109 tokens are clipped to 500; 879 prompt tokens are refused.
    assert [(r.prompt_len, r.output_len) for r in workload.requests()] == [(396, 104)]
    assert workload.source == {
        "source": "file", "path": str(path), "offset": 1, "rows": 2, "rows_in_file": 4,
        "requested": 2,
        "span_s": pytest.approx(0.2272980), "step_ms": 10.0, "seed": 0, "max_model_len": 500,
        "refused": 1, "clipped": 1,
    }  # fmt: skip


def test_a_slice_with_nothing_to_serve_is_refused(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(CSV)
    settings = {**SETTINGS, "requests": 1, "trace_offset": 2}
    refused = (
        r"none of the 1 rows read \(trace_offset=2, requests=1\) has a prompt shorter than "
        r"calibration\.limits\.max_model_len=500 tokens"
    )
    with pytest.raises(ResourceConfigError, match=refused):
        load_workload(str(path), **settings, max_model_len=500)


def test_a_synthetic_workload_is_streamed_and_the_same_at_every_call():
    from collections.abc import Generator

    workload = load_workload(
        None, requests=5, trace_offset=0, step_ms=10.0, seed=3, vocab_size=100,
        max_model_len=4096,
    )  # fmt: skip
    first, again = workload.requests(), workload.requests()
    assert isinstance(first, Generator)  # drawn one at a time, not a list held by the workload
    assert list(first) == list(again) == list(synthetic_requests(5, 3, 4096, 100))
    assert workload.served == 5
