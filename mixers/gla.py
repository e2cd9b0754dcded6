"""Gated Linear Attention (Yang et al., 2023): a per-channel decay from a low-rank projection, write only.

    g_t = logsigmoid(W_up W_down x_t + b) / gate_logit_normalizer      [per head, per key channel]
    S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T

Dividing the log-sigmoid by the normaliser (16 in the paper) pushes the initial retention exp(g) close
to 1, so the state starts with a long memory.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mixers.linear_base import LinearMixer, _positive_int


class GLA(LinearMixer):
    decay = "channel"
    delta_rule = False
    paper_defaults: ClassVar[dict[str, Any]] = {
        "use_short_conv": False,
        "qk_norm": False,
        "output_gate": "swish",
        "output_gate_rank": "full",
    }

    def __init__(
        self,
        d_model: int,
        *,
        layer_idx: int = 0,
        gate_low_rank_dim: int = 16,
        gate_logit_normalizer: float = 16.0,
        **skeleton: Any,
    ) -> None:
        super().__init__(d_model, layer_idx=layer_idx, **self.with_paper_defaults(skeleton))
        if gate_logit_normalizer <= 0:
            raise ValueError(f"gate_logit_normalizer={gate_logit_normalizer}; it must be > 0 (GLA: 16)")
        self.gate_logit_normalizer = gate_logit_normalizer
        _positive_int("gate_low_rank_dim", gate_low_rank_dim)
        self.decay_down = nn.Linear(d_model, gate_low_rank_dim, bias=False)
        self.decay_up = nn.Linear(gate_low_rank_dim, self.num_heads * self.head_dim)

    def gates(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        logits = self.decay_up(self.decay_down(x)).float().view_as(k)  # [B, T, H, K]
        return v, F.logsigmoid(logits) / self.gate_logit_normalizer, None
