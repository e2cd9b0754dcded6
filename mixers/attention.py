"""Softmax attention: the baseline mixer every comparison needs (docs/design.md §1, the seventh mixer).

Causal multi-head attention through PyTorch's `scaled_dot_product_attention`, with optional rotary
position embedding (RoPE) on queries and keys, and an optional causal short convolution on q, k, v (the
linear mixers' one). Zoology's attention baseline on MQAR has such a conv in front (a kernel-3 BaseConv):
it hands every token its predecessor, which plain attention must first learn to fetch with a
previous-token head before recall can work; without it attention sits on a plateau for thousands of steps.

Decoding keeps a KV cache that grows by one key and one value per head and token, so its state is
`H * (K + V) * seq_len` numbers, linear in the length, where the linear mixers keep a fixed `H * K * V`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mixers.base import Mixer
from mixers.linear_base import ShortConvolution


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [..., K]: (x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(Mixer):
    """Causal softmax attention with RoPE and a KV cache for token-by-token decoding.

    Args:
        d_model: model width D.
        layer_idx: position of the layer in the stack (unused; part of the mixer contract).
        num_heads: H.
        head_dim: query/key size per head K (RoPE needs it even).
        value_dim: value size per head V; defaults to `head_dim`.
        rope: rotate queries and keys by their position (RoPE); off gives a position-free mixer
            that only sees order through causality.
        rope_base: base of RoPE's geometric frequency ladder.
        use_short_conv: a causal depthwise conv (+ SiLU) of `conv_size` taps on q, k and v after their
            projections, as in the linear mixers; off by default (plain attention).
        conv_size: taps of the short conv.
    """

    def __init__(
        self,
        d_model: int,
        *,
        layer_idx: int = 0,
        num_heads: int = 2,
        head_dim: int = 128,
        value_dim: int | None = None,
        rope: bool = True,
        rope_base: float = 10000.0,
        use_short_conv: bool = False,
        conv_size: int = 4,
    ) -> None:
        super().__init__(d_model, layer_idx=layer_idx)
        if num_heads < 1 or head_dim < 1:
            raise ValueError(f"attention: num_heads={num_heads} and head_dim={head_dim} must be >= 1")
        if rope and head_dim % 2:
            raise ValueError(f"attention: RoPE rotates pairs of channels, so head_dim={head_dim} must be "
                             "even (or set rope: false)")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.value_dim = head_dim if value_dim is None else value_dim
        self.rope = rope
        self.use_short_conv, self.conv_size = use_short_conv, conv_size
        if use_short_conv:
            if conv_size < 2:
                raise ValueError(f"attention: conv_size={conv_size}; a short conv needs >= 2 taps "
                                 "(zoology: 3, the linear mixers: 4) or use_short_conv=false")
            self.q_conv = ShortConvolution(num_heads * head_dim, conv_size)
            self.k_conv = ShortConvolution(num_heads * head_dim, conv_size)
            self.v_conv = ShortConvolution(num_heads * self.value_dim, conv_size)
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_heads * self.value_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.value_dim, d_model, bias=False)
        inv_freq = rope_base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [K/2]
        # Not persistent: derived from the config, so checkpoints stay valid if the formula is fixed.
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Apply RoPE to x: [B, H, T, K] at integer positions [T]."""
        if not self.rope:
            return x
        # Angles in fp32 even under autocast: bf16 cannot resolve position * frequency past ~256.
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, K/2]
        angles = torch.cat((angles, angles), dim=-1)  # [T, K]
        cos, sin = angles.cos(), angles.sin()
        rotated = x.float() * cos + rotate_half(x.float()) * sin
        return rotated.to(x.dtype)

    def _heads(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [B, T, D] -> q, k: [B, H, T, K], v: [B, H, T, V] (before RoPE); a `cache` carries the convs'
        last inputs from one call to the next."""
        B, T, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # [B, T, H*K], [B, T, H*K], [B, T, H*V]
        if self.use_short_conv:
            q, conv_q = self.q_conv(q, None if cache is None else cache["conv_q"])
            k, conv_k = self.k_conv(k, None if cache is None else cache["conv_k"])
            v, conv_v = self.v_conv(v, None if cache is None else cache["conv_v"])
            if cache is not None:
                cache.update(conv_q=conv_q, conv_k=conv_k, conv_v=conv_v)
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_heads, self.value_dim).transpose(1, 2)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        B, T, _ = x.shape
        q, k, v = self._heads(x)
        positions = torch.arange(T, device=x.device)
        q, k = self._rotate(q, positions), self._rotate(k, positions)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, V]
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.num_heads * self.value_dim))

    def init_cache(self, batch_size: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
        cache = {
            "k": torch.zeros(batch_size, self.num_heads, 0, self.head_dim, device=device, dtype=dtype),
            "v": torch.zeros(batch_size, self.num_heads, 0, self.value_dim, device=device, dtype=dtype),
        }
        if self.use_short_conv:
            # The last conv_size - 1 projected inputs of each conv: [B, channels, conv_size - 1].
            qk, v = self.num_heads * self.head_dim, self.num_heads * self.value_dim
            for name, channels in (("conv_q", qk), ("conv_k", qk), ("conv_v", v)):
                cache[name] = torch.zeros(batch_size, channels, self.conv_size - 1, device=device,
                                          dtype=dtype)
        return cache

    def step(self, x: torch.Tensor, cache: dict[str, Any]) -> torch.Tensor:  # [B, D] -> [B, D]
        B = x.shape[0]
        q, k, v = self._heads(x[:, None, :], cache)  # [B, H, 1, K], [B, H, 1, K], [B, H, 1, V]
        position = torch.tensor([cache["k"].shape[2]], device=x.device)
        q, k = self._rotate(q, position), self._rotate(k, position)
        cache["k"] = torch.cat((cache["k"], k.to(cache["k"].dtype)), dim=2)  # [B, H, t+1, K]
        cache["v"] = torch.cat((cache["v"], v.to(cache["v"].dtype)), dim=2)  # [B, H, t+1, V]
        # The one new query sees every cached key, itself included: no mask needed.
        o = F.scaled_dot_product_attention(q, cache["k"].to(q.dtype), cache["v"].to(q.dtype))  # [B, H, 1, V]
        return self.o_proj(o.reshape(B, self.num_heads * self.value_dim))

    def state_size(self, seq_len: int | None = None) -> int:
        if seq_len is None:
            raise ValueError("attention: the KV cache grows with the length; pass state_size(seq_len)")
        # One key (K) and one value (V) per head and token, as init_cache/step allocate them, plus the
        # convs' last conv_size - 1 inputs.
        kv_cache = self.num_heads * (self.head_dim + self.value_dim) * seq_len
        if not self.use_short_conv:
            return kv_cache
        return kv_cache + (self.conv_size - 1) * self.num_heads * (2 * self.head_dim + self.value_dim)
