"""Triton kernels of the family: chunkwise forward/backward (`triton_chunk`) and the decode step.

See README.md beside this file for the algorithm, the buffers kept for the backward and the
bounded-gate fast path. Set TRITON_INTERPRET=1 before importing triton to run them on the CPU.
"""

from __future__ import annotations

import torch

from kernels import family
from kernels.triton import chunk as _chunk
from kernels.triton.chunk import ChunkFunction
from kernels.triton.common import INTERPRET, MIN_LOWER_BOUND
from kernels.triton.compile import compiled_chunk
from kernels.triton.recurrent import recurrent_step_fwd

if INTERPRET:
    # on the CPU, bf16 dots and casts as a GPU computes them: the 16-bit path runs there too
    from kernels.triton import interpret

    interpret.patch()

__all__ = ["VARIANTS", "triton_chunk", "triton_recurrent_step"]

# The variants the GPU check and benchmark run, as (name, decay, delta rule, lower_bound): the family table's
# ops (kernels.family.OPS) in its words, KDA with K3's bounded gate (g_min = -5) on its fast path among them.
VARIANTS = [(o.name, o.decay, o.delta_rule, o.lower_bound) for o in family.OPS]

HEAD_SIZES = (16, 32, 64, 128, 256)
CHUNK_SIZES = (16, 32, 64)


# KDA's op widens 16-bit q, k, beta to fp32 (triton_chunk says why); False runs its 16-bit kernels, for
# benchmarks/lowp_regimes.py to measure them
WIDE_KDA_KEYS = True


def _wants_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd will want gradients of any of the tensors (None entries ignored)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _check_heads(K: int, V: int) -> None:
    if K not in HEAD_SIZES or V not in HEAD_SIZES:
        raise ValueError(
            f"head sizes K={K}, V={V} are not supported by the Triton kernels; use K, V in {HEAD_SIZES}"
        )


def triton_chunk(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, H, V]
    g: torch.Tensor | None,  # [B, T, H] or [B, T, H, K] log-decay <= 0
    beta: torch.Tensor | None,  # [B, T, H]; delta rule on iff given
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,  # [B, H, K, V]
    output_final_state: bool = False,
    chunk_size: int = 64,
    lower_bound: float | None = None,
    recompute_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise recurrence of docs/design.md §1 on Triton; differentiable in every tensor input.

    `lower_bound` (e.g. K3's g_min = -5) promises g >= lower_bound everywhere and lets the
    per-channel decay compute its diagonal 16x16 blocks with dense dots; values of g below it
    can overflow. A bound below -5.5 is too loose for that and is ignored (general path).
    `recompute_states`: keep no chunk-entry states for the backward (the largest buffer the forward keeps,
    [B, H, T/64, K, V]) and rebuild them there with a second state pass, nor (with X kept, the WY form) W,
    which the backward computes instead; the same result (bit for bit but for a few ulps under the bounded
    gate).
    Returns (o [B, T, H, V] in q's dtype, final state [B, H, K, V] fp32 or None). The per-channel decay
    with the delta rule (KDA) computes from fp32 q, k, beta whatever their dtype (WIDE_KDA_KEYS).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    _check_heads(K, V)
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(
            f"chunk_size={chunk_size} is not supported by the Triton kernels; use one of {CHUNK_SIZES}"
        )
    if lower_bound is not None and lower_bound > 0:
        raise ValueError(f"lower_bound={lower_bound} must be <= 0 (a bound on the log-decay g), or None")
    if lower_bound is not None and lower_bound < MIN_LOWER_BOUND:
        # too loose for the dense diagonal (exp(-lower_bound * (BC - 1)) would overflow): the general path
        # is exact for any gate, so the promise is simply not used
        lower_bound = None
    if scale is None:
        scale = K**-0.5
    if WIDE_KDA_KEYS and g is not None and g.dim() == 4 and beta is not None and q.dtype != torch.float32:
        # the per-channel decay with the delta rule (KDA) takes q, k, beta in fp32: its 16-bit path rounds
        # each position's decayed copy of a key apart, and a key that recurs with beta near 1 erases
        # through 1 - beta k.k ~ 0.01, which bf16's 2^-8 swamps (benchmarks/lowp_regimes.py measures it);
        # v stays in its dtype, the form a layer feeds and the regimes check
        o, ht = triton_chunk(q.float(), k.float(), v, g, beta.float(), scale, initial_state,
                             output_final_state, chunk_size, lower_bound, recompute_states)
        return o.to(q.dtype), ht
    if g is None or g.dim() != 4:
        lower_bound = None  # only the per-channel decay has a position-pair diagonal to replace
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.contiguous() if g is not None else None
    beta = beta.contiguous() if beta is not None else None
    if initial_state is not None:
        initial_state = initial_state.float()
    if T == 0:
        o = q.new_zeros(B, 0, H, V)
        state = initial_state if initial_state is not None else q.new_zeros(B, H, K, V, dtype=torch.float32)
        return o, state if output_final_state else None
    if torch.compiler.is_compiling():
        # opaque to the compiler: custom ops with fake shapes and a registered backward (compile.py)
        return compiled_chunk(
            q, k, v, g, beta, float(scale), initial_state, output_final_state, chunk_size, lower_bound,
            recompute_states,
        )  # fmt: skip
    if not _wants_grad(q, k, v, g, beta, initial_state):
        # no gradient wanted (inference, evaluation): the forward without the buffers kept for a backward
        with _chunk._resources(q, v, "chunk forward"):
            o, ht, _ = _chunk.chunk_forward(
                q,
                k,
                v,
                g,
                beta,
                float(scale),
                initial_state,
                output_final_state,
                chunk_size,
                lower_bound,
                keep=False,
            )
        return o, ht
    out = ChunkFunction.apply(
        q, k, v, g, beta, float(scale), initial_state, output_final_state, chunk_size, lower_bound,
        recompute_states,
    )  # fmt: skip
    if output_final_state:
        return out[0], out[1]
    return out, None


def triton_recurrent_step(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, V]
    g: torch.Tensor | None,  # [B, H] or [B, H, K]
    beta: torch.Tensor | None,  # [B, H]
    state: torch.Tensor,  # [B, H, K, V]
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step; returns (o [B, H, V] in q's dtype, new state [B, H, K, V] fp32).

    The kernel has no backward: when autograd needs one, the step runs as the torch reference
    (kernels.naive.recurrent_step), which is exact and cheap for one token.
    """
    K, V = q.shape[-1], v.shape[-1]
    _check_heads(K, V)
    if scale is None:
        scale = K**-0.5
    if _wants_grad(q, k, v, g, beta, state):
        from kernels.naive import recurrent_step

        o, new_state = recurrent_step(q, k, v, g, beta, state.float(), scale)
        return o.to(q.dtype), new_state
    return recurrent_step_fwd(q, k, v, g, beta, state, scale)
