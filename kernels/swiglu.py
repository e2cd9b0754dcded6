"""SwiGLU's gate: out = silu(gate) * value, with gate and value the two halves of the up projection's output.

`swiglu_reference` is the slow, obvious path (torch ops; it keeps silu(gate) for the backward); the fused
Triton kernels (kernels/triton/swiglu.py) keep only h and write the gradient's two halves in one pass.
`swiglu` validates and dispatches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IMPLS = ("auto", "torch", "triton")
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def swiglu_reference(h: torch.Tensor) -> torch.Tensor:
    """h [..., 2H] -> silu(h[..., :H]) * h[..., H:], [..., H], computed in h's dtype."""
    gate, value = h.chunk(2, dim=-1)
    return F.silu(gate) * value


def swiglu(h: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """h [..., 2H] -> [..., H] in h's dtype. impl "auto" takes the Triton kernels on CUDA for fp16 / bf16 /
    fp32, the reference otherwise; "triton" asks for the kernels (CUDA, or the interpreter on the CPU)."""
    if impl not in IMPLS:
        raise ValueError(f"swiglu: impl={impl!r}; choose one of {IMPLS}")
    if h.dim() == 0 or h.shape[-1] % 2:
        raise ValueError(f"swiglu: the last dim of h {list(h.shape)} must be even (gate and value halves); "
                         "the up projection of a SwiGLU MLP has 2 * hidden outputs")
    kernel = impl == "triton" or (impl == "auto" and h.is_cuda and h.dtype in TRITON_DTYPES)
    if not kernel:
        return swiglu_reference(h)
    if h.dtype not in TRITON_DTYPES:
        raise ValueError(f"swiglu: impl='triton' takes {[str(d) for d in TRITON_DTYPES]}, not {h.dtype}; "
                         "use impl='torch' or 'auto'")
    from kernels.triton.swiglu import swiglu_fwd

    flat = h.reshape(-1, h.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    return swiglu_fwd(flat).view(*h.shape[:-1], h.shape[-1] // 2)
