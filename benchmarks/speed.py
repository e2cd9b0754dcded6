"""How fast are the ops: our kernels against FLA, the torch chunkwise op and SDPA, one command per view.

    python -m benchmarks.speed ops --out DIR                      # ours, FLA, torch, SDPA (~5 min, H200)
    python -m benchmarks.speed ops --out DIR --skip-sweep         # the two fixed shapes + decode
    python -m benchmarks.speed kernels --B 8 --T 8192 --H 16      # GPU time per kernel of our ops
    python -m benchmarks.speed loss --out DIR                     # the LM head + cross-entropy alone
    python -m benchmarks.speed cpu --lengths 256 --reps 1         # the torch chunkwise op on the CPU
    python -m benchmarks.speed compare OUT REV                    # `gpu.sh compare`'s two trees' timings

`ops`: forward and forward+backward (median of triton.testing.do_bench) of each op of docs/design.md §3,
plus KDA with K3's bounded gate (ours: lower_bound=-5; FLA: safe_gate=True, lower_bound=-5), at
(B=32, T=2048, H=2) and (B=8, T=8192, H=16), K = V = 128 (bf16), and a T = 1K..64K sweep at B=1, H=16
(KDA and SDPA; the torch reference only up to 4K). SDPA is causal softmax attention on the same q, k, v
(flash attention where PyTorch picks it). Decode: one KDA step at B=32, H=16 from an fp32 state. Also the
peak GPU memory of one forward+backward above the inputs (torch's allocator peak), and the CPU time to issue
one forward (host_ms_fwd: near the GPU time, the call is launch-bound). Writes h200_bench.csv,
h200_bench.md (ratios ours/FLA and ours/SDPA) and h200_sweep.png.

`kernels`: per kernel, the mean GPU time of a pass (torch.profiler; `--passes`: infer = the forward under
no_grad, train = forward+backward) and its share; kernels that torch launches (casts) appear under their
own names. The forward's kernels run as plain launches (fwd.pdl=0 unless --set says otherwise): as
programmatic dependent launches each is placed early and waits for the one before, and the profiler
would count that wait as its time. `--out FILE`: one CSV row per (op, pass, kernel).

`loss`: the LM head + cross-entropy of one training step at the tasks' shapes (the scored positions of a
[256, 1024] batch: MQAR 767 a sequence, vocabulary 8,192; Palindrome 511, vocabulary 64; d_model 256, bf16
autocast on CUDA), forward and backward of the summed loss: `full` F.cross_entropy on the [N, V] logits,
`torch` / `triton` mixers/loss.py's blocks with the torch softmax chain or the fused kernels as the default
picks them (`triton-passes`: every row read in two passes; `triton-whole`: every row held whole, read once,
up to the kernel's limit; `triton-whole-wN`: so, on N warps a row; `--block-rows R`: rows `triton@R`,
the default kernels over blocks of R rows, whose logits the GPU's L2 cache may hold), `fla` FLA's
fused linear cross-entropy. Error: relative RMS of loss, d(hidden) and d(weight) against the same
computation in fp32. Writes DIR/bench_loss.{csv,md}.

`cpu`: the torch chunkwise backend against the naive token loop, each op at B=8, H=2, K=V=128, fp32:
forward (no_grad) and forward+backward, the minimum wall-clock time over runs (the loop's backward once: at
T=2048 it takes a minute and several GB). Writes cpu_ops_<date>.{csv,md} into --out.

`compare OUT REV`: OUT/rev/bench_*/h200_bench.csv against OUT/tree/bench_*/h200_bench.csv, the median over
the rounds of each (shape, op, implementation, pass), and the working tree's over REV's, as markdown.
`--set KEY=VALUE` (ops, kernels) changes a launch setting (kernels.triton.plan.SETTINGS) for the run.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import (
    SHAPES,
    SWEEP_LENGTHS,
    add_shape_args,
    indexed_device,
    make_inputs,
    provenance,
    rel_rms,
    token_loop_inputs,
    write_csv,
)

FIELDS = ["shape", "op", "impl", "B", "T", "H", "D", "ms_fwd", "ms_fwdbwd", "mb_fwdbwd", "host_ms_fwd"]
COLORS = {"ours": "tab:red", "fla": "tab:blue", "torch": "tab:gray", "sdpa": "tab:green"}
NAMES = ("q", "k", "v", "g", "beta")


class Table(list):
    """Rows of timings, rewritten to CSV after every row: a run cut short by its time limit keeps them."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def append(self, row: dict) -> None:
        super().append(row)
        write_csv(self.path, self, FIELDS)


def gpu_inputs(decay, delta: bool, lower_bound, B: int, T: int, H: int, D: int = 128) -> dict:
    """bf16 inputs on the GPU as a gated layer emits them (g fp32), no initial state."""
    inputs = make_inputs(decay, delta, B, T, H, D, D, seed=0, lower_bound=lower_bound, with_state=False,
                         device="cuda", dtype=torch.bfloat16, layer_gates=True)
    del inputs["initial_state"]
    return inputs


def provider(who: str, name: str, lower_bound: float | None) -> Callable | None:
    """fn(q, k, v, g, beta) -> o for one implementation, or None where it is not installed."""
    if who == "ours":
        from kernels.triton import triton_chunk

        return lambda q, k, v, g, b: triton_chunk(q, k, v, g, b, lower_bound=lower_bound)[0]
    if who == "torch":
        from kernels.chunk_torch import chunk_torch

        return lambda q, k, v, g, b: chunk_torch(q, k, v, g, b, q.shape[-1] ** -0.5, None, False, 64)[0]
    if who == "sdpa":  # [B, T, H, D] -> [B, H, T, D]: causal softmax attention over the same q, k, v
        return lambda q, k, v, g, b: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    try:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.gla import chunk_gla
        from fla.ops.kda import chunk_kda
        from fla.ops.linear_attn import chunk_linear_attn
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError:
        return None
    return {
        "linear_attn": lambda q, k, v, g, b: chunk_linear_attn(q, k, v, normalize=False)[0],
        "simple_gla": lambda q, k, v, g, b: chunk_simple_gla(q, k, v, g)[0],
        "gla": lambda q, k, v, g, b: chunk_gla(q, k, v, g)[0],
        "delta_rule": lambda q, k, v, g, b: chunk_delta_rule(q, k, v, b)[0],
        "gated_delta_rule": lambda q, k, v, g, b: chunk_gated_delta_rule(q, k, v, g, b)[0],
        "kda": lambda q, k, v, g, b: chunk_kda(q, k, v, g, b)[0],
        "kda_bounded": lambda q, k, v, g, b: chunk_kda(q, k, v, g, b, safe_gate=True, lower_bound=-5.0)[0],
    }[name]


def _with_grad(inputs: dict, on: bool) -> list[torch.Tensor]:
    leaves = [t for t in inputs.values() if t is not None]
    for t in leaves:
        t.requires_grad_(on)
        t.grad = None
    return leaves


def time_fn(fn: Callable, inputs: dict, backward: bool) -> float:
    from triton.testing import do_bench

    args = [inputs[n] for n in NAMES]
    if not backward:
        with torch.no_grad():
            return do_bench(lambda: fn(*args), warmup=10, rep=50, return_mode="median")
    leaves, do = _with_grad(inputs, True), torch.randn_like(inputs["v"])
    ms = do_bench(lambda: fn(*args).backward(do), warmup=10, rep=50, grad_to_none=leaves,
                  return_mode="median")
    _with_grad(inputs, False)
    return ms


def host_ms(fn: Callable, inputs: dict, calls: int = 20) -> float:
    """CPU time to issue one forward (no grad), without waiting for the GPU: `calls` calls back to back,
    then one synchronize. Close to the GPU time (ms_fwd) means the call is bound by its launches and
    Python work, not by the GPU."""
    args = [inputs[n] for n in NAMES]
    with torch.no_grad():
        fn(*args)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        issued = time.perf_counter() - start
        torch.cuda.synchronize()
    return issued / calls * 1e3


def peak_mb(fn: Callable, inputs: dict) -> float:
    """Peak GPU memory of one forward+backward above what the inputs already hold (MiB): activations and
    saved intermediates, gradients, the kernels' workspace."""
    _with_grad(inputs, True)
    do = torch.randn_like(inputs["v"])
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(*[inputs[n] for n in NAMES]).backward(do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    _with_grad(inputs, False)
    return round(peak / 2**20, 1)


def measure(rows: list, shape: str, name: str, who: str, B: int, T: int, H: int, lower_bound, decay, delta,
            deadline: float) -> None:
    fn = provider(who, name, lower_bound)
    if fn is None:
        return
    row = {"shape": shape, "op": name, "impl": who, "B": B, "T": T, "H": H, "D": 128}
    for mode, backward in (("ms_fwd", False), ("ms_fwdbwd", True)):
        if time.time() > deadline:
            row[mode] = "SKIP(time)"
            continue
        try:
            row[mode] = round(time_fn(fn, gpu_inputs(decay, delta, lower_bound, B, T, H), backward), 4)
        except Exception as exc:  # FLA refuses gated backwards on Triton 3.6/Hopper (#640); OOM for torch
            row[mode] = f"ERR {type(exc).__name__}: {str(exc)[:80]}".replace(",", ";").replace("\n", " ")
        torch.cuda.empty_cache()
    # (the host time where the forward ran, the memory where the backward did)
    for key, mode, how in (("host_ms_fwd", "ms_fwd", host_ms), ("mb_fwdbwd", "ms_fwdbwd", peak_mb)):
        if isinstance(row.get(mode), float):
            try:
                row[key] = round(how(fn, gpu_inputs(decay, delta, lower_bound, B, T, H)), 4)
            except Exception as exc:
                row[key] = f"ERR {type(exc).__name__}"
            torch.cuda.empty_cache()
    rows.append(row)
    print(f"{shape:8s} {name:18s} {who:6s} B={B:<3d} T={T:<6d} H={H:<3d} fwd={row['ms_fwd']} "
          f"fwdbwd={row['ms_fwdbwd']} peak_MiB={row.get('mb_fwdbwd', '-')} "
          f"host_ms_fwd={row.get('host_ms_fwd', '-')}", flush=True)


def decode(rows: list) -> None:
    """One KDA decode step from an fp32 state, ours and FLA's fused recurrent KDA."""
    from triton.testing import do_bench

    from kernels.triton import triton_recurrent_step

    B, H, D = 32, 16, 128
    q, v = (torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k = F.normalize(torch.randn(B, H, D, device="cuda"), dim=-1).to(torch.bfloat16)
    g = (-5.0 * torch.sigmoid(torch.randn(B, H, D, device="cuda"))).to(torch.bfloat16)
    beta = torch.sigmoid(torch.randn(B, H, device="cuda")).to(torch.bfloat16)
    state = torch.randn(B, H, D, D, device="cuda")
    steps = {"ours": lambda: triton_recurrent_step(q, k, v, g, beta, state)}
    try:
        from fla.ops.kda import fused_recurrent_kda

        steps["fla"] = lambda: fused_recurrent_kda(*(x[:, None] for x in (q, k, v, g, beta)),
                                                   initial_state=state, output_final_state=True)
    except ImportError as exc:
        print(f"decode fla: {exc}"[:200], flush=True)
    for who, step in steps.items():
        try:
            with torch.no_grad():
                ms = do_bench(step, warmup=10, rep=50, return_mode="median")
        except Exception as exc:
            print(f"decode {who}: {type(exc).__name__}: {exc}"[:200], flush=True)
            continue
        rows.append({"shape": "decode", "op": "kda_step", "impl": who, "B": B, "T": 1, "H": H, "D": D,
                     "ms_fwd": round(ms, 4)})
        print(f"decode kda_step {who} {ms:.4f} ms", flush=True)


def _autotuner_benchmark(bench: Callable) -> None:
    """Make every Triton autotuner (FLA's kernels) time its configs with `bench(kernel_call, quantiles)`."""
    from triton.runtime import autotuner

    # a property whose setter ignores assignments: whether the Triton build sets do_bench in __init__ or not
    autotuner.Autotuner.do_bench = property(lambda self: bench, lambda self, value: None)


def autotune_rep(rep: float) -> None:
    """Triton's autotuner (FLA's kernels) times each config for `rep` ms after `rep / 4` of warm-up."""
    from triton.testing import do_bench

    _autotuner_benchmark(lambda call, quantiles: do_bench(call, warmup=rep / 4, rep=rep, quantiles=quantiles))


def compile_each_config() -> None:
    """Make every Triton autotuner (FLA's kernels) run each config once, untimed, and take the first: its
    compiles land in Triton's on-disk cache for a later process to time. With FLA_CACHE_RESULTS=0, so that
    the untimed choice is not kept as the result."""

    def run_once(kernel_call, quantiles):
        kernel_call()  # compiles this config (or raises OutOfResources: the autotuner then skips it)
        return [1.0, 1.0, 1.0]

    _autotuner_benchmark(run_once)


def compile_only(ops: list[str], shapes: list[str], impls: list[str]) -> None:
    """Compile every autotuning config of the given implementations' kernels without timing any of them.

    FLA autotunes each kernel on first use: one process compiles and times every config, about 200 s per
    op and shape on the H200. Run one process per op and shape with this flag (and FLA_CACHE_RESULTS=0, so
    the untimed choices are not kept) side by side: the compiles share the CPU cores and land in Triton's
    on-disk cache, and the timed run afterwards only benchmarks the configs it loads from there.
    """
    from kernels.triton import VARIANTS

    compile_each_config()
    for who in impls:
        for shape in shapes:
            for name, decay, delta, lb in VARIANTS:
                fn = provider(who, name, lb) if name in ops else None
                if fn is None:
                    continue
                t0 = time.time()
                for backward in (False, True):
                    inputs = gpu_inputs(decay, delta, lb, *SHAPES[shape])
                    args = [inputs[n] for n in NAMES]
                    try:
                        if backward:
                            _with_grad(inputs, True)
                            fn(*args).backward(torch.randn_like(inputs["v"]))
                        else:
                            with torch.no_grad():
                                fn(*args)
                        torch.cuda.synchronize()
                    except Exception as exc:  # e.g. FLA refusing a gated backward (#640)
                        print(f"compile {who} {name} {shape} backward={backward}: {type(exc).__name__}")
                print(f"compiled {who} {name} {shape} in {time.time() - t0:.0f} s", flush=True)


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else "-"


def _cell(value) -> str:
    text = "-" if value is None else str(value)
    if "3.7.1 on Hopper" in text or "Triton >= 3.4.0 and <" in text:
        return "refused (#640)"  # FLA's own guard against the Triton 3.6 gated-backward miscompile
    return text[:40]


def _line(*cells) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def write_markdown(rows: list, path: Path, header: str) -> None:
    from kernels.triton import VARIANTS

    ops = [v[0] for v in VARIANTS]
    by = {(r["shape"], r["op"], r["impl"]): r for r in rows}
    lines = [header]
    # the fixed shapes' tables only where the run timed them (a sweep-only run has the sweep alone)
    fixed = [s for s in SHAPES if any(r["shape"] == s and r["impl"] != "fla_anchor" for r in rows)]
    if fixed:
        lines += ["", "## Fixed shapes (bf16, K = V = 128, ms, median of do_bench)", "",
                  "| shape | op | ours fwd | FLA fwd | torch fwd | SDPA fwd | ours fwd+bwd | FLA fwd+bwd "
                  "| torch fwd+bwd | SDPA fwd+bwd | ours/FLA fwd | ours/FLA fwd+bwd | ours/SDPA fwd "
                  "| ours/SDPA fwd+bwd |", "|" + "---|" * 14]
    used_anchor = False
    for shape in fixed:
        sd = by.get((shape, "sdpa", "sdpa"), {})
        for name in ops:
            o, f, t = (by.get((shape, name, w), {}) for w in ("ours", "fla", "torch"))
            raw = f
            if not f and (shape, name, "fla_anchor") in by:
                # FLA's figure from the anchors file (same GPU and versions, another run), marked with a
                used_anchor, raw = True, by[(shape, name, "fla_anchor")]
                f = {m: (f"{v} (a)" if isinstance(v, float) else v) for m, v in raw.items()}
            modes = ("ms_fwd", "ms_fwdbwd")
            lines.append(_line(shape, name, *(x.get(m, "-") for m in modes for x in (o, f, t, sd)),
                               *(ratio(o.get(m), x.get(m)) for x in (raw, sd) for m in modes)))
    both = [(s, n) for s in fixed for n in ops if (s, n, "fla") in by and (s, n, "fla_anchor") in by]
    if both:
        lines += ["", "## FLA in this run against the anchor file (same GPU and versions, another run)", "",
                  "| shape | op | FLA fwd | anchor fwd | FLA fwd+bwd | anchor fwd+bwd |",
                  "|---|---|---|---|---|---|"]
        for shape, name in both:
            f, a = by[(shape, name, "fla")], by[(shape, name, "fla_anchor")]
            lines.append(_line(shape, name, *(x.get(m) for m in ("ms_fwd", "ms_fwdbwd") for x in (f, a))))
    if used_anchor:
        lines += ["", "(a): FLA 0.6.0 from benchmarks/anchors/fla-0.6.0_h200.csv (same H200, torch 2.11, "
                  "Triton 3.6; another run), where this run has no FLA timing of its own; ERR: FLA refuses "
                  "that backward on Triton 3.6 (its issue #640)."]
    if any(isinstance(r.get("mb_fwdbwd"), float) for r in rows if r["shape"] in fixed):
        lines += ["", "## Peak memory of one forward+backward above the inputs (MiB)", "",
                  "| shape | op | ours | FLA | torch | SDPA | ours/FLA | ours/SDPA |",
                  "|---|---|---|---|---|---|---|---|"]
        for shape in fixed:
            sd = by.get((shape, "sdpa", "sdpa"), {}).get("mb_fwdbwd", "-")
            for name in ops:
                o, f, t = (by.get((shape, name, w), {}).get("mb_fwdbwd", "-") for w in ("ours", "fla",
                                                                                         "torch"))
                lines.append(f"| {shape} | {name} | {o} | {f} | {t} | {sd} | {ratio(o, f)} "
                             f"| {ratio(o, sd)} |")
    host = [r for r in rows if r["shape"] in fixed and isinstance(r.get("host_ms_fwd"), float)]
    if host:
        lines += ["", "## Host time to issue one forward (ms, CPU, not waiting for the GPU) against its GPU "
                  "time", "", "Close to 1: the call is bound by its launches and Python work, not by the "
                  "GPU.", "", "| shape | op | impl | host ms | GPU ms (fwd) | host / GPU |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['op']} | {r['impl']} | {r['host_ms_fwd']} | {r.get('ms_fwd', '-')} "
                  f"| {ratio(r['host_ms_fwd'], r.get('ms_fwd'))} |" for r in host]
    sweep = {(r["T"], r["op"], r["impl"]): r for r in rows if r["shape"] == "sweep"}
    if sweep:
        lines += ["", "## Sweep B=1, H=16 (bf16, K = V = 128, ms)", "",
                  "| T | op | ours fwd | FLA fwd | SDPA fwd | ours fwd+bwd | FLA fwd+bwd | SDPA fwd+bwd "
                  "| ours/FLA fwd+bwd | ours/SDPA fwd+bwd |", "|" + "---|" * 10]
        for T in sorted({key[0] for key in sweep}):
            sd = sweep.get((T, "sdpa", "sdpa"), {})
            for name in sorted({key[1] for key in sweep if key[1] != "sdpa" and key[0] == T}):
                o, f = sweep.get((T, name, "ours"), {}), sweep.get((T, name, "fla"), {})
                lines.append(_line(T, name, *(x.get(m) for m in ("ms_fwd", "ms_fwdbwd") for x in (o, f, sd)),
                                   *(ratio(o.get("ms_fwdbwd"), x.get("ms_fwdbwd")) for x in (f, sd))))
    dec = [r for r in rows if r["shape"] == "decode"]
    if dec:
        lines += ["", "## Decode: one KDA step, B=32, H=16, K=V=128, fp32 state (ms)", ""]
        lines += [f"- {r['impl']}: {r['ms_fwd']}" for r in dec]
    path.write_text("\n".join(lines) + "\n")


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = [r for r in rows if r["shape"] == "sweep"]
    if not sweep:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    lines = {("kda", "ours"): "-", ("kda_bounded", "ours"): "--", ("kda_bounded", "fla"): "--",
             ("kda", "fla"): "-", ("kda", "torch"): "-", ("sdpa", "sdpa"): "-"}
    for ax, mode, title in zip(axes, ("ms_fwd", "ms_fwdbwd"), ("forward", "forward + backward"), strict=True):
        for (op, who), style in lines.items():
            pts = [(r["T"], r[mode]) for r in sweep
                   if r["op"] == op and r["impl"] == who and isinstance(r.get(mode), float)]
            if pts:
                xs, ys = zip(*sorted(pts), strict=True)
                ax.plot(xs, ys, style, marker="o", color=COLORS[who], label=f"{op} ({who})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_ylabel("time (ms)")
        ax.set_title(f"KDA vs SDPA, {title}, B=1 H=16 D=128 bf16")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


ANCHOR_OPS = {  # op names in benchmarks/anchors/fla-0.6.0_h200.csv -> ours
    "kda": "kda", "kda_safe_gate": "kda_bounded", "gla": "gla", "deltanet": "delta_rule",
    "linear_attn": "linear_attn", "mamba2(simple_gla)": "simple_gla", "gdn": "gated_delta_rule"}


def _number(x: str):
    try:
        return float(x)
    except (TypeError, ValueError):
        return x if x else "-"


def load_rows(csv_path: Path, anchors: Path | None) -> list[dict]:
    """Rows of a benchmark CSV; with `anchors`, FLA 0.6.0's figures from that file as impl 'fla_anchor'."""
    with open(csv_path) as f:
        rows = [{k: (_number(v) if k.startswith(("ms_", "mb_", "host_ms")) else v) for k, v in r.items()}
                for r in csv.DictReader(f)]
    for r in rows:
        r["T"] = int(r["T"])
    if anchors is None:
        return rows
    shapes = {shape: name for name, shape in SHAPES.items()}
    with open(anchors) as f:
        lines = [ln for ln in f if not ln.startswith("#")]
    seen = set()
    for r in csv.DictReader(lines):
        shape, op = shapes.get((int(r["B"]), int(r["T"]), int(r["H"]))), ANCHOR_OPS.get(r["op"])
        if shape is None or op is None or (shape, op) in seen:
            continue
        seen.add((shape, op))
        if r["ms_fwd"] == "ERR":  # FLA refuses the gated backward on Triton 3.6 / Hopper
            r["ms_fwd"] = r["ms_fwdbwd"] = "refused (#640)"
        rows.append({"shape": shape, "op": op, "impl": "fla_anchor", "B": r["B"], "T": int(r["T"]),
                     "H": r["H"], "D": r["D"], "ms_fwd": _number(r["ms_fwd"]),
                     "ms_fwdbwd": _number(r["ms_fwdbwd"])})
    return rows


def _parser(command: str, doc: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"python -m benchmarks.speed {command}", description=doc)


def _settings(parser: argparse.ArgumentParser) -> None:
    from kernels.triton import plan

    plan.add_override_argument(parser)


def ops(argv: list[str]) -> None:
    from kernels.triton import VARIANTS, plan

    names = [v[0] for v in VARIANTS]
    ap = _parser("ops", "ours, FLA, torch and SDPA per op at the fixed shapes, a length sweep and decode")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-fixed", action="store_true", help="only the length sweep (and decode)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new timings after this")
    ap.add_argument("--ops", nargs="+", default=names, help="subset of ops")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), help="fixed shapes")
    ap.add_argument("--impls", nargs="+", default=["ours", "sdpa", "fla", "torch"])
    ap.add_argument("--report", type=Path, default=None,
                    help="no timing: the markdown and plot into --out from this CSV of an earlier run")
    ap.add_argument("--anchors", type=Path, default=None,
                    help="with --report: FLA figures measured earlier on the same GPU "
                    "(benchmarks/anchors/fla-0.6.0_h200.csv) for the shapes where the run has no FLA row")
    ap.add_argument("--title", default=None, help="with --report: the markdown's first line")
    ap.add_argument("--autotune-rep", type=float, default=None,
                    help="ms for which Triton's autotuner times each config (its default: 100, after 25 of "
                    "warm-up); a quarter of it warms up")
    ap.add_argument("--compile-only", action="store_true",
                    help="no timing: compile every autotuning config of --impls for --ops at --shapes, then "
                    "exit (one process per op and shape side by side, FLA_CACHE_RESULTS=0; see compile_only)")
    _settings(ap)
    args = ap.parse_args(argv)
    if plan.overrides_from_args(args):
        print("settings", plan.current_overrides())
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report is not None:
        rows = load_rows(args.report, args.anchors)
        header = args.title or f"# GPU benchmark (from {args.report.name})"
    else:
        if args.autotune_rep is not None:
            autotune_rep(args.autotune_rep)
        if args.compile_only:
            compile_only(args.ops, args.shapes, args.impls)
            return
        rows = run_ops(args)
        header = f"# GPU benchmark: {provenance('cuda')}"
    write_markdown(rows, args.out / "h200_bench.md", header)
    plot(rows, args.out / "h200_sweep.png")
    print((args.out / "h200_bench.md").read_text())


def run_ops(args: argparse.Namespace) -> list[dict]:
    from kernels.triton import VARIANTS

    deadline = time.time() + args.budget_s
    rows = Table(args.out / "h200_bench.csv")
    if not args.skip_decode:
        decode(rows)
    impls = [w for w in ("ours", "sdpa", "fla", "torch") if w in args.impls]
    # the fixed shapes for every implementation first (FLA's autotuning compiles many configs, so it comes
    # after ours and SDPA), then the length sweep: a run cut short by the budget keeps the comparison
    for who in [] if args.skip_fixed else impls:
        for shape in args.shapes:
            if who == "sdpa":
                measure(rows, shape, "sdpa", "sdpa", *SHAPES[shape], None, "none", False, deadline)
                continue
            # KDA first for the baselines: if the time budget runs out, the headline comparison is in
            for name, decay, delta, lb in VARIANTS if who == "ours" else VARIANTS[::-1]:
                if name in args.ops:
                    measure(rows, shape, name, who, *SHAPES[shape], lb, decay, delta, deadline)
    for who in [] if args.skip_sweep else impls:
        for T in SWEEP_LENGTHS:
            if who == "sdpa":
                measure(rows, "sweep", "sdpa", "sdpa", 1, T, 16, None, "none", False, deadline)
                continue
            if who == "torch" and T > 4096:
                continue
            for name in [n for n in ("kda", "kda_bounded") if n in args.ops]:
                lb = -5.0 if name == "kda_bounded" else None
                measure(rows, "sweep", name, who, 1, T, 16, lb, "channel", True, deadline)
    return rows


def kernel_times(name: str, decay, delta: bool, lower_bound, B: int, T: int, H: int, iters: int,
                 train: bool = True) -> dict[str, float]:
    """Mean GPU time per pass of each kernel: one forward+backward (train) or one forward under
    torch.no_grad (infer: the same forward kernels, what `ops` times as "fwd"), largest first."""
    from torch.profiler import ProfilerActivity, profile

    from kernels.triton import triton_chunk

    inputs = gpu_inputs(decay, delta, lower_bound, B, T, H)
    grads = _with_grad(inputs, train)
    do = torch.randn_like(inputs["v"])

    def step() -> None:
        with torch.set_grad_enabled(train):
            o, _ = triton_chunk(**inputs, lower_bound=lower_bound)
        if train:
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


def kernels(argv: list[str]) -> None:
    from kernels.triton import VARIANTS, plan

    ap = _parser("kernels", "GPU time per kernel of our ops, forward and backward (torch.profiler)")
    add_shape_args(ap)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--ops", nargs="*", default=[v[0] for v in VARIANTS])
    ap.add_argument("--out", type=Path, default=None, help="CSV file")
    ap.add_argument("--passes", nargs="*", default=["infer", "train"], choices=["infer", "train"],
                    help="infer: the no-grad forward; train: forward+backward")
    _settings(ap)
    args = ap.parse_args(argv)
    plan.use_overrides(["fwd.pdl=0"])  # (the module's docstring says why; --set fwd.pdl=1 overrides it)
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
            print(f"\n== {name}  B{args.B} T{args.T} H{args.H}: {total:.3f} ms GPU time per {what}",
                  flush=True)
            for kname, ms in times.items():
                print(f"  {ms:8.3f} ms  {100 * ms / total:5.1f}%  {kname[:90]}")
                rows.append({"op": name, "pass": pass_, "B": args.B, "T": args.T, "H": args.H,
                             "kernel": kname, "ms": round(ms, 4)})
    if args.out:
        write_csv(args.out, rows, ["op", "pass", "B", "T", "H", "kernel", "ms"])


# task -> (scored positions per sequence at T=1024, vocabulary)
LOSS_SHAPES = {"mqar": (767, 8192), "palindrome": (511, 64)}
# triton: the default (rows up to WHOLE_ROW_LIMIT held whole); -passes, -whole force either softmax kernel
LOSS_IMPLS = ["full", "torch", "triton", "triton-passes", "triton-whole", "triton-whole-w4",
              "triton-whole-w8", "fla"]


def loss_fn(impl: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None:
    from mixers.loss import linear_cross_entropy

    if "@" in impl:
        # `triton@R`: the default kernels over blocks of R rows (--block-rows)
        rows = int(impl.split("@", 1)[1])
        return lambda h, w, t: linear_cross_entropy(h, w, t, block_rows=rows, impl="triton")[0]
    if impl == "full":
        return lambda h, w, t: F.cross_entropy((h @ w.T).float(), t, reduction="sum")
    if impl in ("torch", "triton"):
        return lambda h, w, t: linear_cross_entropy(h, w, t, impl=impl)[0]
    if impl.startswith("triton-"):
        from kernels.triton import cross_entropy

        limit = 0 if impl == "triton-passes" else cross_entropy.WHOLE_ROW_MAX
        warps = int(impl.removeprefix("triton-whole-w")) if impl.startswith("triton-whole-w") else None

        def forced(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            keep = cross_entropy.WHOLE_ROW_LIMIT, cross_entropy.WHOLE_ROW_WARPS
            cross_entropy.WHOLE_ROW_LIMIT, cross_entropy.WHOLE_ROW_WARPS = limit, warps
            try:
                return linear_cross_entropy(h, w, t, impl="triton")[0]
            finally:
                cross_entropy.WHOLE_ROW_LIMIT, cross_entropy.WHOLE_ROW_WARPS = keep

        return forced
    try:
        from fla.modules import FusedLinearCrossEntropyLoss
    except Exception:  # not installed, or an FLA that does not build here
        return None
    loss = FusedLinearCrossEntropyLoss(reduction="sum")
    return lambda h, w, t: loss(h, t, w)


def measure_loss(impl: str, task: str, rows: int, d_model: int, args: argparse.Namespace,
                 device: torch.device) -> dict:
    _, vocab = LOSS_SHAPES[task]
    fn = loss_fn(impl)
    row = {"task": task, "impl": impl, "N": rows, "V": vocab, "D": d_model}
    if fn is None:
        return row | {"error": "not available (flash-linear-attention not installed)"}
    generator = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(rows, d_model, generator=generator).to(device).requires_grad_()
    weight = (torch.randn(vocab, d_model, generator=generator) * d_model**-0.5).to(device).requires_grad_()
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
    t0 = time.perf_counter()
    for _ in range(args.steps):
        out = run(True)
    ms = (time.perf_counter() - t0) * 1e3 / args.steps
    peak = None
    if cuda:
        end.record()
        torch.cuda.synchronize(device)
        ms = start.elapsed_time(end) / args.steps
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30
    names = ("loss", "dhidden", "dweight")
    errors = {f"err_{name}": f"{rel_rms(a, b):.1e}" for name, a, b in zip(names, ref, out, strict=True)}
    return row | {"ms": round(ms, 3), "extra_peak_gib": None if peak is None else round(peak, 3), **errors}


def loss(argv: list[str]) -> None:
    ap = _parser("loss", "the LM head + cross-entropy at the tasks' shapes: time, peak memory, error")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tasks", nargs="+", default=list(LOSS_SHAPES), choices=list(LOSS_SHAPES))
    ap.add_argument("--impls", nargs="+", default=LOSS_IMPLS, choices=LOSS_IMPLS)
    ap.add_argument("--batch", type=int, default=256, help="sequences of 1,024 positions")
    ap.add_argument("--rows", type=int, default=None,
                    help="scored rows (default: batch x the task's count per sequence)")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--block-rows", type=int, nargs="+", default=[], metavar="R",
                    help="also time the default kernels over blocks of R rows each (rows triton@R; the "
                    "default block is mixers/loss.py's BLOCK_ELEMENTS over the vocabulary)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    if any(r < 1 for r in args.block_rows):
        ap.error(f"--block-rows {args.block_rows}: each must be >= 1")
    device = indexed_device(args.device)
    results = []
    for task in args.tasks:
        rows = args.rows or args.batch * LOSS_SHAPES[task][0]
        for impl in args.impls + [f"triton@{r}" for r in args.block_rows]:
            try:
                result = measure_loss(impl, task, rows, args.d_model, args, device)
            except Exception as error:  # an OOM, a kernel that will not build: recorded, the rest go on
                result = {"task": task, "impl": impl, "N": rows,
                          "error": f"{type(error).__name__}: {str(error).splitlines()[0][-160:]}"}
            print(result, flush=True)
            results.append(result)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    write_csv(args.out / "bench_loss.csv", results)
    lines = [f"# LM head + cross-entropy, forward and backward\n\n{provenance(device)}; "
             f"`python -m benchmarks.speed loss {' '.join(argv)}`\n",
             "| task | impl | N | ms | vs full | extra peak GiB | err loss / dh / dw |",
             "|---|---|---:|---:|---:|---:|---|"]
    full = {r["task"]: r.get("ms") for r in results if r["impl"] == "full"}
    for r in results:
        if "ms" not in r:
            lines.append(f"| {r['task']} | {r['impl']} | {r['N']} | – | – | – | {r['error']} |")
            continue
        vs = f"{full[r['task']] / r['ms']:.2f}x" if full.get(r["task"]) else ""
        lines.append(f"| {r['task']} | {r['impl']} | {r['N']} | {r['ms']:.2f} | {vs} | {r['extra_peak_gib']} "
                     f"| {r['err_loss']} / {r['err_dhidden']} / {r['err_dweight']} |")
    (args.out / "bench_loss.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _best_time(fn: Callable[[], None], reps: int, warmup: bool) -> float:
    if warmup:
        fn()  # allocator, first-call dispatch; skipped for the loop, whose seconds dwarf it
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cpu_times(op: str, backend: str, inputs: list[torch.Tensor], reps: int, reps_backward: int
              ) -> tuple[float, float]:
    """(forward seconds, forward+backward seconds) of one op and backend (kernels.ops)."""
    import kernels

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
    return _best_time(forward, reps, warmup), _best_time(forward_backward, reps_backward, warmup)


def cpu(argv: list[str]) -> None:
    from kernels.family import OPS as FAMILY

    # the family's named ops that the torch chunked form serves as they are
    names = [op.name for op in FAMILY if op.lower_bound is None]
    switches = {op.name: (op.decay, op.delta_rule) for op in FAMILY}
    ap = _parser("cpu", "the torch chunkwise backend against the naive token loop, per op, on the CPU")
    ap.add_argument("--ops", nargs="+", default=names, choices=names)
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 1024, 2048])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128, help="K = V")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per torch figure (after a warm-up)")
    ap.add_argument("--naive-reps", type=int, default=2,
                    help="timed forward runs of the loop (its backward: once)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    B, H, K = args.batch, args.heads, args.head_dim
    header = (f"{'op':<17} {'T':>5} | {'fwd naive':>9} {'fwd torch':>9} {'x':>6} | {'f+b naive':>9} "
              f"{'f+b torch':>9} {'x':>6}")
    print(header + "\n" + "-" * len(header))
    rows = []
    for op in args.ops:
        for T in args.lengths:
            decay, delta = switches[op]
            inputs = token_loop_inputs(decay, delta, B, T, H, K, K, torch.Generator().manual_seed(args.seed))
            naive_f, naive_fb = cpu_times(op, "naive", inputs, args.naive_reps, 1)
            torch_f, torch_fb = cpu_times(op, "torch", inputs, args.reps, args.reps)
            rows.append({"op": op, "T": T, "fwd_naive_s": naive_f, "fwd_torch_s": torch_f,
                         "fwd_speedup": naive_f / torch_f, "fwdbwd_naive_s": naive_fb,
                         "fwdbwd_torch_s": torch_fb, "fwdbwd_speedup": naive_fb / torch_fb})
            print(f"{op:<17} {T:>5} | {naive_f:>9.3f} {torch_f:>9.3f} {naive_f / torch_f:>5.1f}x"
                  f" | {naive_fb:>9.3f} {torch_fb:>9.3f} {naive_fb / torch_fb:>5.1f}x", flush=True)
    context = (f"{provenance('cpu')}; threads {torch.get_num_threads()}; load average at end "
               f"{os.getloadavg()[0]:.1f}; B={B}, H={H}, K=V={K}, fp32, chunk_size=64; min over runs: torch "
               f"{args.reps} after a warm-up, naive forward {args.naive_reps}, naive forward+backward 1")
    print(context)
    stem = args.out / f"cpu_ops_{datetime.datetime.now(datetime.timezone.utc):%Y%m%d_%H%M}"
    args.out.mkdir(parents=True, exist_ok=True)
    with open(f"{stem}.csv", "w", newline="") as f:
        f.write(f"# {context}\n")
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["# CPU ops benchmark: torch chunkwise vs naive token loop", "", context, "",
             "| op | T | fwd naive (s) | fwd torch (s) | speedup | fwd+bwd naive (s) | fwd+bwd torch (s) "
             "| speedup |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['op']} | {r['T']} | {r['fwd_naive_s']:.3f} | {r['fwd_torch_s']:.3f} "
              f"| {r['fwd_speedup']:.1f}x | {r['fwdbwd_naive_s']:.3f} | {r['fwdbwd_torch_s']:.3f} "
              f"| {r['fwdbwd_speedup']:.1f}x |" for r in rows]
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.csv and {stem}.md")


PASSES = ("ms_fwd", "ms_fwdbwd")


def medians(folder: Path) -> dict[tuple[str, str, str, str], float]:
    """(shape, op, impl, pass) -> the median ms over the bench_*/h200_bench.csv files under folder
    (entries that are not numbers, a skip or an error, left out)."""
    found: dict[tuple[str, str, str, str], list[float]] = {}
    for path in sorted(folder.glob("bench_*/h200_bench.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                for name in PASSES:
                    try:
                        ms = float(row.get(name) or "")
                    except ValueError:
                        continue
                    found.setdefault((row["shape"], row["op"], row["impl"], name), []).append(ms)
    return {key: statistics.median(values) for key, values in found.items()}


def compare_table(before: dict, after: dict, rev: str) -> list[str]:
    """Markdown lines: one row per key of either side, REV's ms, the working tree's and their ratio."""
    lines = [f"| shape | op | impl | pass | {rev} ms | working tree ms | tree / rev |",
             "|---|---|---|---|---|---|---|"]
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        cells = [*key, f"{a:.4f}" if a else "-", f"{b:.4f}" if b else "-", f"{b / a:.3f}" if a and b else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def compare(argv: list[str]) -> None:
    ap = _parser("compare", "the timings of two trees side by side (benchmarks/gpu.sh's compare step)")
    ap.add_argument("out", type=Path, help="the compare step's folder (rev/ and tree/ under it)")
    ap.add_argument("rev", help="the revision's name, for the header")
    args = ap.parse_args(argv)
    before, after = medians(args.out / "rev"), medians(args.out / "tree")
    if not before and not after:
        raise SystemExit(f"no bench_*/h200_bench.csv under {args.out}/rev or {args.out}/tree")
    ratios = [after[k] / before[k] for k in before.keys() & after.keys() if before[k] > 0]
    print(f"# GPU time, {args.rev} against the working tree (median of each side's rounds)\n")
    print("\n".join(compare_table(before, after, args.rev)))
    if ratios:
        print(f"\ntree / rev over {len(ratios)} timings: median {statistics.median(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f}")


COMMANDS = {"ops": ops, "kernels": kernels, "loss": loss, "cpu": cpu, "compare": compare}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"{__doc__.split(chr(10) * 2)[1]}\n\ncommands: {', '.join(COMMANDS)} (-h: flags)")
    COMMANDS[argv[0]](argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
