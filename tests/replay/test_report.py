"""The report's line on the trace, from report.json's ``trace`` entry (a plain dict)."""

from __future__ import annotations

import pytest

from mstar_resources.replay.report import trace_line, trace_summary
from mstar_resources.replay.trace import Request
from mstar_resources.replay.workload import Workload

SERVED = {"requests": 1998, "steps": 42013, "prompt_tokens": 2209565, "generated_tokens": 529807}
"""What was served of a trace, as report.json's ``trace`` entry holds it."""


@pytest.mark.parametrize(
    ("source", "line"),
    [
        pytest.param(
            {"source": "synthetic", "seed": 0, "max_model_len": 131072, "refused": 0,
             "clipped": 0},
            "trace: synthetic (seed 0): 1,998 requests served, 0 refused (prompt >= max_model_len "
            "131,072), 0 clipped (output cut to fit); 42,013 steps; 2,209,565 prompt tokens, "
            "529,807 generated",
            id="synthetic",
        ),
        pytest.param(
            {"source": "file", "path": "azure-conv-2023.csv", "offset": 100, "rows": 2000,
             "rows_in_file": 19366, "span_s": 424.259457, "step_ms": 10.0, "seed": 0,
             "max_model_len": 4096, "refused": 2, "clipped": 5},
            "trace: azure-conv-2023.csv rows 100..2,099 of 19,366 (424.3 s at 10 ms a step, "
            "seed 0): 1,998 requests served, 2 refused (prompt >= max_model_len 4,096), 5 clipped "
            "(output cut to fit); 42,013 steps; 2,209,565 prompt tokens, 529,807 generated",
            id="file",
        ),
    ],
)  # fmt: skip
def test_the_trace_line_names_the_source_and_what_was_served(source, line):
    assert trace_line({**source, **SERVED}) == line


def test_the_summary_counts_the_requests_and_their_tokens():
    requests = [Request(0, 0, (1, 2, 3), 4), Request(1, 7, (5,), 2)]
    workload = Workload(requests, {"source": "synthetic", "seed": 3})
    assert trace_summary(workload, steps=9) == {
        "source": "synthetic", "seed": 3, "requests": 2, "steps": 9, "prompt_tokens": 4,
        "generated_tokens": 6,
    }  # fmt: skip
