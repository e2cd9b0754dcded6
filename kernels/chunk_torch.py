"""The chunkwise form of the family recurrence in plain torch: vectorised, differentiable by autograd.

The derivation (chunk form, WY representation, UT transform, decay handling) is in kernels/README.md;
the names below follow it. Within a chunk of C tokens, with G the in-chunk cumulative log-decay
(G_r = g_1 + ... + g_r):

    Delta = (I + A)^-1 Diag(beta) (V - (exp(G) * K) S0)     pseudo-values (Delta = V without delta rule)
    O     = scale * ((exp(G) * Q) S0 + tril(Aqk) Delta)
    S_C   = exp(G_C) * S0 + (exp(G_C - G) * K)^T Delta

with A[r, i] = beta_r sum_c k_rc k_ic exp(G_rc - G_ic) for i < r and Aqk[r, i] the same with q_r, for i <= r.
All intra-chunk work (the Gram matrices, the triangular solve) is batched over every chunk at once; only the
state pass S0 -> S_C loops over chunks. Every exponent is a difference G_r - G_i with r >= i (masked before
exp), or G_r itself, so no exp() overflows however negative g is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _to_chunks(x: torch.Tensor, T: int, C: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, ...] -> [B, H, N, C, ...] in `dtype`, zero-padded to N * C tokens.

    Padded tokens (k = v = g = beta = 0) leave the state unchanged; their outputs are sliced off.
    """
    x = x.movedim(1, 2).to(dtype)  # [B, H, T, ...]
    pad = -T % C
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    # contiguous once here, instead of a hidden copy in every matmul that reads the strided view
    return x.unflatten(2, (-1, C)).contiguous()


def _channel_grams(rows: tuple[torch.Tensor, ...], b: torch.Tensor, G: torch.Tensor) -> list[torch.Tensor]:
    """For each a in rows: L[r, i] = sum_c a_rc b_ic exp(G_rc - G_ic) for i <= r, 0 above the diagonal.

    a, b: [..., C, K], G: [..., C, K] per-channel cumulative log-decay -> [..., C, C] per a.
    exp(G_r - G_i) cannot be split as exp(G_r) exp(-G_i) over a whole chunk (exp(-G_i) overflows once the
    decay has accumulated below about -88), and the pairwise [C, C, K] exponent is too big to build. Instead
    the lower triangle is assembled bottom-up by halving (see kernels/README.md): a block of 2m tokens is
    [[L_first, 0], [X, L_second]] where the off-diagonal block X (rows: second half, columns: first half)
    splits at the reference point G_ref = G at the last token of the first half,
        exp(G_r - G_i) = exp(G_r - G_ref) exp(G_ref - G_i),
    both factors <= 1, so X is one matmul. Each level costs O(C K) elementwise per chunk, log2(C) levels.
    The rows share the decay factors, so q and k are handled in one pass.
    """
    C = G.shape[-2]
    dtype = b.dtype
    # level m = 1: the diagonal, no decay between a token and itself; C diagonal blocks of size 1
    Ls = [(a * b).sum(-1)[..., None, None] for a in rows]  # [..., C, 1, 1]
    m = 1
    while m < C:
        n_blk = C // (2 * m)
        # unbind, not indexing: its backward is one stack, not a zero-filled full-size tensor per index
        G_1, G_2 = G.unflatten(-2, (n_blk, 2, m)).unbind(-3)  # [..., n_blk, m, K] first / second halves
        G_ref = G_1[..., -1:, :]  # [..., n_blk, 1, K]
        # exponents are differences of the (float64) cumsum, formed before rounding to the compute dtype
        decay_row = (G_2 - G_ref).to(dtype).exp()  # <= 1
        decay_col = (G_ref - G_1).to(dtype).exp()  # <= 1
        b_1 = b.unflatten(-2, (n_blk, 2, m)).unbind(-3)[0] * decay_col  # [..., n_blk, m, K]
        for i, a in enumerate(rows):
            a_2 = a.unflatten(-2, (n_blk, 2, m)).unbind(-3)[1] * decay_row
            X = a_2 @ b_1.transpose(-1, -2)  # [..., n_blk, m, m]
            L_1, L_2 = Ls[i].unflatten(-3, (n_blk, 2)).unbind(-3)  # [..., n_blk, m, m] each
            top = torch.cat([L_1, torch.zeros_like(X)], dim=-1)
            Ls[i] = torch.cat([top, torch.cat([X, L_2], dim=-1)], dim=-2)  # [..., n_blk, 2m, 2m]
        m *= 2
    return [L.squeeze(-3) for L in Ls]


def _intra_grams(
    q: torch.Tensor, k: torch.Tensor, G: torch.Tensor | None, delta: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Aqk (incl. diagonal) and, for the delta rule only, Akk (strictly lower), with the decay between the two
    positions; [..., C, C] each."""
    C = q.shape[-2]
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict = incl.tril(-1)
    if G is None:
        decay = incl
    elif G.shape[-1] == 1:
        # scalar decay factors out of the inner product: one [C, C] decay matrix
        decay = (G - G.transpose(-1, -2)).masked_fill(~incl, float("-inf")).to(q.dtype).exp()  # [..., C, C]
    else:
        grams = _channel_grams((q, k) if delta else (q,), k, G)
        return grams[0], grams[1] * strict if delta else None
    A_qk = (q @ k.transpose(-1, -2)) * decay
    return A_qk, (k @ k.transpose(-1, -2)) * decay * strict if delta else None


def chunk_torch(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, H, V]
    g: torch.Tensor | None,  # None, [B, T, H] or [B, T, H, K] log-decay
    beta: torch.Tensor | None,  # None (delta rule off) or [B, T, H]
    scale: float,
    initial_state: torch.Tensor | None,  # [B, H, K, V]
    output_final_state: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise family op (inputs validated by kernels/ops.py). Returns (o in q's dtype, S_T or None)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    if T == 0:
        S = q.new_zeros(B, H, K, V, dtype=acc) if initial_state is None else initial_state.to(acc)
        return q.new_zeros(B, 0, H, V), S if output_final_state else None
    # a short sequence needs no full chunk: the result does not depend on C, only the cost does
    C = min(chunk_size, max(16, 1 << max(T - 1, 0).bit_length()))

    q_c = _to_chunks(q, T, C, acc)  # [B, H, N, C, K]
    k_c = _to_chunks(k, T, C, acc)  # [B, H, N, C, K]
    v_c = _to_chunks(v, T, C, acc)  # [B, H, N, C, V]
    N = q_c.shape[2]
    # G_r: log of the decay accumulated from the chunk start through token r, [B, H, N, C, 1 or K]. Kept in
    # float64: exponents are differences G_r - G_i of values that reach -100s, and in float32 the rounding of
    # G (ulp(300) ~ 3e-5) would show up directly as a relative error of every decay factor.
    G = (
        None
        if g is None
        else _to_chunks(g if g.dim() == 4 else g.unsqueeze(-1), T, C, torch.float64).cumsum(-2)
    )

    A_qk, A_kk = _intra_grams(q_c, k_c, G, beta is not None)  # [B, H, N, C, C]
    if G is None:
        q_in, k_in, k_out, decay_chunk = q_c, k_c, k_c, None
    else:
        G_last = G[..., -1:, :]  # [B, H, N, 1, K or 1]
        decay_in = G.to(acc).exp()  # [B, H, N, C, K or 1], <= 1
        q_in, k_in = q_c * decay_in, k_c * decay_in  # read the decayed chunk-start state
        k_out = k_c * (G_last - G).to(acc).exp()  # a write at r decays until the chunk end
        decay_chunk = G_last.to(acc).exp().transpose(-1, -2)  # [B, H, N, K or 1, 1]: rows of the state

    if beta is not None:
        b = _to_chunks(beta, T, C, acc).unsqueeze(-1)  # [B, H, N, C, 1]
        eye = torch.eye(C, dtype=acc, device=q.device)
        # UT transform: (I + Diag(beta) Akk) [U, W] = Diag(beta) [V, exp(G) K], one triangular solve per chunk
        UW = torch.linalg.solve_triangular(
            eye + b * A_kk, b * torch.cat([v_c, k_in], dim=-1), upper=False, unitriangular=True
        )
        U, W = UW[..., :V], UW[..., V:]  # [B, H, N, C, V], [B, H, N, C, K]
    else:
        U, W = v_c, None

    S = q.new_zeros(B, H, K, V, dtype=acc) if initial_state is None else initial_state.to(acc)
    # unbind, not indexing: the backward of N index ops would write N full-size zero gradients (O(N^2) work)
    U_n = U.unbind(2)  # N x [B, H, C, V]
    W_n = [None] * N if W is None else W.unbind(2)  # N x [B, H, C, K]
    k_out_n = k_out.transpose(-1, -2).unbind(2)  # N x [B, H, K, C]
    decay_n = [None] * N if decay_chunk is None else decay_chunk.unbind(2)  # N x [B, H, K or 1, 1]
    starts, deltas = [], []
    for n in range(N):
        starts.append(S)
        # pseudo-values: what each token writes once the chunk-start state has been erased
        delta = U_n[n] if W_n[n] is None else U_n[n] - W_n[n] @ S  # [B, H, C, V]
        deltas.append(delta)
        S_decayed = S if decay_n[n] is None else decay_n[n] * S
        S = S_decayed + k_out_n[n] @ delta  # [B, H, K, V]
    S0 = torch.stack(starts, dim=2)  # [B, H, N, K, V]
    D = torch.stack(deltas, dim=2)  # [B, H, N, C, V]

    o = (q_in @ S0 + A_qk @ D) * scale  # [B, H, N, C, V]
    o = o.flatten(2, 3)[:, :, :T].movedim(2, 1)  # [B, T, H, V]
    return o.to(q.dtype), S if output_final_state else None
