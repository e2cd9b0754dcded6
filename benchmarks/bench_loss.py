"""The LM head + cross-entropy of one training step at the tasks' shapes: time, peak memory, error.

    python benchmarks/bench_loss.py --out DIR                # MQAR and Palindrome at B=256, T=1024
    python benchmarks/bench_loss.py --out DIR --device cpu --rows 512 --impls torch full   # smoke test

Rows: the scored positions of a [256, 1024] batch (MQAR kimi: 767 of 1,024 per sequence, vocabulary 8,192;
Palindrome: 511, vocabulary 64), d_model 256, bf16 autocast on CUDA. Each implementation runs forward and
backward of the summed loss with respect to the hidden states and the head's weight:

    full    F.cross_entropy on the full [N, V] logits (the obvious form)
    torch   mixers/loss.py's blocks with the torch softmax chain
    triton  mixers/loss.py's blocks with the fused softmax kernel (kernels/triton/cross_entropy.py)
    fla     FLA's fused linear cross-entropy (fla.modules, when installed)

Error: relative RMS of loss, d(hidden) and d(weight) against the same computation in fp32 without autocast.
Writes DIR/bench_loss.csv and DIR/bench_loss.md (date, GPU, versions, commit on top).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_train import _commit, _versions, indexed_device  # noqa: E402
from mixers.loss import linear_cross_entropy  # noqa: E402
from tests.helpers import rel_rms  # noqa: E402

# task -> (scored positions per sequence at T=1024, vocabulary)
SHAPES = {"mqar": (767, 8192), "palindrome": (511, 64)}
IMPLS = ["full", "torch", "triton", "fla"]


def _fla_loss() -> Callable | None:
    try:
        from fla.modules import FusedLinearCrossEntropyLoss
    except Exception:  # not installed, or an FLA that does not build here
        return None
    loss = FusedLinearCrossEntropyLoss(reduction="sum")
    return lambda h, w, t: loss(h, t, w)


def loss_fn(impl: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None:
    if impl == "full":
        return lambda h, w, t: F.cross_entropy((h @ w.T).float(), t, reduction="sum")
    if impl in ("torch", "triton"):
        return lambda h, w, t: linear_cross_entropy(h, w, t, impl=impl)[0]
    return _fla_loss()


def measure(impl: str, task: str, rows: int, d_model: int, args: argparse.Namespace,
            device: torch.device) -> dict:
    per_seq, vocab = SHAPES[task]
    fn = loss_fn(impl)
    row = {"task": task, "impl": impl, "N": rows, "V": vocab, "D": d_model}
    if fn is None:
        return row | {"error": "not available (flash-linear-attention not installed)"}
    generator = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(rows, d_model, generator=generator).to(device).requires_grad_()
    weight = (torch.randn(vocab, d_model, generator=generator) * d_model ** -0.5).to(device).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=generator).to(device)

    def run(autocast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden.grad = weight.grad = None
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = fn(hidden, weight, targets)
        loss.backward()
        return loss.detach().float(), hidden.grad.float(), weight.grad.float()

    # fp32 reference of the same implementation: the error is the rounding that autocast adds
    ref = [t.clone() for t in run(False)]
    cuda = device.type == "cuda"
    for _ in range(args.warmup):
        out = run(True)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    else:
        t0 = time.perf_counter()
    for _ in range(args.steps):
        out = run(True)
    if cuda:
        end.record()
        torch.cuda.synchronize(device)
        ms = start.elapsed_time(end) / args.steps
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30
    else:
        ms = (time.perf_counter() - t0) * 1e3 / args.steps
        peak = None
    return row | {"ms": round(ms, 3), "extra_peak_gib": None if peak is None else round(peak, 3),
                  "err_loss": f"{rel_rms(ref[0], out[0]):.1e}",
                  "err_dhidden": f"{rel_rms(ref[1], out[1]):.1e}",
                  "err_dweight": f"{rel_rms(ref[2], out[2]):.1e}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS)
    parser.add_argument("--batch", type=int, default=256, help="sequences of 1,024 positions")
    parser.add_argument("--rows", type=int, default=None,
                        help="scored rows (default: batch x the task's count per sequence)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = indexed_device(args.device)
    results = []
    for task in args.tasks:
        rows = args.rows or args.batch * SHAPES[task][0]
        for impl in args.impls:
            try:
                result = measure(impl, task, rows, args.d_model, args, device)
            except Exception as error:  # an OOM, a kernel that will not build: recorded, the rest go on
                result = {"task": task, "impl": impl, "N": rows,
                          "error": f"{type(error).__name__}: {str(error).splitlines()[0][-160:]}"}
            print(result, flush=True)
            results.append(result)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in results for k in r))
    with open(args.out / "bench_loss.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(results)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = [f"# LM head + cross-entropy, forward and backward\n\n{datetime.date.today()}, {gpu}, "
             f"{_versions()}, commit {_commit()}; `python benchmarks/bench_loss.py "
             f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n",
             "| task | impl | N | ms | vs full | extra peak GiB | err loss / dh / dw |",
             "|---|---|---:|---:|---:|---:|---|"]
    full = {r["task"]: r.get("ms") for r in results if r["impl"] == "full"}
    for r in results:
        if "ms" not in r:
            lines.append(f"| {r['task']} | {r['impl']} | {r['N']} | – | – | – | {r['error']} |")
            continue
        ratio = f"{full[r['task']] / r['ms']:.2f}x" if full.get(r["task"]) else ""
        lines.append(f"| {r['task']} | {r['impl']} | {r['N']} | {r['ms']:.2f} | {ratio} | "
                     f"{r['extra_peak_gib']} | {r['err_loss']} / {r['err_dhidden']} / {r['err_dweight']} |")
    (args.out / "bench_loss.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
