"""`benchmarks.launches ptx`: a kernel compiled to PTX for sm_90 on the CPU, compared between two trees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import launches

pytest.importorskip("triton")

# compiles kernels to sm_90 PTX on the CPU: the compiler-output tier, not the edit-test loop
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

PTX = """//
.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0,
\t.param .u64 .ptr .global .align 1 k_param_1
)
{
\t.reg .b32 \t%r<4>;
\t.loc\t1 10 0
\tld.param.b64 \t%rd2, [k_param_1];
\tld.param.b64 \t%rd1, [k_param_0];
\tadd.s32 \t%r3, %r1, %r2;   // a comment
}
\t.section\t.debug_info
\t.b32 577
"""


def test_instructions_leave_out_what_does_not_run() -> None:
    n_params, lines = launches.instructions(PTX)
    assert n_params == 2
    # parameter loads first, sorted and renumbered; registers renumbered; no comments, .loc or debug section
    assert lines == [
        "ld.param.b64 \t%rd, [k_param];",
        "ld.param.b64 \t%rd, [k_param];",
        ".visible .entry k(",
        ")",
        "{",
        ".reg .b32 \t%r<4>;",
        "add.s32 \t%r, %r, %r;",
        "}",
    ]


def _tree(tmp_path: Path, edit=None) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "kernels", tree / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    if edit:
        path = tree / "kernels" / "triton" / "cumsum.py"
        path.write_text(edit(path.read_text()))
    return tree


def test_the_same_kernel_compiles_the_same_and_a_change_is_seen(tmp_path: Path) -> None:
    consts = dict(launches.DEFAULTS)
    here = launches.compile_in(ROOT, "_rev_cumsum_kernel", consts)
    assert here[1] and here == launches.compile_in(_tree(tmp_path), "_rev_cumsum_kernel", consts)
    # the reverse cumsum made forward: other instructions
    changed = _tree(
        tmp_path / "b",
        lambda src: src.replace("axis=0, reverse=True)", "axis=0)"),
    )
    assert launches.compile_in(changed, "_rev_cumsum_kernel", consts) != here


def test_a_string_constexpr_selects_the_products_precision() -> None:
    # the solve's PREC ("tf32" by default, as for 16-bit inputs) is a string, not an integer
    consts = dict(launches.DEFAULTS)
    tf32 = launches.compile_in(ROOT, "_solve_kernel", consts)
    tf32x3 = launches.compile_in(ROOT, "_solve_kernel", {**consts, "PREC": "tf32x3"})
    assert tf32[1] and tf32x3[1] and tf32 != tf32x3
