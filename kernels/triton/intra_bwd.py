"""Stage 4 (or, with the plan's `first`, 2) of the backward: the relative-decay parts of dq, dk and dG
through A_qk = rel(Q, K) and A_kk = rel(K, K), one program per 16-row block and block of key columns.
Branches on DECAY ("none", "scalar": whole-chunk products; "channel": triangular, with BOUNDED's dense
diagonal) and on DELTA (M_kk). Not run for FUSED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from kernels.triton.common import BC, _decay_head, _head, _load_block, _load_row_block, _rows
from kernels.triton.intra_bwd_blocks import _rel_cols, _rel_cols_tri, _rel_diag, _rel_rows, _rel_rows_tri

if TYPE_CHECKING:
    from kernels.triton.chunk import Grads, Saved
    from kernels.triton.plan import BackwardPlan


@triton.jit
def _rel_full(
    q,
    k,
    gc,
    m_qk,
    m_kk,
    o_r,
    m_r,
    o_i,
    m_i,
    o_k,
    t0,
    r0,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    DECAY: tl.constexpr,
    DELTA: tl.constexpr,
    LOWP: tl.constexpr,
):
    # no decay or the scalar one: the rows and columns over the whole chunk, masked
    # dq = rel_rows(M_qk, k); with DELTA also dkr = rel_rows(M_kk, k)
    b_dq, b_dkr = _rel_rows(
        m_qk,
        m_kk,
        k,
        gc,
        o_r,
        m_r,
        o_i,
        m_i,
        o_k,
        t0,
        r0,
        T,
        H,
        K,
        BT,
        BC,
        DECAY,
        DELTA,
        LOWP,
    )
    # dkc = rel_cols(M_qk, q), plus rel_cols(M_kk, k) with DELTA
    b_dkc = _rel_cols(
        m_qk,
        q,
        m_kk,
        k,
        gc,
        o_r,
        m_r,
        o_i,
        m_i,
        o_k,
        t0,
        r0,
        T,
        H,
        K,
        BT,
        BC,
        DECAY,
        DELTA,
        LOWP,
    )
    return b_dq, b_dkr, b_dkc


@triton.jit
def _intra_bwd_kernel(
    q,
    k,
    gc,
    m_qk,
    m_kk,
    dq,
    dk,
    dgk,
    dq_out,
    dk_out,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    DECAY: tl.constexpr,
    DELTA: tl.constexpr,
    BOUNDED: tl.constexpr,
):
    # gradients through the relative-decay products A_qk = rel(q, k), A_kk = rel(k, k), BC rows and the BK key
    # columns [i_k BK, (i_k + 1) BK) at a time (every term is separable over the key channel):
    # rel(x, y)_ri = sum_c x_rc y_ic exp(G_rc - G_ic); dx = rel_rows(M, y), dy = rel_cols(M, x),
    # and the log-decay gets x * dx - y * dy.
    # fp32 (tf32) operands rather than bf16 ones: dG = x dx - y dy cancels, and the bounded path's
    # e^75-scaled operands left dg at 2.1e-2 relative error in bf16 on the H200
    LOWP: tl.constexpr = False
    # the per-channel decay runs this kernel before dqk (the plan's first): its parts alone, dqk adds them
    FIRST: tl.constexpr = DECAY == "channel"
    i_tc, i_k, i_bh = (
        tl.program_id(0).to(tl.int64),
        tl.program_id(1).to(tl.int64),
        tl.program_id(2).to(tl.int64),
    )
    # the program's base pointers: its head's rows
    bh = _head(i_bh, T, H)
    q, k = _rows((q, k), bh, K)
    m_qk, m_kk = _rows((m_qk, m_kk), bh, BT)
    dq, dk, dgk, dq_out, dk_out = _rows((dq, dk, dgk, dq_out, dk_out), bh, K)
    if DECAY != "none":
        gc = _decay_head(gc, bh, K, DECAY)
    NC: tl.constexpr = BT // BC
    i_t, i_c = i_tc // NC, i_tc % NC
    t0 = i_t * BT
    r0 = t0 + i_c * BC
    o_r = r0 + tl.arange(0, BC)
    m_r = o_r < T
    o_i = t0 + tl.arange(0, BT)
    m_i = o_i < T
    o_k = i_k * BK + tl.arange(0, BK)
    dense = 0
    b_gd = 0
    if DECAY == "channel":
        if not BOUNDED:
            # unbounded gates: this block's diagonal goes dense, as with the bounded gate, when its own decay
            # is at most e^75 in each of these key columns
            b_g0 = _load_row_block(gc, tl.minimum(r0, T - 1), o_k, T, H, K)
            b_g1 = _load_row_block(gc, tl.minimum(r0 + BC, T) - 1, o_k, T, H, K)
            dense = (tl.max(b_g0 - b_g1, 0) <= 75.0).to(tl.int64)
            b_gd = tl.where(dense == 1, b_g0, b_g1)  # the anchor of _rel_cols_tri
        b_dq, b_dkr = _rel_rows_tri(
            m_qk,
            m_kk,
            k,
            gc,
            o_r,
            m_r,
            o_k,
            t0,
            r0,
            i_c,
            T,
            H,
            K,
            BT,
            BC,
            BOUNDED,
            DELTA,
            LOWP,
            dense,
        )
        b_dkc = _rel_cols_tri(
            m_qk,
            q,
            m_kk,
            k,
            gc,
            o_r,
            m_r,
            o_k,
            t0,
            r0,
            i_c,
            T,
            H,
            K,
            BT,
            BC,
            BOUNDED,
            DELTA,
            LOWP,
            dense,
            b_gd,
        )
    else:
        b_dq, b_dkr, b_dkc = _rel_full(
            q,
            k,
            gc,
            m_qk,
            m_kk,
            o_r,
            m_r,
            o_i,
            m_i,
            o_k,
            t0,
            r0,
            T,
            H,
            K,
            BT,
            BC,
            DECAY,
            DELTA,
            LOWP,
        )
    # the diagonal block by positions: the blocks of an unbounded gate too steep to go dense
    if DECAY == "channel" and not BOUNDED:
        if dense == 0:
            b_dq, b_dkr, b_dkc = _rel_diag(
                b_dq,
                b_dkr,
                b_dkc,
                m_qk,
                m_kk,
                q,
                k,
                gc,
                o_r,
                m_r,
                o_k,
                t0,
                r0,
                T,
                H,
                K,
                BT,
                BC,
                DELTA,
            )
    b_q = _load_block(q, o_r, m_r, o_k, H, K)
    b_k = _load_block(k, o_r, m_r, o_k, H, K)
    if DELTA:
        b_dk = b_dkc + b_dkr
        b_dg = b_q * b_dq + b_k * (b_dkr - b_dkc)
    else:
        b_dk = b_dkc
        b_dg = b_q * b_dq - b_k * b_dkc
    p_k = o_r[:, None] * (H * K) + o_k[None, :]
    if FIRST:
        # before the dqk kernel: this part alone, which dqk adds to its own
        tl.store(dq + p_k, b_dq.to(dq.dtype.element_ty), mask=m_r[:, None])
        tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_r[:, None])
        tl.store(dgk + p_k, b_dg.to(dgk.dtype.element_ty), mask=m_r[:, None])
    else:
        # the final dq, dk go straight into tensors of the inputs' dtype (no cast pass afterwards)
        b_dq += tl.load(dq + p_k, mask=m_r[:, None], other=0.0).to(tl.float32)
        b_dk += tl.load(dk + p_k, mask=m_r[:, None], other=0.0).to(tl.float32)
        tl.store(dq_out + p_k, b_dq.to(dq_out.dtype.element_ty), mask=m_r[:, None])
        tl.store(dk_out + p_k, b_dk.to(dk_out.dtype.element_ty), mask=m_r[:, None])
        if DECAY != "none":
            tl.store(dgk + p_k, tl.load(dgk + p_k, mask=m_r[:, None], other=0.0) + b_dg, mask=m_r[:, None])


def intra_backward(q: torch.Tensor, k: torch.Tensor, saved: Saved, grads: Grads, bp: BackwardPlan) -> None:
    """The relative-decay parts of dq, dk and dG into grads, from M_qk and M_kk: added to dqk's partial
    sums and finished (dqk ran first), or left partial for dqk to finish (the plan's `first`)."""
    p = bp.problem
    B, T, H, K, BT, NT = p.B, p.T, p.H, p.K, p.chunk_size, p.NT
    g = grads
    # one program per 16-row block and per block of BKi key columns (each term is separable over channels)
    BKi = bp.intra_bk
    _intra_bwd_kernel[(NT * (BT // BC), K // BKi, B * H)](
        q,
        k,
        saved.gc,
        g.m_qk,
        g.m_kk,
        g.dq,
        g.dk,
        g.dgk,
        g.dq_out,
        g.dk_out,
        T,
        H=H,
        K=K,
        BT=BT,
        BC=BC,
        BK=BKi,
        DECAY=p.decay,
        DELTA=p.delta_rule,
        BOUNDED=p.bounded,
        num_warps=bp.intra.warps,
        num_stages=bp.intra.stages,
        maxnreg=bp.intra.maxnreg,
    )
