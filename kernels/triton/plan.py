"""The launch plan of the chunk kernels: from (op, shape, dtype, bounded gate, needs grad) every derived form,
block size, warp count, stage count and register cap that the forward and backward launch code uses, as one
frozen value computed before anything launches. The plan holds only what its rules choose: each form has
one rule, a function of the problem and the named thresholds below.

    python -m kernels.triton.plan kda --B 8 --T 8192 --H 16          # what launches, and with what
    python -m kernels.triton.plan kda_bounded --B 1 --T 65536 --H 16 --set state_fwd.warps=8

The rules were chosen from per-kernel profiles on an H200 (132 SMs, 227 KB of shared memory a block) at the
benchmark shapes; the figures behind them are in PERF.md beside this file. `overrides` changes a launch
setting for profiling (`--set KEY=VALUE` in the scripts): every key is in SETTINGS with what it selects.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kernels.family import Decay
from kernels.triton.common import INTERPRET

# The state passes run one program per (batch, head, block of V columns), sequentially over the chunks.
# FILL_PROGRAMS programs of 64 columns fill the H200 by themselves: from there on the forms that trade
# parallel work for fewer passes (the output inside the state pass, the WY form with a gradient, 128-column
# blocks) win; below it the passes take narrower blocks so that more programs run.
FILL_PROGRAMS = 256
# B * H from which the no-grad forward takes the output and the WY form inside its state pass
MANY_HEADS = 64
# grid axis 1 holds at most 65,535 programs: dqk's chunks go there only below this many
MAX_GRID_Y = 65536
# 16-bit inputs at head sizes up to this have software-pipelined loops; fp32 tiles, or 256-wide ones, in
# several stages overflow the 227 KB of shared memory
PIPELINED_HEAD = 128

# The launch settings that `overrides` can change (the scripts' `--set KEY=VALUE`, for profiling), and what
# each selects: the launch options of a kernel (warps, stages, register cap, block size) and whether the
# forward's launches are programmatic dependent ones. The forms the kernels compute in (the output inside
# the state pass, the WY form, X kept, ...) are not settings: the rules below pick them from the problem, by
# the named thresholds above (PERF.md has the measurements, and the forms tried and dropped)
SETTINGS: dict[str, str] = {
    "cumsum.warps": "warps of the forward cumsum kernel (4)",
    "cumsum16.warps": "warps of the 16-bit-decay cumsum kernel (1)",
    "intra_fwd.warps": "warps of the intra forward (2 for GLA and the bounded no-grad KDA, else 4)",
    "intra_fwd.stages": "stages of the intra forward (1 for the per-channel decay, else 3)",
    "intra_fwd.maxnreg": "register cap of the intra forward (0: none; 168 / 128 for KDA, see _intra_forward)",
    "solve.warps": "warps of the solve (1)",
    "solve.maxnreg": "register cap of the solve (0: none; 128 for 16-bit inputs)",
    "wu.warps": "warps of the W/U pass",
    "fwd.pdl": "1: the forward's kernels as programmatic dependent launches (sm_90+; "
               "`benchmarks.speed kernels` sets 0)",
    "state_fwd.warps": "warps of the forward state pass (8 unchains its chained products, see _unchain)",
    "state_fwd.bv": "V columns a program of the forward state pass",
    "state_fwd.stages": "stages of the forward state pass",
    "state_bwd.warps": "warps of the reverse state pass (8 unchains its chained products)",
    "state_bwd.bv": "V columns a program of the reverse state pass",
    "state_bwd.stages": "stages of the reverse state pass",
    "dqk.warps": "warps of dqk (4)",
    "dqk.bk": "key columns a program of dqk (64)",
    "dqk.stages": "stages of dqk",
    "dvt.warps": "warps of dvt (4)",
    "dvt.stages": "stages of dvt",
    "intra_bwd.warps": "warps of the intra backward (4)",
    "intra_bwd.bk": "key columns a program of the intra backward (64 per-channel, else 128)",
    "intra_bwd.stages": "stages of the intra backward",
    "intra_bwd.maxnreg": "register cap of the intra backward (0: none)",
}

_OVERRIDES: contextvars.ContextVar[Mapping[str, int | None]] = contextvars.ContextVar(
    "kernels_triton_plan_overrides", default=MappingProxyType({})
)


def parse_overrides(items: Iterable[str] | Mapping[str, int | None]) -> dict[str, int | None]:
    """`KEY=VALUE` strings (the scripts' `--set`; `none` for the rule) or a mapping, checked against
    SETTINGS: an unknown key or a value that is not an integer is a ValueError naming it and what is
    allowed."""
    if isinstance(items, Mapping):
        pairs = [(key, value, f"{key}={value}") for key, value in items.items()]
    else:
        pairs = []
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. solve.warps=2")
            pairs.append((key, value, item))
    out: dict[str, int | None] = {}
    for key, value, item in pairs:
        if key not in SETTINGS:
            raise ValueError(f"--set {item!r}: unknown key {key!r}; the settings are {sorted(SETTINGS)}")
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            out[key] = None
            continue
        try:
            out[key] = int(value)
        except ValueError:
            raise ValueError(f"--set {item!r}: {value!r} is not an integer (or none for the rule)") from None
    return out


@contextlib.contextmanager
def overrides(items: Iterable[str] | Mapping[str, int | None]) -> Iterator[dict[str, int | None]]:
    """Within the block, the plans take these settings instead of their rules (for profiling and tests);
    yields the parsed settings. Nested blocks add to the outer ones."""
    changed = parse_overrides(items)
    token = _OVERRIDES.set(MappingProxyType({**_OVERRIDES.get(), **changed}))
    try:
        yield changed
    finally:
        _OVERRIDES.reset(token)


def current_overrides() -> dict[str, int | None]:
    """The settings in force (`overrides`, `use_overrides`)."""
    return dict(_OVERRIDES.get())


def use_overrides(items: Iterable[str]) -> dict[str, int | None]:
    """A script's `--set` for the rest of its run (the command line's scope); code that returns to its
    caller uses `overrides` instead."""
    changed = parse_overrides(items)
    _OVERRIDES.set(MappingProxyType({**_OVERRIDES.get(), **changed}))
    return changed


def add_override_argument(parser: argparse.ArgumentParser) -> None:
    """The scripts' `--set KEY=VALUE ...` (`benchmarks.speed`, `benchmarks.launches`, check_kernels.py)."""
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="launch settings of kernels.triton.plan.SETTINGS instead of their rules, "
        "e.g. --set solve.warps=2 state_bwd.stages=1",
    )


def overrides_from_args(args: argparse.Namespace) -> dict[str, int | None]:
    """Apply the parsed `--set` for the script's run (use_overrides); a bad item exits with its message."""
    try:
        return use_overrides(args.set)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def _setting(key: str, rule):
    # an override where one is set (None: the rule), else the rule
    value = _OVERRIDES.get().get(key)
    return rule if value is None else value


def _switch(key: str, rule: bool) -> bool:
    return bool(_setting(key, rule))


def _cap(key: str, rule: int | None) -> int | None:
    # a register cap per thread: an override of 0 means no cap
    value = _OVERRIDES.get().get(key)
    if value is None:
        return rule
    return value or None


def _big_warps(big: bool) -> int:
    # 8 warps for the big tiles on a GPU; the interpreter runs every kernel with 4
    return 8 if big and not INTERPRET else 4


def _block_v(key: str, V: int, programs: int, wide: bool) -> int:
    # the state passes split V finer when B * H alone cannot fill the GPU (wide: 128-column blocks once it
    # does); the interpreter takes 32 columns
    if INTERPRET:
        return min(V, 32)
    value = _OVERRIDES.get().get(key)
    if value is not None:
        return min(V, value)
    return min(V, 32 if programs < FILL_PROGRAMS else (128 if wide else 64))


@dataclass(frozen=True)
class Problem:
    """What a plan is computed from: the shape, the op's two switches, the gate's bound and the dtype."""

    B: int
    T: int
    H: int
    K: int
    V: int
    chunk_size: int
    decay: Decay  # kernels.family's word: none, scalar (per head), channel (per key)
    delta_rule: bool
    bounded: bool
    lowp: bool  # 16-bit inputs (their dot operands in bf16)
    keep: bool  # a gradient wanted: the forward keeps what the backward reads
    pdl_capable: bool = False  # compiled kernels on an sm_90+ GPU with Triton's grid dependency control

    @property
    def NT(self) -> int:
        return -(-self.T // self.chunk_size)

    @property
    def pipelined(self) -> bool:
        return self.lowp and max(self.K, self.V) <= PIPELINED_HEAD

    @property
    def programs(self) -> int:
        # the state passes' programs counted in blocks of 64 V columns
        return self.B * self.H * max(1, self.V // 64)

    @property
    def wide(self) -> bool:
        return self.programs >= FILL_PROGRAMS


@dataclass(frozen=True)
class Kernel:
    """One kernel's launch options (stages and register cap None where the launch leaves Triton's)."""

    warps: int
    stages: int | None = None
    maxnreg: int | None = None


@dataclass(frozen=True)
class ForwardPlan:
    problem: Problem
    out: bool  # the output inside the state pass (else _output_kernel after it)
    wy: bool  # the no-grad delta rule's Vt inside the state pass, no W/U pass
    keep_x: bool  # with a gradient: the WY form too, X kept for dvt, W alone from the W/U pass
    vt_x: bool  # with keep_x: no Vt kept
    tril: bool  # L and A_qk stored and loaded block lower-triangular
    log2: bool  # G stored times log2(e)
    g16: bool  # G's rows as uint16 decays within 16-row blocks (_cumsum16_kernel)
    pdl: bool  # programmatic dependent launches
    cumsum: Kernel
    cumsum16: Kernel
    intra: Kernel
    solve: Kernel
    solve_prec: str
    wu: Kernel
    state: Kernel
    state_bv: int
    state_early: bool  # the state pass loads a chunk's small inputs at the top of its step, else where used
    output_bv: int
    # with a gradient, the per-channel decay: Q exp(G) and K_d kept for the reverse state pass (16-bit
    # inputs: the rounded copies the forward multiplied with), else that pass forms them from q, k and G
    keep_decayed: bool

    @property
    def runs_wu(self) -> bool:
        return self.problem.delta_rule and not self.wy

    @property
    def store_h(self) -> bool:
        # the chunk-entry states written: the backward or _output_kernel reads them
        return self.problem.keep or not self.out

    @property
    def store_vt(self) -> bool:
        # Vt written: the backward (unless it forms Vt from X) or _output_kernel reads it
        return self.problem.delta_rule and self.store_h and not self.vt_x

    @property
    def state_unchain(self) -> bool:
        # the state pass's chained products through _unchain where it runs 8 warps (with 4 the layouts are
        # the same either way)
        return self.state.warps > 4


@dataclass(frozen=True)
class BackwardPlan:
    problem: Problem
    vt_x: bool  # the forward kept X and no Vt
    pre_x: bool  # the forward kept X
    state: Kernel
    state_bv: int
    state_early: bool  # the reverse state pass loads a chunk's decay at the top of its step, else where used
    k_inner: int  # dqk's grid: (key blocks, chunks, B H) if 1, else (chunks, key blocks, B H)
    dqk: Kernel
    dqk_bk: int
    dqk_bv: int
    dvt: Kernel
    intra: Kernel
    intra_bk: int

    @property
    def fused(self) -> bool:
        # dqk does the intra-chunk part as well (no dvt, no intra backward): no delta rule, no per-channel
        # decay
        p = self.problem
        return not p.delta_rule and p.decay != "channel"

    @property
    def first(self) -> bool:
        # the intra backward before dqk, which finishes dq, dk, dg (the per-channel decay)
        return self.problem.decay == "channel"

    @property
    def dv_w(self) -> bool:
        # dqk's V loop reads dvt's dV (the delta rule, intra first)
        return self.problem.delta_rule and self.first

    @property
    def seq(self) -> bool:
        # dqk's epilogue loads each tile where first needed (GLA: the per-channel decay, no delta rule)
        return not self.problem.delta_rule and self.first

    @property
    def state_unchain(self) -> bool:
        return self.state.warps > 4


def plan_forward(p: Problem) -> ForwardPlan:
    """The forward's launches for problem p (p.keep: with a gradient)."""
    decay, delta, keep = p.decay, p.delta_rule, p.keep
    # the state pass computes the output (and, for the delta rule, forms Vt in the WY form) where it has many
    # programs: with a gradient where they fill the GPU (p.wide), without one from B * H >= MANY_HEADS. Few
    # programs mean a long sequential pass on part of the GPU, where the output and the W/U products are
    # better left to passes that run every chunk in parallel
    out = p.wide if keep else p.B * p.H >= MANY_HEADS
    wy = delta and out and not keep
    keep_x = delta and out and keep
    # (the per-channel decay's dqk spills with T applied to X there: it keeps Vt)
    vt_x = keep_x and decay != "channel"
    # L and A_qk without their zeros above the diagonal blocks, where the state pass is their only reader
    tril = out and not keep
    log2 = decay == "channel" and p.bounded and not keep
    bv = _block_v("state_fwd.bv", p.V, p.programs, wide=p.pipelined)
    # a chunk's small inputs: at the top of the step, but where used for the scalar decay and for KDA's
    # differentiable forward with many programs
    late = decay == "scalar" or (decay == "channel" and delta and keep and p.wide)
    return ForwardPlan(
        problem=p,
        out=out,
        wy=wy,
        keep_x=keep_x,
        vt_x=vt_x,
        tril=tril,
        log2=log2,
        g16=log2 and _g16(p.lowp),
        pdl=p.pdl_capable and _switch("fwd.pdl", True),
        cumsum=Kernel(_setting("cumsum.warps", 4)),
        cumsum16=Kernel(_setting("cumsum16.warps", 1)),
        intra=_intra_forward(p),
        solve=Kernel(_setting("solve.warps", 1), maxnreg=_cap("solve.maxnreg", 128 if p.lowp else None)),
        solve_prec="tf32" if p.lowp else "tf32x3",
        # 4 where the pass writes W alone (keep_x), else 8 at K or V >= 128
        wu=Kernel(_setting("wu.warps", 4 if keep_x else _big_warps(p.K >= 128 or p.V >= 128))),
        state=Kernel(
            _setting("state_fwd.warps", _big_warps(p.K * bv >= 128 * 64)),
            stages=_setting("state_fwd.stages", (2 if out else 3) if p.pipelined else 1),
        ),
        state_bv=bv,
        state_early=not late,
        output_bv=min(p.V, 64),
        keep_decayed=keep and decay == "channel" and p.lowp,
    )  # fmt: skip


def _g16(lowp: bool) -> bool:
    # 16-bit inputs only: the uint16 decays' steps of 1/512 in the exponents (0.039% RMS) sit below bf16's
    # rounding of the operands, not below fp32's
    return lowp


def _intra_forward(p: Problem) -> Kernel:
    # KDA with 16-bit inputs: at most 128 registers a thread (4 programs per SM instead of 2 unbounded or 3
    # bounded); the bounded gate's no-grad form 2 warps at 168 (6 programs, no spill); GLA 2 warps
    capped = p.pipelined and p.decay == "channel" and p.delta_rule
    narrow = capped and not p.keep and p.bounded
    warps = 2 if (p.pipelined and p.decay == "channel" and not p.delta_rule) or narrow else 4
    return Kernel(
        _setting("intra_fwd.warps", warps),
        # the per-channel decay's triangular loop runs 1-4 steps: unpipelined
        stages=_setting("intra_fwd.stages", 1 if p.decay == "channel" else 3),
        maxnreg=_cap("intra_fwd.maxnreg", 168 if narrow else (128 if capped else None)),
    )


def plan_backward(p: Problem, vt_x: bool, pre_x: bool) -> BackwardPlan:
    """The backward's launches for problem p, given what the forward kept (vt_x: X and no Vt; pre_x: X)."""
    decay, delta = p.decay, p.delta_rule
    # many programs: the forward pass's 128-column blocks and 8 warps
    big = p.wide and p.pipelined
    delta_no_decay = p.pipelined and decay == "none" and delta
    dvt_stages = (3 if pre_x else 2) if p.pipelined else 1
    kda = p.pipelined and decay == "channel" and delta
    return BackwardPlan(
        problem=p,
        vt_x=vt_x,
        pre_x=pre_x,
        state=Kernel(
            _setting("state_bwd.warps", _big_warps(big)),
            stages=_setting("state_bwd.stages", 2 if p.pipelined else 1),
        ),
        state_bv=_block_v("state_bwd.bv", p.V, p.programs, wide=big),
        # the chunk's decay at the top of the step for the per-channel decay with few programs
        state_early=decay == "channel" and not p.wide,
        # (grid axis 1 holds the chunks only below MAX_GRID_Y of them)
        k_inner=int(p.NT < MAX_GRID_Y),
        dqk=Kernel(
            _setting("dqk.warps", 4),
            stages=_setting("dqk.stages", (2 if delta and decay == "none" else 3) if p.pipelined else 1),
        ),
        dqk_bk=min(p.K, _setting("dqk.bk", 64)),
        dqk_bv=min(p.V, 64),
        dvt=Kernel(_setting("dvt.warps", 4), stages=_setting("dvt.stages", dvt_stages)),
        # the delta rule without a decay: 2 stages and 128 registers (4 programs per SM instead of 3); KDA: a
        # cap of 96 (5 instead of 4); the per-channel decay's triangular loops unpipelined
        intra=Kernel(
            _setting("intra_bwd.warps", 4),
            stages=_setting("intra_bwd.stages", 1 if decay == "channel" else (2 if delta_no_decay else 3)),
            maxnreg=_cap("intra_bwd.maxnreg", 128 if delta_no_decay else (96 if kda else None)),
        ),
        intra_bk=min(p.K, _setting("intra_bwd.bk", 64 if decay == "channel" else 128)),
    )  # fmt: skip


# the plans' rules that follow from their fields, printed beside them
_DERIVED = {
    ForwardPlan: ("runs_wu", "store_h", "store_vt", "state_unchain"),
    BackwardPlan: ("fused", "first", "dv_w", "seq", "state_unchain"),
}


def describe(plan: ForwardPlan | BackwardPlan) -> list[str]:
    """One line a field: `name: value`, the kernels' options inline."""
    lines = []
    for field in dataclasses.fields(plan):
        if field.name == "problem":
            continue
        value = getattr(plan, field.name)
        if isinstance(value, Kernel):
            value = " ".join(f"{k}={v}" for k, v in dataclasses.asdict(value).items() if v is not None)
        lines.append(f"  {field.name}: {value}")
    lines += [f"  {name}: {getattr(plan, name)}" for name in _DERIVED[type(plan)]]
    return lines


def main(argv: list[str] | None = None) -> None:
    from kernels import family

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op", choices=[o.name for o in family.OPS])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128, help="head size K = V")
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    add_override_argument(ap)
    args = ap.parse_args(argv)
    overrides_from_args(args)
    op = family.op(args.op)
    base = Problem(
        B=args.B, T=args.T, H=args.H, K=args.D, V=args.D, chunk_size=args.chunk_size,
        decay=op.decay, delta_rule=op.delta_rule, bounded=op.lower_bound is not None,
        lowp=args.dtype != "fp32", keep=False, pdl_capable=True,
    )  # fmt: skip
    print(f"{args.op} B{args.B} T{args.T} H{args.H} K=V={args.D} {args.dtype} (on an sm_90 GPU)")
    print("no-grad forward:")
    print("\n".join(describe(plan_forward(base))))
    train = dataclasses.replace(base, keep=True)
    forward = plan_forward(train)
    print("forward with a gradient:")
    print("\n".join(describe(forward)))
    print("backward:")
    print("\n".join(describe(plan_backward(train, forward.vt_x, forward.keep_x))))


if __name__ == "__main__":
    main()
