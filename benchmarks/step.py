"""The whole training step, as a user runs it: step time, tokens/s, peak memory and where the GPU time goes.

    python -m benchmarks.step --out DIR             # every mixer, MQAR + Palindrome, T 256-2048
    python -m benchmarks.step --out DIR --mixers kda attention --lengths 1024 --impls ours fla
    python -m benchmarks.step --out DIR --device cpu --batch 2 --lengths 32 --d-model 32   # smoke test
    python -m benchmarks.step --out DIR --mixers --patterns 'kda*3,attention' --lengths 1024  # hybrid

The model of Kimi Linear's synthetic setting (2 layers, d_model 256, the mixers' yamls: 2 heads x 128), one
fixed batch of the task (B=256 by default), bf16 autocast on CUDA, and the step train.py takes: the body, the
LM head + cross-entropy at the labelled positions only, backward, gradient clipping, fused AdamW. After
`--warmup` steps (the first, timed on its own, is what compilation costs a run), `--steps` steps are timed
with CUDA events; peak memory is the largest allocation of the timed steps (of a +cudagraphs row, of its
steps from the first: the graphs' pool keeps what their recording allocated). One more step runs under
torch.profiler and its GPU time is split into

    mixer op      our Triton chunk kernels (or FLA's, or SDPA's for attention), forward and backward
    lm head+loss  the head's matmuls, softmax and their gradients
    short conv    the causal depthwise convolutions, forward and backward
    matmuls       every other GEMM (projections, MLP, their gradients)
    rest          elementwise glue, norms, the optimizer

`--patterns` adds hybrid stacks (`model.pattern` in short form, mixers/pattern.py; each kind at its yaml, as
many layers as the pattern has, our layers only), named as the analysis names them (`kda:attention 3:1`).
`--impls fla` builds the same backbone around FLA's layers (`fla.layers`, flash-linear-attention >= 0.6,
with their short convolutions and fused norms) and FLA's fused linear cross-entropy over all positions
(ignore_index -100), where FLA has the layer; on CUDA, before anything is timed, one process per FLA model
compiles every config its autotuners will try, side by side (FLA autotunes on first use, compiling each
config in turn: minutes per model in the timing process otherwise; `--no-warm` skips it, `--warm-timeout`
bounds it, `--warm-only` does only it, e.g. beside a run training on the same GPU, for a later call with
`--no-warm` on the same machine, whose Triton cache then holds the configs). `--variants` picks our step's
forms: `default` (what `python train.py` runs on this device at the configs' defaults: compiled on CUDA,
eager on the CPU, and replayed as CUDA graphs where `trainer.cuda_graphs` says so; the row says which),
`eager`, `lean`, `compile`, `lean+compile`. A compiled row is measured after `torch._dynamo.reset()`, and
fails (recorded, with the reason) if the compiler made no graph: a row labelled compiled ran compiled. A
graph compiled inside the timed steps (a guard failing after the warm-up) sends them to be timed again on
the cached graphs (`graphs made while timed`), and a second such round fails the row. `unprofiled ms` is
the step time in no kernel (the GPU idle between them); the report names rows where it passes 10 %.
On CUDA the profiled step's host time is split the same way (`host ... ms` in the CSV: each host op's
own CPU time, launch calls included, under the profiler's overhead), to tell a host-bound step's cause.
`--cuda-graphs` compiles our body in torch.compile's reduce-overhead mode (its forward and backward
recorded as CUDA graphs and replayed: a launch each instead of one per kernel, for steps the host bounds);
those rows are labelled +cudagraphs, are `default` only where train.py replays too, carry no split
(replayed graphs hide which op launched a kernel) and fail if inductor skipped the graphs.
Each row is printed beside the last committed figure of the same form (`benchmarks/anchors/
train_eaf2b28_h200.csv`, H200; rows of another GPU get none) and beside FLA's layers; the step before this
benchmark existed (`train_a359d38_h200.csv`) closes the report of an H200's table.
Writes DIR/bench_train.csv and DIR/bench_train.md (date, GPU, versions, commit on top), and
DIR/bench_train_kernels.csv: each category of each step's GPU time by launching op and kernel, largest
first, so that every figure of the split can be traced to the kernels it adds up.
`--resume` keeps the rows DIR holds and measures the missing ones, so that a table larger than one
session's device time fills over several (every row records its date, commit and device; a table is of
one device, so rows of another make --resume stop before anything is measured or written).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import inspect
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch._functorch.config as functorch_config
from omegaconf import OmegaConf
from torch import nn

from benchmarks.common import ROOT, commit, device_name, indexed_device, provenance, write_csv
from benchmarks.memory import SAVED, compiled_rows, outside_graph, saved_split, split_gib
from harness import step as train
from harness.config import fast_step, replays_graphs
from kernels import conv as conv_ops
from kernels.triton import conv as triton_conv
from kernels.triton.conv import BWD_FORMS
from mixers.model import RECOMPUTABLE, LanguageModel
from mixers.pattern import check_pattern, expand, mixer_yaml, pattern_name

MIXERS = ["kda", "gdn", "mamba2", "gla", "deltanet", "linear_attn", "attention"]
TASKS = {"mqar": "mqar", "palindrome": "palindrome"}
BASELINE = ROOT / "benchmarks" / "anchors" / "train_a359d38_h200.csv"
# the last committed step figures, per form (impl label), task, mixer and length
LAST = ROOT / "benchmarks" / "anchors" / "train_eaf2b28_h200.csv"
# the GPU both anchors were measured on: a row of another is not compared with them
ANCHOR_GPU = "H200"
CATEGORIES = ["mixer op", "lm head+loss", "short conv", "matmuls", "rest"]

# our mixer -> FLA's layer of the same op (FLA's own gates and defaults), as module.Class under fla.layers
# (0.6 does not export every layer it has)
FLA_LAYERS = {
    "kda": "kda.KimiDeltaAttention",
    "gdn": "gated_deltanet.GatedDeltaNet",
    "gla": "gla.GatedLinearAttention",
    "deltanet": "delta_net.DeltaNet",
    "linear_attn": "linear_attn.LinearAttention",
    "mamba2": "simple_gla.SimpleGatedLinearAttention",
}


class FlaMixer(nn.Module):
    """An FLA layer in our backbone's mixer slot: 2 heads of 128 at d_model 256, as our yamls."""

    def __init__(self, d_model: int, *, layer_idx: int = 0, layer: str = "kda.KimiDeltaAttention",
                 num_heads: int = 2, head_dim: int = 128) -> None:
        super().__init__()
        module, name = layer.rsplit(".", 1)
        try:
            cls = getattr(importlib.import_module(f"fla.layers.{module}"), name)
        except ImportError as error:
            raise RuntimeError(f"FLA layers need flash-linear-attention 0.6 ({error})") from None
        accepted = inspect.signature(cls).parameters
        # layers sized by expand_k / expand_v take widths relative to d_model; the others a head_dim
        relative = "expand_k" in accepted
        width = num_heads * head_dim / d_model
        wanted = {"hidden_size": d_model, "num_heads": num_heads, "head_dim": head_dim,
                  "layer_idx": layer_idx, "expand_k": width, "expand_v": width if relative else 1.0,
                  "use_short_conv": True, "mode": "chunk"}
        self.layer = cls(**{k: v for k, v in wanted.items() if k in accepted})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)[0]

    def state_size(self, seq_len: int | None = None) -> int:
        return 0


def build(impl: str, mixer: str, vocab: int, d_model: int, lean: bool = False,
          pattern: list[str] | None = None, backend: str | None = None,
          recompute: tuple[str, ...] = ()) -> LanguageModel:
    """The model of one row; `backend` replaces the yaml's op backend (ours, a single mixer); `recompute`:
    what ours recomputes in its compiled backward instead of keeping (RECOMPUTABLE's parts)."""
    if pattern is not None:  # a hybrid: the mixer node is its first kind's yaml, the others' their own
        cfg = mixer_yaml(pattern[0])
        return LanguageModel(vocab, cfg, d_model=d_model, num_layers=len(pattern), pattern=pattern,
                             lean_backward=lean, recompute=recompute)
    if impl == "ours":
        cfg = mixer_yaml(mixer)
        if backend is not None and "backend" in cfg:
            cfg.backend = backend
        return LanguageModel(vocab, cfg, d_model=d_model, num_layers=2, mixer_name=mixer, lean_backward=lean,
                             recompute=recompute)
    cfg = {"_target_": f"{__name__}.FlaMixer", "layer": FLA_LAYERS[mixer]}
    return LanguageModel(vocab, cfg, d_model=d_model, num_layers=2, mixer_name=f"fla.{mixer}")


def task_batch(task: str, B: int, T: int, device: torch.device) -> tuple[train.Batch, torch.Tensor, int]:
    """One fixed batch of `task` at length T (its yaml's generator, seed 0), its labels and vocabulary."""
    cfg = OmegaConf.load(ROOT / "conf" / "task" / f"{TASKS[task]}.yaml")
    cfg.seq_len = T
    generate, vocab = train.load_task(cfg)
    inputs, labels = generate(B, T, seed=0)
    return train.make_batch(inputs, labels, device), labels, vocab


def _ranged(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return wrapped


def label_ranges(model: LanguageModel) -> None:
    """Profiler ranges around the mixer op and the short convolutions (forward; their backward nodes are
    recognised by name)."""
    for module in model.modules():
        if type(module).__name__ == "ShortConvolution":
            module.forward = _ranged(module.forward, "bench::short_conv")
        if hasattr(module, "chunk_op"):
            module.chunk_op = _ranged(module.chunk_op, "bench::mixer_op")
    model.scored_loss = _ranged(model.scored_loss, "bench::loss")


def _category(names: list[str], kernel: str) -> str:
    joined = " ".join(names).lower()
    kernel = kernel.lower()
    if "bench::loss" in joined or "linearcrossentropy" in joined or "cross_entropy" in joined:
        return "lm head+loss"
    # "conv" but not "convert": inductor names a fused kernel by the ops it holds, dtype casts among them
    if "short_conv" in joined or "convolution" in joined or re.search(r"conv(?!ert)", kernel):
        return "short conv"
    if ("bench::mixer_op" in joined or "chunk" in joined or "kda_harness" in joined
            or "attention" in joined or "flash" in kernel or "chunk" in kernel):
        return "mixer op"
    if any(s in kernel for s in ("gemm", "cutlass", "nvjet", "xmma", "wgmma", "sm90_")) or any(
            s in joined for s in ("aten::mm", "aten::addmm", "aten::bmm", "mmbackward")):
        return "matmuls"
    return "rest"


def _ancestry(event: Any) -> list[str]:
    # an op's name and those of the ops (and profiler ranges) it ran inside, innermost first
    names, parent = [event.name], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return names


def host_split(events: list[Any]) -> dict[str, float]:
    """Host time (ms) per category: each host event's own CPU time (self_cpu_time_total, us; the launch
    calls among them), by the ops and ranges it ran inside."""
    split = dict.fromkeys(CATEGORIES, 0.0)
    for event in events:
        split[_category(_ancestry(event), "")] += event.self_cpu_time_total / 1000
    return split


def profile_split(step: Callable[[], None], device: torch.device,
                  kernels: dict[tuple[str, str, str], list[float]] | None = None,
                  host: dict[str, float] | None = None) -> dict[str, float]:
    """GPU time (ms) of one step per category; on the CPU, the ops' own CPU time instead. `kernels`, if
    given, collects each category by (category, op that launched it, kernel): [ms, launches]; `host`, if
    given (CUDA), the host's time per category (host_split)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    split = dict.fromkeys(CATEGORIES, 0.0)
    for event in prof.events():
        items = [(k.name, k.duration) for k in event.kernels] if device.type == "cuda" else (
            [(event.name, event.self_cpu_time_total)] if not event.cpu_children else [])
        if not items:
            continue
        names = _ancestry(event)
        for kernel, duration in items:
            category = _category(names, kernel)
            split[category] += duration / 1000
            if kernels is not None:
                entry = kernels.setdefault((category, event.name, kernel[:120]), [0.0, 0])
                entry[0] += duration / 1000
                entry[1] += 1
    if host is not None and device.type == "cuda":
        host.update(host_split([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]))
    return split


def make_step(impl: str, model: LanguageModel, batch: train.Batch, labels: torch.Tensor, compiled: bool,
              autocast: Callable[[], Any], backend: str = "inductor",
              graphs: bool = False) -> Callable[[], None]:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = train.make_optimizer(params, OmegaConf.load(ROOT / "conf" / "optim" / "adamw.yaml"))
    # reduce-overhead: inductor records the body's forward and backward as CUDA graphs and replays them,
    # one launch each instead of one per kernel (what bounds a short step on the host)
    mode = "reduce-overhead" if graphs else None
    features = torch.compile(model.features, backend=backend, mode=mode) if compiled else model.features
    if graphs:
        # as the trainer calls it (harness.run)
        features = train.graph_steps(features)
    if impl == "ours":
        def step() -> None:
            loss, _ = train.forward_backward(model, features, batch, optimizer, autocast, False)
            train.clip_and_guard(params, 1.0, loss, optimizer)
            optimizer.step()
        step.features = features  # type: ignore[attr-defined]
        return step
    from fla.modules import FusedLinearCrossEntropyLoss

    criterion = FusedLinearCrossEntropyLoss()
    flat_labels = labels.to(batch.inputs.device).flatten()

    def fla_step() -> None:
        with autocast():
            hidden = features(batch.inputs).flatten(0, 1)  # [B * T, D]
            with torch.profiler.record_function("bench::loss"):
                loss = criterion(hidden, flat_labels, model.lm_head.weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        train.clip_and_guard(params, 1.0, loss.detach(), optimizer)
        optimizer.step()
    return fla_step


def _label(impl: str, lean: bool, compiled: bool, budget: float | None = None, conv: str = "",
           graphs: bool = False, recompute: tuple[str, ...] = ()) -> str:
    """What ran: `conv` names a short-conv backward or implementation other than the default (--conv-bwd,
    --conv-impl), ours only;
    `graphs`: our compiled body replayed as CUDA graphs (--cuda-graphs); `recompute`: what our plain
    compiled model recomputes in the backward instead of keeping (--recompute)."""
    recompute = _recomputes(impl, lean, compiled, recompute)
    return impl + ("+lean" if lean else "") + ("+compile" if compiled else "") \
        + ("+cudagraphs" if graphs and compiled and impl == "ours" else "") \
        + (f"+mem{budget:g}" if budget is not None else "") \
        + (f"+conv-{conv}" if conv and impl == "ours" else "") \
        + (f"+recompute-{','.join(recompute)}" if recompute else "")


def _recomputes(impl: str, lean: bool, compiled: bool, parts: tuple[str, ...]) -> tuple[str, ...]:
    """What a row's model recomputes of --recompute's `parts`: ours, plain and compiled only."""
    return tuple(parts) if compiled and not lean and impl == "ours" else ()


# --variants: (compiled, lean, CUDA graphs) of each form of our step; `default` is the configs' own
VARIANTS = {"eager": (False, False, False), "lean": (False, True, False), "compile": (True, False, False),
            "lean+compile": (True, True, False)}


def default_form(device: torch.device) -> tuple[bool, bool, bool]:
    """(compiled, lean, CUDA graphs) of the step train.py takes on `device` at the configs' defaults
    (conf/trainer/default.yaml, conf/model/default.yaml), resolved as the trainer resolves them."""
    defaults = OmegaConf.create({"trainer": OmegaConf.load(ROOT / "conf" / "trainer" / "default.yaml"),
                                 "model": OmegaConf.load(ROOT / "conf" / "model" / "default.yaml")})
    compiled, lean = fast_step(defaults, device.type)
    # true where it cannot replay is refused by train.py; no default row to time there
    graphs = replays_graphs(defaults, compiled, device.type) and compiled and device.type == "cuda"
    return compiled, lean, graphs


def variants(names: list[str], device: torch.device) -> list[tuple[bool, bool, bool, bool]]:
    """(compiled, lean, CUDA graphs, is_default) per distinct form asked for, in order; `default` is the
    form train.py takes on `device` (default_form), measured once if also named."""
    default = default_form(device)
    forms = [default if name == "default" else VARIANTS[name] for name in names]
    return [(*form, form == default and "default" in names) for form in dict.fromkeys(forms)]


class RanEager(RuntimeError):
    """torch.compile made no graph for a row labelled compiled (e.g. its recompile limit was reached)."""


class RanWithoutGraphs(RuntimeError):
    """Inductor skipped CUDA graphs for a row labelled +cudagraphs (it logs why: a CPU tensor, a mutated
    input, dynamic shapes)."""


def _graph_skips() -> int:
    return torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


class RecompiledWhileTimed(RuntimeError):
    """torch.compile compiled a graph in each of two rounds of timed steps: no round timed only the step."""


def _graph_count() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _timed(step: Callable[[], None], steps: int, device: torch.device) -> tuple[float, float | None]:
    """(ms a step over `steps` steps, peak GiB allocated during them or None off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / steps, round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) * 1000 / steps, None


def timed_compiled(step: Callable[[], None], steps: int, device: torch.device,
                   compiled: bool) -> tuple[float, float | None, int]:
    """_timed, and the graphs torch.compile made during the timed steps (0 for an eager step). A guard that
    fails after the warm-up would count a compilation as step time: the steps are then timed once more on
    the graphs it cached, and a second round that compiles again is RecompiledWhileTimed."""
    before = _graph_count() if compiled else 0
    ms, peak = _timed(step, steps, device)
    made = _graph_count() - before if compiled else 0
    if made:
        before = _graph_count()
        ms, peak = _timed(step, steps, device)
        if _graph_count() > before:
            raise RecompiledWhileTimed(f"torch.compile made {made} graph(s) in the timed steps and "
                                       f"{_graph_count() - before} more when they were timed again: a guard "
                                       "fails at every step, so no time here is the step's")
    return ms, peak, made


def measure(impl: str, task: str, mixer: str, T: int, args: argparse.Namespace, device: torch.device,
            compiled: bool, lean: bool = False, default: bool = False,
            pattern: list[str] | None = None, budget: float | None = None,
            graphs: bool = False) -> dict[str, Any]:
    """One row; `budget`: trainer.compile_memory_budget for a compiled form (None: torch's default);
    `graphs`: our compiled body replayed as CUDA graphs."""
    # the partitioner reads it when the first step compiles and when compiled_rows traces the graph again
    with functorch_config.patch(activation_memory_budget=1.0 if budget is None else budget):
        return _measure(impl, task, mixer, T, args, device, compiled, lean, default, pattern, budget,
                        graphs and compiled and impl == "ours")


def _measure(impl: str, task: str, mixer: str, T: int, args: argparse.Namespace, device: torch.device,
             compiled: bool, lean: bool, default: bool, pattern: list[str] | None,
             budget: float | None, graphs: bool) -> dict[str, Any]:
    recompute = _recomputes(impl, lean, compiled, tuple(getattr(args, "recompute", ())))
    row: dict[str, Any] = {"impl": _label(impl, lean, compiled, budget, getattr(args, "conv_label", ""),
                                          graphs, recompute),
                           "default": default,
                           "task": task,
                           "mixer": mixer, "layers": len(pattern) if pattern else 2, "T": T, "B": args.batch}
    batch, labels, vocab = task_batch(task, args.batch, T, device)
    torch.manual_seed(0)
    model = build(impl, mixer, vocab, args.d_model, lean, pattern, recompute=recompute).to(device)
    label_ranges(model)
    use_bf16 = device.type == "cuda"
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else (
        lambda: torch.autocast(device.type, enabled=False))
    if compiled:
        # each model compiles from a clean slate, as in its own run: a process that has compiled other
        # models may reach dynamo's recompile limit, and then it runs eager without a word
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
    step = make_step(impl, model, batch, labels, compiled, autocast, getattr(args, "backend", "inductor"),
                     graphs)
    if graphs:
        # the graphs' private pool keeps what their recording allocated, which the timed steps' replays
        # no longer count as allocated: a +cudagraphs row's peak covers the recording too
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    # the first step pays Triton's and (compiled) inductor's compilation: what a run pays once
    t0 = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    # milliseconds kept: a tiny eager CPU model's first step is a few of them, not 0
    row["first_step_s"] = round(time.perf_counter() - t0, 4)
    if compiled:
        if _graph_count() == 0:
            raise RanEager("torch.compile made no graph: this row would be eager under a compiled label")
        row["graphs"] = _graph_count()
        row["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
    if graphs:
        # the graphs are recorded at the steps after the first (the first runs the compiled code plain)
        for _ in range(2):
            step()
        if _graph_skips():
            raise RanWithoutGraphs(f"inductor skipped CUDA graphs {_graph_skips()} time(s) (its log says "
                                   "why): the row would be the plain compiled step under a +cudagraphs label")
    for _ in range(args.warmup - 1):
        step()
    recorded_gib = round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if graphs else None
    ms, row["peak_gib"], made = timed_compiled(step, args.steps, device, compiled)
    if recorded_gib is not None:
        row["peak_gib"] = max(row["peak_gib"], recorded_gib)
    if compiled:
        row["graphs"], row["graphs made while timed"] = _graph_count(), made
    row["step_ms"] = round(ms, 2)
    row["tokens_per_s_M"] = round(args.batch * T / ms / 1000, 3)
    if not compiled:
        row.update(_saved_columns(saved_split(model, step)))
    # replayed graphs hide the ops that launched each kernel, which the split's categories read
    if args.profile and not graphs:
        kernels: dict[tuple[str, str, str], list[float]] = {}
        host: dict[str, float] = {}
        split = profile_split(step, device, kernels, host)
        row["_kernels"] = sorted(((category, ms, n, op, kernel) for (category, op, kernel), (ms, n)
                                  in kernels.items()), key=lambda k: (CATEGORIES.index(k[0]), -k[1]))
        total = sum(split.values()) or math.nan
        row.update({f"{k} ms": round(v, 2) for k, v in split.items()})
        row["mixer op share"] = round(split["mixer op"] / total, 3)
        # step time no kernel accounts for: the GPU idle between kernels (a host-bound step, a compilation)
        row["unprofiled ms"] = round(row["step_ms"] - total, 2)
        # where the host's time goes (under the profiler, which adds its own): a step whose host time
        # passes its GPU time is bound by the host
        row.update({f"host {k} ms": round(v, 2) for k, v in host.items()})
    if compiled and impl == "ours" and getattr(args, "backend", "inductor") == "inductor":
        # a compiled body saves what inductor's partition decides, outside the modules' hooks: its graph's
        # saved values by the module they were computed in, the head + loss's storages beside them; last,
        # since tracing the graph again resets dynamo (`step` would compile anew)
        try:
            outside = outside_graph(model, step.features, batch, autocast)
            rows = compiled_rows(model.features, (batch.inputs,), autocast) + outside
        except Exception as error:  # another torch's inductor may not be traced so: the timing stands
            row["saved error"] = _error_line(error)
        else:
            row.update(_saved_columns(split_gib(rows, "bytes")))
    return row


def _saved_columns(split: dict[str, float]) -> dict[str, float]:
    return {f"saved {k} GiB": float(f"{v:.4g}") for k, v in split.items()}


def _baseline() -> dict[tuple[str, int], dict[str, str]]:
    if not BASELINE.exists():
        return {}
    with open(BASELINE) as f:
        return {(r["mixer"], int(r["T"])): r for r in csv.DictReader(f)}


def _last() -> dict[tuple[str, str, str, int], dict[str, str]]:
    with open(LAST) as f:
        return {(r["impl"], r["task"], r["mixer"], int(r["T"])): r for r in csv.DictReader(f)}


def _cell(text: str) -> Any:
    # a CSV cell back as the value measure() wrote: int, float, bool or text
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _key(row: dict[str, Any]) -> tuple:
    return (row["impl"], bool(row.get("default")), row["task"], row["mixer"], int(row.get("layers", 2)),
            int(row["T"]), int(row["B"]))


def load(out: Path) -> list[dict[str, Any]]:
    """The rows of out/bench_train.csv that measured a step (with their kernel listings), to be kept by a
    --resume run; rows that recorded an error are measured again."""
    path = out / "bench_train.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = [{k: _cell(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
    rows = [r for r in rows if "step_ms" in r]
    listed: dict[tuple, list] = {}
    if (out / "bench_train_kernels.csv").exists():
        with open(out / "bench_train_kernels.csv", newline="") as f:
            for r in csv.DictReader(f):
                key = (r["impl"], r["default"] == "True", r["task"], r["mixer"], int(r["layers"]),
                       int(r["T"]))
                listed.setdefault(key, []).append((r["category"], float(r["ms"]), int(r["launches"]),
                                                   r["op"], r["kernel"]))
        for r in rows:
            r["_kernels"] = listed.get(_key(r)[:-1], [])
    elif (out / "bench_train_rest.csv").exists():
        # written before the listing covered every category: the "rest" alone, keyed without the form
        with open(out / "bench_train_rest.csv", newline="") as f:
            for r in csv.DictReader(f):
                listed.setdefault((r["impl"], r["task"], r["mixer"], int(r["T"])), []).append(
                    ("rest", float(r["ms"]), int(r["launches"]), r["op"], r["kernel"]))
        for r in rows:
            r["_kernels"] = listed.get((r["impl"], r["task"], r["mixer"], int(r["T"])), [])
    return rows


def row_devices(out: Path, rows: list[dict[str, Any]]) -> set[str]:
    """The devices the kept rows were measured on: their `device`, else (rows written before the column)
    the one bench_train.md's header names, its second field."""
    named = None
    md = out / "bench_train.md"
    if md.exists():
        lines = md.read_text().splitlines()
        fields = lines[2].split(", ") if len(lines) > 2 else []
        named = fields[1] if len(fields) > 1 else None
    return {str(r.get("device") or named or "an unnamed device") for r in rows}


# a step whose kernels account for less than 1 - this of its time is named under the table
UNPROFILED = 0.1


def _unprofiled(row: dict[str, Any]) -> float:
    """A row's step time in no kernel (0 without a profile); rows kept from before the column existed
    give it from their split."""
    if "unprofiled ms" in row:
        return row["unprofiled ms"]
    split = [row.get(f"{c} ms") for c in CATEGORIES]
    return 0.0 if None in split else row["step_ms"] - sum(split)


def _anchored(row: dict[str, Any]) -> bool:
    # rows from before the device column are of the H200's table, the only one then
    return ANCHOR_GPU in str(row.get("device", ANCHOR_GPU))


def write(rows: list[dict[str, Any]], out: Path, header: str, echo: bool = True) -> None:
    # what each category of each step's GPU time is made of, largest first
    fields = ["impl", "default", "task", "mixer", "layers", "T", "category", "ms", "launches", "op", "kernel"]
    listing = [dict(zip(fields, (*_key(r)[:-1], category, f"{ms:.4f}", *rest), strict=True))
               for r in rows for category, ms, *rest in r.get("_kernels", [])]
    write_csv(out / "bench_train_kernels.csv", listing, fields)
    write_csv(out / "bench_train.csv", rows,
              list(dict.fromkeys(k for r in rows for k in r if k != "_kernels")))
    base, last = _baseline(), _last()
    lines = [f"# Training step, whole model\n\n{header}\n",
             "| task | mixer | T | impl | step ms | tokens/s (M) | peak GiB | first step s | vs eaf2b28 "
             "| vs FLA step | mixer op / loss / conv / matmul / rest (ms) "
             "| saved GiB: mixer / mlp / norms / rest |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    fla = {(r["task"], r["mixer"], r["T"]): r for r in rows if r["impl"].startswith("fla") and "step_ms" in r}
    # the label of train.py's form now, per device type: read from the configs once a table
    current = {}
    for kind in ("cpu", "cuda"):
        compiled, lean, graphs = default_form(torch.device(kind))
        current[kind] = _label("ours", lean, compiled, graphs=graphs)
    for r in rows:
        layers = r.get("layers", 2)
        name = r["mixer"] if layers == 2 else f"{r['mixer']} ({layers} layers)"
        if "step_ms" not in r:
            lines.append(f"| {r['task']} | {name} | {r['T']} | {r['impl']} | {r.get('error', '?')} "
                         "| | | | | | | |")
            continue
        old = last.get((r["impl"], r["task"], r["mixer"], r["T"])) if _anchored(r) else None
        ratio = f"{r['step_ms'] / float(old['step_ms']):.2f}x of {old['step_ms']}" if old else ""
        other = fla.get((r["task"], r["mixer"], r["T"]))
        vs_fla = f"{r['step_ms'] / other['step_ms']:.2f}x" if other and r["impl"].startswith("ours") else ""
        split = " / ".join(f"{r[f'{c} ms']:.1f}" for c in CATEGORIES) if f"{CATEGORIES[0]} ms" in r else ""
        peak = r["peak_gib"] if r.get("peak_gib") is not None else "–"
        saved = " / ".join(f"{r[f'saved {k} GiB']:.2f}" for k in SAVED) \
            if f"saved {SAVED[0]} GiB" in r else ""
        impl = r["impl"] + (_default_mark(r, current) if r.get("default") else "")
        lines.append(f"| {r['task']} | {name} | {r['T']} | {impl} | {r['step_ms']:.1f} | "
                     f"{r['tokens_per_s_M']:.2f} | {peak} | {r['first_step_s']} | {ratio} | {vs_fla} "
                     f"| {split} | {saved} |")
    idle = [f"{r['task']} {r['mixer']} T={r['T']} {r['impl']} ({_unprofiled(r):.1f} of "
            f"{r['step_ms']:.1f} ms)" for r in rows
            if "step_ms" in r and _unprofiled(r) > UNPROFILED * r["step_ms"]]
    if idle:
        lines += ["", f"Over {UNPROFILED:.0%} of the step in no kernel (the GPU idle between them; the split "
                  "above accounts for the rest): " + "; ".join(idle)]
    if base and any(_anchored(r) for r in rows):
        lines += ["", "a359d38 (MQAR, B=256, from the training-step issue): " + ", ".join(
            f"{m} T={t}: {r['step_ms']} ms, {r['peak_gib']} GiB" for (m, t), r in sorted(base.items()))]
    (out / "bench_train.md").write_text("\n".join(lines) + "\n")
    if echo:
        print("\n".join(lines))


def _default_mark(row: dict[str, Any], current: dict[str, str]) -> str:
    """A `default` row kept from a commit whose default form was another (`current`: the label of today's,
    per device type) is marked with that commit, so that a table never shows two forms of one cell as the
    default."""
    kind = "cpu" if str(row.get("device", "")).endswith("cores)") else "cuda"
    if row["impl"] == current[kind]:
        return " (default)"
    return f" (default at {str(row.get('measured', '?')).split()[-1]})"


def _error_line(error: BaseException) -> str:
    """The innermost cause of `error` in one line: Hydra's instantiate wraps a layer's own error in a long
    message of its own, and the cause is what names the fix."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = str(error).strip().splitlines() or [""]
    text = lines[0]
    return f"{type(error).__name__}: {text if len(text) <= 200 else text[:199] + '…'}"


class Planned(NamedTuple):
    """One row to measure: `key` as the table keys its rows (_key), the form's switches beside it."""
    key: tuple
    impl: str
    task: str
    mixer: str
    T: int
    pattern: list[str] | None
    compiled: bool
    lean: bool
    graphs: bool
    default: bool
    budget: float | None


def planned(args: argparse.Namespace, models: list[tuple[str, list[str] | None]],
            ours: list[tuple[bool, bool, bool, bool]]) -> list[Planned]:
    """Every row the arguments ask for, in the order they are measured: task, length, model, impl, form."""
    plan = []
    for task in args.tasks:
        for T in args.lengths:
            for mixer, pattern in models:
                for impl in args.impls:
                    if impl == "fla" and (pattern is not None or mixer not in FLA_LAYERS):
                        continue
                    # FLA's layers in their own (eager) form: the reference point
                    forms = ours if impl == "ours" else [(False, False, False, False)]
                    forms = [(c, lean, g, d, None) for c, lean, g, d in forms] + [
                        (True, lean, g, False, b) for c, lean, g, _ in forms if c and impl == "ours"
                        for b in args.memory_budgets]
                    for compiled, lean, graphs, default, budget in forms:
                        label = _label(impl, lean, compiled, budget, args.conv_label, graphs,
                                       tuple(args.recompute))
                        key = _key({"impl": label, "default": default, "task": task, "mixer": mixer,
                                    "layers": len(pattern) if pattern else 2, "T": T, "B": args.batch})
                        plan.append(Planned(key, impl, task, mixer, T, pattern, compiled, lean, graphs,
                                            default, budget))
    return plan


def fla_layers_to_warm(todo: list[Planned]) -> list[tuple[str, str, int]]:
    """(task, mixer, shortest length) of each FLA model with a row still to measure. FLA's autotuners key
    on heads and widths, not the length, so one compile per model serves all its lengths."""
    shortest: dict[tuple[str, str], int] = {}
    for row in todo:
        if row.impl == "fla":
            shortest[(row.task, row.mixer)] = min(row.T, shortest.get((row.task, row.mixer), row.T))
    return [(task, mixer, T) for (task, mixer), T in shortest.items()]


def warm_command(args: argparse.Namespace, task: str, mixer: str, T: int) -> list[str]:
    """The process that compiles one FLA model's autotuning configs untimed (--compile-only)."""
    return [sys.executable, "-m", "benchmarks.step", "--compile-only", "--out", str(args.out / "warm"),
            "--impls", "fla", "--tasks", task, "--mixers", mixer, "--lengths", str(T),
            "--batch", str(args.batch), "--d-model", str(args.d_model), "--device", args.device]


def warm_fla(todo: list[Planned], args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """Compile FLA's kernels for the rows to come, one process per model side by side, before any is timed;
    the models compiled (fla_layers_to_warm), [] where no FLA row is to come.

    FLA autotunes each kernel on its first call, compiling every config in turn: minutes per model in the
    process that times it. Side by side the compiles share the CPU's cores and land in Triton's on-disk
    cache, so the timed process only benchmarks configs it loads. The children keep no autotuning result
    (FLA_CACHE_RESULTS=0): they time nothing, and the timed process chooses alone on the GPU."""
    models = fla_layers_to_warm(todo)
    if not models:
        return models
    env = {**os.environ, "FLA_CACHE_RESULTS": "0"}
    # each child's output to its own file: a pipe left unread while another child is waited on would fill
    # and stall that child's compiles
    logs = args.out / "warm"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    children = []
    for task, mixer, T in models:
        log = logs / f"{task}_{mixer}.log"
        with open(log, "w") as sink:
            child = subprocess.Popen(warm_command(args, task, mixer, T), env=env, stdout=sink,
                                     stderr=subprocess.STDOUT)
        children.append((task, mixer, log, child))
    print(f"compiling FLA's configs for {len(children)} model(s) side by side (--no-warm skips it)",
          flush=True)
    for task, mixer, log, child in children:
        try:
            child.wait(timeout=max(1.0, args.warm_timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            print(f"  fla {mixer} {task}: cut off at --warm-timeout {args.warm_timeout:g} s (its first timed "
                  "step compiles the rest)", flush=True)
            continue
        last = (log.read_text().strip().splitlines() or ["no output"])[-1]
        failed = f" (exit {child.returncode}; {log})" if child.returncode else ""
        print(f"  fla {mixer} {task}: {last}{failed}", flush=True)
    print(f"compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    return models


def compile_fla(todo: list[Planned], args: argparse.Namespace, device: torch.device) -> int:
    """--compile-only: one step of each FLA model asked for, its autotuners compiling every config untimed;
    nothing is measured or written."""
    from benchmarks.speed import compile_each_config

    compile_each_config()
    for task, mixer, T in fla_layers_to_warm(todo):
        t0 = time.perf_counter()
        batch, labels, vocab = task_batch(task, args.batch, T, device)
        model = build("fla", mixer, vocab, args.d_model).to(device)
        step = make_step("fla", model, batch, labels, False,
                         lambda: torch.autocast(device.type, dtype=torch.bfloat16))
        step()
        torch.cuda.synchronize(device)
        print(f"compiled fla {mixer} {task} at T={T} in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for bench_train.{csv,md}")
    parser.add_argument("--mixers", nargs="*", default=MIXERS)
    parser.add_argument("--patterns", nargs="+", default=[], metavar="PATTERN",
                        help="also time hybrid stacks, e.g. 'kda*3,attention' (Kimi Linear's 3:1, 4 layers)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--lengths", nargs="+", type=int, default=[256, 512, 1024, 2048])
    parser.add_argument("--impls", nargs="+", default=None, choices=["ours", "fla"],
                        help="default: ours, and fla where flash-linear-attention is installed")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--variants", nargs="+", default=["default", "eager"],
                        choices=["default", *VARIANTS], help="forms of our step to time")
    parser.add_argument("--compile", action="store_true", help="also time the compiled forms")
    parser.add_argument("--lean", action="store_true", help="also time the lean forms")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--memory-budgets", nargs="+", type=float, default=[], metavar="B",
                        help="also time each compiled form at these trainer.compile_memory_budget values "
                             "(in (0, 1]; rows ours+compile+memB)")
    parser.add_argument("--recompute", nargs="+", choices=list(RECOMPUTABLE), default=[],
                        help="what the plain compiled model recomputes in the backward instead of keeping "
                             "(mixers.model.RECOMPUTABLE): its compiled rows are labelled +recompute-PARTS, "
                             "none of them `default`")
    parser.add_argument("--conv-bwd", choices=BWD_FORMS, default=None,
                        help="the short conv's backward (kernels/triton/conv.py BWD_FORM); a form other than "
                             "the default labels its rows +conv-FORM, none of them `default`")
    parser.add_argument("--conv-impl", choices=conv_ops.CUDA_IMPLS, default=None,
                        help="the short conv on CUDA (kernels/conv.py CUDA_IMPL): the Triton kernels or "
                             "`shifted`, torch ops that torch.compile fuses; one other than the default "
                             "labels its rows +conv-IMPL, none of them `default`")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="our compiled rows with the body replayed as CUDA graphs (torch.compile's "
                             "reduce-overhead mode), labelled +cudagraphs, none of them `default`, without "
                             "the profile's split; CUDA only")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="time FLA's rows without first compiling its autotuning configs side by side, "
                             "one process per model (e.g. where a seeded Triton cache holds its choices)")
    parser.add_argument("--warm-timeout", type=float, default=300.0,
                        help="seconds the side-by-side compiles of FLA's configs may take in all")
    parser.add_argument("--warm-only", action="store_true",
                        help="compile FLA's configs for the missing rows side by side, as before timing, and "
                             "exit without timing or writing a row: on a machine busy training, so that a "
                             "later call times them at once with --no-warm (CUDA, --impls with fla)")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile FLA's configs for the rows asked for, untimed, and exit (what each "
                             "warming process runs; CUDA, --impls fla)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows --out already holds and measure only the missing ones (a table "
                             "filled over several sessions; each row names its date and commit)")
    args = parser.parse_args(argv)
    device = indexed_device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # fla-core alone (the tests' FLA reference loops) has FLA's ops but not its layers
    fla_missing = importlib.util.find_spec("fla") is None or importlib.util.find_spec("fla.layers") is None
    if args.impls is None:
        args.impls = ["ours"] + ["fla"] * (not fla_missing)
        if fla_missing:
            print("no FLA rows: flash-linear-attention is not installed (pip install "
                  "'flash-linear-attention>=0.6' to time its layers beside ours)", flush=True)
    elif "fla" in args.impls and fla_missing:
        parser.error("--impls fla: flash-linear-attention is not installed; pip install "
                     "'flash-linear-attention>=0.6', or leave fla out of --impls")
    if args.compile_only and (device.type != "cuda" or args.impls != ["fla"]):
        parser.error(f"--compile-only compiles FLA's Triton configs on CUDA: give --impls fla on a GPU (here "
                     f"--impls {' '.join(args.impls)} on {device.type})")
    if args.warm_only and (device.type != "cuda" or "fla" not in args.impls or not args.warm):
        parser.error(f"--warm-only compiles FLA's Triton configs on CUDA: give --impls fla on a GPU, without "
                     f"--no-warm (here --impls {' '.join(args.impls)} on {device.type}"
                     f"{', --no-warm' if not args.warm else ''})")
    bad = [b for b in args.memory_budgets if not 0 < b <= 1]
    if bad:
        parser.error(f"--memory-budgets {bad}: each must be in (0, 1], the fraction of the compiled graph's "
                     "saved activations it keeps")
    unknown = sorted(set(args.mixers) - set(MIXERS))
    if unknown:
        parser.error(f"unknown mixer(s) {unknown}; choose from {MIXERS}")
    patterns = [expand(p.split(",")) for p in args.patterns]
    for text, pattern in zip(args.patterns, patterns, strict=True):
        try:
            check_pattern(pattern, len(pattern))
        except ValueError as error:
            parser.error(f"--patterns {text}: {error}")
    models = [(mixer, None) for mixer in args.mixers] + [(pattern_name(p), p) for p in patterns]
    header = (f"{provenance(device)}; B={args.batch}, d_model {args.d_model}, 2 layers (a pattern: its own), "
              f"warmup {args.warmup}, {args.steps} timed steps; "
              f"`python -m benchmarks.step {' '.join(argv if argv is not None else sys.argv[1:])}`")
    names = list(args.variants) + ["compile"] * args.compile + ["lean"] * args.lean \
        + ["lean+compile"] * (args.compile and args.lean)
    ours = variants(names, device)
    args.conv_label = ""
    if args.conv_bwd is not None and device.type != "cuda":
        parser.error(f"--conv-bwd {args.conv_bwd}: the models take the Triton short conv on CUDA only (the "
                     "torch reference on the CPU); run it on the GPU, or leave the flag out")
    if args.conv_impl is not None and device.type != "cuda":
        parser.error(f"--conv-impl {args.conv_impl}: the models take it on CUDA only (the torch reference "
                     "conv on the CPU); run it on the GPU, or leave the flag out")
    if args.cuda_graphs and device.type != "cuda":
        parser.error("--cuda-graphs: CUDA graphs need a CUDA device; run it on the GPU, or leave the flag "
                     "out")
    if args.conv_impl == "shifted" and args.conv_bwd is not None:
        parser.error(f"--conv-impl shifted --conv-bwd {args.conv_bwd}: the shifted taps have no Triton "
                     "backward to choose; give one of the two")
    if args.conv_bwd is not None and args.conv_bwd != triton_conv.BWD_FORM:
        triton_conv.BWD_FORM, args.conv_label = args.conv_bwd, args.conv_bwd
    if args.conv_impl is not None and args.conv_impl != conv_ops.CUDA_IMPL:
        conv_ops.CUDA_IMPL, args.conv_label = args.conv_impl, args.conv_impl
    if args.recompute:
        # a form other than the one train.py takes: none of its compiled rows is `default`
        ours = [(c, lean, g, d and not c) for c, lean, g, d in ours]
    if args.cuda_graphs:
        # every compiled form replayed; the default's rows stay `default` only if train.py replays too
        ours = [(c, lean, c, d and g == c) for c, lean, g, d in ours]
    if args.conv_label:
        # a form other than the one train.py takes: none of its rows is `default`
        ours = [(c, lean, g, False) for c, lean, g, _ in ours]
    rows = load(args.out) if args.resume else []
    here = device_name(device)
    other = sorted(row_devices(args.out, rows) - {here})
    if other:
        parser.error(f"--resume: {args.out} holds rows measured on {', '.join(other)}, and this run is on "
                     f"{here}: resume there, or give this device its own --out (a table is of one device)")
    done = {_key(r) for r in rows}
    measured_by = f"{datetime.date.today()} {commit()}"
    if rows:
        header += (f"; rows kept from earlier runs (--resume): {len(rows)}, each with its date and commit "
                   "in the CSV")
    todo = [row for row in planned(args, models, ours) if row.key not in done]
    if args.compile_only:
        return compile_fla(todo, args, device)
    warmed = warm_fla(todo, args) if "fla" in args.impls and device.type == "cuda" and args.warm else []
    if args.warm_only:
        if not warmed:
            print(f"no FLA row left to measure in {args.out}: nothing to compile", flush=True)
        return 0
    for row_plan in todo:
        impl, task, mixer, T = row_plan.impl, row_plan.task, row_plan.mixer, row_plan.T
        try:
            row = measure(impl, task, mixer, T, args, device, row_plan.compiled, row_plan.lean,
                          row_plan.default, row_plan.pattern, row_plan.budget, row_plan.graphs)
        except Exception as error:  # an OOM or an FLA layer that will not build: recorded
            row = {"impl": row_plan.key[0],
                   "default": row_plan.default,
                   "task": task,
                   "mixer": mixer, "T": T, "B": args.batch,
                   "error": _error_line(error)}
        row["measured"], row["device"] = measured_by, here
        print({k: v for k, v in row.items() if k != "_kernels"}, flush=True)
        rows.append(row)
        # written after every row: a run cut off by a time limit keeps what it measured
        write(rows, args.out, header, echo=False)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    write(rows, args.out, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
