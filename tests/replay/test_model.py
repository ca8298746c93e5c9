"""The replay's model on the CPU: its sizes on a rank from a deployment's profile, its KV cache,
where the forward pass writes each token's K and V, and how the weights split between ranks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mstar_resources.calibration.profile import CalibrationProfile, load_profile
from mstar_resources.replay.model import Model, ModelSizes, Query, describe

from ..conftest import compose_shipped

CPU = torch.device("cpu")
GQA, MLA = "llama3-8b-h200", "deepseek-v3-tp8-h200"


def profile(deployment: str, *overrides: str) -> CalibrationProfile:
    return load_profile(compose_shipped([f"deployment={deployment}", *overrides]).calibration)


def small(deployment: str, *overrides: str, layers: int = 1, tp: int = 1) -> ModelSizes:
    """The deployment's attention on a rank of ``tp``, with a residual of 256 and an MLP of 512
    split between the ranks (widths attention never sees), so that the CPU builds it at once."""
    shape = ModelSizes.of(profile(deployment, *overrides), layers=layers, vocab_size=64, tp=tp)
    return dataclasses.replace(shape, hidden=256, mlp=512 // tp)


BF16 = torch.bfloat16


@pytest.mark.parametrize(
    ("deployment", "overrides", "layers", "tp", "expected"),
    [
        pytest.param(GQA, [], 4, 1, dict(
            qo_heads=32, kv_heads=8, head_dim=128, page_size=16, hidden=4096, mlp=8192,
            kv_dtype=BF16, head_dim_ckv=0, head_dim_kpe=0, mla=False,
            kv_bytes_per_token=4 * 2 * 8 * 128 * 2, rotary_dim=128), id="gqa"),
        pytest.param(GQA, [], 2, 2, dict(
            qo_heads=16, kv_heads=4, hidden=4096, mlp=4096,
            kv_bytes_per_token=2 * 2 * 4 * 128 * 2), id="gqa-two-ranks-split-the-kv-heads"),
        pytest.param(GQA, ["calibration.model.kv_dtype=float8_e4m3fn"], 1, 1, dict(
            dtype=BF16, kv_dtype=torch.float8_e4m3fn, kv_bytes_per_token=2 * 8 * 128),
            id="gqa-fp8-cache"),
        pytest.param(MLA, [], 3, 1, dict(
            qo_heads=16, kv_heads=1, head_dim=128, page_size=64, hidden=16 * 128, mla=True,
            head_dim_ckv=512, head_dim_kpe=64, kv_bytes_per_token=3 * (512 + 64) * 2,
            rotary_dim=64), id="mla"),
        pytest.param(MLA, [], 1, 2, dict(
            qo_heads=8, kv_heads=1, mlp=2 * 16 * 128 // 2, kv_bytes_per_token=(512 + 64) * 2),
            id="mla-two-ranks-keep-the-whole-compressed-kv"),
    ],
)  # fmt: skip
def test_a_rank_s_shape_comes_from_the_profile(deployment, overrides, layers, tp, expected):
    shape = ModelSizes.of(profile(deployment, *overrides), layers=layers, vocab_size=100, tp=tp)
    assert (shape.layers, shape.vocab_size) == (layers, 100)
    assert {name: getattr(shape, name) for name in expected} == expected


@pytest.mark.parametrize(
    ("deployment", "overrides", "shapes", "dtype"),
    [
        pytest.param(GQA, [], [(2, 5, 2, 16, 8, 128)], BF16, id="gqa-k-and-v"),
        pytest.param(GQA, ["calibration.model.kv_dtype=float8_e4m3fn"],
                     [(2, 5, 2, 16, 8, 128)], torch.float8_e4m3fn, id="gqa-fp8"),
        pytest.param(MLA, [], [(2, 5, 64, 512), (2, 5, 64, 64)], BF16, id="mla-ckv-and-kpe"),
    ],
)  # fmt: skip
def test_the_kv_cache_holds_every_layer_s_pages(deployment, overrides, shapes, dtype):
    shape = small(deployment, *overrides, layers=2)
    cache = Model(shape, CPU, seed=0).empty_kv_cache(5)
    assert [tuple(t.shape) for t in cache] == shapes
    assert all(t.dtype == dtype and t.device == CPU for t in cache)
    nbytes = sum(t.numel() * t.element_size() for t in cache)
    assert nbytes == 5 * shape.page_size * shape.kv_bytes_per_token


# --- the forward pass ---------------------------------------------------------------------------

TOKENS, POSITIONS = [5, 5, 9], [3, 7, 3]
"""Token 5 at two positions, and another token at one of them."""
SLOT_PAGES, SLOT_OFFSETS = [1, 2, 3], [0, 5, 15]


def forward(model: Model, attention_width: int) -> tuple[torch.Tensor, list, tuple]:
    """One forward over :data:`TOKENS`, on a cache filled with NaN (never written), sampling the
    last two rows; attention, a stand-in that returns zeros, checks each layer's K and V are in
    the cache before it runs. The sampled tokens, what attention was called with, the cache."""
    cache = model.empty_kv_cache(4)
    for part in cache:
        part.fill_(float("nan"))
    calls = []

    def attention(layer: int, q: Query) -> torch.Tensor:
        calls.append((layer, q, [filled_slots(part[layer]) for part in cache]))
        heads = model.shape.qo_heads
        return torch.zeros(len(TOKENS), heads, attention_width, dtype=model.shape.dtype)

    out = model.forward(
        *(torch.tensor(values, dtype=torch.int32) for values in (TOKENS, POSITIONS)),
        *(torch.tensor(values, dtype=torch.int32) for values in (SLOT_PAGES, SLOT_OFFSETS)),
        torch.tensor([1, 2]), cache, attention,
    )  # fmt: skip
    return out, calls, cache


def filled_slots(layer_cache: torch.Tensor) -> list[tuple[int, ...]]:
    """The (page, offset) slots of one layer's cache that hold a value (no NaN)."""
    if layer_cache.dim() == 5:  # GQA: [pages, K and V, page, heads, head dim]
        filled = ~layer_cache.isnan().any(dim=(1, 3, 4))
    else:  # MLA: [pages, page, width]
        filled = ~layer_cache.isnan().any(dim=2)
    return [tuple(slot) for slot in filled.nonzero().tolist()]


SLOTS = sorted(zip(SLOT_PAGES, SLOT_OFFSETS, strict=True))


def test_forward_writes_each_token_s_k_and_v_at_its_slot_in_every_layer_before_attention():
    model = Model(small(GQA, layers=2), CPU, seed=0)
    s = model.shape
    out, calls, (cache,) = forward(model, s.head_dim)
    assert [layer for layer, _, _ in calls] == [0, 1]
    for _, q, seen in calls:
        assert seen == [SLOTS]  # this layer's K and V, and only at the tokens' slots
        assert isinstance(q, torch.Tensor) and q.shape == (3, s.qo_heads, s.head_dim)
    assert [filled_slots(cache[layer]) for layer in (0, 1)] == [SLOTS, SLOTS]
    assert out.dtype == torch.int32 and out.shape == (2,)
    assert all(0 <= token < s.vocab_size for token in out.tolist())
    # In the first layer a token's V is the same at any position, and its K is turned by the
    # rotary embedding: another vector of the same length.
    (page_a, page_b), (at_a, at_b) = SLOT_PAGES[:2], SLOT_OFFSETS[:2]
    k_a, v_a = cache[0][page_a, :, at_a].float()
    k_b, v_b = cache[0][page_b, :, at_b].float()
    assert torch.allclose(v_a, v_b, rtol=1e-2, atol=1e-2)
    assert not torch.allclose(k_a, k_b, rtol=1e-1, atol=1e-1)
    assert torch.allclose(k_a.norm(dim=-1), k_b.norm(dim=-1), rtol=2e-2)


def test_mla_forward_writes_each_token_s_compressed_kv_and_rotary_key_at_its_slot():
    model = Model(small(MLA, layers=2), CPU, seed=0)
    s = model.shape
    out, calls, (ckv, kpe) = forward(model, s.head_dim_ckv)
    assert [layer for layer, _, _ in calls] == [0, 1]
    for _, q, seen in calls:
        assert seen == [SLOTS, SLOTS]
        assert isinstance(q, tuple)
        assert [part.shape for part in q] == [(3, s.qo_heads, 512), (3, s.qo_heads, 64)]
    assert [filled_slots(part[layer]) for part in (ckv, kpe) for layer in (0, 1)] == [SLOTS] * 4
    assert out.shape == (2,)
    (page_a, page_b), (at_a, at_b) = SLOT_PAGES[:2], SLOT_OFFSETS[:2]
    # The compressed KV is not turned; the rotary key is, keeping its length.
    assert torch.allclose(
        ckv[0][page_a, at_a].float(), ckv[0][page_b, at_b].float(), rtol=1e-2, atol=1e-2
    )
    kpe_a, kpe_b = kpe[0][page_a, at_a].float(), kpe[0][page_b, at_b].float()
    assert not torch.allclose(kpe_a, kpe_b, rtol=1e-1, atol=1e-1)
    assert torch.allclose(kpe_a.norm(), kpe_b.norm(), rtol=2e-2)


def test_the_same_seed_makes_the_same_model_and_tokens():
    first, again = (Model(small(GQA), CPU, seed=3) for _ in range(2))
    other = Model(small(GQA), CPU, seed=4)
    assert torch.equal(first.layers[0]["qkv"], again.layers[0]["qkv"])
    assert not torch.equal(first.layers[0]["qkv"], other.layers[0]["qkv"])
    assert torch.equal(forward(first, 128)[0], forward(again, 128)[0])


# --- tensor parallelism: each rank keeps its shard of the same matrices -------------------------


@pytest.mark.parametrize("deployment", [GQA, MLA])
def test_ranks_shard_the_matrices_one_rank_holds_whole(deployment):
    whole = Model(small(deployment), CPU, seed=0)
    ranks = [Model(small(deployment, tp=2), CPU, seed=0, tp_rank=r, tp=2) for r in (0, 1)]
    s, halves = whole.shape, [rank.layers[0] for rank in ranks]
    layer = whole.layers[0]
    if s.mla:
        # Each rank's query heads, and the whole compressed KV and rotary key (the last columns).
        latent = s.head_dim_ckv + s.head_dim_kpe
        q, kv = layer["qkv"].split([layer["qkv"].shape[1] - latent, latent], dim=1)
        parts = [half["qkv"].split([q.shape[1] // 2, latent], dim=1) for half in halves]
        assert torch.equal(torch.cat([part[0] for part in parts], dim=1), q)
        assert all(torch.equal(part[1], kv) for part in parts)
    else:
        widths = [s.qo_heads * s.head_dim, *[s.kv_heads * s.head_dim] * 2]  # Q, K, V
        for whole_part, *rank_parts in zip(
            layer["qkv"].split(widths, dim=1),
            *(half["qkv"].split([w // 2 for w in widths], dim=1) for half in halves),
            strict=True,
        ):
            assert torch.equal(torch.cat(rank_parts, dim=1), whole_part)
    for name, dim in (("o", 0), ("up", 1), ("down", 0)):
        assert torch.equal(torch.cat([half[name] for half in halves], dim=dim), layer[name])
    for rank in ranks:
        assert torch.equal(rank.embed, whole.embed) and torch.equal(rank.lm_head, whole.lm_head)
        assert rank.group_all_reduce and not whole.group_all_reduce


# --- the report's description -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deployment", "described"),
    [
        pytest.param(GQA, {"attention": "gqa", "layers": 2, "qo_heads_per_rank": 16,
                           "kv_heads_per_rank": 4, "head_dim": 128, "hidden": 4096,
                           "vocab_size": 100}, id="gqa"),
        pytest.param(MLA, {"attention": "mla", "layers": 2, "qo_heads_per_rank": 8,
                           "kv_heads_per_rank": 1, "head_dim": 128, "hidden": 2048,
                           "vocab_size": 100, "head_dim_ckv": 512, "head_dim_kpe": 64}, id="mla"),
    ],
)  # fmt: skip
def test_describe_gives_the_report_a_rank_s_shape(deployment, described):
    assert describe(ModelSizes.of(profile(deployment), layers=2, vocab_size=100, tp=2)) == described
