"""The ground truth: the token-by-token recurrence of docs/design.md §1 (Kimi Linear's Eq. 1).

    S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T      (delta rule on)
    S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T                                    (delta rule off)
    o_t = scale * S_t^T q_t

`g` is the log-decay: absent (no decay), `[B, T, H]` (one scalar per head, broadcast over the K rows
of the state) or `[B, T, H, K]` (one per key channel). The delta rule is on exactly when `beta` is given.
Everything is computed in float32 (or float64 if the inputs are float64); this is slow on purpose.
"""

from __future__ import annotations

import torch


def recurrent_step(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, V]
    g: torch.Tensor | None,  # [B, H] or [B, H, K] log-decay, or None
    beta: torch.Tensor | None,  # [B, H] or None (delta rule off)
    state: torch.Tensor,  # [B, H, K, V], float32/float64
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the recurrence; returns (o_t [B, H, V] in the state's dtype, S_t [B, H, K, V])."""
    dtype = state.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if g is not None:
        decay = g.to(dtype).exp()
        # scalar decay [B, H] scales the whole state; channel decay [B, H, K] scales its rows
        state = state * (decay[..., None, None] if decay.dim() == 2 else decay[..., None])
    if beta is not None:
        b = beta.to(dtype)[..., None]  # [B, H, 1]
        # erase what k currently reads out, then write v: S += beta k (v - S^T k)^T
        v_old = torch.einsum("bhkv,bhk->bhv", state, k)
        state = state + torch.einsum("bhk,bhv->bhkv", k, b * (v - v_old))
    else:
        state = state + torch.einsum("bhk,bhv->bhkv", k, v)
    o = scale * torch.einsum("bhkv,bhk->bhv", state, q)
    return o, state


def naive_recurrent(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, H, V]
    g: torch.Tensor | None = None,  # [B, T, H] or [B, T, H, K]
    beta: torch.Tensor | None = None,  # [B, T, H]
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,  # [B, H, K, V]
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Loop `recurrent_step` over T. Returns (o [B, T, H, V] in q's dtype, final state or None)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if scale is None:
        scale = K**-0.5
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    if initial_state is None:
        state = q.new_zeros(B, H, K, V, dtype=acc)
    else:
        state = initial_state.to(acc)
    outputs = []
    for t in range(T):
        o_t, state = recurrent_step(
            q[:, t],
            k[:, t],
            v[:, t],
            None if g is None else g[:, t],
            None if beta is None else beta[:, t],
            state,
            scale,
        )
        outputs.append(o_t)
    o = torch.stack(outputs, dim=1) if outputs else q.new_zeros(B, 0, H, V, dtype=acc)
    return o.to(q.dtype), (state.float() if acc == torch.float32 else state) if output_final_state else None
