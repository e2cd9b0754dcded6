"""Longhorn (Liu et al., 2024), as a DeltaNet variant: the closed-form solution of the one-step regularised
regression instead of one gradient step (kernels/README.md §0), which rescales DeltaNet's write strength:

    beta'_t = beta_t / (1 + beta_t k_t^T k_t)
    S_t = (I - beta'_t k_t k_t^T) S_{t-1} + beta'_t k_t v_t^T

Along k_t the transition has the eigenvalue 1 / (1 + beta_t |k_t|^2), in (0, 1] for any beta_t >= 0 and any
key, so neither beta_t needs bounding (here softplus, unbounded) nor the keys L2 normalising (off by
default). No decay. It runs on the DeltaNet op: the layer only computes beta'.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mixers.linear_base import LinearMixer


class Longhorn(LinearMixer):
    decay = "none"
    delta_rule = True
    paper_defaults: ClassVar[dict[str, Any]] = {
        "use_short_conv": True,
        "qk_norm": False,
        "output_gate": "none",
    }

    def __init__(self, d_model: int, *, layer_idx: int = 0, **skeleton: Any) -> None:
        super().__init__(d_model, layer_idx=layer_idx, **self.with_paper_defaults(skeleton))
        self.beta_proj = nn.Linear(d_model, self.num_heads, bias=False)

    def gates(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        beta = F.softplus(self.beta_proj(x).float())  # [B, T, H], unbounded above
        return v, None, beta / (1 + beta * k.float().pow(2).sum(-1))
