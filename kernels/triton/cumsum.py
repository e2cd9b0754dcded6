"""Stage 1 of the forward and last of the backward: G, the chunk-local cumsum of the log decay g (one
program per chunk), or with the plan's g16 the uint16 decays within 16-row blocks; and dg, the reverse
cumsum of dG (the scalar decay's). Branches on DECAY ("scalar", "channel"; nothing runs for "none"); no
delta rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from kernels.triton.common import BC, G16_STEPS, LOG2E, _decay_head, _head, _load_rows, _pdl_start, _rows

if TYPE_CHECKING:
    from kernels.triton.plan import BackwardPlan, ForwardPlan


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
    # the program's base pointers: its head's rows
    bh = _head(i_bh, T, H)
    g = _decay_head(g, bh, K, DECAY)
    gc = _decay_head(gc, bh, K, DECAY)
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    if DECAY == "channel":
        o_k = tl.arange(0, K)
        p = o_t[:, None] * (H * K) + o_k[None, :]
        b_g = tl.load(g + p, mask=m_t[:, None], other=0.0).to(tl.float32)
        b_gc = tl.cumsum(b_g, axis=0)
        if LOG2:
            tl.store(gc + p, b_gc * LOG2E, mask=m_t[:, None])
        else:
            tl.store(gc + p, b_gc, mask=m_t[:, None])
    else:
        p = o_t * H
        b_g = tl.load(g + p, mask=m_t, other=0.0).to(tl.float32)
        tl.store(gc + p, tl.cumsum(b_g, axis=0), mask=m_t)


@triton.jit
def _cumsum16_kernel(g, gc, gq, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, PDL: tl.constexpr):
    # the plan's g16 (the bounded gate's no-grad forward, with its log2): one 16-row block of a chunk per
    # program (one warp, its rows in each thread's registers): every row's decay from the block's first
    # row a, G_a - G = -(g summed over the rows after a, up to the row), times log2(e) in steps of 1/512 as
    # uint16 (gq); G itself (times log2(e), fp32, gc) only at the block's first row and, in the block that
    # holds it, at the chunk's last valid row: the rows the intra forward and the state pass read. The
    # earlier blocks of the chunk are summed again for the prefix (from L2: their programs run alongside)
    _pdl_start(PDL)
    i_tc, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    # the program's base pointers: its head's rows
    g, gc, gq = _rows((g, gc, gq), _head(i_bh, T, H), K)
    NC: tl.constexpr = BT // 16
    i_t, i_c = i_tc // NC, i_tc % NC
    t0 = i_t * BT
    r0 = t0 + i_c * 16
    if r0 < T:
        o_k = tl.arange(0, K)
        b_s = tl.zeros([K], dtype=tl.float32)  # g summed over the chunk's rows before this block
        for j in range(0, i_c):
            o_j = t0 + j * 16 + tl.arange(0, 16)
            b_s += tl.sum(_load_rows(g, o_j, o_j < T, H, K), 0)
        o_r = r0 + tl.arange(0, 16)
        m_r = o_r < T
        p = o_r[:, None] * (H * K) + o_k[None, :]
        b_g = tl.load(g + p, mask=m_r[:, None], other=0.0).to(tl.float32)
        b_g0 = tl.where((tl.arange(0, 16) == 0)[:, None], b_g, 0.0)
        b_d = tl.cumsum(b_g - b_g0, axis=0) * (-LOG2E * G16_STEPS)  # >= 0 for g <= 0
        b_d = tl.minimum(tl.maximum(b_d, 0.0) + 0.5, 65535.0)  # rounded (the conversion truncates)
        tl.store(gq + p, b_d.to(tl.uint16), mask=m_r[:, None])
        b_ga = b_s + tl.sum(b_g0, 0)
        tl.store(gc + r0 * (H * K) + o_k, b_ga * LOG2E)
        t_last = tl.minimum(t0 + BT, T) - 1
        if t_last < r0 + 16:
            tl.store(gc + t_last * (H * K) + o_k, (b_s + tl.sum(b_g, 0)) * LOG2E)


@triton.jit
def _rev_cumsum_kernel(dgk, dg, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr):
    # G = chunk-local cumsum(g), so dg is the reverse cumsum of dG inside each chunk, summed over K first: the
    # scalar decay's (the per-channel decay's dqk reverse-cumsums its own, the plan's first), in g's dtype
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    # the program's base pointers: its head's rows (dgk [B, T, H, K], dg [B, T, H])
    bh = _head(i_bh, T, H)
    dgk += bh * K
    dg += bh
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    b_dg = _load_rows(dgk, o_t, m_t, H, K)
    b_s = tl.cumsum(tl.sum(b_dg, 1), axis=0, reverse=True)
    tl.store(dg + o_t * H, b_s.to(dg.dtype.element_ty), mask=m_t)


def cumsum_forward(
    g: torch.Tensor | None, fp: ForwardPlan
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(G, uint16 decays): the chunk-local cumsum of g in fp32 (None without a decay) and, with the plan's
    g16, the decays within 16-row blocks (else None; G then holds only the rows its readers take)."""
    p = fp.problem
    B, T, H, K, BT, NT = p.B, p.T, p.H, p.K, p.chunk_size, p.NT
    pdl = fp.pdl
    on_pdl = {"launch_pdl": True} if pdl else {}
    gq = torch.empty(g.shape, device=g.device, dtype=torch.uint16) if fp.g16 else None
    gc = None
    if fp.g16:
        # (G's rows at the blocks' first rows and the chunks' last only)
        gc = torch.empty(g.shape, device=g.device, dtype=torch.float32)
        _cumsum16_kernel[(NT * (BT // BC), B * H)](
            g, gc, gq, T, H=H, K=K, BT=BT, PDL=pdl, **on_pdl, num_warps=fp.cumsum16.warps
        )
    elif p.decay != "none":
        gc = torch.empty(g.shape, device=g.device, dtype=torch.float32)
        _cumsum_kernel[(NT, B * H)](
            g,
            gc,
            T,
            H=H,
            K=K,
            BT=BT,
            DECAY=p.decay,
            LOG2=fp.log2,
            PDL=pdl,
            num_warps=fp.cumsum.warps,
            **on_pdl,
        )
    return gc, gq


def rev_cumsum(dgk: torch.Tensor, dg: torch.Tensor, bp: BackwardPlan) -> None:
    """dg = the reverse cumsum of dG (dgk) inside each chunk, summed over K: the scalar decay's."""
    p = bp.problem
    _rev_cumsum_kernel[(p.NT, p.B * p.H)](dgk, dg, p.T, H=p.H, K=p.K, BT=p.chunk_size)
