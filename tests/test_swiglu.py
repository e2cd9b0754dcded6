"""SwiGLU's gate: the fused Triton kernels (kernels/triton/swiglu.py, the interpreter here) against the
reference (kernels/swiglu.py), output and gradient, at odd sizes; what the backward keeps; bad input."""

from __future__ import annotations

import pytest
import torch

from benchmarks.common import rel_rms
from benchmarks.memory import saved_storages
from kernels.swiglu import swiglu, swiglu_reference


def _h(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return (torch.randn(shape, dtype=torch.float32) * 2).to(dtype).requires_grad_()


@pytest.mark.parametrize("shape", [(37, 2 * 16), (5, 7, 2 * 20), (3, 2 * 300), (2, 9, 2 * 704)])
def test_kernel_equals_reference_fp32(shape: tuple[int, ...]) -> None:
    h = _h(shape)
    dout = torch.randn(*shape[:-1], shape[-1] // 2)
    out = swiglu(h, impl="triton")
    (dh,) = torch.autograd.grad(out, h, dout)
    ref = swiglu_reference(h)
    (dh_ref,) = torch.autograd.grad(ref, h, dout)
    assert out.shape == ref.shape and out.dtype == h.dtype
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dh, dh_ref, rtol=1e-5, atol=1e-6)


def test_kernel_bf16_within_reference_error() -> None:
    # both against fp32: the kernel rounds once, the reference after silu and after the product
    h = _h((4, 33, 2 * 96), torch.bfloat16)
    dout = torch.randn(4, 33, 96).to(torch.bfloat16)
    exact = swiglu_reference(h.detach().float().requires_grad_())
    out = swiglu(h, impl="triton")
    ref = swiglu_reference(h)
    (dh,) = torch.autograd.grad(out, h, dout)
    (dh_ref,) = torch.autograd.grad(ref, h, dout)
    h32 = h.detach().float().requires_grad_()
    (dh_exact,) = torch.autograd.grad(swiglu_reference(h32), h32, dout.float())
    assert out.dtype == torch.bfloat16 and dh.dtype == torch.bfloat16
    assert rel_rms(exact, out) <= 2 * rel_rms(exact, ref) + 1e-3
    assert rel_rms(dh_exact, dh) <= 2 * rel_rms(dh_exact, dh_ref) + 1e-3


def test_strided_input() -> None:
    # h as a slice of a wider buffer: rows strided, last dim contiguous
    torch.manual_seed(1)
    wide = torch.randn(19, 2 * 48 + 10, requires_grad=True)
    h = wide[:, 3 : 3 + 2 * 48]
    dout = torch.randn(19, 48)
    (dw,) = torch.autograd.grad(swiglu(h, impl="triton"), wide, dout)
    (dw_ref,) = torch.autograd.grad(swiglu_reference(h), wide, dout)
    torch.testing.assert_close(dw, dw_ref, rtol=1e-5, atol=1e-6)


def _saved_bytes(fn, h: torch.Tensor) -> int:  # noqa: ANN001
    with saved_storages() as live:
        out = fn(h)  # held until the count, at the context's exit
    del out
    return sum(r["bytes"] for r in live)


def test_backward_keeps_only_h() -> None:
    h = _h((64, 2 * 128))
    assert _saved_bytes(lambda x: swiglu(x, impl="triton"), h) == h.numel() * h.element_size()
    # the reference also keeps silu(gate), half of h again
    assert _saved_bytes(swiglu_reference, h) == h.numel() * h.element_size() * 3 // 2


def test_auto_on_cpu_is_the_reference() -> None:
    h = _h((3, 2 * 16))
    assert torch.equal(swiglu(h), swiglu_reference(h))


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match=r"last dim of h \[4, 7\] must be even"):
        swiglu(torch.randn(4, 7))
    with pytest.raises(ValueError, match="impl='fused'"):
        swiglu(torch.randn(4, 8), impl="fused")
    with pytest.raises(ValueError, match="float64"):
        swiglu(torch.randn(4, 8, dtype=torch.float64), impl="triton")
