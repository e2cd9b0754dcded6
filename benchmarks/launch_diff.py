"""Does a change alter how the kernels are launched at a shape? Run the forward (with and without a gradient)
and backward launch code of kernels/triton/ (chunk.py's pipelines, the stage modules' launchers; at older
revisions chunk.py alone) on meta tensors, every kernel replaced by a recorder, at the working tree and at a
git revision, and diff the launches: grid, constexprs, warps, stages, register caps. No GPU, nothing compiled.

    python benchmarks/launch_diff.py REV --op kda_bounded --B 1 --T 65536 --H 16
    python benchmarks/launch_diff.py HEAD~3 --op delta_rule --B 32 --T 2048 --H 2

For launch-rule changes made when no device time is left: where the launches at a shape are the same as
at a revision measured on the GPU, that revision's figures at that shape still hold. (Whether a kernel's
code compiles to the same instructions is benchmarks/ptx_diff.py's question.) Exits 1 when they differ.
A constexpr that only one side passes (an alternative removed or added) is listed with its values, not
counted as a difference: whether the code it selected still compiles the same is ptx_diff's question.
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# runs in a fresh interpreter inside the tree (argv: op B T H D), with benchmarks/occupancy.py's recorder in
# place of every kernel; one line a launch
_RECORD = r"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks")]
import torch
import occupancy
from kernels.triton import VARIANTS, chunk

op = sys.argv[1]
B, T, H, D = (int(x) for x in sys.argv[2:6])
found = [variant[1:] for variant in VARIANTS if variant[0] == op]
if not found:
    sys.exit(f"unknown op {op!r}; kernels.triton.VARIANTS has {[variant[0] for variant in VARIANTS]}")
(decay, delta, lower_bound), = found
launches = []
# where each kernel is looked up when launched: its stage module (a list of names: all in chunk.py)
homes = occupancy.KERNELS
if not isinstance(homes, dict):
    homes = dict.fromkeys(homes, chunk)
for name, module in homes.items():
    setattr(module, name, occupancy._Recorder(name, launches))
bf = torch.bfloat16
q, k, v = (torch.empty(B, T, H, D, dtype=bf, device="meta") for _ in range(3))
g = None
if decay not in (None, "none"):  # (kernels.family's "none"; None at revisions before it)
    g = torch.empty((B, T, H) if decay == "scalar" else (B, T, H, D), device="meta")
beta = torch.empty(B, T, H, dtype=bf, device="meta") if delta else None


def show(title):
    print(title)
    for launch in launches:
        settings = " ".join(f"{key}={value}" for key, value in sorted(launch.kwargs.items()))
        print(launch.kernel, launch.grid, settings)
    launches.clear()


# (the entry points' names at older revisions: _chunk_fwd, _chunk_bwd)
forward = getattr(chunk, "chunk_forward", None) or chunk._chunk_fwd
backward = getattr(chunk, "chunk_backward", None) or chunk._chunk_bwd
for keep in (False, True):
    _, _, saved = forward(q, k, v, g, beta, D**-0.5, None, False, 64, lower_bound, keep=keep)
    show("-- forward " + ("with a gradient" if keep else "without a gradient"))
backward(q, k, v, g, beta, D**-0.5, None, torch.empty_like(v), None, 64, lower_bound, saved)
show("-- backward")
"""


def record(tree: Path, args: argparse.Namespace) -> list[str]:
    argv = [args.op, str(args.B), str(args.T), str(args.H), str(args.D)]
    out = subprocess.run(
        [sys.executable, "-c", _RECORD, *argv], cwd=tree, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        sys.exit(f"recording the launches in {tree} failed:\n{out.stderr[-2000:]}")
    return out.stdout.splitlines()


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", help="git revision to compare the working tree against, e.g. HEAD~3")
    ap.add_argument("--op", default="kda_bounded", help="a name of kernels.triton.VARIANTS")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128, help="K = V")
    args = ap.parse_args()
    new = record(ROOT, args)
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = Path(tmp) / "old"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(old_tree), args.rev], cwd=ROOT, check=True
        )
        try:
            old = record(old_tree, args)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=ROOT, check=True)
    shape = f"B{args.B} T{args.T} H{args.H} K=V={args.D} bf16"
    print(f"{args.op} {shape}: {len(old)} launches at {args.rev}, {len(new)} now")
    diff, one_sided = compare(old, new)
    for kernel, items in sorted(one_sided.items()):
        print(f"{kernel}: constexprs passed on one side only: {', '.join(sorted(items))}")
    if not diff:
        print("same launches")
        return
    print("\n".join(diff))
    sys.exit(1)


if __name__ == "__main__":
    main()
