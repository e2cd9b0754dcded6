"""Stage 4 of the forward: the state pass, sequential over chunks per (batch, head, V block), writing the
chunk-entry states h, the pseudo-values Vt and the final state, and (the plan's `out`) the output O =
scale (Q Gamma) S + A_qk Vt; else the output kernel after it. Branches on DECAY (the state's decay) and on
DELTA (Vt = U - W S, or from L and X in the WY form). The backward of a forward that kept no h (the op's
recompute_states) runs the pass again for h alone (`rebuild_states`).
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
    _load_vec,
    _pdl_start,
    _rows,
    _unchain,
)

if TYPE_CHECKING:
    from kernels.triton.chunk import Saved
    from kernels.triton.plan import ForwardPlan


# T and NT are not specialised: Triton 3.6 on the H200 miscompiled this kernel's WY form specialised for one
# chunk (NT == 1, T <= 64): wrong outputs at T = 63 and an illegal memory access at T = 16 and 32, while the
# interpreter and every T of more than one chunk were right; unspecialised, T = 1..2048 all match
@triton.jit(do_not_specialize=["T", "NT"])
def _state_fwd_kernel(
    keys,
    vals,
    mats,
    gc,
    beta,
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
    TRIL: tl.constexpr,
    LOG2: tl.constexpr,
    PDL: tl.constexpr,
):
    # sequential over chunks for one (batch, head, V block): h[c] = state entering chunk c (h given: kept for
    # the backward and, without OUT, for _output_kernel); h0, ht: the initial and final states where given.
    # OUT (o given, the plan's out): also this V block of the chunk's output O = scale (Q Gamma) S + A_qk Vt,
    # from the state and Vt still in registers, instead of a separate pass that reads both back from memory.
    # vt given: Vt kept (the backward, _output_kernel). DELTA: beta given (the delta rule).
    # WY (linv given, the plan's wy or keep_x): Vt = L diag(beta) (V - (Gamma K) S) from L, Gamma K (kg; k
    # and G without a per-channel decay) and V, so that no W/U pass runs; else Vt = U - W S from _wu_kernel,
    # U in v's place and W in kg's.
    # x given (with WY, the plan's keep_x): X = V - (Gamma K) S kept for the dvt backward, in the input dtype.
    # A buffer a launch does not read or write is None; 16-bit inputs (LOWP) take bf16 dot operands.
    # EARLY (the plan's state_early): the chunk's small inputs (_chunk_small) loaded at the top of the
    # chunk's step, else where used. With WY, L is taken as loaded times diag(beta) X, beta on the rows of X
    # (in registers).
    # TRIL (the plan's tril): L and A_qk loaded block lower-triangular (16-column blocks up to the row's),
    # the zeros above not stored by the solve and the intra forward.
    # kr given (rebuild_states, the per-channel decay): the raw keys, from which and G the pass forms K_d
    # where k is None and Gamma K where kg is None, as the intra forward writes them (fp32 inputs keep no
    # decayed copies, keep_x no Gamma K).
    # Tuples: keys (q, k, kg, kr), vals (v, vt, x, o), mats (aqk, linv), states (h, h0, ht)
    q, k, kg, kr = keys
    v, vt, x, o = vals
    aqk, linv = mats
    h, h0, ht = states
    DELTA: tl.constexpr = beta is not None
    WY: tl.constexpr = linv is not None
    OUT: tl.constexpr = o is not None
    # q's dtype is the op's dot dtype (Q exp(G) is kept in it); v is bf16 in fp32-q,k training
    LOWP: tl.constexpr = q.dtype.element_ty != tl.float32
    _pdl_start(PDL)
    i_v, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    # the program's base pointers: its head's rows of the [B, T, H, *] tensors, its (batch, head)'s states
    bh = _head(i_bh, T, H)
    if kr is None:
        q, k, kg = _rows((q, k, kg), bh, K)
    else:
        q, kr = _rows((q, kr), bh, K)
        if k is not None:
            k += bh * K
        if kg is not None:
            kg += bh * K
    v += bh * V
    if OUT:
        o += bh * V
    aqk += bh * BT
    if DECAY != "none":
        gc = _decay_head(gc, bh, K, DECAY)
    if WY:
        linv += bh * BT
        beta += bh
    if vt is not None:
        vt += bh * V
    if x is not None:
        x += bh * V
    if h is not None:
        h += i_bh * NT * K * V
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_s = o_k[:, None] * V + o_v[None, :]
    if h0 is not None:
        b_s = tl.load(h0 + i_bh * K * V + p_s).to(tl.float32)
    else:
        b_s = tl.zeros([K, BV], dtype=tl.float32)
    for i_t in range(NT):
        if EARLY:
            b_gv, b_b = _chunk_small(gc, beta, i_t, T, H, K, BT, DECAY, DELTA and WY, LOG2)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        if kr is not None:
            b_g = _load_rows(gc, o_t, m_t, H, K)  # the chunk's G, for the raw keys
        o_cb = tl.arange(0, BT)
        if TRIL:
            m_tc = m_t[:, None] & (o_cb[None, :] // 16 <= o_cb[:, None] // 16)
        else:
            m_tc = m_t[:, None]
        if h is not None:
            tl.store(h + i_t * K * V + p_s, b_s.to(h.dtype.element_ty))
        p_v = o_t[:, None] * (H * V) + o_v[None, :]
        # the state as a dot operand: what h holds (bf16 for 16-bit inputs), so OUT matches _output_kernel
        b_sd = _dot_cast(b_s, LOWP)
        if DELTA:
            if WY:
                # pseudo-values Vt = L diag(beta) (V - (Gamma K) S), the WY form of U - W S
                if kg is None:
                    b_kg = _load_rows(kr, o_t, m_t, H, K) * tl.exp(tl.where(m_t[:, None], b_g, 0.0))
                else:
                    b_kg = _load_rows(kg, o_t, m_t, H, K)
                if EARLY:
                    b_kg = _decay_rows(b_kg, b_gv, DECAY)
                elif DECAY == "scalar":
                    b_kg = b_kg * tl.exp(_load_vec(gc, o_t, m_t, H))[:, None]
                b_x = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
                b_x -= _unchain(tl.dot(_dot_cast(b_kg, LOWP), b_sd), T > 0, UNCHAIN)
                if x is not None:
                    tl.store(x + p_v, b_x.to(x.dtype.element_ty), mask=m_t[:, None])
                # (the rows of L here and of A_qk below: one expression twice, left where the revision
                # checked on the H200 computes them; hoisted above the branches it compiles in another order)
                p_l = o_t[:, None] * (H * BT) + tl.arange(0, BT)[None, :]
                # L as loaded, beta on the rows of X: L (diag(beta) X)
                b_tm = tl.load(linv + p_l, mask=m_tc, other=0.0)
                if EARLY:
                    b_x = b_x * b_b[:, None]
                else:
                    b_x = b_x * _load_vec(beta, o_t, m_t, H)[:, None]
                b_vt = _unchain(tl.dot(_dot_cast(b_tm, LOWP), _dot_cast(b_x, LOWP)), T > 0, UNCHAIN)
            else:
                # pseudo-values Vt = U - W S: the delta rule's correction against the entering state (W in
                # kg's place, U in v's)
                b_w = _load_rows(kg, o_t, m_t, H, K)
                b_vt = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
                b_vt -= tl.dot(_dot_cast(b_w, LOWP), b_sd)
            if vt is not None:
                tl.store(vt + p_v, b_vt.to(vt.dtype.element_ty), mask=m_t[:, None])
            # the output reads Vt as stored (the input dtype, v's), as _output_kernel does
            b_vo = b_vt.to(v.dtype.element_ty).to(tl.float32)
        else:
            b_vt = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
            b_vo = b_vt
        if OUT:
            if EARLY:
                b_qg = _decay_rows(_load_rows(q, o_t, m_t, H, K), b_gv, DECAY)
            else:
                b_qg = _load_qg(q, gc, o_t, m_t, H, K, DECAY)
            p_a = o_t[:, None] * (H * BT) + tl.arange(0, BT)[None, :]
            b_a = tl.load(aqk + p_a, mask=m_tc, other=0.0)
            b_o = _unchain(tl.dot(_dot_cast(b_qg, LOWP), b_sd), T > 0, UNCHAIN) * scale
            b_o += tl.dot(_dot_cast(b_a, LOWP), _dot_cast(b_vo, LOWP))
            tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_t[:, None])
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        if k is None:
            # (kr: K_d = K exp(G_last - G), the intra forward's expression)
            b_gl = _load_row(gc, t_last, T, H, K)
            b_kd = _load_rows(kr, o_t, m_t, H, K) * tl.exp(tl.where(m_t[:, None], b_gl[None, :] - b_g, 0.0))
            b_dl = b_gv if EARLY else tl.exp(b_gl)
        elif EARLY:
            b_kd, b_dl = _key_decay_from(k, b_gv, o_t, m_t, t_last, H, K, DECAY)
        else:
            b_kd, b_dl = _key_decay_to_end(k, gc, o_t, m_t, t_last, T, H, K, DECAY)
        b_s = b_s * b_dl[:, None] + tl.dot(tl.trans(_dot_cast(b_kd, LOWP)), _dot_cast(b_vt, LOWP))
    if ht is not None:
        tl.store(ht + i_bh * K * V + p_s, b_s)


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
    # the program's base pointers (its head's rows, its chunk's entering state)
    bh = _head(i_bh, T, H)
    q += bh * K
    v, o = _rows((v, o), bh, V)
    aqk += bh * BT
    if DECAY != "none":
        gc = _decay_head(gc, bh, K, DECAY)
    if DELTA:
        vt += bh * V
    h += (i_bh * NT + i_t) * K * V
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    b_s = tl.load(h + o_k[:, None] * V + o_v[None, :]).to(tl.float32)
    b_qg = _load_qg(q, gc, o_t, m_t, H, K, DECAY)
    b_a = tl.load(aqk + o_t[:, None] * (H * BT) + tl.arange(0, BT)[None, :], mask=m_t[:, None], other=0.0)
    p_v = o_t[:, None] * (H * V) + o_v[None, :]
    if DELTA:
        b_vt = tl.load(vt + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
    else:
        b_vt = tl.load(v + p_v, mask=m_t[:, None], other=0.0).to(tl.float32)
    b_o = tl.dot(_dot_cast(b_qg, LOWP), _dot_cast(b_s, LOWP)) * scale
    b_o += tl.dot(_dot_cast(b_a, LOWP), _dot_cast(b_vt, LOWP))
    tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_t[:, None])


def state_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gc: torch.Tensor | None,
    beta: torch.Tensor | None,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    aqk: torch.Tensor,
    linv: torch.Tensor | None,
    w: torch.Tensor | None,
    u: torch.Tensor | None,
    qg: torch.Tensor | None,
    kd: torch.Tensor | None,
    kg: torch.Tensor | None,
    fp: ForwardPlan,
    keep_h: bool = True,
) -> tuple[torch.Tensor | None, ...]:
    """(O, final state, h, Vt, X), each None where the plan does not write it (O is allocated always and
    written here only with the plan's `out`; `output` writes it otherwise). keep_h False (the op's
    recompute_states): h only where `output` reads it."""
    p = fp.problem
    B, T, H, K, V, NT = p.B, p.T, p.H, p.K, p.V, p.NT
    dev = q.device
    keep_x = fp.keep_x
    x = torch.empty_like(v) if keep_x else None
    store_h = fp.store_h and (keep_h or not fp.out)
    h = torch.empty(B, H, NT, K, V, device=dev, dtype=_h_dtype(p.lowp)) if store_h else None
    vt = torch.empty_like(v) if fp.store_vt else None
    ht = torch.empty(B, H, K, V, device=dev, dtype=torch.float32) if output_final_state else None
    o = torch.empty(B, T, H, V, device=dev, dtype=q.dtype)
    h0 = initial_state.contiguous() if initial_state is not None else None
    # the delta rule's W/U form: U and W stand where the WY form reads V and Gamma K
    wu = p.delta_rule and not (fp.wy or keep_x)
    # (None for the buffers this launch does not touch: o without the plan's out, L without the WY form)
    _launch(
        (
            qg if qg is not None else q,
            kd if kd is not None else k,
            w if wu else (kg if kg is not None else k),
            None,
        ),
        (u if wu else v, vt, x, o if fp.out else None),
        (aqk, None if wu else linv),
        gc,
        beta,
        (h, h0, ht),
        scale,
        fp,
        fp.pdl,
    )
    return o, ht, h, vt, x


def _launch(keys, vals, mats, gc, beta, states, scale: float, fp: ForwardPlan, pdl: bool) -> None:
    # the state pass over the plan's grid and settings (the forward's, and rebuild_states' without PDL)
    p = fp.problem
    _state_fwd_kernel[(p.V // fp.state_bv, p.B * p.H)](
        keys,
        vals,
        mats,
        gc,
        beta,
        states,
        scale,
        p.T,
        p.NT,
        H=p.H,
        K=p.K,
        V=p.V,
        BT=p.chunk_size,
        BV=fp.state_bv,
        DECAY=p.decay,
        UNCHAIN=fp.state_unchain,
        EARLY=fp.state_early,
        TRIL=fp.tril,
        LOG2=fp.log2,
        PDL=pdl,
        **({"launch_pdl": True} if pdl else {}),
        num_warps=fp.state.warps,
        num_stages=fp.state.stages,
    )


def _h_dtype(lowp: bool) -> torch.dtype:
    # intermediate states in bf16 for 16-bit inputs (they feed bf16 dots anyway), fp32 for fp32 inputs
    return torch.bfloat16 if lowp else torch.float32


def rebuild_states(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None,
    scale: float,
    initial_state: torch.Tensor | None,
    saved: Saved,
    fp: ForwardPlan,
) -> Saved:
    """`saved` with what a forward under recompute_states left to its backward: h (its largest buffer), by
    the forward's state pass (its plan `fp`) again on the same operands, writing h alone; and with X kept
    W, which only the reverse state pass reads, by the W pass."""
    from kernels.triton import solve

    p = fp.problem
    B, H, K, V, NT = p.B, p.H, p.K, p.V, p.NT
    channel = p.decay == "channel"
    wu = p.delta_rule and not fp.keep_x
    w, u = saved.w, None
    if p.delta_rule:
        # the W/U pass again: the W/U form's U (not kept; it writes the kept W too), the WY form's W (not
        # kept), its Gamma K formed from k and G where not kept
        rebuilt, u = solve.wu(k, v, saved.gc, beta, saved.linv, saved.kg, fp)
        w = w if w is not None else rebuilt
    # the operands of the forward's launch: V without the delta rule; L, beta, V and Gamma K in the WY form
    # (keep_x); W and U in the W/U form (the form of few programs). The per-channel decay's K_d and Gamma K
    # where kept (16-bit inputs), else None: the pass forms them from k and G as the intra forward does (the
    # bounded gate's in other factors, a few ulps apart)
    kd = saved.kd if channel else k
    kg = w if wu else (saved.kg if channel and p.delta_rule else k)
    raw = k if kd is None or kg is None else None
    h = torch.empty(B, H, NT, K, V, device=q.device, dtype=_h_dtype(p.lowp))
    _launch(
        (q, kd, kg, raw),
        (u if wu else v, None, None, None),
        (saved.aqk, None if wu else saved.linv),
        saved.gc,
        beta,
        (h, initial_state.contiguous() if initial_state is not None else None, None),
        scale,
        fp,
        False,
    )
    return saved._replace(h=h, w=w)


def output(
    q: torch.Tensor,
    v: torch.Tensor,
    gc: torch.Tensor | None,
    scale: float,
    aqk: torch.Tensor,
    vt: torch.Tensor | None,
    h: torch.Tensor,
    qg: torch.Tensor | None,
    o: torch.Tensor,
    fp: ForwardPlan,
) -> None:
    """O = scale (Q Gamma) S + A_qk Vt into o, from the states h and Vt the state pass wrote."""
    p = fp.problem
    B, T, H, K, V, BT, NT = p.B, p.T, p.H, p.K, p.V, p.chunk_size, p.NT
    BVo = fp.output_bv
    _output_kernel[(NT, V // BVo, B * H)](
        qg if qg is not None else q,
        v,
        gc,
        aqk,
        vt if p.delta_rule else v,
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
        DECAY=p.decay,
        DELTA=p.delta_rule,
        LOWP=p.lowp,
        num_warps=4,
    )
