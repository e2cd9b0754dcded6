"""Which of the chunk op's 16-bit buffers makes bf16 training go non-finite: one rounded to bf16 at a time.

    python -m benchmarks.lowp_buffers --out DIR                              # the H200 run, every variant
    python -m benchmarks.lowp_buffers --out DIR --variants fp32 bf16_all m   # a subset (merged in DIR)
    python -m benchmarks.lowp_buffers --out DIR --device cpu --length 64 --batch 4 --steps 3 \\
        --set model.d_model=32 mixer.head_dim=16 mixer.chunk_size=16              # CPU check (interpreter)

The op (kernels/triton/chunk.py) takes its precision from q's dtype: with bf16 q, k, v it keeps M_qk, M_kk
and the partial dq, dk in bf16, saves its forward's buffers in bf16, and feeds tl.dot bf16 operands; KDA
trained that way goes non-finite (Palindrome L=2048, step ~146; results/fast_step_check/README.md), with
fp32 q, k it trains. Each variant trains the run train.py makes of

    experiment=kimi_fig4_h200 task=palindrome task.seq_len=L mixer=kda optim.lr=1e-3 seed=0
    trainer.max_steps=5000 trainer.compile=false model.lean_backward=false trainer.precision=bf16

(eager, plain backward, bf16 autocast, the 5,000-step schedule) for --steps steps from the same init and
batches, on the Triton op (mixer.backend=triton), and records every step's loss and the first non-finite
step (the run stops there). Variants, each a patch applied here around the op's functions (kernels/ is
not edited):

    fp32       the op as the model calls it: fp32 q, k (the L2 norm's output), bf16 v
    bf16_all   q, k, v cast to bf16 before the op: its whole 16-bit path (the one that diverged)
    inputs     fp32 path, q and k rounded to bf16 before the op (and so dq, dk through the casts), as
               bf16_all hands them, but still fp32
    output     fp32 path, the op's output o rounded to bf16 as the 16-bit path returns it (and so dO, its
               gradient, on the way back)
    m          fp32 path, M_qk and M_kk rounded to bf16 between dvt's backward (writes) and the intra
               backward (reads)
    partial    fp32 path, the partial dq, dk rounded to bf16 before the stage that finishes them
    saved_F    fp32 path, the forward's saved buffer F (Saved.F: w, vt, h by default; aqk, akk, linv, kg,
               x on request; the fp32 path keeps no decayed Q, K: its reverse state pass forms them) rounded
               to bf16 for the backward (the forward's own output unchanged: only what the backward reads)
    fwd_F      fp32 path, the forward's buffers F rounded to bf16 where its stage returns them, so the
               forward's later stages (its state recurrence and output) read them rounded, as the backward
               does: fwd_intra (A_qk and the decayed Q, K of the intra forward; A_kk stays fp32 in
               the 16-bit path too), fwd_linv (the solve's L), fwd_wu (W). The 16-bit path's dot
               operands and chunk states h are formed inside the kernels and rounded by none of these:
               bf16_all failing where every other variant trains points there.
    bwd_F      fp32 path, the reverse state pass's dVt (bwd_dvt) or dh (bwd_dh) rounded where it returns
               them, as the 16-bit path stores them, for the stages of the backward that read them

    rounded    every single variant above from inputs on, at once (VARIANT+VARIANT stacks any few): where
               each alone trains and this trains too, what breaks bf16_all is inside the kernels

Rounding is cast to bf16 and back, so a variant differs from fp32 in that buffer's precision only, not in
the kernels' dot operands. Each patch counts the values it changed: a variant whose patch never changed a
value fails (a patch that silently does nothing); one whose buffer the plan does not keep is `absent`,
one whose buffer is 16-bit in the fp32 path too (Vt follows v's dtype, bf16 under autocast) `already`.

The CPU check runs every patch through Triton's interpreter, bf16_all included (kernels/triton/interpret.py
gives it the GPU's bf16 dots and casts); its numbers say nothing about training at L=2048.

Writes DIR/lowp_buffers.csv (variant, step, loss, finite) and DIR/lowp_buffers.md (provenance, then a
row per variant: the first non-finite step, the loss at a few steps). Rows of variants not run this time
are kept from an earlier run into the same DIR.

On the H200 (each variant ~1 min at B=256; three commands under the 10-minute limit), after the three
that split the question in two (`--variants fp32 bf16_all rounded`):

    python -m benchmarks.lowp_buffers --out $OUT/lowp --variants fp32 bf16_all m partial
    python -m benchmarks.lowp_buffers --out $OUT/lowp --variants saved_w saved_h saved_aqk saved_akk \
        saved_linv
    python -m benchmarks.lowp_buffers --out $OUT/lowp --variants inputs fwd_intra fwd_linv fwd_wu

(`bash benchmarks/gpu.sh $OUT lowp lowp_saved lowp_fwd` runs the same three.)
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

DEFAULT_SAVED = ("w", "vt", "h")
OTHER_SAVED = ("aqk", "akk", "linv", "kg", "x")
# the stage (module of kernels.triton, function) and which of its returned buffers the 16-bit path keeps in
# bf16 (A_kk stays fp32 there when training; U follows v's dtype in both paths)
FORWARD = {"intra": ("intra_fwd", "intra_forward", (0, 2, 3, 4)), "linv": ("solve", "solve", (0,)),
           "wu": ("solve", "wu", (0,))}
# the same for the reverse state pass: dVt follows q's dtype and dh the saved h's, so both are bf16 there
BACKWARD = {"dvt": ("state_bwd", "state_backward", (0,)), "dh": ("state_bwd", "state_backward", (1,))}
STAGES = {**{f"fwd_{f}": stage for f, stage in FORWARD.items()},
          **{f"bwd_{f}": stage for f, stage in BACKWARD.items()}}
SINGLE = ("inputs", "output", "m", "partial", *(f"saved_{f}" for f in DEFAULT_SAVED), *STAGES)
# every buffer the 16-bit path keeps in bf16, rounded at once on the fp32 path: where each alone trains, this
# against bf16_all tells the stored buffers together from what only the kernels themselves do in 16 bits
# (their bf16 dot operands, the states h formed in them, the solve's single TF32 products)
ROUNDED = "rounded"
VARIANTS = ("fp32", "bf16_all", *SINGLE, ROUNDED)
ALL_VARIANTS = (*VARIANTS, *(f"saved_{f}" for f in OTHER_SAVED))


def parts(variant: str) -> list[str]:
    """The single patches a variant stacks: `rounded` all of SINGLE, `m+partial` those two, else itself.
    ValueError naming the choices for one that is not a variant."""
    names = list(SINGLE) if variant == ROUNDED else variant.split("+")
    single = ALL_VARIANTS if len(names) == 1 else tuple(v for v in ALL_VARIANTS if v not in (
        "fp32", "bf16_all", ROUNDED))
    for name in names:
        if name not in single:
            raise ValueError(f"variant {variant!r} is unknown; use one of {ALL_VARIANTS}, or several of "
                             f"{SINGLE} joined by '+'")
    return names
FIELDS = ["variant", "step", "loss", "finite"]
REPORT_STEPS = (1, 50, 100, 150, 200, 250)


class Counter:
    """What a variant's patch did: values changed, calls where its buffer was absent or already 16-bit."""

    def __init__(self) -> None:
        self.changed = 0
        self.absent = 0
        self.already: set[str] = set()

    def rounded(self, t: Any) -> Any:
        """t rounded to bf16 (in t's dtype), counted; t itself where it is 16-bit already."""
        import torch

        if t.dtype != torch.float32:
            self.already.add(str(t.dtype).removeprefix("torch."))
            return t
        r = t.to(torch.bfloat16).to(t.dtype)
        self.changed += int((r != t).sum().item())
        return r


def _round_in_place(t: Any, counter: Counter) -> None:
    r = counter.rounded(t)
    if r is not t:
        t.copy_(r)


@contextlib.contextmanager
def _patched(module: Any, name: str,
             make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, make(original))
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def saved_rounded(fields: Iterable[str], counter: Counter) -> Iterator[None]:
    """The chunk op's forward keeps the buffers `fields` (of chunk.Saved) rounded to bf16 for its backward,
    for the duration of the context; its own output is unchanged. `counter` counts the values changed and
    the calls where a buffer was absent."""
    from kernels.triton import chunk

    fields = list(fields)
    unknown = sorted(set(fields) - set(chunk.Saved._fields))
    if unknown:
        raise ValueError(f"saved buffers {unknown} unknown; choose from {chunk.Saved._fields}")

    def rounding_saved(original: Callable[..., Any]) -> Callable[..., Any]:
        def chunk_forward(*args: Any, **kwargs: Any) -> Any:
            o, ht, saved = original(*args, **kwargs)
            if saved is None:  # no gradient wanted: nothing kept
                return o, ht, saved
            replaced = {}
            for field in fields:
                t = getattr(saved, field)
                if t is None:
                    counter.absent += 1
                else:
                    # a new tensor, not t rounded in place: a saved buffer may share storage with another
                    replaced[field] = counter.rounded(t)
            return o, ht, saved._replace(**replaced)

        return chunk_forward

    with _patched(chunk, "chunk_forward", rounding_saved):
        yield


@contextlib.contextmanager
def variant_patch(variant: str, model: Any, counter: Counter) -> Iterator[None]:
    """The variant's patch around the op, for the duration of the context; `counter` counts its effect.
    A variant of several parts (`rounded`, `m+partial`) stacks theirs."""
    names = parts(variant)
    if len(names) > 1:
        with contextlib.ExitStack() as stack:
            for name in names:
                stack.enter_context(variant_patch(name, model, counter))
            yield
        return
    import torch

    from kernels.triton import dqk_bwd, intra_bwd

    mixers = [m for m in model.mixers if hasattr(m, "chunk_op")]
    ops = [m.chunk_op for m in mixers]

    def entry(op: Callable[..., Any]) -> Callable[..., Any]:
        def called(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
            if variant == "bf16_all":
                # the values the casts change (as `rounded` counts them)
                counter.changed += sum(int((t.bfloat16() != t).sum().item()) for t in (q, k, v))
                q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
            elif q.dtype != torch.float32 or k.dtype != torch.float32:
                # the other variants start from the fp32 path: bf16 q, k here would test the 16-bit one
                raise RuntimeError(f"{variant}: the op got q {q.dtype}, k {k.dtype}; want its fp32 path")
            elif variant == "inputs":
                q, k = counter.rounded(q), counter.rounded(k)
            out = op(q, k, v, *args, **kwargs)
            if variant == "output":  # o as the 16-bit path returns it; its gradient dO comes back rounded
                return (counter.rounded(out[0]), *out[1:])
            return out

        return called

    with contextlib.ExitStack() as stack:
        for mixer, op in zip(mixers, ops, strict=True):
            mixer.chunk_op = entry(op)
            stack.callback(setattr, mixer, "chunk_op", op)
        if variant == "fp32":
            counter.changed += 1  # nothing to patch: the reference
        elif variant == "bf16_all":
            # the op's entry casts (above); KDA's op would widen bf16 q, k again, so its 16-bit kernels are
            # asked for by name
            import kernels.triton

            stack.enter_context(_patched(kernels.triton, "WIDE_KDA_KEYS", lambda _: False))
        elif variant in ("inputs", "output"):
            pass  # the op's entry rounds (above)
        elif variant == "m":

            def intra_rounding_m(original: Callable[..., Any]) -> Callable[..., Any]:
                def intra_backward(q: Any, k: Any, saved: Any, grads: Any, bp: Any) -> None:
                    # dvt's backward has written M_qk, M_kk (it runs before this stage in every plan)
                    for t in {id(t): t for t in (grads.m_qk, grads.m_kk) if t is not None}.values():
                        _round_in_place(t, counter)
                    return original(q, k, saved, grads, bp)

                return intra_backward

            stack.enter_context(_patched(intra_bwd, "intra_backward", intra_rounding_m))
        elif variant == "partial":
            # dqk and the intra backward both write the partial dq, dk; the second of the two (the plan's
            # order) reads them and writes the finished dq_out, dk_out (over them where they share a buffer:
            # it holds the partial sums until then)
            calls: dict[int, int] = {}

            def second_rounds_partial(original: Callable[..., Any], at: int) -> Callable[..., Any]:
                def stage(*args: Any) -> None:
                    grads, bp = args[at], args[-1]
                    if not bp.fused:
                        calls[id(grads)] = calls.get(id(grads), 0) + 1
                        if calls[id(grads)] == 2:
                            del calls[id(grads)]
                            _round_in_place(grads.dq, counter)
                            _round_in_place(grads.dk, counter)
                    else:
                        counter.absent += 1
                    return original(*args)

                return stage

            # dqk_backward(q, k, v, beta, scale, do, saved, dh, dvt, grads, bp); intra_backward(q, k, saved,
            # grads, bp)
            stack.enter_context(_patched(dqk_bwd, "dqk_backward", lambda f: second_rounds_partial(f, 9)))
            stack.enter_context(_patched(intra_bwd, "intra_backward", lambda f: second_rounds_partial(f, 3)))
        elif variant.startswith("saved_"):
            stack.enter_context(saved_rounded([variant.removeprefix("saved_")], counter))
        elif variant in STAGES:
            module_name, function, positions = STAGES[variant]
            module = importlib.import_module(f"kernels.triton.{module_name}")

            def rounding_returned(original: Callable[..., Any]) -> Callable[..., Any]:
                def stage(*args: Any, **kwargs: Any) -> Any:
                    out = original(*args, **kwargs)
                    inputs = {t.untyped_storage().data_ptr() for t in args if isinstance(t, torch.Tensor)}
                    returned = out if isinstance(out, tuple) else (out,)
                    for t in (returned[i] for i in positions):
                        # in place: two returned buffers may share storage; never an input handed back
                        if t is not None and t.untyped_storage().data_ptr() not in inputs:
                            _round_in_place(t, counter)
                    return out

                return stage

            stack.enter_context(_patched(module, function, rounding_returned))
        yield


def compose_config(args: argparse.Namespace) -> Any:
    from hydra import compose, initialize_config_dir

    import harness.config  # noqa: F401  (registers the typed schema the config names)
    from benchmarks.common import ROOT

    overrides = [
        "experiment=kimi_fig4_h200", "task=palindrome", f"task.seq_len={args.length}", "mixer=kda",
        f"optim.lr={args.lr}", f"seed={args.seed}", "trainer.max_steps=5000",
        "trainer.early_stop.enabled=false", "trainer.compile=false", "model.lean_backward=false",
        "trainer.precision=bf16",
        f"trainer.batch_size={args.batch}", "mixer.backend=triton", f"trainer.device={args.device}",
        # (W&B stays off; its name and tags read Hydra's runtime, which a composed config has not)
        "logger.wandb.name=lowp_buffers", "logger.wandb.tags=[]", *args.set,
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


def train_variant(variant: str, run: Any, init: dict[str, Any],
                  steps: int) -> tuple[list[dict[str, Any]], str]:
    """Train `steps` steps from `init` under the variant's patch; (per-step rows, status)."""
    import dataclasses

    import torch

    from harness.step import lr_factor, make_optimizer
    from harness.trainer import train_step

    cfg = run.cfg
    run.model.load_state_dict(init)
    optimizer = make_optimizer(run.params, cfg.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(
        s, cfg.optim.warmup_steps, cfg.trainer.max_steps, cfg.optim.min_lr_ratio))
    run = dataclasses.replace(run, optimizer=optimizer, scheduler=scheduler)
    counter = Counter()
    rows: list[dict[str, Any]] = []
    status = "finite"
    bad_step = torch.zeros((), dtype=torch.long, device=run.device)
    with variant_patch(variant, run.model, counter):
        for step in range(1, steps + 1):
            result = train_step(run, step, True, bad_step)
            bad_step = result.bad_step
            loss = math.nan if result.loss is None else result.loss
            # (a non-finite gradient norm with a finite loss counts too)
            finite = math.isfinite(loss) and result.divergence is None
            rows.append({"variant": variant, "step": step, "loss": loss, "finite": finite})
            if result.divergence is not None:
                status = f"non-finite at step {step}: {result.divergence}"
                break
            optimizer.step()
            scheduler.step()
            if not counter.changed and counter.absent:
                return rows, "absent: the plan keeps no such buffer"
            if not counter.changed and counter.already:
                return rows, f"already {'/'.join(sorted(counter.already))} in the fp32 path: nothing to round"
    if not counter.changed:
        raise RuntimeError(f"variant {variant}: its patch never changed a value; it does not reach the op")
    return rows, status if variant == "fp32" else f"{status} ({counter.changed} values rounded)"


def _first_nonfinite(rows: list[dict[str, Any]]) -> int | None:
    return next((int(r["step"]) for r in rows if str(r["finite"]) not in ("True", "true", "1")), None)


def write(out: Path, rows: list[dict[str, Any]], statuses: dict[str, str], header: str) -> None:
    from benchmarks.common import write_csv

    path = out / "lowp_buffers.csv"
    ran = {r["variant"] for r in rows}
    kept = []
    if path.exists():
        with open(path) as f:
            kept = [r for r in csv.DictReader(f) if r["variant"] not in ran]
    table = kept + rows
    write_csv(path, table, FIELDS)
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for r in table:
        by_variant.setdefault(r["variant"], []).append(r)
    lines = [header, "", "| variant | first non-finite step | steps | " + " | ".join(
        f"loss @{s}" for s in REPORT_STEPS) + " | status |", "|---" * (len(REPORT_STEPS) + 4) + "|"]
    for variant, vrows in by_variant.items():
        losses = {int(r["step"]): float(r["loss"]) for r in vrows}
        cells = [f"{losses[s]:.4f}" if s in losses else "" for s in REPORT_STEPS]
        first = _first_nonfinite(vrows)
        status = statuses.get(variant, "(an earlier run)")
        lines.append(f"| {variant} | {first if first is not None else '-'} | {len(vrows)} | "
                     + " | ".join(cells) + f" | {status} |")
    (out / "lowp_buffers.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), metavar="VARIANT",
                        help=f"of {', '.join(ALL_VARIANTS)}, or single ones joined by '+' (e.g. m+partial)")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cuda or cpu (the CPU runs Triton's interpreter)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more train.py overrides (e.g. a smaller model for the CPU check)")
    args = parser.parse_args(argv)
    for variant in args.variants:
        try:
            parts(variant)
        except ValueError as error:
            parser.error(str(error))
    if args.device == "cpu":
        # before triton is imported
        os.environ["TRITON_INTERPRET"] = "1"

    from benchmarks.common import provenance
    from harness.check import Decision
    from harness.run import Progress, build_run, run_meta

    cfg = compose_config(args)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = run_meta(cfg, args.out / "run", "kda")
    run = build_run(cfg, args.out / "run", meta, Progress(), None, Decision("new"))
    init = {k: v.clone() for k, v in run.model.state_dict().items()}
    header = (f"# The op's 16-bit buffers one at a time: KDA, Palindrome L={args.length}, B={args.batch}, "
              f"lr {args.lr}, seed {args.seed}, eager, bf16 autocast\n\n{provenance(run.device)}")
    rows: list[dict[str, Any]] = []
    statuses: dict[str, str] = {}
    for variant in args.variants:
        start = time.perf_counter()
        vrows, statuses[variant] = train_variant(variant, run, init, args.steps)
        rows += vrows
        print(f"{variant}: {statuses[variant]} ({len(vrows)} steps, last loss {vrows[-1]['loss']:.4f}, "
              f"{time.perf_counter() - start:.0f} s)", flush=True)
        write(args.out, rows, statuses, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
