"""The softmax cross-entropy of a block of logits rows in one kernel (the elementwise half of mixers/loss.py).

mixers/loss.py forms each block of logits with a matmul. What follows the matmul is a memory-bound chain
in torch: the logits cast to fp32, logsumexp (itself max, subtract, exp, sum, log), gather, argmax, the
subtraction and exponential of the gradient and its cast back, each a full pass over the block. Here one
program owns one row. A row of up to WHOLE_ROW_LIMIT columns (padded to a power of two) is read
once and held: max, exponentials, their sum, and (only when a gradient is wanted) d(lse - x_y)/dx =
softmax(x) - onehot(y) written over the logits, in place and in their dtype. Otherwise a row is read twice:
a first pass keeps, per lane, the running max, the sum of exponentials rescaled to it and the first index
of the max; the second writes the gradient.

Results per row: lse, x_y (the target's logit) and argmax, in fp32 / int32. The reference is the torch
chain in mixers/loss.py (`impl="torch"`); tests/test_loss.py compares the two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _ce_rows_kernel(
    logits,  # [n, V], row stride `stride`; overwritten with the gradient when WANT_GRAD
    targets,  # [n] int64, each in [0, V)
    lse_out,  # [n] fp32
    picked_out,  # [n] fp32
    argmax_out,  # [n] int32
    V,
    stride,
    WANT_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits + row * stride
    lanes = tl.arange(0, BLOCK_V)
    run_max = tl.full([BLOCK_V], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_V], tl.float32)
    arg = tl.zeros([BLOCK_V], tl.int32)
    for start in range(0, V, BLOCK_V):
        cols = start + lanes
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(run_max, x)
        # a lane that has seen only -inf (past V) keeps a zero sum instead of exp(-inf + inf) = nan
        scale = tl.where(run_max == new_max, 1.0, tl.exp(run_max - new_max))
        term = tl.where(x == new_max, 1.0, tl.exp(x - new_max))
        run_sum = tl.where(new_max == float("-inf"), 0.0, run_sum * scale + term)
        # strictly greater: a lane keeps the first column of its max, columns being visited in order
        arg = tl.where(x > run_max, cols, arg)
        run_max = new_max
    row_max = tl.max(run_max, 0)
    total = tl.sum(tl.where(run_max == float("-inf"), 0.0, run_sum * tl.exp(run_max - row_max)), 0)
    lse = row_max + tl.log(total)
    # the first column holding the row's max, as torch.argmax returns
    first = tl.min(tl.where(run_max == row_max, arg, V), 0)
    target = tl.load(targets + row)
    picked = tl.load(base + target).to(tl.float32)
    tl.store(lse_out + row, lse)
    tl.store(picked_out + row, picked)
    tl.store(argmax_out + row, first)
    if WANT_GRAD:
        for start in range(0, V, BLOCK_V):
            cols = start + lanes
            mask = cols < V
            x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            grad = tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)
            tl.store(base + cols, grad.to(logits.dtype.element_ty), mask=mask)


@triton.jit
def _ce_whole_row_kernel(
    logits,  # [n, V], row stride `stride`; overwritten with the gradient when WANT_GRAD
    targets,  # [n] int64, each in [0, V)
    lse_out,  # [n] fp32
    picked_out,  # [n] fp32
    argmax_out,  # [n] int32
    V,
    stride,
    WANT_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,  # >= V
):
    row = tl.program_id(0).to(tl.int64)
    base = logits + row * stride
    cols = tl.arange(0, BLOCK_V)
    mask = cols < V
    x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32)
    row_max = tl.max(x, 0)
    e = tl.exp(x - row_max)
    lse = row_max + tl.log(tl.sum(e, 0))
    # the first column holding the row's max, as torch.argmax returns
    first = tl.min(tl.where(x == row_max, cols, V), 0)
    target = tl.load(targets + row)
    picked = tl.sum(tl.where(cols == target, x, 0.0), 0)
    tl.store(lse_out + row, lse)
    tl.store(picked_out + row, picked)
    tl.store(argmax_out + row, first)
    if WANT_GRAD:
        # softmax from the exponentials already taken: one read and one write of the row in all
        grad = e * tl.exp(row_max - lse) - tl.where(cols == target, 1.0, 0.0)
        tl.store(base + cols, grad.to(logits.dtype.element_ty), mask=mask)


# A row of at most WHOLE_ROW_LIMIT columns is held whole in registers and read once; longer rows take the
# two-pass kernel above. On Hopper the whole row is the faster for a row that fits one pass of that kernel
# (one warp at Palindrome's 64 columns, where the two passes spread 2,048 lanes over 8 warps) and no faster
# at MQAR's 8,192 (speed loss: triton, triton-whole). The kernel holds up to WHOLE_ROW_MAX (16 fp32 a
# thread over 16 warps at 8,192); 0 sends every row to the two passes.
WHOLE_ROW_MAX = 16384
WHOLE_ROW_LIMIT = 2048
# warps of a whole-row program; None: one per 512 columns (16 fp32 a thread), 1 to 16. The loss benchmark
# times others (triton-whole-wN) to find where the reductions' synchronisation outweighs the registers
WHOLE_ROW_WARPS: int | None = None


def row_buffers(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty (lse, target logit, argmax) buffers for n rows, in the dtypes ce_rows writes."""
    return (torch.empty(n, dtype=torch.float32, device=device),
            torch.empty(n, dtype=torch.float32, device=device),
            torch.empty(n, dtype=torch.int32, device=device))


def ce_rows(logits: torch.Tensor, targets: torch.Tensor, want_grad: bool,
            out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lse [n] fp32, target logit [n] fp32, argmax [n] int32) of `logits` [n, V]; with `want_grad`, the
    logits are overwritten with softmax - onehot(targets) in their own dtype. `out`: three contiguous [n]
    tensors of those dtypes to write into (slices of whole-batch buffers: no per-block reductions)."""
    n, V = logits.shape
    if logits.stride(1) != 1:
        raise ValueError(f"ce_rows: logits of stride {tuple(logits.stride())} must be contiguous along V")
    if out is None:
        out = row_buffers(n, logits.device)
    lse, picked, argmax = out
    for t, dtype in zip(out, (torch.float32, torch.float32, torch.int32), strict=True):
        if t.shape != (n,) or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"ce_rows: out tensors must be contiguous [{n}] of {dtype}, got "
                             f"{list(t.shape)} {t.dtype}")
    if n == 0:
        return lse, picked, argmax
    whole = max(16, triton.next_power_of_2(V))
    if whole <= min(WHOLE_ROW_LIMIT, WHOLE_ROW_MAX):
        warps = WHOLE_ROW_WARPS or max(1, min(16, whole // 512))
        _ce_whole_row_kernel[(n,)](logits, targets, lse, picked, argmax, V, logits.stride(0),
                                   WANT_GRAD=want_grad, BLOCK_V=whole, num_warps=warps)
        return lse, picked, argmax
    # 2,048 columns a pass: 8 KiB fp32 a row in registers over 8 warps
    _ce_rows_kernel[(n,)](logits, targets, lse, picked, argmax, V, logits.stride(0),
                          WANT_GRAD=want_grad, BLOCK_V=2048, num_warps=8)
    return lse, picked, argmax
