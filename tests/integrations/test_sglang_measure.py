"""``MSTAR_RESOURCES_SGLANG=auto``: what the plugin reads of SGLang's model runner and runtime
context to plan as its FlashInfer backend will, on stand-ins holding what SGLang 0.5.17 and 0.5.23
hold when they start to size the KV pool; the measurement itself runs in SGLang on the GPU
(``scripts/sglang_proof.py``)."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from mstar_resources.calibration.profile import PlanKind
from mstar_resources.integrations.setting import serving
from mstar_resources.integrations.sglang.measure import (
    MOST_RUNNING_REQUESTS,
    SglangPlans,
    sglang_plans,
)

GRAPHS = [1, 2, 4, 8, 12, 16, 24, 32]


def phase(backend: str = "full", bs: list[int] | None = None, max_bs: int | None = None) -> Any:
    return types.SimpleNamespace(backend=backend, bs=bs, max_bs=max_bs)


def runner(**changes: Any) -> Any:
    """SGLang's ``ModelRunner`` of a Llama 3 8B-shaped model (32 / 8 heads of 128, bf16)."""
    model = types.SimpleNamespace(
        num_attention_heads=32, get_max_num_attention_heads=lambda: 32,
        get_num_kv_heads=lambda tp: max(1, 8 // tp),
        head_dim=128, dtype=torch.bfloat16, context_len=8192, is_encoder_decoder=False,
    )  # fmt: skip
    stand_in = types.SimpleNamespace(
        model_config=model, page_size=1, kv_cache_dtype=torch.bfloat16, sliding_window_size=None
    )
    for name, value in changes.items():
        owner, _, attribute = name.rpartition(".")
        setattr(model if owner else stand_in, attribute, value)
    return stand_in


def context(
    tp: int = 1, dp: int = 1, cp: int = 1, dcp: int = 1, prefill: Any = None, decode: Any = None,
    speculative: Any = None, deterministic: bool = False, dllm: str | None = None,
    attention_backend: str | None = "flashinfer", **schedule: Any,
) -> Any:  # fmt: skip
    """SGLang's ``runtime_context``: the settings in effect, SGLang's defaults but those given,
    in its bags (``get_schedule()``, ``get_exec()``, ``get_parallel()``, ``get_spec()``)."""
    graphs = types.SimpleNamespace(
        decode=decode or phase(bs=GRAPHS), prefill=prefill or phase("disabled")
    )
    limits = {"max_running_requests": None, "chunked_prefill_size": 4096,
              "max_prefill_tokens": 16384, **schedule}  # fmt: skip
    execution = types.SimpleNamespace(
        graph=types.SimpleNamespace(cuda_graph_config=graphs),
        deterministic=types.SimpleNamespace(enable_deterministic_inference=deterministic),
        dllm=types.SimpleNamespace(dllm_algorithm=dllm),
        kernel=types.SimpleNamespace(
            attention_backend=attention_backend,
            decode_attention_backend=None,
            prefill_attention_backend=None,
        ),
    )
    parallel = types.SimpleNamespace(
        attn_tp_size=tp, attn_dp_size=dp, attn_cp_size=cp, attn_dcp_size=dcp
    )
    return types.SimpleNamespace(
        get_parallel=lambda: parallel,
        get_schedule=lambda: types.SimpleNamespace(**limits),
        get_exec=lambda: execution,
        get_spec=lambda: types.SimpleNamespace(speculative_algorithm=speculative),
    )


def sglang_tensor_cores(kv_cache_dtype: torch.dtype, num_attention_heads: int,
                        num_kv_heads: int) -> bool:  # fmt: skip
    """SGLang 0.5.23's ``should_use_tensor_core`` as it reads without its environment override:
    an FP8 cache, or GQA groups of 4 or more."""
    fp8 = kv_cache_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return fp8 or num_attention_heads // num_kv_heads >= 4


def test_the_decode_kernel_is_the_one_sglangs_own_rule_picks_asked_as_its_backend_asks():
    asked: list[dict[str, Any]] = []

    def rule(**kwargs: Any) -> bool:
        asked.append(kwargs)
        return False  # SGLANG_FLASHINFER_USE_TENSOR_CORE=false, say

    plans = sglang_plans(runner(), context(tp=2), rule)
    assert isinstance(plans, SglangPlans)
    assert asked == [{"kv_cache_dtype": torch.bfloat16, "num_attention_heads": 16,
                      "num_kv_heads": 4}]  # fmt: skip
    assert plans.profile().plans["decode"].tensor_cores is False


def test_sglangs_defaults_plan_its_most_requests_and_largest_prefill_batch():
    plans = sglang_plans(runner(), context(tp=2), sglang_tensor_cores)
    assert isinstance(plans, SglangPlans)
    assert (plans.num_qo_heads, plans.num_kv_heads, plans.head_dim) == (16, 4, 128)
    assert (plans.q_dtype, plans.kv_dtype, plans.page_size) == ("bfloat16", "bfloat16", 1)
    # No --max-running-requests: SGLang's cap; a prefill batch of max_prefill_tokens.
    assert plans.max_running_requests == MOST_RUNNING_REQUESTS
    assert plans.max_prefill_tokens == 16384
    assert plans.decode_graph_batch_sizes == tuple(GRAPHS)


@pytest.mark.parametrize(
    ("settings", "requests", "tokens", "graphs"),
    [
        # Its limit, and the graphs SGLang captures clamped to it (plus the limit itself).
        ({"max_running_requests": 20}, 20, 16384, (1, 2, 4, 8, 12, 16, 20)),
        # An odd limit: SGLang may pad it (two-batch overlap), so the padded batch is planned.
        ({"max_running_requests": 21}, 22, 16384, (1, 2, 4, 8, 12, 16, 22)),
        # Per attention data-parallel rank, padded to 2 x its 4 attention TP ranks.
        ({"max_running_requests": 80, "dp": 4, "tp": 4}, 24, 16384, (1, 2, 4, 8, 12, 16, 24)),
        # Chunked prefill off: a whole prompt of the context length, where that is more.
        ({"chunked_prefill_size": -1, "max_prefill_tokens": 4096}, 4096, 8192, tuple(GRAPHS)),
        # A breakable prefill graph pads a batch up to its largest captured token count.
        ({"prefill": phase("breakable", max_bs=32768)}, 4096, 32768, tuple(GRAPHS)),
        # No decode graphs captured.
        ({"decode": phase("disabled", [1, 2])}, 4096, 16384, ()),
    ],
)  # fmt: skip
def test_the_limits_in_effect_are_the_limits_planned(settings, requests, tokens, graphs):
    plans = sglang_plans(runner(), context(**settings), sglang_tensor_cores)
    assert isinstance(plans, SglangPlans)
    assert plans.max_running_requests == requests
    assert plans.max_prefill_tokens == tokens
    assert plans.decode_graph_batch_sizes == graphs


def test_the_profile_plans_both_prefill_wrappers_and_decode_as_sglang_does():
    plans = sglang_plans(runner(), context(), sglang_tensor_cores)
    assert isinstance(plans, SglangPlans)
    profile = plans.profile()
    assert {label: p.kind for label, p in profile.plans.items()} == {
        "prefill": PlanKind.paged_prefill,
        "ragged_prefill": PlanKind.ragged_prefill,
        "decode": PlanKind.decode,
    }
    # SGLang plans a GQA group of 4 (32 / 8) with tensor cores; its captured sizes are kept.
    assert profile.plans["decode"].tensor_cores is True
    assert profile.cuda_graph_batch_sizes == GRAPHS
    assert (profile.limits.max_num_seqs, profile.limits.max_model_len) == (4096, 8192)
    # The tree measured serves both of SGLang's roles, decode under its graphs.
    records = plans.resources()
    assert serving(records, "prefill").labels == ("prefill", "ragged_prefill")
    assert serving(records, "decode").cg_slots == (0,)


@pytest.mark.parametrize(
    ("model", "settings", "why"),
    [
        ({"sliding_window_size": 4096}, {}, "sliding-window"),
        ({"model_config.is_encoder_decoder": True}, {}, "cross-attention"),
        ({"model_config.get_max_num_attention_heads": lambda: 40}, {}, "query heads"),
        ({"kv_cache_dtype": torch.uint8}, {}, "FP8 stand-in"),
        ({"kv_cache_dtype": torch.float4_e2m1fn_x2}, {}, "FP8 stand-in"),
        ({}, {"speculative": "EAGLE"}, "speculative decoding (EAGLE)"),
        ({}, {"deterministic": True}, "deterministic inference"),
        ({}, {"dcp": 2}, "decode-context parallelism (attn_dcp_size 2)"),
        ({}, {"dllm": "LowConfidence"}, "diffusion-LLM decoding (LowConfidence)"),
        ({}, {"attention_backend": "llada2_cfg_flashinfer"}, "llada2_cfg_flashinfer"),
        ({}, {"attention_backend": "minicpm_flashinfer"}, "minicpm_flashinfer"),
    ],
)  # fmt: skip
def test_what_the_profile_cannot_hold_is_left_to_sglang_saying_why(model, settings, why):
    reason = sglang_plans(runner(**model), context(**settings), sglang_tensor_cores)
    assert isinstance(reason, str) and why in reason


def test_no_speculative_algorithm_as_sglang_names_it_is_planned():
    none = types.SimpleNamespace(name="NONE")  # SGLang's SpeculativeAlgorithm.NONE
    assert isinstance(
        sglang_plans(runner(), context(speculative=none), sglang_tensor_cores), SglangPlans
    )
