"""What engines reserve for a deployment's FlashInfer workspace: one shared buffer each.

The expected sizes are the engines' own figures in bytes, not this package's constants: vLLM's
``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE`` default of 394 MiB is 394 x 1,048,576 = 413,138,944
bytes (``vllm/envs.py``; the README records it); SGLang's ``SGLANG_FLASHINFER_WORKSPACE_SIZE``
default 384 x 1,048,576 = 402,653,184; TensorRT-LLM's hard-coded 320 x 1,048,576 = 335,544,320;
MLC-LLM's 768 x 1,048,576 = 805,306,368. vLLM's per-token floor (PR #48428) is
``max_num_batched_tokens x query heads per rank x head dim x 16`` bytes, worked out by hand below
from each deployment's ``conf/deployment/<name>.yaml``.
"""

from __future__ import annotations

import pytest

from mstar_resources.calibration.calibrate import vllm_formula_bytes
from mstar_resources.calibration.profile import load_profile
from mstar_resources.units import MIB

from ..conftest import compose_shipped
from ..scripts import load_script

engines = load_script("_engines")

VLLM_DEFAULT_BYTES = 413_138_944
"""vLLM's default FlashInfer buffer, 394 MiB (394 x 1,048,576)."""


@pytest.mark.parametrize(
    ("overrides", "formula_bytes", "buffer_bytes"),
    [
        # 8,192 tokens x 32 heads x 128 x 16 B = 8,192 x 65,536 = 536,870,912 = 512 MiB exactly,
        # above 413,138,944: the formula's.
        pytest.param(["deployment=llama3-8b-h200"], 536_870_912, 536_870_912, id="8b"),
        # 16,384 x 8 heads (one rank of TP8) x 128 x 16 = 268,435,456, under vLLM's default.
        pytest.param(
            ["deployment=llama3-70b-tp8-h200"], 268_435_456, VLLM_DEFAULT_BYTES, id="70b-tp8"
        ),
        # 16,384 x 96 x 128 x 16 = 16,384 x 196,608 = 3,221,225,472 = 3,072 MiB (README's table).
        pytest.param(
            ["deployment=glm-4.5-air-h200"], 3_221_225_472, 3_221_225_472, id="glm-4.5-air"
        ),
        # 8,192 x 32 x 256 x 16 = 8,192 x 131,072 = 1,073,741,824 = 1,024 MiB (README's table).
        pytest.param(
            ["deployment=qwen3.5-122b-a10b-h200"], 1_073_741_824, 1_073_741_824, id="qwen3.5"
        ),
        # 8,193 x 65,536 = 536,936,448 = 512 MiB + 64 KiB: the buffer is 513 whole MiB,
        # 537,919,488 bytes.
        pytest.param(
            ["deployment=llama3-8b-h200", "calibration.limits.max_num_batched_tokens=8193"],
            536_936_448,
            537_919_488,
            id="8b-rounded-up-to-whole-mib",
        ),
    ],
)
def test_the_engines_buffer_is_vllm_s_size_for_the_deployment(
    overrides, formula_bytes, buffer_bytes
):
    profile = load_profile(compose_shipped(overrides).calibration)
    assert vllm_formula_bytes(profile) == formula_bytes
    assert engines.vllm_buffer_mb(profile) * MIB == buffer_bytes


def test_vllm_plans_no_flashinfer_mla_on_an_h200():
    profile = load_profile(compose_shipped(["deployment=deepseek-v3-tp8-h200"]).calibration)
    assert (vllm_formula_bytes(profile), engines.vllm_buffer_mb(profile)) == (None, None)


def test_each_engine_reserves_one_buffer_for_all_its_wrappers():
    profile = load_profile(compose_shipped(["deployment=llama3-8b-h200"]).calibration)
    buffers = engines.engine_buffers_mb(profile)
    assert {engine: mb * MIB for engine, mb in buffers.items() if mb is not None} == {
        "vLLM": 536_870_912, "SGLang": 402_653_184, "TensorRT-LLM": 335_544_320,
        "MLC-LLM": 805_306_368,
    }  # fmt: skip
    assert list(buffers) == ["vLLM", "SGLang", "TensorRT-LLM", "MLC-LLM"]


def test_the_engines_plans_at_other_limits_are_those_a_shipped_deployment_declares():
    cfg = compose_shipped(["deployment=llama3-8b-h200"])
    declared = load_profile(cfg.calibration)
    overrides = engines.engine_plans("vllm", cfg.calibration.model, 256, 8192)
    assert load_profile(compose_shipped(["deployment=llama3-8b-h200", *overrides]).calibration) == (
        declared
    )
    shipped = load_profile(compose_shipped(["deployment=llama3-70b-tp8-h200"]).calibration)
    assert engines.decode_graph_batch_sizes("sglang", 512, 16384) == shipped.cuda_graph_batch_sizes


def test_the_engines_graph_sizes_follow_the_limits():
    sglang = engines.decode_graph_batch_sizes("sglang", 640, 16384)
    assert [s for s in sglang if s > 256] == [*range(272, 512, 16), 512, 544, 576, 608, 640]
    assert engines.decode_graph_batch_sizes("vllm", 32, 8192) == [1, 2, 4, 8, 16, 24, 32]
    # vLLM's sizes are tokens, at most max_num_batched_tokens.
    assert engines.decode_graph_batch_sizes("vllm", 256, 64)[-1] == 64
