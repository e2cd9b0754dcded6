"""Does a change alter what a kernel compiles to? Compile one kernel of kernels/triton/chunk.py for an
H100/H200 (sm_90) on this machine, no GPU needed (Triton's bundled ptxas), at the working tree and at
a git revision, and diff the PTX instructions (debug info and parameter-load order left out).

    python benchmarks/ptx_diff.py REV _intra_fwd_kernel --const BOUNDED=1 AUTO=0 DELTA=1

For refactors made when no device time is left: an empty diff says the GPU runs the same code as the
revision checked on it. Constexprs the kernel has that --const does not name take the values of the
default bounded-KDA launch (DECAY=2, DELTA=1, BOUNDED=1, LOWP=1, K=V=128, BT=64, BC=16, H=16, ...);
constexprs only one side has are passed as 0 there (a new alternative, off). Pointers are bf16 where
the default launch passes 16-bit tensors (q, k, v, qg, kd, kg, aqk, o, dq, dk, ...), fp32 elsewhere.
Exits 1 when the instructions differ (and says when they are only in another order).
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
    H=16, K=128, V=128, BT=64, BC=16, BK=64, BV=64, BW=32, DECAY=2, DELTA=1, BOUNDED=1, LOWP=1,
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
kern = getattr(chunk, sys.argv[1])
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", help="git revision to compare the working tree against, e.g. HEAD~3")
    ap.add_argument("kernel", help="a @triton.jit kernel of kernels/triton/chunk.py, e.g. _intra_fwd_kernel")
    ap.add_argument(
        "--const",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="constexpr values (integers, or strings: PREC)",
    )
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
