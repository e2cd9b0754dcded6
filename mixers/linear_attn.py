"""Linear attention (Katharopoulos et al., 2020): write only, no erase, no decay.

    S_t = S_{t-1} + phi(k_t) v_t^T,    o_t = scale * S_t^T phi(q_t)

phi is the feature map (elu+1 in the paper). The paper's normaliser 1 / (phi(q_t)^T sum_i phi(k_i)) is
replaced by the skeleton's per-head output RMSNorm, which keeps the growing sum at a fixed scale.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from mixers.linear_base import LinearMixer


class LinearAttention(LinearMixer):
    decay = "none"
    delta_rule = False
    paper_defaults: ClassVar[dict[str, Any]] = {
        "use_short_conv": False,
        "feature_map": "elu+1",
        "qk_norm": False,
        "output_gate": "none",
    }

    def __init__(self, d_model: int, *, layer_idx: int = 0, **skeleton: Any) -> None:
        super().__init__(d_model, layer_idx=layer_idx, **self.with_paper_defaults(skeleton))

    def gates(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return v, None, None
