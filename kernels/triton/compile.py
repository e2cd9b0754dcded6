"""The chunked op as `torch.library` custom ops, so that `torch.compile` treats our Triton kernels as opaque.

Traced as plain Python, the chunk op's launches reach inductor, which analyses every Triton kernel it meets
and stops at instructions it does not know (our inline PTX). As custom ops with fake (shape-only)
implementations and a registered autograd formula, the compiler sees two ops, `kda_harness::chunk_fwd` and
`kda_harness::chunk_bwd`, and fuses the glue around them.

Like the eager path (`ChunkFunction`), the forward keeps what the backward reads and the backward runs
only the backward kernels. A custom op returns tensors whose shapes its fake implementation can state, so
`chunk_fwd` returns the output, the final state and the buffers of `chunk.Saved` as a list, an empty 1-D
placeholder for each one the plan does not keep. Which buffers exist, with what shape and dtype, is
`chunk.saved_layout`, which the fake forward returns: a function of the shapes, dtypes and switches alone
(the plan's keep_x and vt_x follow from B * H and V, not from the device; with dynamic shapes their
thresholds become the compiler's guards). tests/test_compile.py checks it against the real forward's
buffers for every op. Without a gradient (`keep=False`, read while tracing) the forward keeps nothing and
returns no buffers; with `recompute_states` it returns h's placeholder and `chunk_bwd` rebuilds h.
`triton_chunk` takes this path while compiling.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.triton import chunk as _chunk

# the shape returned for an output that does not exist (custom ops return tensors only); no kept buffer has
# one dimension, so chunk_bwd tells the absent ones by it
_EMPTY = (0,)


def _or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return t if t is not None else like.new_empty(_EMPTY, dtype=torch.float32)


@torch.library.custom_op("kda_harness::chunk_fwd", mutates_args=())
def chunk_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    chunk_size: int,
    lower_bound: float | None,
    keep: bool,
    recompute_states: bool,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(o [B, T, H, V] in q's dtype, final state [B, H, K, V] fp32 or an empty tensor without one, the
    buffers of chunk.Saved in its order with keep (an empty tensor for each one the plan does not keep, and
    for h with recompute_states), else [])."""
    with _chunk._resources(q, v, "chunk forward"):
        o, ht, saved = _chunk.chunk_forward(
            q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound, keep=keep,
            recompute_states=recompute_states,
        )  # fmt: skip
    if not keep:
        return o, _or_empty(ht, q), []
    return o, _or_empty(ht, q), [_or_empty(t, q) for t in saved]


@chunk_fwd.register_fake
def _chunk_fwd_fake(
    q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound, keep,
    recompute_states,
):  # fmt: skip
    B, T, H, K = q.shape
    V = v.shape[-1]
    ht_shape = (B, H, K, V) if output_final_state else _EMPTY
    o, ht = q.new_empty(B, T, H, V), q.new_empty(ht_shape, dtype=torch.float32)
    if not keep:
        return o, ht, []
    layout = _chunk.saved_layout(q, k, v, g, beta, chunk_size, lower_bound, recompute_states)
    return o, ht, [_or_empty(spec and q.new_empty(spec[0], dtype=spec[1]), q) for spec in layout]


@torch.library.custom_op("kda_harness::chunk_bwd", mutates_args=())
def chunk_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    scale: float,
    initial_state: torch.Tensor | None,
    do: torch.Tensor,
    dht: torch.Tensor | None,
    chunk_size: int,
    lower_bound: float | None,
    saved: Sequence[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg, dbeta, d initial_state), each in its input's dtype; empty where the input is None.
    `saved`: chunk_fwd's buffers (keep=True; h's placeholder with recompute_states, then rebuilt here)."""
    kept = _chunk.Saved(*(None if t.dim() == 1 else t for t in saved))
    with _chunk._resources(q, v, "chunk backward"):
        dq, dk, dv, dg, dbeta, dh0 = _chunk.chunk_backward(
            q, k, v, g, beta, scale, initial_state, do.contiguous(), dht, chunk_size, lower_bound, kept
        )
    return (
        dq.to(q.dtype),
        dk.to(k.dtype),
        dv.to(v.dtype),
        dg.to(g.dtype) if g is not None else _or_empty(None, q),
        dbeta.to(beta.dtype) if beta is not None else _or_empty(None, q),
        dh0.to(initial_state.dtype) if initial_state is not None else _or_empty(None, q),
    )


@chunk_bwd.register_fake
def _chunk_bwd_fake(q, k, v, g, beta, scale, initial_state, do, dht, chunk_size, lower_bound, saved):
    def like(t: torch.Tensor | None) -> torch.Tensor:
        return torch.empty_like(t) if t is not None else q.new_empty(_EMPTY, dtype=torch.float32)

    return like(q), like(k), like(v), like(g), like(beta), like(initial_state)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound, keep, _ = inputs
    o, _, saved = output
    # the buffers take no gradient; unused outputs' gradients stay None (no zero-filled h or A)
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, _chunk.shape_only(g), beta, initial_state, *saved)
    ctx.o_shape, ctx.keep = o.shape, keep
    ctx.scale, ctx.output_final_state = scale, output_final_state
    ctx.chunk_size, ctx.lower_bound = chunk_size, lower_bound


def _backward(ctx, do, dht, _dsaved):
    if not ctx.keep:
        # (compiled_chunk asks for keep wherever autograd may want a gradient)
        raise RuntimeError("kda_harness::chunk_fwd ran with keep=False: it kept nothing for a backward")
    q, k, v, g, beta, initial_state, *saved = ctx.saved_tensors
    if do is None:
        do = q.new_zeros(ctx.o_shape)
    dq, dk, dv, dg, dbeta, dh0 = chunk_bwd(
        q, k, v, g, beta, ctx.scale, initial_state, do,
        dht if ctx.output_final_state else None, ctx.chunk_size, ctx.lower_bound, saved,
    )  # fmt: skip
    return (
        dq, dk, dv,
        dg if g is not None else None,
        dbeta if beta is not None else None,
        None,
        dh0 if initial_state is not None else None,
        None, None, None, None, None,
    )  # fmt: skip


chunk_fwd.register_autograd(_backward, setup_context=_setup_context)


def compiled_chunk(
    q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound,
    recompute_states=False,
):  # fmt: skip
    """`triton_chunk`'s result through the custom ops: (o, final state or None). Whether a gradient is
    wanted is read while tracing (the compiler guards on it): without one the forward keeps nothing."""
    from kernels.triton import _wants_grad

    keep = _wants_grad(q, k, v, g, beta, initial_state)
    o, ht, _ = chunk_fwd(
        q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound, keep,
        recompute_states,
    )  # fmt: skip
    return o, ht if output_final_state else None
