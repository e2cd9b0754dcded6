"""The launch tooling's handling of a kernel's entry (benchmarks.launches): a tuple argument's pointers
specialized one by one, the debug-only labels of inlined helpers left out of the compared PTX."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

import triton.language as tl  # noqa: E402

from benchmarks import launches  # noqa: E402


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
