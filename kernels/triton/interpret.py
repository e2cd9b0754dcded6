"""Triton's CPU interpreter made to compute bf16 as the GPU does: the kernels' 16-bit path runs on the CPU.

The interpreter keeps a bf16 tensor as its raw uint16 bits. Two of its ops get that wrong: `tl.dot` multiplies
the bit patterns as integers (results off by orders of magnitude), and a cast from fp32 to bf16 truncates the
mantissa where the GPU rounds to nearest even (twice the rounding error, all of it one way). `patch()` wraps
both: a dot widens bf16 operands to the fp32 values they hold (a tensor core multiplies bf16 exactly and
accumulates in fp32), and the cast rounds to nearest even. Every other op the kernels apply to bf16 tiles
(loads, stores, selects, transposes, casts to fp32) moves bits, which the interpreter does right.

`emulate_tf32(mode)` (off by default, for benchmarks/lowp_regimes.py) also rounds fp32 operands of a dot whose
input precision is tf32 to TF32's 10 mantissa bits, to nearest or by truncation, as a GPU's tensor cores
take them: the GPU's fp32 path, where the interpreter is otherwise exact. Applied by
kernels/triton/__init__.py when TRITON_INTERPRET=1 (patch only); tests/test_interpret.py checks it against
torch's bf16 on the installed Triton, and the kernels' bf16 path against the float64 token loop.
"""

from __future__ import annotations

import numpy as np


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _rounded(bits: np.ndarray, drop: int) -> np.ndarray:
    """fp32 bits rounded to nearest, ties to even, at bit `drop`: its low `drop` bits zero."""
    half, low = np.uint32((1 << (drop - 1)) - 1), np.uint32((1 << drop) - 1)
    return (bits + half + ((bits >> drop) & np.uint32(1))) & ~low


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    # a NaN stays a (quiet) NaN instead of rounding into inf
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (_rounded(bits, 16) >> 16).astype(np.uint16)
    quiet_nan = ((bits >> 16) | np.uint32(0x40)).astype(np.uint16)
    return np.where(np.isnan(x), quiet_nan, rounded)


# emulate_tf32's mode: None (exact fp32 products), "rne" or "trunc"
_TF32: list[str | None] = [None]


def _tf32(x: np.ndarray, mode: str) -> np.ndarray:
    # TF32 keeps 10 of fp32's 23 mantissa bits
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return (_rounded(bits, 13) if mode == "rne" else bits & ~np.uint32((1 << 13) - 1)).view(np.float32)


def emulate_tf32(mode: str | None) -> None:
    """Dots with input precision tf32 round their fp32 operands to TF32 ("rne": to nearest even, "trunc":
    dropping the low 13 bits) or, with None, multiply them exactly (the default)."""
    if mode not in (None, "rne", "trunc"):
        raise ValueError(f"emulate_tf32: mode {mode!r}; use None, 'rne' or 'trunc'")
    if not patch():
        raise RuntimeError("emulate_tf32: this Triton's interpreter cannot be patched")
    _TF32[0] = mode


def patch() -> bool:
    """Wrap the interpreter's dot and fp32 -> bf16 cast (once). False if this Triton's interpreter does not
    have them where expected (the bf16 path then stays wrong there; tests/test_interpret.py fails)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    if builder is None or handle is None or not all(hasattr(builder, n) for n in ("create_dot", "cast_impl")):
        return False
    if getattr(builder, "_kda_harness_bf16", False):
        return True
    dot, cast = builder.create_dot, builder.cast_impl

    tf32 = getattr(getattr(getattr(interpreter, "_ir", None), "INPUT_PRECISION", None), "TF32", None)

    def create_dot(self, a, b, d, input_precision, *rest):
        def wide(x):
            if x.dtype.scalar == tl.bfloat16:
                return handle(_bf16_bits_to_f32(x.data), tl.float32)
            if _TF32[0] and x.dtype.scalar == tl.float32 and input_precision == tf32:
                return handle(_tf32(x.data, _TF32[0]), tl.float32)
            return x

        return dot(self, wide(a), wide(b), d, input_precision, *rest)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return handle(_f32_to_bf16_bits(src.data), tl.bfloat16)
        return cast(self, src, dst_type)

    builder.create_dot, builder.cast_impl = create_dot, cast_impl
    builder._kda_harness_bf16 = True
    return True
