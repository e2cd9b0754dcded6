"""The LM head and cross-entropy at the labelled positions only, without a `[tokens, vocab]` logits tensor.

The synthetic tasks score a fraction of the positions (MQAR its queries, Palindrome its second half), and
their vocabularies reach 8192 ids: full fp32 logits of a `[256, 1024]` batch are 8 GiB before the softmax
and its gradient. Here the caller gathers the final hidden states of the scored positions (`[N, D]`), and
`linear_cross_entropy` runs the head and the loss over them in blocks of rows: each block's logits live
only inside the loop, and with a gradient wanted the block's gradients with respect to the hidden states and
the head's weight are computed right there, so the backward only scales them.

After each block's matmul, the softmax, its gradient and the argmax are either a chain of torch ops
(`impl="torch"`, every device) or one Triton kernel that reads each row once (rows it can hold whole) or
twice and writes the gradient over the logits in place (`impl="triton"`, kernels/triton/cross_entropy.py;
`"auto"` takes it on CUDA): at
MQAR's 8,192 ids the torch chain is a dozen full passes over fp32 copies of the logits.

The slow, obvious reference is `F.cross_entropy(hidden @ weight.T, targets, reduction="sum")`
(tests/test_loss.py checks loss, hits and both gradients of both paths against it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Logits per block, as elements: 2**25 (the torch chain's fp32 copies, 128 MiB each: 4,096 rows at 8,192
# ids) or 2**27 (the kernel's one bf16 block, 256 MiB). A block costs a dozen launches whatever its size, so
# a small vocabulary takes all its rows in one block (Palindrome's 64 ids: 130k rows, not 32 blocks).
BLOCK_ELEMENTS = {"torch": 1 << 25, "triton": 1 << 27}


def default_block_rows(vocab: int, triton_kernel: bool) -> int:
    return max(1, BLOCK_ELEMENTS["triton" if triton_kernel else "torch"] // vocab)


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    # under autocast the head's matmul runs in the autocast dtype, as nn.Linear would; the softmax in fp32
    if torch.is_autocast_enabled(hidden.device.type):
        return torch.get_autocast_dtype(hidden.device.type)
    return hidden.dtype


IMPLS = ("auto", "torch", "triton")


def _softmax_block(logits: torch.Tensor, target: torch.Tensor, acc: torch.dtype,
                   wants_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The torch chain: (summed loss, hits, softmax - onehot in the logits' dtype or None) of one block."""
    dtype = logits.dtype
    logits = logits.to(acc)
    lse = torch.logsumexp(logits, dim=-1)  # [n]
    picked = logits.gather(1, target[:, None])[:, 0]
    hits = logits.argmax(-1) == target
    if not wants_grad:
        return (lse - picked).sum(), hits, None
    # d(lse - logit_y)/dlogits = softmax - onehot(y), formed in place of the logits
    grad = logits.sub_(lse[:, None]).exp_()
    grad.scatter_add_(1, target[:, None], grad.new_full((len(target), 1), -1.0))
    return (lse - picked).sum(), hits, grad.to(dtype)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, block_rows, impl):  # [N, D], [V, D], [N]
        dtype = _compute_dtype(hidden)
        # the kernel computes in fp32: fp64 (the tests' references) keeps the torch chain
        triton_kernel = impl == "triton" or (impl == "auto" and hidden.is_cuda and dtype != torch.float64)
        block_rows = block_rows or default_block_rows(weight.shape[0], triton_kernel)
        wants_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        # the softmax in fp32 at least (fp64 inputs, as in the tests' references, stay fp64)
        acc = torch.promote_types(dtype, torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            n = hidden.shape[0]
            grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
            grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) \
                if ctx.needs_input_grad[1] else None
            if triton_kernel:
                from kernels.triton.cross_entropy import ce_rows, row_buffers

                # the kernel writes each row's lse, target logit and argmax here: one sum at the end
                rowwise = row_buffers(n, hidden.device)
            else:
                loss = hidden.new_zeros((), dtype=acc)
                hits = torch.empty(n, dtype=torch.bool, device=hidden.device)
            for start in range(0, n, block_rows):
                rows = slice(start, start + block_rows)
                h = hidden[rows].to(dtype)  # [n, D]
                logits = h @ w.T
                if triton_kernel:
                    ce_rows(logits, targets[rows], wants_grad, out=tuple(t[rows] for t in rowwise))
                    grad = logits if wants_grad else None
                else:
                    block_loss, hits[rows], grad = _softmax_block(logits, targets[rows], acc, wants_grad)
                    loss += block_loss
                if grad is not None:
                    if grad_hidden is not None:
                        grad_hidden[rows] = (grad @ w).to(hidden.dtype)
                    if grad_weight is not None:
                        grad_weight += (grad.T @ h).to(acc)
            if triton_kernel:
                lse, picked, argmax = rowwise
                loss = (lse - picked).sum().to(acc)
                hits = argmax == targets
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(hits)
        return loss, hits

    @staticmethod
    def backward(ctx, grad_loss, _grad_hits):
        grad_hidden, grad_weight = ctx.saved_tensors
        dh = None if grad_hidden is None else grad_hidden * grad_loss.to(grad_hidden.dtype)
        dw = None if grad_weight is None else (grad_weight * grad_loss).to(ctx.weight_dtype)
        return dh, dw, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,  # [N, D], the final hidden states of the scored positions
    weight: torch.Tensor,  # [V, D], the LM head's weight
    targets: torch.Tensor,  # [N] int64, each in [0, V)
    block_rows: int | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (the summed cross-entropy: a float32 scalar, float64 for float64 inputs; hits [N] bool:
    whether argmax == target).

    Differentiable in `hidden` and `weight`. Divide the sum by N for the mean over scored positions.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: hidden {list(hidden.shape)} and weight {list(weight.shape)} "
                         "must be [N, D] and [V, D] with the same D")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"linear_cross_entropy: targets {list(targets.shape)} must be [N] = "
                         f"[{hidden.shape[0]}], one per row of hidden")
    if block_rows is not None and block_rows < 1:
        raise ValueError(f"linear_cross_entropy: block_rows={block_rows} must be >= 1")
    if impl not in IMPLS:
        raise ValueError(f"linear_cross_entropy: impl={impl!r}; choose one of {IMPLS}")
    return _LinearCrossEntropy.apply(hidden, weight, targets, block_rows, impl)


def reference_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor,
                            targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The obvious form on the full logits (what `linear_cross_entropy` must equal)."""
    logits = hidden @ weight.T
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, targets, reduction="sum"), logits.argmax(-1) == targets
