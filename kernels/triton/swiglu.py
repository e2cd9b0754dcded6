"""SwiGLU's gate, out = silu(gate) * value, as fused Triton kernels (kernels/swiglu.py has the reference).

h [N, 2 * H] is the up projection's output, gate = h[:, :H] and value = h[:, H:]. Eager torch runs four
kernels over [N, H] tensors in the forward and backward (silu, mul; silu_backward, two muls) and a cat of the
two halves of the gradient, and keeps silu(gate) for the backward besides h. Here one kernel writes out and
one writes dh = [d gate, d value] straight into its two halves; the backward recomputes silu(gate) from h,
the only tensor kept. With s = sigmoid(gate):

    d value = dout * gate * s
    d gate  = dout * value * s * (1 + gate * (1 - s))

Both compute in fp32 and round once to h's dtype. The two launches are torch custom ops (namespace
kda_harness) with fake implementations and a registered autograd formula, so torch.compile treats them as
opaque calls.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# A program owns a [BLOCK_R, BLOCK_C] tile of the [N, H] output: 4,096 elements, contiguous runs of up to
# 256 columns in each half of h.
BLOCK_R = 16
MAX_BLOCK_C = 256


@triton.jit
def _swiglu_fwd_kernel(h, out, N, H, stride_h, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < N) & (cols[None, :] < H)
    p_gate = h + rows[:, None] * stride_h + cols[None, :]
    gate = tl.load(p_gate, mask=mask, other=0.0).to(tl.float32)
    value = tl.load(p_gate + H, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * value
    tl.store(out + rows[:, None] * H + cols[None, :], y.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(h, dout, dh, N, H, stride_h, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < N) & (cols[None, :] < H)
    offset = rows[:, None] * stride_h + cols[None, :]
    gate = tl.load(h + offset, mask=mask, other=0.0).to(tl.float32)
    value = tl.load(h + offset + H, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(dout + rows[:, None] * H + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(gate)
    d_value = d * gate * s
    d_gate = d * value * s * (1.0 + gate * (1.0 - s))
    out_offset = rows[:, None] * (2 * H) + cols[None, :]
    tl.store(dh + out_offset, d_gate.to(dh.dtype.element_ty), mask=mask)
    tl.store(dh + out_offset + H, d_value.to(dh.dtype.element_ty), mask=mask)


def _grid(N: int, H: int) -> tuple[tuple[int, int], int]:
    block_c = min(MAX_BLOCK_C, max(16, triton.next_power_of_2(H)))
    return (triton.cdiv(N, BLOCK_R), triton.cdiv(H, block_c)), block_c


@torch.library.custom_op("kda_harness::swiglu_fwd", mutates_args=())
def swiglu_fwd(h: torch.Tensor) -> torch.Tensor:
    """h [N, 2H] with unit stride along its last dim -> silu(h[:, :H]) * h[:, H:], [N, H] in h's dtype."""
    N, H = h.shape[0], h.shape[1] // 2
    out = h.new_empty(N, H)
    if N and H:
        grid, block_c = _grid(N, H)
        _swiglu_fwd_kernel[grid](h, out, N, H, h.stride(0), BLOCK_R=BLOCK_R, BLOCK_C=block_c, num_warps=4)
    return out


@swiglu_fwd.register_fake
def _swiglu_fwd_fake(h: torch.Tensor) -> torch.Tensor:
    return h.new_empty(h.shape[0], h.shape[1] // 2)


@torch.library.custom_op("kda_harness::swiglu_bwd", mutates_args=())
def swiglu_bwd(h: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    """The gradient of swiglu_fwd at h for dout [N, H]: dh [N, 2H] (gate half, value half) in h's dtype."""
    N, H = h.shape[0], h.shape[1] // 2
    dh = h.new_empty(N, 2 * H)
    if N and H:
        grid, block_c = _grid(N, H)
        _swiglu_bwd_kernel[grid](h, dout.contiguous(), dh, N, H, h.stride(0), BLOCK_R=BLOCK_R,
                                 BLOCK_C=block_c, num_warps=4)
    return dh


@swiglu_bwd.register_fake
def _swiglu_bwd_fake(h: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    return h.new_empty(h.shape[0], h.shape[1])


def _setup_context(ctx, inputs, output) -> None:  # noqa: ANN001 (torch.library's signature)
    ctx.save_for_backward(inputs[0])


def _backward(ctx, dout: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    (h,) = ctx.saved_tensors
    return swiglu_bwd(h, dout)


swiglu_fwd.register_autograd(_backward, setup_context=_setup_context)
