"""The LM head + cross-entropy at scored positions (mixers/loss.py) against F.cross_entropy on full logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixers.loss import linear_cross_entropy, reference_cross_entropy


def _inputs(N: int, D: int, V: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = (torch.randn(V, D, generator=generator, dtype=torch.float64) * 0.3).requires_grad_()
    targets = torch.randint(0, V, (N,), generator=generator)
    return hidden, weight, targets


@pytest.mark.parametrize("N,block_rows", [(1, 4), (37, 8), (64, 64), (100, 4096), (53, 1)])
def test_loss_hits_and_gradients_equal_full_logits(N: int, block_rows: int) -> None:
    hidden, weight, targets = _inputs(N, 24, 77)
    loss, hits = linear_cross_entropy(hidden, weight, targets, block_rows=block_rows)
    ref_loss, ref_hits = reference_cross_entropy(hidden, weight, targets)
    # a non-unit upstream gradient: the backward must scale the gradients formed in the forward
    (loss * 0.37).backward()
    dh, dw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    (ref_loss * 0.37).backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert torch.equal(hits, ref_hits)
    torch.testing.assert_close(dh, hidden.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw, weight.grad, rtol=1e-10, atol=1e-12)


def test_mean_over_labelled_positions_equals_ignore_index() -> None:
    # what train.py computes: the head at the labelled positions of [B, T], summed, over their count
    B, T, D, V = 3, 11, 16, 29
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(B, T, D, generator=generator, requires_grad=True)
    weight = torch.randn(V, D, generator=generator, requires_grad=True)
    labels = torch.randint(0, V, (B, T), generator=generator)
    labels[torch.rand(B, T, generator=generator) < 0.6] = -100
    flat = labels.flatten()
    positions = (flat != -100).nonzero().squeeze(1)
    loss, _ = linear_cross_entropy(features.flatten(0, 1)[positions], weight, flat[positions], block_rows=5)
    (loss / len(positions)).backward()
    grads = features.grad.clone(), weight.grad.clone()
    features.grad = weight.grad = None
    reference = F.cross_entropy((features @ weight.T).flatten(0, 1), flat)  # ignore_index=-100
    reference.backward()
    torch.testing.assert_close(loss / len(positions), reference)
    torch.testing.assert_close(grads[0], features.grad)
    torch.testing.assert_close(grads[1], weight.grad)


def _rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    return float((out.double() - ref.double()).pow(2).mean().sqrt() / ref.double().pow(2).mean().sqrt())


def test_bf16_autocast_as_accurate_as_autocast_reference() -> None:
    hidden64, weight64, targets = _inputs(40, 32, 50)
    truth = reference_cross_entropy(hidden64, weight64, targets)[0]
    truth.backward()
    hidden, weight = hidden64.detach().float().requires_grad_(), weight64.detach().float().requires_grad_()
    results = []
    for fn in (lambda: linear_cross_entropy(hidden, weight, targets, block_rows=16),
               lambda: reference_cross_entropy(hidden, weight, targets)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = fn()
        loss.backward()
        results.append((loss, hidden.grad.clone(), weight.grad.clone()))
        hidden.grad = weight.grad = None
    (loss, dh, dw), (ref, ref_dh, ref_dw) = results
    # both take the head's matmul in bf16 and the softmax in fp32: the same error against fp64
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)
    for ours, theirs, exact in ((dh, ref_dh, hidden64.grad), (dw, ref_dw, weight64.grad)):
        assert ours.dtype == torch.float32
        assert _rel_rms(exact, ours) < 1.5 * _rel_rms(exact, theirs) + 1e-3


def test_no_grad_needs_no_gradient_buffers() -> None:
    hidden, weight, targets = _inputs(20, 8, 13)
    with torch.no_grad():
        loss, hits = linear_cross_entropy(hidden, weight, targets, block_rows=7)
    ref, ref_hits = reference_cross_entropy(hidden.detach(), weight.detach(), targets)
    torch.testing.assert_close(loss, ref)
    assert torch.equal(hits, ref_hits) and not loss.requires_grad


def test_bad_shapes_are_named() -> None:
    hidden, weight, targets = _inputs(5, 8, 13)
    with pytest.raises(ValueError, match="same D"):
        linear_cross_entropy(hidden, weight[:, :4], targets)
    with pytest.raises(ValueError, match="targets"):
        linear_cross_entropy(hidden, weight, targets[:3])
