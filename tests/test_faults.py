"""Faults and bad input: nothing lost, nothing mislabelled.

Each test here replays one way a careful user broke the harness (two processes in one run directory,
impossible optimiser values, a changed config on resume, `+key` typos, a zero decay, corrupt files, a
killed worker, SIGTERM) and checks that the run directory stays consistent, or that the launch is refused
with a message naming the value and the fix. tests/fault_injection.py replays them end to end (with a kill
storm on a small sweep); `test_fault_injection_fast` runs its fast form.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import rel_rms
from omegaconf import DictConfig

import kernels
import kernels.ops

ROOT = Path(__file__).resolve().parents[1]
MakeCfg = Callable[..., DictConfig]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# ---- kernels: a zero decay, non-finite inputs, Triton without a GPU ----

SCALAR_AND_CHANNEL = [
    ("simple_gla", "scalar", False),
    ("gated_delta_rule", "scalar", True),
    ("gla", "channel", False),
    ("kda", "channel", True),
]


@pytest.mark.parametrize(("name", "decay", "delta"), SCALAR_AND_CHANNEL, ids=[c[0] for c in SCALAR_AND_CHANNEL])
def test_zero_decay_matches_the_reference(name: str, decay: str, delta: bool) -> None:
    """g = -inf (exp(g) = 0: the state is forgotten) is legal; the chunked form must equal the token loop,
    in outputs, final state and every gradient, not turn NaN."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 40, 2, 8, 8
    shape = (B, T, H) if decay == "scalar" else (B, T, H, K)
    g = F.logsigmoid(torch.randn(shape, generator=gen))
    g[:, [5, 17, 39]] = -math.inf  # a chunk start, the middle of a chunk, the last token
    inputs = {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen),
        "g": g,
    }
    if delta:
        inputs["beta"] = torch.rand(B, T, H, generator=gen)
    initial = torch.randn(B, H, K, V, generator=gen)
    op = getattr(kernels, f"chunk_{name}")
    results = {}
    for backend in ("naive", "torch"):
        leaves = {key: value.clone().requires_grad_() for key, value in inputs.items()}
        state = initial.clone().requires_grad_()
        o, final = op(**leaves, initial_state=state, output_final_state=True, backend=backend, chunk_size=16)
        (o.square().sum() + final.square().sum()).backward()
        results[backend] = [o, final, state.grad] + [leaves[key].grad for key in inputs]
    for ref, out in zip(results["naive"], results["torch"], strict=True):
        assert torch.isfinite(out).all()
        assert rel_rms(ref, out) < 1e-5


@pytest.mark.parametrize("bad", ["q", "k", "v", "beta", "initial_state"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_inputs_are_named(bad: str, value: float, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 8, 2, 8, 8
    args = {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": torch.randn(B, T, H, K, generator=gen),
        "v": torch.randn(B, T, H, V, generator=gen),
        "g": -torch.rand(B, T, H, K, generator=gen),
        "beta": torch.rand(B, T, H, generator=gen),
        "initial_state": torch.zeros(B, H, K, V),
    }
    args[bad].view(-1)[3] = value
    with pytest.raises(ValueError, match=rf"chunk_kda: {bad} hold\(s\) NaN or infinite"):
        kernels.chunk_kda(**args, backend="torch")
    # the check is one of the value checks: the gate the training loop turns off between its log steps
    monkeypatch.setattr(kernels.ops, "_values_checked", lambda t: False)
    kernels.chunk_kda(**args, backend="torch")


def test_triton_without_gpu_or_interpreter_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises(ValueError, match=r"backend='triton' got tensors on cpu.*TRITON_INTERPRET=1"):
        kernels.chunk_linear_attn(q, q, q, backend="triton")
    with pytest.raises(ValueError, match=r"TRITON_INTERPRET=1"):
        kernels.linear_attn_step(q[:, 0], q[:, 0], q[:, 0], torch.zeros(1, 1, 8, 8), backend="triton")
