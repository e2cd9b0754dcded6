"""The short convolution of the mixers: a causal depthwise convolution over time, then SiLU.

    y[b, t, c] = silu( sum_j weight[c, j] * x[b, t - (W - 1) + j, c] ),   j = 0 .. W - 1

where x is prefixed by `initial_state` [B, C, W - 1], the last W - 1 inputs before it (zeros at the start of a
sequence). The final state is the last W - 1 inputs of that prefixed sequence, so a sequence cut into pieces,
down to one token at a time, gives the output of one call.

`short_conv_reference` is the slow, obvious path (F.conv1d on a transposed copy); the fused Triton kernel
(kernels/triton/conv.py) works on the channels-last x directly, and `short_conv_shifted` writes the taps as
torch ops for torch.compile to fuse (CUDA_IMPL picks it on CUDA). `short_conv` validates and dispatches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "naive", "torch", "triton")
# what `auto` runs on CUDA: "triton", the fused kernels, or "shifted", short_conv_shifted's torch ops
# (benchmarks.step --conv-impl times the step with each)
CUDA_IMPL = "triton"
CUDA_IMPLS = ("triton", "shifted")
# the Triton kernel unrolls its W taps (W * W loads in the backward); the papers use 2 to 4
MAX_TRITON_CONV_SIZE = 8
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def short_conv_reference(
    x: torch.Tensor,  # [B, T, C]
    weight: torch.Tensor,  # [C, W]
    initial_state: torch.Tensor | None = None,  # [B, C, W - 1]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (y [B, T, C] in x's dtype, final state [B, C, W - 1] in x's dtype), computed in x's dtype."""
    B, T, C = x.shape
    W = weight.shape[-1]
    x = x.transpose(1, 2)  # [B, C, T]
    if initial_state is None:
        initial_state = x.new_zeros(B, C, W - 1)
    x = torch.cat([initial_state.to(x.dtype), x], dim=-1)  # [B, C, W - 1 + T]
    if T == 0:
        return x.new_zeros(B, 0, C), x.clone()
    y = F.conv1d(x, weight.to(x.dtype)[:, None, :], groups=C)  # [B, C, T]
    # clone: a view would keep the whole padded input alive inside the cache
    return F.silu(y).transpose(1, 2), x[:, :, x.shape[-1] - (W - 1) :].clone()


def short_conv_shifted(
    x: torch.Tensor,  # [B, T, C]
    weight: torch.Tensor,  # [C, W]
    initial_state: torch.Tensor | None = None,  # [B, C, W - 1]
) -> torch.Tensor:
    """y [B, T, C] in x's dtype as W shifted multiply-adds of channels-last torch ops, accumulated in fp32
    (or x's wider dtype) as the Triton kernel does. Eager it makes a pass (and keeps a copy) a tap; under
    torch.compile inductor fuses the taps, the SiLU and their gradients with the ops around them, which the
    Triton kernels, custom ops opaque to it, cannot be."""
    B, T, C = x.shape
    W = weight.shape[-1]
    if initial_state is None:
        padded = F.pad(x, (0, 0, W - 1, 0))  # [B, W - 1 + T, C]
    else:
        padded = torch.cat([initial_state.to(x.dtype).transpose(1, 2), x], dim=1)
    acc = torch.promote_types(x.dtype, torch.float32)
    w = weight.to(acc)
    a = padded[:, :T].to(acc) * w[:, 0]
    for j in range(1, W):
        a = a + padded[:, j : j + T].to(acc) * w[:, j]
    return F.silu(a).to(x.dtype)


def final_state(x: torch.Tensor, initial_state: torch.Tensor | None, W: int) -> torch.Tensor:
    """The last W - 1 inputs of `initial_state` followed by x: [B, C, W - 1] in x's dtype (differentiable)."""
    B, T, C = x.shape
    if T >= W - 1:
        return x[:, T - (W - 1) :].transpose(1, 2).contiguous()
    if initial_state is None:
        initial_state = x.new_zeros(B, C, W - 1)
    return torch.cat([initial_state.to(x.dtype), x.transpose(1, 2)], dim=-1)[:, :, T:].contiguous()


def _validate(
    x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None, backend: str
) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"short_conv: backend={backend!r} is unknown; use one of {BACKENDS}")
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or not x.is_floating_point():
        what = _shape(x) + f" {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"short_conv: x is {what}; expected a floating-point [B, T, C] tensor")
    B, T, C = x.shape
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != C:
        what = _shape(weight) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"short_conv: weight is {what}; expected [C, W] = [{C}, W] (one kernel per channel)")
    W = weight.shape[1]
    if W < 2:
        raise ValueError(f"short_conv: weight has W={W} taps; a short convolution needs W >= 2")
    if weight.device != x.device:
        raise ValueError(f"short_conv: weight is on {weight.device} but x on {x.device}; move both to one")
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != (B, C, W - 1):
            what = _shape(initial_state) if isinstance(initial_state, torch.Tensor) else "not a tensor"
            raise ValueError(
                f"short_conv: initial_state is {what}; expected [B, C, W - 1] = {[B, C, W - 1]} "
                "(the last W - 1 inputs before x, as the final state of the previous call)"
            )
        if initial_state.device != x.device:
            raise ValueError(
                f"short_conv: initial_state is on {initial_state.device} but x on {x.device}; "
                "move both to one device"
            )


def _use_triton(x: torch.Tensor, weight: torch.Tensor, backend: str) -> bool:
    W = weight.shape[1]
    fits = W <= MAX_TRITON_CONV_SIZE and x.dtype in TRITON_DTYPES and weight.dtype in TRITON_DTYPES
    if backend == "auto":
        # the kernel where it applies; float64 (test references) and long kernels take the reference
        return x.is_cuda and fits
    if backend != "triton":
        return False
    if W > MAX_TRITON_CONV_SIZE:
        raise ValueError(
            f"short_conv: backend='triton' supports W <= {MAX_TRITON_CONV_SIZE} taps, got W={W}; "
            "use backend='torch' (or 'auto') for longer kernels"
        )
    if x.dtype not in TRITON_DTYPES or weight.dtype not in TRITON_DTYPES:
        raise ValueError(
            f"short_conv: backend='triton' takes x and weight in {TRITON_DTYPES}, got {x.dtype} and "
            f"{weight.dtype}; cast them or use backend='torch'"
        )
    return True


def short_conv(
    x: torch.Tensor,  # [B, T, C]
    weight: torch.Tensor,  # [C, W]
    initial_state: torch.Tensor | None = None,  # [B, C, W - 1]
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise convolution + SiLU (module docstring); differentiable in x, weight and initial_state.

    backend: "auto" (the Triton kernel on CUDA for W <= 8 and 16/32-bit floats, the reference otherwise),
    "triton" (the kernel; on CPU tensors it needs TRITON_INTERPRET=1 before triton is imported), "torch" or
    "naive" (both the reference). The reference computes in x's dtype (weight cast to it, as nn.Conv1d under
    autocast); the kernel reads weight as given and accumulates in fp32.
    Returns (y [B, T, C] in x's dtype, final state [B, C, W - 1] in x's dtype).
    """
    _validate(x, weight, initial_state, backend)
    if backend == "auto" and x.is_cuda and CUDA_IMPL == "shifted":
        return short_conv_shifted(x, weight, initial_state), final_state(x, initial_state, weight.shape[1])
    if not _use_triton(x, weight, backend):
        return short_conv_reference(x, weight, initial_state)
    from kernels.triton.conv import triton_short_conv

    y = triton_short_conv(x, weight, initial_state)
    return y, final_state(x, initial_state, weight.shape[1])
