"""The mixer contract (docs/design.md §4), written once so every mixer and the backbone agree on it.

A mixer maps `x: [B, T, D] -> [B, T, D]` causally. Besides `forward` it supports token-by-token
decoding through a cache it creates itself:

    cache = mixer.init_cache(batch_size, device=x.device, dtype=torch.float32)
    for t in range(T):
        y[:, t] = mixer.step(x[:, t], cache)        # x_t: [B, D] -> y_t: [B, D]; updates `cache` in place

and `y` equals `mixer(x)` up to floating-point error. `state_size(seq_len)` is the number of values
held per sequence at decode time after `seq_len` tokens (recurrent state + conv caches; the KV cache
for attention), counted honestly from the shapes actually allocated by `init_cache`.

Constructor: `__init__(self, d_model, *, layer_idx=0, **typed_kwargs)`; common kwargs are
`num_heads`, `head_dim` (key size K) and, where it differs, `value_dim` (V). A mixer is registered by
its yaml `conf/mixer/<name>.yaml` (`_target_: mixers.<module>.<Class>` + kwargs, with the class's
defaults; a linear mixer's names `conf/linear_mixer.yaml` in its `defaults`), nothing else.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Mixer(nn.Module):
    def __init__(self, d_model: int, *, layer_idx: int = 0) -> None:
        super().__init__()
        self.d_model = d_model
        self.layer_idx = layer_idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        raise NotImplementedError

    def init_cache(self, batch_size: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
        raise NotImplementedError

    def step(self, x: torch.Tensor, cache: dict[str, Any]) -> torch.Tensor:  # [B, D] -> [B, D]
        raise NotImplementedError

    def state_size(self, seq_len: int | None = None) -> int:
        raise NotImplementedError

    def check_device(self, device: torch.device) -> None:
        """Raise ValueError (the key, the value, the fix) where this layer's settings cannot run on `device`,
        e.g. a kernel's size limits; a run calls it while checking its config. Nothing by default."""
