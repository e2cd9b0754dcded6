"""The LM head + cross-entropy at scored positions (mixers/loss.py) against F.cross_entropy on full logits."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from benchmarks.common import rel_rms
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
        assert rel_rms(exact, ours) < 1.5 * rel_rms(exact, theirs) + 1e-3


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


@pytest.fixture(params=["passes", "whole"])
def ce_kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each of the softmax kernels: rows read in passes of 2,048 columns (the default's), or held whole
    (every row up to WHOLE_ROW_MAX)."""
    from kernels.triton import cross_entropy

    monkeypatch.setattr(cross_entropy, "WHOLE_ROW_LIMIT",
                        cross_entropy.WHOLE_ROW_MAX if request.param == "whole" else 0)
    return request.param


# the fused softmax kernel (kernels/triton/cross_entropy.py) against the torch chain it replaces:
# V below, at and above one pass of 2,048 columns, with a masked tail
@pytest.mark.parametrize("N,V,block_rows", [(1, 16, 4), (37, 77, 8), (19, 2048, 7), (23, 2100, 64)])
def test_triton_softmax_kernel_equals_torch_chain(N: int, V: int, block_rows: int, ce_kernel: str) -> None:
    hidden64, weight64, targets = _inputs(N, 24, V, seed=V)
    results = {}
    for impl in ("torch", "triton"):
        hidden = hidden64.detach().float().requires_grad_()
        weight = weight64.detach().float().requires_grad_()
        loss, hits = linear_cross_entropy(hidden, weight, targets, block_rows=block_rows, impl=impl)
        (loss * 0.37).backward()
        results[impl] = loss, hits, hidden.grad, weight.grad
    (loss, hits, dh, dw), (ref, ref_hits, ref_dh, ref_dw) = results["triton"], results["torch"]
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(hits, ref_hits)
    torch.testing.assert_close(dh, ref_dh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw, ref_dw, rtol=1e-5, atol=1e-6)


def test_triton_softmax_kernel_ties_and_no_grad(ce_kernel: str) -> None:
    # equal logits (identical rows of the head): argmax is the first of them, as torch.argmax says; 7 and
    # 7 + 2048 share a lane of the two-pass kernel's first and second pass, 25 is another lane
    hidden, weight, targets = _inputs(30, 8, 2100, seed=3)
    weight = weight.detach().clone()
    weight[7] *= 4
    weight[2055] = weight[7]
    weight[25] = weight[7]
    hidden = hidden.detach().float()
    with torch.no_grad():
        loss, hits = linear_cross_entropy(hidden, weight.float(), targets, impl="triton")
        ref, ref_hits = reference_cross_entropy(hidden, weight.float(), targets)
    logits = hidden @ weight.float().T
    assert (logits.argmax(-1) == 7).any(), "the tie must be hit for the test to mean anything"
    from kernels.triton.cross_entropy import ce_rows

    lse, picked, argmax = ce_rows(logits.clone(), targets, want_grad=False)
    assert torch.equal(argmax.long(), logits.argmax(-1))
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1))
    torch.testing.assert_close(picked, logits.gather(1, targets[:, None])[:, 0])
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(hits, ref_hits) and not loss.requires_grad


def test_triton_softmax_kernel_under_bf16_autocast() -> None:
    hidden64, weight64, targets = _inputs(40, 32, 300)
    truth = reference_cross_entropy(hidden64, weight64, targets)[0]
    truth.backward()
    hidden, weight = hidden64.detach().float().requires_grad_(), weight64.detach().float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = linear_cross_entropy(hidden, weight, targets, block_rows=16, impl="triton")
    loss.backward()
    # the logits are bf16 (the matmul's output) and so is the gradient written over them
    torch.testing.assert_close(loss.double(), truth, rtol=2e-2, atol=0)
    assert rel_rms(hidden64.grad, hidden.grad) < 2e-2 and rel_rms(weight64.grad, weight.grad) < 2e-2


def test_unknown_impl_is_named() -> None:
    hidden, weight, targets = _inputs(5, 8, 13)
    with pytest.raises(ValueError, match="impl='cuda'"):
        linear_cross_entropy(hidden, weight, targets, impl="cuda")


def test_bench_loss_smoke(tmp_path) -> None:
    # the GPU benchmark's code path on the CPU at a tiny size: every implementation runs and agrees
    import csv

    from benchmarks import speed

    assert speed.main(["loss", "--out", str(tmp_path), "--device", "cpu", "--rows", "40", "--tasks",
                       "palindrome", "--impls", "full", "torch", "triton", "triton-passes", "triton-whole",
                       "triton-whole-w4", "--block-rows", "16", "7", "--warmup", "0", "--steps", "1"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "bench_loss.csv")))
    assert [r["impl"] for r in rows] == ["full", "torch", "triton", "triton-passes", "triton-whole",
                                         "triton-whole-w4", "triton@16", "triton@7"]
    assert all(float(r["err_loss"]) < 1e-3 and float(r["ms"]) > 0 for r in rows)
    with pytest.raises(SystemExit):
        speed.main(["loss", "--out", str(tmp_path), "--device", "cpu", "--block-rows", "0"])


def test_the_default_holds_a_row_whole_where_it_fits_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows up to WHOLE_ROW_LIMIT columns (2,048 by default) go to the whole-row kernel, on a warp per 512
    columns unless WHOLE_ROW_WARPS says, longer ones to the two passes; the limit at 0 sends every row to the
    two passes."""
    from kernels.triton import cross_entropy

    launched = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: tuple) -> Callable[..., None]:
            return lambda *a, **kwargs: launched.append((self.name, kwargs["BLOCK_V"], kwargs["num_warps"]))

    monkeypatch.setattr(cross_entropy, "_ce_whole_row_kernel", Recorder("whole"))
    monkeypatch.setattr(cross_entropy, "_ce_rows_kernel", Recorder("passes"))
    for V in (64, 2000, 2048, 2049, 8192):
        cross_entropy.ce_rows(torch.randn(3, V), torch.zeros(3, dtype=torch.long), want_grad=True)
    assert launched == [("whole", 64, 1), ("whole", 2048, 4), ("whole", 2048, 4), ("passes", 2048, 8),
                        ("passes", 2048, 8)]
    launched.clear()
    monkeypatch.setattr(cross_entropy, "WHOLE_ROW_WARPS", 8)
    cross_entropy.ce_rows(torch.randn(3, 64), torch.zeros(3, dtype=torch.long), want_grad=True)
    monkeypatch.setattr(cross_entropy, "WHOLE_ROW_LIMIT", 0)
    cross_entropy.ce_rows(torch.randn(3, 64), torch.zeros(3, dtype=torch.long), want_grad=True)
    assert launched == [("whole", 64, 8), ("passes", 2048, 8)]


def test_softmax_kernel_out_buffers_are_checked() -> None:
    from kernels.triton.cross_entropy import ce_rows

    logits, targets = torch.randn(6, 20), torch.randint(0, 20, (6,))
    good = (torch.empty(6), torch.empty(6), torch.empty(6, dtype=torch.int32))
    ce_rows(logits.clone(), targets, want_grad=False, out=good)
    torch.testing.assert_close(good[0], torch.logsumexp(logits, -1))
    with pytest.raises(ValueError, match=r"contiguous \[6\] of torch.int32"):
        ce_rows(logits.clone(), targets, want_grad=False, out=(good[0], good[1], torch.empty(6)))


def test_bench_loss_block_rows_are_the_blocks_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    # a `triton@R` row runs the kernels over blocks of R rows, not the default block
    from benchmarks import speed
    from kernels.triton import cross_entropy

    seen = []
    real = cross_entropy.ce_rows
    monkeypatch.setattr(cross_entropy, "ce_rows", lambda logits, *a, **k: seen.append(len(logits)) or
                        real(logits, *a, **k))
    hidden, weight, targets = _inputs(40, 8, 13)
    speed.loss_fn("triton@16")(hidden, weight, targets)
    assert seen == [16, 16, 8]
