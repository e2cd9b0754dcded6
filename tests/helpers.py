"""Shared test helpers (importable as `from helpers import rel_rms`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def make_inputs(
    decay: str | None,
    delta: bool,
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    seed: int,
    lower_bound: float | None = None,
    with_state: bool = True,
) -> dict[str, torch.Tensor | None]:
    """Random inputs of one op of the family ([B, T, H, D] layout, fp32, unit-norm keys, an initial state
    unless with_state=False), the keys of `triton_chunk` / `naive_recurrent`."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = None
    if decay is not None:
        shape = (B, T, H) if decay == "scalar" else (B, T, H, K)
        if lower_bound is None:
            # log-sigmoid gates span strong and weak decay, some far below -5 (the unbounded regime)
            g = F.logsigmoid(2 * torch.randn(shape, generator=gen))
        else:
            g = lower_bound * torch.rand(shape, generator=gen)
    beta = torch.rand(B, T, H, generator=gen) if delta else None
    h0 = torch.randn(B, H, K, V, generator=gen) if with_state else None
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": h0}


# A real task at a tiny size, for runs of `python train.py` in a fresh process (the stand-in task of
# conftest.py exists only inside the test process).
CLI_TINY = [
    "task=palindrome",
    "mixer=attention",
    "task.seq_len=16",
    "task.num_train=64",
    "task.num_eval=16",
    "task.params.vocab_size=8",
    "model.d_model=16",
    "mixer.head_dim=8",
    "trainer.batch_size=8",
    "trainer.device=cpu",
    "trainer.cpu_threads=1",
]
