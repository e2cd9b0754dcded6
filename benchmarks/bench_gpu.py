"""Time our Triton kernels against FLA 0.6.0, our torch chunkwise op and SDPA on one GPU (bf16).

    python benchmarks/bench_gpu.py --out benchmarks/results            # everything (~5 min on an H200)
    python benchmarks/bench_gpu.py --out /tmp/b --skip-sweep           # the two fixed shapes + decode

Forward and forward+backward (median of triton.testing.do_bench) for each op of docs/design.md §3, plus
KDA with K3's bounded gate (ours: lower_bound=-5; FLA: safe_gate=True, lower_bound=-5), at
(B=32, T=2048, H=2) and (B=8, T=8192, H=16), K = V = 128, and a T = 1K..64K sweep at B=1, H=16
(KDA and SDPA; the torch reference only up to 8K). SDPA is causal softmax attention on the same
q, k, v (flash attention where PyTorch picks it). Decode: one KDA step at B=32, H=16 from an fp32
state. Also the peak GPU memory of one forward+backward above the inputs (torch's allocator peak), and
the CPU time to issue one forward (host_ms_fwd: near the GPU time, the call is launch-bound).
Writes h200_bench.csv, h200_bench.md (ratios ours/FLA and ours/SDPA) and h200_sweep.png.
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
import triton
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.triton import VARIANTS as OPS  # noqa: E402
from kernels.triton import (  # noqa: E402
    plan,
    triton_chunk,
    triton_recurrent_step,
)
from tests import helpers  # noqa: E402

FIELDS = ["shape", "op", "impl", "B", "T", "H", "D", "ms_fwd", "ms_fwdbwd", "mb_fwdbwd", "host_ms_fwd"]


class Table(list):
    """Rows of timings, rewritten to CSV after every row: a run cut short by its time limit keeps them."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def append(self, row: dict) -> None:
        super().append(row)
        with open(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(self)


COLORS = {"ours": "tab:red", "fla": "tab:blue", "torch": "tab:gray", "sdpa": "tab:green"}


def make_inputs(
    decay: str, delta: bool, lower_bound: float | None, B: int, T: int, H: int, D: int = 128
) -> dict[str, torch.Tensor | None]:
    """bf16 inputs on the GPU as a gated layer emits them (g fp32), no initial state (tests/helpers.py)."""
    inputs = helpers.make_inputs(
        decay, delta, B, T, H, D, D, seed=0, lower_bound=lower_bound, with_state=False, device="cuda",
        dtype=torch.bfloat16, layer_gates=True,
    )  # fmt: skip
    del inputs["initial_state"]
    return inputs


def provider(who: str, name: str, lower_bound: float | None) -> Callable | None:
    """fn(q, k, v, g, beta) -> o for one implementation, or None where it is not installed."""
    if who == "ours":
        return lambda q, k, v, g, b: triton_chunk(q, k, v, g, b, lower_bound=lower_bound)[0]
    if who == "torch":
        try:
            from kernels.chunk_torch import chunk_torch
        except ImportError:
            return None
        return lambda q, k, v, g, b: chunk_torch(q, k, v, g, b, q.shape[-1] ** -0.5, None, False, 64)[0]
    if who == "fla":
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
            "kda_bounded": lambda q, k, v, g, b: chunk_kda(q, k, v, g, b, safe_gate=True, lower_bound=-5.0)[
                0
            ],
        }[name]
    if who == "sdpa":
        # [B, T, H, D] -> [B, H, T, D]; causal softmax attention over the same q, k, v
        return lambda q, k, v, g, b: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2)
    raise ValueError(who)


def time_fn(fn: Callable, inputs: dict, backward: bool) -> float:
    leaves = [t for t in inputs.values() if t is not None]
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    if not backward:
        with torch.no_grad():
            return do_bench(lambda: fn(*args), warmup=10, rep=50, return_mode="median")
    for t in leaves:
        t.requires_grad_(True)
    do = torch.randn_like(inputs["v"])

    def step() -> None:
        fn(*args).backward(do)

    ms = do_bench(step, warmup=10, rep=50, grad_to_none=leaves, return_mode="median")
    for t in leaves:
        t.requires_grad_(False)
        t.grad = None
    return ms


def host_ms(fn: Callable, inputs: dict, calls: int = 20) -> float:
    """CPU time to issue one forward (no grad), without waiting for the GPU: `calls` calls back to back,
    then one synchronize. Close to the GPU time (ms_fwd) means the call is bound by its launches and
    Python work, not by the GPU."""
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
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
    leaves = [t for t in inputs.values() if t is not None]
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    for t in leaves:
        t.requires_grad_(True)
    do = torch.randn_like(inputs["v"])
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(*args).backward(do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for t in leaves:
        t.requires_grad_(False)
        t.grad = None
    return round(peak / 2**20, 1)


def measure(
    rows: list,
    shape: str,
    name: str,
    who: str,
    B: int,
    T: int,
    H: int,
    lower_bound,
    decay,
    delta,
    deadline: float,
) -> None:
    fn = provider(who, name, lower_bound)
    if fn is None:
        return
    row = {"shape": shape, "op": name, "impl": who, "B": B, "T": T, "H": H, "D": 128}
    for mode, backward in (("ms_fwd", False), ("ms_fwdbwd", True)):
        if time.time() > deadline:
            row[mode] = "SKIP(time)"
            continue
        try:
            inputs = make_inputs(decay, delta, lower_bound, B, T, H)
            row[mode] = round(time_fn(fn, inputs, backward), 4)
        except Exception as exc:  # FLA refuses gated backwards on Triton 3.6/Hopper (#640); OOM for torch
            row[mode] = f"ERR {type(exc).__name__}: {str(exc)[:80]}".replace(",", ";").replace("\n", " ")
        torch.cuda.empty_cache()
    if isinstance(row.get("ms_fwd"), float):
        try:
            row["host_ms_fwd"] = round(host_ms(fn, make_inputs(decay, delta, lower_bound, B, T, H)), 4)
        except Exception as exc:
            row["host_ms_fwd"] = f"ERR {type(exc).__name__}"
        torch.cuda.empty_cache()
    if isinstance(row.get("ms_fwdbwd"), float):
        try:
            row["mb_fwdbwd"] = peak_mb(fn, make_inputs(decay, delta, lower_bound, B, T, H))
        except Exception as exc:
            row["mb_fwdbwd"] = f"ERR {type(exc).__name__}"
        torch.cuda.empty_cache()
    rows.append(row)
    print(
        f"{shape:8s} {name:18s} {who:6s} B={B:<3d} T={T:<6d} H={H:<3d} "
        f"fwd={row['ms_fwd']} fwdbwd={row['ms_fwdbwd']} peak_MiB={row.get('mb_fwdbwd', '-')} "
        f"host_ms_fwd={row.get('host_ms_fwd', '-')}",
        flush=True,
    )


def decode(rows: list) -> None:
    B, H, D = 32, 16, 128
    q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
    k = F.normalize(torch.randn(B, H, D, device="cuda"), dim=-1).to(torch.bfloat16)
    v = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
    g = (-5.0 * torch.sigmoid(torch.randn(B, H, D, device="cuda"))).to(torch.bfloat16)
    beta = torch.sigmoid(torch.randn(B, H, device="cuda")).to(torch.bfloat16)
    state = torch.randn(B, H, D, D, device="cuda")
    with torch.no_grad():
        ms = do_bench(
            lambda: triton_recurrent_step(q, k, v, g, beta, state), warmup=10, rep=50, return_mode="median"
        )
    rows.append(
        {
            "shape": "decode",
            "op": "kda_step",
            "impl": "ours",
            "B": B,
            "T": 1,
            "H": H,
            "D": D,
            "ms_fwd": round(ms, 4),
        }
    )
    print(f"decode kda_step ours {ms:.4f} ms", flush=True)
    try:
        from fla.ops.kda import fused_recurrent_kda

        def fla_step() -> None:
            fused_recurrent_kda(
                q[:, None],
                k[:, None],
                v[:, None],
                g[:, None],
                beta[:, None],
                initial_state=state,
                output_final_state=True,
            )

        with torch.no_grad():
            ms = do_bench(fla_step, warmup=10, rep=50, return_mode="median")
        rows.append(
            {
                "shape": "decode",
                "op": "kda_step",
                "impl": "fla",
                "B": B,
                "T": 1,
                "H": H,
                "D": D,
                "ms_fwd": round(ms, 4),
            }
        )
        print(f"decode kda_step fla {ms:.4f} ms", flush=True)
    except Exception as exc:
        print(f"decode fla: {type(exc).__name__}: {exc}"[:200], flush=True)


def _autotuner_benchmark(bench: Callable) -> None:
    """Make every Triton autotuner (FLA's kernels) time its configs with `bench(kernel_call, quantiles)`."""
    from triton.runtime import autotuner

    # a property whose setter ignores assignments: whether the Triton build sets do_bench in __init__ or not
    autotuner.Autotuner.do_bench = property(lambda self: bench, lambda self, value: None)


def autotune_rep(rep: float) -> None:
    """Triton's autotuner (FLA's kernels) times each config for `rep` ms after `rep / 4` of warm-up."""

    def bench(kernel_call, quantiles):
        return do_bench(kernel_call, warmup=rep / 4, rep=rep, quantiles=quantiles)

    _autotuner_benchmark(bench)


def compile_only(ops: list[str], shapes: list[str], impls: list[str]) -> None:
    """Compile every autotuning config of the given implementations' kernels without timing any of them.

    FLA autotunes each kernel on first use: one process compiles and times every config, about 200 s per
    op and shape on the H200. Run one process per op and shape with this flag (and FLA_CACHE_RESULTS=0, so
    the untimed choices are not kept) side by side: the compiles share the CPU cores and land in Triton's
    on-disk cache, and the timed run afterwards only benchmarks the configs it loads from there.
    """

    def run_once(kernel_call, quantiles):
        kernel_call()  # compiles this config (or raises OutOfResources: the autotuner then skips it)
        return [1.0, 1.0, 1.0]

    _autotuner_benchmark(run_once)
    for who in impls:
        for shape, B, T, H in (("B32T2K", 32, 2048, 2), ("B8T8K", 8, 8192, 16)):
            if shape not in shapes:
                continue
            for name, decay, delta, lb in OPS:
                fn = provider(who, name, lb) if name in ops else None
                if fn is None:
                    continue
                t0 = time.time()
                for backward in (False, True):
                    inputs = make_inputs(decay, delta, lb, B, T, H)
                    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
                    try:
                        if backward:
                            for t in inputs.values():
                                if t is not None:
                                    t.requires_grad_(True)
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
    text = str(value)
    if "3.7.1 on Hopper" in text or "Triton >= 3.4.0 and <" in text:
        return "refused (#640)"  # FLA's own guard against the Triton 3.6 gated-backward miscompile
    return text[:40]


def write_markdown(rows: list, path: Path, header: str) -> None:
    lines = [header]
    # the two fixed shapes' tables only where the run timed them (a sweep-only run has the sweep alone)
    fixed = [
        s for s in ("B32T2K", "B8T8K") if any(r["shape"] == s and r["impl"] != "fla_anchor" for r in rows)
    ]
    if fixed:
        lines += [
            "",
            "## Fixed shapes (bf16, K = V = 128, ms, median of do_bench)",
            "",
            "| shape | op | ours fwd | FLA fwd | torch fwd | SDPA fwd | ours fwd+bwd | FLA fwd+bwd "
            "| torch fwd+bwd "
            "| SDPA fwd+bwd | ours/FLA fwd | ours/FLA fwd+bwd | ours/SDPA fwd | ours/SDPA fwd+bwd |",
            "|" + "---|" * 14,
        ]
    by = {(r["shape"], r["op"], r["impl"]): r for r in rows}
    used_anchor = False
    for shape in fixed:
        sd = by.get((shape, "sdpa", "sdpa"), {})
        for name, *_ in OPS:
            o, f, t = (by.get((shape, name, w), {}) for w in ("ours", "fla", "torch"))
            if not f and (shape, name, "fla_anchor") in by:
                used_anchor = True
                # FLA's figure from the anchors file (same GPU and versions, another run), marked with a
                f = {
                    m: (f"{v} (a)" if isinstance(v, float) else v)
                    for m, v in by[(shape, name, "fla_anchor")].items()
                }
                f["raw"] = by[(shape, name, "fla_anchor")]
            cells = [
                o.get("ms_fwd", "-"),
                f.get("ms_fwd", "-"),
                t.get("ms_fwd", "-"),
                sd.get("ms_fwd", "-"),
                o.get("ms_fwdbwd", "-"),
                f.get("ms_fwdbwd", "-"),
                t.get("ms_fwdbwd", "-"),
                sd.get("ms_fwdbwd", "-"),
                ratio(o.get("ms_fwd"), f.get("raw", f).get("ms_fwd")),
                ratio(o.get("ms_fwdbwd"), f.get("raw", f).get("ms_fwdbwd")),
                ratio(o.get("ms_fwd"), sd.get("ms_fwd")),
                ratio(o.get("ms_fwdbwd"), sd.get("ms_fwdbwd")),
            ]
            cells = [_cell(c) for c in cells]
            lines.append(f"| {shape} | {name} | " + " | ".join(cells) + " |")
    both = [
        (shape, name)
        for shape in fixed
        for name, *_ in OPS
        if (shape, name, "fla") in by and (shape, name, "fla_anchor") in by
    ]
    if both:
        lines += [
            "",
            "## FLA in this run against the anchor file (same GPU and versions, another run)",
            "",
            "| shape | op | FLA fwd | anchor fwd | FLA fwd+bwd | anchor fwd+bwd |",
            "|---|---|---|---|---|---|",
        ]
        for shape, name in both:
            f, a = by[(shape, name, "fla")], by[(shape, name, "fla_anchor")]
            cells = [f.get("ms_fwd"), a.get("ms_fwd"), f.get("ms_fwdbwd"), a.get("ms_fwdbwd")]
            lines.append(f"| {shape} | {name} | " + " | ".join(_cell(c) for c in cells) + " |")
    if used_anchor:
        lines += [
            "",
            "(a): FLA 0.6.0 from benchmarks/anchors/fla-0.6.0_h200.csv (same H200, torch 2.11, Triton 3.6; "
            "another run), where this run has no FLA timing of its own; ERR: FLA refuses that backward on "
            "Triton 3.6 (its issue #640).",
        ]
    if any(isinstance(r.get("mb_fwdbwd"), float) for r in rows if r["shape"] in fixed):
        lines += [
            "",
            "## Peak memory of one forward+backward above the inputs (MiB)",
            "",
            "| shape | op | ours | FLA | torch | SDPA | ours/FLA | ours/SDPA |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for shape in fixed:
            sd = by.get((shape, "sdpa", "sdpa"), {}).get("mb_fwdbwd", "-")
            for name, *_ in OPS:
                o, f, t = (
                    by.get((shape, name, w), {}).get("mb_fwdbwd", "-") for w in ("ours", "fla", "torch")
                )
                lines.append(
                    f"| {shape} | {name} | {o} | {f} | {t} | {sd} | {ratio(o, f)} | {ratio(o, sd)} |"
                )
    host = [r for r in rows if r["shape"] in fixed and isinstance(r.get("host_ms_fwd"), float)]
    if host:
        lines += [
            "",
            "## Host time to issue one forward (ms, CPU, not waiting for the GPU) against its GPU time",
            "",
            "Close to 1: the call is bound by its launches and Python work, not by the GPU.",
            "",
            "| shape | op | impl | host ms | GPU ms (fwd) | host / GPU |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['shape']} | {r['op']} | {r['impl']} | {r['host_ms_fwd']} | {r.get('ms_fwd', '-')} "
            f"| {ratio(r['host_ms_fwd'], r.get('ms_fwd'))} |"
            for r in host
        ]
    sweep = {(r["T"], r["op"], r["impl"]): r for r in rows if r["shape"] == "sweep"}
    if sweep:
        lines += [
            "",
            "## Sweep B=1, H=16 (bf16, K = V = 128, ms)",
            "",
            "| T | op | ours fwd | FLA fwd | SDPA fwd | ours fwd+bwd | FLA fwd+bwd | SDPA fwd+bwd "
            "| ours/FLA fwd+bwd | ours/SDPA fwd+bwd |",
            "|" + "---|" * 10,
        ]
        for T in sorted({key[0] for key in sweep}):
            sd = sweep.get((T, "sdpa", "sdpa"), {})
            for name in sorted({key[1] for key in sweep if key[1] != "sdpa" and key[0] == T}):
                o, f = sweep.get((T, name, "ours"), {}), sweep.get((T, name, "fla"), {})
                cells = [o.get("ms_fwd"), f.get("ms_fwd"), sd.get("ms_fwd")]
                cells += [o.get("ms_fwdbwd"), f.get("ms_fwdbwd"), sd.get("ms_fwdbwd")]
                cells += [
                    ratio(o.get("ms_fwdbwd"), f.get("ms_fwdbwd")),
                    ratio(o.get("ms_fwdbwd"), sd.get("ms_fwdbwd")),
                ]
                lines.append(
                    f"| {T} | {name} | " + " | ".join(_cell("-" if c is None else c) for c in cells) + " |"
                )
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
    for ax, mode, title in zip(axes, ("ms_fwd", "ms_fwdbwd"), ("forward", "forward + backward"), strict=True):
        for (op, who), style in {
            ("kda", "ours"): "-",
            ("kda_bounded", "ours"): "--",
            ("kda_bounded", "fla"): "--",
            ("kda", "fla"): "-",
            ("kda", "torch"): "-",
            ("sdpa", "sdpa"): "-",
        }.items():
            pts = [
                (r["T"], r[mode])
                for r in sweep
                if r["op"] == op and r["impl"] == who and isinstance(r.get(mode), float)
            ]
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
    "kda": "kda",
    "kda_safe_gate": "kda_bounded",
    "gla": "gla",
    "deltanet": "delta_rule",
    "linear_attn": "linear_attn",
    "mamba2(simple_gla)": "simple_gla",
    "gdn": "gated_delta_rule",
}


def _number(x: str):
    try:
        return float(x)
    except (TypeError, ValueError):
        return x if x else "-"


def load_rows(csv_path: Path, anchors: Path | None) -> list[dict]:
    """Rows of a benchmark CSV; with `anchors`, FLA 0.6.0's figures from that file as impl 'fla_anchor'."""
    with open(csv_path) as f:
        rows = [
            {k: (_number(v) if k.startswith(("ms_", "mb_", "host_ms")) else v) for k, v in r.items()}
            for r in csv.DictReader(f)
        ]
    for r in rows:
        r["T"] = int(r["T"])
    if anchors is not None:
        shapes = {(32, 2048, 2): "B32T2K", (8, 8192, 16): "B8T8K"}
        with open(anchors) as f:
            lines = [ln for ln in f if not ln.startswith("#")]
        seen = set()
        for r in csv.DictReader(lines):
            shape = shapes.get((int(r["B"]), int(r["T"]), int(r["H"])))
            op = ANCHOR_OPS.get(r["op"])
            if shape is None or op is None or (shape, op) in seen:
                continue
            seen.add((shape, op))
            if r["ms_fwd"] == "ERR":  # FLA refuses the gated backward on Triton 3.6 / Hopper
                r["ms_fwd"] = r["ms_fwdbwd"] = "refused (#640)"
            rows.append(
                {
                    "shape": shape,
                    "op": op,
                    "impl": "fla_anchor",
                    "B": r["B"],
                    "T": int(r["T"]),
                    "H": r["H"],
                    "D": r["D"],
                    "ms_fwd": _number(r["ms_fwd"]),
                    "ms_fwdbwd": _number(r["ms_fwdbwd"]),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-fixed", action="store_true", help="only the length sweep (and decode)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new timings after this")
    parser.add_argument("--ops", nargs="+", default=[op[0] for op in OPS], help="subset of ops")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=["B32T2K", "B8T8K"],
        choices=["B32T2K", "B8T8K"],
        help="fixed shapes to time",
    )
    parser.add_argument("--impls", nargs="+", default=["ours", "sdpa", "fla", "torch"])
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="no timing: rewrite the markdown and plot into --out from this CSV of an earlier run",
    )
    parser.add_argument(
        "--anchors",
        type=Path,
        default=None,
        help="with --report: FLA figures measured earlier on the same GPU "
        "(benchmarks/anchors/fla-0.6.0_h200.csv) for the shapes where the run has no FLA row of its own",
    )
    parser.add_argument("--title", default=None, help="with --report: the markdown's first line")
    parser.add_argument(
        "--autotune-rep",
        type=float,
        default=None,
        help="ms for which Triton's autotuner times each config (its default: 100, after 25 of warm-up); "
        "a quarter of it warms up",
    )
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="no timing: compile every autotuning config of --impls for --ops at --shapes, then exit "
        "(run one process per op and shape side by side, with FLA_CACHE_RESULTS=0; see compile_only)",
    )
    plan.add_override_argument(parser)
    args = parser.parse_args()
    overrides = plan.overrides_from_args(args)
    if overrides:
        print("settings", plan.current_overrides())
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report is not None:
        rows = load_rows(args.report, args.anchors)
        write_markdown(
            rows, args.out / "h200_bench.md", args.title or f"# GPU benchmark (from {args.report.name})"
        )
        plot(rows, args.out / "h200_sweep.png")
        print((args.out / "h200_bench.md").read_text())
        return
    if args.autotune_rep is not None:
        autotune_rep(args.autotune_rep)
    if args.compile_only:
        compile_only(args.ops, args.shapes, args.impls)
        return
    deadline = time.time() + args.budget_s
    rows = Table(args.out / "h200_bench.csv")
    if not args.skip_decode:
        decode(rows)
    impls = [w for w in ("ours", "sdpa", "fla", "torch") if w in args.impls]
    # the two fixed shapes for every implementation first (FLA's autotuning compiles many configs, so it
    # comes after ours and SDPA), then the length sweep: a run cut short by the budget keeps the comparison
    for who in [] if args.skip_fixed else impls:
        for shape, B, T, H in (("B32T2K", 32, 2048, 2), ("B8T8K", 8, 8192, 16)):
            if shape not in args.shapes:
                continue
            if who == "sdpa":
                measure(rows, shape, "sdpa", "sdpa", B, T, H, None, "none", False, deadline)
                continue
            # KDA first for the baselines: if the time budget runs out, the headline comparison is in
            for name, decay, delta, lb in OPS if who == "ours" else OPS[::-1]:
                if name in args.ops:
                    measure(rows, shape, name, who, B, T, H, lb, decay, delta, deadline)
    for who in [] if args.skip_sweep else impls:
        for T in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
            if who == "sdpa":
                measure(rows, "sweep", "sdpa", "sdpa", 1, T, 16, None, "none", False, deadline)
                continue
            if who == "torch" and T > 4096:
                continue
            for name in [n for n in ("kda", "kda_bounded") if n in args.ops]:
                lb = -5.0 if name == "kda_bounded" else None
                measure(rows, "sweep", name, who, 1, T, 16, lb, "channel", True, deadline)
    try:
        import fla

        fla_version = getattr(fla, "__version__", "?")
    except ImportError:
        fla_version = "not installed"
    header = (
        f"# GPU benchmark: {torch.cuda.get_device_name()}, {datetime.date.today()}, "
        f"torch {torch.__version__}, "
        f"triton {triton.__version__}, FLA {fla_version}"
        + (
            f"; launch settings changed: {' '.join(f'{k}={v}' for k, v in overrides.items())}"
            if overrides
            else ""
        )
    )
    write_markdown(rows, args.out / "h200_bench.md", header)
    plot(rows, args.out / "h200_sweep.png")
    print((args.out / "h200_bench.md").read_text())


if __name__ == "__main__":
    main()
