"""`benchmarks.launches occupancy`: the family's launches recorded on meta tensors, compiled for sm_90 on the
CPU, and the programs per SM that their registers and shared memory allow."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# (not importorskip: importing triton here, before test_triton.py sets TRITON_INTERPRET, would leave the
# interpreter off for the tests after these in one process)
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

# compiles the family for sm_90 on the CPU (minutes): the compiler-output tier, not the edit-test loop
pytestmark = pytest.mark.slow

# The text and arithmetic helpers are tested here, not through _run: benchmarks.launches imports no Triton
# (test_kernel_entry.py imports it too), and a fresh interpreter costs a second of torch's import each.
from benchmarks.launches import loop_loads, mma_dup, programs_per_sm, sass_counts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _run(code_or_args: list[str]) -> subprocess.CompletedProcess:
    # a fresh interpreter without TRITON_INTERPRET: the script compiles for the GPU, and importing it here
    # would take the interpreter away from the other tests
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, *code_or_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_programs_per_sm_names_the_limit() -> None:
    p = programs_per_sm
    out = " ".join(map(str, (p(177, 4, 17408), p(128, 4, 17408), p(16, 16, 0), p(32, 1, 100000),
                             p(255, 1, 0))))
    # 177 registers round up to 184 a thread, 5888 a warp: 65536 // (4 * 5888) = 2; 128 registers: 4;
    # 16 warps of 32 threads: 4 by threads; 100,000 bytes of shared memory: 2; one warp of 255: 8
    expected = "(2, 'registers') (4, 'registers') (4, 'threads') (2, 'shared memory') (8, 'registers')"
    assert out == expected


def test_every_launch_of_the_delta_rule_compiles_and_fits(tmp_path: Path) -> None:
    out = tmp_path / "occ.csv"
    res = _run(
        [
            "-m",
            "benchmarks.launches",
            "occupancy",
            "--ops",
            "delta_rule",
            "--B",
            "1",
            "--T",
            "128",
            "--H",
            "2",
            "--D",
            "64",
            "--set",
            "intra_bwd.maxnreg=128",
            "--options",
            "intra_fwd:num_stages=1",
            "--out",
            str(out),
        ]  # fmt: skip
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    kernels = [r["kernel"] for r in rows]
    # the delta rule's forward and backward, in launch order (no cumsum without a decay; the intra forward
    # twice: as launched and with the --options form)
    assert kernels == [
        "_intra_fwd_kernel",
        "_intra_fwd_kernel",
        "_solve_kernel",
        "_wu_kernel",
        "_state_fwd_kernel",
        "_output_kernel",
        "_state_bwd_kernel",
        "_dqk_bwd_kernel",
        "_dvt_bwd_kernel",
        "_intra_bwd_kernel",
    ]
    assert [r["stages"] for r in rows[:2]] == ["3", "1"]
    intra_bwd = rows[-1]
    assert intra_bwd["maxnreg"] == "128" and int(intra_bwd["regs"]) <= 128
    # the sequential state passes loop over the chunks; every kernel has instructions
    assert all(r["loop_instrs"] != "-" for r in rows if "state" in r["kernel"])
    for r in rows:
        assert int(r["instrs"]) > 0, r
        assert 0 < int(r["regs"]) <= 255, r
        assert int(r["programs_per_sm"]) >= 1, r
        assert int(r["programs"]) >= 1, r
    # grid of the intra forward: T / 16 row blocks times B * H
    assert int(rows[0]["programs"]) == (128 // 16) * 2


def test_bad_options_are_named() -> None:
    res = _run(["-m", "benchmarks.launches", "occupancy", "--options", "intra_bwd:warps=2"])
    assert res.returncode != 0
    assert "expected KERNEL:NAME=INT" in res.stderr and "intra_bwd:warps=2" in res.stderr


# signature on _rev_cumsum_kernel (pointers x, x and the integer T), in a fresh interpreter (_run)
_SIGNATURE_SETUP = (
    "import torch; from benchmarks.launches import signature; "
    "from kernels.triton import cumsum, state_fwd; "
    "x = torch.empty(4, device='meta', dtype=torch.bfloat16); c = dict(H=16, K=128, BT=64, DECAY=2); "
    "f = cumsum._rev_cumsum_kernel.fn; "
)
_DIV = "[['tt.divisibility', 16]]"


def test_launches_are_specialized_as_the_launcher_does() -> None:
    # tensors and integers divisible by 16 carry tt.divisibility 16, an integer 1 becomes a constant: without
    # the hints the compiler cannot vectorize the loads, and the counts would not be the GPU's
    res = _run(
        [
            "-c",
            _SIGNATURE_SETUP + "print(signature(f, (x, x, 8192), c)); print(signature(f, (x, x, 1), c)); "
            "print(signature(f, (x, x, 100), c))",
        ]
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    aligned, one, odd = res.stdout.strip().splitlines()
    div = _DIV
    assert f"{{(0,): {div}, (1,): {div}, (2,): {div}}}" in aligned and "'T': 'i32'" in aligned
    assert "'T': 'constexpr'" in one and "'T': 1" in one
    assert f"{{(0,): {div}, (1,): {div}}}" in odd and "'T': 'i32'" in odd


def test_unspecialised_integers_stay_plain() -> None:
    # the forward state pass is compiled without Triton's specialisation of T and NT (Triton 3.6 miscompiled
    # its one-chunk form on the H200): its launcher passes them as plain i32, and so does the script
    res = _run(
        [
            "-c",
            _SIGNATURE_SETUP
            + "print([p.name for p in state_fwd._state_fwd_kernel.params if p.do_not_specialize]); "
            "print(signature(f, (x, x, 8192), c, ('T',))); print(signature(f, (x, x, 1), c, ('T',)))",
        ]
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    names, aligned, one = res.stdout.strip().splitlines()
    assert names == "['T', 'NT']"
    div = _DIV
    assert f"{{(0,): {div}, (1,): {div}}}" in aligned and "'T': 'i32'" in aligned
    assert "'T': 'i32'" in one and "'T': 1" not in one


def test_sass_counts_finds_loops_and_instruction_kinds() -> None:
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   MUFU.EX2 R2, R3 ;
        /*0030*/                   HMMA.1688.F32.TF32 R4, R8, R12, R4 ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/               @P0 BRA 0x20 ;
        /*0060*/                   NOP ;
        /*0070*/                   BRA 0x90 ;
        /*0080*/                   EXIT ;
    """
    # one loop, 0x20..0x50 (4 instructions); the forward branch at 0x70 is not one; NOP not counted
    expected = "{'instrs': 8, 'loop_instrs': '4', 'mufu': 1, 'mma': 1, 'bar': 1}"
    assert str(sass_counts(sass)) == expected


def test_loop_loads_counts_plain_loads_inside_loops_only() -> None:
    ttgir = "\n".join(
        [
            "  tt.func public @k(%a: !tt.ptr<f32>) {",
            "    %0 = tt.load %p0, %m0 : tensor<64x!tt.ptr<bf16>, #blocked> loc(#l0)",  # before the loop
            "    %1:2 = scf.for %i = %c0 to %n step %c1 iter_args(%x = %c) -> (tensor<64xf32>) : i32 {",
            "      %2 = ttg.async_copy_global_to_local %p1, %b {contiguity = 8 : i32} : t -> s loc(#l1)",
            "      %3 = tt.load %p2, %m2, %cst : tensor<128x!tt.ptr<f32>, #ttg.slice<{dim = 1}>> loc(#l2)",
            "      scf.for %j = %c0 to %n step %c1 : i32 {",
            "        %4 = tt.load %p3 : tensor<16x64x!tt.ptr<bf16>, #blocked1> loc(#l3)",
            "      } loc(#l4)",
            "      scf.yield %x : tensor<64xf32> loc(#l5)",
            "    } loc(#l6)",
            "    %5 = tt.load %p4 : tensor<32x!tt.ptr<f32>, #blocked> loc(#l7)",  # after the loop
            "    tt.return loc(#l8)",
            "  } loc(#l9)",
        ]
    )
    assert str(loop_loads(ttgir)) == "2: 128xf32 16x64xbf16"


def test_mma_dup_counts_products_whose_layout_repeats_rows_or_columns() -> None:
    # three products: 64 rows on 8 warps along the rows (MMAv3; 128 rows covered: duplicated), the same
    # shape on 4 x 2 warps (64 rows, 2 x 64 columns: not), and 16 rows on 4 warps (MMAv2: duplicated)
    ttgir = "\n".join(
        [
            "#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [8, 1], "
            "instrShape = [16, 64, 16]}>",
            "#mma1 = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 2], "
            "instrShape = [16, 64, 16]}>",
            "#mma2 = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [4, 1], "
            "instrShape = [16, 8]}>",
            "    %a = ttng.warp_group_dot %x, %y, %c {inputPrecision = 0 : i32} : "
            "!ttg.memdesc<64x128xbf16> * !ttg.memdesc<128x128xbf16> -> tensor<64x128xf32, #mma>",
            "    %b = ttng.warp_group_dot %x, %y, %c {inputPrecision = 0 : i32} : "
            "!ttg.memdesc<64x128xbf16> * !ttg.memdesc<128x128xbf16> -> tensor<64x128xf32, #mma1>",
            "    %d = tt.dot %u, %w, %e : tensor<16x128xbf16> * tensor<128x16xbf16> "
            "-> tensor<16x16xf32, #mma2>",
        ]
    )
    assert str(mma_dup(ttgir)) == "2/3"


def test_state_pass_products_unchained(tmp_path: Path) -> None:
    # bounded KDA's no-grad state pass at B8 T8K H16 (8 warps, 128 columns): five products, three of them
    # chained (X, Vt, the output's state term), which would be laid out twice over (3/5) did _unchain not
    # break the chain
    out = tmp_path / "occ.csv"
    args = ["occupancy", "--no-grad", "--ops", "kda_bounded", "--out", str(out)]
    res = _run(["-m", "benchmarks.launches", *args])
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = [r for r in csv.DictReader(out.open()) if r["kernel"] == "_state_fwd_kernel"]
    assert row["warps"] == "8" and row["mma_dup"] == "0/5"


def test_intra_forward_exponentials_without_subnormal_handling() -> None:
    # EX2_FTZ: the bounded intra forward's exponentials as ex2.approx.ftz.f32 (results under 2^-126 flushed
    # to 0), where tl.exp's ex2.approx.f32 keeps subnormals (which ptxas pays for with a compare, two
    # predicated multiplies and a select each); the plan's log2 (the no-grad forward): G comes times log2(e),
    # so no exponential multiplies by log2(e) first, against the differentiable forward's G as is. Read from
    # the PTX that Triton writes (g16 off: its decays come another way), not from ptxas's SASS, so that the
    # counts do not move with the ptxas version
    code = textwrap.dedent(
        """
        import json
        from benchmarks.common import PHASES, record_launches
        from benchmarks.launches import compile_launch
        from kernels.triton import plan
        plan._g16 = lambda lowp: False
        out = {}
        phases = record_launches("kda_bounded", 1, 256, 2, 128)
        for key, phase in (("grad", PHASES[1]), ("log2", PHASES[0])):
            launches = phases[phase]
            (launch,) = [x for x in launches if x.kernel == "_intra_fwd_kernel"]
            ptx = compile_launch(launch).asm["ptx"]
            lines = [x.split("//")[0].strip() for x in ptx.splitlines()]
            out[key] = [
                sum(x.startswith("ex2.approx.") for x in lines),
                sum(x.startswith("ex2.approx.ftz.f32") for x in lines),
                sum("0f3FB8AA3B" in x for x in lines),  # log2(e) as an fp32 immediate
            ]
        print(json.dumps(out))
        """
    )
    res = _run(["-c", code])
    assert res.returncode == 0, res.stderr[-3000:]
    counts = json.loads(res.stdout)
    # every exponential flushes subnormals (the two launches differ in warps, so in exponentials a thread)
    assert counts["grad"][0] > 0 and counts["log2"][0] > 0, counts
    assert counts["grad"][1] == counts["grad"][0] and counts["log2"][1] == counts["log2"][0], counts
    # log2: no multiply by log2(e) is left
    assert counts["log2"][2] == 0 and counts["grad"][2] > 0, counts


def test_forward_kernels_wait_for_the_one_before_under_pdl() -> None:
    # fwd.pdl: launched as programmatic dependents, the forward's kernels let the next one be placed and
    # then wait for the one before (griddepcontrol.launch_dependents, griddepcontrol.wait) before their
    # first global load, store or asynchronous copy (sm_90 PTX); plain launches have neither
    code = textwrap.dedent(
        """
        import json
        from pathlib import Path
        from benchmarks.launches import DEFAULTS, compile_in
        out = {}
        kernels = ["_cumsum_kernel", "_cumsum16_kernel", "_intra_fwd_kernel", "_solve_kernel"]
        for name in kernels + ["_state_fwd_kernel", "_solve_kernel 0"]:
            kernel, _, plain = name.partition(" ")
            consts = {**DEFAULTS, "LOG2": 1, "G16": 1, "PDL": 0 if plain else 1}
            out[name] = compile_in(Path("."), kernel, consts)[1]
        print(json.dumps(out))
        """
    )
    res = _run(["-c", code])
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    for name, lines in out.items():
        memory = [
            i
            for i, line in enumerate(lines)
            if any(op in line for op in ("ld.global", "st.global", "cp.async"))
        ]
        assert memory, name
        if name.endswith(" 0"):
            assert not any("griddepcontrol" in line for line in lines), name
            continue
        (wait,) = [i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait")]
        (launch,) = [i for i, line in enumerate(lines) if line.startswith("griddepcontrol.launch_dependents")]
        assert launch < wait < memory[0], name


def test_every_launch_of_every_op_compiles_with_and_without_states() -> None:
    # the interpreter runs a kernel's Python, not Triton's compiler, and accepts forms the compiler rejects
    # (a helper that returns None fails to compile on Triton 3.6): each distinct launch of the seven ops'
    # forwards and backward, without and with an initial state, the final state and its gradient, and with
    # the states rebuilt in the backward (recompute_states), compiled for sm_90 with its real constexprs,
    # dtypes, warps and stages
    code = textwrap.dedent(
        """
        import torch
        from benchmarks.common import record_launches
        from benchmarks.launches import compile_launch
        from kernels.triton import VARIANTS

        def form(x):
            if isinstance(x, tuple):
                return tuple(map(form, x))
            return str(x.dtype) if isinstance(x, torch.Tensor) else repr(x)

        seen, failed = set(), []
        for op, *_ in VARIANTS:
            for states, rebuild in ((False, False), (True, False), (False, True), (True, True)):
                phases = record_launches(op, 1, 130, 2, 128, states=states, recompute_states=rebuild)
                for launches in phases.values():
                    for launch in launches:
                        key = (launch.kernel, form(launch.args), repr(sorted(launch.kwargs.items())))
                        if key in seen:
                            continue
                        seen.add(key)
                        try:
                            compile_launch(launch)
                        except Exception as error:
                            failed.append(f"{op} states={states} recompute_states={rebuild} {launch.kernel}: "
                                          f"{str(error)[-400:]}")
        print(f"{len(seen)} launches", *failed, sep="\\n")
        """
    )
    res = _run(["-c", code])
    assert res.returncode == 0, res.stderr[-3000:]
    count, *failed = res.stdout.strip().split("\n")
    assert not failed, "\n".join(failed)
    # every kernel of the family, in several forms
    assert int(count.split()[0]) >= 40, res.stdout
