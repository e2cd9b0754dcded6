"""The pieces of a training step and of an evaluation, on a built model: the learning-rate schedule, the
optimizer, the loss at the scored positions, forward and backward, gradient clipping with the non-finite
guard, the eval at every length, and where values first went non-finite. The loop that calls them is
harness/trainer.py. The task's data (`load_task`, `make_batch`, `Batch`) is exported here too, so that a
benchmark builds the very step a run takes from this one module (benchmarks/step.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

import kernels
from harness.data import Batch, load_task, make_batch
from mixers.model import LanguageModel

__all__ = ["Batch", "batch_loss", "clip_and_guard", "eval_batch_size_at", "evaluate", "evaluate_lengths",
           "first_nonfinite", "forward_backward", "load_task", "lr_factor", "make_batch", "make_optimizer"]

def lr_factor(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of optim.lr after `step` scheduler steps: linear warmup, then cosine to min_lr_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(params: list[torch.nn.Parameter], optim: DictConfig) -> torch.optim.AdamW:
    """The run's AdamW (optim.*; benchmarks/step.py times the same one)."""
    return torch.optim.AdamW(
        # decay matrices only: norms' gains and the mixers' 1-d gate parameters keep their scale
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        # fused: one kernel for the whole update, and it takes `found_inf` (clip_and_guard) to skip a
        # non-finite step on the device without the host waiting for the GPU
        lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, fused=True)


def graph_steps(features: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """`features` compiled in reduce-overhead mode, each call a new step to CUDA graph trees: the last
    call's outputs (consumed by then: the loss, an eval batch's sums) may be overwritten by this one's
    replay, instead of the trees keeping them and recording again."""
    def step_features(tokens: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return features(tokens)
    return step_features


def batch_loss(model: LanguageModel, features: Callable[[torch.Tensor], torch.Tensor],
               batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy over the scored positions, hits [N] bool); call under the run's autocast."""
    if batch.num_scored == 0:
        raise ValueError("a batch has no labelled position (every label is -100): the task generated "
                         "nothing to score; check task.params")
    return model.scored_loss(features(batch.inputs), batch.positions, batch.targets)


def forward_backward(model: LanguageModel, features: Callable[[torch.Tensor], torch.Tensor], batch: Batch,
                     optimizer: torch.optim.Optimizer, autocast: Callable[[], Any],
                     value_checks: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's forward and backward: (mean loss over the scored positions, hits [N]), gradients set.
    `value_checks`: let the ops read their inputs back to check values (kernels.value_checks)."""
    with kernels.value_checks(value_checks), autocast():
        loss_sum, hits = batch_loss(model, features, batch)
    loss = loss_sum / batch.num_scored
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return loss.detach(), hits


def clip_and_guard(params: list[torch.nn.Parameter], grad_clip: float | None, loss: torch.Tensor,
                   optimizer: torch.optim.Optimizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip the gradients' norm (None: no clipping) and arm the fused optimizer to skip its next update on
    the device if the loss or the norm is not finite (a NaN gradient would be written into every weight),
    without the host waiting for the GPU. Returns (gradient norm, finite) as device scalars."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip or math.inf)
    finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
    optimizer.found_inf = (~finite).float()
    return grad_norm, finite


@torch.no_grad()
def evaluate(model: LanguageModel, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int,
             device: torch.device, autocast: Callable[[], Any],
             features: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
    """Loss, token accuracy and sequence accuracy over a whole eval set (on the CPU: `labels`), with the
    head at labelled positions only, summed on the device and read back once."""
    model.eval()
    features = features or model.features
    sums = torch.zeros(3, device=device, dtype=torch.float64)  # loss, correct tokens, perfect sequences
    total, scored = 0, 0
    for start in range(0, len(inputs), batch_size):
        batch = make_batch(inputs[start:start + batch_size], labels[start:start + batch_size], device)
        if batch.num_scored == 0:
            continue
        with autocast():
            loss, hits = batch_loss(model, features, batch)
        seq_hits = torch.zeros_like(batch.per_sequence).index_add_(0, batch.sequence, hits.long())
        perfect = ((seq_hits == batch.per_sequence) & (batch.per_sequence > 0)).sum()
        sums += torch.stack([loss.double(), hits.sum().double(), perfect.double()])
        total, scored = total + batch.num_scored, scored + batch.num_sequences_scored
    model.train()
    loss_sum, correct, perfect = sums.tolist()
    total, scored = max(total, 1), max(scored, 1)
    return {"loss": loss_sum / total, "acc": correct / total, "seq_acc": perfect / scored}


def eval_batch_size_at(batch_size: int, seq_len: int, length: int) -> int:
    """Sequences an eval batch at `length` holds: `batch_size` at the training length and below, fewer above
    it in proportion (at least one). A no-grad forward at 2L of the training length's batch would hold twice
    the tokens, and its transients can outgrow the training step's peak."""
    return max(1, batch_size * seq_len // length) if length > seq_len else batch_size


def evaluate_lengths(model: LanguageModel, eval_sets: dict[int, tuple[torch.Tensor, torch.Tensor]],
                     seq_len: int, batch_size: int, device: torch.device, autocast: Callable[[], Any],
                     features: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
    """eval/{loss,acc,seq_acc} at the training length, and eval/{acc,seq_acc}@<len> at every length.

    `batch_size` counts sequences of the training length; a longer eval length takes proportionally fewer
    (eval_batch_size_at), so no eval batch holds more tokens than one at the training length."""
    evals = {}
    for length, (inputs, labels) in eval_sets.items():
        result = evaluate(model, inputs, labels, eval_batch_size_at(batch_size, seq_len, length), device,
                          autocast, features)
        if length == seq_len:
            evals.update({f"eval/{key}": value for key, value in result.items()})
        evals[f"eval/acc@{length}"], evals[f"eval/seq_acc@{length}"] = result["acc"], result["seq_acc"]
    return evals


def first_nonfinite(model: torch.nn.Module, x: torch.Tensor, autocast: Callable[[], Any]) -> str | None:
    """The first parameter, or module output of a forward on `x`, that holds a NaN or an infinity; None if
    all are finite.

    For a forward that raised: huge but finite weights (a step at a diverging lr) can make a mixer's
    internals non-finite (e.g. exp(A_log) overflows, and 0 * inf is NaN), and a kernel that validates its
    inputs then raises before any loss exists. Non-finite values upstream of the raise mean the run
    diverged; none means the error is a real bug.
    """
    for name, parameter in model.named_parameters():
        if not torch.isfinite(parameter).all():
            return f"parameter {name}"
    found: list[str] = []

    def check(name: str, output: Any) -> None:
        tensors = [t for t in (output if isinstance(output, (tuple, list)) else [output])
                   if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not found and any(not torch.isfinite(t).all() for t in tensors):
            found.append(f"the output of {name or 'the model'}")

    # Forward hooks fire as each module returns, innermost first: the first hit is where values broke.
    handles = [module.register_forward_hook(lambda _m, _i, out, name=name: check(name, out))
               for name, module in model.named_modules()]
    try:
        with torch.no_grad(), autocast():
            model(x)
    except Exception:  # the same error again; the hooks have seen what came before it
        pass
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None
