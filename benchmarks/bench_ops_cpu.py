"""CPU benchmark: the torch chunkwise backend against the naive token loop, for each op of the family.

    python benchmarks/bench_ops_cpu.py                  # the full table (minutes: the loop is slow)
    python benchmarks/bench_ops_cpu.py --lengths 256 --reps 1 --ops kda

Times forward (under no_grad) and forward+backward (loss = sum of o * a fixed random cotangent) for each op
at B=8, H=2, K=V=128, fp32, and prints one table with both backends side by side and the speedup. Each
figure is the minimum wall-clock time over a few runs (--reps for the torch backend, after a warm-up;
--naive-reps for the loop's forward; its backward once: at T=2048 it takes a minute and holds every step's
state for autograd, several GB of memory). Writes
cpu_ops_<date>.csv and .md to --out with the date, CPU, torch version, thread count and load average, so the
figures can be read in context.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402
from kernels.family import OPS as FAMILY  # noqa: E402
from tests.helpers import token_loop_inputs  # noqa: E402

# the family's named ops (kernels/family.py) that the torch chunked form serves as they are
OPS = tuple(op.name for op in FAMILY if op.lower_bound is None)
SWITCHES = {op.name: (op.decay, op.delta_rule) for op in FAMILY}


def make_inputs(op: str, B: int, T: int, H: int, K: int, V: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Realistic inputs (tests/helpers.token_loop_inputs): L2-normalised keys, log-decays, beta in (0, 1)."""
    decay, delta = SWITCHES[op]
    return token_loop_inputs(decay, delta, B, T, H, K, V, gen)


def time_call(fn: Callable[[], None], reps: int, warmup: bool) -> float:
    if warmup:
        fn()  # allocator, first-call dispatch; skipped for the loop, whose seconds dwarf it
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_one(
    op: str, backend: str, inputs: list[torch.Tensor], reps: int, reps_backward: int
) -> tuple[float, float]:
    """(forward seconds, forward+backward seconds) for one op and backend."""
    chunk_op = getattr(kernels, f"chunk_{op}")
    do = torch.randn(*inputs[2].shape, generator=torch.Generator().manual_seed(1))

    def forward() -> None:
        with torch.no_grad():
            chunk_op(*inputs, backend=backend)

    def forward_backward() -> None:
        leaves = [x.detach().requires_grad_() for x in inputs]
        o, _ = chunk_op(*leaves, backend=backend)
        (o * do).sum().backward()

    warmup = backend != "naive"
    return time_call(forward, reps, warmup), time_call(forward_backward, reps_backward, warmup)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--lengths", nargs="+", type=int, default=[256, 1024, 2048])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128, help="K = V")
    parser.add_argument("--reps", type=int, default=3, help="timed runs per torch figure (after a warm-up)")
    parser.add_argument(
        "--naive-reps", type=int, default=2, help="timed forward runs of the loop (its backward: once)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    B, H, K = args.batch, args.heads, args.head_dim
    rows = []
    header = (
        f"{'op':<17} {'T':>5} | {'fwd naive':>9} {'fwd torch':>9} {'x':>6}"
        f" | {'f+b naive':>9} {'f+b torch':>9} {'x':>6}"
    )
    print(header)
    print("-" * len(header))
    for op in args.ops:
        for T in args.lengths:
            inputs = make_inputs(op, B, T, H, K, K, torch.Generator().manual_seed(args.seed))
            naive_f, naive_fb = bench_one(op, "naive", inputs, args.naive_reps, 1)
            torch_f, torch_fb = bench_one(op, "torch", inputs, args.reps, args.reps)
            row = {
                "op": op,
                "T": T,
                "fwd_naive_s": naive_f,
                "fwd_torch_s": torch_f,
                "fwd_speedup": naive_f / torch_f,
                "fwdbwd_naive_s": naive_fb,
                "fwdbwd_torch_s": torch_fb,
                "fwdbwd_speedup": naive_fb / torch_fb,
            }
            rows.append(row)
            print(
                f"{op:<17} {T:>5} | {naive_f:>9.3f} {torch_f:>9.3f} {row['fwd_speedup']:>5.1f}x"
                f" | {naive_fb:>9.3f} {torch_fb:>9.3f} {row['fwdbwd_speedup']:>5.1f}x",
                flush=True,
            )

    now = datetime.datetime.now(datetime.timezone.utc)
    context = (
        f"date {now:%Y-%m-%d %H:%M} UTC; CPU {cpu_name()} ({os.cpu_count()} cores); "
        f"torch {torch.__version__}; "
        f"threads {torch.get_num_threads()}; load average at end {os.getloadavg()[0]:.1f}; "
        f"B={B}, H={H}, K=V={K}, fp32, chunk_size=64; min over runs: torch {args.reps} after a warm-up, "
        f"naive forward {args.naive_reps}, naive forward+backward 1"
    )
    print(context)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"cpu_ops_{now:%Y%m%d_%H%M}"
    with open(f"{stem}.csv", "w", newline="") as f:
        f.write(f"# {context}\n")
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        "# CPU ops benchmark: torch chunkwise vs naive token loop",
        "",
        context,
        "",
        "| op | T | fwd naive (s) | fwd torch (s) | speedup "
        "| fwd+bwd naive (s) | fwd+bwd torch (s) | speedup |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['T']} | {r['fwd_naive_s']:.3f} | {r['fwd_torch_s']:.3f}"
            f" | {r['fwd_speedup']:.1f}x"
            f" | {r['fwdbwd_naive_s']:.3f} | {r['fwdbwd_torch_s']:.3f} | {r['fwdbwd_speedup']:.1f}x |"
        )
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.csv and {stem}.md")


if __name__ == "__main__":
    main()
