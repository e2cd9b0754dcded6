"""Elementwise pieces of the linear layer that save their input, not their outputs, for the backward.

Autograd, left to itself, keeps every intermediate of an elementwise chain: for KDA's gate
`g_min * sigmoid(exp(A_log) * (z + b))` the fp32 `z + b` and the fp32 sigmoid; for the output
`RMSNorm(o.float()) * sigmoid(gate)` the fp32 copy of `o`, its normalised value and the product's two
factors; for `F.normalize` under CUDA's autocast an fp32 copy of q and an fp32 output. At B=256 T=1024
each [B, T, 256] fp32 tensor is 256 MiB a layer. Each Function here saves only what the backward cannot
cheaply recompute (the inputs, already in the autocast dtype, or the output another op saves anyway) and
recomputes the rest in fp32 in its backward: a few elementwise passes over tensors the backward reads
anyway.

The layer (linear_base.LinearMixer, `lean_backward`) uses them; with `lean_backward = False` it runs the
plain torch expressions they replace, the reference the tests compare them with.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ACTIVATIONS = ("none", "sigmoid", "swish")


def wide(t: torch.Tensor) -> torch.Tensor:
    # the precision the pieces compute in: fp32, or float64 for float64 inputs (references, gradchecks)
    return t if t.dtype == torch.float64 else t.float()


class L2Norm(torch.autograd.Function):
    """y = x / max(|x|, eps) over the last dim, computed in fp32, returned in x's dtype (F.normalize).

    Saves y itself (the op after it keeps the same tensor) and 1 / max(|x|, eps):
    dx = r (dy - y <y, dy>) where |x| > eps, r dy where the norm was clamped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float) -> torch.Tensor:
        norm = wide(x).norm(dim=-1, keepdim=True)  # [..., 1]
        r = 1 / norm.clamp_min(eps)
        y = (wide(x) * r).to(x.dtype)
        # the sign of r marks the clamped rows (r > 0 always): they need no projection
        ctx.save_for_backward(y, torch.where(norm > eps, r, -r))
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None]:
        y, signed_r = ctx.saved_tensors
        yf, dyf = wide(y), wide(dy)
        r = signed_r.abs()
        project = (signed_r > 0).to(yf.dtype)
        dx = r * (dyf - project * yf * (yf * dyf).sum(-1, keepdim=True))
        return dx.to(y.dtype), None


def l2_norm(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:  # [..., K] -> [..., K], x's dtype
    """F.normalize(x, dim=-1) in fp32 that keeps x's dtype and saves only its output (L2Norm)."""
    return L2Norm.apply(x, eps)


def _gate_preact(z: torch.Tensor, bias: torch.Tensor, heads: int) -> torch.Tensor:
    # [B, T, H*K] (any dtype) + [H*K] -> fp32 [B, T, H, K]
    return (wide(z) + wide(bias)).unflatten(-1, (heads, -1))


class KDAGate(torch.autograd.Function):
    """KDA's per-channel log-decay from the low-rank logits z [B, T, H*K] (mixers/kda.py):

        softplus: g = -exp(A_log) * softplus(z + b)
        bounded:  g = g_min * sigmoid(exp(A_log) * (z + b))

    returned in fp32 [B, T, H, K]. Saves z (the up-projection's output, in the autocast dtype), b, A_log."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, bias: torch.Tensor, A_log: torch.Tensor, bounded: bool,
                g_min: float) -> torch.Tensor:
        u = _gate_preact(z, bias, A_log.shape[0])
        A = wide(A_log).exp()[:, None]  # [H, 1]
        g = g_min * torch.sigmoid(A * u) if bounded else -A * F.softplus(u)
        ctx.save_for_backward(z, bias, A_log)
        ctx.bounded, ctx.g_min = bounded, g_min
        return g

    @staticmethod
    def backward(ctx: Any, dg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        z, bias, A_log = ctx.saved_tensors
        u = _gate_preact(z, bias, A_log.shape[0])
        A = wide(A_log).exp()[:, None]
        dg = wide(dg)
        if ctx.bounded:
            s = torch.sigmoid(A * u)
            dpre = dg * ctx.g_min * s * (1 - s)  # d/d(A u)
            du = dpre * A
            # d/dA_log = d/dA * A, and d(A u)/dA = u
            dA_log = (dpre * u * A).sum(dim=(0, 1, 3))
        else:
            du = -dg * A * torch.sigmoid(u)
            # g is proportional to A = exp(A_log): dg/dA_log = g
            dA_log = (dg * -A * F.softplus(u)).sum(dim=(0, 1, 3))
        du = du.flatten(-2)  # [B, T, H*K]
        dbias = du.sum(dim=tuple(range(du.dim() - 1)))
        return du.to(z.dtype), dbias.to(bias.dtype), dA_log.to(A_log.dtype), None, None


def kda_gate(z: torch.Tensor, bias: torch.Tensor, A_log: torch.Tensor, bounded: bool,
             g_min: float) -> torch.Tensor:
    """KDAGate: g [B, T, H, K] fp32 from z [B, T, H*K]."""
    return KDAGate.apply(z, bias, A_log, bounded, g_min)


def _activate(gate: torch.Tensor, activation: str) -> torch.Tensor:
    return torch.sigmoid(gate) if activation == "sigmoid" else F.silu(gate)


class GatedRMSNorm(torch.autograd.Function):
    """out = RMSNorm(o) * act(gate) in fp32 (per head, over the last dim, with weight w), act in
    ACTIVATIONS ("none": no gate). Saves o and the gate logits as they come (the op's output and the gate
    projection's, in the autocast dtype), w and the fp32 1/rms [..., 1]; the backward recomputes the
    normalised o and the activation."""

    @staticmethod
    def forward(ctx: Any, o: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, eps: float,
                activation: str) -> torch.Tensor:
        of = wide(o)
        r = torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
        out = of * r * wide(weight)
        if activation != "none":
            out = out * _activate(wide(gate), activation)
        ctx.save_for_backward(o, gate, weight, r)
        ctx.activation = activation
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        o, gate, weight, r = ctx.saved_tensors
        n = wide(o) * r  # the normalised o
        y = n * wide(weight)
        dout = wide(dout)
        dgate = None
        if ctx.activation != "none":
            gf = wide(gate)
            s = torch.sigmoid(gf)
            a = s if ctx.activation == "sigmoid" else gf * s
            # sigmoid' = s (1 - s); silu' = s (1 + x (1 - s))
            da = s * (1 - s) if ctx.activation == "sigmoid" else s * (1 + gf * (1 - s))
            dgate = (dout * y * da).to(gate.dtype)
            dy = dout * a
        else:
            dy = dout
        dweight = (dy * n).sum(dim=tuple(range(dy.dim() - 1))).to(weight.dtype)
        dn = dy * wide(weight)
        do = r * (dn - n * (dn * n).mean(-1, keepdim=True))
        return do.to(o.dtype), dgate, dweight, None, None


def gated_rms_norm(o: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, eps: float,
                   activation: str) -> torch.Tensor:
    """GatedRMSNorm: RMSNorm(o) * act(gate) [..., V] in fp32."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is unknown; use one of {ACTIVATIONS}")
    if activation != "none" and gate is None:
        raise ValueError(f"activation={activation!r} needs the gate logits; pass gate or activation='none'")
    return GatedRMSNorm.apply(o, gate, weight, eps, activation)
