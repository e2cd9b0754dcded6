"""Mamba2-style mixer (SSD, Dao & Gu 2024): a scalar, data-dependent decay per head, write only.

    dt_t = softplus(W x_t + dt_bias)            [per head]
    S_t  = exp(-dt_t exp(A_log)) S_{t-1} + k_t (dt_t v_t)^T

The same step dt_t scales the decay and the write, so an unimportant token (dt ~ 0) neither decays the
state nor writes to it. In Mamba2's names: k = B, q = C, v = x, K = d_state. Left out from Mamba2: the D
skip connection and group-shared B/C (here q/k are per head, like every mixer of the family); the gate
is applied after the RMSNorm (Mamba2 gates before normalising).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from mixers.linear_base import LinearMixer, MambaDecay


class Mamba2(LinearMixer):
    decay = "scalar"
    delta_rule = False
    paper_defaults: ClassVar[dict[str, Any]] = {
        "use_short_conv": True,
        "qk_norm": False,
        "output_gate": "swish",
        "output_gate_rank": "full",
    }

    def __init__(
        self, d_model: int, *, layer_idx: int = 0, dt_min: float = 1e-3, dt_max: float = 1e-1, **skeleton: Any
    ) -> None:
        super().__init__(d_model, layer_idx=layer_idx, **self.with_paper_defaults(skeleton))
        self.log_decay = MambaDecay(d_model, self.num_heads, dt_min, dt_max)

    def gates(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        g, dt = self.log_decay(x)  # [B, T, H] each
        return v * dt[..., None].to(v.dtype), g, None
