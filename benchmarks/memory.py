"""What one training step keeps for its backward: every saved tensor by module, autograd node, shape, dtype.

    python -m benchmarks.memory --device cuda                      # B=256 T=1024 as measured
    python -m benchmarks.memory --device cuda --plain              # the layers' plain autograd
    python -m benchmarks.memory --device cuda --plain --compiled   # the default step's compiled graph
    TRITON_INTERPRET=1 python -m benchmarks.memory --device cpu --batch 3 --seq-len 128 --bf16

The model of `benchmarks.step` (2 layers, d_model 256, the mixers' yamls) on one MQAR batch, its loss (LM
head + cross-entropy at the labelled positions), under bf16 autocast on CUDA (on the CPU with --bf16). The
mixers run their Triton ops (`backend=triton`; on the CPU through Triton's interpreter, which needs
TRITON_INTERPRET=1: set here before triton is imported), so the kernels' autograd Function and what it
keeps are the real ones. A saved tensor is attributed to the innermost module running when autograd packed
it and named by the autograd node that holds it (found by walking the graph from the loss); each storage is
counted once. Sizes are scaled from the measured --batch x --seq-len to --scale-batch x --scale-len (a
tensor scales when its first dimension is the batch or the batch's tokens, weights and their casts do not:
choose a --batch and a --batch x --seq-len that are no width of the model, e.g. 3 x 128).

With --compiled, the body as `torch.compile` runs it (the default step on CUDA): there inductor's partition
decides what is kept, and autograd sees one node holding all of it. Inductor traces and partitions the
body at --scale-batch x --scale-len on fake tensors and nothing runs (seconds, on any machine); each saved
value is attributed to the module it was computed in (the trace's nn_module_stack). The step benchmark's
compiled rows add the storages kept outside the graph (head + loss) to these.

The CPU's autocast is not CUDA's: the CPU's RMSNorm is composed of saved elementwise ops where CUDA's is
one fused node (the L2 norm agrees: the layers widen q, k to fp32 ahead of it on both); the GPU run is the
measurement, the CPU run the itemisation to read the glue from. `saved_storages` is the measuring tool
the step benchmark and the tests share.
"""

from __future__ import annotations

import argparse
import contextlib
import operator
import os
import re
import sys
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

if __name__ == "__main__" and (
        "--device" in sys.argv[:-1] and sys.argv[sys.argv.index("--device") + 1] == "cpu"):
    # the Triton kernels on the CPU: the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.common import indexed_device  # noqa: E402
from harness import step as train  # noqa: E402
from mixers.model import RECOMPUTABLE  # noqa: E402

GIB = 2**30
SAVED = ["mixer", "mlp", "norms", "rest"]


def _saved_part(path: str) -> str:
    # a module path of LanguageModel: blocks.<i>.mixer..., blocks.<i>.mlp..., *norm*; the rest (embedding,
    # the scored positions' gather, the head + loss) outside any of them
    parts = path.split(".")
    if len(parts) >= 3 and parts[0] == "blocks":
        return "norms" if "norm" in parts[2] else parts[2] if parts[2] in ("mixer", "mlp") else "rest"
    return "norms" if parts[0] == "norm" else "rest"


@contextlib.contextmanager
def module_stack(model: nn.Module) -> Iterator[list[str]]:
    """The path of the module running now, innermost last (empty outside every module), kept by forward
    hooks on every submodule for as long as the context lasts."""
    stack: list[str] = []
    handles = []
    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(lambda m, a, n=name: stack.append(n) and None))
            handles.append(module.register_forward_hook(lambda m, a, o, n=name: stack.pop() and None))
    try:
        yield stack
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def saved_storages(model: nn.Module | None = None,
                   keep: Callable[[torch.Tensor], bool] | None = None) -> Iterator[list[dict[str, Any]]]:
    """Every storage autograd keeps for the backward of the graph built inside the context, once each, with
    the module of `model` that saved it first ("(top)" outside them, or without a model); `keep`, if given,
    chooses at pack time which saved tensors count. The list yielded is filled when the backward starts
    (its first unpack) or, if none runs, when the context exits. Only tensors still held then count: a
    temporary that a freed node saved is dropped, and a later tensor given its address is neither lost nor
    counted twice."""
    entries: list[tuple[weakref.ref[torch.Tensor], str]] = []
    live: list[dict[str, Any]] = []
    done = False

    def snapshot() -> None:
        nonlocal done
        done = True
        seen: set[int] = set()
        for ref, module in entries:
            t = ref()
            if t is None:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            live.append({"module": module or "(top)", "part": _saved_part(module) if module else "rest",
                         "ptr": storage.data_ptr(), "shape": tuple(t.shape),
                         "dtype": str(t.dtype).removeprefix("torch."), "bytes": storage.nbytes()})

    with module_stack(model) if model is not None else contextlib.nullcontext([]) as stack:

        def pack(t: torch.Tensor) -> torch.Tensor:
            # a detached alias: a node saving its own output, packed as itself, would be a reference cycle
            # through its grad_fn that nothing frees, so every temporary would look held
            alias = t.detach()
            if keep is None or keep(t):
                entries.append((weakref.ref(alias), stack[-1] if stack else ""))
            return alias

        def unpack(t: torch.Tensor) -> torch.Tensor:
            if not done:
                snapshot()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield live
    if not done:
        snapshot()


def saved_split(model: nn.Module, step: Callable[[], None]) -> dict[str, float]:
    """GiB of tensors one step keeps for its backward, by the module that saved them (each storage once):
    what the activation memory is made of. Buffers an op keeps outside autograd's saved tensors (ctx
    attributes) are not seen; the peak includes them."""
    with saved_storages(model) as live:
        step()
    return split_gib(live, "bytes")


class _Traced(Exception):
    """Raised by `recording_backend(stop=True)` once the forward graph is recorded: nothing is generated."""


def _module_path(node: torch.fx.Node) -> str:
    # the innermost module in the trace's nn_module_stack, written as named_modules() writes it:
    # "L['self'].blocks[0].mixer" or "L['self'].blocks.0.mixer" -> "blocks.0.mixer" ("" outside every module)
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    path = re.sub(r"^(L\[['\"](self|fn)['\"]\]|self)", "", path)
    return re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path).strip(".")


def _viewed(node: torch.fx.Node) -> torch.fx.Node | None:
    """The value `node` is a view of (its op's first return aliases its first input), else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    returns = target._schema.returns
    alias = returns[0].alias_info if returns else None
    if alias is None or alias.is_write or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    return node.args[0]


def _op_name(node: torch.fx.Node) -> str:
    """The op that computed `node`; an element of a multi-output op as op[i] (the chunk op's kept buffers
    by their names in kernels/triton/chunk.py's Saved)."""
    indices: list[int] = []
    while node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0],
                                                                                          torch.fx.Node):
        indices.insert(0, int(node.args[1]))
        node = node.args[0]
    name = str(node.target)
    if name.startswith("kda_harness.chunk_fwd") and len(indices) == 2 and indices[0] == 2:
        from kernels.triton.chunk import Saved

        return f"chunk_fwd: Saved.{Saved._fields[indices[1]]}"
    return name + "".join(f"[{i}]" for i in indices)


def graph_saved(graph: torch.fx.GraphModule, user_outputs: int) -> list[dict[str, Any]]:
    """The values a compiled forward graph hands its backward (its outputs past the first `user_outputs`),
    one row per storage: a saved view counts as the value it views, once. The graph's inputs (parameters,
    the tokens) are live anyway and not listed. Module: where the value was computed (the trace's
    nn_module_stack; "(top)" outside every module, as the weights' casts)."""
    output = next(n for n in graph.graph.nodes if n.op == "output")
    rows: dict[str, dict[str, Any]] = {}
    for node in pytree.tree_leaves(output.args[0])[user_outputs:]:
        if not isinstance(node, torch.fx.Node):
            continue  # a saved size (dynamic shapes), no storage
        root = node
        while (base := _viewed(root)) is not None:
            root = base
        value = root.meta.get("val")
        if root.op == "placeholder" or not isinstance(value, torch.Tensor) or root.name in rows \
                or value.untyped_storage().nbytes() == 0:  # (an absent buffer's empty placeholder)
            continue
        module = _module_path(root) or _module_path(node)
        rows[root.name] = {"module": module or "(top)", "part": _saved_part(module) if module else "rest",
                           "name": root.name, "op": _op_name(root),
                           "shape": tuple(int(s) for s in value.shape),
                           "dtype": str(value.dtype).removeprefix("torch."),
                           "bytes": int(value.untyped_storage().nbytes())}
    return list(rows.values())


def recording_backend(rows: list[dict[str, Any]], stop: bool = False) -> Callable[..., Any]:
    """A torch.compile backend: inductor, with every compiled forward graph's saved values (`graph_saved`)
    appended to `rows` as inductor's partitioner chose them. With `stop`, the compile ends there (raising
    `_Traced` inside torch.compile): the graph is traced on fake tensors, so nothing runs or is allocated
    and the step's real sizes cost seconds on any machine."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        user_outputs = len(pytree.tree_leaves(output.args[0]))

        def inner(graph: torch.fx.GraphModule, inputs: list[Any], **kwargs: Any) -> Any:
            # the backward graph takes the forward's saved values and the outputs' gradients (tangents_*)
            if not any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.graph.nodes):
                rows.extend(graph_saved(graph, user_outputs))
                if stop:
                    raise _Traced
            return compile_fx_inner(graph, inputs, **kwargs)

        return compile_fx(gm, example_inputs, inner_compile=inner)

    return backend


def compiled_rows(fn: Callable[..., Any], inputs: tuple[Any, ...],
                  autocast: Callable[[], Any]) -> list[dict[str, Any]]:
    """What `torch.compile(fn)` keeps for its backward when called on `inputs`, traced and partitioned by
    inductor without running (`recording_backend(stop=True)`). Resets dynamo before and after."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    rows: list[dict[str, Any]] = []
    compiled = torch.compile(fn, backend=recording_backend(rows, stop=True))
    try:
        # a cached graph would come back compiled without reaching the recording inner compile
        with functorch_config.patch(enable_autograd_cache=False), \
                inductor_config.patch(fx_graph_cache=False), autocast():
            compiled(*inputs)
    except torch._dynamo.exc.BackendCompilerFailed as error:
        if not isinstance(error.inner_exception, _Traced):
            raise
    finally:
        torch._dynamo.reset()
    if not rows:
        raise RuntimeError("compiled_rows: inductor compiled no forward graph with a backward here")
    return rows


def outside_graph(model: nn.Module, features: Callable[[torch.Tensor], torch.Tensor], batch: train.Batch,
                  autocast: Callable[[], Any]) -> list[dict[str, Any]]:
    """The storages a step with a compiled `features` keeps for its backward outside the compiled graph
    (the head + loss, the scored positions' gather): every saved storage but the compiled graph's."""
    with saved_storages(model) as live, autocast():
        loss_sum, _ = train.batch_loss(model, features, batch)
        nodes = node_names(loss_sum)
    return [r for r in live
            if not any(name.startswith("CompiledFunction") for name in nodes.get(r["ptr"], ()))]


def _node_tensors(node: Any) -> list[torch.Tensor]:
    """The tensors an autograd node holds for its backward (built-in nodes' _saved_* attributes, a custom
    Function's saved_tensors)."""
    found: list[torch.Tensor] = []
    if hasattr(node, "saved_tensors"):
        with contextlib.suppress(RuntimeError):
            found += [t for t in node.saved_tensors if isinstance(t, torch.Tensor)]
    for name in dir(node):
        if not name.startswith("_saved_"):
            continue
        try:
            value = getattr(node, name)
        except RuntimeError:
            continue
        values = value if isinstance(value, (tuple, list)) else (value,)
        found += [t for t in values if isinstance(t, torch.Tensor)]
    return found


def node_names(loss: torch.Tensor) -> dict[int, set[str]]:
    """storage data_ptr -> names of the autograd nodes that saved a tensor on it."""
    names: dict[int, set[str]] = defaultdict(set)
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for t in _node_tensors(node):
            names[t.untyped_storage().data_ptr()].add(type(node).__name__)
        todo += [next_node for next_node, _ in node.next_functions]
    return names


def saved_tensors(mixer: str, args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """One row per saved storage: module, part (mixer / mlp / norms / rest), nodes, shape, dtype, bytes."""
    from benchmarks import step  # (it imports this module: the step's rows carry saved_split)

    batch, _, vocab = step.task_batch("mqar", args.batch, args.seq_len, device)
    torch.manual_seed(0)
    model = step.build("ours", mixer, vocab, args.d_model, not args.plain, backend=args.backend).to(device)
    bf16 = device.type == "cuda" or args.bf16
    with saved_storages(model) as live, torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss_sum, _ = train.batch_loss(model, model.features, batch)
    nodes = node_names(loss_sum)
    tokens = args.batch * args.seq_len
    factor = args.scale_batch * args.scale_len / tokens
    for row in live:
        scales = bool(row["shape"]) and row["shape"][0] in (args.batch, tokens)
        row["nodes"] = ",".join(sorted(nodes.get(row["ptr"], {"?"})))
        row["scaled_bytes"] = row["bytes"] * (factor if scales else 1)
    return live


def split_gib(rows: list[dict[str, Any]], size: str = "scaled_bytes") -> dict[str, float]:
    """GiB saved by each part (mixer / mlp / norms / rest), each row counted by its `size` field."""
    return {part: sum(r[size] for r in rows if r["part"] == part) / GIB for part in SAVED}


def _report(heading: str, split: dict[str, float], columns: tuple[str, str, str],
            rows: list[dict[str, Any]], node: Callable[[dict[str, Any]], str], size: str) -> str:
    """The split on the heading's line, then every storage of layer 0: module, `node`, shape, dtype, MiB
    (`columns` names the node, shape and size columns)."""
    node_col, shape_col, size_col = columns
    out = [f"## {heading}: " + " / ".join(f"{p} {split[p]:.2f}" for p in SAVED)
           + f", total {sum(split.values()):.2f}", "",
           "layer 0 (blocks.0.*; layer 1 saves the same), every saved storage:", "",
           f"| module | {node_col} | {shape_col} | dtype | {size_col} |", "|---|---|---|---|---:|"]
    out += [f"| {r['module'].removeprefix('blocks.0.')} | {node(r)} | {list(r['shape'])} | {r['dtype']} "
            f"| {r[size] / 2**20:.0f} |" for r in rows if r["module"].startswith("blocks.0.")]
    return "\n".join(out) + "\n"


def table(mixer: str, rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    name = mixer + (" (plain)" if args.plain else "")
    heading = (f"{name}: saved GiB at B={args.scale_batch} T={args.scale_len} (measured at B={args.batch} "
               f"T={args.seq_len})")
    return _report(heading, split_gib(rows), ("autograd node(s)", "shape (measured)", "MiB scaled"), rows,
                   lambda r: r["nodes"], "scaled_bytes")


def compiled_table(mixer: str, args: argparse.Namespace,
                   device: torch.device) -> tuple[str, dict[str, float]]:
    """The compiled body's saved values at --scale-batch x --scale-len, traced there (nothing runs)."""
    from benchmarks import step

    batch, _, vocab = step.task_batch("mqar", args.scale_batch, args.scale_len, device)
    torch.manual_seed(0)
    model = step.build("ours", mixer, vocab, args.d_model, not args.plain, backend=args.backend,
                       recompute=tuple(args.recompute)).to(device)
    bf16 = device.type == "cuda" or args.bf16
    budget = 1.0 if args.memory_budget is None else args.memory_budget
    with functorch_config.patch(activation_memory_budget=budget):
        rows = compiled_rows(model.features, (batch.inputs,),
                             lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16))
    split = split_gib(rows, "bytes")
    name = mixer + (" (plain)" if args.plain else "") + (f", memory budget {budget:g}"
                                                          if args.memory_budget is not None else "")
    heading = (f"{name}, compiled: the graph's saved GiB at B={args.scale_batch} T={args.scale_len} "
               "(traced at that size by inductor, not run; the head + loss outside the graph not included)")
    return _report(heading, split, ("graph node (op)", "shape", "MiB"), rows,
                   lambda r: f"{r['name']} ({r['op']})", "bytes"), split


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixers", nargs="+", default=["kda", "gdn", "mamba2"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--scale-batch", type=int, default=256)
    parser.add_argument("--scale-len", type=int, default=1024)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--backend", default="triton", help="the mixers' op backend (default: triton)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on the CPU too (always on CUDA)")
    parser.add_argument("--plain", action="store_true",
                        help="the plain layers (model.lean_backward off, the training default), to compare")
    parser.add_argument("--compiled", action="store_true",
                        help="what torch.compile's graph of the body keeps (the default step on CUDA), "
                             "traced by inductor at --scale-batch x --scale-len without running")
    parser.add_argument("--memory-budget", type=float, default=None,
                        help="with --compiled: trainer.compile_memory_budget, in (0, 1] "
                             "(default: torch's, 1)")
    parser.add_argument("--recompute", nargs="+", choices=list(RECOMPUTABLE), default=[],
                        help="with --compiled --plain: what the model recomputes in the backward instead of "
                             "keeping (mixers.model.RECOMPUTABLE)")
    args = parser.parse_args(argv)
    if args.memory_budget is not None and not (args.compiled and 0 < args.memory_budget <= 1):
        parser.error(f"--memory-budget {args.memory_budget}: give a value in (0, 1], with --compiled")
    if args.recompute and not (args.compiled and args.plain):
        parser.error(f"--recompute {' '.join(args.recompute)}: it changes the plain model's compiled "
                     "graph only; add --compiled --plain")
    device = indexed_device(args.device)
    splits = {}
    for mixer in args.mixers:
        if args.compiled:
            text, splits[mixer] = compiled_table(mixer, args, device)
            print(text)
            continue
        rows = saved_tensors(mixer, args, device)
        print(table(mixer, rows, args))
        splits[mixer] = split_gib(rows)
    return splits


if __name__ == "__main__":
    main()
