"""Chunkwise Triton kernels for the whole family (docs/design.md §1): the autograd Function and the forward
and backward as pipelines of stage launchers, one module a stage (README.md beside this file: the stage x
switch matrix, the derivation, the buffers kept for the backward and why, the bounded-gate fast path).

Two compile-time switches select the op, in kernels.family's words: DECAY ("none", "scalar" per head,
"channel" per key) and DELTA (the delta rule off/on). Every form, block size and warp count comes from the
launch plan (plan.py).
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import torch
from triton.runtime.errors import OutOfResources

from kernels import family
from kernels.triton import cumsum, dqk_bwd, dvt_bwd, intra_bwd, intra_fwd, solve, state_bwd, state_fwd
from kernels.triton.common import HAS_GDC, INTERPRET

# the stage modules, in pipeline order: each holds its kernels and their launcher
STAGES = (cumsum, intra_fwd, solve, state_fwd, state_bwd, dqk_bwd, dvt_bwd, intra_bwd)


@functools.cache
def _gdc_on(device: int | None) -> bool:
    # programmatic dependent launch for this CUDA device: compiled kernels (not the interpreter), a Triton
    # with grid dependency control, sm_90 or later; asked once a device
    return HAS_GDC and not INTERPRET and torch.cuda.get_device_capability(device)[0] >= 9


def _m_dtype(lowp: bool) -> torch.dtype:
    # M_qk, M_kk in bf16 for 16-bit inputs; the intra backward loads them into fp32
    return torch.bfloat16 if lowp else torch.float32


class Saved(NamedTuple):
    """What chunk_forward keeps for chunk_backward (None where the plan keeps nothing)."""

    gc: torch.Tensor | None  # chunk-local cumsum G of g, fp32
    aqk: torch.Tensor  # A_qk, the intra-chunk attention [B, T, H, BT]
    akk: torch.Tensor | None  # A_kk (the delta rule)
    linv: torch.Tensor | None  # L = (I + diag(beta) A_kk)^-1 (the delta rule)
    w: torch.Tensor | None  # W = L diag(beta) Gamma K (the delta rule)
    vt: torch.Tensor | None  # the pseudo-values Vt (the delta rule, unless the plan forms them from X)
    h: torch.Tensor | None  # the chunk-entry states [B, H, NT, K, V] (None: recompute_states)
    qg: torch.Tensor | None  # Q exp(G) (the per-channel decay, the plan's keep_decayed)
    kd: torch.Tensor | None  # K exp(G_last - G) (likewise)
    kg: torch.Tensor | None  # K exp(G) (KDA, where X does not stand in for it)
    x: torch.Tensor | None  # X = V - (Gamma K) S (the plan's keep_x)


class Grads(NamedTuple):
    """The backward's gradient buffers, written by dqk, dvt and the intra backward in the plan's order."""

    dq_out: torch.Tensor  # the final dq, dk, in the inputs' dtypes
    dk_out: torch.Tensor
    dq: torch.Tensor  # the partial dq, dk (dq_out, dk_out themselves where of their dtype or FUSED)
    dk: torch.Tensor
    dgk: torch.Tensor  # dG per key channel before its reverse cumsum, fp32 (dq's pointer without a decay; dg
    # itself for an fp32 per-channel g)
    m_qk: torch.Tensor | None  # dA_qk, dvt's for the intra backward (not for FUSED)
    m_kk: torch.Tensor | None  # diag(beta) dA_kk (the delta rule; else m_qk)
    dv: torch.Tensor  # dv (the delta rule; else dVt itself)
    dbeta: torch.Tensor | None  # fp32 (the delta rule)
    dg: torch.Tensor | None  # dg in g's shape and dtype (a decay)


def _problem(q, v, g, beta, chunk_size, lower_bound, keep: bool, launch: bool = True):
    # (kernels.triton.plan is imported here, so that `python -m kernels.triton.plan` finds it not yet loaded)
    from kernels.triton import plan

    B, T, H, K = q.shape
    return plan.Problem(
        B=B, T=T, H=H, K=K, V=v.shape[-1], chunk_size=chunk_size,
        decay=family.decay_of(q, g), delta_rule=beta is not None,
        bounded=lower_bound is not None, lowp=q.dtype != torch.float32, keep=keep,
        # (launch=False: for the buffers' layout, which programmatic launches do not change; the device is
        # not asked)
        pdl_capable=launch and q.is_cuda and _gdc_on(q.device.index),
    )  # fmt: skip


def saved_layout(q, k, v, g, beta, chunk_size, lower_bound, recompute_states=False) -> Saved:
    """(shape, dtype) of each buffer chunk_forward(keep=True, recompute_states) keeps for these inputs, None
    where it keeps none: a function of the shapes, dtypes and switches alone (the plan's keep_x and vt_x
    through B * H and V), so that the compiled path's fake forward can state the buffers (compile.py). It
    mirrors the stages' allocations; tests/test_compile.py checks it against chunk_forward for every op."""
    from kernels.triton import plan

    fp = plan.plan_forward(_problem(q, v, g, beta, chunk_size, lower_bound, True, launch=False))
    p = fp.problem
    B, T, H, K, V, BT = p.B, p.T, p.H, p.K, p.V, p.chunk_size
    # 16-bit inputs keep what only feeds dots in bf16 (also for fp16 inputs)
    dots = torch.bfloat16 if p.lowp else torch.float32
    rows = (B, T, H, BT)
    channel = p.decay == "channel"
    return Saved(
        gc=(tuple(g.shape), torch.float32) if g is not None else None,
        aqk=(rows, dots),
        akk=(rows, torch.float32) if p.delta_rule else None,
        linv=(rows, dots) if p.delta_rule else None,
        w=(tuple(k.shape), k.dtype) if fp.runs_wu and not (recompute_states and fp.keep_x) else None,
        vt=(tuple(v.shape), v.dtype) if fp.store_vt else None,
        h=None if recompute_states else ((B, H, p.NT, K, V), dots),
        qg=((B, T, H, K), dots) if fp.keep_decayed else None,
        kd=((B, T, H, K), dots) if fp.keep_decayed else None,
        kg=((B, T, H, K), dots) if channel and p.delta_rule and not fp.keep_x else None,
        x=(tuple(v.shape), v.dtype) if fp.keep_x else None,
    )


def chunk_forward(
    q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound, keep=True,
    recompute_states=False,
):  # fmt: skip
    """The chunkwise forward on checked, contiguous inputs (triton_chunk checks them): returns (o, final
    state or None, Saved for chunk_backward or None). keep=False (no gradient wanted) keeps nothing and
    skips the chunk-entry states h and Vt where nothing else reads them. recompute_states (with keep):
    no h kept (Saved.h None), chunk_backward rebuilds it; h is written only where the output kernel reads
    it; with keep_x no W either (chunk_backward runs the W pass)."""
    from kernels.triton import plan

    fp = plan.plan_forward(_problem(q, v, g, beta, chunk_size, lower_bound, keep))
    gc, gq = cumsum.cumsum_forward(g, fp)
    aqk, akk, qg, kd, kg = intra_fwd.intra_forward(q, k, gc, gq, scale, fp)
    linv = solve.solve(beta, akk, fp) if fp.problem.delta_rule else None
    # (with keep_x only the backward reads W: recompute_states leaves it to the backward)
    defer_w = recompute_states and fp.keep_x
    w, u = solve.wu(k, v, gc, beta, linv, kg, fp) if fp.problem.delta_rule and not defer_w else (None, None)
    o, ht, h, vt, x = state_fwd.state_forward(
        q, k, v, gc, beta, scale, initial_state, output_final_state, aqk, linv, w, u, qg, kd, kg, fp,
        keep_h=not recompute_states,
    )  # fmt: skip
    if not fp.out:
        state_fwd.output(q, v, gc, scale, aqk, vt, h, qg, o, fp)
    if not keep:
        return o, ht, None
    if not fp.keep_decayed:
        qg = kd = None  # (the reverse state pass decays fp32 q and k itself)
    if recompute_states:
        h = None  # (the output kernel's, where it ran: the backward rebuilds the states)
    # (Gamma K only served X in the backward)
    return o, ht, Saved(gc, aqk, akk, linv, w, vt, h, qg, kd, None if fp.keep_x else kg, x)


def shape_only(g: torch.Tensor | None) -> torch.Tensor | None:
    """What the backward keeps of g: a zero-byte stand-in with its shape, dtype and device. The backward
    reads g's values only through G, its chunk-local cumsum (Saved.gc), so keeping g itself would hold a
    second copy of the gate ([B, T, H, K] fp32 for KDA) for nothing."""
    return None if g is None else g.new_empty(()).expand(g.shape)


def _gradients(q, k, v, g, dvt: torch.Tensor, bp) -> Grads:
    # the buffers dqk, dvt and the intra backward write, in the plan's precisions
    p = bp.problem
    B, T, H, K, BT = p.B, p.T, p.H, p.K, p.chunk_size
    dev = q.device
    dq_out = torch.empty_like(q)
    dk_out = torch.empty_like(k)
    # the partial dq, dk in bf16 for 16-bit inputs (fp32's range, also for fp16 inputs), else fp32. Where that
    # is the inputs' dtype the final sums overwrite them: the kernel that finishes a tile is the one program
    # that reads its partial sums, and it reads them before it writes (so also for dG below)
    partial = torch.bfloat16 if p.lowp else torch.float32
    dq = dq_out if bp.fused or q.dtype == partial else torch.empty(B, T, H, K, device=dev, dtype=partial)
    dk = dk_out if bp.fused or k.dtype == partial else torch.empty(B, T, H, K, device=dev, dtype=partial)
    # (g is shape_only's stand-in: dense strides stated, not preserved from it)
    dg = torch.empty(g.shape, device=dev, dtype=g.dtype) if p.decay != "none" else None
    if p.decay == "channel" and g.dtype == torch.float32:
        # dqk reverse-cumsums dG per chunk from these rows into dg (the plan's first)
        dgk = dg
    else:
        # (without a decay: no dG at all; dq only stands in for the pointer)
        dgk = torch.empty(B, T, H, K, device=dev, dtype=torch.float32) if p.decay != "none" else dq
    m_qk = None if bp.fused else torch.empty(B, T, H, BT, device=dev, dtype=_m_dtype(p.lowp))
    m_kk = torch.empty(B, T, H, BT, device=dev, dtype=_m_dtype(p.lowp)) if p.delta_rule else m_qk
    dv = torch.empty(B, T, H, v.shape[-1], device=dev, dtype=v.dtype) if p.delta_rule else dvt
    dbeta = torch.empty(B, T, H, device=dev, dtype=torch.float32) if p.delta_rule else None
    return Grads(dq_out, dk_out, dq, dk, dgk, m_qk, m_kk, dv, dbeta, dg)


def chunk_backward(q, k, v, g, beta, scale, initial_state, do, dht, chunk_size, lower_bound, saved):
    """The chunkwise backward from chunk_forward's saved buffers and the output's (and final state's)
    gradients do, dht: returns (dq, dk, dv, dg, dbeta, dh0) in the kernels' dtypes (ChunkFunction casts).
    Where the forward kept no states (saved.h None, recompute_states) it rebuilds them first (and W, where
    it kept X)."""
    from kernels.triton import plan

    if saved.h is None:
        # the forward's plan (no programmatic dependent launch: that chains the forward's kernels)
        fp = plan.plan_forward(_problem(q, v, g, beta, chunk_size, lower_bound, True, launch=False))
        saved = state_fwd.rebuild_states(q, k, v, beta, scale, initial_state, saved, fp)
    # the forward kept X = V - (Gamma K) S and no Vt = T X: dqk and dvt read X for it
    vt_x = beta is not None and saved.vt is None
    problem = _problem(q, v, g, beta, chunk_size, lower_bound, True)
    bp = plan.plan_backward(problem, vt_x, saved.x is not None)
    do = do.contiguous()
    dvt, dh, dh0 = state_bwd.state_backward(q, k, scale, do, dht, saved, bp)
    grads = _gradients(q, k, v, g, dvt, bp)

    def dqk() -> None:
        dqk_bwd.dqk_backward(q, k, v, beta, scale, do, saved, dh, dvt, grads, bp)

    if bp.fused:
        # no delta rule, no per-channel decay: dqk does the intra-chunk part too
        dqk()
    elif bp.first:
        # the intra backward first; dqk adds its own part, finishes dq, dk and reverse-cumsums dG per chunk
        dvt_bwd.dvt_backward(q, k, v, beta, scale, do, saved, dvt, grads, bp)
        intra_bwd.intra_backward(q, k, saved, grads, bp)
        dqk()
    else:
        dqk()
        dvt_bwd.dvt_backward(q, k, v, beta, scale, do, saved, dvt, grads, bp)
        intra_bwd.intra_backward(q, k, saved, grads, bp)
    if problem.decay == "scalar":
        # (the per-channel decay's dqk reverse-cumsums dG itself, the plan's first)
        cumsum.rev_cumsum(grads.dgk, grads.dg, bp)
    return grads.dq_out, grads.dk_out, grads.dv, grads.dg, grads.dbeta, dh0


class KernelResourceError(RuntimeError):
    """A kernel of the family asked the GPU for more shared memory (or registers) than it has."""


@contextlib.contextmanager
def _resources(q: torch.Tensor, v: torch.Tensor, where: str):
    # Triton's OutOfResources names the kernel and the bytes, not the call that got there or what to change
    try:
        yield
    except OutOfResources as exc:
        K, V = q.shape[-1], v.shape[-1]
        dtype = str(q.dtype).removeprefix("torch.")
        raise KernelResourceError(
            f"the Triton {where} at head sizes K={K}, V={V} with {dtype} inputs needs more GPU resources "
            f"than this GPU has ({exc}). Use head sizes <= 128 (checked on an H200), 16-bit inputs, or the "
            f"torch chunkwise op (backend='torch') for this layer."
        ) from exc


class ChunkFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound,
        recompute_states,
    ):  # fmt: skip
        with _resources(q, v, "chunk forward"):
            o, ht, saved = chunk_forward(
                q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound,
                recompute_states=recompute_states,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, shape_only(g), beta, initial_state, *saved)
        ctx.scale, ctx.chunk_size, ctx.lower_bound = scale, chunk_size, lower_bound
        if ht is not None:
            return o, ht
        return o

    @staticmethod
    def backward(ctx, do, dht=None):
        q, k, v, g, beta, h0, *saved = ctx.saved_tensors
        with _resources(q, v, "chunk backward"):
            dq, dk, dv, dg, dbeta, dh0 = chunk_backward(
                q, k, v, g, beta, ctx.scale, h0, do, dht, ctx.chunk_size, ctx.lower_bound, Saved(*saved)
            )
        return (
            dq.to(q.dtype),
            dk.to(k.dtype),
            dv.to(v.dtype),
            None if g is None else dg.to(g.dtype),
            None if beta is None else dbeta.to(beta.dtype),
            None,
            None if h0 is None else dh0.to(h0.dtype),
            None,
            None,
            None,
            None,
        )
