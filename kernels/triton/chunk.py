"""Chunkwise Triton kernels for the whole family (docs/design.md §1), forward and backward.

Two compile-time switches select the op: DECAY (0 none, 1 scalar per head, 2 per key channel) and
DELTA (delta rule off/on). The derivation, the buffers kept for the backward and why, and the
bounded-gate fast path are in README.md beside this file. Pipeline (one program per chunk unless said):

    forward : cumsum(g) -> intra (A_qk, A_kk, per 16-row block) -> solve (L = (I + diag(beta) A_kk)^-1,
              W, U; delta only) -> state pass (sequential over chunks, per V block) -> output
    backward: reverse state pass (dS per chunk, dVt) -> dense per-chunk grads (dq/dk/dG per K block;
              M_qk, M_kk, dv, dbeta) -> intra-chunk relative grads (per 16-row block and K block) ->
              reverse cumsum of dG (torch)
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

try:  # grid dependency control (programmatic dependent launch, sm_90+), TUNE["fwd.pdl"]
    import triton.language.extra.cuda  # noqa: F401

    HAS_GDC = hasattr(tl.extra.cuda, "gdc_wait")
except ImportError:
    HAS_GDC = False

# The interpreter runs on the CPU: one config, no autotune, and fp32 dots only (the caller's job).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Sub-chunk edge: the diagonal blocks of the per-channel decay are handled 16 rows at a time.
BC = 16
# TUNE["fwd.g16"]: the within-block decays G_a - G (log2 units, >= 0) stored as uint16 in steps of 1/512
# (0.068% at most in an exponential, 0.039% RMS, beside bf16's 0.2% and 0.11%); the cap 65535 / 512 = 128
# is 2^128, where fp32 overflows anyway (15 steps of g < -5.9; lower_bound >= MIN_LOWER_BOUND keeps clear)
G16_STEPS = tl.constexpr(512.0)
# log2(e): exp(x) = 2^(x log2(e)); G times it where its readers take 2^x (TUNE["fwd.log2"])
LOG2E = tl.constexpr(1.4426950408889634)
# exp(-lower_bound * (BC - 1)) must stay finite in fp32/bf16 (max ~ e^88): |lower_bound| <= 5.5 leaves margin.
MIN_LOWER_BOUND = -5.5


@triton.jit
def _dot_cast(x, LOWP: tl.constexpr):
    # bf16 operands feed the tensor cores for 16-bit inputs; fp32 inputs keep fp32 (the interpreter needs it)
    if LOWP:
        return x.to(tl.bfloat16)
    else:
        return x


@triton.jit
def _exp(x, FTZ: tl.constexpr, LOG2: tl.constexpr = 0):
    # exp(x). FTZ (TUNE["intra_fwd.ftz"], compiled for a GPU only): as ex2.approx.ftz.f32 of x log2(e), one
    # MUFU.EX2 and its multiply; tl.exp's ex2.approx.f32 keeps subnormal results, which ptxas makes a compare,
    # two predicated multiplies and a select around each MUFU (sm_90 SASS). The same approximation (2^-22
    # relative) but for results under 2^-126 (1.2e-38), which become 0: decays that small change nothing.
    # LOG2 (TUNE["fwd.log2"]): x is in log2 units already (G stored times log2(e)), so 2^x, no multiply
    if LOG2:
        y = x
    else:
        y = x * LOG2E
    if FTZ:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;",
            "=f,f",
            [y],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    elif LOG2:
        return tl.exp2(x)
    else:
        return tl.exp(x)


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
def _pdl_start(PDL: tl.constexpr):
    # a kernel of the forward launched as a programmatic dependent of the one before it (TUNE["fwd.pdl"]):
    # it lets the next kernel's programs be placed once all of its own have started, then waits until the
    # kernel before it has finished and its writes are visible, before any load or store of its own. Only
    # the launch and the placing of programs overlap the previous kernel's last wave, nothing it reads
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


@triton.jit
def _cumsum_kernel(
    g,
    gc,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    DECAY: tl.constexpr,
    LOG2: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    # G = chunk-local cumsum of g (fp32); LOG2 (per-channel decay): G stored times log2(e), for readers that
    # take 2^x
    _pdl_start(PDL)
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    if DECAY == 2:
        o_k = tl.arange(0, K)
        p = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_g = tl.load(g + p, mask=m_t[:, None], other=0.0).to(tl.float32)
        b_gc = tl.cumsum(b_g, axis=0)
        if LOG2:
            tl.store(gc + p, b_gc * LOG2E, mask=m_t[:, None])
        else:
            tl.store(gc + p, b_gc, mask=m_t[:, None])
    else:
        p = (i_b * T + o_t) * H + i_h
        b_g = tl.load(g + p, mask=m_t, other=0.0).to(tl.float32)
        tl.store(gc + p, tl.cumsum(b_g, axis=0), mask=m_t)


@triton.jit
def _cumsum16_kernel(g, gc, gq, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, PDL: tl.constexpr):
    # TUNE["fwd.g16"] (the bounded gate's no-grad forward, with fwd.log2): one 16-row block of a chunk per
    # program (one warp, its rows in each thread's registers): every row's decay from the block's first
    # row a, G_a - G = -(g summed over the rows after a, up to the row), times log2(e) in steps of 1/512 as
    # uint16 (gq); G itself (times log2(e), fp32, gc) only at the block's first row and, in the block that
    # holds it, at the chunk's last valid row: the rows the intra forward and the state pass read. The
    # earlier blocks of the chunk are summed again for the prefix (from L2: their programs run alongside)
    _pdl_start(PDL)
    i_tc, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    NC: tl.constexpr = BT // 16
    i_t, i_c = i_tc // NC, i_tc % NC
    t0 = i_t * BT
    r0 = t0 + i_c * 16
    if r0 < T:
        o_k = tl.arange(0, K)
        b_s = tl.zeros([K], dtype=tl.float32)  # g summed over the chunk's rows before this block
        for j in range(0, i_c):
            o_j = t0 + j * 16 + tl.arange(0, 16)
            b_s += tl.sum(_load_rows(g, o_j, o_j < T, i_b, i_h, T, H, K), 0)
        o_r = r0 + tl.arange(0, 16)
        m_r = o_r < T
        p = ((i_b * T + o_r[:, None]) * H + i_h) * K + o_k[None, :]
        b_g = tl.load(g + p, mask=m_r[:, None], other=0.0).to(tl.float32)
        b_g0 = tl.where((tl.arange(0, 16) == 0)[:, None], b_g, 0.0)
        b_d = tl.cumsum(b_g - b_g0, axis=0) * (-LOG2E * G16_STEPS)  # >= 0 for g <= 0
        b_d = tl.minimum(tl.maximum(b_d, 0.0) + 0.5, 65535.0)  # rounded (the conversion truncates)
        tl.store(gq + p, b_d.to(tl.uint16), mask=m_r[:, None])
        b_ga = b_s + tl.sum(b_g0, 0)
        tl.store(gc + ((i_b * T + r0) * H + i_h) * K + o_k, b_ga * LOG2E)
        t_last = tl.minimum(t0 + BT, T) - 1
        if t_last < r0 + 16:
            tl.store(gc + ((i_b * T + t_last) * H + i_h) * K + o_k, (b_s + tl.sum(b_g, 0)) * LOG2E)


@triton.jit
def _rev_cumsum_kernel(dgk, dg, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, DECAY: tl.constexpr):
    # G = chunk-local cumsum(g), so dg is the reverse cumsum of dG inside each chunk (summed over K first
    # for the scalar decay), written in g's dtype
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    b_dg = _load_rows(dgk, o_t, m_t, i_b, i_h, T, H, K)
    if DECAY == 2:
        p = ((i_b * T + o_t[:, None]) * H + i_h) * K + tl.arange(0, K)[None, :]
        tl.store(dg + p, tl.cumsum(b_dg, axis=0, reverse=True).to(dg.dtype.element_ty), mask=m_t[:, None])
    else:
        b_s = tl.cumsum(tl.sum(b_dg, 1), axis=0, reverse=True)
        tl.store(dg + (i_b * T + o_t) * H + i_h, b_s.to(dg.dtype.element_ty), mask=m_t)


@triton.jit
def _load_block(x, o_t, m_t, o_d, i_b, i_h, T, H: tl.constexpr, D: tl.constexpr):
    # rows o_t, columns o_d of a [B, T, H, D] tensor for head (i_b, i_h), as fp32; invalid rows are 0
    p = x + ((i_b * T + o_t[:, None]) * H + i_h) * D + o_d[None, :]
    return tl.load(p, mask=m_t[:, None], other=0.0).to(tl.float32)


@triton.jit
def _load_row_block(x, t, o_d, i_b, i_h, T, H: tl.constexpr, D: tl.constexpr):
    # one row t, columns o_d of a [B, T, H, D] tensor as fp32 (0 if t >= T)
    return tl.load(x + ((i_b * T + t) * H + i_h) * D + o_d, mask=(o_d * 0 + t) < T, other=0.0).to(tl.float32)


@triton.jit
def _load_rows(x, o_t, m_t, i_b, i_h, T, H: tl.constexpr, D: tl.constexpr):
    # rows o_t of a [B, T, H, D] tensor for head (i_b, i_h), as fp32 [len(o_t), D]; invalid rows are 0
    return _load_block(x, o_t, m_t, tl.arange(0, D), i_b, i_h, T, H, D)


@triton.jit
def _load_row(x, t, i_b, i_h, T, H: tl.constexpr, D: tl.constexpr):
    # one row t of a [B, T, H, D] tensor as fp32 [D] (0 if t >= T)
    return _load_row_block(x, t, tl.arange(0, D), i_b, i_h, T, H, D)


@triton.jit
def _load_vec(x, o_t, m_t, i_b, i_h, T, H: tl.constexpr):
    # a [B, T, H] tensor at rows o_t as fp32
    return tl.load(x + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.0).to(tl.float32)


@triton.jit
def _store_decayed(
    qg, kd, kg, b_q, b_k, b_g, b_gl, o_r, m_r, i_b, i_h, T, H: tl.constexpr, K: tl.constexpr,
    DELTA: tl.constexpr,
):  # fmt: skip
    # the decayed operands of rows o_r (G of the rows in b_g, of the chunk's last row in b_gl), written once
    # by the intra kernel for the later ones: Q exp(G) (queries read the state from the chunk start: the
    # output, the reverse state pass), K exp(G_last - G) (keys carried to the chunk's end: both state
    # passes) and, with the delta rule, K exp(G) (W/U and the dvt backward)
    p_rk = ((i_b * T + o_r[:, None]) * H + i_h) * K + tl.arange(0, K)[None, :]
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
    DELTA: tl.constexpr,
    BOUNDED: tl.constexpr,
    LOWP: tl.constexpr,
    ZERO_KK: tl.constexpr,
    FTZ: tl.constexpr,
    ZERO_QK: tl.constexpr = 1,
    LOG2: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
    G16: tl.constexpr = 0,
):
    # rows [r0, r0 + BC) of A_qk = scale * tril(Q Gamma (K / Gamma)^T) and A_kk = strict_tril(...K...); the
    # per-channel decay in _intra_fwd_tri, one BC-column block at a time
    _pdl_start(PDL)
    i_tc, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    NC: tl.constexpr = BT // BC
    i_t, i_c = i_tc // NC, i_tc % NC
    if DECAY == 2:
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
            i_b,
            i_h,
            H,
            K,
            BT,
            BC,
            DELTA,
            BOUNDED,
            LOWP,
            ZERO_KK,
            FTZ,
            ZERO_QK,
            LOG2,
            G16,
        )
    else:
        t0 = i_t * BT
        r0 = t0 + i_c * BC
        o_r = r0 + tl.arange(0, BC)  # rows of this block
        o_i = t0 + tl.arange(0, BT)  # columns: the whole chunk
        m_r, m_i = o_r < T, o_i < T
        b_q = _load_rows(q, o_r, m_r, i_b, i_h, T, H, K)  # [BC, K]
        b_kr = _load_rows(k, o_r, m_r, i_b, i_h, T, H, K)  # [BC, K]
        b_ki = _load_rows(k, o_i, m_i, i_b, i_h, T, H, K)  # [BT, K]
        b_aqk = tl.dot(_dot_cast(b_q, LOWP), tl.trans(_dot_cast(b_ki, LOWP)))
        b_akk = tl.dot(_dot_cast(b_kr, LOWP), tl.trans(_dot_cast(b_ki, LOWP)))
        if DECAY == 1:
            b_gr = _load_vec(gc, o_r, m_r, i_b, i_h, T, H)
            b_gi = _load_vec(gc, o_i, m_i, i_b, i_h, T, H)
            m_d = (o_r[:, None] >= o_i[None, :]) & m_i[None, :]
            b_d = tl.exp(tl.where(m_d, b_gr[:, None] - b_gi[None, :], float("-inf")))
            b_aqk = b_aqk * b_d
            b_akk = b_akk * b_d
        b_aqk = tl.where((o_r[:, None] >= o_i[None, :]) & m_i[None, :], b_aqk, 0.0) * scale
        p_a = ((i_b * T + o_r[:, None]) * H + i_h) * BT + tl.arange(0, BT)[None, :]
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
    i_b,
    i_h,
    H: tl.constexpr,
    K: tl.constexpr,
    BC: tl.constexpr,
    DELTA: tl.constexpr,
):
    o_b = tl.arange(0, BC)
    # the diagonal block, one column at a time with the exact relative decay (masked before the exp)
    o_k = tl.arange(0, K)
    p_kj = k + ((i_b * T + r0) * H + i_h) * K + o_k
    p_gj = gc + ((i_b * T + r0) * H + i_h) * K + o_k
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
    i_b,
    i_h,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    DELTA: tl.constexpr,
    BOUNDED: tl.constexpr,
    LOWP: tl.constexpr,
    ZERO_KK: tl.constexpr,
    FTZ: tl.constexpr,
    ZERO_QK: tl.constexpr = 1,
    LOG2: tl.constexpr = 0,
    G16: tl.constexpr = 0,
):
    # the per-channel decay's rows [r0, r0 + BC) of A_qk and A_kk one BC-column block at a time, over only the
    # blocks the rows reach (0..i_c; the unbounded path's diagonal block by positions); the blocks after the
    # diagonal are stored as zeros
    t0 = i_t * BT
    r0 = t0 + i_c * BC
    o_b = tl.arange(0, BC)
    o_r = r0 + o_b
    m_r = o_r < T
    b_q = _load_rows(q, o_r, m_r, i_b, i_h, T, H, K)  # [BC, K]
    b_kr = _load_rows(k, o_r, m_r, i_b, i_h, T, H, K)
    b_ga = _load_row(gc, tl.minimum(r0, T - 1), i_b, i_h, T, H, K)  # anchor: the block's first row
    if G16:
        # (TUNE["fwd.g16"]) the rows' decays from the anchor, G_a - G_r (>= 0, log2 units), from uint16
        b_dr = _load_rows(gq, o_r, m_r, i_b, i_h, T, H, K) * (1.0 / G16_STEPS)
    else:
        b_gr = _load_rows(gc, o_r, m_r, i_b, i_h, T, H, K)
        b_dr = b_ga[None, :] - b_gr
    # LOG2: G comes times log2(e) from the cumsum kernel, every exponential here a 2^x without the multiply.
    # The launch sets it for the bounded gate only, the only form here whose every use of G is an
    # exponential through _exp
    b_er = _exp(tl.where(m_r[:, None], -b_dr, float("-inf")), FTZ, LOG2)  # <= 1
    if BOUNDED:
        # the decayed operands from the products' own fp32 tiles of exponentials E_r = exp(G - G_a) and
        # E_d = exp(G_a - G) (<= e^{-lower_bound (BC - 1)}) times [K] vectors: Q exp(G) = Q E_r exp(G_a),
        # K exp(G_last - G) = K E_d exp(G_last - G_a); two tiles of exponentials a program instead of four
        # (the diagonal block's keys are K E_d)
        b_ed = _exp(tl.where(m_r[:, None], b_dr, float("-inf")), FTZ, LOG2)
        b_qr = b_q * b_er
        b_kr_e = b_kr * b_er
        b_kd_e = b_kr * b_ed
        b_gl = _load_row(gc, tl.minimum(t0 + BT, T) - 1, i_b, i_h, T, H, K)
        p_rk = ((i_b * T + o_r[:, None]) * H + i_h) * K + tl.arange(0, K)[None, :]
        b_ea = _exp(b_ga, FTZ, LOG2)[None, :]
        tl.store(qg + p_rk, (b_qr * b_ea).to(qg.dtype.element_ty), mask=m_r[:, None])
        b_el = _exp(b_gl - b_ga, FTZ, LOG2)[None, :]
        tl.store(kd + p_rk, (b_kd_e * b_el).to(kd.dtype.element_ty), mask=m_r[:, None])
        if DELTA:
            tl.store(kg + p_rk, (b_kr_e * b_ea).to(kg.dtype.element_ty), mask=m_r[:, None])
        b_qe = _dot_cast(b_qr, LOWP)
        b_ke = _dot_cast(b_kr_e, LOWP)
    else:
        b_gl = _load_row(gc, tl.minimum(t0 + BT, T) - 1, i_b, i_h, T, H, K)
        _store_decayed(qg, kd, kg, b_q, b_kr, b_gr, b_gl, o_r, m_r, i_b, i_h, T, H, K, DELTA)
        b_qe = _dot_cast(b_q * b_er, LOWP)
        b_ke = _dot_cast(b_kr * b_er, LOWP)
    p_row = ((i_b * T + o_r[:, None]) * H + i_h) * BT
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
        b_gb = _load_row(gc, tl.minimum(r0 + BC, T) - 1, i_b, i_h, T, H, K)
        dense = (tl.max(b_ga - b_gb, 0) <= 75.0).to(tl.int64)
        n_j = i_c + dense
    for j in range(0, n_j):
        o_j = t0 + j * BC + o_b
        m_j = o_j < T
        if G16:
            # G_a - G_j = (G_a - G at block j's first row) + block j's own decays
            b_dj = (b_ga - _load_row(gc, t0 + j * BC, i_b, i_h, T, H, K))[None, :] + _load_rows(
                gq, o_j, m_j, i_b, i_h, T, H, K
            ) * (1.0 / G16_STEPS)
        else:
            b_dj = b_ga[None, :] - _load_rows(gc, o_j, m_j, i_b, i_h, T, H, K)  # G_a - G of the columns
        b_y = _load_rows(k, o_j, m_j, i_b, i_h, T, H, K)
        b_y = b_y * _exp(tl.where(m_j[:, None], b_dj, float("-inf")), FTZ, LOG2)
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
                i_b,
                i_h,
                H,
                K,
                BC,
                DELTA,
            )
    # the blocks after the diagonal: zeros (the output kernel and the backward read whole rows)
    o_c = tl.arange(0, BT)
    m_z = m_r[:, None] & (o_c[None, :] >= (i_c + 1) * BC)
    b_z = tl.zeros([BC, BT], dtype=tl.float32)
    if ZERO_QK:
        # (not where the state pass loads A_qk block lower-triangular, TUNE["fwd.tril"])
        tl.store(aqk + p_row + o_c[None, :], b_z.to(aqk.dtype.element_ty), mask=m_z)
    if DELTA and ZERO_KK:
        # (the solve reads only the blocks up to the diagonal; the dvt backward reads whole rows)
        tl.store(akk + p_row + o_c[None, :], b_z, mask=m_z)


@triton.jit
def _a_block(
    akk,
    beta,
    t0,
    i: tl.constexpr,
    j: tl.constexpr,
    i_b,
    i_h,
    T,
    H: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    # block (i, j) (BC x BC) of diag(beta) A_kk inside the chunk starting at t0; rows past T are 0
    o_b = tl.arange(0, BC)
    o_r = t0 + i * BC + o_b
    m_r = o_r < T
    b_a = tl.load(
        akk + ((i_b * T + o_r[:, None]) * H + i_h) * BT + (j * BC + o_b)[None, :],
        mask=m_r[:, None],
        other=0.0,
    )
    return b_a * _load_vec(beta, o_r, m_r, i_b, i_h, T, H)[:, None]


@triton.jit
def _inv_unit_lower(b_n, BC: tl.constexpr, PREC: tl.constexpr):
    # (I + N)^-1 for a strictly lower triangular BC x BC block N (BC = 16, so N^16 = 0): the series
    # sum_{m < 16} (-N)^m, factored as (I - N)(I + N^2)(I + N^4)(I + N^8): six products (a chain four deep)
    # instead of the BC - 1 dependent steps of a row-by-row substitution
    o_b = tl.arange(0, BC)
    eye = tl.where(o_b[:, None] == o_b[None, :], 1.0, 0.0)
    b_n2 = tl.dot(b_n, b_n, input_precision=PREC)
    b_p = eye - b_n
    b_n4 = tl.dot(b_n2, b_n2, input_precision=PREC)
    b_p += tl.dot(b_p, b_n2, input_precision=PREC)
    b_n8 = tl.dot(b_n4, b_n4, input_precision=PREC)
    b_p += tl.dot(b_p, b_n4, input_precision=PREC)
    return b_p + tl.dot(b_p, b_n8, input_precision=PREC)


@triton.jit
def _solve_kernel(
    beta,
    akk,
    linv,
    T,
    H: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    PREC: tl.constexpr,
    ZERO_L: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
):
    # L = (I + diag(beta) A_kk)^-1 by blocks of BC rows: first the NC diagonal blocks (_inv_unit_lower), then
    # the blocks below the diagonal from L_ij = -L_ii sum_{j <= m < i} A_im L_mj, all in registers (NC <= 4),
    # every product on the tensor cores (PREC: "tf32" for 16-bit inputs, whose L is stored in bf16; "tf32x3",
    # fp32-level, for fp32 inputs). One warp per program: the 16 x 16 products give more warps nothing to
    # share. H200, B8 T8K H16 (run 38): 0.295 -> 0.162 ms against forward substitution on the diagonal
    # blocks (15 dependent steps of reductions) with fp32 FMA products; 3xTF32 products there: 0.309 ms
    _pdl_start(PDL)
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    t0 = i_t * BT
    NC: tl.constexpr = BT // BC
    b_l00 = _inv_unit_lower(_a_block(akk, beta, t0, 0, 0, i_b, i_h, T, H, BT, BC), BC, PREC)
    if NC >= 2:
        b_l11 = _inv_unit_lower(_a_block(akk, beta, t0, 1, 1, i_b, i_h, T, H, BT, BC), BC, PREC)
    if NC == 4:
        b_l22 = _inv_unit_lower(_a_block(akk, beta, t0, 2, 2, i_b, i_h, T, H, BT, BC), BC, PREC)
        b_l33 = _inv_unit_lower(_a_block(akk, beta, t0, 3, 3, i_b, i_h, T, H, BT, BC), BC, PREC)
    _store_block(linv, b_l00, t0, 0, 0, i_b, i_h, T, H, BT, BC)
    if NC >= 2:
        b_l10 = -tl.dot(
            b_l11,
            tl.dot(_a_block(akk, beta, t0, 1, 0, i_b, i_h, T, H, BT, BC), b_l00, input_precision=PREC),
            input_precision=PREC,
        )
        _store_block(linv, b_l11, t0, 1, 1, i_b, i_h, T, H, BT, BC)
        _store_block(linv, b_l10, t0, 1, 0, i_b, i_h, T, H, BT, BC)
    if NC == 4:
        b_a20 = _a_block(akk, beta, t0, 2, 0, i_b, i_h, T, H, BT, BC)
        b_a21 = _a_block(akk, beta, t0, 2, 1, i_b, i_h, T, H, BT, BC)
        b_a30 = _a_block(akk, beta, t0, 3, 0, i_b, i_h, T, H, BT, BC)
        b_a31 = _a_block(akk, beta, t0, 3, 1, i_b, i_h, T, H, BT, BC)
        b_a32 = _a_block(akk, beta, t0, 3, 2, i_b, i_h, T, H, BT, BC)
        b_l21 = -tl.dot(b_l22, tl.dot(b_a21, b_l11, input_precision=PREC), input_precision=PREC)
        b_l32 = -tl.dot(b_l33, tl.dot(b_a32, b_l22, input_precision=PREC), input_precision=PREC)
        b_s20 = tl.dot(b_a20, b_l00, input_precision=PREC) + tl.dot(b_a21, b_l10, input_precision=PREC)
        b_l20 = -tl.dot(b_l22, b_s20, input_precision=PREC)
        b_s31 = tl.dot(b_a31, b_l11, input_precision=PREC) + tl.dot(b_a32, b_l21, input_precision=PREC)
        b_l31 = -tl.dot(b_l33, b_s31, input_precision=PREC)
        b_s30 = tl.dot(b_a30, b_l00, input_precision=PREC) + tl.dot(b_a31, b_l10, input_precision=PREC)
        b_s30 += tl.dot(b_a32, b_l20, input_precision=PREC)
        b_l30 = -tl.dot(b_l33, b_s30, input_precision=PREC)
        _store_block(linv, b_l22, t0, 2, 2, i_b, i_h, T, H, BT, BC)
        _store_block(linv, b_l33, t0, 3, 3, i_b, i_h, T, H, BT, BC)
        _store_block(linv, b_l21, t0, 2, 1, i_b, i_h, T, H, BT, BC)
        _store_block(linv, b_l32, t0, 3, 2, i_b, i_h, T, H, BT, BC)
        _store_block(linv, b_l20, t0, 2, 0, i_b, i_h, T, H, BT, BC)
        _store_block(linv, b_l31, t0, 3, 1, i_b, i_h, T, H, BT, BC)
        _store_block(linv, b_l30, t0, 3, 0, i_b, i_h, T, H, BT, BC)
    # the blocks above the diagonal are 0; the W/U kernel and the backward read L whole (ZERO_L; not where the
    # state pass loads it block lower-triangular, TUNE["fwd.tril"])
    if ZERO_L:
        o_t = t0 + tl.arange(0, BT)
        m_t = o_t < T
        o_c = tl.arange(0, BT)
        p_a = ((i_b * T + o_t[:, None]) * H + i_h) * BT + o_c[None, :]
        tl.store(
            linv + p_a,
            tl.zeros([BT, BT], dtype=tl.float32).to(linv.dtype.element_ty),
            mask=m_t[:, None] & (o_c[None, :] // BC > o_c[:, None] // BC),
        )


@triton.jit
def _wu_kernel(
    k,
    v,
    gc,
    beta,
    linv,
    w,
    u,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    DECAY: tl.constexpr,
    LOWP: tl.constexpr,
    PRE_KG: tl.constexpr,
    STORE_U: tl.constexpr,
):
    # W = L diag(beta) (Gamma K), U = L diag(beta) V (the WY representation), one chunk per program.
    # PRE_KG: k already holds Gamma K (written by the cumsum kernel). Without STORE_U only W (the state pass
    # then forms Vt from L and V itself, TUNE["bwd.x"])
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    p_a = ((i_b * T + o_t[:, None]) * H + i_h) * BT + tl.arange(0, BT)[None, :]
    b_beta = _load_vec(beta, o_t, m_t, i_b, i_h, T, H)  # [BT]
    b_lf = tl.load(linv + p_a, mask=m_t[:, None], other=0.0).to(tl.float32)
    b_tm = _dot_cast(b_lf * b_beta[None, :], LOWP)
    b_k = _load_rows(k, o_t, m_t, i_b, i_h, T, H, K)
    if DECAY == 2 and not PRE_KG:
        b_k = b_k * tl.exp(_load_rows(gc, o_t, m_t, i_b, i_h, T, H, K))
    elif DECAY == 1:
        b_k = b_k * tl.exp(_load_vec(gc, o_t, m_t, i_b, i_h, T, H))[:, None]
    b_w = tl.dot(b_tm, _dot_cast(b_k, LOWP))  # [BT, K]
    p_w = ((i_b * T + o_t[:, None]) * H + i_h) * K + tl.arange(0, K)[None, :]
    tl.store(w + p_w, b_w.to(w.dtype.element_ty), mask=m_t[:, None])
    if STORE_U:
        b_v = _load_rows(v, o_t, m_t, i_b, i_h, T, H, V)
        b_u = tl.dot(b_tm, _dot_cast(b_v, LOWP))  # [BT, V]
        p_u = ((i_b * T + o_t[:, None]) * H + i_h) * V + tl.arange(0, V)[None, :]
        tl.store(u + p_u, b_u.to(u.dtype.element_ty), mask=m_t[:, None])


@triton.jit
def _store_block(
    linv,
    b_x,
    t0,
    i: tl.constexpr,
    j: tl.constexpr,
    i_b,
    i_h,
    T,
    H: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    o_b = tl.arange(0, BC)
    o_r = t0 + i * BC + o_b
    tl.store(
        linv + ((i_b * T + o_r[:, None]) * H + i_h) * BT + (j * BC + o_b)[None, :],
        b_x.to(linv.dtype.element_ty),
        mask=(o_r < T)[:, None],
    )


@triton.jit
def _unchain(x, on, UNCHAIN: tl.constexpr):
    # x through a run-time branch that is always taken (on: a run-time truth). Triton gives a product whose
    # result reaches another product (a chain) all its warps along the rows (flash attention's layout): with
    # 8 warps and 64 rows, on sm_90 both warpgroups then compute the same 64 rows. Its search for the chain
    # stops at the branch's yield, so the product takes the layout of an unchained one, the warpgroups
    # splitting the columns. The branch never taken keeps a product of its own, so that it is not folded
    # into a select (which the search would follow)
    if UNCHAIN:
        if on:
            y = x
        else:
            y = x * 0.5
    else:
        y = x
    return y


@triton.jit
def _chunk_small(
    gc,
    beta,
    i_t,
    i_b,
    i_h,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    DECAY: tl.constexpr,
    BETA: tl.constexpr,
    LOG2: tl.constexpr = 0,
):
    # a state pass's small inputs of chunk i_t, too small for Triton to pipeline (sm_90 TTGIR: plain loads,
    # where the tiles are asynchronous copies a stage ahead), so each a wait of the sequential pass on memory
    # where it is used (EARLY = 0); EARLY = 1 loads them at the top of the chunk's step, EARLY = 2 one chunk
    # ahead: the per-channel decay to the chunk's end exp(G_last) ([K]), or the scalar decay's column G
    # ([BT]); beta ([BT], BETA)
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    if DECAY == 2:
        b_gv = _exp(_load_row(gc, tl.minimum(i_t * BT + BT, T) - 1, i_b, i_h, T, H, K), False, LOG2)
    elif DECAY == 1:
        b_gv = _load_vec(gc, o_t, m_t, i_b, i_h, T, H)
    else:
        b_gv = tl.full([K], 1.0, dtype=tl.float32)
    if BETA:
        b_b = _load_vec(beta, o_t, m_t, i_b, i_h, T, H)
    else:
        b_b = tl.zeros([BT], dtype=tl.float32)
    return b_gv, b_b


@triton.jit
def _key_decay_to_end(
    k,
    gc,
    o_t,
    m_t,
    t_last,
    i_b,
    i_h,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    DECAY: tl.constexpr,
    LOG2: tl.constexpr = 0,
):
    # K_d = K * exp(G_last - G): keys decayed to the chunk's last row ([BT, K]), and exp(G_last) ([K]).
    # For the per-channel decay, k already holds K_d (written by the intra or the cumsum kernel)
    b_k = _load_rows(k, o_t, m_t, i_b, i_h, T, H, K)
    if DECAY == 2:
        b_kd = b_k
        b_dl = _exp(_load_row(gc, t_last, i_b, i_h, T, H, K), False, LOG2)
    elif DECAY == 1:
        b_gl = tl.load(gc + (i_b * T + t_last) * H + i_h)
        b_g = _load_vec(gc, o_t, m_t, i_b, i_h, T, H)
        b_kd = b_k * tl.exp(tl.where(m_t, b_gl - b_g, float("-inf")))[:, None]
        b_dl = tl.exp(b_gl + tl.zeros([K], dtype=tl.float32))
    else:
        b_kd = b_k
        b_dl = tl.full([K], 1.0, dtype=tl.float32)
    return b_kd, b_dl


@triton.jit
def _key_decay_from(
    k, b_gv, o_t, m_t, t_last, i_b, i_h, T, H: tl.constexpr, K: tl.constexpr, DECAY: tl.constexpr
):
    # _key_decay_to_end from the chunk's b_gv of _chunk_small (loaded earlier)
    b_k = _load_rows(k, o_t, m_t, i_b, i_h, T, H, K)
    if DECAY == 1:
        b_gl = tl.sum(tl.where(o_t == t_last, b_gv, 0.0), 0)
        b_kd = b_k * tl.exp(tl.where(m_t, b_gl - b_gv, float("-inf")))[:, None]
        b_dl = tl.exp(b_gl + tl.zeros([K], dtype=tl.float32))
    else:
        b_kd = b_k
        b_dl = b_gv
    return b_kd, b_dl


@triton.jit
def _decay_rows(b_x, b_gv, DECAY: tl.constexpr):
    # rows of Q or K times exp(G) for the scalar decay (b_gv: the chunk's column G); the per-channel decay's
    # operands come decayed already
    if DECAY == 1:
        b_x = b_x * tl.exp(b_gv)[:, None]
    return b_x


@triton.jit
def _load_qg(
    q, gc, o_t, m_t, i_b, i_h, T, H: tl.constexpr, K: tl.constexpr, DECAY: tl.constexpr, PRE: tl.constexpr
):
    # Q * exp(G) ([BT, K]): queries read the state decayed from the chunk start.
    # PRE: for the per-channel decay, q already holds Q * exp(G) (written by the intra or the cumsum kernel)
    b_q = _load_rows(q, o_t, m_t, i_b, i_h, T, H, K)
    if DECAY == 2 and not PRE:
        b_q = b_q * tl.exp(_load_rows(gc, o_t, m_t, i_b, i_h, T, H, K))
    elif DECAY == 1:
        b_q = b_q * tl.exp(_load_vec(gc, o_t, m_t, i_b, i_h, T, H))[:, None]
    return b_q


# T and NT are not specialised: Triton 3.6 on the H200 miscompiled this kernel's WY form specialised for one
# chunk (NT == 1, T <= 64): wrong outputs at T = 63 and an illegal memory access at T = 16 and 32, while the
# interpreter and every T of more than one chunk were right (run 45); unspecialised, T = 1..2048 all match
@triton.jit(do_not_specialize=["T", "NT"])
def _state_fwd_kernel(
    k,
    v,
    gc,
    w,
    u,
    vt,
    h,
    h0,
    ht,
    q,
    aqk,
    o,
    kg,
    linv,
    beta,
    x,
    scale,
    T,
    NT,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    DECAY: tl.constexpr,
    DELTA: tl.constexpr,
    HAS_H0: tl.constexpr,
    STORE_HT: tl.constexpr,
    LOWP: tl.constexpr,
    OUT: tl.constexpr,
    STORE_H: tl.constexpr,
    STORE_VT: tl.constexpr,
    WY: tl.constexpr,
    STORE_X: tl.constexpr,
    EARLY: tl.constexpr,
    UNCHAIN: tl.constexpr,
    TRIL: tl.constexpr = 0,
    LOG2: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    # sequential over chunks for one (batch, head, V block): h[c] = state entering chunk c (STORE_H: kept for
    # the backward and, without OUT, for _output_kernel). OUT (TUNE["state_fwd.output"]): also this V block of
    # the chunk's output O = scale (Q Gamma) S + A_qk Vt, from the state and Vt still in registers, instead of
    # a separate pass that reads both back from memory. STORE_VT: Vt kept (the backward, _output_kernel).
    # WY (TUNE["state_fwd.wy"], the delta rule): Vt = L diag(beta) (V - (Gamma K) S) from L, Gamma K (kg; k
    # and G without a per-channel decay) and V, so that no W/U pass runs; else Vt = U - W S from _wu_kernel.
    # STORE_X (with WY, TUNE["bwd.x"]): X = V - (Gamma K) S kept for the dvt backward, in the input dtype.
    # EARLY (TUNE["state_fwd.early"]): the chunk's small inputs (_chunk_small) loaded where used (0), at the
    # top of the chunk's step (1) or one chunk ahead (2). With WY, L is taken as loaded times diag(beta) X,
    # beta on the rows of X (in registers).
    # TRIL (TUNE["fwd.tril"]): L and A_qk loaded block lower-triangular (16-column blocks up to the row's),
    # the zeros above not stored by the solve and the intra forward
    _pdl_start(PDL)
    i_v, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_s = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    if HAS_H0:
        b_s = tl.load(h0 + p_s).to(tl.float32)
    else:
        b_s = tl.zeros([K, BV], dtype=tl.float32)
    if EARLY == 2:
        b_gv_n, b_b_n = _chunk_small(gc, beta, 0, i_b, i_h, T, H, K, BT, DECAY, DELTA and WY, LOG2)
    for i_t in range(NT):
        if EARLY == 2:
            b_gv, b_b = b_gv_n, b_b_n
            b_gv_n, b_b_n = _chunk_small(
                gc, beta, tl.minimum(i_t + 1, NT - 1), i_b, i_h, T, H, K, BT, DECAY, DELTA and WY, LOG2
            )
        elif EARLY == 1:
            b_gv, b_b = _chunk_small(gc, beta, i_t, i_b, i_h, T, H, K, BT, DECAY, DELTA and WY, LOG2)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        o_cb = tl.arange(0, BT)
        if TRIL:
            m_tc = m_t[:, None] & (o_cb[None, :] // 16 <= o_cb[:, None] // 16)
        else:
            m_tc = m_t[:, None]
        if STORE_H:
            tl.store(
                h + i_t * K * V + i_bh * NT * K * V + o_k[:, None] * V + o_v[None, :],
                b_s.to(h.dtype.element_ty),
            )
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        # the state as a dot operand: what h holds (bf16 for 16-bit inputs), so OUT matches _output_kernel
        b_sd = _dot_cast(b_s, LOWP)
        if DELTA:
            if WY:
                # pseudo-values Vt = L diag(beta) (V - (Gamma K) S), the WY form of U - W S
                b_kg = _load_rows(kg, o_t, m_t, i_b, i_h, T, H, K)
                if EARLY:
                    b_kg = _decay_rows(b_kg, b_gv, DECAY)
                elif DECAY == 1:
                    b_kg = b_kg * tl.exp(_load_vec(gc, o_t, m_t, i_b, i_h, T, H))[:, None]
                b_x = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
                b_x -= _unchain(tl.dot(_dot_cast(b_kg, LOWP), b_sd), T > 0, UNCHAIN)
                if STORE_X:
                    tl.store(x + p_v, b_x.to(x.dtype.element_ty), mask=m_t[:, None])
                # (the rows of L here and of A_qk below: one expression twice, left where the revision
                # checked on the H200 computes them; hoisted above the branches it compiles in another order)
                p_l = ((i_b * T + o_t[:, None]) * H + i_h) * BT + tl.arange(0, BT)[None, :]
                # L as loaded, beta on the rows of X: L (diag(beta) X)
                b_tm = tl.load(linv + p_l, mask=m_tc, other=0.0)
                if EARLY:
                    b_x = b_x * b_b[:, None]
                else:
                    b_x = b_x * _load_vec(beta, o_t, m_t, i_b, i_h, T, H)[:, None]
                b_vt = _unchain(tl.dot(_dot_cast(b_tm, LOWP), _dot_cast(b_x, LOWP)), T > 0, UNCHAIN)
            else:
                # pseudo-values Vt = U - W S: the delta rule's correction against the entering state
                b_w = _load_rows(w, o_t, m_t, i_b, i_h, T, H, K)
                b_vt = tl.load(u + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
                b_vt -= tl.dot(_dot_cast(b_w, LOWP), b_sd)
            if STORE_VT:
                tl.store(vt + p_v, b_vt.to(vt.dtype.element_ty), mask=m_t[:, None])
            # the output reads Vt as stored (the input dtype), as _output_kernel does
            b_vo = b_vt.to(vt.dtype.element_ty).to(tl.float32)
        else:
            b_vt = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
            b_vo = b_vt
        if OUT:
            if EARLY:
                b_qg = _decay_rows(_load_rows(q, o_t, m_t, i_b, i_h, T, H, K), b_gv, DECAY)
            else:
                b_qg = _load_qg(q, gc, o_t, m_t, i_b, i_h, T, H, K, DECAY, True)
            p_a = ((i_b * T + o_t[:, None]) * H + i_h) * BT + tl.arange(0, BT)[None, :]
            b_a = tl.load(aqk + p_a, mask=m_tc, other=0.0)
            b_o = _unchain(tl.dot(_dot_cast(b_qg, LOWP), b_sd), T > 0, UNCHAIN) * scale
            b_o += tl.dot(_dot_cast(b_a, LOWP), _dot_cast(b_vo, LOWP))
            tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_t[:, None])
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        if EARLY:
            b_kd, b_dl = _key_decay_from(k, b_gv, o_t, m_t, t_last, i_b, i_h, T, H, K, DECAY)
        else:
            b_kd, b_dl = _key_decay_to_end(k, gc, o_t, m_t, t_last, i_b, i_h, T, H, K, DECAY, LOG2)
        b_s = b_s * b_dl[:, None] + tl.dot(tl.trans(_dot_cast(b_kd, LOWP)), _dot_cast(b_vt, LOWP))
    if STORE_HT:
        tl.store(ht + p_s, b_s)


@triton.jit
def _output_kernel(
    q,
    v,
    gc,
    aqk,
    vt,
    h,
    o,
    scale,
    T,
    NT,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    DECAY: tl.constexpr,
    DELTA: tl.constexpr,
    LOWP: tl.constexpr,
):
    # O = scale * (Q Gamma) S + A_qk Vt, per chunk and V block
    i_t, i_v, i_bh = (
        tl.program_id(0).to(tl.int64),
        tl.program_id(1).to(tl.int64),
        tl.program_id(2).to(tl.int64),
    )
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    b_s = tl.load(h + (i_bh * NT + i_t) * K * V + o_k[:, None] * V + o_v[None, :]).to(tl.float32)
    b_qg = _load_qg(q, gc, o_t, m_t, i_b, i_h, T, H, K, DECAY, True)
    p_a = ((i_b * T + o_t[:, None]) * H + i_h) * BT + tl.arange(0, BT)[None, :]
    b_a = tl.load(aqk + p_a, mask=m_t[:, None], other=0.0)
    p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
    if DELTA:
        b_vt = tl.load(vt + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
    else:
        b_vt = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
    b_o = tl.dot(_dot_cast(b_qg, LOWP), _dot_cast(b_s, LOWP)) * scale
    b_o += tl.dot(_dot_cast(b_a, LOWP), _dot_cast(b_vt, LOWP))
    tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_t[:, None])


@triton.jit
def _state_bwd_kernel(
    q,
    k,
    gc,
    w,
    aqk,
    do,
    dvt,
    dh,
    dht,
    dh0,
    scale,
    T,
    NT,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    DECAY: tl.constexpr,
    DELTA: tl.constexpr,
    HAS_DHT: tl.constexpr,
    LOWP: tl.constexpr,
    EARLY: tl.constexpr,
    UNCHAIN: tl.constexpr,
):
    # reverse over chunks: dh[c] = gradient w.r.t. the state leaving chunk c; dVt = A_qk^T dO + K_d dS'.
    # EARLY (TUNE["state_bwd.early"]): the chunk's decay (_chunk_small) loaded where used (0), at the top of
    # the chunk's step (1) or one chunk ahead (2)
    i_v, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_s = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    if HAS_DHT:
        b_ds = tl.load(dht + p_s).to(tl.float32)
    else:
        b_ds = tl.zeros([K, BV], dtype=tl.float32)
    if EARLY == 2:
        b_gv_n, _ = _chunk_small(gc, gc, NT - 1, i_b, i_h, T, H, K, BT, DECAY, False)
    for i_r in range(NT):
        i_t = NT - 1 - i_r
        if EARLY == 2:
            b_gv = b_gv_n
            b_gv_n, _ = _chunk_small(gc, gc, tl.maximum(i_t - 1, 0), i_b, i_h, T, H, K, BT, DECAY, False)
        elif EARLY == 1:
            b_gv, _ = _chunk_small(gc, gc, i_t, i_b, i_h, T, H, K, BT, DECAY, False)
        tl.store(
            dh + (i_bh * NT + i_t) * K * V + o_k[:, None] * V + o_v[None, :], b_ds.to(dh.dtype.element_ty)
        )
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        p_a = ((i_b * T + o_t[:, None]) * H + i_h) * BT + tl.arange(0, BT)[None, :]
        b_a = tl.load(aqk + p_a, mask=m_t[:, None], other=0.0)
        b_do = tl.load(do + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        if EARLY:
            b_kd, b_dl = _key_decay_from(k, b_gv, o_t, m_t, t_last, i_b, i_h, T, H, K, DECAY)
        else:
            b_kd, b_dl = _key_decay_to_end(k, gc, o_t, m_t, t_last, i_b, i_h, T, H, K, DECAY)
        b_dvt = _unchain(tl.dot(tl.trans(_dot_cast(b_a, LOWP)), _dot_cast(b_do, LOWP)), T > 0, UNCHAIN)
        b_dvt += tl.dot(_dot_cast(b_kd, LOWP), _dot_cast(b_ds, LOWP))
        b_dvt = _unchain(b_dvt, T > 0, UNCHAIN and DELTA)  # (with the delta rule it feeds W^T dVt)
        tl.store(dvt + p_v, b_dvt.to(dvt.dtype.element_ty), mask=m_t[:, None])
        if EARLY:
            b_qg = _decay_rows(_load_rows(q, o_t, m_t, i_b, i_h, T, H, K), b_gv, DECAY)
        else:
            b_qg = _load_qg(q, gc, o_t, m_t, i_b, i_h, T, H, K, DECAY, True)
        b_ds_new = (
            b_ds * b_dl[:, None] + tl.dot(tl.trans(_dot_cast(b_qg, LOWP)), _dot_cast(b_do, LOWP)) * scale
        )
        if DELTA:
            b_w = _load_rows(w, o_t, m_t, i_b, i_h, T, H, K)
            b_ds_new -= tl.dot(tl.trans(_dot_cast(b_w, LOWP)), _dot_cast(b_dvt, LOWP))
        b_ds = b_ds_new
    tl.store(dh0 + p_s, b_ds)


@triton.jit
def _dqk_bwd_kernel(
    q,
    k,
    v,
    gc,
    beta,
    vt,
    h,
    dh,
    do,
    dvt,
    linv,
    dq,
    dk,
    dgk,
    dq_out,
    dk_out,
    dg,
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
    DELTA: tl.constexpr,
    LOWP: tl.constexpr,
    FUSED: tl.constexpr,
    FINISH: tl.constexpr,
    K_INNER: tl.constexpr,
    VT_X: tl.constexpr,
    SEQ: tl.constexpr,
    DV_W: tl.constexpr,
):
    # dq, dk and dG of one chunk for the K columns [i_k BK, (i_k + 1) BK): the plain products through the
    # state (O's state term, S' = Gamma_last S + K_d^T Vt, W S); the relative-decay parts are left to
    # _intra_bwd_kernel. FUSED (no delta rule, no per-channel decay): the
    # intra-chunk part too, from M_qk = scale tril(dO V^T) (times the relative decay) summed over the same V
    # loop, so neither _dvt_bwd_kernel nor _intra_bwd_kernel runs and dq, dk are final here. FINISH
    # (TUNE["bwd.intra_first"]; no decay or the per-channel one): _intra_bwd_kernel ran first and left its
    # partial dq, dk in dq, dk and its dG in dgk; they are added here, and the chunk's dG reverse-cumsummed
    # into dg (the chunk's rows are all in this program, the cumsum a product with the upper triangle of
    # ones on the tensor cores), so no _rev_cumsum_kernel runs
    # K_INNER (TUNE["dqk.k_inner"]): the grid is (key blocks, chunks, B H), a chunk's key blocks side by side.
    # DV_W (the delta rule after the dvt backward): dvt holds dV = T^T dVt, not dVt, and
    # d(Gamma K) = T^T dW = -dV S^T needs no product with T.
    # VT_X (TUNE["bwd.vt_x"]): vt holds X = V - (Gamma K) S, not Vt = T X; the V loop sums X dS'^T and
    # T (X dS'^T) follows it, so the forward keeps no Vt
    i_t, i_k, i_bh = (
        tl.program_id(K_INNER).to(tl.int64),
        tl.program_id(1 - K_INNER).to(tl.int64),
        tl.program_id(2).to(tl.int64),
    )
    i_b, i_h = i_bh // H, i_bh % H
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
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        p_s = (i_bh * NT + i_t) * K * V + o_k[:, None] * V + o_v[None, :]
        b_do = tl.load(do + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
        if DELTA:
            b_vt = tl.load(vt + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
        else:
            b_vt = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
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
        p_a = ((i_b * T + o_t[:, None]) * H + i_h) * BT + tl.arange(0, BT)[None, :]
        if VT_X or not DV_W:
            b_beta = _load_vec(beta, o_t, m_t, i_b, i_h, T, H)
            b_tm = tl.load(linv + p_a, mask=m_t[:, None], other=0.0).to(tl.float32) * b_beta[None, :]
        if VT_X:
            # Vt dS'^T = T (X dS'^T), in the dot operands' precision (tf32 operands: more shared memory)
            b_dkd = tl.dot(_dot_cast(b_tm, LOWP), _dot_cast(b_dkd, LOWP))
        if DV_W:
            # the V loop summed dV S^T with dV = T^T dVt (dvt's output): d(Gamma K) = -dV S^T
            b_dkg = -b_dws
        else:
            b_dkg = tl.dot(tl.trans(_dot_cast(b_tm, LOWP)), _dot_cast(-b_dws, LOWP))
    p_k = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    if SEQ:
        # (TUNE["dqk.seq"]; the per-channel decay with the intra backward first) the same terms, each tile
        # loaded where it is first needed and dead after its last use, the finished dq stored before k loads
        b_g = _load_block(gc, o_t, m_t, o_k, i_b, i_h, T, H, K)
        b_gl = tl.load(gc + ((i_b * T + t_last) * H + i_h) * K + o_k)
        b_eg = tl.exp(b_g)
        b_dq = b_dqs * b_eg * scale
        if DELTA:
            b_dkg = b_dkg * b_eg
        b_dk = b_dkd * tl.exp(tl.where(m_t[:, None], b_gl[None, :] - b_g, float("-inf")))
        b_dgl = b_dgl * tl.exp(b_gl)
        b_dg = _load_block(q, o_t, m_t, o_k, i_b, i_h, T, H, K) * b_dq
        b_dq += tl.load(dq + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
        tl.store(dq_out + p_k, b_dq.to(dq_out.dtype.element_ty), mask=m_t[:, None])
        b_k = _load_block(k, o_t, m_t, o_k, i_b, i_h, T, H, K)
        b_dg -= b_k * b_dk
        b_dgl += tl.sum(b_k * b_dk, 0)
        if DELTA:
            b_dk += b_dkg
            b_dg += b_k * b_dkg
        b_dk += tl.load(dk + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
        tl.store(dk_out + p_k, b_dk.to(dk_out.dtype.element_ty), mask=m_t[:, None])
        b_dg = tl.where(o_t[:, None] == t_last, b_dg + b_dgl[None, :], b_dg)
        b_dg += tl.load(dgk + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
        b_dg = _rev_cumsum_by_dot(b_dg, BT, LOWP)
        tl.store(dg + p_k, b_dg.to(dg.dtype.element_ty), mask=m_t[:, None])
    else:
        b_q = _load_block(q, o_t, m_t, o_k, i_b, i_h, T, H, K)
        b_k = _load_block(k, o_t, m_t, o_k, i_b, i_h, T, H, K)
        if DECAY == 2:
            b_g = _load_block(gc, o_t, m_t, o_k, i_b, i_h, T, H, K)
            b_gl = tl.load(gc + ((i_b * T + t_last) * H + i_h) * K + o_k)
            b_eg = tl.exp(b_g)
            b_ed = tl.exp(tl.where(m_t[:, None], b_gl[None, :] - b_g, float("-inf")))
            b_dgl = b_dgl * tl.exp(b_gl)
        elif DECAY == 1:
            b_g = _load_vec(gc, o_t, m_t, i_b, i_h, T, H)
            b_gl = tl.load(gc + (i_b * T + t_last) * H + i_h)
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
            if DECAY == 1:
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
            if DECAY > 0:
                # G = chunk-local cumsum(g): dg is the reverse cumsum of dG inside the chunk (rows past T
                # hold 0)
                b_dg += tl.load(dgk + p_k, mask=m_t[:, None], other=0.0).to(tl.float32)
                b_dg = _rev_cumsum_by_dot(b_dg, BT, LOWP)
                tl.store(dg + p_k, b_dg.to(dg.dtype.element_ty), mask=m_t[:, None])
        else:
            tl.store(dq + p_k, b_dq.to(dq.dtype.element_ty), mask=m_t[:, None])
            tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_t[:, None])
            # without a decay nothing reads dG (linear attention and the delta rule: 0.54 GB of fp32 at B8 T8K
            # H16 that used to be written and never read)
            if DECAY > 0:
                tl.store(dgk + p_k, b_dg, mask=m_t[:, None])


@triton.jit
def _dvt_bwd_kernel(
    k,
    v,
    gc,
    beta,
    vt,
    h,
    do,
    dvt,
    akk,
    linv,
    dv,
    dbeta,
    m_qk,
    m_kk,
    x,
    scale,
    T,
    NT,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    DECAY: tl.constexpr,
    DELTA: tl.constexpr,
    LOWP: tl.constexpr,
    PRE_KG: tl.constexpr,
    PRE_X: tl.constexpr,
    VT_X: tl.constexpr,
):
    # the [BT, BT] gradients of one chunk: M_qk = dA_qk, and for the delta rule dv = T^T dVt, dbeta and
    # M_kk = diag(beta) dA with dA = -L^T dL L^T (the relative-decay parts go to _intra_bwd_kernel).
    # PRE_X (TUNE["bwd.x"]): X = V - (Gamma K) S as the forward state pass kept it, instead of from h and
    # Gamma K here. VT_X (with PRE_X, TUNE["bwd.vt_x"]): no Vt in memory; the V loop sums dO X^T and
    # dO Vt^T = (dO X^T) T^T follows it
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_c = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    p_a = ((i_b * T + o_t[:, None]) * H + i_h) * BT + o_c[None, :]
    b_dp = tl.zeros([BT, BT], dtype=tl.float32)  # dO Vt^T
    if DELTA:
        b_beta = _load_vec(beta, o_t, m_t, i_b, i_h, T, H)
        b_tm = tl.load(linv + p_a, mask=m_t[:, None], other=0.0).to(tl.float32) * b_beta[None, :]
        if not PRE_X:
            b_kg = _dot_cast(_load_qg(k, gc, o_t, m_t, i_b, i_h, T, H, K, DECAY, PRE_KG), LOWP)  # Gamma K
        # dT = dVt V^T + dW (Gamma K)^T with dW = -dVt S^T, i.e. dVt (V - (Gamma K) S)^T
        b_dtm = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(V // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
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
                p_s = (i_bh * NT + i_t) * K * V + o_k[:, None] * V + o_v[None, :]
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
        tl.store(dbeta + (i_b * T + o_t) * H + i_h, b_db, mask=m_t)


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
    i_b,
    i_h,
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
    p_m = ((i_b * T + o_r[:, None]) * H + i_h) * BT + (o_i - t0)[None, :]
    b_m = tl.load(m + p_m, mask=m_r[:, None], other=0.0).to(tl.float32)
    b_y = _load_block(y, o_i, m_i, o_k, i_b, i_h, T, H, K)  # [BT, BK]
    if DECAY == 1:
        b_gr = _load_vec(gc, o_r, m_r, i_b, i_h, T, H)
        b_gi = _load_vec(gc, o_i, m_i, i_b, i_h, T, H)
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
    i_b,
    i_h,
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
    p_mt = ((i_b * T + o_r[None, :]) * H + i_h) * BT + (o_c - t0)[:, None]
    b_mt = tl.load(m + p_mt, mask=m_r[None, :], other=0.0).to(tl.float32)
    b_x = _load_block(x, o_r, m_r, o_k, i_b, i_h, T, H, K)  # [BT, BK]
    if TWO:
        b_mt2 = tl.load(m2 + p_mt, mask=m_r[None, :], other=0.0).to(tl.float32)
        b_x2 = _load_block(x2, o_r, m_r, o_k, i_b, i_h, T, H, K)  # [BT, BK]
    if DECAY == 1:
        b_gc = _load_vec(gc, o_c, m_c, i_b, i_h, T, H)
        b_gr = _load_vec(gc, o_r, m_r, i_b, i_h, T, H)
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
    i_b,
    i_h,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BOUNDED: tl.constexpr,
    TWO: tl.constexpr,
    LOWP: tl.constexpr,
    dense,
    FTZ: tl.constexpr,
):
    # _rel_rows for the per-channel decay over only the column blocks the rows can reach (0..i_c, or 0..i_c-1
    # when the unbounded path leaves the diagonal to _rel_diag), one BC-column block at a time, instead of
    # the whole chunk masked: 2.5 blocks of y and G on average instead of 4
    o_b = tl.arange(0, BC)
    b_gr = _load_block(gc, o_r, m_r, o_k, i_b, i_h, T, H, K)
    b_ga = _load_row_block(gc, tl.minimum(r0, T - 1), o_k, i_b, i_h, T, H, K)
    b_x = tl.zeros([BC, o_k.shape[0]], dtype=tl.float32)
    b_x2 = tl.zeros([BC, o_k.shape[0]], dtype=tl.float32)
    if BOUNDED:
        n_j = i_c + 1
    else:
        n_j = i_c + dense  # (dense: this block's diagonal goes dense, see _intra_bwd_kernel)
    for j in range(0, n_j):
        o_j = t0 + j * BC + o_b
        m_j = o_j < T
        b_gj = _load_block(gc, o_j, m_j, o_k, i_b, i_h, T, H, K)
        b_yj = _load_block(y, o_j, m_j, o_k, i_b, i_h, T, H, K)
        b_yj = _dot_cast(b_yj * _exp(tl.where(m_j[:, None], b_ga[None, :] - b_gj, float("-inf")), FTZ), LOWP)
        p_m = ((i_b * T + o_r[:, None]) * H + i_h) * BT + (j * BC + o_b)[None, :]
        b_x += tl.dot(_dot_cast(tl.load(m + p_m, mask=m_r[:, None], other=0.0).to(tl.float32), LOWP), b_yj)
        if TWO:
            b_x2 += tl.dot(
                _dot_cast(tl.load(m2 + p_m, mask=m_r[:, None], other=0.0).to(tl.float32), LOWP), b_yj
            )
    b_er = _exp(tl.where(m_r[:, None], b_gr - b_ga[None, :], float("-inf")), FTZ)
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
    i_b,
    i_h,
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
    FTZ: tl.constexpr,
):
    # _rel_cols for the per-channel decay over only the row blocks that reach the columns (i_c..NC-1, or
    # i_c+1.. on the unbounded path), one BC-row block at a time
    NC: tl.constexpr = BT // BC
    o_b = tl.arange(0, BC)
    b_gc = _load_block(gc, o_c, m_c, o_k, i_b, i_h, T, H, K)
    if BOUNDED:
        b_ga = _load_row_block(gc, tl.minimum(c0, T - 1), o_k, i_b, i_h, T, H, K)
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
                m_j[:, None], _load_block(gc, o_j, m_j, o_k, i_b, i_h, T, H, K) - b_ga[None, :], float("-inf")
            ),
            FTZ,
        )
        p_mt = ((i_b * T + o_j[None, :]) * H + i_h) * BT + (o_c - t0)[:, None]  # [BC columns, BC rows]
        b_xj = _load_block(x, o_j, m_j, o_k, i_b, i_h, T, H, K)
        b_y += tl.dot(
            _dot_cast(tl.load(m + p_mt, mask=m_j[None, :], other=0.0).to(tl.float32), LOWP),
            _dot_cast(b_xj * b_ex, LOWP),
        )
        if TWO:
            b_x2j = _load_block(x2, o_j, m_j, o_k, i_b, i_h, T, H, K)
            b_y += tl.dot(
                _dot_cast(tl.load(m2 + p_mt, mask=m_j[None, :], other=0.0).to(tl.float32), LOWP),
                _dot_cast(b_x2j * b_ex, LOWP),
            )
    return b_y * _exp(tl.where(m_c[:, None], b_ga[None, :] - b_gc, float("-inf")), FTZ)


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
    i_b,
    i_h,
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
    b_g = _load_block(gc, o_r, m_r, o_k, i_b, i_h, T, H, K)  # [BC, BK]
    p_j = ((i_b * T + r0) * H + i_h) * K + o_k  # row r0 (+ j H K), columns o_k
    p_mc = ((i_b * T + o_r) * H + i_h) * BT + (r0 - t0)  # column r0 - t0 (+ j) of M, rows o_r
    p_mr = ((i_b * T + r0) * H + i_h) * BT + (o_r - t0)  # row r0 (+ j), columns o_r - t0 of M
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
    i_b,
    i_h,
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
        i_b,
        i_h,
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
        i_b,
        i_h,
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
    LOWP: tl.constexpr,
    FIRST: tl.constexpr,
    FTZ: tl.constexpr,
):
    # gradients through the relative-decay products A_qk = rel(q, k), A_kk = rel(k, k), BC rows and the BK key
    # columns [i_k BK, (i_k + 1) BK) at a time (every term is separable over the key channel):
    # rel(x, y)_ri = sum_c x_rc y_ic exp(G_rc - G_ic); dx = rel_rows(M, y), dy = rel_cols(M, x),
    # and the log-decay gets x * dx - y * dy
    i_tc, i_k, i_bh = (
        tl.program_id(0).to(tl.int64),
        tl.program_id(1).to(tl.int64),
        tl.program_id(2).to(tl.int64),
    )
    i_b, i_h = i_bh // H, i_bh % H
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
    if DECAY == 2:
        if not BOUNDED:
            # unbounded gates: this block's diagonal goes dense, as with the bounded gate, when its own decay
            # is at most e^75 in each of these key columns
            b_g0 = _load_row_block(gc, tl.minimum(r0, T - 1), o_k, i_b, i_h, T, H, K)
            b_g1 = _load_row_block(gc, tl.minimum(r0 + BC, T) - 1, o_k, i_b, i_h, T, H, K)
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
            i_b,
            i_h,
            T,
            H,
            K,
            BT,
            BC,
            BOUNDED,
            DELTA,
            LOWP,
            dense,
            FTZ,
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
            i_b,
            i_h,
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
            FTZ,
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
            i_b,
            i_h,
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
    if DECAY == 2 and not BOUNDED:
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
                i_b,
                i_h,
                T,
                H,
                K,
                BT,
                BC,
                DELTA,
            )
    b_q = _load_block(q, o_r, m_r, o_k, i_b, i_h, T, H, K)
    b_k = _load_block(k, o_r, m_r, o_k, i_b, i_h, T, H, K)
    if DELTA:
        b_dk = b_dkc + b_dkr
        b_dg = b_q * b_dq + b_k * (b_dkr - b_dkc)
    else:
        b_dk = b_dkc
        b_dg = b_q * b_dq - b_k * b_dkc
    p_k = ((i_b * T + o_r[:, None]) * H + i_h) * K + o_k[None, :]
    if FIRST:
        # before the dqk kernel (TUNE["bwd.intra_first"]): this part alone, which dqk adds to its own
        tl.store(dq + p_k, b_dq.to(dq.dtype.element_ty), mask=m_r[:, None])
        tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_r[:, None])
        if DECAY > 0:
            tl.store(dgk + p_k, b_dg.to(dgk.dtype.element_ty), mask=m_r[:, None])
    else:
        # the final dq, dk go straight into tensors of the inputs' dtype (no cast pass afterwards)
        b_dq += tl.load(dq + p_k, mask=m_r[:, None], other=0.0).to(tl.float32)
        b_dk += tl.load(dk + p_k, mask=m_r[:, None], other=0.0).to(tl.float32)
        tl.store(dq_out + p_k, b_dq.to(dq_out.dtype.element_ty), mask=m_r[:, None])
        tl.store(dk_out + p_k, b_dk.to(dk_out.dtype.element_ty), mask=m_r[:, None])
        if DECAY > 0:
            tl.store(dgk + p_k, tl.load(dgk + p_k, mask=m_r[:, None], other=0.0) + b_dg, mask=m_r[:, None])


# Launch settings (warps per program, software-pipelining stages), chosen from per-kernel profiles on an
# H200 at B8 T8K H16 (benchmarks/results/h200_profile_*.csv); None = the rule in the launch code. More
# stages buffer more tiles in shared memory (227 KB on the H200): the deeper settings are for 16-bit inputs;
# fp32 inputs (fp32 tiles, twice the bytes) asked for 240 KB with them and run the loops unpipelined.
# `python benchmarks/profile_gpu.py --set solve.warps=2 state_bwd.stages=1` tries others.
TUNE: dict[str, int | None] = {
    # None: 2 for GLA (the per-channel decay without the delta rule) with 16-bit inputs at K, V <= 128, else
    # 4. H200, B8 T8K H16: with 3 stages (run 52) GLA 0.795 -> 0.728 ms and bounded KDA 0.986 -> 0.960, with
    # one (run 56) GLA 0.617 with 2 against 0.682 with 4, bounded KDA 0.885 against 0.868; unbounded KDA
    # (capped at 128 registers) 1.08 -> 1.42 with 2. With its decayed operands folded, the bounded gate's
    # no-grad intra forward takes 2 warps at a cap of 168 registers (6 programs per SM, no spill; sm_90: 1,626
    # instructions a thread against 1,045 with 4 warps, 16% fewer a program): H200, B8 T8K H16 (run 109,
    # checked within bounds) 0.709 -> 0.651 ms, the forward 1.606 -> 1.551; 2 warps at the cap of 128 (176
    # bytes spilled) 0.791, a cap of 96 with 4 warps 0.861, 2 stages 0.752, no cap 0.709
    "intra_fwd.warps": None,
    # 1: the per-channel intra forward's tiles of exponentials as ex2.approx.ftz.f32 (_exp) on a GPU, 0:
    # tl.exp. sm_90 (occupancy.py, B8 T8K H16 no-grad): bounded KDA 1,390 -> 1,259 instructions, KDA 1,864 ->
    # 1,769, GLA 2,473 -> 2,273. H200 (run 98, checked within bounds): the intra forward 0.795 -> 0.771 ms
    # (bounded KDA), 0.978 -> 0.962 (KDA), 0.619 -> 0.608 (GLA)
    "intra_fwd.ftz": 1,
    # the same for the per-channel intra backward's triangular loops (_rel_rows_tri, _rel_cols_tri). sm_90:
    # bounded KDA 939 -> 840 instructions (8 -> 0 bytes spilled), KDA 1,494 -> 1,393, GLA 1,219 -> 1,124
    "intra_bwd.ftz": 1,
    # 1: dqk's key blocks of one chunk next to each other in launch order (grid (key blocks, chunks, B H)), so
    # that they read the chunk's dO, Vt, dVt at about the same time, instead of NT programs apart. H200, B8
    # T8K H16 (run 78): bounded KDA's dqk 2.051 -> 1.994 ms, GLA's 1.695 -> 1.689; the same for the intra
    # backward's key blocks of one 16-row block lost (1.729 -> 1.802)
    "dqk.k_inner": 1,
    # 1: with the intra backward first (the per-channel decay), dqk's epilogue loads each
    # tile where it is first needed (G, then q, then k) and stores the finished dq before k loads; 0: q, k
    # and G loaded together after the V loop. None: 1 without the delta rule (GLA). sm_90 (occupancy.py):
    # spills 56 -> 8 bytes (GLA), 344 -> 240 (both KDAs). H200, B8 T8K H16 (run 83, checked within bounds):
    # GLA's dqk 1.701 -> 1.656 ms (fwd+bwd 5.262 -> 5.216), but both KDAs' 2.008 -> 2.028
    "dqk.seq": None,
    # warps of the forward cumsum kernel (None: 4). H200, B8 T8K H16 (run 81), bounded KDA: 2 warps 0.262 ms,
    # 4 0.261, 8 0.262, 16 0.392 (at its bytes, 4.1 TB/s, whatever the warps)
    "cumsum.warps": None,
    "cumsum16.warps": None,
    # stages: 1 for the per-channel decay, whose triangular loop runs 1-4 steps (H200, B8 T8K H16, run 54:
    # bounded KDA 0.962 -> 0.886 ms, GLA 0.728 -> 0.618, KDA 1.085 -> 1.006; 2 stages 0.945, 0.653, 1.080),
    # else Triton's default 3. maxnreg (registers a thread; 0 = no cap): 128 for KDA (both gates; bounded
    # since run 73) with 16-bit inputs at K, V <= 128, else no cap.
    # benchmarks/occupancy.py (sm_90, Triton 3.9, B8 T8K H16): 194 registers hold unbounded KDA's intra
    # forward to 2 programs (8 warps) per SM, the cap allows 4 (176 bytes spilled): 1.361 -> 1.082 ms on the
    # H200 (run 31; fwd+bwd 9.56 -> 9.31). Bounded KDA (128 registers then), GLA and the delta rule: within
    # 0.005 ms either way, so no cap there
    "intra_fwd.stages": None,
    "intra_fwd.maxnreg": None,
    "solve.warps": 1,
    # registers a thread for the solve (0: no cap; sm_90 138, 14 programs of one warp per SM). None: 128 for
    # 16-bit inputs (16 programs per SM, 24 bytes spilled), else no cap. H200, B8 T8K H16 (run 98): bounded
    # KDA's solve 0.162 -> 0.144 ms with 128, 0.179 with 96
    "solve.maxnreg": None,
    # 1: the state passes' chained products (forward: X = V - (Gamma K) S, Vt = L diag(beta) X, the output's
    # state term; reverse: dVt) go through _unchain, so that Triton does not lay them out as a chain; 0:
    # straight on. None: 1 with 8 warps. With 8 warps and 64 rows a chained product had all 8 warps along
    # its rows, so on sm_90 both warpgroups computed the same 64 rows (benchmarks/occupancy.py's mma_dup
    # column); unchained, they split the columns (bounded KDA's no-grad pass: 44 -> 24 tensor-core
    # instructions a step, 255 -> 182 registers, 24 -> 0 bytes spilled). With 4 warps the layouts are the
    # same either way. H200, B8 T8K H16 (run 95, checked within bounds at B=8 H=16), GPU time per pass,
    # 0 -> 1: bounded KDA no-grad forward 1.914 -> 1.728 ms (state pass 0.680 -> 0.496), fwd+bwd 7.239 ->
    # 7.000; KDA 2.110 -> 1.932 and 7.622 -> 7.375; GDN 1.478 -> 1.246 and 6.590 -> 6.342; the delta rule
    # 4.498 -> 4.351 fwd+bwd; GLA 1.326 -> 1.246 and 5.124 -> 5.036
    "state_fwd.unchain": None,
    "state_bwd.unchain": None,
    # None: 4 where the pass writes W alone (bwd.x; H200, B8 T8K H16, run 54: 0.205 -> 0.177 ms for bounded
    # KDA and the delta rule), else 8 at K or V >= 128 and 4 below
    "wu.warps": None,
    # where the forward state pass loads each chunk's small inputs (exp(G_last), the scalar decay's G, beta:
    # too small for Triton's pipelining, so plain loads that the sequential loop waits on): 0 where they are
    # used, 1 at the top of the chunk's step, 2 one chunk ahead (loop-carried). None: 1, but 0 for the scalar
    # decay and for KDA's differentiable forward where the pass has many programs (B * H * V / 64 >= 256).
    # H200 (run 89, GPU time per pass, 0 / 1 / 2): B8 T8K H16 no-grad bounded KDA 0.817 / 0.680 / 0.909 ms
    # (forward 2.054 -> 1.918), KDA 0.827 / 0.680 / 0.900, the delta rule 0.691 / 0.586 / 0.708, GLA 0.518 /
    # 0.449 / 0.433; with a gradient GLA 0.582 / 0.520 / 0.522, the delta rule 0.940 / 0.925 / 0.890, but
    # bounded KDA 1.086 / 1.136 / 1.105; GDN 0.924 / 0.969 / 1.411 (no grad), 1.185 / 1.582 / 1.938, simple
    # GLA 0.577 / 0.656 / 0.736; B1 T64K H16 bounded KDA 1.591 / 1.386 / 1.414 with a gradient; B32 T2K H2
    # KDA 0.113 / 0.106 / 0.108
    "state_fwd.early": None,
    # 1 (None): without a gradient, where the state pass is the only reader of L and A_qk (the output and Vt
    # inside it), it loads them block lower-triangular (16-column blocks up to the row's) and the solve and
    # the intra forward do not store the zeros above (about 0.1 GB at B8 T8K H16); 0: stored and read whole.
    # H200, B8 T8K H16 (run 103, checked within bounds), no-grad forward, GPU time: bounded KDA 1.682 ->
    # 1.661 ms (intra forward 0.778 -> 0.758, solve 0.144 -> 0.137), KDA 1.867 -> 1.851, GLA 1.239 -> 1.188
    # (intra 0.610 -> 0.578, state pass 0.368 -> 0.348), the delta rule 0.958 -> 0.942, GDN 1.237 -> 1.215
    "fwd.tril": None,
    # 1 (None): the bounded gate's no-grad forward stores G times log2(e), and its
    # readers, the intra forward and the state pass's exp(G_last), take 2^x without the multiply; 0: G as
    # is. sm_90 (occupancy.py, B8 T8K H16 no-grad): the intra forward 1,626 -> 1,508 instructions, its loop
    # 367 -> 335. H200 (run 111, checked within bounds, also with slow gates): no-grad bounded KDA 1.550 ->
    # 1.529 ms GPU time (intra forward 0.651 -> 0.646, state pass 0.500 -> 0.485)
    "fwd.log2": None,
    # 1 (None): the forward's cumsum, intra, solve and state-pass kernels launched as programmatic dependent
    # launches on sm_90 and later (_pdl_start): each lets the next one's programs be placed as its own last
    # ones start, and waits for the one before it to finish before it touches memory; 0: plain launches
    "fwd.pdl": None,
    # 1 (None): with fwd.log2, the cumsum kernel stores G (fp32) only at each 16-row block's first row and
    # at the chunk's last valid row, and every row's decay from its block's first row, G_a - G, as uint16
    # in steps of 1/512 (G16_STEPS); the intra forward takes its exponentials from those (half the bytes of
    # fp32 G written and read); 0: fp32 G at every row
    "fwd.g16": None,
    # the same for the reverse state pass (exp(G_last), the scalar decay's G). None: 1 for the per-channel
    # decay where the pass has few programs (B * H * V / 64 < 256), else 0. H200 (run 89, 0 / 1 / 2): B1
    # T64K H16 bounded KDA 2.185 / 1.960 / 1.966 ms, GLA 1.885 / 1.623 / 1.651; B32 T2K H2 bounded KDA 0.157
    # / 0.137 / 0.139; B8 T8K H16 0.611 / 0.622 / 0.610, GDN 0.748 / 0.791 / 1.228
    "state_bwd.early": None,
    # None: 8 at K * BV >= 128 * 64, else 4. Until the products were unchained (state_fwd.unchain) the no-grad
    # pass without a decay (linear attention, the delta rule) took 4 where it has many programs (H200, B8
    # T8K H16, run 60: linear attention's forward 0.646 -> 0.577 ms, the delta rule's 1.253 -> 1.184);
    # unchained, 8 won there too (run 96: 0.578 -> 0.559, 1.074 -> 0.978; state pass 0.577 -> 0.483)
    "state_fwd.warps": None,
    # V columns per program (16-128): 32 below 256 programs of 64 columns, else 128 (64 for fp32 inputs or
    # head sizes over 128).
    # H200, B8 T8K H16 (run 20): 64 -> 128 took bounded KDA's forward state pass 0.61 -> 0.49 ms (the delta
    # rule's 0.46 -> 0.43); the reverse pass lost with 128 (0.80 -> 0.99) and keeps 64
    "state_fwd.bv": None,
    # 3 (Triton's default) for 16-bit inputs with K, V <= 128 (2 with state_fwd.output), else 1
    "state_fwd.stages": None,
    # 1: the output O = scale (Q Gamma) S + A_qk Vt computed inside the forward state pass, from the state and
    # Vt in registers (and, without a gradient wanted, h and Vt not stored); 0: _output_kernel, a pass of its
    # own over the stored h and Vt; None: 1 where the state pass has at least 256 programs of 64 columns
    # (B * H * V / 64; it then runs 128-column blocks), or without a gradient from B * H >= 64 on, else 0.
    # H200 (runs 44, 46): B8 T8K H16 bounded KDA no-grad forward 2.67 -> 2.44 ms, fwd+bwd 8.54 -> 8.42 (state
    # pass + output 0.88 -> 0.64 / 0.76 ms); at B1 H16 (run 48) the sweep's T = 64K went 3.93 -> 4.37 ms
    # forward, 11.34 -> 11.92 fwd+bwd; at B32 T2K H2 (run 50, with state_fwd.wy) no-grad bounded KDA 0.404 ->
    # 0.382, linear attention 0.119 -> 0.095, but fwd+bwd 1.207 -> 1.224 and the delta rule's 0.715 -> 0.743
    "state_fwd.output": None,
    # 1: the delta rule's no-grad forward computes Vt = L diag(beta) (V - (Gamma K) S) inside the state pass
    # from L, Gamma K and V, and runs no W/U pass (nothing else reads W and U there); 0: Vt = U - W S; None:
    # 1 from B * H >= 64 on (as state_fwd.output without a gradient). H200, B8 T8K H16 (run 45): bounded KDA
    # 2.46 -> 2.23 ms (W/U 0.40 ms gone, the state pass 0.64 -> 0.82), the delta rule 1.47 -> 1.27; with 4
    # warps instead of 8 (run 48) the delta rule 1.26 -> 1.18 but bounded KDA 2.24 -> 2.27; with 64-column
    # blocks (run 47) 2.55 and 1.53
    "state_fwd.wy": None,
    # 1: the delta rule's differentiable forward forms Vt = L diag(beta) (V - (Gamma K) S) in the state pass
    # as the no-grad one does, keeps X = V - (Gamma K) S (input dtype) for the dvt backward, which then reads
    # X instead of the chunk states h and Gamma K, and the W/U pass writes W alone; 0: Vt = U - W S; None: 1
    # where the state pass has at least 256 programs of 64 columns (as state_fwd.output with a gradient).
    # H200, B8 T8K H16 (run 51, checked within bounds): bounded KDA fwd+bwd 8.42 -> 8.36 ms (state pass 0.76
    # -> 1.08, W/U 0.39 -> 0.20, dvt 0.89 -> 0.70), KDA 8.65 -> 8.59, the delta rule 4.86 -> 4.77
    "bwd.x": None,
    # 1: with bwd.x and the output inside the forward state pass, the forward keeps no Vt (bf16 [B,T,H,V]):
    # the dqk and dvt backwards read X instead and apply T = L diag(beta) to their [BT, BK] / [BT, BT]
    # products after the V loop (Vt dS'^T = T (X dS'^T), dO Vt^T = (dO X^T) T^T); dvt reads one tile
    # fewer per V block. 0: Vt kept and read. None: 1 without the per-channel decay (the delta rule, GDN).
    # H200, B8 T8K H16 (run 82, checked within bounds at the wide forms): the forward state pass 0.999 ->
    # 0.927 ms (the delta rule), 1.077 -> 1.005 (bounded KDA); dvt unchanged (0.660 -> 0.656); dqk 0.807
    # -> 0.836 (the delta rule), 1.244 -> 1.287 (GDN), but 1.996 -> 2.260 for both KDAs (336 bytes
    # spilled with the extra product; 1 program per SM with it in tf32). fwd+bwd: the delta rule 4.700
    # -> 4.650, GDN 6.622 -> 6.619, bounded KDA 7.483 -> 7.674
    "bwd.vt_x": None,
    # KDA (both gates), GLA, simple GLA and linear attention (16-bit inputs, K, V <= 128) where the pass has
    # many programs (B * H * V / 64 >= 256): 128-column blocks, 8 warps, 2 stages, as the forward pass
    # (H200, B8 T8K H16, run 66: bounded KDA's reverse state pass 0.777 -> 0.607 ms, fwd+bwd 7.888 -> 7.722;
    # 128 columns at 8 warps with 1 stage 0.954, 32 columns 1.230-1.250; run 69: GLA 0.679 -> 0.509, linear
    # attention 0.598 -> 0.503, simple GLA 0.577 -> 0.552). Not for the delta rule (run 66: 0.679 -> 0.668)
    # or GDN (run 69: 0.743 -> 0.800). Else 64 columns (32 with few programs, see _block_v) and 4 warps, 2
    # stages for 16-bit inputs with K, V <= 128 (1 else). Before run 66 KDA's
    # wide pass ran 64 columns with 1 stage (run 56, 0.793 -> 0.770 against 2 stages); few programs need the
    # pipelining: at B1 H16 (run 59) 1 stage took bounded KDA's fwd+bwd at T=64K from 10.95 to 13.02 ms
    "state_bwd.warps": None,
    "state_bwd.bv": None,
    "state_bwd.stages": None,
    "dqk.warps": 4,
    # 1: the intra backward before the dqk kernel (the delta rule or the per-channel decay; not the scalar
    # decay): dqk adds the intra part to its own and reverse-cumsums dG itself, so dG is written once and no
    # _rev_cumsum_kernel runs; 0: dqk first, the intra backward adds, the cumsum kernel last. Default: 1 for
    # the per-channel decay (GLA, KDA), 0 for the delta rule alone. H200 (runs 60-61, checked within bounds):
    # bounded KDA fwd+bwd 7.976 -> 7.897 ms at B8 T8K H16 (intra backward 2.117 -> 1.745, dqk 1.550 ->
    # 2.145, no dG cumsum's 0.306; sm_90: dqk spills 216 bytes instead of 64), KDA 8.296 -> 8.212, GLA
    # 5.629 -> 5.587; B1 T64K 11.070 -> 10.988, B32 T2K 1.162 -> 1.148. The delta rule lost: 4.713 ->
    # 4.806. Run 24 (an earlier form) lost for KDA too: dqk 1.71 -> 2.59. 8 warps in
    # dqk with it: 7.897 -> 9.046 (dqk.bk=32: 8.784)
    "bwd.intra_first": None,
    "dqk.bk": None,  # key columns per program (16-128): 64
    # 3 for 16-bit inputs with K, V <= 128 (2 for the delta rule without a decay), else 1. H200, B8 T8K H16
    # (run 22): 2 stages took the delta rule's dqk kernel 1.09 -> 0.85 ms, bounded KDA's 1.71 -> 1.78
    "dqk.stages": None,
    "dvt.warps": 4,
    # 2 for 16-bit inputs with K, V <= 128 (3 where it reads X, bwd.x: H200, B8 T8K H16, run 54: 0.699 ->
    # 0.663 ms for bounded KDA and the delta rule; 3 lost with h and Gamma K, run 22), else 1
    "dvt.stages": None,
    "intra_bwd.warps": 4,
    "intra_bwd.bk": None,  # key columns per program (16-128): 64 for the per-channel decay, else 128
    # stages 3 and no register cap, except for the delta rule without decay (16-bit inputs, K, V <= 128): 2
    # stages and a cap of 128 (occupancy.py, sm_90, Triton 3.9: 151 registers and 3 programs per SM -> 128,
    # 48 bytes spilled and 4; H200, B8 T8K H16, run 31: 0.911 -> 0.814 ms). The same setting lost 0.10-0.14
    # ms for bounded and unbounded KDA and GLA (bounded KDA 2.489 -> 2.605 ms; 2 stages alone 2.627). KDA
    # (both gates; 16-bit, K, V <= 128): 3 stages and a cap of 96 (121 registers and 4 programs per SM -> 5,
    # 48 bytes spilled; run 41: bounded 2.379 -> 2.278 ms, unbounded 2.510 -> 2.407; 80 registers, 6
    # programs and 136 bytes spilled: 2.352; GLA at 96: 1.987 -> 1.990). The per-channel decay's triangular
    # loops run 1-4 steps: 1 stage there (H200, B8 T8K H16, run 54: bounded KDA 2.287 -> 2.116 ms, KDA 2.419
    # -> 2.285, GLA 1.989 -> 1.740; sm_90: bounded KDA's spill 48 -> 8 bytes, GLA 116 -> 94 registers)
    "intra_bwd.stages": None,
    "intra_bwd.maxnreg": None,
}


def set_tune(items: list[str]) -> dict[str, int | None]:
    """Apply `KEY=VALUE` overrides (the scripts' `--set`) to TUNE; returns the changed entries.
    A key TUNE does not have, or a value that is not an integer (or `none` for the launch rule), is a
    ValueError naming it and what is allowed."""
    changed: dict[str, int | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. solve.warps=2")
        if key not in TUNE:
            raise ValueError(f"--set {item!r}: unknown key {key!r}; TUNE has {sorted(TUNE)}")
        if value.lower() == "none":
            changed[key] = None
        else:
            try:
                changed[key] = int(value)
            except ValueError:
                raise ValueError(
                    f"--set {item!r}: {value!r} is not an integer (or none for the default rule)"
                ) from None
    TUNE.update(changed)
    return changed


def add_tune_argument(parser) -> None:
    """The scripts' `--set KEY=VALUE ...` (profile_gpu.py, bench_gpu.py, check_kernels.py)."""
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="override kernels.triton.chunk.TUNE entries (launch settings and tested alternatives), "
        "e.g. --set solve.warps=2 state_bwd.stages=1",
    )


def tune_from_args(args) -> dict[str, int | None]:
    """Apply the parsed `--set` to TUNE (set_tune); a bad item exits with set_tune's message."""
    try:
        return set_tune(args.set)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def _pipelined(q: torch.Tensor, K: int, V: int) -> bool:
    # software-pipelined loops for 16-bit inputs at head sizes <= 128; fp32 tiles, or 256-wide ones, in
    # several stages overflow the 227 KB of shared memory (K = V = 256 bf16: the backward asked for more)
    return q.dtype != torch.float32 and max(K, V) <= 128


def _tuned(key: str, default: int) -> int:
    value = TUNE[key]
    return default if value is None else value


def _maxnreg(key: str, default: int | None) -> int | None:
    # a register cap per thread: TUNE None = the launch code's rule (default), 0 = no cap, else the cap
    value = TUNE[key]
    if value is None:
        return default
    return value or None


def _auto(key: str, default: bool) -> bool:
    # a TUNE switch: 0 or 1 where set, else (None) the launch code's rule
    return default if TUNE[key] is None else bool(TUNE[key])


def _num_warps(big: bool) -> int:
    return 8 if big and not INTERPRET else 4


def _state_programs(B: int, H: int, V: int) -> tuple[int, bool]:
    # the state passes' programs counted in blocks of 64 V columns, and whether there are enough of them
    # (>= 256) to fill the H200 alone: the launch rules of both passes go by it (see chunk_forward)
    programs = B * H * max(1, V // 64)
    return programs, programs >= 256


def _block_v(V: int, programs: int, key: str, wide: bool = False) -> int:
    # the state passes are sequential over chunks: split V finer when B * H alone cannot fill the GPU
    if INTERPRET:
        return min(V, 32)
    if TUNE[key] is not None:
        return min(V, TUNE[key])
    # (wide: 128-column blocks once B * H fills the GPU by itself; the forward pass, 16-bit, K, V <= 128)
    return min(V, 32 if programs < 256 else (128 if wide else 64))


def _l_dtype(lowp: bool) -> torch.dtype:
    # L in bf16 for 16-bit inputs: W, U and the backward's dots take it as bf16
    # anyway; only dvt's dA = -L^T dL L^T and dbeta use it in fp32
    return torch.bfloat16 if lowp else torch.float32


@functools.cache
def _gdc_on(device: int | None) -> bool:
    # programmatic dependent launch for this CUDA device (TUNE["fwd.pdl"]): compiled kernels (not the
    # interpreter), a Triton with grid dependency control, sm_90 or later; asked once a device
    return HAS_GDC and not INTERPRET and torch.cuda.get_device_capability(device)[0] >= 9


def _g16(lowp: bool) -> bool:
    # TUNE["fwd.g16"] for 16-bit inputs only: its steps of 1/512 in the exponents (0.039% RMS) sit below
    # bf16's rounding of the operands, not below fp32's
    return lowp and bool(_tuned("fwd.g16", 1))


def _akk_dtype(lowp: bool, keep: bool) -> torch.dtype:
    # A_kk in bf16 for 16-bit inputs without a gradient, where the solve is its only reader; fp32 otherwise
    # (the dvt backward reads it too)
    return torch.bfloat16 if lowp and not keep else torch.float32


def _m_dtype(lowp: bool) -> torch.dtype:
    # M_qk, M_kk in bf16 for 16-bit inputs; the intra backward loads them into fp32
    return torch.bfloat16 if lowp else torch.float32


def chunk_forward(
    q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound, keep=True
):
    """The chunkwise forward on checked, contiguous inputs (triton_chunk checks them): returns (o, final
    state or None, the buffers chunk_backward reads or None). keep=False (no gradient wanted) keeps
    nothing and skips the chunk-entry states h and Vt where nothing else reads them."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT = chunk_size
    NT = triton.cdiv(T, BT)
    decay = 0 if g is None else (1 if g.dim() == 3 else 2)
    delta = beta is not None
    bounded = lower_bound is not None
    lowp = q.dtype != torch.float32
    pipelined = _pipelined(q, K, V)
    dev = q.device
    f32 = torch.float32
    qg = kd = kg = None
    # the state pass's programs: few (B * H small) means a long sequential pass on part of the GPU, where the
    # output and the W/U products are better left to passes that run every chunk in parallel. H200 (runs
    # 48-50): the fused forms won at B8 H16 (256 programs of 64 columns) with or without a gradient, at B32 H2
    # without one only, and lost at B1 H16
    programs, wide = _state_programs(B, H, V)
    many = B * H >= 64
    # the no-grad forward of the delta rule: Vt from L, Gamma K and V inside the state pass, no W/U pass
    wy = delta and not keep and _auto("state_fwd.wy", many)
    # the output inside the forward state pass (TUNE["state_fwd.output"]), or a pass of its own after it
    fused = _auto("state_fwd.output", wide if keep else many)
    state_early = _tuned(
        "state_fwd.early", 0 if decay == 1 or (decay == 2 and delta and keep and wide) else 1
    )
    # L and A_qk without their zeros above the diagonal blocks, where the state pass is their only reader
    # (TUNE["fwd.tril"])
    tril = not keep and fused and (wy or not delta) and BC == 16 and bool(_tuned("fwd.tril", 1))
    if decay == 2:
        # decayed queries and keys for the later kernels; they only ever feed dots (bf16 operands for 16-bit
        # inputs), so they are kept in that precision
        qg = torch.empty(B, T, H, K, device=dev, dtype=torch.bfloat16 if lowp else f32)
        kd = torch.empty_like(qg)
        # and Gamma K for W/U and the dvt backward (H200, B8 T8K H16, run 20: bounded KDA's W/U 0.60 -> 0.35
        # ms, dvt 1.44 -> 1.11, intra forward 0.96 -> 0.99)
        kg = torch.empty_like(qg) if delta else None
    # the bounded gate's no-grad forward: G stored times log2(e), its readers (the intra forward, the state
    # pass's exp(G_last)) taking 2^x without a multiply (TUNE["fwd.log2"])
    log2 = decay == 2 and bounded and not keep and bool(_tuned("fwd.log2", 1))
    # the forward's kernels as programmatic dependent launches (TUNE["fwd.pdl"]; sm_90 and later)
    pdl = q.is_cuda and bool(_tuned("fwd.pdl", 1)) and _gdc_on(q.device.index)
    on_pdl = {"launch_pdl": True} if pdl else {}
    # with fwd.log2: G's rows as 16-bit decays from their block's first row (TUNE["fwd.g16"])
    g16 = log2 and _g16(lowp)
    gq = torch.empty(g.shape, device=dev, dtype=torch.uint16) if g16 else None
    gc = None
    if g16:
        gc = torch.empty(g.shape, device=dev, dtype=f32)  # (its rows at blocks' first rows, chunks' last)
        _cumsum16_kernel[(NT * (BT // BC), B * H)](
            g, gc, gq, T, H=H, K=K, BT=BT, PDL=pdl, **on_pdl, num_warps=_tuned("cumsum16.warps", 1)
        )
    elif decay:
        gc = torch.empty(g.shape, device=dev, dtype=f32)
        _cumsum_kernel[(NT, B * H)](
            g,
            gc,
            T,
            H=H,
            K=K,
            BT=BT,
            DECAY=decay,
            LOG2=log2,
            PDL=pdl,
            num_warps=_tuned("cumsum.warps", 4),
            **on_pdl,
        )
    gcx = gc if gc is not None else q  # a valid pointer the kernels never read when DECAY == 0
    # A_qk only ever feeds dots, so 16-bit inputs keep it in bf16 (their dot operands' precision)
    aqk = torch.empty(B, T, H, BT, device=dev, dtype=torch.bfloat16 if lowp else f32)
    akk = torch.empty(B, T, H, BT, device=dev, dtype=_akk_dtype(lowp, keep)) if delta else None
    # KDA with 16-bit inputs: at most 128 registers a thread, 4 programs per SM instead of 2 (unbounded) or 3
    # (bounded) (TUNE)
    capped = pipelined and decay == 2 and delta
    # the bounded gate's no-grad intra forward: 2 warps at 168 registers (TUNE["intra_fwd.warps"]'s comment)
    narrow = capped and not keep and bounded
    _intra_fwd_kernel[(NT * (BT // BC), B * H)](
        q,
        k,
        gcx,
        gq if gq is not None else gcx,
        akk if delta else aqk,
        aqk,
        qg if qg is not None else q,
        kd if kd is not None else k,
        kg if kg is not None else k,
        scale,
        T,
        H=H,
        K=K,
        BT=BT,
        BC=BC,
        DECAY=decay,
        DELTA=delta,
        BOUNDED=bounded,
        LOWP=lowp,
        ZERO_KK=keep,
        FTZ=not INTERPRET and bool(TUNE["intra_fwd.ftz"]),
        ZERO_QK=not tril,
        LOG2=log2,
        PDL=pdl,
        G16=g16,
        **on_pdl,
        num_warps=_tuned("intra_fwd.warps", 2 if (pipelined and decay == 2 and not delta) or narrow else 4),
        num_stages=_tuned("intra_fwd.stages", 1 if decay == 2 else 3),
        maxnreg=_maxnreg("intra_fwd.maxnreg", 168 if narrow else (128 if capped else None)),
    )
    linv = w = u = vt = None
    if delta:
        linv = torch.empty(B, T, H, BT, device=dev, dtype=_l_dtype(lowp))
        _solve_kernel[(NT, B * H)](
            beta,
            akk,
            linv,
            T,
            H=H,
            BT=BT,
            BC=BC,
            PREC="tf32" if lowp else "tf32x3",
            ZERO_L=not tril,
            PDL=pdl,
            **on_pdl,
            num_warps=_tuned("solve.warps", 1),
            maxnreg=_maxnreg("solve.maxnreg", 128 if lowp else None),
        )
    # with a gradient (TUNE["bwd.x"]): the same WY form of Vt, keeping X = V - (Gamma K) S for the dvt
    # backward, and W alone from the W/U pass (the backward reads W; U only served Vt)
    keep_x = delta and keep and _auto("bwd.x", wide)
    x = torch.empty_like(v) if keep_x else None
    if delta and not wy:
        w = torch.empty_like(k)
        u = None if keep_x else torch.empty_like(v)
        _wu_kernel[(NT, B * H)](
            kg if kg is not None else k,
            v,
            gcx,
            beta,
            linv,
            w,
            u if u is not None else v,
            T,
            H=H,
            K=K,
            V=V,
            BT=BT,
            DECAY=decay,
            LOWP=lowp,
            PRE_KG=kg is not None,
            STORE_U=u is not None,
            num_warps=_tuned("wu.warps", 4 if u is None else _num_warps(K >= 128 or V >= 128)),
        )
    # intermediate states in bf16 for 16-bit inputs (they feed bf16 dots anyway), fp32 for fp32 inputs
    h_dtype = torch.bfloat16 if lowp else f32
    h = torch.empty(B, H, NT, K, V, device=dev, dtype=h_dtype) if keep or not fused else None
    # Vt: read by the backward and by _output_kernel; not kept where the backward forms it from X
    # (TUNE["bwd.vt_x"])
    vt_x = keep_x and fused and bool(_tuned("bwd.vt_x", decay != 2))
    vt = torch.empty_like(v) if delta and (keep or not fused) and not vt_x else None
    ht = torch.empty(B, H, K, V, device=dev, dtype=f32) if output_final_state else None
    o = torch.empty(B, T, H, V, device=dev, dtype=q.dtype)
    BV = _block_v(V, programs, "state_fwd.bv", wide=pipelined)
    h0 = initial_state.contiguous() if initial_state is not None else None
    dummy = v  # a valid pointer (of Vt's dtype) for the buffers a launch does not touch
    warps = _tuned("state_fwd.warps", _num_warps(K * BV >= 128 * 64))
    _state_fwd_kernel[(V // BV, B * H)](
        kd if kd is not None else k,
        v,
        gcx,
        w if w is not None else k,
        u if u is not None else v,
        vt if vt is not None else dummy,
        h if h is not None else dummy,
        h0 if h0 is not None else dummy,
        ht if ht is not None else dummy,
        qg if qg is not None else q,
        aqk,
        o,
        kg if kg is not None else k,
        linv if linv is not None else dummy,
        beta if beta is not None else dummy,
        x if x is not None else dummy,
        scale,
        T,
        NT,
        H=H,
        K=K,
        V=V,
        BT=BT,
        BV=BV,
        DECAY=decay,
        DELTA=delta,
        HAS_H0=h0 is not None,
        STORE_HT=output_final_state,
        LOWP=lowp,
        OUT=fused,
        STORE_H=h is not None,
        STORE_VT=vt is not None,
        WY=wy or keep_x,
        STORE_X=keep_x,
        UNCHAIN=bool(_tuned("state_fwd.unchain", warps > 4)),
        EARLY=state_early,
        TRIL=tril,
        LOG2=log2,
        PDL=pdl,
        **on_pdl,
        num_warps=warps,
        num_stages=_tuned("state_fwd.stages", (2 if fused else 3) if pipelined else 1),
    )
    if not fused:
        BVo = min(V, 64)
        _output_kernel[(NT, V // BVo, B * H)](
            qg if qg is not None else q,
            v,
            gcx,
            aqk,
            vt if delta else v,
            h,
            o,
            scale,
            T,
            NT,
            H=H,
            K=K,
            V=V,
            BT=BT,
            BV=BVo,
            DECAY=decay,
            DELTA=delta,
            LOWP=lowp,
            num_warps=4,
        )
    if not keep:
        return o, ht, None
    # (Gamma K only served X in the backward)
    return o, ht, (gc, aqk, akk, linv, w, vt, h, qg, kd, None if keep_x else kg, x)


def chunk_backward(q, k, v, g, beta, scale, initial_state, do, dht, chunk_size, lower_bound, saved):
    """The chunkwise backward from chunk_forward's saved buffers and the output's (and final state's)
    gradients do, dht: returns (dq, dk, dv, dg, dbeta, dh0) in the kernels' dtypes (ChunkFunction casts)."""
    gc, aqk, akk, linv, w, vt, h, qg, kd, kg, x = saved
    # the forward kept X = V - (Gamma K) S and no Vt = T X (TUNE["bwd.vt_x"]): dqk and dvt read X for it
    vt_x = beta is not None and vt is None
    B, T, H, K = q.shape
    V = v.shape[-1]
    pipelined = _pipelined(q, K, V)
    BT = chunk_size
    NT = triton.cdiv(T, BT)
    # TUNE["dqk.k_inner"]: dqk's key blocks of one chunk launched side by side (grid axis 1 holds at most
    # 65,535 chunks: T up to about 4M at 64-row chunks)
    k_inner = int(bool(TUNE["dqk.k_inner"]) and NT < 65536)
    decay = 0 if g is None else (1 if g.dim() == 3 else 2)
    delta = beta is not None
    bounded = lower_bound is not None
    lowp = q.dtype != torch.float32
    dev = q.device
    f32 = torch.float32
    gcx = gc if gc is not None else q
    do = do.contiguous()
    dvt = torch.empty(B, T, H, V, device=dev, dtype=f32 if not lowp else q.dtype)
    dh = torch.empty(B, H, NT, K, V, device=dev, dtype=h.dtype)
    dh0 = torch.empty(B, H, K, V, device=dev, dtype=f32)
    programs, wide = _state_programs(B, H, V)
    # many programs: the forward pass's 128-column blocks and 8 warps (TUNE["state_bwd.*"]); the delta rule
    # with a scalar decay or none (GDN, the delta rule) gained nothing from them until their products were
    # unchained (state_bwd.unchain; H200 run 96, B8 T8K H16 fwd+bwd: the delta rule 4.338 -> 4.165 ms, the
    # reverse pass 0.674 -> 0.505; GDN 6.312 -> 6.119, 0.747 -> 0.556)
    big = wide and pipelined
    BV = _block_v(V, programs, "state_bwd.bv", wide=big)
    # software pipelining over the chunk loop: 3 stages of its buffered loads (A_qk, q, k, G, W per stage)
    # asked for 234-304 KB of shared memory on the H200 (limit 227 KB) once NT > 1; with the decayed q, k
    # precomputed, 2 stages of 16-bit tiles fit (B8 T8K H16: 1.46 -> 0.81-0.90 ms with 4 warps)
    warps = _tuned("state_bwd.warps", _num_warps(big))
    _state_bwd_kernel[(V // BV, B * H)](
        qg if qg is not None else q,
        kd if kd is not None else k,
        gcx,
        w if delta else k,
        aqk,
        do,
        dvt,
        dh,
        dht.contiguous() if dht is not None else dh0,
        dh0,
        scale,
        T,
        NT,
        H=H,
        K=K,
        V=V,
        BT=BT,
        BV=BV,
        DECAY=decay,
        DELTA=delta,
        HAS_DHT=dht is not None,
        LOWP=lowp,
        EARLY=_tuned("state_bwd.early", 1 if decay == 2 and not wide else 0),
        UNCHAIN=bool(_tuned("state_bwd.unchain", warps > 4)),
        num_warps=warps,
        num_stages=_tuned("state_bwd.stages", 2 if pipelined else 1),
    )
    # no delta rule and no per-channel decay: the dqk kernel does the intra-chunk part as well
    fused = not delta and decay <= 1
    dq_out = torch.empty_like(q)
    dk_out = torch.empty_like(k)
    # the partial dq, dk in bf16 for 16-bit inputs (fp32's range, also for fp16 inputs), else fp32
    partial = torch.bfloat16 if lowp else f32
    dq = dq_out if fused else torch.empty(B, T, H, K, device=dev, dtype=partial)
    dk = dk_out if fused else torch.empty(B, T, H, K, device=dev, dtype=partial)
    # the intra backward first (TUNE["bwd.intra_first"]; no decay or the per-channel one, whose dG the dqk
    # kernel can reverse-cumsum per K block): it writes its partial dq, dk and dG, and dqk adds its own and
    # writes the final dq, dk and dg, so no _rev_cumsum_kernel runs and dG is not read back and rewritten
    first = not fused and decay != 1 and bool(_tuned("bwd.intra_first", decay == 2))
    # (without a decay: no dG at all; dq only stands in for the pointer)
    dgk = torch.empty(B, T, H, K, device=dev, dtype=f32) if decay else dq
    m_qk = None if fused else torch.empty(B, T, H, BT, device=dev, dtype=_m_dtype(lowp))
    m_kk = torch.empty(B, T, H, BT, device=dev, dtype=_m_dtype(lowp)) if delta else m_qk
    dv = torch.empty(B, T, H, V, device=dev, dtype=v.dtype) if delta else dvt
    dbeta = torch.empty(B, T, H, device=dev, dtype=f32) if delta else None
    dg = torch.empty_like(g) if decay else None
    # two kernels instead of one per chunk, for smaller register tiles: dq, dk, dG per K block of 64
    # (three [BT, BK] accumulators over the V loop), and the [BT, BT] matrices (M_qk, M_kk, dbeta, dv)
    BK, BVd = min(K, _tuned("dqk.bk", 64)), min(V, 64)

    # dqk after dvt (the intra backward first) with the delta rule: the V loop reads dvt's dv = T^T dVt
    # instead of dVt, and d(Gamma K) = -dv S^T needs no product with T
    dv_w = delta and first
    # the epilogue's load order (TUNE["dqk.seq"]; the per-channel decay with the intra backward first)
    seq = bool(_tuned("dqk.seq", not delta)) and first and decay == 2

    def dqk_pass():
        _dqk_bwd_kernel[(K // BK, NT, B * H) if k_inner else (NT, K // BK, B * H)](
            q,
            k,
            v,
            gcx,
            beta if delta else q,
            (x if vt_x else vt) if delta else v,
            h,
            dh,
            do,
            dv if dv_w else dvt,
            linv if delta else aqk,
            dq,
            dk,
            dgk,
            dq_out,
            dk_out,
            dg if dg is not None else dgk,
            scale,
            T,
            NT,
            H=H,
            K=K,
            V=V,
            BT=BT,
            BK=BK,
            BV=BVd,
            DECAY=decay,
            DELTA=delta,
            LOWP=lowp,
            FUSED=fused,
            K_INNER=k_inner,
            VT_X=vt_x,
            DV_W=dv_w,
            SEQ=seq,
            FINISH=first,
            num_warps=_tuned("dqk.warps", 4),
            num_stages=_tuned("dqk.stages", (2 if delta and not decay else 3) if pipelined else 1),
        )

    if fused:
        dqk_pass()
        if decay:
            _rev_cumsum_kernel[(NT, B * H)](dgk, dg, T, H=H, K=K, BT=BT, DECAY=decay)
        return dq_out, dk_out, dv, dg, dbeta, dh0
    if not first:
        dqk_pass()
    # with the delta rule, Gamma K ([BT, K]) and the state block ([K, BV]) stay resident: 8 warps at K = 128
    _dvt_bwd_kernel[(NT, B * H)](
        kg if kg is not None else k,
        v,
        gcx,
        beta if delta else q,
        vt if delta and not vt_x else v,
        h,
        do,
        dvt,
        akk if delta else aqk,
        linv if delta else aqk,
        dv,
        dbeta if delta else dq,
        m_qk,
        m_kk,
        x if x is not None else v,
        scale,
        T,
        NT,
        H=H,
        K=K,
        V=V,
        BT=BT,
        BV=BVd,
        DECAY=decay,
        DELTA=delta,
        LOWP=lowp,
        PRE_KG=kg is not None,
        PRE_X=x is not None,
        VT_X=vt_x,
        num_warps=_tuned("dvt.warps", _num_warps(delta and K >= 128)),
        num_stages=_tuned("dvt.stages", (3 if x is not None else 2) if pipelined else 1),
    )
    # tf32 rather than bf16 operands here: dG = x dx - y dy cancels, and the bounded path's e^75-scaled
    # operands left dg at 2.1e-2 relative error in bf16 on the H200
    # one program per 16-row block and per block of BKi key columns (each term is separable over channels).
    # H200, B8 T8K H16: blocks of 64 took the per-channel decay's intra backward from 7.3 to 5.0 ms (GLA)
    # and 14.3 to 8.6 ms (KDA); the other decays lost 0.15-0.4 ms to reading M twice: they keep whole rows
    BKi = min(K, _tuned("intra_bwd.bk", 64 if decay == 2 else 128))
    # the delta rule (no decay) with 16-bit inputs: 2 stages and at most 128 registers a thread, 4 programs
    # per SM instead of 3 (H200, B8 T8K H16, run 31: 0.911 -> 0.814 ms; TUNE)
    capped = pipelined and decay == 0 and delta
    # KDA, bounded or not, with 16-bit inputs: at most 96 registers, 5 programs per SM instead of 4 (48 bytes
    # spilled; H200, B8 T8K H16, run 41: 2.379 -> 2.278 ms bounded, 2.510 -> 2.407 unbounded; GLA unchanged)
    kda_capped = pipelined and decay == 2 and delta
    _intra_bwd_kernel[(NT * (BT // BC), K // BKi, B * H)](
        q,
        k,
        gcx,
        m_qk,
        m_kk,
        dq,
        dk,
        dgk,
        dq_out,
        dk_out,
        T,
        H=H,
        K=K,
        BT=BT,
        BC=BC,
        BK=BKi,
        DECAY=decay,
        DELTA=delta,
        BOUNDED=bounded,
        LOWP=False,
        FIRST=first,
        FTZ=not INTERPRET and bool(TUNE["intra_bwd.ftz"]),
        num_warps=_tuned("intra_bwd.warps", 4),
        num_stages=_tuned("intra_bwd.stages", 1 if decay == 2 else (2 if capped else 3)),
        maxnreg=_maxnreg("intra_bwd.maxnreg", 128 if capped else (96 if kda_capped else None)),
    )
    if first:
        dqk_pass()
    elif decay:
        _rev_cumsum_kernel[(NT, B * H)](dgk, dg, T, H=H, K=K, BT=BT, DECAY=decay)
    return dq_out, dk_out, dv, dg, dbeta, dh0


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
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound):
        with _resources(q, v, "chunk forward"):
            o, ht, saved = chunk_forward(
                q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound
            )
        ctx.save_for_backward(q, k, v, g, beta, initial_state, *saved)
        ctx.scale, ctx.chunk_size, ctx.lower_bound = scale, chunk_size, lower_bound
        if ht is not None:
            return o, ht
        return o

    @staticmethod
    def backward(ctx, do, dht=None):
        q, k, v, g, beta, h0, *saved = ctx.saved_tensors
        with _resources(q, v, "chunk backward"):
            dq, dk, dv, dg, dbeta, dh0 = chunk_backward(
                q, k, v, g, beta, ctx.scale, h0, do, dht, ctx.chunk_size, ctx.lower_bound, saved
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
        )
