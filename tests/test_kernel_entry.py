"""A kernel's entry: the base-pointer helpers of kernels/triton/common.py (_head, _rows) in the
interpreter, the family's parameter budget, and the launch tooling's handling of tuple arguments
(benchmarks.launches: a tuple's pointers specialized one by one, the debug-only labels of inlined helpers
left out of the compared PTX)."""

from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks import launches  # noqa: E402
from benchmarks.common import kernel_homes  # noqa: E402
from kernels.triton.common import _head, _rows  # noqa: E402

# the tile and head sizes; every other constexpr of a kernel is a flag (a switch or a form)
SIZES = {"H", "K", "V", "BT", "BC", "BK", "BV"}


def test_no_kernel_takes_more_than_20_parameters_or_6_flags() -> None:
    # pointers of one kind come as a tuple where a kernel has many (keys, vals, states, ...), and a switch
    # that a buffer or a dtype tells is read from it inside
    over = {}
    for name, module in kernel_homes().items():
        params = inspect.signature(getattr(module, name).fn).parameters
        flags = [n for n, p in params.items() if "constexpr" in str(p.annotation) and n not in SIZES]
        if len(params) > 20 or len(flags) > 6:
            over[name] = (len(params), flags)
    assert not over, over


@triton.jit
def _copy_heads(xs, out, T, H: tl.constexpr, D: tl.constexpr):
    # head i_bh of x ([B, T, H, D]) into out[i_bh] ([B H, T, D]): a tuple argument holding a None unpacked
    # at entry, the given pointer moved by _rows and the None one only under its guard, as the kernels do
    # (Triton 3.6's compiler cannot return a None from a helper)
    i_bh = tl.program_id(0).to(tl.int64)
    x, none = xs
    (x,) = _rows((x,), _head(i_bh, T, H), D)
    if none is not None:
        none += _head(i_bh, T, H) * D
    tl.static_assert(none is None)
    (out,) = _rows((out,), i_bh, T * D)
    o_t = tl.arange(0, 16)
    o_d = tl.arange(0, D)
    b_x = tl.load(x + o_t[:, None] * (H * D) + o_d[None, :], mask=(o_t < T)[:, None], other=0.0)
    tl.store(out + o_t[:, None] * D + o_d[None, :], b_x, mask=(o_t < T)[:, None])


def test_rows_move_pointers_to_the_head_and_a_none_stays_none() -> None:
    B, T, H, D = 2, 13, 3, 16
    x = torch.randn(B, T, H, D)
    out = torch.full((B * H, T, D), float("nan"))
    _copy_heads[(B * H,)]((x, None), out, T, H=H, D=D)
    assert torch.equal(out, x.permute(0, 2, 1, 3).reshape(B * H, T, D))


def test_tuple_arguments_are_specialized_element_by_element() -> None:
    # as Triton's launcher does: each tensor of a tuple 16-byte aligned, each None a constexpr, keyed by its
    # path (the parameter's index, then the place in the tuple)
    def kernel(xs, T, H: tl.constexpr):
        pass

    x = torch.empty(4, device="meta", dtype=torch.bfloat16)
    y = torch.empty(4, device="meta", dtype=torch.float32)
    sig, consts, attrs = launches.signature(kernel, ((x, None, y), 8192), {"H": 16})
    div = [["tt.divisibility", 16]]
    assert sig == {"xs": ("*bf16", "constexpr", "*fp32"), "T": "i32", "H": "constexpr"}
    assert consts == {(0, 1): None, "H": 16}
    assert attrs == {(0, 0): div, (0, 2): div, (1,): div}
    # (flat arguments keyed by name, as before)
    assert launches.signature(kernel, (None, 1), {"H": 16})[1] == {"xs": None, "T": 1, "H": 16}


def test_debug_labels_of_inlined_helpers_are_not_instructions() -> None:
    # $L__tmp labels mark, for the debug sections only, where an inlined helper's code starts and ends; a
    # branch target ($L__BB) is kept
    ptx = "\n".join(
        [
            ".visible .entry k(",
            ")",
            "{",
            "$L__tmp0:",
            "\tadd.s64 \t%rd2, %rd1, %rd0;",
            "$L__tmp1:",
            "$L__BB0_1:",
            "\t@%p1 bra \t$L__BB0_1;",
            "}",
        ]
    )
    assert launches.instructions(ptx)[1] == [
        ".visible .entry k(",
        ")",
        "{",
        "add.s64 \t%rd, %rd, %rd;",
        "$L__BB0_1:",
        "@%p bra \t$L__BB0_1;",
        "}",
    ]
