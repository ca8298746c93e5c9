"""A small attention stack with a deployment's attention shape, for replaying a serving trace.

Seeded random weights (the shapes are what matter here, not what the model says): per layer an
RMS norm, a QKV projection, rotary embedding, FlashInfer attention over a paged KV cache, an
output projection, a norm and a two-matrix MLP; then a norm, a small LM head and greedy sampling.
With tensor parallelism the heads and the MLP are split between the ranks and the output and MLP
projections are summed with an all-reduce, as Megatron-style engines do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..calibration.profile import CalibrationProfile

ROPE_THETA = 500_000.0
"""Llama 3's rotary base."""


@dataclass(frozen=True)
class Shape:
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

    @classmethod
    def of(cls, profile: CalibrationProfile, layers: int, vocab_size: int, tp: int) -> Shape:
        model = profile.model
        hidden = model.num_qo_heads * model.head_dim
        return cls(
            layers=layers,
            qo_heads=model.num_qo_heads // tp,
            kv_heads=model.num_kv_heads // tp,
            head_dim=model.head_dim,
            page_size=model.page_size,
            vocab_size=vocab_size,
            hidden=hidden,
            mlp=2 * hidden // tp,
            dtype=getattr(torch, model.q_dtype),
            kv_dtype=getattr(torch, model.kv_dtype),
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token takes on this rank, all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype.itemsize


Attention = Callable[[int, torch.Tensor], torch.Tensor]
"""``attention(layer, q)``: the layer's attention output for queries ``q`` [tokens, heads, dim],
over the KV cache the batch was planned on."""


class Model:
    """The weights, on one rank's device, and the forward pass over flattened tokens."""

    def __init__(
        self, shape: Shape, device: torch.device, seed: int, tp_rank: int = 0, tp: int = 1
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

        q, kv = s.qo_heads * tp * s.head_dim, s.kv_heads * tp * s.head_dim
        self.embed = weight(s.vocab_size, s.hidden) * math.sqrt(s.hidden)
        self.layers = []
        for _ in range(s.layers):
            wq, wk, wv = weight(s.hidden, q, 1), weight(s.hidden, kv, 1), weight(s.hidden, kv, 1)
            self.layers.append(
                {
                    "qkv": torch.cat([wq, wk, wv], dim=1),
                    "o": weight(q, s.hidden, 0),
                    "up": weight(s.hidden, s.mlp * tp, 1),
                    "down": weight(s.mlp * tp, s.hidden, 0),
                }
            )
        self.lm_head = weight(s.hidden, s.vocab_size)
        half = s.head_dim // 2
        self.inv_freq = 1.0 / (
            ROPE_THETA ** (torch.arange(0, half, device=device, dtype=torch.float32) / half)
        )

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
        kv_cache: torch.Tensor,
        attention: Attention,
    ) -> torch.Tensor:
        """Greedy next tokens for the rows ``sample_rows`` of a batch of ``tokens``.

        Each token's K and V go to ``kv_cache[layer][slot_pages, :, slot_offsets]`` before
        attention reads the cache. No host synchronisation: CUDA graphs capture it whole.
        """
        s = self.shape
        h = self.embed[tokens]
        cos, sin = self._rotary(positions)
        q_width, kv_width = s.qo_heads * s.head_dim, s.kv_heads * s.head_dim
        for index, layer in enumerate(self.layers):
            x = _rms_norm(h)
            q, k, v = (x @ layer["qkv"]).split([q_width, kv_width, kv_width], dim=-1)
            q = _rotate(q.view(-1, s.qo_heads, s.head_dim), cos, sin)
            k = _rotate(k.view(-1, s.kv_heads, s.head_dim), cos, sin)
            cache = kv_cache[index]
            cache[slot_pages, 0, slot_offsets] = k.to(s.kv_dtype)
            cache[slot_pages, 1, slot_offsets] = v.view(-1, s.kv_heads, s.head_dim).to(s.kv_dtype)
            out = attention(index, q).reshape(-1, q_width) @ layer["o"]
            h = h + self._all_reduce(out)
            x = _rms_norm(h)
            mlp = torch.nn.functional.gelu(x @ layer["up"], approximate="tanh") @ layer["down"]
            h = h + self._all_reduce(mlp)
        logits = _rms_norm(h[sample_rows]) @ self.lm_head
        return logits.argmax(dim=-1).to(torch.int32)

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


def describe(shape: Shape) -> dict[str, Any]:
    """The shape as the report shows it."""
    return {
        "layers": shape.layers,
        "qo_heads_per_rank": shape.qo_heads,
        "kv_heads_per_rank": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden": shape.hidden,
        "vocab_size": shape.vocab_size,
    }
