"""What one training step saves for its backward: every saved tensor by module, autograd node, shape, dtype.

    python benchmarks/saved_tensors.py --device cuda                      # B=256 T=1024 as measured
    python benchmarks/saved_tensors.py --device cuda --plain              # the layers' plain autograd
    TRITON_INTERPRET=1 python benchmarks/saved_tensors.py --device cpu --batch 3 --seq-len 128 --bf16

bench_train.py's model (2 layers, d_model 256, the mixers' yamls) on one MQAR batch, its loss (LM head +
cross-entropy at the labelled positions), under bf16 autocast on CUDA (on the CPU with --bf16). The mixers
run their Triton ops (`backend=triton`; on the CPU through Triton's interpreter, which needs
TRITON_INTERPRET=1: this script sets it before triton is imported), so the kernels' autograd Function and
what it keeps are the real ones. A saved tensor is attributed to the innermost module running when autograd
packed it and named by the autograd node that holds it (found by walking the graph from the loss); each
storage is counted once. Sizes are scaled from the measured --batch x --seq-len to --scale-batch x
--scale-len (a tensor scales when its first dimension is the batch or the batch's tokens, weights and their
casts do not: choose a --batch and a --batch x --seq-len that are no width of the model, e.g. 3 x 128).

The CPU's autocast is not CUDA's: CUDA runs `normalize` in fp32 (its output too), the CPU in bf16, and the
CPU's RMSNorm is composed of saved elementwise ops where CUDA's is one fused node; the GPU run is the
measurement, the CPU run the itemisation to read the glue from.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    # the Triton kernels on the CPU: the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from benchmarks.bench_train import SAVED, indexed_device, saved_storages  # noqa: E402
from mixers.model import LanguageModel  # noqa: E402

GIB = 2**30


def build(mixer: str, vocab: int, d_model: int, backend: str, lean: bool) -> LanguageModel:
    cfg = OmegaConf.load(ROOT / "conf" / "mixer" / f"{mixer}.yaml")
    if "backend" in cfg:
        cfg.backend = backend
    return LanguageModel(vocab, cfg, d_model=d_model, num_layers=2, mixer_name=mixer, lean_backward=lean)


def _node_tensors(node: Any) -> list[torch.Tensor]:
    """The tensors an autograd node holds for its backward (built-in nodes' _saved_* attributes, a custom
    Function's saved_tensors)."""
    found: list[torch.Tensor] = []
    if hasattr(node, "saved_tensors"):
        try:
            found += [t for t in node.saved_tensors if isinstance(t, torch.Tensor)]
        except RuntimeError:
            pass
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
    task_cfg = OmegaConf.load(ROOT / "conf" / "task" / "mqar.yaml")
    task_cfg.seq_len = args.seq_len
    generate, vocab = train.load_task(task_cfg)
    inputs, labels = generate(args.batch, args.seq_len, seed=0)
    batch = train.make_batch(inputs, labels, device)
    torch.manual_seed(0)
    model = build(mixer, vocab, args.d_model, args.backend, lean=not args.plain).to(device)
    bf16 = device.type == "cuda" or args.bf16
    with saved_storages(model) as live, torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss_sum, _ = train.batch_loss(model, model.features, batch)
    nodes = node_names(loss_sum)
    tokens = args.batch * args.seq_len
    factor = args.scale_batch * args.scale_len / tokens
    rows = []
    for row in live:
        shape = row["shape"]
        scales = bool(shape) and shape[0] in (args.batch, tokens)
        row["nodes"] = ",".join(sorted(nodes.get(row["ptr"], {"?"})))
        row["scaled_bytes"] = row["bytes"] * (factor if scales else 1)
        rows.append(row)
    return rows


def _layer0(module: str) -> str:
    return module.removeprefix("blocks.0.")


def split_gib(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Scaled GiB saved by each part (mixer / mlp / norms / rest)."""
    return {part: sum(r["scaled_bytes"] for r in rows if r["part"] == part) / GIB for part in SAVED}


def table(mixer: str, rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    split = split_gib(rows)
    name = mixer + (" (plain)" if args.plain else "")
    out = [f"## {name}: saved GiB at B={args.scale_batch} T={args.scale_len} (measured at B={args.batch} "
           f"T={args.seq_len}): " + " / ".join(f"{p} {split[p]:.2f}" for p in SAVED)
           + f", total {sum(split.values()):.2f}", "",
           "layer 0 (blocks.0.*; layer 1 saves the same), every saved storage:", "",
           "| module | autograd node(s) | shape (measured) | dtype | MiB scaled |", "|---|---|---|---|---:|"]
    for r in rows:
        if r["module"].startswith("blocks.0."):
            out.append(f"| {_layer0(r['module'])} | {r['nodes']} | {list(r['shape'])} | {r['dtype']} "
                       f"| {r['scaled_bytes'] / 2**20:.0f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = parser.parse_args(argv)
    device = indexed_device(args.device)
    splits = {}
    for mixer in args.mixers:
        rows = saved_tensors(mixer, args, device)
        print(table(mixer, rows, args))
        splits[mixer] = split_gib(rows)
    return splits


if __name__ == "__main__":
    main()
