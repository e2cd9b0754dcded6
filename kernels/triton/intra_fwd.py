"""Stage 2 of the forward: the intra-chunk matrices A_qk = scale tril(rel(Q, K)) and, with the delta rule,
A_kk = strict_tril(diag(beta) rel(K, K)), one program per 16-row block; with the per-channel decay also the
decayed operands Q exp(G), K exp(G_last - G), exp(G) K for the later stages. Branches on DECAY ("none",
"scalar": the whole chunk in one tile; "channel": block by block, triangular, BOUNDED's dense diagonal) and on
DELTA (A_kk).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from kernels.triton.common import (
    BC,
    EX2_FTZ,
    G16_STEPS,
    _decay_head,
    _dot_cast,
    _exp,
    _head,
    _load_row,
    _load_rows,
    _load_vec,
    _pdl_start,
    _rows,
)

if TYPE_CHECKING:
    from kernels.triton.plan import ForwardPlan


@triton.jit
def _store_decayed(
    qg, kd, kg, b_q, b_k, b_g, b_gl, o_r, m_r, H: tl.constexpr, K: tl.constexpr, DELTA: tl.constexpr,
):  # fmt: skip
    # the decayed operands of rows o_r (G of the rows in b_g, of the chunk's last row in b_gl), written once
    # by the intra kernel for the later ones: Q exp(G) (queries read the state from the chunk start: the
    # output, the reverse state pass), K exp(G_last - G) (keys carried to the chunk's end: both state
    # passes) and, with the delta rule, K exp(G) (W/U and the dvt backward)
    p_rk = o_r[:, None] * (H * K) + tl.arange(0, K)[None, :]
    b_eg = tl.exp(tl.where(m_r[:, None], b_g, 0.0))
    tl.store(qg + p_rk, (b_q * b_eg).to(qg.dtype.element_ty), mask=m_r[:, None])
    b_kdr = b_k * tl.exp(tl.where(m_r[:, None], b_gl[None, :] - b_g, 0.0))
    tl.store(kd + p_rk, b_kdr.to(kd.dtype.element_ty), mask=m_r[:, None])
    if DELTA:
        tl.store(kg + p_rk, (b_k * b_eg).to(kg.dtype.element_ty), mask=m_r[:, None])


@triton.jit
def _intra_fwd_kernel(
    q,
    k,
    gc,
    gq,
    akk,
    aqk,
    qg,
    kd,
    kg,
    scale,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    DECAY: tl.constexpr,
    BOUNDED: tl.constexpr,
    ZERO: tl.constexpr,
    LOG2: tl.constexpr,
    PDL: tl.constexpr,
):
    # rows [r0, r0 + BC) of A_qk = scale * tril(Q Gamma (K / Gamma)^T) and A_kk = strict_tril(...K...); the
    # per-channel decay in _intra_fwd_tri, one BC-column block at a time. A buffer a launch does not read or
    # write is None (gq: the plan's g16). ZERO: the blocks above the diagonal stored as zeros, in "none"
    # (the plan's tril), "qk" (A_qk's) or "both" (A_kk's too: the dvt backward reads whole rows).
    # Switches that the buffers already say: the delta rule is the launch with A_kk, and 16-bit inputs take
    # bf16 dot operands
    DELTA: tl.constexpr = akk is not None
    LOWP: tl.constexpr = q.dtype.element_ty != tl.float32
    _pdl_start(PDL)
    i_tc, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    # the program's base pointers: its head's rows
    bh = _head(i_bh, T, H)
    q, k = _rows((q, k), bh, K)
    aqk += bh * BT
    if DELTA:
        akk += bh * BT
    if DECAY != "none":
        gc = _decay_head(gc, bh, K, DECAY)
    if gq is not None:
        gq += bh * K
    if DECAY == "channel":
        qg, kd = _rows((qg, kd), bh, K)
        if DELTA:
            kg += bh * K
    NC: tl.constexpr = BT // BC
    i_t, i_c = i_tc // NC, i_tc % NC
    if DECAY == "channel":
        _intra_fwd_tri(
            q,
            k,
            gc,
            gq,
            akk,
            aqk,
            qg,
            kd,
            kg,
            scale,
            T,
            i_t,
            i_c,
            H,
            K,
            BT,
            BC,
            DELTA,
            BOUNDED,
            LOWP,
            ZERO,
            LOG2,
        )
    else:
        t0 = i_t * BT
        r0 = t0 + i_c * BC
        o_r = r0 + tl.arange(0, BC)  # rows of this block
        o_i = t0 + tl.arange(0, BT)  # columns: the whole chunk
        m_r, m_i = o_r < T, o_i < T
        b_q = _load_rows(q, o_r, m_r, H, K)  # [BC, K]
        b_kr = _load_rows(k, o_r, m_r, H, K)  # [BC, K]
        b_ki = _load_rows(k, o_i, m_i, H, K)  # [BT, K]
        b_aqk = tl.dot(_dot_cast(b_q, LOWP), tl.trans(_dot_cast(b_ki, LOWP)))
        b_akk = tl.dot(_dot_cast(b_kr, LOWP), tl.trans(_dot_cast(b_ki, LOWP)))
        if DECAY == "scalar":
            b_gr = _load_vec(gc, o_r, m_r, H)
            b_gi = _load_vec(gc, o_i, m_i, H)
            m_d = (o_r[:, None] >= o_i[None, :]) & m_i[None, :]
            b_d = tl.exp(tl.where(m_d, b_gr[:, None] - b_gi[None, :], float("-inf")))
            b_aqk = b_aqk * b_d
            b_akk = b_akk * b_d
        b_aqk = tl.where((o_r[:, None] >= o_i[None, :]) & m_i[None, :], b_aqk, 0.0) * scale
        p_a = o_r[:, None] * (H * BT) + tl.arange(0, BT)[None, :]
        tl.store(aqk + p_a, b_aqk.to(aqk.dtype.element_ty), mask=m_r[:, None])
        if DELTA:
            b_akk = tl.where((o_r[:, None] > o_i[None, :]) & m_i[None, :], b_akk, 0.0)
            tl.store(akk + p_a, b_akk, mask=m_r[:, None])


@triton.jit
def _fwd_diag_by_positions(
    k,
    gc,
    akk,
    aqk,
    b_q,
    b_kr,
    b_gr,
    scale,
    T,
    r0,
    i_c,
    o_r,
    m_r,
    p_row,
    H: tl.constexpr,
    K: tl.constexpr,
    BC: tl.constexpr,
    DELTA: tl.constexpr,
):
    o_b = tl.arange(0, BC)
    # the diagonal block, one column at a time with the exact relative decay (masked before the exp)
    o_k = tl.arange(0, K)
    p_kj = k + r0 * (H * K) + o_k
    p_gj = gc + r0 * (H * K) + o_k
    b_aq = tl.zeros([BC, BC], dtype=tl.float32)
    b_ak = tl.zeros([BC, BC], dtype=tl.float32)
    for j in range(BC):
        t_j = r0 + j
        m_kj = (o_k * 0 + t_j) < T
        b_kj = tl.load(p_kj + j * H * K, mask=m_kj, other=0.0).to(tl.float32)
        b_gj = tl.load(p_gj + j * H * K, mask=m_kj, other=0.0)
        m_e = (o_r[:, None] >= t_j) & m_r[:, None] & m_kj[None, :]
        b_e = tl.exp(tl.where(m_e, b_gr - b_gj[None, :], float("-inf")))  # [BC, K]
        b_aq = tl.where(o_b[None, :] == j, tl.sum(b_q * b_kj[None, :] * b_e, 1)[:, None], b_aq)
        b_ak = tl.where(o_b[None, :] == j, tl.sum(b_kr * b_kj[None, :] * b_e, 1)[:, None], b_ak)
    o_j = r0 + o_b
    m_j = o_j < T
    p_a = p_row + (i_c * BC + o_b)[None, :]
    b_aq = tl.where((o_r[:, None] >= o_j[None, :]) & m_j[None, :], b_aq, 0.0) * scale
    tl.store(aqk + p_a, b_aq.to(aqk.dtype.element_ty), mask=m_r[:, None])
    if DELTA:
        tl.store(
            akk + p_a,
            tl.where((o_r[:, None] > o_j[None, :]) & m_j[None, :], b_ak, 0.0),
            mask=m_r[:, None],
        )


@triton.jit
def _fwd_block(
    aqk,
    akk,
    b_qe,
    b_ke,
    b_y,
    o_r,
    m_r,
    o_j,
    m_j,
    p_a,
    scale,
    LOWP: tl.constexpr,
    DELTA: tl.constexpr,
    OFF_DIAG: tl.constexpr = 0,
):
    # the block (rows o_r, columns o_j) of A_qk and A_kk from the rows' decayed q, k and the columns' keys
    # b_y. OFF_DIAG: a block before the rows' own, whose columns past T hold keys of 0: no mask to apply
    b_y = tl.trans(_dot_cast(b_y, LOWP))
    b_a = tl.dot(b_qe, b_y)
    if OFF_DIAG:
        b_a = b_a * scale
    else:
        b_a = tl.where((o_r[:, None] >= o_j[None, :]) & m_j[None, :], b_a, 0.0) * scale
    tl.store(aqk + p_a, b_a.to(aqk.dtype.element_ty), mask=m_r[:, None])
    if DELTA:
        b_a = tl.dot(b_ke, b_y)
        if OFF_DIAG:
            tl.store(akk + p_a, b_a, mask=m_r[:, None])
        else:
            tl.store(
                akk + p_a, tl.where((o_r[:, None] > o_j[None, :]) & m_j[None, :], b_a, 0.0), mask=m_r[:, None]
            )


@triton.jit
def _intra_fwd_tri(
    q,
    k,
    gc,
    gq,
    akk,
    aqk,
    qg,
    kd,
    kg,
    scale,
    T,
    i_t,
    i_c,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    DELTA: tl.constexpr,
    BOUNDED: tl.constexpr,
    LOWP: tl.constexpr,
    ZERO: tl.constexpr,
    LOG2: tl.constexpr,
):
    # the per-channel decay's rows [r0, r0 + BC) of A_qk and A_kk one BC-column block at a time, over only the
    # blocks the rows reach (0..i_c; the unbounded path's diagonal block by positions); the blocks after the
    # diagonal are stored as zeros
    t0 = i_t * BT
    r0 = t0 + i_c * BC
    o_b = tl.arange(0, BC)
    o_r = r0 + o_b
    m_r = o_r < T
    b_q = _load_rows(q, o_r, m_r, H, K)  # [BC, K]
    b_kr = _load_rows(k, o_r, m_r, H, K)
    b_ga = _load_row(gc, tl.minimum(r0, T - 1), T, H, K)  # anchor: the block's first row
    if gq is not None:
        # (the plan's g16) the rows' decays from the anchor, G_a - G_r (>= 0, log2 units), from uint16
        b_dr = _load_rows(gq, o_r, m_r, H, K) * (1.0 / G16_STEPS)
    else:
        b_gr = _load_rows(gc, o_r, m_r, H, K)
        b_dr = b_ga[None, :] - b_gr
    # LOG2: G comes times log2(e) from the cumsum kernel, every exponential here a 2^x without the multiply.
    # The launch sets it for the bounded gate only, the only form here whose every use of G is an
    # exponential through _exp
    b_er = _exp(tl.where(m_r[:, None], -b_dr, float("-inf")), EX2_FTZ, LOG2)  # <= 1
    if BOUNDED:
        # the decayed operands from the products' own fp32 tiles of exponentials E_r = exp(G - G_a) and
        # E_d = exp(G_a - G) (<= e^{-lower_bound (BC - 1)}) times [K] vectors: Q exp(G) = Q E_r exp(G_a),
        # K exp(G_last - G) = K E_d exp(G_last - G_a); two tiles of exponentials a program instead of four
        # (the diagonal block's keys are K E_d)
        b_ed = _exp(tl.where(m_r[:, None], b_dr, float("-inf")), EX2_FTZ, LOG2)
        b_qr = b_q * b_er
        b_kr_e = b_kr * b_er
        b_kd_e = b_kr * b_ed
        b_gl = _load_row(gc, tl.minimum(t0 + BT, T) - 1, T, H, K)
        p_rk = o_r[:, None] * (H * K) + tl.arange(0, K)[None, :]
        b_ea = _exp(b_ga, EX2_FTZ, LOG2)[None, :]
        tl.store(qg + p_rk, (b_qr * b_ea).to(qg.dtype.element_ty), mask=m_r[:, None])
        b_el = _exp(b_gl - b_ga, EX2_FTZ, LOG2)[None, :]
        tl.store(kd + p_rk, (b_kd_e * b_el).to(kd.dtype.element_ty), mask=m_r[:, None])
        if DELTA:
            tl.store(kg + p_rk, (b_kr_e * b_ea).to(kg.dtype.element_ty), mask=m_r[:, None])
        b_qe = _dot_cast(b_qr, LOWP)
        b_ke = _dot_cast(b_kr_e, LOWP)
    else:
        b_gl = _load_row(gc, tl.minimum(t0 + BT, T) - 1, T, H, K)
        _store_decayed(qg, kd, kg, b_q, b_kr, b_gr, b_gl, o_r, m_r, H, K, DELTA)
        b_qe = _dot_cast(b_q * b_er, LOWP)
        b_ke = _dot_cast(b_kr * b_er, LOWP)
    p_row = o_r[:, None] * (H * BT)
    if BOUNDED:
        # first the diagonal block, its keys decayed to the anchor (E_d dies here, before the loop)
        _fwd_block(
            aqk,
            akk,
            b_qe,
            b_ke,
            b_kd_e,
            o_r,
            m_r,
            o_r,
            m_r,
            p_row + (i_c * BC + o_b)[None, :],
            scale,
            LOWP,
            DELTA,
        )
    dense = 0
    # the bounded gate keeps exp(G_r0 - G_i) <= e^{-lower_bound (BC - 1)} inside the diagonal block too
    if BOUNDED:
        n_j = i_c  # (the diagonal block before the loop)
    else:
        # unbounded gates: a block whose own decay, first row to last, is at most e^75 in every channel (what
        # the bounded gate -5 guarantees) takes the dense product for its diagonal block as well; the others
        # go by positions
        b_gb = _load_row(gc, tl.minimum(r0 + BC, T) - 1, T, H, K)
        dense = (tl.max(b_ga - b_gb, 0) <= 75.0).to(tl.int64)
        n_j = i_c + dense
    for j in range(0, n_j):
        o_j = t0 + j * BC + o_b
        m_j = o_j < T
        if gq is not None:
            # G_a - G_j = (G_a - G at block j's first row) + block j's own decays
            b_dj = (b_ga - _load_row(gc, t0 + j * BC, T, H, K))[None, :] + _load_rows(
                gq, o_j, m_j, H, K
            ) * (1.0 / G16_STEPS)
        else:
            b_dj = b_ga[None, :] - _load_rows(gc, o_j, m_j, H, K)  # G_a - G of the columns
        b_y = _load_rows(k, o_j, m_j, H, K)
        b_y = b_y * _exp(tl.where(m_j[:, None], b_dj, float("-inf")), EX2_FTZ, LOG2)
        _fwd_block(
            aqk,
            akk,
            b_qe,
            b_ke,
            b_y,
            o_r,
            m_r,
            o_j,
            m_j,
            p_row + (j * BC + o_b)[None, :],
            scale,
            LOWP,
            DELTA,
            BOUNDED,  # (the diagonal block before the loop there)
        )
    # the diagonal block by positions: the blocks of an unbounded gate too steep to go dense
    if not BOUNDED:
        if dense == 0:
            _fwd_diag_by_positions(
                k,
                gc,
                akk,
                aqk,
                b_q,
                b_kr,
                b_gr,
                scale,
                T,
                r0,
                i_c,
                o_r,
                m_r,
                p_row,
                H,
                K,
                BC,
                DELTA,
            )
    # the blocks after the diagonal: zeros (the output kernel and the backward read whole rows)
    o_c = tl.arange(0, BT)
    m_z = m_r[:, None] & (o_c[None, :] >= (i_c + 1) * BC)
    b_z = tl.zeros([BC, BT], dtype=tl.float32)
    if ZERO != "none":
        # (not where the state pass loads A_qk block lower-triangular, the plan's tril)
        tl.store(aqk + p_row + o_c[None, :], b_z.to(aqk.dtype.element_ty), mask=m_z)
    if DELTA and ZERO == "both":
        # (the solve reads only the blocks up to the diagonal; the dvt backward reads whole rows)
        tl.store(akk + p_row + o_c[None, :], b_z, mask=m_z)


def _akk_dtype(lowp: bool, keep: bool) -> torch.dtype:
    # A_kk in bf16 for 16-bit inputs without a gradient, where the solve is its only reader; fp32 otherwise
    # (the dvt backward reads it too)
    return torch.bfloat16 if lowp and not keep else torch.float32


def intra_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    gc: torch.Tensor | None,
    gq: torch.Tensor | None,
    scale: float,
    fp: ForwardPlan,
) -> tuple[torch.Tensor, ...]:
    """(A_qk, A_kk or None, Q exp(G), K exp(G_last - G), exp(G) K): the last three for the per-channel
    decay only (the delta rule's for exp(G) K), else None."""
    p = fp.problem
    B, T, H, K, BT, NT = p.B, p.T, p.H, p.K, p.chunk_size, p.NT
    decay, delta, lowp, keep = p.decay, p.delta_rule, p.lowp, p.keep
    dev = q.device
    qg = kd = kg = None
    if decay == "channel":
        # decayed queries and keys for the later kernels; they only ever feed dots (bf16 operands for 16-bit
        # inputs), so they are kept in that precision; Gamma K for W/U and the dvt backward
        qg = torch.empty(B, T, H, K, device=dev, dtype=torch.bfloat16 if lowp else torch.float32)
        kd = torch.empty_like(qg)
        kg = torch.empty_like(qg) if delta else None
    # A_qk only ever feeds dots, so 16-bit inputs keep it in bf16 (their dot operands' precision)
    aqk = torch.empty(B, T, H, BT, device=dev, dtype=torch.bfloat16 if lowp else torch.float32)
    akk = torch.empty(B, T, H, BT, device=dev, dtype=_akk_dtype(lowp, keep)) if delta else None
    _intra_fwd_kernel[(NT * (BT // BC), B * H)](
        q,
        k,
        gc,
        gq,
        akk,
        aqk,
        qg,
        kd,
        kg,
        scale,
        T,
        H=H,
        K=K,
        BT=BT,
        BC=BC,
        DECAY=decay,
        BOUNDED=p.bounded,
        # (keep and the plan's tril exclude each other: A_kk's zeros come with A_qk's)
        ZERO="both" if keep else ("none" if fp.tril else "qk"),
        LOG2=fp.log2,
        PDL=fp.pdl,
        **({"launch_pdl": True} if fp.pdl else {}),
        num_warps=fp.intra.warps,
        num_stages=fp.intra.stages,
        maxnreg=fp.intra.maxnreg,
    )
    return aqk, akk, qg, kd, kg
