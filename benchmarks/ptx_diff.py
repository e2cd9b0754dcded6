"""Does a change alter what a kernel compiles to? Compile one kernel of kernels/triton/ (a stage module's, or
chunk.py's at older revisions, where it held them all) for an H100/H200 (sm_90) on this machine, no GPU needed
(Triton's bundled ptxas), at the working tree and at a git revision, and diff the PTX instructions (debug info
and parameter-load order left out).

    python benchmarks/ptx_diff.py REV _intra_fwd_kernel --const BOUNDED=1 DELTA=1

For refactors made when no device time is left: an empty diff says the GPU runs the same code as the
revision checked on it. Constexprs the kernel has that --const does not name take the values of the
default bounded-KDA launch (DECAY="channel", DELTA=1, BOUNDED=1, LOWP=1, K=V=128, BT=64, BC=16, H=16, ...);
constexprs only one side has are passed as 0 there (a new alternative, off). Pointers are bf16 where
the default launch passes 16-bit tensors (q, k, v, qg, kd, kg, aqk, o, dq, dk, ...), fp32 elsewhere.
Exits 1 when the instructions differ (and says when they are only in another order).

    python benchmarks/ptx_diff.py REV --ops kda_bounded delta_rule --B 8 --T 8192 --H 16

With --ops (names of kernels.triton.VARIANTS, or `all`): every launch of each op's no-grad forward and
of its forward and backward with a gradient, as each tree's launch code makes it at that shape (recorded
on meta tensors by that tree's benchmarks/occupancy.py), compiled with its real constexprs, argument
dtypes, warps, stages and register cap, and the two trees' launches compared in order, kernel by kernel.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DEFAULTS = dict(
    H=16, K=128, V=128, BT=64, BC=16, BK=64, BV=64, BW=32, DECAY="channel", DELTA=1, BOUNDED=1, LOWP=1,
    STORE_DECAYED=1, TRI=1, AUTO=0, PRE_KG=1, FUSED=0, DECAYED=0, HAS_H0=1, STORE_HT=1, HAS_DHT=1,
    PREC="tf32",
)  # fmt: skip
LOWP_POINTERS = {
    "q",
    "k",
    "v",
    "qg",
    "kd",
    "kg",
    "aqk",
    "o",
    "do",
    "dq",
    "dk",
    "dv",
    "w",
    "u",
    "vt",
    "h",
    "dh",
}

# runs in a fresh interpreter inside the tree to compile (argv: kernel name, JSON of constexprs)
_COMPILE = r"""
import inspect, json, os, re, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.getcwd())
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.triton import chunk
# the kernel in chunk.py or in one of its stage modules (older revisions: chunk.py holds them all)
homes = [chunk, *getattr(chunk, "STAGES", ())]
found = [getattr(m, sys.argv[1]) for m in homes if hasattr(m, sys.argv[1])]
if not found:
    sys.exit(f"no kernel {sys.argv[1]} in kernels.triton.chunk or its stage modules")
kern = found[0]
given = json.loads(sys.argv[2])
lowp = set(json.loads(sys.argv[3]))
sig, consts = {}, {}
for name, p in inspect.signature(kern.fn).parameters.items():
    if "constexpr" in str(p.annotation):
        consts[name] = given.get(name, 0)
        sig[name] = "constexpr"
    elif name == "scale":
        sig[name] = "fp32"
    elif name in ("T", "NT"):
        sig[name] = "i32"
    else:
        sig[name] = "*bf16" if name in lowp else "*fp32"
out = triton.compile(ASTSource(fn=kern, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
print(out.asm["ptx"])
"""


# runs in a fresh interpreter inside the tree (argv: JSON of [ops], B, T, H, D); one JSON line a launch
_COMPILE_LAUNCHES = r"""
import json, os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks")]
import occupancy
from kernels.triton import VARIANTS

ops = json.loads(sys.argv[1])
B, T, H, D = (int(x) for x in sys.argv[2:6])


def compile_launch(launch):
    if hasattr(occupancy, "compile_launch"):
        return occupancy.compile_launch(launch)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(occupancy.chunk, launch.kernel)
    plain = tuple(p.name for p in getattr(fn, "params", ()) if getattr(p, "do_not_specialize", False))
    sig, consts, attrs = occupancy._signature(fn.fn, launch.args, launch.kwargs, plain)
    opts = {"num_warps": launch.kwargs.get("num_warps", 4), "num_stages": launch.kwargs.get("num_stages", 3)}
    if launch.kwargs.get("maxnreg") is not None:
        opts["maxnreg"] = launch.kwargs["maxnreg"]
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


cache = {}
for name, decay, delta, lower_bound in VARIANTS:
    if name not in ops:
        continue
    for phase, keep in (("no-grad forward", False), ("forward and backward", True)):
        for launch in occupancy.record(name, decay, delta, lower_bound, B, T, H, D, keep=keep):
            dtypes = [str(a.dtype) if hasattr(a, "dtype") else type(a).__name__ for a in launch.args]
            key = repr((launch.kernel, sorted(launch.kwargs.items()), dtypes))
            if key not in cache:
                cache[key] = compile_launch(launch).asm["ptx"]
            settings = " ".join(f"{k}={v}" for k, v in sorted(launch.kwargs.items()))
            print(json.dumps({"op": name, "phase": phase, "kernel": launch.kernel, "settings": settings,
                              "ptx": cache[key]}))
"""


def instructions(ptx: str) -> tuple[int, list[str]]:
    """The number of kernel parameters, and the PTX body without the parameter declarations, debug
    sections, comments, .loc lines and register numbers, its parameter loads sorted (a new, unused
    pointer argument only shifts them)."""
    body = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    n_params, loads, lines = 0, [], []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if not line or line.startswith((".loc", ".file")):
            continue
        if line.startswith(".param"):
            n_params += 1
            continue
        line = re.sub(r"_param_\d+", "_param", line)
        line = re.sub(r"%([a-z]+)\d+", r"%\1", line)
        (loads if line.startswith("ld.param") else lines).append(line)
    return n_params, sorted(loads) + lines


def compile_in(tree: Path, kernel: str, consts: dict) -> tuple[int, list[str]]:
    res = subprocess.run(
        [sys.executable, "-c", _COMPILE, kernel, json.dumps(consts), json.dumps(sorted(LOWP_POINTERS))],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise SystemExit(f"compiling {kernel} in {tree} failed:\n{res.stderr[-3000:]}")
    return instructions(res.stdout)


def compile_launches(tree: Path, ops: list[str], shape: tuple[int, int, int, int]) -> list[dict]:
    """Every launch of `ops` at shape (B, T, H, D) in `tree`, each with its PTX instructions
    (`instructions`), in launch order."""
    res = subprocess.run(
        [sys.executable, "-c", _COMPILE_LAUNCHES, json.dumps(ops), *(str(x) for x in shape)],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise SystemExit(f"compiling the launches of {ops} in {tree} failed:\n{res.stderr[-3000:]}")
    launches = [json.loads(line) for line in res.stdout.splitlines()]
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
                  f"{[x['kernel'] for x in new]} now")  # fmt: skip
            continue
        differ = [b["kernel"] for a, b in zip(old, new, strict=True) if a["ptx"] != b["ptx"]]
        same = same and not differ
        verdict = f"other instructions in {', '.join(differ)}" if differ else "same instructions"
        print(f"{op}, {phase}: {len(new)} launches, {verdict}")
    return same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", help="git revision to compare the working tree against, e.g. HEAD~3")
    ap.add_argument(
        "kernel", nargs="?", help="a @triton.jit kernel of kernels/triton/, e.g. _intra_fwd_kernel"
    )
    ap.add_argument("--ops", nargs="*", default=None, help="every launch of these ops (or all), see above")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128, help="K = V")
    ap.add_argument(
        "--const",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="constexpr values (integers, or strings: PREC)",
    )
    args = ap.parse_args()
    if args.ops is not None:
        main_ops(args)
        return
    if args.kernel is None:
        raise SystemExit("name a kernel (e.g. _intra_fwd_kernel) or give --ops")
    consts = dict(DEFAULTS)
    for item in args.const:
        name, sep, value = item.partition("=")
        if not sep or not value:
            raise SystemExit(f"--const {item!r}: expected NAME=VALUE, e.g. BOUNDED=0 or PREC=tf32x3")
        consts[name] = int(value) if value.lstrip("-").isdigit() else value
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), args.rev], cwd=ROOT, check=True)
        try:
            before = compile_in(old, args.kernel, consts)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=True)
    (p_before, before), (p_after, after) = before, compile_in(ROOT, args.kernel, consts)
    diff = list(difflib.unified_diff(before, after, args.rev, "working tree", lineterm="", n=1))
    print(f"{args.kernel} {consts}")
    print(f"{args.rev}: {len(before)} lines, {p_before} parameters; working tree: {len(after)}, {p_after}")
    if not diff:
        print("same instructions")
        return
    print("\n".join(diff[:200]))
    labels = re.compile(r"^\$L__\w+:$")
    if Counter(x for x in before if not labels.match(x)) == Counter(x for x in after if not labels.match(x)):
        print("(the same instructions in another order)")
    raise SystemExit(1)


def main_ops(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from kernels.triton import VARIANTS

    names = [variant[0] for variant in VARIANTS]
    ops = names if args.ops in ([], ["all"]) else args.ops
    unknown = sorted(set(ops) - set(names))
    if unknown:
        raise SystemExit(f"--ops {unknown}: not ops of kernels.triton.VARIANTS {names}")
    shape = (args.B, args.T, args.H, args.D)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), args.rev], cwd=ROOT, check=True)
        try:
            before = compile_launches(old, ops, shape)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=True)
    after = compile_launches(ROOT, ops, shape)
    print(f"B{args.B} T{args.T} H{args.H} K=V={args.D} bf16, {args.rev} against the working tree")
    if not compare_launches(args.rev, before, after):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
