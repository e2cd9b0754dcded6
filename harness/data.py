"""The data a run trains on: the task's generator (tasks/<name>.py) bound to its params, the batch order
as a pure function of the step, and a batch on its device with its scored positions found on the host.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

# tasks/, beside this package
TASKS = Path(__file__).resolve().parents[1] / "tasks"


def _check_kwargs(fn: Callable[..., Any], params: dict[str, Any], task: str) -> None:
    """Raise a one-line ValueError naming each key of `params` that `fn` does not accept, the closest
    accepted one, and all of them."""
    signature = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.values()):
        return
    accepted = [name for name in signature if name not in ("num_examples", "seq_len", "seed")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        named = []
        for key in unknown:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            named.append(f"task.params.{key}={params[key]!r}{hint}")
        raise ValueError(f"{', '.join(named)}: not a parameter of tasks/{task}.py's {fn.__name__}(); its "
                         f"parameters: {', '.join(accepted)}")


def load_task(task: DictConfig) -> tuple[Callable[..., tuple[torch.Tensor, torch.Tensor]], int]:
    """The task's generator, bound to its params, and the vocabulary size the model needs."""
    try:
        module = importlib.import_module(f"tasks.{task.name}")
    except ModuleNotFoundError as error:
        if error.name not in ("tasks", f"tasks.{task.name}"):
            raise
        available = sorted(p.stem for p in TASKS.glob("[!_]*.py"))
        raise ValueError(f"task.name={task.name!r}: no module tasks/{task.name}.py; "
                         f"available: {available}") from None
    # task.params is an open node (harness.config.TaskConfig): its keys and its type are checked here
    if task.params is not None and not OmegaConf.is_dict(task.params):
        raise ValueError(f"task.params={task.params!r}: give the generator's parameters one by one, "
                         f"task.params.<name>=<value> (tasks/{task.name}.py)")
    params = OmegaConf.to_container(task.params, resolve=True) if task.params is not None else {}
    for fn in (module.generate, module.num_tokens):
        _check_kwargs(fn, params, task.name)

    def generate(num_examples: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, labels = module.generate(num_examples, seq_len, seed=seed, **params)
        inputs, labels = torch.as_tensor(inputs, dtype=torch.long), torch.as_tensor(labels, dtype=torch.long)
        if inputs.shape != (num_examples, seq_len) or labels.shape != inputs.shape:
            raise ValueError(f"task {task.name!r} returned inputs {tuple(inputs.shape)} and labels "
                             f"{tuple(labels.shape)}; expected both [{num_examples}, {seq_len}]")
        return inputs, labels

    return generate, int(module.num_tokens(**params))



class EpochSampler:
    """Batch indices as a pure function of the step: a fresh permutation of the train set per epoch.

    Being a function of (seed, step) only, resuming at step s needs no RNG state to reproduce the batches.
    """

    def __init__(self, num_train: int, batch_size: int, seed: int) -> None:
        self.num_train, self.batch_size, self.seed = num_train, batch_size, seed
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            generator = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._perms[epoch] = torch.randperm(self.num_train, generator=generator)
        return self._perms[epoch]

    def indices(self, step: int) -> torch.Tensor:  # [batch_size], for the 0-based optimizer step
        chunks, position, end = [], step * self.batch_size, (step + 1) * self.batch_size
        while position < end:
            epoch, offset = divmod(position, self.num_train)
            take = min(end - position, self.num_train - offset)
            chunks.append(self._perm(epoch)[offset:offset + take])
            position += take
        return torch.cat(chunks)


@dataclass
class Batch:
    """A batch on its device, with the scored positions found on the host (no device read-back needed)."""

    inputs: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [N] flat indices into [B * T] of the labelled positions
    targets: torch.Tensor  # [N] their labels
    sequence: torch.Tensor  # [N] the sequence each belongs to
    per_sequence: torch.Tensor  # [B] labelled positions per sequence
    num_scored: int  # N
    num_sequences_scored: int  # sequences with at least one label


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # pinned + non_blocking: the copy is queued behind the GPU's work instead of waiting for it
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def make_batch(inputs: torch.Tensor, labels: torch.Tensor, device: torch.device) -> Batch:
    """`inputs` [B, T] on the host or already on `device`; `labels` [B, T] on the host (-100: not scored)."""
    flat = labels.reshape(-1)
    positions = (flat != -100).nonzero().squeeze(1)  # [N]
    per_sequence = (labels != -100).sum(-1)  # [B]
    return Batch(
        inputs=inputs if inputs.device.type == device.type else to_device(inputs, device),
        positions=to_device(positions, device), targets=to_device(flat[positions], device),
        sequence=to_device(positions // labels.shape[1], device),
        per_sequence=to_device(per_sequence, device), num_scored=len(positions),
        num_sequences_scored=int((per_sequence > 0).sum()))
