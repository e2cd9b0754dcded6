"""Stage 1 of the backward: the reverse state pass, sequential over chunks from the last per (batch, head,
V block): dh (the gradient of the state leaving each chunk), dVt = A_qk^T dO + K_d dS' and dh0. Branches on
DECAY (the decay of dS) and on DELTA (dS' takes -W^T dVt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from kernels.triton.common import (
    _chunk_small,
    _decay_head,
    _decay_rows,
    _dot_cast,
    _head,
    _key_decay_from,
    _key_decay_to_end,
    _load_qg,
    _load_row,
    _load_rows,
    _rows,
    _unchain,
)

if TYPE_CHECKING:
    from kernels.triton.chunk import Saved
    from kernels.triton.plan import BackwardPlan


@triton.jit
def _state_bwd_kernel(
    q,
    k,
    gc,
    w,
    aqk,
    do,
    dvt,
    states,
    scale,
    T,
    NT,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    DECAY: tl.constexpr,
    EARLY: tl.constexpr,
    UNCHAIN: tl.constexpr,
    DECAYED: tl.constexpr,
):
    # reverse over chunks: dh[c] = gradient w.r.t. the state leaving chunk c; dVt = A_qk^T dO + K_d dS'
    # (dht: the final state's gradient where given; a buffer a launch does not read is None). states: (dh,
    # dht, dh0).
    # EARLY (the plan's state_early): the chunk's decay (_chunk_small) loaded at the top of the chunk's
    # step, else where used. DELTA: w given (the delta rule). LOWP: 16-bit inputs, told by q (Q exp(G) is
    # kept in the op's dot dtype; v is bf16 in fp32-q,k training). DECAYED (the per-channel decay): q, k
    # hold the forward's Q exp(G) and K_d (the plan's keep_decayed), else the pass forms them from G
    DELTA: tl.constexpr = w is not None
    LOWP: tl.constexpr = q.dtype.element_ty != tl.float32
    i_v, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    # the program's base pointers: its head's rows of the [B, T, H, *] tensors, its (batch, head)'s states
    bh = _head(i_bh, T, H)
    dh, dht, dh0 = states
    q, k = _rows((q, k), bh, K)
    aqk += bh * BT
    do, dvt = _rows((do, dvt), bh, V)
    if DECAY != "none":
        gc = _decay_head(gc, bh, K, DECAY)
    if DELTA:
        w += bh * K
    dh += i_bh * NT * K * V
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_s = o_k[:, None] * V + o_v[None, :]
    if dht is not None:
        b_ds = tl.load(dht + i_bh * K * V + p_s).to(tl.float32)
    else:
        b_ds = tl.zeros([K, BV], dtype=tl.float32)
    for i_r in range(NT):
        i_t = NT - 1 - i_r
        if EARLY:
            b_gv, _ = _chunk_small(gc, gc, i_t, T, H, K, BT, DECAY, False)
        tl.store(dh + i_t * K * V + p_s, b_ds.to(dh.dtype.element_ty))
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        p_v = o_t[:, None] * (H * V) + o_v[None, :]
        p_a = o_t[:, None] * (H * BT) + tl.arange(0, BT)[None, :]
        b_a = tl.load(aqk + p_a, mask=m_t[:, None], other=0.0)
        b_do = tl.load(do + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        if DECAY == "channel" and not DECAYED:
            # K_d = K exp(G_last - G) and Q exp(G) from the chunk's rows of G, both <= 1 (G falls along the
            # chunk): its [BT, K] tile of G loaded once for both
            b_g = _load_rows(gc, o_t, m_t, H, K)
            b_gl = _load_row(gc, t_last, T, H, K)
            b_dl = b_gv if EARLY else tl.exp(b_gl)
            b_kd = _load_rows(k, o_t, m_t, H, K) * tl.exp(tl.where(m_t[:, None], b_gl[None, :] - b_g, 0.0))
        elif EARLY:
            b_kd, b_dl = _key_decay_from(k, b_gv, o_t, m_t, t_last, H, K, DECAY)
        else:
            b_kd, b_dl = _key_decay_to_end(k, gc, o_t, m_t, t_last, T, H, K, DECAY)
        b_dvt = _unchain(tl.dot(tl.trans(_dot_cast(b_a, LOWP)), _dot_cast(b_do, LOWP)), T > 0, UNCHAIN)
        b_dvt += tl.dot(_dot_cast(b_kd, LOWP), _dot_cast(b_ds, LOWP))
        b_dvt = _unchain(b_dvt, T > 0, UNCHAIN and DELTA)  # (with the delta rule it feeds W^T dVt)
        tl.store(dvt + p_v, b_dvt.to(dvt.dtype.element_ty), mask=m_t[:, None])
        if DECAY == "channel" and not DECAYED:
            b_qg = _load_rows(q, o_t, m_t, H, K) * tl.exp(tl.where(m_t[:, None], b_g, 0.0))
        elif EARLY:
            b_qg = _decay_rows(_load_rows(q, o_t, m_t, H, K), b_gv, DECAY)
        else:
            b_qg = _load_qg(q, gc, o_t, m_t, H, K, DECAY)
        b_ds_new = (
            b_ds * b_dl[:, None] + tl.dot(tl.trans(_dot_cast(b_qg, LOWP)), _dot_cast(b_do, LOWP)) * scale
        )
        if DELTA:
            b_w = _load_rows(w, o_t, m_t, H, K)
            b_ds_new -= tl.dot(tl.trans(_dot_cast(b_w, LOWP)), _dot_cast(b_dvt, LOWP))
        b_ds = b_ds_new
    tl.store(dh0 + i_bh * K * V + p_s, b_ds)


def state_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    do: torch.Tensor,
    dht: torch.Tensor | None,
    saved: Saved,
    bp: BackwardPlan,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dVt, dh, dh0): dVt in the inputs' dtype for 16-bit inputs (fp32 for fp32), dh in h's, dh0 fp32."""
    p = bp.problem
    B, T, H, K, V, BT, NT = p.B, p.T, p.H, p.K, p.V, p.chunk_size, p.NT
    dev = q.device
    dvt = torch.empty(B, T, H, V, device=dev, dtype=torch.float32 if not p.lowp else q.dtype)
    dh = torch.empty(B, H, NT, K, V, device=dev, dtype=saved.h.dtype)
    dh0 = torch.empty(B, H, K, V, device=dev, dtype=torch.float32)
    BV = bp.state_bv
    _state_bwd_kernel[(V // BV, B * H)](
        saved.qg if saved.qg is not None else q,
        saved.kd if saved.kd is not None else k,
        saved.gc,
        saved.w,
        saved.aqk,
        do,
        dvt,
        (dh, dht.contiguous() if dht is not None else None, dh0),
        scale,
        T,
        NT,
        H=H,
        K=K,
        V=V,
        BT=BT,
        BV=BV,
        DECAY=p.decay,
        EARLY=bp.state_early,
        UNCHAIN=bp.state_unchain,
        DECAYED=saved.qg is not None,
        num_warps=bp.state.warps,
        num_stages=bp.state.stages,
    )
    return dvt, dh, dh0
