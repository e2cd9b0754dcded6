"""The block products of the intra backward (intra_bwd.py): for rel(x, y)_ri = sum_c x_rc y_ic exp(G_rc -
G_ic), the row side rel_rows(M, y) and the column side rel_cols(M, x) over whole chunks (no decay or the
scalar one) or over 16-column blocks up to the diagonal (the per-channel decay), and the unbounded
per-channel diagonal block one position at a time. Branches on DECAY; the diagonal on DELTA (M_kk).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton.common import EX2_FTZ, _dot_cast, _exp, _load_block, _load_row_block, _load_vec


@triton.jit
def _rel_rows(
    m,
    m2,
    y,
    gc,
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
    TWO: tl.constexpr,
    LOWP: tl.constexpr,
):
    # X'_r = sum_{i <= r} M_ri y_i exp(G_r - G_i) for the BC rows o_r and the key columns o_k (M is lower
    # triangular), for M = m and, with TWO, also M = m2 (same y: the decay factors are shared). Returns
    # (X' for m, X' for m2 or again for m). No decay or the scalar one (_rel_rows_tri: the per-channel decay).
    p_m = o_r[:, None] * (H * BT) + (o_i - t0)[None, :]
    b_m = tl.load(m + p_m, mask=m_r[:, None], other=0.0).to(tl.float32)
    b_y = _load_block(y, o_i, m_i, o_k, H, K)  # [BT, BK]
    if DECAY == "scalar":
        b_gr = _load_vec(gc, o_r, m_r, H)
        b_gi = _load_vec(gc, o_i, m_i, H)
        m_d = (o_r[:, None] >= o_i[None, :]) & m_i[None, :]
        b_d = tl.exp(tl.where(m_d, b_gr[:, None] - b_gi[None, :], float("-inf")))
        b_x = tl.dot(_dot_cast(b_m * b_d, LOWP), _dot_cast(b_y, LOWP))
        if TWO:
            b_m2 = tl.load(m2 + p_m, mask=m_r[:, None], other=0.0).to(tl.float32)
            b_x2 = tl.dot(_dot_cast(b_m2 * b_d, LOWP), _dot_cast(b_y, LOWP))
        else:
            b_x2 = b_x
    else:
        b_x = tl.dot(_dot_cast(b_m, LOWP), _dot_cast(b_y, LOWP))
        if TWO:
            b_m2 = tl.load(m2 + p_m, mask=m_r[:, None], other=0.0).to(tl.float32)
            b_x2 = tl.dot(_dot_cast(b_m2, LOWP), _dot_cast(b_y, LOWP))
        else:
            b_x2 = b_x
    return b_x, b_x2


@triton.jit
def _rel_cols(
    m,
    x,
    m2,
    x2,
    gc,
    o_c,
    m_c,
    o_r,
    m_r,
    o_k,
    t0,
    c0,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    DECAY: tl.constexpr,
    TWO: tl.constexpr,
    LOWP: tl.constexpr,
):
    # Y'_i = sum_{r >= i} M_ri x_r exp(G_r - G_i) for the BC columns o_c and the key columns o_k; o_r runs
    # over the chunk. With TWO, the sum of it for (m, x) and for (m2, x2) (the decay factors are shared).
    # No decay or the scalar one (_rel_cols_tri: the per-channel decay).
    p_mt = o_r[None, :] * (H * BT) + (o_c - t0)[:, None]
    b_mt = tl.load(m + p_mt, mask=m_r[None, :], other=0.0).to(tl.float32)
    b_x = _load_block(x, o_r, m_r, o_k, H, K)  # [BT, BK]
    if TWO:
        b_mt2 = tl.load(m2 + p_mt, mask=m_r[None, :], other=0.0).to(tl.float32)
        b_x2 = _load_block(x2, o_r, m_r, o_k, H, K)  # [BT, BK]
    if DECAY == "scalar":
        b_gc = _load_vec(gc, o_c, m_c, H)
        b_gr = _load_vec(gc, o_r, m_r, H)
        m_d = (o_r[None, :] >= o_c[:, None]) & m_r[None, :]
        b_d = tl.exp(tl.where(m_d, b_gr[None, :] - b_gc[:, None], float("-inf")))  # [BC, BT]
        b_y = tl.dot(_dot_cast(b_mt * b_d, LOWP), _dot_cast(b_x, LOWP))
        if TWO:
            b_y += tl.dot(_dot_cast(b_mt2 * b_d, LOWP), _dot_cast(b_x2, LOWP))
    else:
        b_y = tl.dot(_dot_cast(b_mt, LOWP), _dot_cast(b_x, LOWP))
        if TWO:
            b_y += tl.dot(_dot_cast(b_mt2, LOWP), _dot_cast(b_x2, LOWP))
    return b_y


@triton.jit
def _rel_rows_tri(
    m,
    m2,
    y,
    gc,
    o_r,
    m_r,
    o_k,
    t0,
    r0,
    i_c,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BOUNDED: tl.constexpr,
    TWO: tl.constexpr,
    LOWP: tl.constexpr,
    dense,
):
    # _rel_rows for the per-channel decay over only the column blocks the rows can reach (0..i_c, or 0..i_c-1
    # when the unbounded path leaves the diagonal to _rel_diag), one BC-column block at a time, instead of
    # the whole chunk masked: 2.5 blocks of y and G on average instead of 4
    o_b = tl.arange(0, BC)
    b_gr = _load_block(gc, o_r, m_r, o_k, H, K)
    b_ga = _load_row_block(gc, tl.minimum(r0, T - 1), o_k, T, H, K)
    b_x = tl.zeros([BC, o_k.shape[0]], dtype=tl.float32)
    b_x2 = tl.zeros([BC, o_k.shape[0]], dtype=tl.float32)
    if BOUNDED:
        n_j = i_c + 1
    else:
        n_j = i_c + dense  # (dense: this block's diagonal goes dense, see _intra_bwd_kernel)
    for j in range(0, n_j):
        o_j = t0 + j * BC + o_b
        m_j = o_j < T
        b_gj = _load_block(gc, o_j, m_j, o_k, H, K)
        b_yj = _load_block(y, o_j, m_j, o_k, H, K)
        b_ej = _exp(tl.where(m_j[:, None], b_ga[None, :] - b_gj, float("-inf")), EX2_FTZ)
        b_yj = _dot_cast(b_yj * b_ej, LOWP)
        p_m = o_r[:, None] * (H * BT) + (j * BC + o_b)[None, :]
        b_x += tl.dot(_dot_cast(tl.load(m + p_m, mask=m_r[:, None], other=0.0).to(tl.float32), LOWP), b_yj)
        if TWO:
            b_x2 += tl.dot(
                _dot_cast(tl.load(m2 + p_m, mask=m_r[:, None], other=0.0).to(tl.float32), LOWP), b_yj
            )
    b_er = _exp(tl.where(m_r[:, None], b_gr - b_ga[None, :], float("-inf")), EX2_FTZ)
    b_x = b_x * b_er
    if TWO:
        b_x2 = b_x2 * b_er
    else:
        b_x2 = b_x
    return b_x, b_x2


@triton.jit
def _rel_cols_tri(
    m,
    x,
    m2,
    x2,
    gc,
    o_c,
    m_c,
    o_k,
    t0,
    c0,
    i_c,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BOUNDED: tl.constexpr,
    TWO: tl.constexpr,
    LOWP: tl.constexpr,
    dense,
    b_gd,
):
    # _rel_cols for the per-channel decay over only the row blocks that reach the columns (i_c..NC-1, or
    # i_c+1.. on the unbounded path), one BC-row block at a time
    NC: tl.constexpr = BT // BC
    o_b = tl.arange(0, BC)
    b_gc = _load_block(gc, o_c, m_c, o_k, H, K)
    if BOUNDED:
        b_ga = _load_row_block(gc, tl.minimum(c0, T - 1), o_k, T, H, K)
        j0 = i_c
    else:
        # b_gd: G at the block's first row if it is dense (it then includes itself, as with the bounded gate),
        # else at its last valid row (from _intra_bwd_kernel, which loaded both to decide)
        b_ga = b_gd
        j0 = i_c + 1 - dense
    b_y = tl.zeros([BC, o_k.shape[0]], dtype=tl.float32)
    for j in range(j0, NC):
        o_j = t0 + j * BC + o_b
        m_j = o_j < T
        b_ex = _exp(
            tl.where(
                m_j[:, None], _load_block(gc, o_j, m_j, o_k, H, K) - b_ga[None, :], float("-inf")
            ),
            EX2_FTZ,
        )
        p_mt = o_j[None, :] * (H * BT) + (o_c - t0)[:, None]  # [BC columns, BC rows]
        b_xj = _load_block(x, o_j, m_j, o_k, H, K)
        b_y += tl.dot(
            _dot_cast(tl.load(m + p_mt, mask=m_j[None, :], other=0.0).to(tl.float32), LOWP),
            _dot_cast(b_xj * b_ex, LOWP),
        )
        if TWO:
            b_x2j = _load_block(x2, o_j, m_j, o_k, H, K)
            b_y += tl.dot(
                _dot_cast(tl.load(m2 + p_mt, mask=m_j[None, :], other=0.0).to(tl.float32), LOWP),
                _dot_cast(b_x2j * b_ex, LOWP),
            )
    return b_y * _exp(tl.where(m_c[:, None], b_ga[None, :] - b_gc, float("-inf")), EX2_FTZ)


@triton.jit
def _rel_diag(
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
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    DELTA: tl.constexpr,
):
    # the diagonal BC x BC block of the unbounded per-channel path, one position t_j = r0 + j at a time with
    # the exact exp(G_r - G_j), masked before the exp: column j of M times k_j for the rows (dq from M_qk,
    # with DELTA dkr from M_kk) and row j of M times q_j (and k_j) for the columns (dkc). One loop serves
    # both sides, so each j loads G_j, k_j, q_j once and computes each of its two [BC, BK] exponentials once.
    b_g = _load_block(gc, o_r, m_r, o_k, H, K)  # [BC, BK]
    p_j = r0 * (H * K) + o_k  # row r0 (+ j H K), columns o_k
    p_mc = o_r * (H * BT) + (r0 - t0)  # column r0 - t0 (+ j) of M, rows o_r
    p_mr = r0 * (H * BT) + (o_r - t0)  # row r0 (+ j), columns o_r - t0 of M
    for j in range(BC):
        t_j = r0 + j
        m_kj = (o_k * 0 + t_j) < T
        m_cj = (o_r * 0 + t_j) < T
        p = p_j + j * H * K
        b_kj = tl.load(k + p, mask=m_kj, other=0.0).to(tl.float32)
        b_qj = tl.load(q + p, mask=m_kj, other=0.0).to(tl.float32)
        b_gj = tl.load(gc + p, mask=m_kj, other=0.0)
        # rows r >= t_j: sum over the column j of M
        # (rows past T masked too: their G is 0, and exp(0 - G_j) overflows)
        m_e = m_r[:, None] & m_kj[None, :]
        b_e = tl.exp(tl.where((o_r[:, None] >= t_j) & m_e, b_g - b_gj[None, :], float("-inf")))
        b_ke = b_kj[None, :] * b_e
        b_dq += tl.load(m_qk + p_mc + j, mask=m_r, other=0.0).to(tl.float32)[:, None] * b_ke
        # columns c <= t_j: row j of M
        b_e = tl.exp(tl.where((o_r[:, None] <= t_j) & m_e, b_gj[None, :] - b_g, float("-inf")))
        b_mq = tl.load(m_qk + p_mr + j * H * BT, mask=m_cj, other=0.0).to(tl.float32)  # [BC]
        if DELTA:
            b_dkr += tl.load(m_kk + p_mc + j, mask=m_r, other=0.0).to(tl.float32)[:, None] * b_ke
            b_mk = tl.load(m_kk + p_mr + j * H * BT, mask=m_cj, other=0.0).to(tl.float32)  # [BC]
            b_dkc += (b_mq[:, None] * b_qj[None, :] + b_mk[:, None] * b_kj[None, :]) * b_e
        else:
            b_dkc += b_mq[:, None] * b_qj[None, :] * b_e
    return b_dq, b_dkr, b_dkc
