"""Stage 3 of the forward, the delta rule only: the UT transform L = (I + diag(beta) A_kk)^-1 (one program per
chunk, one warp), and the WY representation W = L diag(beta) (Gamma K), U = L diag(beta) V. The solve
branches on neither switch; W/U on DECAY (Gamma K).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from kernels.triton.common import (
    BC,
    _dot_cast,
    _head,
    _load_rows,
    _load_vec,
    _pdl_start,
    _rows,
)

if TYPE_CHECKING:
    from kernels.triton.plan import ForwardPlan


@triton.jit
def _a_block(
    akk,
    beta,
    t0,
    i: tl.constexpr,
    j: tl.constexpr,
    T,
    H: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    # block (i, j) (BC x BC) of diag(beta) A_kk inside the chunk starting at t0 (akk, beta at the program's
    # head); rows past T are 0
    o_b = tl.arange(0, BC)
    o_r = t0 + i * BC + o_b
    m_r = o_r < T
    b_a = tl.load(akk + o_r[:, None] * (H * BT) + (j * BC + o_b)[None, :], mask=m_r[:, None], other=0.0)
    return b_a * _load_vec(beta, o_r, m_r, H)[:, None]


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
    # share. H200, B8 T8K H16: 0.162 ms, against 0.295 for forward substitution on the diagonal
    # blocks (15 dependent steps of reductions) with fp32 FMA products; 3xTF32 products there: 0.309 ms
    _pdl_start(PDL)
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    # the program's base pointers: its head's rows
    bh = _head(i_bh, T, H)
    beta += bh
    akk, linv = _rows((akk, linv), bh, BT)
    t0 = i_t * BT
    NC: tl.constexpr = BT // BC
    b_l00 = _inv_unit_lower(_a_block(akk, beta, t0, 0, 0, T, H, BT, BC), BC, PREC)
    if NC >= 2:
        b_l11 = _inv_unit_lower(_a_block(akk, beta, t0, 1, 1, T, H, BT, BC), BC, PREC)
    if NC == 4:
        b_l22 = _inv_unit_lower(_a_block(akk, beta, t0, 2, 2, T, H, BT, BC), BC, PREC)
        b_l33 = _inv_unit_lower(_a_block(akk, beta, t0, 3, 3, T, H, BT, BC), BC, PREC)
    _store_block(linv, b_l00, t0, 0, 0, T, H, BT, BC)
    if NC >= 2:
        b_l10 = -tl.dot(
            b_l11,
            tl.dot(_a_block(akk, beta, t0, 1, 0, T, H, BT, BC), b_l00, input_precision=PREC),
            input_precision=PREC,
        )
        _store_block(linv, b_l11, t0, 1, 1, T, H, BT, BC)
        _store_block(linv, b_l10, t0, 1, 0, T, H, BT, BC)
    if NC == 4:
        b_a20 = _a_block(akk, beta, t0, 2, 0, T, H, BT, BC)
        b_a21 = _a_block(akk, beta, t0, 2, 1, T, H, BT, BC)
        b_a30 = _a_block(akk, beta, t0, 3, 0, T, H, BT, BC)
        b_a31 = _a_block(akk, beta, t0, 3, 1, T, H, BT, BC)
        b_a32 = _a_block(akk, beta, t0, 3, 2, T, H, BT, BC)
        b_l21 = -tl.dot(b_l22, tl.dot(b_a21, b_l11, input_precision=PREC), input_precision=PREC)
        b_l32 = -tl.dot(b_l33, tl.dot(b_a32, b_l22, input_precision=PREC), input_precision=PREC)
        b_s20 = tl.dot(b_a20, b_l00, input_precision=PREC) + tl.dot(b_a21, b_l10, input_precision=PREC)
        b_l20 = -tl.dot(b_l22, b_s20, input_precision=PREC)
        b_s31 = tl.dot(b_a31, b_l11, input_precision=PREC) + tl.dot(b_a32, b_l21, input_precision=PREC)
        b_l31 = -tl.dot(b_l33, b_s31, input_precision=PREC)
        b_s30 = tl.dot(b_a30, b_l00, input_precision=PREC) + tl.dot(b_a31, b_l10, input_precision=PREC)
        b_s30 += tl.dot(b_a32, b_l20, input_precision=PREC)
        b_l30 = -tl.dot(b_l33, b_s30, input_precision=PREC)
        _store_block(linv, b_l22, t0, 2, 2, T, H, BT, BC)
        _store_block(linv, b_l33, t0, 3, 3, T, H, BT, BC)
        _store_block(linv, b_l21, t0, 2, 1, T, H, BT, BC)
        _store_block(linv, b_l32, t0, 3, 2, T, H, BT, BC)
        _store_block(linv, b_l20, t0, 2, 0, T, H, BT, BC)
        _store_block(linv, b_l31, t0, 3, 1, T, H, BT, BC)
        _store_block(linv, b_l30, t0, 3, 0, T, H, BT, BC)
    # the blocks above the diagonal are 0; the W/U kernel and the backward read L whole (ZERO_L; not where the
    # state pass loads it block lower-triangular, the plan's tril)
    if ZERO_L:
        o_t = t0 + tl.arange(0, BT)
        m_t = o_t < T
        o_c = tl.arange(0, BT)
        p_a = o_t[:, None] * (H * BT) + o_c[None, :]
        tl.store(
            linv + p_a,
            tl.zeros([BT, BT], dtype=tl.float32).to(linv.dtype.element_ty),
            mask=m_t[:, None] & (o_c[None, :] // BC > o_c[:, None] // BC),
        )


@triton.jit
def _store_block(
    linv,
    b_x,
    t0,
    i: tl.constexpr,
    j: tl.constexpr,
    T,
    H: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    o_b = tl.arange(0, BC)
    o_r = t0 + i * BC + o_b
    tl.store(
        linv + o_r[:, None] * (H * BT) + (j * BC + o_b)[None, :],
        b_x.to(linv.dtype.element_ty),
        mask=(o_r < T)[:, None],
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
    RAW: tl.constexpr,
):
    # W = L diag(beta) (Gamma K), U = L diag(beta) V (the WY representation), one chunk per program. For the
    # per-channel decay k holds Gamma K already (written by the intra forward), or with RAW (the backward's
    # W under recompute_states) k itself, decayed here by exp(G) as the intra forward does. Without u (None)
    # only W (the state pass then forms Vt from L and V itself, the plan's keep_x)
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    # the program's base pointers: its head's rows
    bh = _head(i_bh, T, H)
    k, w = _rows((k, w), bh, K)
    v += bh * V
    beta += bh
    linv += bh * BT
    if DECAY == "scalar":
        gc += bh
    if RAW:
        gc += bh * K
    if u is not None:
        u += bh * V
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    p_a = o_t[:, None] * (H * BT) + tl.arange(0, BT)[None, :]
    b_beta = _load_vec(beta, o_t, m_t, H)  # [BT]
    b_lf = tl.load(linv + p_a, mask=m_t[:, None], other=0.0).to(tl.float32)
    b_tm = _dot_cast(b_lf * b_beta[None, :], LOWP)
    b_k = _load_rows(k, o_t, m_t, H, K)
    if DECAY == "scalar":
        b_k = b_k * tl.exp(_load_vec(gc, o_t, m_t, H))[:, None]
    if RAW:
        b_k = b_k * tl.exp(tl.where(m_t[:, None], _load_rows(gc, o_t, m_t, H, K), 0.0))
    b_w = tl.dot(b_tm, _dot_cast(b_k, LOWP))  # [BT, K]
    p_w = o_t[:, None] * (H * K) + tl.arange(0, K)[None, :]
    tl.store(w + p_w, b_w.to(w.dtype.element_ty), mask=m_t[:, None])
    if u is not None:
        b_v = _load_rows(v, o_t, m_t, H, V)
        b_u = tl.dot(b_tm, _dot_cast(b_v, LOWP))  # [BT, V]
        p_u = o_t[:, None] * (H * V) + tl.arange(0, V)[None, :]
        tl.store(u + p_u, b_u.to(u.dtype.element_ty), mask=m_t[:, None])


def _l_dtype(lowp: bool) -> torch.dtype:
    # L in bf16 for 16-bit inputs: W, U and the backward's dots take it as bf16 anyway; only dvt's
    # dA = -L^T dL L^T and dbeta use it in fp32
    return torch.bfloat16 if lowp else torch.float32


def solve(beta: torch.Tensor, akk: torch.Tensor, fp: ForwardPlan) -> torch.Tensor:
    """L = (I + diag(beta) A_kk)^-1, [B, T, H, C] (with the plan's tril the blocks above the diagonal
    unwritten)."""
    p = fp.problem
    B, T, H, BT, NT = p.B, p.T, p.H, p.chunk_size, p.NT
    linv = torch.empty(B, T, H, BT, device=akk.device, dtype=_l_dtype(p.lowp))
    _solve_kernel[(NT, B * H)](
        beta,
        akk,
        linv,
        T,
        H=H,
        BT=BT,
        BC=BC,
        PREC=fp.solve_prec,
        ZERO_L=not fp.tril,
        PDL=fp.pdl,
        **({"launch_pdl": True} if fp.pdl else {}),
        num_warps=fp.solve.warps,
        maxnreg=fp.solve.maxnreg,
    )
    return linv


def wu(
    k: torch.Tensor,
    v: torch.Tensor,
    gc: torch.Tensor | None,
    beta: torch.Tensor,
    linv: torch.Tensor,
    kg: torch.Tensor | None,
    fp: ForwardPlan,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(W, U), where the plan runs the W/U pass (else None, None): W = L diag(beta) (Gamma K) and, unless
    the plan keeps X (the backward then reads W alone; U only served Vt), U = L diag(beta) V. For the
    per-channel decay without kg (Gamma K not kept: the backward's W under recompute_states) the pass
    decays k by exp(G) itself."""
    if not fp.runs_wu:
        return None, None
    p = fp.problem
    B, T, H, K, V, BT, NT = p.B, p.T, p.H, p.K, p.V, p.chunk_size, p.NT
    w = torch.empty_like(k)
    u = None if fp.keep_x else torch.empty_like(v)
    raw = p.decay == "channel" and kg is None
    _wu_kernel[(NT, B * H)](
        kg if kg is not None else k,
        v,
        gc,
        beta,
        linv,
        w,
        u,
        T,
        H=H,
        K=K,
        V=V,
        BT=BT,
        DECAY=p.decay,
        LOWP=p.lowp,
        RAW=raw,
        num_warps=fp.wu.warps,
    )
    return w, u
