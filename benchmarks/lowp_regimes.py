"""The chunk op's 16-bit path beside its fp32 path in regimes a trained layer reaches: recurring, sharp keys.

    python -m benchmarks.lowp_regimes --out DIR                                  # on a GPU: compiled kernels
    TRITON_INTERPRET=1 python -m benchmarks.lowp_regimes --out DIR --device cpu --tf32 rne   # the interpreter

The GPU check (tests/gpu/check_kernels.py) draws random unit keys and a layer's gates, where the bf16 path
stays within FLA's bounds (o 5e-3, dq/dk/dv 8e-3, dg/dbeta 2e-2). A trained layer's keys are not random: a
token that recurs brings back its key (Palindrome's vocabulary at L = 2,048 repeats every token many times),
and a sharp key reads and writes a few channels whose decay it keeps near 1. Each regime below is one input
draw of that kind for KDA (K3's bounded gate) and Gated DeltaNet at B = 1, H = 1, K = V = 128, T = 192 (three
chunks) from an initial state, fed to the op in the launch forms of many programs (the training shapes') as
fp32; as bf16 (q, k, v, beta; g and the state fp32), which KDA's op widens to fp32 but for v; for KDA also
as bf16 through its 16-bit kernels (kernels.triton.WIDE_KDA_KEYS off); and in the layer's form (v bf16, the
rest fp32: on CUDA a layer's F.normalize returns fp32 q, k and its beta is fp32, where v leaves an autocast
projection in bf16). Each row: the relative RMS error of o, the final state and every gradient against the
float64 token loop on the same bf16-rounded inputs, and whether everything stayed finite.

    layer       the check's draw: g = lower_bound * sigmoid(z) (GDN: log-sigmoid), beta = sigmoid(z)
    max_decay   g at the bound everywhere
    no_decay    g = -1e-4 everywhere, beta = 0.99
    half_slow   every other channel (GDN: alternate positions) decaying slowly
    same_keys   one key (plus 5 % noise) at every position, slow decay, beta = 0.99: a recurring token
    sharp_keys  q and k on 4 channels that do not decay (-1e-3), the rest at the bound, beta = 0.99
    big_v       the layer's draw with v 100 times larger

With --saved, the layer's form again with some of the buffers the op keeps for its backward (chunk.Saved)
rounded to bf16 in between (benchmarks.lowp_buffers.saved_rounded): which of them the fp32 path could
store in 16 bits. The output is the forward's and unchanged; the gradients show it.

In the interpreter (--device cpu) bf16 is computed as on a GPU (kernels/triton/interpret.py) and fp32
exactly, unless --tf32 rounds the fp32 dots' operands as a GPU's tensor cores take them (the GPU's fp32 path
runs its dots in TF32). Writes DIR/lowp_regimes.csv and DIR/lowp_regimes.md (provenance first).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import CHECK_BOUNDS, errors_of, indexed_device, provenance, write_csv

OPS = {"kda_bounded": ("channel", -5.0), "gated_delta_rule": ("scalar", None)}
REGIMES = ("layer", "max_decay", "no_decay", "half_slow", "same_keys", "sharp_keys", "big_v")
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
# the GPU check's bounds but the no-grad forward's (not run here)
BOUNDS = {name: bound for name, bound in CHECK_BOUNDS.items() if name != "o_infer"}
ERRORS = list(BOUNDS)


def regime_inputs(regime: str, decay: str, lower_bound: float | None, T: int, K: int, device: torch.device,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """One draw of the regime's inputs, all fp32 ([B, T, H, D] with B = H = 1)."""
    if regime not in REGIMES:
        raise ValueError(f"regime {regime!r}; choose from {', '.join(REGIMES)}")
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=gen)

    B, H, V = 1, 1, K
    gshape = (B, T, H, K) if decay == "channel" else (B, T, H)
    q, k = F.normalize(randn(B, T, H, K), dim=-1), F.normalize(randn(B, T, H, K), dim=-1)
    v = randn(B, T, H, V)
    z, beta = randn(*gshape), torch.sigmoid(randn(B, T, H))
    bound = lower_bound if lower_bound is not None else -5.0

    def gate(z: torch.Tensor) -> torch.Tensor:
        return lower_bound * torch.sigmoid(z) if lower_bound is not None else F.logsigmoid(z)

    g = gate(z)
    if regime == "max_decay":
        g = torch.full(gshape, bound * 0.999, device=device)
    elif regime == "no_decay":
        g, beta = torch.full(gshape, -1e-4, device=device), torch.full_like(beta, 0.99)
    elif regime == "half_slow":
        g = gate(z - 8.0 * (torch.arange(gshape[-1], device=device) % 2 == 0))
    elif regime == "same_keys":
        g, beta = gate(z - 6.0), torch.full_like(beta, 0.99)
        k = F.normalize(randn(1, 1, 1, K) + 0.05 * randn(B, T, H, K), dim=-1)
    elif regime == "sharp_keys":
        few = torch.zeros(K, device=device)
        few[:4] = 1.0
        k = F.normalize(randn(B, T, H, K) * (0.05 + few), dim=-1)
        q = F.normalize(randn(B, T, H, K) * (0.05 + few), dim=-1)
        beta = torch.full_like(beta, 0.99)
        if decay == "channel":
            g = torch.where(few.bool(), -1e-3, bound * 0.99).expand(gshape).contiguous()
        else:
            g = torch.full(gshape, -1e-3, device=device)
    elif regime == "big_v":
        v = 100.0 * v
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": randn(B, H, K, V)}


# the input forms: which of q, k, v, beta go to the op in bf16 (the rest in fp32); "bf16 kernels" as bf16
# but through KDA's 16-bit kernels, which the op itself does not run (kernels.triton.WIDE_KDA_KEYS)
SIXTEEN = ("q", "k", "v", "beta")
FORMS = {"fp32": (), "bf16": SIXTEEN, "bf16 kernels": SIXTEEN, "layer": ("v",)}
LABELS = {"bf16": "bf16", "bf16 kernels": "bf16, 16-bit kernels", "layer": "layer (v bf16)"}


def errors(op: str, inputs: dict[str, torch.Tensor], form: str, seed: int = 1,
           saved: tuple[str, ...] = ()) -> dict[str, float]:
    """Relative RMS errors of the op (FORMS[form] in bf16) against the float64 token loop on the same
    bf16-rounded inputs, and `finite` (1.0 or 0.0). `saved`: buffers of chunk.Saved the forward keeps
    rounded to bf16 for the backward (benchmarks.lowp_buffers.saved_rounded)."""
    import kernels.triton
    from benchmarks.lowp_buffers import Counter, saved_rounded
    from kernels.naive import naive_recurrent
    from kernels.triton import triton_chunk

    lower_bound = OPS[op][1]
    rounded = {n: t.to(torch.bfloat16).float() if n in ("q", "k", "v", "beta") else t
               for n, t in inputs.items()}
    ref = {n: t.double().requires_grad_(True) for n, t in rounded.items()}
    o_ref, ht_ref = naive_recurrent(*(ref[n] for n in NAMES[:5]), None, ref["initial_state"], True)
    gen = torch.Generator(device=o_ref.device).manual_seed(seed)
    do = torch.randn(o_ref.shape, device=o_ref.device, generator=gen)
    dht = torch.randn(ht_ref.shape, device=o_ref.device, generator=gen)
    ((o_ref * do.double()).sum() + (ht_ref * dht.double()).sum()).backward()

    def ours(q, k, v, g, beta, initial_state, output_final_state):
        return triton_chunk(q, k, v, g, beta, None, initial_state, output_final_state, 64, lower_bound)

    cast = {n: t.to(torch.bfloat16) if n in FORMS[form] else t for n, t in rounded.items()}
    wide, kernels.triton.WIDE_KDA_KEYS = kernels.triton.WIDE_KDA_KEYS, form != "bf16 kernels"
    counter = Counter()
    try:
        with saved_rounded(saved, counter):
            out, note = errors_of(ours, cast, (o_ref.detach(), ht_ref.detach()),
                                  {n: t.grad for n, t in ref.items()}, do, dht)
    finally:
        kernels.triton.WIDE_KDA_KEYS = wide
    if note:
        raise RuntimeError(f"{op}: {note}")
    if saved and (counter.changed == 0 or counter.absent):
        # a buffer this plan does not keep, or fp32 values bf16 holds exactly: the row would say nothing
        raise RuntimeError(f"{op}: saved {'+'.join(saved)} in bf16 changed {counter.changed} values, "
                           f"absent {counter.absent} times; choose buffers this plan keeps in fp32")
    # a non-finite output or gradient has a non-finite error
    return {**out, "finite": float(all(math.isfinite(e) for e in out.values()))}


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "",
             "| op | regime | inputs | " + " | ".join(ERRORS) + " | / fp32 (worst) | finite |",
             "|---|---|---|" + "---:|" * len(ERRORS) + "---:|---|"]
    fp32 = {(r["op"], r["regime"]): r for r in rows if r["inputs"].startswith("fp32")}
    for r in rows:
        cells = [f"**{r[n]:.1e}**" if r[n] > BOUNDS[n] else f"{r[n]:.1e}" for n in ERRORS]
        base = fp32.get((r["op"], r["regime"]))
        ratio = ""
        if not r["inputs"].startswith("fp32") and base is not None:
            ratio = f"{max(r[n] / max(base[n], 1e-12) for n in ERRORS):.0f}x"
        lines.append(f"| {r['op']} | {r['regime']} | {r['inputs']} | " + " | ".join(cells)
                     + f" | {ratio} | {'yes' if r['finite'] else 'NO'} |")
    lines += ["", "Bold: over the GPU check's bound."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=REGIMES)
    parser.add_argument("--T", type=int, default=192)
    parser.add_argument("--K", type=int, default=128, help="K = V (the Triton kernels take 16-256)")
    parser.add_argument("--tf32", choices=["off", "rne", "trunc"], default="off",
                        help="interpreter only: round the fp32 dots' operands to TF32 as a GPU does")
    parser.add_argument("--saved", nargs="+", default=[], metavar="F[+F...]",
                        help="also the layer's form with these chunk.Saved buffers kept in bf16 for the "
                             "backward, a row each: e.g. h w+h (w and h at once)")
    args = parser.parse_args(argv)
    device = indexed_device(args.device)
    interpreting = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if device.type == "cpu" and not interpreting:
        parser.error("--device cpu runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    if args.tf32 != "off" and device.type != "cpu":
        parser.error(f"--tf32 {args.tf32} emulates a GPU's TF32 in the interpreter; on {device} the GPU "
                     "does it")
    from kernels.triton import interpret, plan

    # the launch forms of the training shapes (B = 256): the thresholds of many programs at 0; both
    # settings are undone on return (a caller in the same process, the tests, keeps its rules)
    thresholds = plan.FILL_PROGRAMS, plan.MANY_HEADS
    plan.FILL_PROGRAMS, plan.MANY_HEADS = 0, 0
    if args.tf32 != "off":
        interpret.emulate_tf32(args.tf32)
    try:
        return _measure(args, device, argv)
    finally:
        plan.FILL_PROGRAMS, plan.MANY_HEADS = thresholds
        if args.tf32 != "off":
            interpret.emulate_tf32(None)


def _measure(args: argparse.Namespace, device: torch.device, argv: list[str] | None) -> int:
    fp32_label = "fp32" + (f" (tf32 {args.tf32})" if args.tf32 != "off" else
                           " (exact)" if device.type == "cpu" else "")
    header = (f"# The chunk op's 16-bit path by input regime\n\n{provenance(device)}; "
              f"B=1 H=1 K=V={args.K} T={args.T}, chunk 64, forms of many programs; "
              f"`python -m benchmarks.lowp_regimes {' '.join(argv if argv is not None else sys.argv[1:])}`")
    rows: list[dict] = []
    for op in args.ops:
        decay, lower_bound = OPS[op]
        for regime in args.regimes:
            inputs = regime_inputs(regime, decay, lower_bound, args.T, args.K, device)
            forms = [(form, ()) for form in FORMS] + [("layer", tuple(f.split("+"))) for f in args.saved]
            for form, saved in forms:
                if form == "bf16 kernels" and decay != "channel":
                    continue  # the op runs its 16-bit kernels for bf16 already
                label = LABELS.get(form, fp32_label) + (f", saved {'+'.join(saved)} bf16" if saved else "")
                start = time.time()
                row = {"op": op, "regime": regime, "inputs": label, **errors(op, inputs, form, saved=saved)}
                rows.append(row)
                worst = max(ERRORS, key=lambda n: row[n] / BOUNDS[n])
                print(f"{op:16s} {regime:10s} {label:18s} worst {worst} {row[worst]:.1e} "
                      f"(bound {BOUNDS[worst]:.0e}){'' if row['finite'] else ' NON-FINITE'} "
                      f"{time.time() - start:.0f} s", flush=True)
                write_csv(args.out / "lowp_regimes.csv", rows)
    (args.out / "lowp_regimes.md").write_text(markdown(rows, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
