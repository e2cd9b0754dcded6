"""Shared test helpers (importable as `from helpers import rel_rms`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import torch


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Relative RMS error ||out - ref|| / ||ref||, computed in float64.

    Both tensors must have the same shape. A zero reference gives the absolute norm of out instead, so that an
    all-zero expected value still fails when out is not zero.
    """
    if ref.shape != out.shape:
        raise ValueError(f"rel_rms: shapes differ, ref {tuple(ref.shape)} vs out {tuple(out.shape)}")
    ref64, out64 = ref.detach().double(), out.detach().double()
    denom = ref64.norm().item()
    err = (out64 - ref64).norm().item()
    return err / denom if denom > 0 else err
