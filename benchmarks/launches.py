"""What the kernels launch and compile to, on this machine without a GPU (Triton's bundled ptxas, sm_90).

    python -m benchmarks.launches diff REV --op kda_bounded --B 1 --T 65536 --H 16
    python -m benchmarks.launches ptx REV --ops all                     # every launch of every op
    python -m benchmarks.launches ptx REV _intra_fwd_kernel --const BOUNDED=1 DELTA=1
    python -m benchmarks.launches occupancy --ops kda delta_rule --set intra_bwd.warps=2

The launch code (kernels/triton/chunk.py's pipelines and the stage modules' launchers) runs on meta tensors
with every kernel replaced by a recorder (benchmarks.common.record_launches), so each launch is seen with its
grid, constexprs, argument dtypes, warps, stages and register cap. A git revision REV is checked out into a
temporary worktree, and the same code of this checkout records and compiles its kernels: both sides of a
comparison are measured alike. Each command exits 1 when the two sides differ.

`diff`: the launches of the forward without and with a gradient and of the backward, at the working tree
and at REV, in order; for launch-rule changes made when no device time is left (where the launches at a
shape are those of a revision measured on the GPU, its figures at that shape still hold). A constexpr that
only one side passes (an alternative removed or added) is listed with its values, not counted as a
difference: whether the code it selected still compiles the same is `ptx`'s question.

`ptx`: does a change alter what the GPU runs? With --ops (names of kernels.triton.VARIANTS, or `all`): every
launch of each op's no-grad forward and of its forward and backward with a gradient, compiled with its real
constexprs, dtypes, warps, stages and cap, compared kernel by kernel. With a KERNEL: that @triton.jit
kernel alone; constexprs --const does not name take the values of the default bounded-KDA launch (DEFAULTS),
those only one side has are 0 there (a new alternative, off); pointers are bf16 where the default launch
passes 16-bit tensors (LOWP_POINTERS), fp32 elsewhere, a tuple parameter's pointers in their dtypes at the
kernel's first launch. The PTX is compared without debug info (nor the labels that only it uses) and with the
parameter loads sorted; an empty diff says the GPU runs the code checked at REV.

`occupancy`: how many programs of each kernel fit on one SM: `cuobjdump --dump-resource-usage` reads each
launch's registers per thread, spilled bytes (LOCAL) and shared memory, and `cuobjdump -sass` its static
instruction counts: all, each loop body's, exponentials (mufu), tensor-core products (mma), barriers; and
from the TTGIR the plain (not asynchronously copied, so waited-on) loads inside loops (`loop_loads`) and the
tensor-core products that several warps compute alike (`mma_dup`). Programs per SM follow from the sm_90
limits (65,536 registers in 256-register units per warp, 2,048 threads, 32 blocks, 228 KB of shared memory
with 1 KB reserved per block). `--options KERNEL:NAME=INT` compiles one kernel with other launch options
(num_warps, num_stages, maxnreg) than the launch code's, to see what they would free. The figures are this
machine's Triton's (see the header): the device image's Triton may allocate registers differently, so run
it there too before drawing conclusions.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

from benchmarks.common import (
    PHASES,
    ROOT,
    Launch,
    add_shape_args,
    checkout,
    in_tree,
    kernel_homes,
    provenance,
    record_launches,
    write_csv,
)

# sm_90 (H100, H200) per-SM limits
REGS_PER_SM = 65536
REG_UNIT_PER_WARP = 256
MAX_THREADS = 2048
MAX_BLOCKS = 32
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_BLOCK = 1024
SMS = 132  # H200

POINTER_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.uint16: "u16"}
# the constexprs of the default bounded-KDA launch, for `ptx REV KERNEL`
DEFAULTS = dict(
    H=16, K=128, V=128, BT=64, BC=16, BK=64, BV=64, BW=32, DECAY="channel", DELTA=1, BOUNDED=1, LOWP=1,
    STORE_DECAYED=1, TRI=1, AUTO=0, PRE_KG=1, FUSED=0, DECAYED=0, HAS_H0=1, STORE_HT=1, HAS_DHT=1,
    PREC="tf32", ZERO="none",
)  # fmt: skip
LOWP_POINTERS = set("q k v qg kd kg aqk o do dq dk dv w u vt h dh".split())


def signature(fn, args: tuple, kwargs: dict, plain: tuple = ()) -> tuple[dict, dict, dict]:
    """Triton's signature, constexprs and attributes of one launch, specialized as its launcher would:
    tensors 16-byte aligned (fresh CUDA allocations are 256-byte aligned) and integers divisible by 16
    get `tt.divisibility` 16, an integer equal to 1 becomes the constant 1; except the integers named in
    `plain` (the kernel's `do_not_specialize`), which the launcher passes as they are. Without these hints
    the compiler cannot vectorize the loads: 16-bit loads one element at a time,
    twice the instructions, and other register counts than the GPU's launches get."""
    sig, consts, attrs = {}, {}, {}
    params = list(inspect.signature(fn).parameters.items())
    index = {name: i for i, (name, _) in enumerate(params)}
    runtime = [(n, p) for n, p in params if "constexpr" not in str(p.annotation)]
    if len(args) != len(runtime):
        raise SystemExit(f"{fn.__name__}: {len(args)} positional arguments for {len(runtime)} parameters")
    for (name, _), a in zip(runtime, args, strict=True):
        sig[name] = _specialize(a, (index[name],), name, plain, consts, attrs)
    for name, p in params:
        if "constexpr" in str(p.annotation):
            sig[name] = "constexpr"
            value = kwargs[name]
            consts[name] = int(value) if isinstance(value, bool) else value
    return sig, consts, attrs


def _specialize(a, path: tuple, name: str, plain: tuple, consts: dict, attrs: dict):
    # the signature type of argument `a` at `path` (a parameter's index, then its place in a tuple argument),
    # its constant into `consts` and its hints into `attrs`, keyed by name for a whole parameter, by path
    # inside a tuple
    key = name if len(path) == 1 else path
    if isinstance(a, tuple):
        return tuple(_specialize(x, (*path, j), name, plain, consts, attrs) for j, x in enumerate(a))
    if a is None:
        # a buffer the launch does not touch: a constexpr None, as the launcher specializes it
        consts[key] = None
        return "constexpr"
    if isinstance(a, torch.Tensor):
        attrs[path] = [["tt.divisibility", 16]]
        return "*" + POINTER_TYPES[a.dtype]
    if isinstance(a, float):
        return "fp32"
    if name in plain:
        return "i32"
    if a == 1:
        consts[key] = 1
        return "constexpr"
    if a % 16 == 0:
        attrs[path] = [["tt.divisibility", 16]]
    return "i32"


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(?:\.[^\s;]*)?([^;]*);")


def sass_counts(sass: str) -> dict:
    """Static instruction counts of one kernel's SASS (`cuobjdump -sass`): all instructions, each loop's
    body (a backward branch to the loop head; innermost and outer loops alike, in address order), and the
    exponentials (MUFU), tensor-core products (HMMA/HGMMA) and barriers (BAR) among them."""
    ins = [(int(a, 16), op, rest) for a, op, rest in _SASS_LINE.findall(sass)]
    loops = []
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            lo = int(target.group(1), 16)
            loops.append(sum(1 for a, _, _ in ins if lo <= a <= addr))
    ops = [op for _, op, _ in ins if op != "NOP"]
    return {
        "instrs": len(ops),
        "loop_instrs": "/".join(str(n) for n in loops) or "-",
        "mufu": sum(op == "MUFU" for op in ops),
        "mma": sum(op in ("HMMA", "HGMMA") for op in ops),
        "bar": sum(op == "BAR" for op in ops),
    }


_LOAD_TYPE = re.compile(r"tensor<([0-9x]+)x!tt\.ptr<(\w+)>")


def loop_loads(ttgir: str) -> str:
    """The plain loads (`tt.load`, not Triton's asynchronous copies) inside the loops of one kernel's TTGIR,
    as `count: shapes`. A sequential loop with one program per SM waits on each where its value is used
    (the state passes' small per-chunk inputs); where many programs share an SM they hide it."""
    found, stack, depth = [], [], 0
    for line in ttgir.splitlines():
        if "scf.for" in line and line.rstrip().endswith("{"):
            stack.append(depth)
        if stack and re.search(r"= tt\.load ", line):
            m = _LOAD_TYPE.search(line)
            found.append(f"{m.group(1)}x{m.group(2)}" if m else "scalar")
        depth += line.count("{") - line.count("}")
        while stack and depth <= stack[-1]:
            stack.pop()
    return f"{len(found)}: {' '.join(found)}" if found else "0"


_MMA_LAYOUT = re.compile(
    r"^#(mma\d*) = #ttg\.nvidia_mma<\{versionMajor = (\d+),.*?warpsPerCTA = \[(\d+), (\d+)\].*?"
    r"instrShape = \[(\d+), (\d+)",
    re.M,
)
_MMA_PRODUCT = re.compile(r"= (?:tt\.dot|ttng\.warp_group_dot) .*?-> tensor<(\d+)x(\d+)x\w+, #(mma\d*)>")


def mma_dup(ttgir: str) -> str:
    """The tensor-core products of one kernel's TTGIR whose layout covers more rows or columns than the
    product has, so that several warps compute the same entries, as `duplicated/all`: each warp of an
    `nvidia_mma` layout takes 16 rows, and 8 columns (MMAv2) or the instruction's N (MMAv3) at a time. Triton
    puts all warps along the rows of a product whose result feeds another product (a chain); with 8 warps
    and 64 rows that is twice the rows, both warpgroups computing the same ones."""
    layouts = {m.group(1): tuple(int(m.group(i)) for i in range(2, 7)) for m in _MMA_LAYOUT.finditer(ttgir)}
    dup = total = 0
    for m in _MMA_PRODUCT.finditer(ttgir):
        rows, cols = int(m.group(1)), int(m.group(2))
        version, warps_m, warps_n, _, instr_n = layouts[m.group(3)]
        per_warp_n = instr_n if version == 3 else 8
        total += 1
        dup += warps_m * 16 > rows or warps_n * per_warp_n > cols
    return f"{dup}/{total}"


def launch_options(launch: Launch, options: dict | None = None) -> dict:
    """The compile options of one launch (warps, stages, register cap), `options` taking precedence."""
    opts = {"num_warps": launch.kwargs.get("num_warps", 4), "num_stages": launch.kwargs.get("num_stages", 3)}
    if launch.kwargs.get("maxnreg") is not None:
        opts["maxnreg"] = launch.kwargs["maxnreg"]
    return opts | (options or {})


def compile_launch(launch: Launch, options: dict | None = None):
    """One recorded launch compiled for sm_90 as its launcher would (Triton's CompiledKernel: asm["ptx"],
    asm["ttgir"], asm["cubin"], metadata)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(kernel_homes()[launch.kernel], launch.kernel)
    plain = tuple(p.name for p in getattr(fn, "params", ()) if getattr(p, "do_not_specialize", False))
    sig, consts, attrs = signature(fn.fn, launch.args, launch.kwargs, plain)
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=launch_options(launch, options))


def resources(launch: Launch, options: dict) -> dict:
    """Registers per thread, spilled bytes and shared memory of one launch, compiled for sm_90."""
    import triton

    opts = launch_options(launch, options)
    out = compile_launch(launch, options)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(out.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True)
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
    fields = dict(re.findall(r"(\w+(?:\[\d\])?):(\d+)", usage.stdout))
    return {
        "warps": opts["num_warps"],
        "stages": opts["num_stages"],
        "maxnreg": opts.get("maxnreg"),
        "regs": int(fields["REG"]),
        "spill_bytes": int(fields["LOCAL"]) + int(fields["STACK"]),
        "smem": int(out.metadata.shared) + int(fields["SHARED"]),
        **sass_counts(sass),
        "mma_dup": mma_dup(out.asm["ttgir"]),
        "loop_loads": loop_loads(out.asm["ttgir"]),
    }


def programs_per_sm(regs: int, warps: int, smem: int) -> tuple[int, str]:
    """Resident programs per SM on sm_90 and the limit that sets it."""
    regs_per_warp = math.ceil(regs * 32 / REG_UNIT_PER_WARP) * REG_UNIT_PER_WARP
    limits = {
        "registers": REGS_PER_SM // (regs_per_warp * warps),
        "threads": MAX_THREADS // (32 * warps),
        "blocks": MAX_BLOCKS,
        "shared memory": SMEM_PER_SM // (smem + SMEM_RESERVED_PER_BLOCK),
    }
    limit = min(limits, key=limits.get)
    return limits[limit], limit


def parse_options(items: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    kernels = kernel_homes()
    for item in items:
        m = re.fullmatch(r"(\w+):(num_warps|num_stages|maxnreg)=(\d+)", item)
        if not m:
            raise SystemExit(
                f"--options {item!r}: expected KERNEL:NAME=INT, NAME one of num_warps, num_stages, maxnreg; "
                "KERNEL a short name such as intra_bwd (for _intra_bwd_kernel)"
            )
        kernel = f"_{m.group(1)}_kernel"
        if kernel not in kernels:
            raise SystemExit(f"--options {item!r}: no kernel {kernel}; kernels: {', '.join(kernels)}")
        out.setdefault(kernel, {})[m.group(2)] = int(m.group(3))
    return out


def kernel_ptx(kernel: str, consts: dict) -> str:
    """The PTX of one kernel compiled for sm_90 with constexprs `consts` (0 for those not named)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    homes = kernel_homes()
    if kernel not in homes:
        raise SystemExit(f"no kernel {kernel} in kernels.triton.chunk or its stage modules")
    fn = getattr(homes[kernel], kernel)
    sig, given = {}, {}
    tuples = _tuple_params(kernel, fn)
    for name, p in inspect.signature(fn.fn).parameters.items():
        if "constexpr" in str(p.annotation):
            sig[name], given[name] = "constexpr", consts.get(name, 0)
        elif name in tuples:
            # every pointer a tuple parameter groups given, in its dtype at the first launch (fp32 where none)
            sig[name] = tuple("*fp32" if x is None else "*" + POINTER_TYPES[x.dtype] for x in tuples[name])
        else:
            sig[name] = "fp32" if name == "scale" else "i32" if name in ("T", "NT") else (
                "*bf16" if name in LOWP_POINTERS else "*fp32")
    src = ASTSource(fn=fn, signature=sig, constexprs=given)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def _tuple_params(kernel: str, fn) -> dict[str, tuple]:
    """The parameters of `kernel` that take a tuple of pointers, each with the tuple of its first launch
    (the default op's first, at a small shape): how many pointers a tuple holds is the launch code's."""
    from kernels.triton import VARIANTS

    signature = inspect.signature(fn.fn).parameters.items()
    params = [n for n, p in signature if "constexpr" not in str(p.annotation)]
    ops = sorted((v[0] for v in VARIANTS), key=lambda op: op != "kda_bounded")
    for op in ops:
        for launches in record_launches(op, 1, 256, 2).values():
            for launch in launches:
                if launch.kernel == kernel:
                    return {n: a for n, a in zip(params, launch.args, strict=True) if isinstance(a, tuple)}
    return {}


# entry points of `in_tree` (another tree's kernels, this toolkit): argv as strings, the answer on stdout


def print_kernel_ptx(argv: list[str]) -> None:
    print(kernel_ptx(argv[0], json.loads(argv[1])))


def print_launches(argv: list[str]) -> None:
    """op B T H D: each phase's header, then one line a launch: kernel (grid) KEY=VALUE ..."""
    for phase, launches in record_launches(argv[0], *(int(x) for x in argv[1:5])).items():
        print(f"-- {phase}")
        for launch in launches:
            print(launch.kernel, launch.grid, " ".join(f"{k}={v}" for k, v in sorted(launch.kwargs.items())))


def _arg_types(a):
    # what of an argument its compiled kernel depends on beyond the constexprs: dtypes, None, tuples' contents
    if isinstance(a, tuple):
        return tuple(_arg_types(x) for x in a)
    return str(a.dtype) if hasattr(a, "dtype") else type(a).__name__


def print_launch_ptx(argv: list[str]) -> None:
    """ops (JSON) B T H D: one JSON line a launch of the no-grad forward and of forward and backward,
    with its PTX."""
    cache: dict[str, str] = {}
    for op in json.loads(argv[0]):
        phases = record_launches(op, *(int(x) for x in argv[1:5]))
        grouped = {"no-grad forward": phases[PHASES[0]],
                   "forward and backward": phases[PHASES[1]] + phases[PHASES[2]]}
        for phase, launches in grouped.items():
            for launch in launches:
                dtypes = [_arg_types(a) for a in launch.args]
                key = repr((launch.kernel, sorted(launch.kwargs.items()), dtypes))
                if key not in cache:
                    cache[key] = compile_launch(launch).asm["ptx"]
                settings = " ".join(f"{k}={v}" for k, v in sorted(launch.kwargs.items()))
                print(json.dumps({"op": op, "phase": phase, "kernel": launch.kernel, "settings": settings,
                                  "ptx": cache[key]}))


_DEBUG_LABEL = re.compile(r"\$L__tmp\d+:")


def instructions(ptx: str) -> tuple[int, list[str]]:
    """The number of kernel parameters, and the PTX body without the parameter declarations, debug
    sections, comments, .loc lines, the debug sections' labels ($L__tmp, which mark where an inlined
    @triton.jit helper's code starts and ends) and register numbers, its parameter loads sorted (a new,
    unused pointer argument only shifts them)."""
    body = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    n_params, loads, lines = 0, [], []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if not line or line.startswith((".loc", ".file")) or _DEBUG_LABEL.fullmatch(line):
            continue
        if line.startswith(".param"):
            n_params += 1
            continue
        line = re.sub(r"_param_\d+", "_param", line)
        line = re.sub(r"%([a-z]+)\d+", r"%\1", line)
        (loads if line.startswith("ld.param") else lines).append(line)
    return n_params, sorted(loads) + lines


def compile_in(tree: Path, kernel: str, consts: dict) -> tuple[int, list[str]]:
    """`instructions` of one kernel of `tree` compiled with `consts`."""
    return instructions(in_tree(tree, "benchmarks.launches:print_kernel_ptx", kernel, json.dumps(consts)))


def compile_launches(tree: Path, ops: list[str], shape: tuple[int, int, int, int]) -> list[dict]:
    """Every launch of `ops` at shape (B, T, H, D) in `tree`, each with its PTX instructions
    (`instructions`), in launch order."""
    out = in_tree(tree, "benchmarks.launches:print_launch_ptx", json.dumps(ops), *(str(x) for x in shape))
    launches = [json.loads(line) for line in out.splitlines()]
    for launch in launches:
        launch["params"], launch["ptx"] = instructions(launch.pop("ptx"))
    return launches


def compare_launches(rev: str, before: list[dict], after: list[dict]) -> bool:
    """Print, per op and phase, whether each launch compiles to the same instructions in both trees;
    True when all do (and the launches are the same kernels in the same order)."""
    same = True
    groups: dict[tuple[str, str], tuple[list, list]] = {}
    for side, launches in ((0, before), (1, after)):
        for launch in launches:
            groups.setdefault((launch["op"], launch["phase"]), ([], []))[side].append(launch)
    for (op, phase), (old, new) in groups.items():
        if [x["kernel"] for x in old] != [x["kernel"] for x in new]:
            same = False
            print(f"{op}, {phase}: other kernels: {[x['kernel'] for x in old]} at {rev}, "
                  f"{[x['kernel'] for x in new]} now")
            continue
        differ = [b["kernel"] for a, b in zip(old, new, strict=True) if a["ptx"] != b["ptx"]]
        same = same and not differ
        verdict = f"other instructions in {', '.join(differ)}" if differ else "same instructions"
        print(f"{op}, {phase}: {len(new)} launches, {verdict}")
    return same


def launch_lines(tree: Path, op: str, B: int, T: int, H: int, D: int = 128) -> list[str]:
    """`print_launches` of `tree`'s launch code, as lines."""
    out = in_tree(tree, "benchmarks.launches:print_launches", op, *(str(x) for x in (B, T, H, D)))
    return out.splitlines()


def _parse(line: str) -> tuple[str, dict[str, str]]:
    # "kernel (grid) KEY=VALUE ..." -> ("kernel (grid)", {KEY: VALUE})
    head, _, settings = line.partition(") ")
    return head + ")", dict(item.split("=", 1) for item in settings.split())


def compare(old: list[str], new: list[str]) -> tuple[list[str], dict[str, set[str]]]:
    """The launches that differ (unified diff lines, empty when none) and, per kernel, the constexprs only
    one side passes (`NAME=VALUE before` / `NAME=VALUE now`). Launches match in order; a launch differs
    in its kernel, grid, or any setting both sides pass."""
    one_sided: dict[str, set[str]] = {}
    if len(old) == len(new):
        same = True
        for a, b in zip(old, new, strict=True):
            if a.startswith("--") or b.startswith("--"):
                same = same and a == b
                continue
            (head_a, set_a), (head_b, set_b) = _parse(a), _parse(b)
            common = set_a.keys() & set_b.keys()
            same = same and head_a == head_b and all(set_a[k] == set_b[k] for k in common)
            kernel = head_b.split()[0]
            for key in set_a.keys() - common:
                one_sided.setdefault(kernel, set()).add(f"{key}={set_a[key]} before")
            for key in set_b.keys() - common:
                one_sided.setdefault(kernel, set()).add(f"{key}={set_b[key]} now")
        if same:
            return [], one_sided
    return list(difflib.unified_diff(old, new, "before", "working tree", lineterm="", n=0)), {}


def _parser(command: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"python -m benchmarks.launches {command}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def diff(argv: list[str]) -> None:
    ap = _parser("diff")
    ap.add_argument("rev", help="git revision to compare the working tree against, e.g. HEAD~3")
    ap.add_argument("--op", default="kda_bounded", help="a name of kernels.triton.VARIANTS")
    add_shape_args(ap)
    args = ap.parse_args(argv)
    shape = (args.op, args.B, args.T, args.H, args.D)
    new = launch_lines(ROOT, *shape)
    with checkout(args.rev) as tree:
        old = launch_lines(tree, *shape)
    print(f"{args.op} B{args.B} T{args.T} H{args.H} K=V={args.D} bf16: {len(old)} launches at {args.rev}, "
          f"{len(new)} now")
    lines, one_sided = compare(old, new)
    for kernel, items in sorted(one_sided.items()):
        print(f"{kernel}: constexprs passed on one side only: {', '.join(sorted(items))}")
    if lines:
        print("\n".join(lines))
        sys.exit(1)
    print("same launches")


def ptx(argv: list[str]) -> None:
    ap = _parser("ptx")
    ap.add_argument("rev", help="git revision to compare the working tree against, e.g. HEAD~3")
    ap.add_argument("kernel", nargs="?", help="a @triton.jit kernel of kernels/triton/ (_intra_fwd_kernel)")
    ap.add_argument("--ops", nargs="*", default=None, help="every launch of these ops (or all), see above")
    add_shape_args(ap)
    ap.add_argument("--const", nargs="*", default=[], metavar="NAME=VALUE",
                    help="constexpr values (integers, or strings: PREC)")
    args = ap.parse_args(argv)
    if args.ops is not None:
        from kernels.triton import VARIANTS

        names = [variant[0] for variant in VARIANTS]
        ops = names if args.ops in ([], ["all"]) else args.ops
        unknown = sorted(set(ops) - set(names))
        if unknown:
            raise SystemExit(f"--ops {unknown}: not ops of kernels.triton.VARIANTS {names}")
        shape = (args.B, args.T, args.H, args.D)
        with checkout(args.rev) as tree:
            before = compile_launches(tree, ops, shape)
        after = compile_launches(ROOT, ops, shape)
        print(f"B{args.B} T{args.T} H{args.H} K=V={args.D} bf16, {args.rev} against the working tree")
        if not compare_launches(args.rev, before, after):
            raise SystemExit(1)
        return
    if args.kernel is None:
        raise SystemExit("name a kernel (e.g. _intra_fwd_kernel) or give --ops")
    consts = dict(DEFAULTS)
    for item in args.const:
        name, sep, value = item.partition("=")
        if not sep or not value:
            raise SystemExit(f"--const {item!r}: expected NAME=VALUE, e.g. BOUNDED=0 or PREC=tf32x3")
        consts[name] = int(value) if value.lstrip("-").isdigit() else value
    with checkout(args.rev) as tree:
        p_before, before = compile_in(tree, args.kernel, consts)
    p_after, after = compile_in(ROOT, args.kernel, consts)
    lines = list(difflib.unified_diff(before, after, args.rev, "working tree", lineterm="", n=1))
    print(f"{args.kernel} {consts}")
    print(f"{args.rev}: {len(before)} lines, {p_before} parameters; working tree: {len(after)}, {p_after}")
    if not lines:
        print("same instructions")
        return
    print("\n".join(lines[:200]))
    labels = re.compile(r"^\$L__\w+:$")
    if Counter(x for x in before if not labels.match(x)) == Counter(x for x in after if not labels.match(x)):
        print("(the same instructions in another order)")
    raise SystemExit(1)


def occupancy(argv: list[str]) -> None:
    from kernels.triton import VARIANTS, plan

    ap = _parser("occupancy")
    ap.add_argument("--ops", nargs="*", default=["kda_bounded"], choices=[v[0] for v in VARIANTS])
    add_shape_args(ap)
    ap.add_argument("--options", nargs="*", default=[], metavar="KERNEL:NAME=INT")
    ap.add_argument("--out", type=Path, default=None, help="CSV file")
    ap.add_argument("--no-grad", action="store_true", help="the no-grad forward's launches alone")
    plan.add_override_argument(ap)
    args = ap.parse_args(argv)
    plan.overrides_from_args(args)
    options = parse_options(args.options)
    print(f"# sm_90 resource usage by this machine's compiler, B{args.B} T{args.T} H{args.H} K=V={args.D} "
          f"bf16: {provenance()}")
    rows = []
    for name in [v[0] for v in VARIANTS if v[0] in args.ops]:
        phases = record_launches(name, args.B, args.T, args.H, args.D)
        seen = set()
        for launch in phases[PHASES[0]] if args.no_grad else phases[PHASES[1]] + phases[PHASES[2]]:
            key = (launch.kernel, tuple(sorted((k, str(v)) for k, v in launch.kwargs.items())))
            if key in seen:
                continue
            seen.add(key)
            for opts in [{}] + ([options[launch.kernel]] if launch.kernel in options else []):
                r = resources(launch, opts)
                n, limit = programs_per_sm(r["regs"], r["warps"], r["smem"])
                programs = math.prod(launch.grid)
                rows.append({"op": name, "kernel": launch.kernel, "programs": programs, **r,
                             "programs_per_sm": n, "warps_per_sm": n * r["warps"], "limited_by": limit,
                             "waves": round(programs / (n * SMS), 1)})
    head = ["op", "kernel", "programs", "warps", "stages", "maxnreg", "regs", "spill_bytes", "smem",
            "programs_per_sm", "warps_per_sm", "limited_by", "waves", "instrs", "loop_instrs", "mufu", "mma",
            "bar", "mma_dup", "loop_loads"]
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in head]
    for r in [dict(zip(head, head, strict=True)), *rows]:
        print("  ".join(str(r[h]).ljust(w) for h, w in zip(head, widths, strict=True)))
    if args.out:
        write_csv(args.out, rows, head)


COMMANDS = {"diff": diff, "ptx": ptx, "occupancy": occupancy}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"{__doc__.split(chr(10) * 2)[1]}\n\ncommands: {', '.join(COMMANDS)} (-h: flags)")
    # compiled for the GPU, with the GPU's launch settings, not run by the interpreter
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    COMMANDS[argv[0]](argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
