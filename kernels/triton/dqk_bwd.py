"""Stage 2 (or, with the plan's `first`, 4) of the backward: dq, dk and dG of one chunk per block of key
columns, the plain products through the state; without the delta rule and the per-channel decay (FUSED)
the intra-chunk part too. Branches on DECAY (G, dG, its reverse cumsum) and on DELTA (W, the T = L diag
(beta) products, d(Gamma K)).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from kernels.triton.common import _decay_head, _dot_cast, _head, _load_block, _load_vec, _rows

if TYPE_CHECKING:
    from kernels.triton.chunk import Grads, Saved
    from kernels.triton.plan import BackwardPlan


@triton.jit
def _rev_cumsum_by_dot(b_x, BT: tl.constexpr, LOWP: tl.constexpr):
    # the reverse cumsum of a chunk's [BT, *] rows as a product with the upper triangle of ones on the tensor
    # cores: single-pass TF32 for 16-bit inputs (10 mantissa bits, beside bf16's 7
    # in dq, dk), 3xTF32 for fp32 inputs
    o_c = tl.arange(0, BT)
    b_up = (o_c[:, None] <= o_c[None, :]).to(tl.float32)
    if LOWP:
        return tl.dot(b_up, b_x, input_precision="tf32")
    else:
        return tl.dot(b_up, b_x, input_precision="tf32x3")


@triton.jit
def _dqk_bwd_kernel(
    keys,
    grads,
    vals,
    gc,
    beta,
    linv,
    states,
    scale,
    T,
    NT,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    DECAY: tl.constexpr,
    K_INNER: tl.constexpr,
    VT_X: tl.constexpr,
):
    # dq, dk and dG of one chunk for the K columns [i_k BK, (i_k + 1) BK): the plain products through the
    # state (O's state term, S' = Gamma_last S + K_d^T Vt, W S); the relative-decay parts are left to
    # _intra_bwd_kernel. FUSED (no delta rule, no per-channel decay): the
    # intra-chunk part too, from M_qk = scale tril(dO V^T) (times the relative decay) summed over the same V
    # loop, so neither _dvt_bwd_kernel nor _intra_bwd_kernel runs and dq, dk are final here. FINISH
    # (the plan's first: the per-channel decay): _intra_bwd_kernel ran first and left its
    # partial dq, dk in dq, dk and its dG in dgk; they are added here, and the chunk's dG reverse-cumsummed
    # into dg (the chunk's rows are all in this program, the cumsum a product with the upper triangle of
    # ones on the tensor cores), so no _rev_cumsum_kernel runs
    # K_INNER (the plan's k_inner): the grid is (key blocks, chunks, B H), a chunk's key blocks side by side.
    # DV_W (the delta rule after the dvt backward): dvt holds dV = T^T dVt, not dVt, and
    # d(Gamma K) = T^T dW = -dV S^T needs no product with T.
    # VT_X (the plan's vt_x): vt holds X = V - (Gamma K) S, not Vt = T X; the V loop sums X dS'^T and
    # T (X dS'^T) follows it, so the forward keeps no Vt. vt holds V itself without the delta rule.
    # A buffer a launch does not read is None. The switches the buffers say: DELTA, beta given (the delta
    # rule); LOWP, 16-bit inputs (bf16 dot operands).
    # Tuples: keys (q, k), grads (dq, dk, dgk, dq_out, dk_out, dg), vals (vt, do, dvt), states (h, dh)
    q, k = keys
    dq, dk, dgk, dq_out, dk_out, dg = grads
    vt, do, dvt = vals
    h, dh = states
    DELTA: tl.constexpr = beta is not None
    LOWP: tl.constexpr = q.dtype.element_ty != tl.float32
    # the op's backward (BackwardPlan.fused, .first, .dv_w, .seq)
    FUSED: tl.constexpr = (not DELTA) and DECAY != "channel"
    FINISH: tl.constexpr = DECAY == "channel"
    DV_W: tl.constexpr = DELTA and FINISH
    SEQ: tl.constexpr = (not DELTA) and FINISH
    i_t, i_k, i_bh = (
        tl.program_id(K_INNER).to(tl.int64),
        tl.program_id(1 - K_INNER).to(tl.int64),
        tl.program_id(2).to(tl.int64),
    )
    # the program's base pointers: its head's rows of the [B, T, H, *] tensors, its chunk's states
    bh = _head(i_bh, T, H)
    q, k, dq, dk, dgk, dq_out = _rows((q, k, dq, dk, dgk, dq_out), bh, K)
    dk_out += bh * K
    vt, do, dvt = _rows((vt, do, dvt), bh, V)
    if DECAY != "none":
        gc = _decay_head(gc, bh, K, DECAY)
    if FINISH:
        dg += bh * K
    if DELTA:
        beta += bh
        linv += bh * BT
    h, dh = _rows((h, dh), i_bh * NT + i_t, K * V)
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_k = i_k * BK + tl.arange(0, BK)
    t_last = tl.minimum(i_t * BT + BT, T) - 1
    b_dqs = tl.zeros([BT, BK], dtype=tl.float32)  # dO S^T
    b_dkd = tl.zeros([BT, BK], dtype=tl.float32)  # Vt dS'^T
    b_dws = tl.zeros([BT, BK], dtype=tl.float32)  # dVt S^T
    b_dgl = tl.zeros([BK], dtype=tl.float32)  # sum_v S * dS' (times exp(G_last) below): the carried decay
    if FUSED:
        b_dp = tl.zeros([BT, BT], dtype=tl.float32)  # dO V^T
    for i_v in range(V // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        p_v = o_t[:, None] * (H * V) + o_v[None, :]
        p_s = o_k[:, None] * V + o_v[None, :]
        b_do = tl.load(do + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
        b_vt = tl.load(vt + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
        b_s = tl.load(h + p_s).to(tl.float32)  # [BK, BV]
        b_dsn = tl.load(dh + p_s).to(tl.float32)
        b_dqs += tl.dot(_dot_cast(b_do, LOWP), tl.trans(_dot_cast(b_s, LOWP)))
        b_dkd += tl.dot(_dot_cast(b_vt, LOWP), tl.trans(_dot_cast(b_dsn, LOWP)))
        b_dgl += tl.sum(b_s * b_dsn, 1)
        if FUSED:
            b_dp += tl.dot(_dot_cast(b_do, LOWP), tl.trans(_dot_cast(b_vt, LOWP)))
        if DELTA:
            b_dvt = tl.load(dvt + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
            b_dws += tl.dot(_dot_cast(b_dvt, LOWP), tl.trans(_dot_cast(b_s, LOWP)))
    if DELTA:
        # Vt = U - W S: dW = -dVt S^T; W = T (Gamma K) with T = L diag(beta): d(Gamma K) = T^T dW. First, so
        # that dVt S^T and T are dead before the decay's tiles load
        p_a = o_t[:, None] * (H * BT) + tl.arange(0, BT)[None, :]
        if VT_X or not DV_W:
            b_beta = _load_vec(beta, o_t, m_t, H)
            b_tm = tl.load(linv + p_a, mask=m_t[:, None], other=0.0).to(tl.float32) * b_beta[None, :]
        if VT_X:
            # Vt dS'^T = T (X dS'^T), in the dot operands' precision (tf32 operands: more shared memory)
            b_dkd = tl.dot(_dot_cast(b_tm, LOWP), _dot_cast(b_dkd, LOWP))
        if DV_W:
            # the V loop summed dV S^T with dV = T^T dVt (dvt's output): d(Gamma K) = -dV S^T
            b_dkg = -b_dws
        else:
            b_dkg = tl.dot(tl.trans(_dot_cast(b_tm, LOWP)), _dot_cast(-b_dws, LOWP))
    p_k = o_t[:, None] * (H * K) + o_k[None, :]
    if SEQ:
        # (the plan's seq: GLA, the per-channel decay without the delta rule) the same terms, each tile
        # loaded where it is first needed and dead after its last use, the finished dq stored before k loads
        b_g = _load_block(gc, o_t, m_t, o_k, H, K)
        b_gl = tl.load(gc + t_last * (H * K) + o_k)
        b_eg = tl.exp(b_g)
        b_dq = b_dqs * b_eg * scale
        b_dk = b_dkd * tl.exp(tl.where(m_t[:, None], b_gl[None, :] - b_g, float("-inf")))
        b_dgl = b_dgl * tl.exp(b_gl)
        b_dg = _load_block(q, o_t, m_t, o_k, H, K) * b_dq
        b_dq += tl.load(dq + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
        tl.store(dq_out + p_k, b_dq.to(dq_out.dtype.element_ty), mask=m_t[:, None])
        b_k = _load_block(k, o_t, m_t, o_k, H, K)
        b_dg -= b_k * b_dk
        b_dgl += tl.sum(b_k * b_dk, 0)
        b_dk += tl.load(dk + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
        tl.store(dk_out + p_k, b_dk.to(dk_out.dtype.element_ty), mask=m_t[:, None])
        b_dg = tl.where(o_t[:, None] == t_last, b_dg + b_dgl[None, :], b_dg)
        b_dg += tl.load(dgk + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
        b_dg = _rev_cumsum_by_dot(b_dg, BT, LOWP)
        tl.store(dg + p_k, b_dg.to(dg.dtype.element_ty), mask=m_t[:, None])
    else:
        b_q = _load_block(q, o_t, m_t, o_k, H, K)
        b_k = _load_block(k, o_t, m_t, o_k, H, K)
        if DECAY == "channel":
            b_g = _load_block(gc, o_t, m_t, o_k, H, K)
            b_gl = tl.load(gc + t_last * (H * K) + o_k)
            b_eg = tl.exp(b_g)
            b_ed = tl.exp(tl.where(m_t[:, None], b_gl[None, :] - b_g, float("-inf")))
            b_dgl = b_dgl * tl.exp(b_gl)
        elif DECAY == "scalar":
            b_g = _load_vec(gc, o_t, m_t, H)
            b_gl = tl.load(gc + t_last * H)
            b_0 = tl.zeros([BT, BK], dtype=tl.float32)
            b_eg = tl.exp(b_g)[:, None] + b_0
            b_ed = tl.exp(tl.where(m_t, b_gl - b_g, float("-inf")))[:, None] + b_0
            b_dgl = b_dgl * tl.exp(b_gl)
        else:
            b_eg = tl.full([BT, BK], 1.0, dtype=tl.float32)
            b_ed = tl.full([BT, BK], 1.0, dtype=tl.float32)
        # O = scale (Q Gamma) S: dq = scale (dO S^T) Gamma, and the log-decay sees q * dq
        b_dq = b_dqs * b_eg * scale
        b_dg = b_q * b_dq
        # S' = Gamma_last S + K_d^T Vt with K_d = K Gamma_last / Gamma
        b_dk = b_dkd * b_ed
        b_dg -= b_k * b_dk
        b_dgl += tl.sum(b_k * b_dk, 0)
        if DELTA:
            b_dkg = b_dkg * b_eg
            b_dk += b_dkg
            b_dg += b_k * b_dkg
        if FUSED:
            # A_qk = scale tril(Q K^T) (times exp(G_r - G_i)): dq += M K, dk += M^T Q with M = dA_qk, and the
            # log-decay sees q * dq - k * dk of these terms (fp32 operands, as in _intra_bwd_kernel)
            o_c = i_t * BT + tl.arange(0, BT)
            m_m = (o_t[:, None] >= o_c[None, :]) & m_t[:, None] & m_t[None, :]
            if DECAY == "scalar":
                b_dp = b_dp * tl.exp(tl.where(m_m, b_g[:, None] - b_g[None, :], float("-inf")))
            b_m = tl.where(m_m, b_dp, 0.0) * scale
            b_dqi = tl.dot(b_m, b_k)
            b_dki = tl.dot(tl.trans(b_m), b_q)
            b_dq += b_dqi
            b_dk += b_dki
            b_dg += b_q * b_dqi - b_k * b_dki
        # the carried state's decay exp(G_last) and K_d's numerator both hang on the last row's G
        b_dg = tl.where(o_t[:, None] == t_last, b_dg + b_dgl[None, :], b_dg)
        if FINISH:
            b_dq += tl.load(dq + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
            tl.store(dq_out + p_k, b_dq.to(dq_out.dtype.element_ty), mask=m_t[:, None])
            b_dk += tl.load(dk + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
            tl.store(dk_out + p_k, b_dk.to(dk_out.dtype.element_ty), mask=m_t[:, None])
            # G = chunk-local cumsum(g): dg is the reverse cumsum of dG inside the chunk (rows past T hold 0)
            b_dg += tl.load(dgk + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
            b_dg = _rev_cumsum_by_dot(b_dg, BT, LOWP)
            tl.store(dg + p_k, b_dg.to(dg.dtype.element_ty), mask=m_t[:, None])
        else:
            tl.store(dq + p_k, b_dq.to(dq.dtype.element_ty), mask=m_t[:, None])
            tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_t[:, None])
            # without a decay nothing reads dG (linear attention and the delta rule: 0.54 GB of fp32 at B8 T8K
            # H16 that used to be written and never read)
            if DECAY != "none":
                tl.store(dgk + p_k, b_dg, mask=m_t[:, None])


def dqk_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None,
    scale: float,
    do: torch.Tensor,
    saved: Saved,
    dh: torch.Tensor,
    dvt: torch.Tensor,
    grads: Grads,
    bp: BackwardPlan,
) -> None:
    """dq, dk and dG of every chunk into grads: partial (grads.dq, grads.dk, grads.dgk) for the intra backward
    to finish, or final (grads.dq_out, grads.dk_out, grads.dg) where the plan has dqk last (`first`)."""
    p = bp.problem
    B, T, H, K, V, BT, NT = p.B, p.T, p.H, p.K, p.V, p.chunk_size, p.NT
    delta = p.delta_rule
    # two kernels instead of one per chunk, for smaller register tiles: dq, dk, dG per K block of 64
    # (three [BT, BK] accumulators over the V loop), and the [BT, BT] matrices (M_qk, M_kk, dbeta, dv)
    BK, BVd = bp.dqk_bk, bp.dqk_bv
    dv_w, vt_x = bp.dv_w, bp.vt_x
    g = grads
    _dqk_bwd_kernel[(K // BK, NT, B * H) if bp.k_inner else (NT, K // BK, B * H)](
        (q, k),
        (g.dq, g.dk, g.dgk, g.dq_out, g.dk_out, g.dg),
        ((saved.x if vt_x else saved.vt) if delta else v, do, g.dv if dv_w else dvt),
        saved.gc,
        beta,
        saved.linv,
        (saved.h, dh),
        scale,
        T,
        NT,
        H=H,
        K=K,
        V=V,
        BT=BT,
        BK=BK,
        BV=BVd,
        DECAY=p.decay,
        K_INNER=bp.k_inner,
        VT_X=vt_x,
        num_warps=bp.dqk.warps,
        num_stages=bp.dqk.stages,
    )
