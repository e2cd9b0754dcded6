"""benchmarks.solve_precision: the CPU emulation behind the solve's TF32 setting (solve.tf32)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import solve_precision as sp


def test_tf32_keeps_ten_mantissa_bits() -> None:
    x = torch.tensor([1.0, 1.0 + 2**-10, 1.0 + 2**-11, 1.0 + 2**-12, -3.0 - 2**-12])
    # representable values stay; halfway rounds away from zero; below halfway rounds down
    assert sp.tf32(x).tolist() == [1.0, 1.0 + 2**-10, 1.0 + 2**-10, 1.0, -3.0]


@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_blocked_inverse_is_the_inverse(chunk: int) -> None:
    gen = torch.Generator().manual_seed(chunk)
    a = sp.delta_chunk(gen, 32, chunk)
    exact = torch.linalg.inv(torch.eye(chunk, dtype=torch.float64) + a)
    assert sp.rel_rms(sp.blocked_inverse(a, "ieee"), exact) < 1e-6
    assert sp.rel_rms(sp.blocked_inverse(a, "tf32x3"), exact) < 1e-6
    # single-pass TF32 is visibly rounder, but it is not garbage
    assert 1e-7 < sp.rel_rms(sp.blocked_inverse(a, "tf32"), exact) < 5e-3


def test_tf32_error_is_below_the_bf16_store_for_kda_chunks() -> None:
    worst = sp.errors(lambda g: sp.kda_chunk(g, 128), torch.Generator().manual_seed(0), 3)
    assert worst["tf32"] < 0.5 * worst["bf16 store"]
    assert worst["ieee"] < 1e-3 * worst["bf16 store"]
