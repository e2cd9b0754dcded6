"""GPU check of the short convolution's Triton kernel (kernels/triton/conv.py): correctness and speed.

Run on the device machine (a CUDA GPU):

    python tests/gpu/check_conv.py --out runs/gpu_check           # correctness grid + timing
    python tests/gpu/check_conv.py --out runs/gpu_check --sweep   # + the kernels' tile configs timed
    python tests/gpu/check_conv.py --compile       # sm_90 registers, spills, instructions (no GPU needed)
    TRITON_INTERPRET=1 python tests/gpu/check_conv.py --cpu --out /tmp/conv   # the grid, tiny, on the CPU

Each form of the backward (kernels/triton/conv.py's BWD_FORMS: fused, two_pass, looped) is checked and timed.
Correctness: for bf16 and fp32 at the paper's shape (B=256, T=1024, C=256, W=4, with and without an initial
state) and odd shapes (odd lengths and channel counts, W in {2, 3, 4, 8}, the decode step T=1): relative RMS
error of y, the final state and the gradients of x, weight and the initial state, against the F.conv1d
reference in float64 on the same (rounded) inputs. The same error of the path the mixers took before (the
reference in the input dtype, weight cast to it) is written beside ours as a cross-check of the bounds.
Bounds: fp32 1e-5; bf16 y 5e-3, gradients 8e-3 (the kernel rounds only its outputs).
Timing (bf16, B=256, T=1024, C=256, W=4, no state: a training step's conv): forward and forward + backward
(dx and dweight) of ours and of the F.conv1d path, triton.testing.do_bench medians, and for ours the
bandwidth that the kernels' least traffic at that time would take (`min_bytes`: a memory-bound kernel near
the GPU's peak, 4.8 TB/s on an H200, is as fast as it can be).
--sweep times each kernel at other tiles too (the two-pass form's second kernel also alone), and checks
each tile's outputs against the reference; the looped form's first kernel keeps its own tile there (its
[W, positions, channels] block at the larger tiles would spill) and is swept apart, over its tiles and the
positions a program walks (LOOP_SWEEP).
Writes conv_errors.csv and conv_timing.csv (and conv_sweep.csv, conv_loop_sweep.csv) into --out, prints
tables; exits 1 if an error is over its bound.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import rel_rms  # noqa: E402
from kernels.conv import short_conv, short_conv_reference  # noqa: E402

BOUNDS = {
    torch.float32: {"y": 1e-5, "final_state": 1e-5, "dx": 1e-5, "dweight": 1e-5, "dstate": 1e-5},
    torch.bfloat16: {"y": 5e-3, "final_state": 5e-3, "dx": 8e-3, "dweight": 8e-3, "dstate": 8e-3},
}
# (B, T, C, W, with initial state)
PAPER = [(256, 1024, 256, 4, False), (256, 1024, 256, 4, True)]
ODD = [
    (3, 1000, 200, 4, True),
    (5, 63, 96, 3, False),
    (2, 100, 48, 2, True),
    (4, 17, 256, 8, True),
    (32, 1, 768, 4, True),
    (1, 8192, 512, 4, False),
]
CPU = [(2, 17, 48, 4, True), (2, 1, 48, 3, True), (1, 63, 20, 2, False)]
# tile configs (BLOCK_T, BLOCK_C, num_warps) for --sweep
SWEEP = [(16, 128, 4), (32, 64, 4), (32, 128, 4), (64, 64, 4), (64, 64, 8), (64, 128, 8), (128, 64, 8)]
# the looped form's first kernel: (BLOCK_T, BLOCK_C, num_warps, LOOP_POSITIONS)
LOOP_SWEEP = [(16, 64, 4, 64), (16, 64, 4, 128), (16, 64, 4, 256), (16, 64, 4, 1024), (16, 128, 4, 128),
              (16, 128, 8, 128), (32, 64, 4, 128), (32, 64, 8, 256), (16, 64, 2, 128)]


def _grads(x, weight, state, fn, dy, dfinal) -> dict[str, torch.Tensor]:  # noqa: ANN001
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, weight, state)]
    y, final = fn(*leaves)
    wanted = [t for t in leaves if t is not None]
    grads = torch.autograd.grad((y * dy.to(y.dtype)).sum() + (final * dfinal.to(final.dtype)).sum(), wanted)
    out = {"y": y, "final_state": final, "dx": grads[0], "dweight": grads[1]}
    if state is not None:
        out["dstate"] = grads[2]
    return out


def check_case(
    B: int, T: int, C: int, W: int, with_state: bool, dtype: torch.dtype, device: str, form: str = "fused"
) -> list[dict]:
    from kernels.triton import conv

    conv.BWD_FORM = form
    gen = torch.Generator(device=device).manual_seed(B * 7 + T * 3 + C + W)
    x = torch.randn(B, T, C, device=device, generator=gen).to(dtype)
    weight = torch.randn(C, W, device=device, generator=gen) / W**0.5
    state = torch.randn(B, C, W - 1, device=device, generator=gen).to(dtype) if with_state else None
    dy = torch.randn(B, T, C, device=device, generator=gen)
    dfinal = torch.randn(B, C, W - 1, device=device, generator=gen)
    ours = _grads(x, weight, state, lambda *a: short_conv(*a, backend="triton"), dy, dfinal)
    ref = _grads(*(t.double() if t is not None else None for t in (x, weight, state)), short_conv_reference,
                 dy.double(), dfinal.double())  # fmt: skip
    before = _grads(x, weight, state, short_conv_reference, dy, dfinal)
    rows = []
    for name in ref:
        err, err_before = rel_rms(ref[name], ours[name]), rel_rms(ref[name], before[name])
        rows.append({
            "form": form, "dtype": str(dtype).removeprefix("torch."), "B": B, "T": T, "C": C, "W": W,
            "state": with_state, "tensor": name, "ours": err, "before": err_before,
            "bound": BOUNDS[dtype][name], "ok": err <= BOUNDS[dtype][name],
        })  # fmt: skip
    return rows


def _bench(fn, warmup: int = 25, rep: int = 100) -> float:  # noqa: ANN001
    import triton.testing

    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def min_bytes(kernel: str, B: int, T: int, C: int, W: int, x_bytes: int = 2, block_t: int = 32) -> int:
    """The least traffic of one launch without a state: each [B, T, C] tensor read or written once (fwd: x,
    y; bwd or fused, the one backward kernel: x, dy, dx; two_pass or looped, both its kernels: x, dy, da
    written and read, dx) and the backward's fp32 weight-gradient partials ([B * T / block_t, W, C], block_t
    the positions of one partial sum) written and summed."""
    tensor = B * T * C * x_bytes
    if kernel == "fwd":
        return 2 * tensor
    partials = B * -(-T // block_t) * W * C * 4
    return (5 if kernel in ("two_pass", "looped") else 3) * tensor + 2 * partials


def _bwd_block_t(form: str) -> int:
    from kernels.triton import conv

    if form == "looped":
        block_t = conv.TWO_PASS_CONFIGS[("da_looped", False)][0]
        return block_t * conv.loop_span(block_t)
    return conv.TWO_PASS_CONFIGS[("da", False)][0] if form == "two_pass" else conv.CONFIGS[("bwd", False)][0]


def timing(B: int = 256, T: int = 1024, C: int = 256, W: int = 4) -> list[dict]:
    """ms of forward and forward + backward, ours and the F.conv1d path, bf16, no initial state."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, T, C, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_(True)
    weight = (torch.randn(C, W, device="cuda", generator=gen) / W**0.5).requires_grad_(True)
    dy = torch.randn(B, T, C, device="cuda", generator=gen, dtype=torch.bfloat16)
    from kernels.triton import conv

    paths = {"ours": lambda: short_conv(x, weight, backend="triton")[0],
             "F.conv1d": lambda: short_conv_reference(x, weight)[0]}  # fmt: skip
    rows = []
    default = conv.BWD_FORM
    try:
        for name, fn in paths.items():
            for form in conv.BWD_FORMS if name == "ours" else (None,):
                conv.BWD_FORM = form or default
                with torch.no_grad():
                    fwd = _bench(fn)

                def step(fn=fn) -> None:
                    x.grad = weight.grad = None
                    fn().backward(dy)

                row = {"path": f"{name} ({form})" if form else name, "B": B, "T": T, "C": C, "W": W,
                       "fwd_ms": fwd, "fwd_bwd_ms": _bench(step)}
                if form:
                    forward = min_bytes("fwd", B, T, C, W)
                    both = forward + min_bytes(form, B, T, C, W, block_t=_bwd_block_t(form))
                    row.update(fwd_GBps=forward / fwd / 1e6, fwd_bwd_GBps=both / row["fwd_bwd_ms"] / 1e6,
                               default=form == default)
                rows.append(row)
    finally:
        conv.BWD_FORM = default
    return rows


def _sweep_case(B: int, T: int, C: int, W: int, device: str) -> tuple:
    """The sweeps' inputs (bf16 x, fp32 weight, bf16 dy, no initial state) and the float64 reference's
    y, dx and dweight on them."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(B, T, C, device=device, generator=gen, dtype=torch.bfloat16)
    weight = torch.randn(C, W, device=device, generator=gen)
    dy = torch.randn_like(x)
    x64, weight64 = x.double().requires_grad_(True), weight.double().requires_grad_(True)
    y64 = short_conv_reference(x64, weight64)[0]
    dx64, dweight64 = torch.autograd.grad((y64 * dy.double()).sum(), (x64, weight64))
    return x, weight, dy, {"y": y64.detach(), "dx": dx64, "dweight": dweight64}


def sweep(B: int = 256, T: int = 1024, C: int = 256, W: int = 4, device: str = "cuda") -> list[dict]:
    """ms of each kernel alone at each tile config of SWEEP (bf16, no initial state), and the largest
    relative RMS error of its outputs (y; dx and dweight of each backward form) against the float64
    reference, so that a faster tile is a checked one (`ok`: within the bf16 bounds)."""
    from kernels.triton import conv

    x, weight, dy, ref = _sweep_case(B, T, C, W, device)
    da_alone, dx_alone = torch.randn_like(x), torch.empty_like(x)
    bound = BOUNDS[torch.bfloat16]
    rows = []
    default, default_two, default_form = dict(conv.CONFIGS), dict(conv.TWO_PASS_CONFIGS), conv.BWD_FORM
    try:
        for config in SWEEP:
            conv.CONFIGS[("fwd", False)] = conv.CONFIGS[("bwd", False)] = config
            conv.TWO_PASS_CONFIGS[("da", False)] = conv.TWO_PASS_CONFIGS[("dx", False)] = config
            fwd = _bench(lambda: conv.short_conv_fwd(x, weight, None))
            row = {"BLOCK_T": config[0], "BLOCK_C": config[1], "num_warps": config[2], "fwd_ms": fwd}
            over = [rel_rms(ref["y"], conv.short_conv_fwd(x, weight, None)) / bound["y"]]
            for form in conv.BWD_FORMS:
                conv.BWD_FORM = form
                dx, dweight, _ = conv.short_conv_bwd(dy, x, weight, None)
                over += [rel_rms(ref["dx"], dx) / bound["dx"],
                         rel_rms(ref["dweight"], dweight) / bound["dweight"]]
                bwd = _bench(lambda: conv.short_conv_bwd(dy, x, weight, None))
                row[f"bwd_{form}_ms"] = bwd
                block_t = _bwd_block_t(form) if form == "looped" else config[0]
                row[f"bwd_{form}_GBps"] = min_bytes(form, B, T, C, W, block_t=block_t) / bwd / 1e6
            # the second kernel of the two-pass and looped forms alone: da read, dx written
            dx_ms = _bench(lambda: conv.launch_dx(da_alone, weight, dx_alone, dx_alone, False))
            row["dx_ms"], row["dx_GBps"] = dx_ms, 2 * x.nbytes / dx_ms / 1e6
            row["fwd_GBps"] = min_bytes("fwd", B, T, C, W) / fwd / 1e6
            row["default_fwd"] = config == default[("fwd", False)]
            row["default_bwd"] = config == default[("bwd", False)]
            row["default_two_pass"] = config == default_two[("da", False)] == default_two[("dx", False)]
            # the worst of its errors as a fraction of its bound
            row["err_of_bound"] = max(over)
            row["ok"] = row["err_of_bound"] <= 1
            rows.append(row)
    finally:
        conv.CONFIGS.update(default)
        conv.TWO_PASS_CONFIGS.update(default_two)
        conv.BWD_FORM = default_form
    return rows


def loop_sweep(B: int = 256, T: int = 1024, C: int = 256, W: int = 4, device: str = "cuda") -> list[dict]:
    """ms of the looped backward (both its kernels, the second at its default tile) at each config of
    LOOP_SWEEP for its first kernel, bf16, no initial state, and the largest relative RMS error of dx and
    dweight against the float64 reference as a fraction of its bound (`ok`: within it)."""
    from kernels.triton import conv

    x, weight, dy, ref = _sweep_case(B, T, C, W, device)
    dx64, dweight64 = ref["dx"], ref["dweight"]
    bound = BOUNDS[torch.bfloat16]
    rows = []
    default = (dict(conv.TWO_PASS_CONFIGS), conv.LOOP_POSITIONS, conv.BWD_FORM)
    try:
        conv.BWD_FORM = "looped"
        for block_t, block_c, warps, positions in LOOP_SWEEP:
            conv.TWO_PASS_CONFIGS[("da_looped", False)] = (block_t, block_c, warps)
            conv.LOOP_POSITIONS = positions
            dx, dweight, _ = conv.short_conv_bwd(dy, x, weight, None)
            err = max(rel_rms(dx64, dx) / bound["dx"], rel_rms(dweight64, dweight) / bound["dweight"])
            bwd = _bench(lambda: conv.short_conv_bwd(dy, x, weight, None))
            per_sum = _bwd_block_t("looped")
            least = min_bytes("looped", B, T, C, W, block_t=per_sum)
            rows.append({"BLOCK_T": block_t, "BLOCK_C": block_c, "num_warps": warps, "positions": per_sum,
                         "bwd_ms": bwd, "bwd_GBps": least / bwd / 1e6,
                         "default": (block_t, block_c, warps) == default[0][("da_looped", False)]
                         and positions == default[1],
                         "err_of_bound": err, "ok": err <= 1})  # fmt: skip
    finally:
        conv.TWO_PASS_CONFIGS.clear()
        conv.TWO_PASS_CONFIGS.update(default[0])
        conv.LOOP_POSITIONS, conv.BWD_FORM = default[1], default[2]
    return rows


def compile_report(W: int = 4) -> list[dict]:
    """Registers a thread and spilled bytes of both kernels, with and without an initial state, compiled for
    sm_90 at W taps (bf16 x, fp32 weight, C and T multiples of 16, as a launch at the paper's shape
    specializes them). Needs no GPU."""
    import re
    import subprocess
    import tempfile

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("--compile compiles for the GPU: run it without TRITON_INTERPRET=1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.triton import conv

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    kernels = {"fwd": conv._short_conv_fwd_kernel, "bwd": conv._short_conv_bwd_kernel,
               "da": conv._short_conv_da_kernel, "dx": conv._short_conv_dx_kernel,
               "da_looped": conv._short_conv_da_looped_kernel}
    rows = []
    for name, has_state in [*conv.CONFIGS, *conv.TWO_PASS_CONFIGS]:
        kernel = kernels[name]
        BT, BC, warps = conv._config(name, has_state, 256, W)
        sig, consts, attrs = {}, {}, {}
        for i, p in enumerate(kernel.params):
            if p.is_constexpr:
                sig[p.name] = "constexpr"
                consts[p.name] = {"W": W, "HAS_STATE": has_state, "BLOCK_T": BT, "BLOCK_C": BC,
                                  "WP": triton.next_power_of_2(W), "SPAN": conv.loop_span(BT)}[p.name]
                continue
            if p.name in ("T", "C", "NT", "NP"):
                sig[p.name] = "i32"
            else:
                sig[p.name] = "*fp32" if p.name in ("weight", "dweight_partial") else "*bf16"
            if p.name not in ("NT", "NP"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        src = ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
        out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(out.asm["cubin"])
            f.flush()
            usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True,
                                   text=True, check=True).stdout  # fmt: skip
            sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True,
                                  check=True).stdout  # fmt: skip
        fields = dict(re.findall(r"(\w+(?:\[\d\])?):(\d+)", usage))
        # SASS instructions a thread issues for each element of its tile (loops unrolled: straight code),
        # what bounds a kernel that is not memory-bound
        instructions = len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+\S", sass, flags=re.M))
        rows.append({"kernel": kernel.fn.__name__, "state": has_state, "BLOCK_T": BT, "BLOCK_C": BC,
                     "warps": warps, "regs": int(fields["REG"]),
                     "spill_bytes": int(fields["LOCAL"]) + int(fields["STACK"]),
                     "instr_per_element": instructions / (BT * BC / (32 * warps))})  # fmt: skip
    return rows


def _table(rows: list[dict]) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2e}" if v < 0.1 else f"{v:.4g}"
        return str(v)

    lines = [" ".join(f"{k:>11}" for k in rows[0])]
    lines += [" ".join(f"{cell(v):>11}" for v in r.values()) for r in rows]
    return "\n".join(lines)


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for conv_errors.csv, conv_timing.csv")
    parser.add_argument("--cpu", action="store_true", help="tiny grid on CPU tensors; TRITON_INTERPRET=1")
    parser.add_argument("--sweep", action="store_true", help="also time the kernels at the configs of SWEEP")
    parser.add_argument("--compile", action="store_true",
                        help="only compile for sm_90: registers, spills, instructions an element")
    parser.add_argument("--W", type=int, nargs="+", default=[4], help="taps for --compile (default 4)")
    args = parser.parse_args(argv)
    if args.compile:
        print(_table([{"W": W, **row} for W in args.W for row in compile_report(W)]))
        return 0
    if args.cpu:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--cpu runs the Triton kernel in the interpreter: set TRITON_INTERPRET=1")
        device, cases, dtypes = "cpu", CPU, (torch.float32, torch.bfloat16)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run this on the GPU machine, or --cpu for the tiny CPU grid")
        device, cases, dtypes = "cuda", PAPER + ODD, (torch.bfloat16, torch.float32)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    from kernels.triton import conv

    default = conv.BWD_FORM
    errors = [row for form in conv.BWD_FORMS for dtype in dtypes for case in cases
              for row in check_case(*case, dtype, device, form)]
    conv.BWD_FORM = default
    print(_table(errors))
    if args.out is not None:
        _write(args.out / "conv_errors.csv", errors)
    configs = []
    if device == "cuda":
        print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}")
        times = timing()
        print(_table(times))
        ref = times[-1]
        for ours in times[:-1]:
            fwd, both = ref["fwd_ms"] / ours["fwd_ms"], ref["fwd_bwd_ms"] / ours["fwd_bwd_ms"]
            print(f"speed-up of {ours['path']} over F.conv1d: forward {fwd:.1f}x, "
                  f"forward + backward {both:.1f}x")
        if args.out is not None:
            _write(args.out / "conv_timing.csv", times)
        if args.sweep:
            configs = sweep()
            print(_table(configs))
            if args.out is not None:
                _write(args.out / "conv_sweep.csv", configs)
            looped = loop_sweep()
            print(_table(looped))
            if args.out is not None:
                _write(args.out / "conv_loop_sweep.csv", looped)
            configs += looped
    bad = [r for r in errors + configs if not r["ok"]]
    for r in bad:
        print(f"OVER BOUND: {r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
