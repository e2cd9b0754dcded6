"""Elementwise pieces of the linear layer that save their input, not their outputs, for the backward.

Autograd, left to itself, keeps every intermediate of an elementwise chain: for KDA's gate
`g_min * sigmoid(exp(A_log) * (z + b))` the fp32 `z + b` and the fp32 sigmoid; for the output
`W_o (RMSNorm(o.float()) * sigmoid(gate))` the fp32 copy of `o`, its normalised value, the product's two
factors and the projection's bf16 input; for `F.normalize` under CUDA's autocast an fp32 copy of q and an
fp32 output. At B=256 T=1024 each [B, T, 256] fp32 tensor is 256 MiB a layer. Each Function here saves
only what the backward cannot cheaply recompute (the inputs, already in the autocast dtype, or the output
another op saves anyway) and recomputes the rest in fp32 in its backward: a few elementwise passes over
tensors the backward reads anyway.

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


def narrow(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype: a Function's output must not be a no-op cast (or .contiguous()) of a tensor it computed,
    which torch 2.11's Dynamo routes the backward's gradient past (pytorch/pytorch#180642: zero gradients)."""
    return t if t.dtype == dtype else t.to(dtype)


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


class Recomputed(torch.autograd.Function):
    """y = fn(*inputs), keeping only `inputs` for the backward, which runs fn again (under the forward's
    autocast) and differentiates that. For a cheap fn whose intermediates are large: the short conv's
    input, W x, is the conv's only saved tensor, and recomputing it is one GEMM.

    fn must be deterministic and read every tensor it needs gradients for from `inputs` (a module's
    parameters may be passed as they are: the backward takes their gradients with autograd.grad, which
    does not accumulate them, and returns them as these inputs' gradients)."""

    @staticmethod
    def forward(ctx: Any, fn: Any, *inputs: torch.Tensor) -> torch.Tensor:
        device = inputs[0].device.type
        ctx.fn, ctx.device = fn, device
        ctx.autocast = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        ctx.save_for_backward(*inputs)
        return fn(*inputs)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inputs = ctx.saved_tensors
        # parameters (leaves) as they are; other inputs cut from the outer graph
        inputs = [t if t.is_leaf else t.detach().requires_grad_(t.requires_grad) for t in inputs]
        wanted = [t for t in inputs if t.requires_grad]
        enabled, dtype = ctx.autocast
        # the recomputed graph lives only for this backward: an enclosing saved-tensor hook (a memory
        # count, an offload) sees what the forward kept, not these
        with torch.enable_grad(), torch.autocast(ctx.device, dtype=dtype, enabled=enabled), \
                torch.autograd.graph.saved_tensors_hooks(_identity, _identity):
            y = ctx.fn(*inputs)
        grads = iter(torch.autograd.grad(y, wanted, dy, allow_unused=True))
        return (None, *(next(grads) if t.requires_grad else None for t in inputs))


def recomputed(fn: Any, *inputs: torch.Tensor) -> torch.Tensor:
    """Recomputed: fn(*inputs) that saves only `inputs` (a plain call without a gradient to take, and under
    torch.compile, whose partitioner chooses what to recompute itself)."""
    wanted = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    if torch.compiler.is_compiling() or not wanted:
        return fn(*inputs)
    return Recomputed.apply(fn, *inputs)


class SharedCast(torch.autograd.Function):
    """n views of one cast of x to `dtype`: one copy for autograd to save however many ops read it. The
    backward sums the n gradients in fp32 (the precision n separate casts' gradients meet in), not in
    `dtype`, as autograd would for n uses of one tensor."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dtype: torch.dtype, n: int) -> tuple[torch.Tensor, ...]:
        low = x.to(dtype)
        ctx.dtype = x.dtype
        return tuple(low.view_as(low) for _ in range(n))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, None, None]:
        total = None
        for grad in grads:
            if grad is not None:
                total = wide(grad) if total is None else total + wide(grad)
        return (None if total is None else total.to(ctx.dtype)), None, None


def shared_cast(x: torch.Tensor, dtype: torch.dtype, n: int) -> tuple[torch.Tensor, ...]:
    """SharedCast: n views of x.to(dtype) whose gradients are summed in fp32."""
    return SharedCast.apply(x, dtype, n)


class L2Norm(torch.autograd.Function):
    """y = x / max(|x|, eps) over the last dim, computed in fp32, returned in x's dtype (F.normalize).

    Saves y itself (the op after it keeps the same tensor) and 1 / max(|x|, eps):
    dx = r (dy - y <y, dy>) where |x| > eps, r dy where the norm was clamped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float) -> torch.Tensor:
        norm = wide(x).norm(dim=-1, keepdim=True)  # [..., 1]
        r = 1 / norm.clamp_min(eps)
        y = narrow(wide(x) * r, x.dtype)
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


def _gated_norm(o: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, r: torch.Tensor,
                activation: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    # (out, the normalised o, act(gate) or None), in the computation's precision
    n = wide(o) * r
    out = n * wide(weight)
    a = None if activation == "none" else _activate(wide(gate), activation)
    return (out if a is None else out * a), n, a


class GatedRMSNormProjection(torch.autograd.Function):
    """y = W_o flatten_heads(RMSNorm(o) * act(gate)): the per-head RMSNorm (weight w, over the last dim) and
    gate in fp32, act in ACTIVATIONS ("none": no gate), then the output projection W_o [D, H*V] in the
    dtype the enclosing autocast gives F.linear (its input is cast to it, as nn.Linear's would be).

    Saves o and the gate logits as they come (the op's output and the gate projection's, in the autocast
    dtype), w, W_o and the fp32 1/rms [..., 1]; the backward recomputes the normalised, gated o (the
    projection's input, which autograd would keep as well)."""

    @staticmethod
    def forward(ctx: Any, o: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, eps: float,
                activation: str, proj: torch.Tensor) -> torch.Tensor:
        r = torch.rsqrt(wide(o).pow(2).mean(-1, keepdim=True) + eps)  # [B, T, H, 1]
        out, _, _ = _gated_norm(o, gate, weight, r, activation)  # [B, T, H, V]
        y = F.linear(out.flatten(-2), proj)  # [B, T, D]
        ctx.save_for_backward(o, gate, weight, r, proj)
        ctx.activation = activation
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        o, gate, weight, r, proj = ctx.saved_tensors
        out, n, a = _gated_norm(o, gate, weight, r, ctx.activation)
        # the projection's backward in its forward's dtype (dy's), as autograd's for nn.Linear under autocast
        flat = out.flatten(-2).to(dy.dtype)  # [B, T, H*V]
        dproj = (dy.flatten(0, -2).T @ flat.flatten(0, -2)).to(proj.dtype)  # [D, H*V]
        dout = wide(dy @ proj.to(dy.dtype)).unflatten(-1, o.shape[-2:])  # [B, T, H, V]
        dgate = None
        if a is not None:
            gf = wide(gate)
            s = torch.sigmoid(gf)
            # sigmoid' = s (1 - s); silu' = s (1 + x (1 - s))
            da = s * (1 - s) if ctx.activation == "sigmoid" else s * (1 + gf * (1 - s))
            dgate = (dout * n * wide(weight) * da).to(gate.dtype)
            dout = dout * a
        dweight = (dout * n).sum(dim=tuple(range(dout.dim() - 1))).to(weight.dtype)
        dn = dout * wide(weight)
        do = r * (dn - n * (dn * n).mean(-1, keepdim=True))
        return do.to(o.dtype), dgate, dweight, None, None, dproj


def gated_rms_norm_projection(o: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, eps: float,
                              activation: str, proj: torch.Tensor) -> torch.Tensor:
    """GatedRMSNormProjection: o [B, T, H, V], gate [B, T, H, V] or None -> [B, T, D]."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is unknown; use one of {ACTIVATIONS}")
    if activation != "none" and gate is None:
        raise ValueError(f"activation={activation!r} needs the gate logits; pass gate or activation='none'")
    if proj.dim() != 2 or proj.shape[1] != o.shape[-2] * o.shape[-1]:
        width = o.shape[-2] * o.shape[-1]
        raise ValueError(f"proj has shape {list(proj.shape)}; expected [D, H*V] = [D, {width}]")
    return GatedRMSNormProjection.apply(o, gate, weight, eps, activation, proj)
