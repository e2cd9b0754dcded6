"""One-token recurrent step for decoding (docs/design.md §1), the chunk kernels' DECAY / DELTA switches."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import family
from kernels.triton.common import INTERPRET


@triton.jit
def _step_kernel(
    q,
    k,
    v,
    g,
    beta,
    s_in,
    s_out,
    o,
    scale,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    DECAY: tl.constexpr,
    DELTA: tl.constexpr,
):
    # one (batch, head, V block): S <- (I - beta k k^T) Diag(exp g) S + beta k v^T, o = scale S^T q
    i_v, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_s = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    b_s = tl.load(s_in + p_s).to(tl.float32)  # [K, BV]
    b_q = tl.load(q + i_bh * K + o_k).to(tl.float32)
    b_k = tl.load(k + i_bh * K + o_k).to(tl.float32)
    b_v = tl.load(v + i_bh * V + o_v).to(tl.float32)
    if DECAY == "channel":
        b_s = b_s * tl.exp(tl.load(g + i_bh * K + o_k).to(tl.float32))[:, None]
    elif DECAY == "scalar":
        b_s = b_s * tl.exp(tl.load(g + i_bh).to(tl.float32))
    if DELTA:
        # erase what k reads out now, then write: S += beta k (v - S^T k)^T
        b_beta = tl.load(beta + i_bh).to(tl.float32)
        b_v = b_beta * (b_v - tl.sum(b_s * b_k[:, None], 0))
    b_s += b_k[:, None] * b_v[None, :]
    b_o = tl.sum(b_s * b_q[:, None], 0) * scale
    tl.store(s_out + p_s, b_s)
    tl.store(o + i_bh * V + o_v, b_o.to(o.dtype.element_ty))


def recurrent_step_fwd(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, V]
    g: torch.Tensor | None,  # [B, H] or [B, H, K]
    beta: torch.Tensor | None,  # [B, H]
    state: torch.Tensor,  # [B, H, K, V]
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, K = q.shape
    V = v.shape[-1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    state = state.float().contiguous()
    new_state = torch.empty_like(state)
    o = torch.empty(B, H, V, device=q.device, dtype=q.dtype)
    BV = min(V, 32)
    _step_kernel[(V // BV, B * H)](
        q,
        k,
        v,
        g.contiguous() if g is not None else q,
        beta.contiguous() if beta is not None else q,
        state,
        new_state,
        o,
        scale,
        H=H,
        K=K,
        V=V,
        BV=BV,
        DECAY=family.decay_of(q, g),
        DELTA=beta is not None,
        num_warps=1 if INTERPRET else 4,
    )
    return o, new_state
