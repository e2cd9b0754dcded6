"""Where the time goes: per-kernel GPU time of our Triton ops, forward and backward, from torch.profiler.

    python benchmarks/profile_gpu.py --B 8 --T 8192 --H 16 --out /tmp/prof.csv
    python benchmarks/profile_gpu.py --ops kda_bounded delta_rule

For each op of kernels.triton.VARIANTS (bf16, K = V = 128, as in bench_gpu.py) and each pass
(`--passes`: the forward under torch.no_grad, and forward+backward) it runs a few warm-up passes, then
`--iters` profiled ones, and prints each CUDA kernel's mean time per pass (ms) and its share; kernels
that torch launches (casts) appear under their own names. Writes one CSV row per (op, pass, kernel).
`--set KEY=VALUE` changes a launch setting (kernels.triton.plan.SETTINGS) for the run. The forward's
kernels run as plain launches here (fwd.pdl=0 unless --set says otherwise): as programmatic dependent
launches each one is placed early and waits for the one before it, and the profiler would count that
wait as its time.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_gpu import make_inputs  # noqa: E402
from kernels.triton import (  # noqa: E402
    VARIANTS,
    plan,
    triton_chunk,
)


def kernel_times(
    name: str, decay, delta: bool, lower_bound, B: int, T: int, H: int, iters: int, train: bool = True
) -> dict:
    """Mean GPU time per pass of each kernel: one forward+backward (train) or one forward under
    torch.no_grad (infer: the same forward kernels, what bench_gpu.py times as "fwd")."""
    inputs = make_inputs(decay, delta, lower_bound, B, T, H)
    grads = [t.requires_grad_(train) for t in inputs.values() if t is not None]
    do = torch.randn_like(inputs["v"])

    def step() -> None:
        if not train:
            with torch.no_grad():
                triton_chunk(**inputs, lower_bound=lower_bound)
            return
        o, _ = triton_chunk(**inputs, lower_bound=lower_bound)
        o.backward(do)
        for t in grads:
            t.grad = None

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            totals[ev.name] += ev.device_time / 1e3 / iters  # us -> ms per pass
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--ops", nargs="*", default=[v[0] for v in VARIANTS])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--passes",
        nargs="*",
        default=["infer", "train"],
        choices=["infer", "train"],
        help="infer: the no-grad forward; train: forward+backward",
    )
    plan.add_override_argument(ap)
    args = ap.parse_args()
    plan.use_overrides(["fwd.pdl=0"])  # (the docstring says why; --set fwd.pdl=1 overrides it)
    plan.overrides_from_args(args)
    print("settings", plan.current_overrides())
    rows = []
    for name, decay, delta, lb in VARIANTS:
        if name not in args.ops:
            continue
        for pass_ in args.passes:
            times = kernel_times(name, decay, delta, lb, args.B, args.T, args.H, args.iters, pass_ == "train")
            total = sum(times.values())
            what = "fwd+bwd" if pass_ == "train" else "inference fwd"
            print(
                f"\n== {name}  B{args.B} T{args.T} H{args.H}: {total:.3f} ms GPU time per {what}", flush=True
            )
            for kname, ms in times.items():
                print(f"  {ms:8.3f} ms  {100 * ms / total:5.1f}%  {kname[:90]}")
                rows.append(
                    {
                        "op": name,
                        "pass": pass_,
                        "B": args.B,
                        "T": args.T,
                        "H": args.H,
                        "kernel": kname,
                        "ms": round(ms, 4),
                    }
                )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["op", "pass", "B", "T", "H", "kernel", "ms"])
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
