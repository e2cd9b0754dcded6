"""The chunked op as `torch.library` custom ops, so that `torch.compile` treats our Triton kernels as opaque.

Traced as plain Python, the chunk op's launches reach inductor, which analyses every Triton kernel it meets
and stops at instructions it does not know (our inline PTX). As custom ops with fake (shape-only)
implementations and a registered autograd formula, the compiler sees two ops, `kda_harness::chunk_fwd` and
`kda_harness::chunk_bwd`, and fuses the glue around them.

A custom op's outputs need shapes the fake implementation can state, and the forward's saved buffers depend
on the op's switches, the dtype and, through the plan's keep_x and vt_x (X kept, no Vt), on the number of
programs; so the compiled path saves only the op's inputs, and its backward runs the forward again with the
buffers kept (`keep=True`), then the backward kernels. The eager path
(`ChunkFunction`) keeps the buffers instead. `triton_chunk` takes this path while compiling.
"""

from __future__ import annotations

import torch

from kernels.triton import chunk as _chunk

_EMPTY = (0,)  # the shape returned for an output that does not exist (custom ops return tensors only)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, T, H, V] in q's dtype, final state [B, H, K, V] fp32, or an empty tensor without one)."""
    with _chunk._resources(q, v, "chunk forward"):
        o, ht, _ = _chunk.chunk_forward(
            q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound, keep=False
        )
    return o, _or_empty(ht, q)


@chunk_fwd.register_fake
def _chunk_fwd_fake(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound):
    B, T, H, K = q.shape
    V = v.shape[-1]
    ht_shape = (B, H, K, V) if output_final_state else _EMPTY
    return q.new_empty(B, T, H, V), q.new_empty(ht_shape, dtype=torch.float32)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg, dbeta, d initial_state), each in its input's dtype; empty where the input is None."""
    with _chunk._resources(q, v, "chunk backward"):
        _, _, saved = _chunk.chunk_forward(
            q, k, v, g, beta, scale, initial_state, False, chunk_size, lower_bound, keep=True
        )
        dq, dk, dv, dg, dbeta, dh0 = _chunk.chunk_backward(
            q, k, v, g, beta, scale, initial_state, do.contiguous(), dht, chunk_size, lower_bound, saved
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
def _chunk_bwd_fake(q, k, v, g, beta, scale, initial_state, do, dht, chunk_size, lower_bound):
    def like(t: torch.Tensor | None) -> torch.Tensor:
        return torch.empty_like(t) if t is not None else q.new_empty(_EMPTY, dtype=torch.float32)

    return like(q), like(k), like(v), like(g), like(beta), like(initial_state)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound = inputs
    ctx.save_for_backward(q, k, v, g, beta, initial_state)
    ctx.scale, ctx.output_final_state = scale, output_final_state
    ctx.chunk_size, ctx.lower_bound = chunk_size, lower_bound


def _backward(ctx, do, dht):
    q, k, v, g, beta, initial_state = ctx.saved_tensors
    dq, dk, dv, dg, dbeta, dh0 = chunk_bwd(
        q, k, v, g, beta, ctx.scale, initial_state, do,
        dht if ctx.output_final_state else None, ctx.chunk_size, ctx.lower_bound,
    )  # fmt: skip
    return (
        dq, dk, dv,
        dg if g is not None else None,
        dbeta if beta is not None else None,
        None,
        dh0 if initial_state is not None else None,
        None, None, None,
    )  # fmt: skip


chunk_fwd.register_autograd(_backward, setup_context=_setup_context)


def compiled_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound):
    """`triton_chunk`'s result through the custom ops: (o, final state or None)."""
    o, ht = chunk_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound)
    return o, ht if output_final_state else None
