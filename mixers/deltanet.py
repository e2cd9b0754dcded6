"""DeltaNet (Schlag et al., 2021; parallel form Yang et al., 2024): erase then write, no decay.

    beta_t = sigmoid(W x_t)                               [per head]
    S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   q and k L2-normalised

Each step moves the value read out at k_t towards v_t by a fraction beta_t: an old association under a
similar key is overwritten instead of piling up.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from mixers.linear_base import BetaProjection, LinearMixer


class DeltaNet(LinearMixer):
    decay = "none"
    delta_rule = True
    paper_defaults: ClassVar[dict[str, Any]] = {
        "use_short_conv": True,
        "qk_norm": True,
        "output_gate": "none",
    }

    def __init__(
        self, d_model: int, *, layer_idx: int = 0, allow_neg_eigval: bool = False, **skeleton: Any
    ) -> None:
        super().__init__(d_model, layer_idx=layer_idx, **self.with_paper_defaults(skeleton))
        self.beta = BetaProjection(d_model, self.num_heads, allow_neg_eigval)

    def gates(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return v, None, self.beta(x)
