"""How many programs of each kernel fit on one SM: registers, spills and shared memory of the family's
kernels as they are launched, compiled for an H100/H200 (sm_90) on this machine, no GPU needed.

    python benchmarks/occupancy.py                                  # bounded KDA, B8 T8K H16, bf16
    python benchmarks/occupancy.py --ops kda delta_rule --set intra_bwd.warps=2
    python benchmarks/occupancy.py --options intra_bwd:num_stages=2 intra_bwd:maxnreg=128
    python benchmarks/occupancy.py --no-grad --ops kda_bounded delta_rule   # the no-grad forward's launches

The forward and backward launch code (kernels/triton/chunk.py and its stage modules) runs on meta tensors with
every kernel replaced by a recorder, so each launch is seen with its real constexprs, argument dtypes, warps
and stages; each is then compiled with Triton's bundled ptxas and `cuobjdump --dump-resource-usage` reads its
registers per thread, spilled bytes (LOCAL) and shared memory, and `cuobjdump -sass` its static instruction
counts: all, each loop body's, exponentials (mufu), tensor-core products (mma), barriers; and from the TTGIR
the plain (not asynchronously copied, so waited-on) loads inside loops (`loop_loads`) and the tensor-core
products that several warps compute alike (`mma_dup`). Programs per SM follow from the sm_90 limits
(65,536 registers in 256-register units per warp, 2,048 threads, 32 blocks, 228 KB of shared memory with
1 KB reserved per block). `--options KERNEL:NAME=INT` compiles one kernel with other
launch options (num_warps, num_stages, maxnreg) than the launch code's, to see what they would free.

The figures are this machine's Triton's (see the header): the device image's Triton may allocate
registers differently, so run the script there too before drawing conclusions. Writes `--out` as CSV.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, with the GPU's launch settings
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.triton import VARIANTS, chunk, plan  # noqa: E402

# sm_90 (H100, H200) per-SM limits
REGS_PER_SM = 65536
REG_UNIT_PER_WARP = 256
MAX_THREADS = 2048
MAX_BLOCKS = 32
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_BLOCK = 1024
SMS = 132  # H200

# every kernel of the family and the stage module that holds it (and launches it: a recorder goes there)
KERNELS = {
    name: module
    for module in chunk.STAGES
    for name in sorted(vars(module))
    if name.startswith("_") and name.endswith("_kernel")
}


@dataclass
class Launch:
    kernel: str
    grid: tuple
    args: tuple
    kwargs: dict


class _Recorder:
    def __init__(self, name: str, launches: list) -> None:
        self.name, self.launches = name, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(Launch(self.name, tuple(int(g) for g in grid), args, kwargs))

        return launch


def record(
    name: str, decay, delta: bool, lower_bound, B: int, T: int, H: int, D: int, keep: bool = True
) -> list[Launch]:
    """Every kernel launch of one forward and one backward of `name`, on meta tensors (keep=False: of the
    no-grad forward alone)."""
    launches: list[Launch] = []
    saved = {k: getattr(module, k) for k, module in KERNELS.items()}
    for k, module in KERNELS.items():
        setattr(module, k, _Recorder(k, launches))
    try:
        meta = dict(device="meta", dtype=torch.bfloat16)
        q, k_, v = (torch.empty(B, T, H, D, **meta) for _ in range(3))
        g = None
        if decay != "none":
            g = torch.empty(
                (B, T, H) if decay == "scalar" else (B, T, H, D), device="meta", dtype=torch.float32
            )
        beta = torch.empty(B, T, H, **meta) if delta else None
        o, ht, saved_t = chunk.chunk_forward(
            q, k_, v, g, beta, D**-0.5, None, False, 64, lower_bound, keep=keep
        )
        if keep:
            chunk.chunk_backward(
                q, k_, v, g, beta, D**-0.5, None, torch.empty_like(o), None, 64, lower_bound, saved_t
            )
    finally:
        for k, fn in saved.items():
            setattr(KERNELS[k], k, fn)
    return launches


POINTER_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.uint16: "u16"}


def _signature(fn, args: tuple, kwargs: dict, plain: tuple = ()) -> tuple[dict, dict, dict]:
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
        if a is None:
            # a buffer the launch does not touch: a constexpr None, as the launcher specializes it
            sig[name] = "constexpr"
            consts[name] = None
        elif isinstance(a, torch.Tensor):
            sig[name] = "*" + POINTER_TYPES[a.dtype]
            attrs[(index[name],)] = [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[name] = "fp32"
        elif name in plain:
            sig[name] = "i32"
        elif a == 1:
            sig[name] = "constexpr"
            consts[name] = 1
        else:
            sig[name] = "i32"
            if a % 16 == 0:
                attrs[(index[name],)] = [["tt.divisibility", 16]]
    for name, p in params:
        if "constexpr" in str(p.annotation):
            sig[name] = "constexpr"
            value = kwargs[name]
            consts[name] = int(value) if isinstance(value, bool) else value
    return sig, consts, attrs


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
    opts.update(options or {})
    return opts


def compile_launch(launch: Launch, options: dict | None = None):
    """One recorded launch compiled for sm_90 as its launcher would (Triton's CompiledKernel: asm["ptx"],
    asm["ttgir"], asm["cubin"], metadata)."""
    fn = getattr(KERNELS[launch.kernel], launch.kernel)
    plain = tuple(p.name for p in getattr(fn, "params", ()) if getattr(p, "do_not_specialize", False))
    sig, consts, attrs = _signature(fn.fn, launch.args, launch.kwargs, plain)
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=launch_options(launch, options))


def resources(launch: Launch, options: dict) -> dict:
    """Registers per thread, spilled bytes and shared memory of one launch, compiled for sm_90."""
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
    for item in items:
        m = re.fullmatch(r"(\w+):(num_warps|num_stages|maxnreg)=(\d+)", item)
        if not m:
            raise SystemExit(
                f"--options {item!r}: expected KERNEL:NAME=INT, NAME one of num_warps, num_stages, maxnreg; "
                "KERNEL a short name such as intra_bwd (for _intra_bwd_kernel)"
            )
        kernel = f"_{m.group(1)}_kernel"
        if kernel not in KERNELS:
            raise SystemExit(f"--options {item!r}: no kernel {kernel}; kernels: {', '.join(KERNELS)}")
        out.setdefault(kernel, {})[m.group(2)] = int(m.group(3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", nargs="*", default=["kda_bounded"], choices=[v[0] for v in VARIANTS])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128, help="head size K = V")
    ap.add_argument("--options", nargs="*", default=[], metavar="KERNEL:NAME=INT")
    ap.add_argument("--out", type=Path, default=None, help="CSV file")
    ap.add_argument("--no-grad", action="store_true", help="the no-grad forward's launches alone")
    plan.add_override_argument(ap)
    args = ap.parse_args()
    changed = plan.overrides_from_args(args)
    options = parse_options(args.options)
    shape = f"B{args.B} T{args.T} H{args.H} K=V={args.D} bf16"
    tuned = f", settings {changed}" if changed else ""
    print(f"# sm_90 resource usage, Triton {triton.__version__} (this machine's compiler), {shape}{tuned}")
    rows = []
    for name, decay, delta, lower_bound in VARIANTS:
        if name not in args.ops:
            continue
        seen = set()
        for launch in record(
            name, decay, delta, lower_bound, args.B, args.T, args.H, args.D, keep=not args.no_grad
        ):
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
                             "waves": round(programs / (n * SMS), 1)})  # fmt: skip
    head = ["op", "kernel", "programs", "warps", "stages", "maxnreg", "regs", "spill_bytes", "smem",
            "programs_per_sm", "warps_per_sm", "limited_by", "waves", "instrs", "loop_instrs", "mufu", "mma",
            "bar", "mma_dup", "loop_loads"]  # fmt: skip
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in head]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[h]).ljust(w) for h, w in zip(head, widths, strict=True)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=head)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
