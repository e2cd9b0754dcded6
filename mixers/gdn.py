"""Gated DeltaNet (Yang et al., 2024): DeltaNet plus Mamba2's scalar decay per head, decay first.

    S_t = (I - beta_t k_t k_t^T) exp(g_t) S_{t-1} + beta_t k_t v_t^T
    g_t = -softplus(W x_t + dt_bias) exp(A_log),   beta_t = sigmoid(W_beta x_t)

Unlike Mamba2 the write is not scaled by dt: beta already sets its strength.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from mixers.linear_base import BetaProjection, LinearMixer, MambaDecay


class GatedDeltaNet(LinearMixer):
    decay = "scalar"
    delta_rule = True
    paper_defaults: ClassVar[dict[str, Any]] = {
        "use_short_conv": True,
        "qk_norm": True,
        "output_gate": "swish",
        "output_gate_rank": "full",
    }

    def __init__(
        self,
        d_model: int,
        *,
        layer_idx: int = 0,
        allow_neg_eigval: bool = False,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        **skeleton: Any,
    ) -> None:
        super().__init__(d_model, layer_idx=layer_idx, **self.with_paper_defaults(skeleton))
        self.log_decay = MambaDecay(d_model, self.num_heads, dt_min, dt_max)
        self.beta = BetaProjection(d_model, self.num_heads, allow_neg_eigval)

    def gates(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        g, _ = self.log_decay(x)  # [B, T, H]
        return v, g, self.beta(x)
