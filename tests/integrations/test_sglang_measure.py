"""``MSTAR_RESOURCES_SGLANG=auto``: what the plugin reads of SGLang's model runner to plan as its
FlashInfer backend will, on stand-ins holding the attributes SGLang 0.5.17 has when it starts to
size its KV pool; the measurement itself runs in SGLang on the GPU (``scripts/sglang_proof.py``)."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from mstar_resources.calibration.engine_plans import Engine, uses_tensor_cores
from mstar_resources.calibration.profile import PlanKind
from mstar_resources.integrations.sglang.measure import (
    MOST_RUNNING_REQUESTS,
    SglangPlans,
    sglang_plans,
)
from mstar_resources.resolver import resolve, serving


def phase(backend: str = "full", bs: list[int] | None = None) -> Any:
    return types.SimpleNamespace(backend=backend, bs=bs)


def runner() -> Any:
    """SGLang's ``ModelRunner`` of a Llama 3 8B-shaped model (32 / 8 heads of 128, bf16)."""
    model = types.SimpleNamespace(
        get_max_num_attention_heads=lambda: 32,
        get_num_kv_heads=lambda tp: max(1, 8 // tp),
        head_dim=128, dtype=torch.bfloat16, context_len=8192, is_encoder_decoder=False,
    )  # fmt: skip
    return types.SimpleNamespace(
        model_config=model, page_size=1, kv_cache_dtype=torch.bfloat16, sliding_window_size=None
    )


def context(tp: int = 1, dp: int = 1, graphs: Any = None, **schedule: Any) -> Any:
    """SGLang's ``runtime_context``: the settings in effect, SGLang's defaults but ``schedule``'s,
    in its bags (``get_schedule()``, ``get_exec()``, ``get_parallel()``)."""
    if graphs is None:
        graphs = types.SimpleNamespace(
            decode=phase(bs=[1, 2, 4, 8, 12, 16, 24, 32]), prefill=phase("disabled")
        )
    limits = {"max_running_requests": None, "chunked_prefill_size": 4096,
              "max_prefill_tokens": 16384, **schedule}  # fmt: skip
    execution = types.SimpleNamespace(
        graph=types.SimpleNamespace(cuda_graph_config=graphs),
        deterministic=types.SimpleNamespace(enable_deterministic_inference=False),
    )
    return types.SimpleNamespace(
        get_parallel=lambda: types.SimpleNamespace(attn_tp_size=tp, attn_dp_size=dp),
        get_schedule=lambda: types.SimpleNamespace(**limits),
        get_exec=lambda: execution,
    )


def test_sglangs_defaults_plan_its_most_requests_and_largest_prefill_batch():
    plans = sglang_plans(runner(), context(tp=2))
    assert isinstance(plans, SglangPlans)
    assert (plans.num_qo_heads, plans.num_kv_heads, plans.head_dim) == (16, 4, 128)
    assert (plans.q_dtype, plans.kv_dtype, plans.page_size) == ("bfloat16", "bfloat16", 1)
    # No --max-running-requests: SGLang's cap; a prefill batch of max_prefill_tokens.
    assert plans.max_running_requests == MOST_RUNNING_REQUESTS
    assert plans.max_prefill_tokens == 16384
    assert plans.decode_graph_batch_sizes == (1, 2, 4, 8, 12, 16, 24, 32)


@pytest.mark.parametrize(
    ("settings", "requests", "tokens", "graphs"),
    [
        # Its limit, and the graphs SGLang captures clamped to it (plus the limit itself).
        ({"max_running_requests": 20}, 20, 16384, (1, 2, 4, 8, 12, 16, 20)),
        # Per attention data-parallel rank.
        ({"max_running_requests": 64, "dp": 4}, 16, 16384, (1, 2, 4, 8, 12, 16)),
        # Chunked prefill off: a whole prompt of the context length, where that is more.
        ({"chunked_prefill_size": -1, "max_prefill_tokens": 4096}, 4096, 8192,
         (1, 2, 4, 8, 12, 16, 24, 32)),
        # No decode graphs captured.
        ({"graphs": types.SimpleNamespace(decode=phase("disabled", [1, 2]),
                                          prefill=phase("disabled"))},
         4096, 16384, ()),
    ],
)  # fmt: skip
def test_the_limits_in_effect_are_the_limits_planned(settings, requests, tokens, graphs):
    plans = sglang_plans(runner(), context(**settings))
    assert isinstance(plans, SglangPlans)
    assert plans.max_running_requests == requests
    assert plans.max_prefill_tokens == tokens
    assert plans.decode_graph_batch_sizes == graphs


def test_the_profile_plans_both_prefill_wrappers_and_decode_as_sglang_does():
    plans = sglang_plans(runner(), context())
    assert isinstance(plans, SglangPlans)
    profile = plans.profile()
    assert profile.engine is Engine.sglang
    assert {label: p.kind for label, p in profile.plans.items()} == {
        "prefill": PlanKind.paged_prefill,
        "ragged_prefill": PlanKind.ragged_prefill,
        "decode": PlanKind.decode,
    }
    # SGLang's own choice of tensor cores for this GQA group (4), and its captured sizes.
    assert profile.plans["decode"].tensor_cores == uses_tensor_cores(
        Engine.sglang, 32, 8, "bfloat16"
    )
    assert profile.cuda_graph_batch_sizes == [1, 2, 4, 8, 12, 16, 24, 32]
    assert (profile.limits.max_num_seqs, profile.limits.max_model_len) == (4096, 8192)
    # The tree measured serves both of SGLang's roles, decode under its graphs.
    records = resolve(plans.tree(), env={})
    assert serving(records, "prefill").labels == ("prefill", "ragged_prefill")
    assert serving(records, "decode").cg_slots == (0,)


@pytest.mark.parametrize(
    ("change", "settings", "why"),
    [
        ({"sliding_window_size": 4096}, {}, "sliding-window"),
        ({"kv_cache_dtype": torch.uint8}, {}, "FP8 stand-in"),
        ({}, {"graphs": types.SimpleNamespace(decode=phase(bs=[1]), prefill=phase("full", [8]))},
         "prefill CUDA graphs"),
    ],
)  # fmt: skip
def test_attention_the_profile_cannot_hold_is_left_to_sglang_saying_why(change, settings, why):
    stand_in = runner()
    for name, value in change.items():
        setattr(stand_in, name, value)
    reason = sglang_plans(stand_in, context(**settings))
    assert isinstance(reason, str) and why in reason
