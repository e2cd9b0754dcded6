"""Our token-loop reference against FLA 0.6.0's own reference loops, on the CPU: the same recurrences.

Every GPU comparison with FLA (benchmarks.speed, tests/gpu/check_kernels.py) assumes that our six
ops compute what FLA's do, with the same argument conventions (log-space gates, beta per head, the scale,
the state layout [B, H, K, V], the decay applied before the delta-rule update). This checks it where it is
cheap: `kernels.naive.naive_recurrent` against FLA's `naive_recurrent_*` loops, outputs and final states
from an initial state at an odd length, and the gradients of every input through both. Our Triton kernels
are checked against `naive_recurrent` in tests/test_triton.py, so they inherit the comparison.
Skipped where fla-core is not installed (`pip install fla-core==0.6.0`; the dev extra has it).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from benchmarks.common import make_inputs, rel_rms
from kernels import family
from kernels.naive import naive_recurrent

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # FLA warns that it found no GPU
    fla_kda_module = pytest.importorskip("fla.ops.kda.naive", reason="fla-core is not installed")
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.gla.naive import naive_recurrent_gla
    from fla.ops.linear_attn.naive import naive_recurrent_linear_attn
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

B, T, H, K, V = 2, 37, 3, 8, 16


def fla_linear_attn(q, k, v, g, beta, h0):
    return naive_recurrent_linear_attn(q, k, v, initial_state=h0, output_final_state=True)


def fla_simple_gla(q, k, v, g, beta, h0):
    return naive_recurrent_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True)


def fla_gla(q, k, v, g, beta, h0):
    return naive_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)


def fla_delta_rule(q, k, v, g, beta, h0):
    # this one loop of FLA's is head-first: [B, H, T, D]
    o, s = delta_rule_recurrence(
        *(x.transpose(1, 2) for x in (q, k, v, beta)), initial_state=h0, output_final_state=True
    )
    return o.transpose(1, 2), s


def fla_gated_delta_rule(q, k, v, g, beta, h0):
    return naive_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True)


def fla_kda(q, k, v, g, beta, h0):
    return fla_kda_module.naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)


# (name, decay granularity, delta rule, FLA's loop): the six points of the family table (kernels.family)
FLA_LOOPS = {"linear_attn": fla_linear_attn, "simple_gla": fla_simple_gla, "gla": fla_gla,
             "delta_rule": fla_delta_rule, "gated_delta_rule": fla_gated_delta_rule, "kda": fla_kda}
OPS = [(o.name, o.decay, o.delta_rule, FLA_LOOPS[o.name]) for o in family.PLAIN]


@pytest.mark.parametrize("name,decay,delta,fla_op", OPS, ids=[op[0] for op in OPS])
def test_naive_recurrent_is_fla_reference(name: str, decay: str, delta: bool, fla_op) -> None:
    inputs = make_inputs(decay, delta, B, T, H, K, V, seed=7)
    q, k, v, g, beta, h0 = (inputs[n] for n in ("q", "k", "v", "g", "beta", "initial_state"))
    leaves = [t.requires_grad_(True) for t in (q, k, v, g, beta, h0) if t is not None]

    o, s = naive_recurrent(q, k, v, g, beta, None, h0, True)
    o_fla, s_fla = fla_op(q, k, v, g, beta, h0)
    assert rel_rms(o_fla, o) < 1e-5, f"{name}: outputs differ from FLA's reference"
    assert rel_rms(s_fla, s) < 1e-5, f"{name}: final states differ from FLA's reference"

    do, ds = torch.randn_like(o), torch.randn_like(s)
    grads = torch.autograd.grad((o * do).sum() + (s * ds).sum(), leaves)
    grads_fla = torch.autograd.grad((o_fla * do).sum() + (s_fla * ds).sum(), leaves)
    names = [
        n for n, t in zip("q k v g beta h0".split(), (q, k, v, g, beta, h0), strict=True) if t is not None
    ]
    for n, a, b in zip(names, grads, grads_fla, strict=True):
        assert rel_rms(b, a) < 1e-4, f"{name}: d{n} differs from FLA's reference ({rel_rms(b, a):.2e})"
