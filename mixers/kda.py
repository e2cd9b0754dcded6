"""Kimi Delta Attention (Kimi Linear, 2025; K3): Gated DeltaNet with a per-channel decay (docs/design.md §1).

    S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T
    z_t = W_up W_down x_t + b                                  (Eq. 2: low rank, one logit per key channel)
    g_t = -exp(A_log) * softplus(z_t)                          gate="softplus" (Kimi Linear)
    g_t = g_min * sigmoid(exp(A_log) * z_t),  g_min = -5       gate="bounded"  (K3, Eq. 5)
    beta_t = sigmoid(W_beta x_t)
    y_t = W_o (RMSNorm(o_t) * sigmoid(W_g x_t))                (Eq. 6: W_g low rank in Kimi Linear,
                                                               full rank in K3)

The bounded gate keeps g in (g_min, 0), so a chunk of 16 tokens decays by at most exp(16 g_min) and the
chunkwise kernel can rescale by the inverse decay without overflow (K3 §2.1.1; kernels/README.md §0).
Init per paper: the softplus gate as Mamba2 (A in [1, 16], softplus(b) = dt log-uniform in [1e-3, 1e-1]);
the bounded gate with A_log = 0 (K3) and b chosen so that the initial decay is the same dt range
(g_min sigmoid(b) = -dt).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mixers.linear_base import BetaProjection, LinearMixer, _positive_int, inverse_softplus, log_uniform
from mixers.recompute import kda_gate, recomputed, wide

GATES = ("softplus", "bounded")


class KDA(LinearMixer):
    decay = "channel"
    delta_rule = True
    paper_defaults: ClassVar[dict[str, Any]] = {
        "use_short_conv": True,
        "qk_norm": True,
        "output_gate": "sigmoid",
        "output_gate_rank": "full",
    }

    def __init__(
        self,
        d_model: int,
        *,
        layer_idx: int = 0,
        gate: str = "bounded",
        g_min: float = -5.0,
        gate_low_rank_dim: int | None = None,
        allow_neg_eigval: bool = False,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        **skeleton: Any,
    ) -> None:
        super().__init__(d_model, layer_idx=layer_idx, **self.with_paper_defaults(skeleton))
        if gate not in GATES:
            raise ValueError(
                f"gate={gate!r} is unknown; use 'softplus' (Kimi Linear) or 'bounded' (K3, Eq. 5)"
            )
        if not (math.isfinite(g_min) and g_min < 0):
            raise ValueError(
                f"g_min={g_min}; the lower bound of the log-decay must be a finite negative number (K3: -5)"
            )
        if not 0 < dt_min <= dt_max < -g_min:
            raise ValueError(
                f"dt_min={dt_min}, dt_max={dt_max}; need 0 < dt_min <= dt_max < -g_min (default 1e-3, 1e-1)"
            )
        self.gate, self.g_min = gate, float(g_min)
        H, K = self.num_heads, self.head_dim
        # Kimi Linear: rank = head_dim (128)
        rank = K if gate_low_rank_dim is None else _positive_int("gate_low_rank_dim", gate_low_rank_dim)
        self.decay_down = nn.Linear(d_model, rank, bias=False)
        self.decay_up = nn.Linear(rank, H * K, bias=False)
        dt = log_uniform(H * K, dt_min, dt_max)
        if gate == "softplus":
            self.decay_bias = nn.Parameter(inverse_softplus(dt))
            self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1, 16)))
        else:
            self.decay_bias = nn.Parameter(torch.logit(dt / -self.g_min))
            self.A_log = nn.Parameter(torch.zeros(H))
            self.g_lower_bound = self.g_min
        self.beta = BetaProjection(d_model, H, allow_neg_eigval)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> g [B, T, H, K] float32
        B, T, _ = x.shape
        if self.lean_backward:
            # from x alone (which the projections share), recomputed in the backward: not the low-rank
            # logits, nor the fp32 pre-activation and sigmoid autograd would keep
            return recomputed(self._gate_of_input, x, self.decay_down.weight, self.decay_up.weight,
                              self.decay_bias, self.A_log)
        z = wide(self.decay_up(self.decay_down(x))) + self.decay_bias  # [B, T, H*K]
        z = z.view(B, T, self.num_heads, self.head_dim)
        A = wide(self.A_log).exp()[:, None]  # [H, 1]
        if self.gate == "softplus":
            return -A * F.softplus(z)
        return self.g_min * torch.sigmoid(A * z)

    def _gate_of_input(self, x: torch.Tensor, *parameters: torch.Tensor) -> torch.Tensor:
        # (the parameters are Recomputed's inputs; they are read through the modules)
        z = self.decay_up(self.decay_down(x))  # [B, T, H*K]
        return kda_gate(z, self.decay_bias, self.A_log, self.gate == "bounded", self.g_min)

    def gates(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return v, self.log_decay(x), self.beta(x)
