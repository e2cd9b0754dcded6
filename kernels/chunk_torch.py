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

# exp(x) is exactly 0 in float64 for x below about -745; the scalar path's cumulative log-decays are floored
# here, far enough below that a sum of floored values and ordinary ones never comes back above -745
LOG_DECAY_FLOOR = -1e4


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


def _channel_grams(
    q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, delta: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Per-channel decay: Aqk[r, i] = sum_c q_rc k_ic exp(G_rc - G_ic) for i <= r (and, delta rule only, Akk
    the same with k_r, for i < r), 0 above the diagonal; plus the decayed operands that the state pass needs.

    q, k, g: [..., C, K] (g: the per-token log-decays, <= 0). Returns Aqk, Akk or None ([..., C, C]),
    exp(G) * q, exp(G) * k or None, exp(G_C - G) * k ([..., C, K]) and exp(G_C) ([..., 1, K]), where G is the
    in-chunk cumulative log-decay.

    exp(G_r - G_i) cannot be split as exp(G_r) exp(-G_i) over a whole chunk (exp(-G_i) overflows once the
    decay has accumulated below about -88), and the pairwise [C, C, K] exponent is too big to build. Instead
    the lower triangle is assembled by halving (see kernels/README.md): in a block of 2m tokens, the block X
    (rows: second half, columns: first half) splits at ref, the last token of the first half,
        exp(G_r - G_i) = exp(sum of g over (ref, r]) * exp(sum of g over (i, ref]),
    both factors <= 1, so X is one matmul of row-scaled operands. The operands are carried from level to
    level already scaled: `rows` holds a_r exp(sum of g from the start of r's m-block through r), `cols`
    holds k_i exp(sum of g after i through the end of i's m-block); going to blocks of 2m multiplies the
    second (first) half by the decay over the other half (the product of the two halves' decays, kept per
    block). So every factor is a product of at most log2(C) + 1 factors exp(g) or block decays, all <= 1:
    no exponent is ever positive (no overflow, no masking needed), and no decay is a difference of
    chunk-wide cumulative sums, so float32 keeps it accurate relative to itself (a difference of two
    cumulative sums of size ~100 would carry their rounding, ~1e-5, into every factor, also for neighbouring
    tokens). After the last level, the carried operands are exactly the chunk-level exp(G) q, exp(G) k and
    exp(G_C - G) k, and the block decay is exp(G_C).
    """
    C = g.shape[-2]
    # forward only (no graph recorded): the carried operands are updated in place
    inplace = not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, g)))
    decay = g.exp()  # [..., C, K], <= 1
    rows = [q * decay, k * decay] if delta else [q * decay]  # level m = 1: the window (ref, r] is {r}
    cols = k.clone() if inplace else k  # level m = 1: the window (i, ref] is empty
    block_decay = decay  # [..., C / m, K]: the decay over each m-block, exp(sum of its g) <= 1
    grams = [q.new_zeros(*q.shape[:-1], C) for _ in rows]  # [..., C, C]
    # the diagonal: no decay between a token and itself; q_r . k_r as a batched matmul (no [C, K] temporary)
    grams[0].diagonal(dim1=-2, dim2=-1).copy_((q.unsqueeze(-2) @ k.unsqueeze(-1)).flatten(-3))
    m = 1
    while m < C:
        n_blk = C // (2 * m)
        # the two halves of each 2m-block as strided views [..., n_blk, m, K]: no copies
        cols_1 = cols.unflatten(-2, (n_blk, 2, m))[..., 0, :, :].transpose(-1, -2)  # [..., n_blk, K, m]
        for i, a in enumerate(rows):
            X = a.unflatten(-2, (n_blk, 2, m))[..., 1, :, :] @ cols_1  # [..., n_blk, m, m]
            # the n_blk diagonal 2m-blocks of the gram as a view [..., 2m, 2m, n_blk]; X is their lower-left
            diag = grams[i].unflatten(-1, (n_blk, 2 * m)).unflatten(-3, (n_blk, 2 * m))
            diag.diagonal(dim1=-4, dim2=-2)[..., m:, :m, :].copy_(X.movedim(-3, -1))
        # to blocks of 2m: the second half's row windows extend back over the whole first half, the first
        # half's column windows forward over the whole second half
        halves = block_decay.unflatten(-2, (n_blk, 2))  # [..., n_blk, 2, K]: the decay over each half
        if inplace:
            # no autograd graph: scale just the half that changes, in place (no full-size temporaries)
            for a in rows:
                a.unflatten(-2, (n_blk, 2, m))[..., 1, :, :].mul_(halves[..., :1, :])
            cols.unflatten(-2, (n_blk, 2, m))[..., 0, :, :].mul_(halves[..., 1:, :])
        else:
            # autograd saved the halves read by the matmuls above: new tensors, the unchanged half times 1
            ext = halves.flip(-2).unsqueeze(-2)  # [..., n_blk, 2, 1, K]: the decay over the other half
            one = torch.ones_like(ext[..., :1, :, :])
            to_second = torch.cat([one, ext[..., 1:, :, :]], dim=-3)
            rows = [(a.unflatten(-2, (n_blk, 2, m)) * to_second).flatten(-4, -2) for a in rows]
            to_first = torch.cat([ext[..., :1, :, :], one], dim=-3)
            cols = (cols.unflatten(-2, (n_blk, 2, m)) * to_first).flatten(-4, -2)
        block_decay = halves[..., 0, :] * halves[..., 1, :]  # [..., n_blk, K]
        m *= 2
    A_kk = grams[1] if delta else None
    return grams[0], A_kk, rows[0], rows[1] if delta else None, cols, block_decay


def _intra_grams(
    q: torch.Tensor, k: torch.Tensor, G: torch.Tensor | None, delta: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Aqk (incl. diagonal) and, for the delta rule only, Akk (strictly lower), with the (scalar or no) decay
    between the two positions; [..., C, C] each."""
    C = q.shape[-2]
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if G is None:
        decay = incl
    else:
        # scalar decay factors out of the inner product: one [C, C] decay matrix
        decay = (G - G.transpose(-1, -2)).masked_fill(~incl, float("-inf")).to(q.dtype).exp()  # [..., C, C]
    A_qk = (q @ k.transpose(-1, -2)) * decay
    return A_qk, (k @ k.transpose(-1, -2)) * decay * incl.tril(-1) if delta else None


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
    if g is None:
        A_qk, A_kk = _intra_grams(q_c, k_c, None, beta is not None)  # [B, H, N, C, C]
        q_in, k_in, k_out, decay_chunk = q_c, k_c, k_c, None
    else:
        if g.dim() == 4:
            # per-channel decay: the decay windows are built inside the halving, in the compute dtype
            A_qk, A_kk, q_in, k_in, k_out, decay_last = _channel_grams(
                q_c, k_c, _to_chunks(g, T, C, acc), beta is not None
            )  # [B, H, N, C, C] x 2, [B, H, N, C, K] x 3, [B, H, N, 1, K]
        else:
            # G_r: log of the decay accumulated from the chunk start through token r, [B, H, N, C, 1]. Kept
            # in float64: exponents are differences G_r - G_i of values that reach -100s, and in float32 the
            # rounding of G (ulp(300) ~ 3e-5) would show up directly as a relative error of every factor.
            # A decay of zero (g = -inf: forget everything) is legal, but -inf - -inf is NaN in the
            # differences below; any g below LOG_DECAY_FLOOR already has exp(g) = 0 in float64, so flooring it
            # changes no factor (nor any gradient: both are 0 there).
            G = _to_chunks(g.clamp(min=LOG_DECAY_FLOOR).unsqueeze(-1), T, C, torch.float64).cumsum(-2)
            A_qk, A_kk = _intra_grams(q_c, k_c, G, beta is not None)  # [B, H, N, C, C]
            G_last = G[..., -1:, :]  # [B, H, N, 1, 1]
            decay_in = G.to(acc).exp()  # [B, H, N, C, 1], <= 1
            q_in, k_in = q_c * decay_in, k_c * decay_in  # read the decayed chunk-start state
            k_out = k_c * (G_last - G).to(acc).exp()  # a write at r decays until the chunk end
            decay_last = G_last.to(acc).exp()
        decay_chunk = decay_last.transpose(-1, -2)  # [B, H, N, K or 1, 1]: rows of the state

    if beta is not None:
        b = _to_chunks(beta, T, C, acc).unsqueeze(-1)  # [B, H, N, C, 1]
        eye = torch.eye(C, dtype=acc, device=q.device)
        # UT transform: Delta = U - W S0, [U, W] = T Diag(beta) [V, exp(G) K], T = (I + Diag(beta) Akk)^-1.
        # The state pass applies it as Delta = (T Diag(beta)) (V - (exp(G) K) S0): the same products, but no
        # U and W to precompute, and the explicit inverse of the unit-triangular C x C matrix (one triangular
        # solve per chunk) spares LAPACK's column-major copy of a [C, V + K] right-hand side.
        T_inv = torch.linalg.solve_triangular(
            eye + b * A_kk, eye.expand_as(A_kk), upper=False, unitriangular=True
        )  # [B, H, N, C, C]
        T_n = (T_inv * b.transpose(-1, -2)).unbind(2)  # N x [B, H, C, C]: T Diag(beta), column i times beta_i
    else:
        T_n = [None] * N

    S = q.new_zeros(B, H, K, V, dtype=acc) if initial_state is None else initial_state.to(acc)
    # unbind, not indexing: the backward of N index ops would write N full-size zero gradients (O(N^2) work)
    v_n = v_c.unbind(2)  # N x [B, H, C, V]
    k_in_n = [None] * N if k_in is None else k_in.unbind(2)  # N x [B, H, C, K]
    k_out_n = k_out.transpose(-1, -2).unbind(2)  # N x [B, H, K, C]
    decay_n = [None] * N if decay_chunk is None else decay_chunk.unbind(2)  # N x [B, H, K or 1, 1]
    A_qk_n = A_qk.unbind(2)  # N x [B, H, C, C]
    q_in_n = q_in.unbind(2)  # N x [B, H, C, K]
    outs = []
    for n in range(N):
        # pseudo-values: what each token writes once the chunk-start state has been erased
        delta = v_n[n] if T_n[n] is None else T_n[n] @ (v_n[n] - k_in_n[n] @ S)  # [B, H, C, V]
        # the output reads the decayed chunk-start state and the chunk's own writes; computed here, so that
        # the N chunk-start states are never stacked (an [N, K, V] tensor per head). In place on fresh results
        # (matmul does not save its output for backward), to spare an allocation per op.
        outs.append((q_in_n[n] @ S).add_(A_qk_n[n] @ delta).mul_(scale))  # [B, H, C, V]
        write = k_out_n[n] @ delta  # [B, H, K, V]
        S = write.add_(S) if decay_n[n] is None else torch.addcmul(write, decay_n[n], S)
    o = torch.stack(outs, dim=2)  # [B, H, N, C, V]
    o = o.flatten(2, 3)[:, :, :T].movedim(2, 1)  # [B, T, H, V]
    return o.to(q.dtype), S if output_final_state else None
