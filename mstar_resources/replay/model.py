"""A small attention stack with a deployment's attention shape, for replaying a serving trace.

Seeded random weights (the shapes are what matter here, not what the model says): per layer an
RMS norm, a QKV projection, rotary embedding, FlashInfer attention over a paged KV cache, an
output projection, a norm and a two-matrix MLP; then a norm, a small LM head and greedy sampling.
With tensor parallelism the heads and the MLP are split between the ranks and the output and MLP
projections are summed with an all-reduce, as Megatron-style engines do.

A deployment whose plans are MLA (DeepSeek-V3's attention) gets MLA's absorbed form instead, as
engines run it through FlashInfer's MLA wrapper: each query head projects to the compressed KV's
width plus a rotary part, each token writes one compressed KV and one rotary key (shared by all
heads, so every tensor-parallel rank keeps the whole cache), and attention returns, per head, a
vector of the compressed width, which the output projection maps back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..calibration.profile import CalibrationProfile
from .roles import is_mla

ROPE_THETA = 500_000.0
"""Llama 3's rotary base."""


@dataclass(frozen=True)
class ModelSizes:
    """The model's sizes on one rank."""

    layers: int
    qo_heads: int
    """Query heads on this rank (the profile's heads divided by the tensor-parallel ranks)."""
    kv_heads: int
    head_dim: int
    page_size: int
    vocab_size: int
    hidden: int
    """The residual width: all query heads of the model times the head dim."""
    mlp: int
    """MLP width on this rank."""
    dtype: torch.dtype
    kv_dtype: torch.dtype
    head_dim_ckv: int = 0
    """MLA only (0 otherwise): the compressed KV's width, which is also each head's output's."""
    head_dim_kpe: int = 0
    """MLA only (0 otherwise): the rotary part's width."""

    @classmethod
    def of(cls, profile: CalibrationProfile, layers: int, vocab_size: int, tp: int) -> ModelSizes:
        model = profile.model
        hidden = model.num_qo_heads * model.head_dim
        mla = is_mla(profile)
        return cls(
            layers=layers,
            qo_heads=model.num_qo_heads // tp,
            # MLA's one compressed KV serves every head: each rank keeps all of it.
            kv_heads=model.num_kv_heads if mla else model.num_kv_heads // tp,
            head_dim=model.head_dim,
            page_size=model.page_size,
            vocab_size=vocab_size,
            hidden=hidden,
            mlp=2 * hidden // tp,
            dtype=getattr(torch, model.q_dtype),
            kv_dtype=getattr(torch, model.kv_dtype),
            head_dim_ckv=(model.head_dim_ckv or 0) if mla else 0,
            head_dim_kpe=(model.head_dim_kpe or 0) if mla else 0,
        )

    @property
    def mla(self) -> bool:
        """Whether attention is MLA's (a compressed KV and a rotary key a token)."""
        return self.head_dim_ckv > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token takes on this rank, all layers."""
        per_layer = (
            self.head_dim_ckv + self.head_dim_kpe if self.mla else 2 * self.kv_heads * self.head_dim
        )
        return self.layers * per_layer * self.kv_dtype.itemsize

    @property
    def rotary_dim(self) -> int:
        """The width rotary embedding turns: a whole head, or MLA's rotary part."""
        return self.head_dim_kpe if self.mla else self.head_dim


KVCache = tuple[torch.Tensor, ...]
"""Every layer's KV cache, pages indexed by page id: ``(kv,)`` of [layers, pages, 2, page, kv
heads, head dim] (K and V); for MLA ``(ckv, kpe)`` of [layers, pages, page, width]."""


Query = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
"""Queries [tokens, heads, head dim]; for MLA, the compressed and the rotary parts."""

Attention = Callable[[int, Query], torch.Tensor]
"""``attention(layer, q)``: the layer's attention output [tokens, heads, width] for queries ``q``
over the KV cache the batch was planned on."""


class Model:
    """The weights, on one rank's device, and the forward pass over flattened tokens."""

    def __init__(
        self, shape: ModelSizes, device: torch.device, seed: int, tp_rank: int = 0, tp: int = 1
    ) -> None:
        self.shape, self.device = shape, device
        self.tp, self.group_all_reduce = tp, tp > 1
        s = shape
        gen = torch.Generator(device=device).manual_seed(seed)

        def weight(rows: int, cols: int, shard: int | None = None) -> torch.Tensor:
            # The full matrix is drawn on every rank alike, then this rank keeps its shard.
            full = torch.randn(rows, cols, generator=gen, device=device) / math.sqrt(rows)
            if shard == 1:
                full = full.chunk(tp, dim=1)[tp_rank]
            elif shard == 0:
                full = full.chunk(tp, dim=0)[tp_rank]
            return full.to(s.dtype).contiguous()

        self.embed = weight(s.vocab_size, s.hidden) * math.sqrt(s.hidden)
        self.layers = []
        for _ in range(s.layers):
            if s.mla:
                # Per head, its compressed-width and rotary query; per token, one compressed KV
                # and one rotary key, the same on every rank.
                width = s.head_dim_ckv + s.head_dim_kpe
                qkv = torch.cat(
                    [weight(s.hidden, s.qo_heads * tp * width, 1), weight(s.hidden, width)], dim=1
                )
                out = weight(s.qo_heads * tp * s.head_dim_ckv, s.hidden, 0)
            else:
                q, kv = s.qo_heads * tp * s.head_dim, s.kv_heads * tp * s.head_dim
                wq, wk, wv = (weight(s.hidden, q, 1), weight(s.hidden, kv, 1),
                              weight(s.hidden, kv, 1))  # fmt: skip
                qkv, out = torch.cat([wq, wk, wv], dim=1), weight(q, s.hidden, 0)
            self.layers.append(
                {
                    "qkv": qkv,
                    "o": out,
                    "up": weight(s.hidden, s.mlp * tp, 1),
                    "down": weight(s.mlp * tp, s.hidden, 0),
                }
            )
        self.lm_head = weight(s.hidden, s.vocab_size)
        half = s.rotary_dim // 2
        self.inv_freq = 1.0 / (
            ROPE_THETA ** (torch.arange(0, half, device=device, dtype=torch.float32) / half)
        )

    def empty_kv_cache(self, pages: int) -> KVCache:
        """An uninitialised KV cache of ``pages`` pages for every layer."""
        s, device = self.shape, self.device
        if s.mla:
            return tuple(
                torch.empty((s.layers, pages, s.page_size, width), dtype=s.kv_dtype, device=device)
                for width in (s.head_dim_ckv, s.head_dim_kpe)
            )
        size = (s.layers, pages, 2, s.page_size, s.kv_heads, s.head_dim)
        return (torch.empty(size, dtype=s.kv_dtype, device=device),)

    @property
    def bytes(self) -> int:
        tensors = [self.embed, self.lm_head, *(w for layer in self.layers for w in layer.values())]
        return sum(t.numel() * t.element_size() for t in tensors)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slot_pages: torch.Tensor,
        slot_offsets: torch.Tensor,
        sample_rows: torch.Tensor,
        kv_cache: KVCache,
        attention: Attention,
    ) -> torch.Tensor:
        """Greedy next tokens for the rows ``sample_rows`` of a batch of ``tokens``.

        Each token's K and V (MLA: compressed KV and rotary key) go to the cache at
        (``slot_pages``, ``slot_offsets``) before attention reads it. No host synchronisation:
        CUDA graphs capture it whole.
        """
        s = self.shape
        h = self.embed[tokens]
        cos, sin = self._rotary(positions)
        for index, layer in enumerate(self.layers):
            x = _rms_norm(h)
            q: Query
            if s.mla:
                q, latent = self._mla_projections(x @ layer["qkv"], cos, sin)
                for cache, part in zip(kv_cache, latent, strict=True):
                    cache[index][slot_pages, slot_offsets] = part.to(s.kv_dtype)
                width = s.qo_heads * s.head_dim_ckv
            else:
                q, k, v = self._gqa_projections(x @ layer["qkv"], cos, sin)
                kv_cache[0][index][slot_pages, 0, slot_offsets] = k.to(s.kv_dtype)
                kv_cache[0][index][slot_pages, 1, slot_offsets] = v.to(s.kv_dtype)
                width = s.qo_heads * s.head_dim
            out = attention(index, q).reshape(-1, width) @ layer["o"]
            h = h + self._all_reduce(out)
            x = _rms_norm(h)
            mlp = torch.nn.functional.gelu(x @ layer["up"], approximate="tanh") @ layer["down"]
            h = h + self._all_reduce(mlp)
        logits = _rms_norm(h[sample_rows]) @ self.lm_head
        return logits.argmax(dim=-1).to(torch.int32)

    def _gqa_projections(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values [tokens, heads, head dim], rotated."""
        s = self.shape
        q_width, kv_width = s.qo_heads * s.head_dim, s.kv_heads * s.head_dim
        q, k, v = qkv.split([q_width, kv_width, kv_width], dim=-1)
        q = _rotate(q.view(-1, s.qo_heads, s.head_dim), cos, sin)
        k = _rotate(k.view(-1, s.kv_heads, s.head_dim), cos, sin)
        return q, k, v.view(-1, s.kv_heads, s.head_dim)

    def _mla_projections(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """MLA's query (compressed part, rotary part) [tokens, heads, width] and the token's
        compressed KV and rotary key [tokens, width], the rotary parts turned."""
        s = self.shape
        ckv, kpe = s.head_dim_ckv, s.head_dim_kpe
        q, latent = qkv.split([s.qo_heads * (ckv + kpe), ckv + kpe], dim=-1)
        q_nope, q_pe = q.view(-1, s.qo_heads, ckv + kpe).split([ckv, kpe], dim=-1)
        c_kv, k_pe = latent.split([ckv, kpe], dim=-1)
        k_pe = _rotate(k_pe[:, None, :], cos, sin)[:, 0, :]
        return (q_nope.contiguous(), _rotate(q_pe, cos, sin)), (c_kv, k_pe)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return angles.cos()[:, None, :], angles.sin()[:, None, :]

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.group_all_reduce:
            dist.all_reduce(x)
        return x


def _rms_norm(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    x32 = x.to(torch.float32)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, NeoX style (the halves of each head rotate together)."""
    x1, x2 = x.to(torch.float32).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def describe(shape: ModelSizes) -> dict[str, Any]:
    """The shape as the report shows it."""
    described = {
        "attention": "mla" if shape.mla else "gqa",
        "layers": shape.layers,
        "qo_heads_per_rank": shape.qo_heads,
        "kv_heads_per_rank": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden": shape.hidden,
        "vocab_size": shape.vocab_size,
    }
    if shape.mla:
        described.update(head_dim_ckv=shape.head_dim_ckv, head_dim_kpe=shape.head_dim_kpe)
    return described
