"""What engines reserve for a deployment's FlashInfer workspace: one shared buffer each."""

from __future__ import annotations

import pytest

from mstar_resources.calibration.engine_buffers import engine_buffers_mb, vllm_buffer_mb
from mstar_resources.calibration.profile import load_profile

from ..conftest import compose_shipped


@pytest.mark.parametrize(
    ("deployment", "ranks", "mb"),
    [
        # 8192 batched tokens x 32 heads x 128 x 16 B = 512 MiB, above vLLM's 394 minimum.
        pytest.param("llama3-8b-h200", 1, 512, id="8b"),
        pytest.param("llama3-8b-h200", 2, 394, id="8b-two-ranks"),  # 256 MiB: the minimum
        pytest.param("llama3-70b-tp8-h200", 1, 394, id="70b-tp8"),
    ],
)
def test_the_engines_buffer_is_vllm_s_size_for_the_deployment(deployment, ranks, mb):
    profile = load_profile(compose_shipped([f"deployment={deployment}"]).calibration)
    assert vllm_buffer_mb(profile, ranks) == mb


def test_each_engine_reserves_one_buffer_for_all_its_wrappers():
    profile = load_profile(compose_shipped(["deployment=llama3-8b-h200"]).calibration)
    assert engine_buffers_mb(profile) == {
        "vLLM": 512, "SGLang": 384, "TensorRT-LLM": 320, "MLC-LLM": 768,
    }  # fmt: skip
