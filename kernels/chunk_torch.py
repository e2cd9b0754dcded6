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

# Per-channel decay: the Gram matrices are built from sub-chunks of this many tokens (see _channel_gram)
SUB_CHUNK = 16


def _to_chunks(x: torch.Tensor, T: int, C: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, ...] -> [B, H, N, C, ...] in `dtype`, zero-padded to N * C tokens.

    Padded tokens (k = v = g = beta = 0) leave the state unchanged; their outputs are sliced off.
    """
    x = x.to(dtype).movedim(1, 2)  # [B, H, T, ...]
    pad = -T % C
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], dim=2)
    return x.unflatten(2, (-1, C))


def _channel_gram(a: torch.Tensor, b: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """L[r, i] = sum_c a_rc b_ic exp(G_rc - G_ic) for i <= r, 0 above the diagonal, with per-channel G.

    a: [..., C, K] (extra leading dims broadcast against b and G), b, G: [..., C, K] -> [..., C, C].
    exp(G_r - G_i) cannot be split into exp(G_r) exp(-G_i) over a whole chunk (exp(-G_i) overflows once the
    decay has accumulated below about -88), so the chunk is cut into sub-chunks of s tokens:
    - diagonal s x s blocks: the pairwise exponent G_r - G_i, [..., s, s, K], masked to i <= r before exp;
    - below-diagonal blocks, column block j: split at the reference point G_ref = G at block j's last token:
      exp(G_r - G_i) = exp(G_r - G_ref) exp(G_ref - G_i); for rows r after block j and columns i inside it
      both factors are <= 1, so one matmul per column block computes the whole block column safely.
    """
    C, K = G.shape[-2:]
    s = min(SUB_CHUNK, C)
    n_s = C // s
    G_b = G.unflatten(-2, (n_s, s))  # [..., n_s, s, K]
    a_b = a.unflatten(-2, (n_s, s))
    b_b = b.unflatten(-2, (n_s, s))

    incl_s = torch.ones(s, s, dtype=torch.bool, device=G.device).tril()
    pair = G_b.unsqueeze(-2) - G_b.unsqueeze(-3)  # [..., n_s, s (r), s (i), K] = G_r - G_i
    pair_decay = pair.masked_fill(~incl_s[:, :, None], float("-inf")).exp()
    # sum_c a_rc (b_ic exp(G_rc - G_ic)): one batched mat-vec per row r
    diag = ((pair_decay * b_b.unsqueeze(-3)) @ a_b.unsqueeze(-1)).squeeze(-1)  # [..., n_s, s, s]
    eye = torch.eye(n_s, dtype=G.dtype, device=G.device)
    # place block a of `diag` at rows a*s.., cols a*s..: out[.., a, r, b, i] = diag[.., a, r, i] * [a == b]
    L = (diag.unsqueeze(-2) * eye[:, None, :, None]).flatten(-4, -3).flatten(-2, -1)  # [..., C, C]
    if n_s == 1:
        return L

    G_ref = G_b[..., :-1, -1, :]  # [..., n_s - 1, K]: G at the last token of column block j
    pos = torch.arange(C, device=G.device)
    rows_after = pos[None, :] >= (torch.arange(1, n_s, device=G.device) * s)[:, None]  # [n_s - 1, C]
    row_exp = (G.unsqueeze(-3) - G_ref.unsqueeze(-2)).masked_fill(~rows_after[:, :, None], float("-inf"))
    a_ref = a.unsqueeze(-3) * row_exp.exp()  # [..., n_s - 1, C, K]: rows after block j, decayed to G_ref
    b_ref = b_b[..., :-1, :, :] * (G_ref.unsqueeze(-2) - G_b[..., :-1, :, :]).exp()  # [..., n_s - 1, s, K]
    below = a_ref @ b_ref.transpose(-1, -2)  # [..., n_s - 1, C, s]: column block j of L
    below = torch.cat(
        [below, below.new_zeros(*below.shape[:-3], 1, C, s)], dim=-3
    )  # last block: diagonal only
    return L + below.movedim(-3, -2).flatten(-2, -1)  # [..., C, n_s, s] -> [..., C, C]


def _intra_grams(
    q: torch.Tensor, k: torch.Tensor, G: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Aqk incl. diagonal, Akk strictly lower) with the decay between the two positions; [..., C, C] each."""
    C = q.shape[-2]
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict = incl.tril(-1)
    if G is None:
        return (q @ k.transpose(-1, -2)) * incl, (k @ k.transpose(-1, -2)) * strict
    if G.shape[-1] == 1:
        # scalar decay factors out of the inner product: one [C, C] decay matrix
        decay = (G - G.transpose(-1, -2)).masked_fill(~incl, float("-inf")).exp()  # [..., C, C]
        return (q @ k.transpose(-1, -2)) * decay, (k @ k.transpose(-1, -2)) * decay * strict
    # both Grams share the pairwise decays: stack q and k on a new leading dim
    L = _channel_gram(torch.stack([q, k]), k, G)
    return L[0], L[1] * strict


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
    # a short sequence needs no full chunk: the result does not depend on C, only the cost does
    C = min(chunk_size, max(16, 1 << max(T - 1, 0).bit_length()))

    q_c = _to_chunks(q, T, C, acc) * scale  # [B, H, N, C, K]
    k_c = _to_chunks(k, T, C, acc)  # [B, H, N, C, K]
    v_c = _to_chunks(v, T, C, acc)  # [B, H, N, C, V]
    N = q_c.shape[2]
    # G_r: log of the decay accumulated from the chunk start through token r, [B, H, N, C, 1 or K]
    G = None if g is None else _to_chunks(g if g.dim() == 4 else g.unsqueeze(-1), T, C, acc).cumsum(-2)

    A_qk, A_kk = _intra_grams(q_c, k_c, G)  # [B, H, N, C, C]
    if G is None:
        q_in, k_in, k_out, decay_chunk = q_c, k_c, k_c, None
    else:
        G_last = G[..., -1:, :]  # [B, H, N, 1, K or 1]
        q_in, k_in = q_c * G.exp(), k_c * G.exp()  # read the decayed chunk-start state
        k_out = k_c * (G_last - G).exp()  # a write at r decays until the chunk end
        decay_chunk = G_last.exp().transpose(-1, -2)  # [B, H, N, K or 1, 1]: rows of the state

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
    starts, deltas = [], []
    for n in range(N):
        starts.append(S)
        # pseudo-values: what each token writes once the chunk-start state has been erased
        delta = U[:, :, n] if W is None else U[:, :, n] - W[:, :, n] @ S  # [B, H, C, V]
        deltas.append(delta)
        S_decayed = S if decay_chunk is None else decay_chunk[:, :, n] * S
        S = S_decayed + k_out[:, :, n].transpose(-1, -2) @ delta  # [B, H, K, V]
    S0 = torch.stack(starts, dim=2)  # [B, H, N, K, V]
    D = torch.stack(deltas, dim=2)  # [B, H, N, C, V]

    o = q_in @ S0 + A_qk @ D  # [B, H, N, C, V]
    o = o.flatten(2, 3)[:, :, :T].movedim(2, 1)  # [B, T, H, V]
    return o.to(q.dtype), S if output_final_state else None
