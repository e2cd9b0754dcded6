"""Stage 3 of the backward: the [C, C] gradients of one chunk, M_qk = dA_qk, and for the delta rule dv =
T^T dVt, dbeta and M_kk = diag(beta) dA with dA = -L^T dL L^T; the intra backward reads M_qk, M_kk.
Branches on DELTA (everything past M_qk) and on DECAY (Gamma K). Not run for FUSED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from kernels.triton.common import _decay_head, _dot_cast, _head, _load_qg, _load_vec, _rows

if TYPE_CHECKING:
    from kernels.triton.chunk import Grads, Saved
    from kernels.triton.plan import BackwardPlan


@triton.jit
def _dvt_bwd_kernel(
    k,
    vals,
    vt,
    mats,
    gc,
    beta,
    dbeta,
    h,
    scale,
    T,
    NT,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    DECAY: tl.constexpr,
):
    # the [BT, BT] gradients of one chunk: M_qk = dA_qk, and for the delta rule dv = T^T dVt, dbeta and
    # M_kk = diag(beta) dA with dA = -L^T dL L^T (the relative-decay parts go to _intra_bwd_kernel).
    # x given (the plan's keep_x): X = V - (Gamma K) S as the forward state pass kept it, instead of from h
    # and Gamma K (k: Gamma K for the per-channel decay) here. VT_X (vt absent, the plan's vt_x, with x): no
    # Vt in memory; the V loop sums dO X^T and dO Vt^T = (dO X^T) T^T follows it. A buffer a launch does not
    # read or write is None. DELTA: beta given (the delta rule). LOWP: 16-bit inputs, told by k's dtype, which
    # is q's (Gamma K is kept in the op's dot dtype); v is bf16 in fp32-q,k training.
    # Tuples: vals (v, do, dvt, dv, x), the [B, T, H, V] buffers but vt; mats (akk, linv, m_qk, m_kk)
    v, do, dvt, dv, x = vals
    akk, linv, m_qk, m_kk = mats
    PRE_X: tl.constexpr = x is not None
    VT_X: tl.constexpr = vt is None
    DELTA: tl.constexpr = beta is not None
    LOWP: tl.constexpr = k.dtype.element_ty != tl.float32
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    # the program's base pointers: its head's rows of the [B, T, H, *] tensors, its chunk's state
    bh = _head(i_bh, T, H)
    k += bh * K
    v += bh * V
    if not VT_X:
        vt += bh * V
    do += bh * V
    m_qk += bh * BT
    if DECAY != "none":
        gc = _decay_head(gc, bh, K, DECAY)
    if DELTA:
        beta += bh
        dvt, dv = _rows((dvt, dv), bh, V)
        dbeta += bh
        akk, linv, m_kk = _rows((akk, linv, m_kk), bh, BT)
    if PRE_X:
        x += bh * V
    h += (i_bh * NT + i_t) * K * V
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_c = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    p_a = o_t[:, None] * (H * BT) + o_c[None, :]
    b_dp = tl.zeros([BT, BT], dtype=tl.float32)  # dO Vt^T
    if DELTA:
        b_beta = _load_vec(beta, o_t, m_t, H)
        b_tm = tl.load(linv + p_a, mask=m_t[:, None], other=0.0).to(tl.float32) * b_beta[None, :]
        if not PRE_X:
            b_kg = _dot_cast(_load_qg(k, gc, o_t, m_t, H, K, DECAY), LOWP)  # Gamma K
        # dT = dVt V^T + dW (Gamma K)^T with dW = -dVt S^T, i.e. dVt (V - (Gamma K) S)^T
        b_dtm = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(V // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        p_v = o_t[:, None] * (H * V) + o_v[None, :]
        b_do = tl.load(do + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
        if VT_X:
            b_x = tl.load(x + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
            b_vt = b_x
        elif DELTA:
            b_vt = tl.load(vt + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
        else:
            b_vt = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
        b_dp += tl.dot(_dot_cast(b_do, LOWP), tl.trans(_dot_cast(b_vt, LOWP)))
        if DELTA:
            if not PRE_X:
                p_s = o_k[:, None] * V + o_v[None, :]
                b_s = tl.load(h + p_s).to(tl.float32)  # [K, BV]
            b_dvt = tl.load(dvt + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
            if not PRE_X:
                b_v = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
            b_dv = tl.dot(tl.trans(_dot_cast(b_tm, LOWP)), _dot_cast(b_dvt, LOWP))
            tl.store(dv + p_v, b_dv.to(dv.dtype.element_ty), mask=m_t[:, None])
            if VT_X:
                pass  # X loaded above
            elif PRE_X:
                b_x = tl.load(x + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
            else:
                b_x = b_v - tl.dot(b_kg, _dot_cast(b_s, LOWP))
            b_dtm += tl.dot(_dot_cast(b_dvt, LOWP), tl.trans(_dot_cast(b_x, LOWP)))
    if VT_X:
        # dO Vt^T = (dO X^T) T^T: fp32 (tf32) operands, T as the forward's bf16 product rounded it
        b_dp = tl.dot(b_dp, tl.trans(_dot_cast(b_tm, LOWP).to(tl.float32)))
    b_dp = tl.where((o_c[:, None] >= o_c[None, :]) & m_t[:, None], b_dp, 0.0) * scale
    tl.store(m_qk + p_a, b_dp.to(m_qk.dtype.element_ty), mask=m_t[:, None])
    if DELTA:
        # T = L diag(beta), L = (I + A)^-1 with A = diag(beta) A_kk
        b_l = tl.load(linv + p_a, mask=m_t[:, None], other=0.0).to(tl.float32)
        b_dl = b_dtm * b_beta[None, :]
        b_db = tl.sum(b_l * b_dtm, 0)
        b_da = -tl.dot(tl.dot(tl.trans(b_l), b_dl), tl.trans(b_l))
        b_da = tl.where((o_c[:, None] > o_c[None, :]) & m_t[:, None], b_da, 0.0)
        b_akk = tl.load(akk + p_a, mask=m_t[:, None], other=0.0)
        b_db += tl.sum(b_da * b_akk, 1)
        tl.store(m_kk + p_a, (b_da * b_beta[:, None]).to(m_kk.dtype.element_ty), mask=m_t[:, None])
        tl.store(dbeta + o_t * H, b_db, mask=m_t)


def dvt_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None,
    scale: float,
    do: torch.Tensor,
    saved: Saved,
    dvt: torch.Tensor,
    grads: Grads,
    bp: BackwardPlan,
) -> None:
    """M_qk and, for the delta rule, dv, dbeta and M_kk of every chunk into grads."""
    p = bp.problem
    B, T, H, K, V, BT, NT = p.B, p.T, p.H, p.K, p.V, p.chunk_size, p.NT
    delta = p.delta_rule
    s, g = saved, grads
    _dvt_bwd_kernel[(NT, B * H)](
        s.kg if s.kg is not None else k,
        (v, do, dvt, g.dv, s.x),
        # (None where the forward kept X and no Vt: the plan's vt_x)
        s.vt if delta else v,
        (s.akk, s.linv, g.m_qk, g.m_kk),
        s.gc,
        beta,
        g.dbeta,
        s.h,
        scale,
        T,
        NT,
        H=H,
        K=K,
        V=V,
        BT=BT,
        BV=bp.dqk_bv,
        DECAY=p.decay,
        num_warps=bp.dvt.warps,
        num_stages=bp.dvt.stages,
    )
