"""The benchmark toolkit: what the scripts of benchmarks/ and the tests that share their inputs need once.

    inputs       make_inputs (one op's inputs, [B, T, H, D] keywords), token_loop_inputs (positional, fp32),
                 rel_rms (the error measure), CHECK_BOUNDS (the GPU check's bounds on it), errors_of
                 (an op's outputs and gradients against a reference's)
    shapes       SHAPES (the fixed benchmark shapes), SWEEP_LENGTHS, add_shape_args (--B --T --H --D)
    launches     Launch, Recorder, record_launches: every kernel launch of one op, recorded on meta tensors
    provenance   provenance(): date, device, versions and commit of a measurement; indexed_device
    files        write_csv, checkout (a git revision in a temporary worktree), in_tree (this toolkit run on
                 another tree's kernels)

Imports nothing of Triton at load time: a test process chooses the interpreter before Triton is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from kernels.family import Decay

ROOT = Path(__file__).resolve().parents[1]


# The bounds of the GPU check of the kernels (tests/gpu/check_kernels.py; FLA's own test bounds) on rel_rms
# against the token loop, bf16 inputs
CHECK_BOUNDS = {
    "o": 5e-3,
    "final_state": 5e-3,
    "dq": 8e-3,
    "dk": 8e-3,
    "dv": 8e-3,
    "dinitial_state": 8e-3,
    "dg": 2e-2,
    "dbeta": 2e-2,
    # the no-grad forward (which skips the buffers kept for the backward and, for the delta rule, the W/U
    # pass): its output and final state, the larger error of the two (ours only)
    "o_infer": 5e-3,
}


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Relative RMS error ||out - ref|| / ||ref||, computed in float64.

    Both tensors must have the same shape. A zero reference gives the absolute norm of out instead, so that an
    all-zero expected value still fails when out is not zero.
    """
    if ref.shape != out.shape:
        raise ValueError(f"rel_rms: shapes differ, ref {tuple(ref.shape)} vs out {tuple(out.shape)}")
    ref64, out64 = ref.detach().double(), out.detach().double()
    denom = ref64.norm().item()
    err = (out64 - ref64).norm().item()
    return err / denom if denom > 0 else err


def errors_of(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    inputs: dict,
    ref_out: tuple,
    ref_grads: dict,
    do: torch.Tensor,
    dht: torch.Tensor,
    infer: bool = False,
) -> tuple[dict, str]:
    """Relative RMS errors (rel_rms) of an op's outputs and gradients against a reference's, and a note.
    `fn(q, k, v, g, beta, initial_state=, output_final_state=True)` runs on leaves cloned from `inputs`; the
    loss is o . do + final state . dht; `infer` adds the no-grad forward's larger error as o_infer. When
    the backward raises (FLA's gated backwards on Triton 3.6, #640): the forward's errors and the exception
    as the note instead of nothing."""
    names = [n for n, t in inputs.items() if t is not None]
    leaves = {n: inputs[n].detach().clone().requires_grad_(True) for n in names}
    o, ht = fn(
        leaves["q"],
        leaves["k"],
        leaves["v"],
        leaves.get("g"),
        leaves.get("beta"),
        initial_state=leaves["initial_state"],
        output_final_state=True,
    )
    errs = {"o": rel_rms(ref_out[0], o), "final_state": rel_rms(ref_out[1], ht)}
    if infer:
        with torch.no_grad():
            o_inf, ht_inf = fn(
                *(inputs[n] for n in ("q", "k", "v", "g", "beta")),
                initial_state=inputs["initial_state"],
                output_final_state=True,
            )
        errs["o_infer"] = max(rel_rms(ref_out[0], o_inf), rel_rms(ref_out[1], ht_inf))
    try:
        ((o.float() * do).sum() + (ht.float() * dht).sum()).backward()
    except Exception as exc:
        return errs, f"backward ERR {type(exc).__name__}: {str(exc)[:90]}"
    for n in names:
        errs[f"d{n}"] = rel_rms(ref_grads[n], leaves[n].grad) if leaves[n].grad is not None else float("nan")
    return errs, ""


def make_inputs(
    decay: Decay,
    delta_rule: bool,
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    seed: int,
    lower_bound: float | None = None,
    with_state: bool = True,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    generator: torch.Generator | None = None,
    layer_gates: bool = False,
    slow: bool = False,
) -> dict[str, torch.Tensor | None]:
    """Random inputs of one op of the family ([B, T, H, D] layout, unit-norm keys, an initial state unless
    with_state=False), the keys of `triton_chunk` / `naive_recurrent`.

    q, k, v and beta are drawn in fp32 and cast to `dtype`; g and the initial state stay fp32 (as a gate and
    the state carry emit them). `generator` (e.g. a CUDA one, drawn from in turn across calls) replaces a
    fresh one seeded with `seed` on `device`. The tests' gates (the default) are log-sigmoid of 2 z, some far
    below -5, or lower_bound * U(0, 1), and beta ~ U(0, 1); layer_gates=True draws them as a gated layer
    emits them instead: log-sigmoid(z) or lower_bound * sigmoid(z), and beta = sigmoid(z). slow (with
    layer_gates): every other channel (head, for the scalar decay) decays slowly, z - 5, so that the state
    carries across chunks.
    """
    gen = generator if generator is not None else torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=gen)

    q = randn(B, T, H, K).to(dtype)
    k = F.normalize(randn(B, T, H, K), dim=-1).to(dtype)
    v = randn(B, T, H, V).to(dtype)
    g = None
    if decay != "none":
        shape = (B, T, H) if decay == "scalar" else (B, T, H, K)
        if layer_gates:
            z = randn(*shape)
            if slow:
                # g about -0.03 (bounded) or -0.007 (log-sigmoid) there: with z ~ N(0, 1) alone a bounded gate
                # decays by about e^-160 over a chunk, and exp(G_last) and the entering state barely show
                z = z - 5.0 * (torch.arange(shape[-1], device=device) % 2 == 0)
            g = F.logsigmoid(z) if lower_bound is None else lower_bound * torch.sigmoid(z)
        elif lower_bound is None:
            # log-sigmoid gates span strong and weak decay, some far below -5 (the unbounded regime)
            g = F.logsigmoid(2 * randn(*shape))
        else:
            g = lower_bound * torch.rand(shape, device=device, generator=gen)
    beta = None
    if delta_rule:
        beta = (
            torch.sigmoid(randn(B, T, H))
            if layer_gates
            else torch.rand(B, T, H, device=device, generator=gen)
        )
        beta = beta.to(dtype)
    h0 = randn(B, H, K, V) if with_state else None
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": h0}


def token_loop_inputs(decay: Decay, delta_rule: bool, B: int, T: int, H: int, K: int, V: int,
                      generator: torch.Generator, strong_decay: bool = False) -> list[torch.Tensor]:
    """q, k, v[, g][, beta] in float32 for an op's positional call (tests/test_ops.py, `speed cpu`):
    L2-normalised keys, log-decays logsigmoid(randn), beta in (0, 1); `strong_decay` sets about 5% of the
    decays to -5 .. -20, to exercise the overflow safety of the chunked forms."""
    q = torch.randn(B, T, H, K, generator=generator)
    k = F.normalize(torch.randn(B, T, H, K, generator=generator), dim=-1)
    v = torch.randn(B, T, H, V, generator=generator)
    inputs = [q, k, v]
    if decay != "none":
        shape = (B, T, H) if decay == "scalar" else (B, T, H, K)
        g = F.logsigmoid(torch.randn(*shape, generator=generator))
        if strong_decay:
            strong = torch.rand(*shape, generator=generator) < 0.05
            g = torch.where(strong, -5 - 15 * torch.rand(*shape, generator=generator), g)
        inputs.append(g)
    if delta_rule:
        inputs.append(torch.rand(B, T, H, generator=generator))
    return inputs


# name -> (B, T, H) at K = V = 128: many short sequences of few heads, and a long one of many heads
SHAPES = {"B32T2K": (32, 2048, 2), "B8T8K": (8, 8192, 16)}
# B = 1, H = 16: the lengths at which our chunked ops are timed against SDPA
SWEEP_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def add_shape_args(parser: argparse.ArgumentParser) -> None:
    """--B --T --H --D, the larger fixed shape (B8T8K, K = V = 128) by default."""
    for name, default in zip("BTH", SHAPES["B8T8K"], strict=True):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--D", type=int, default=128, help="head size K = V")


@dataclass
class Launch:
    kernel: str
    grid: tuple
    kwargs: dict
    args: tuple = ()

    def __iter__(self) -> Iterator:
        # unpacks as (kernel, grid, kwargs): what a launch rule decides, without the tensors
        return iter((self.kernel, self.grid, self.kwargs))


class Recorder:
    """Stands in for the Triton kernel `name`: appends each launch to `launches`, then launches `kernel`
    (None: nothing runs, as on meta tensors)."""

    def __init__(self, name: str, launches: list, kernel=None) -> None:
        self.name, self.launches, self.kernel = name, launches, kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(Launch(self.name, tuple(int(g) for g in grid), kwargs, args))
            if self.kernel is not None:
                return self.kernel[grid](*args, **kwargs)

        return launch


def kernel_homes() -> dict[str, ModuleType]:
    """Every kernel of the family -> the stage module that holds and launches it (where a Recorder goes;
    before the split by stage, chunk.py held them all)."""
    from kernels.triton import chunk

    modules = getattr(chunk, "STAGES", None) or (chunk,)
    return {name: m for m in modules for name in sorted(vars(m))
            if name.startswith("_") and name.endswith("_kernel")}


PHASES = ("forward without a gradient", "forward with a gradient", "backward")


def record_launches(op: str, B: int, T: int, H: int, D: int = 128,
                    states: bool = False, recompute_states: bool = False) -> dict[str, list[Launch]]:
    """Every kernel launch of `op` (a name of kernels.triton.VARIANTS) at [B, T, H, D] in bf16, by phase
    (PHASES), from the launch code run on meta tensors with every kernel replaced by a Recorder; with
    `states`, from an initial state, with the final state and its gradient; with `recompute_states`, the
    forward keeping no chunk-entry states and the backward rebuilding them."""
    from kernels.triton import VARIANTS, chunk

    found = [v[1:] for v in VARIANTS if v[0] == op]
    if not found:
        raise SystemExit(f"unknown op {op!r}; kernels.triton.VARIANTS has {[v[0] for v in VARIANTS]}")
    (decay, delta, lower_bound), homes, launches = found[0], kernel_homes(), []
    real = {name: getattr(module, name) for name, module in homes.items()}
    for name, module in homes.items():
        setattr(module, name, Recorder(name, launches))
    meta = {"device": "meta", "dtype": torch.bfloat16}
    q, k, v = (torch.empty(B, T, H, D, **meta) for _ in range(3))
    # (kernels.family's "none"; None in the VARIANTS of revisions before it)
    no_decay = decay in (None, "none")
    g = None if no_decay else torch.empty((B, T, H, D)[: 3 if decay == "scalar" else 4], device="meta")
    beta = torch.empty(B, T, H, **meta) if delta else None
    h0, dht = (torch.empty(B, H, D, D, device="meta") for _ in range(2)) if states else (None, None)
    # (the entry points' names before the split by stage: _chunk_fwd, _chunk_bwd)
    forward = getattr(chunk, "chunk_forward", None) or chunk._chunk_fwd
    backward = getattr(chunk, "chunk_backward", None) or chunk._chunk_bwd
    phases = {}
    # (passed only where asked: a revision before the option has no such argument)
    rebuild = {"recompute_states": True} if recompute_states else {}
    try:
        for phase, keep in ((PHASES[0], False), (PHASES[1], True)):
            o, _, saved = forward(
                q, k, v, g, beta, D**-0.5, h0, states, 64, lower_bound, keep=keep, **(rebuild if keep else {})
            )
            phases[phase] = launches[:]
            launches.clear()
        backward(q, k, v, g, beta, D**-0.5, h0, torch.empty_like(o), dht, 64, lower_bound, saved)
        phases[PHASES[2]] = launches[:]
    finally:
        for name, fn in real.items():
            setattr(homes[name], name, fn)
    return phases


# What a benchmark row's figures depend on: a change here since the commit makes its label "+modified".
CODE_PATHS = ("kernels", "mixers", "harness", "tasks", "conf", "train.py", "benchmarks/*.py",
              "pyproject.toml")


def commit() -> str:
    """The commit whose code ran: $KDA_COMMIT where the caller names it, else the checkout's HEAD, with
    "+modified" where the code differs from it (uncommitted edits, or a copy of a working tree synced onto
    an older clone, as on a lent GPU machine, whose HEAD alone would name code that did not run)."""
    if os.environ.get("KDA_COMMIT"):
        return os.environ["KDA_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", *CODE_PATHS], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+modified" if changed else "")


def versions() -> str:
    parts = [f"torch {torch.__version__}"]
    for name in ("triton", "fla"):
        try:
            parts.append(f"{name} {getattr(__import__(name), '__version__', '?')}")
        except ImportError:
            pass
    return ", ".join(parts)


def device_name(device: torch.device | str | None = None) -> str:
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    return f"{cpu} ({os.cpu_count()} cores)"


def provenance(device: torch.device | str | None = None) -> str:
    """Where a figure comes from: date, device, versions, commit, and the launch settings a --set changed."""
    text = f"{datetime.date.today()}, {device_name(device)}, {versions()}, commit {commit()}"
    plan = sys.modules.get("kernels.triton.plan")  # loaded only where the kernels ran
    changed = plan.current_overrides() if plan is not None else {}
    return text + ("; launch settings changed: " + " ".join(f"{k}={v}" for k, v in changed.items())
                   if changed else "")


def indexed_device(spec: str) -> torch.device:
    """--device as a torch.device; "cuda" names no index, and set_device and the peak-memory counters
    need one."""
    device = torch.device(spec)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def write_csv(path: Path, rows: list[dict], fields: list[str] | None = None) -> None:
    """rows as CSV, the columns `fields` or every key in order of appearance. The scripts rewrite it after
    every row: a run cut off by its time limit keeps what it measured."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields or list(dict.fromkeys(k for r in rows for k in r)),
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """The tree of git revision `rev` of this checkout, in a temporary worktree for as long as the context."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "rev"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev], cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True)


# this toolkit's package loaded from its own folder, the `kernels` imported from the working directory
_IN_TREE = """
import importlib, importlib.util, sys
here, call, *argv = sys.argv[1:]
spec = importlib.util.spec_from_file_location("benchmarks", here + "/__init__.py",
                                              submodule_search_locations=[here])
sys.modules["benchmarks"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["benchmarks"])
module, function = call.split(":")
getattr(importlib.import_module(module), function)(argv)
"""


def in_tree(tree: Path, call: str, *argv: str) -> str:
    """The output of `call` ("module:function", taking argv) of this toolkit, run in a fresh interpreter on
    the kernels of `tree` (a git revision's: the same measuring code on both sides of a comparison),
    compiled for the GPU (no TRITON_INTERPRET)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _IN_TREE, str(ROOT / "benchmarks"), call, *argv], cwd=tree,
                         env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{call} {' '.join(argv)} in {tree} failed:\n{res.stderr[-3000:]}")
    return res.stdout
