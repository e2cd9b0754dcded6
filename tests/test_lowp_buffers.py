"""benchmarks/lowp_buffers.py's forward variants on the CPU (Triton's interpreter): each rounds what the
16-bit path keeps in bf16 where its stage returns it, so the forward's own output moves, and nothing else."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchmarks import lowp_buffers
from kernels.triton import solve, triton_chunk


def _inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    B, T, H, K = 1, 37, 2, 16  # an odd length: the last chunk partial
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, K, generator=gen)
    g = -0.2 * torch.nn.functional.softplus(torch.randn(B, T, H, K, generator=gen))
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    return q, k, v, g, beta


def _bf16_exact(t: torch.Tensor) -> bool:
    return bool((t.to(torch.bfloat16).to(t.dtype) == t).all())


@pytest.mark.parametrize("variant", ["fwd_intra", "fwd_linv", "fwd_wu"])
def test_a_forward_variant_moves_the_forwards_output_and_leaves_a_kk_in_fp32(
        variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v, g, beta = _inputs()
    plain, _ = triton_chunk(q, k, v, g, beta, chunk_size=16)
    seen: list[torch.Tensor] = []
    solve_original = solve.solve

    def solve_seeing(beta: torch.Tensor, akk: torch.Tensor, fp: object) -> torch.Tensor:
        seen.append(akk.clone())
        return solve_original(beta, akk, fp)

    model = SimpleNamespace(mixers=[SimpleNamespace(chunk_op=triton_chunk)])
    counter = lowp_buffers.Counter()
    # (patched first, so that fwd_linv's patch wraps this one and rounds what it returns)
    monkeypatch.setattr(solve, "solve", solve_seeing)
    with lowp_buffers.variant_patch(variant, model, counter):
        rounded, _ = model.mixers[0].chunk_op(q, k, v, g, beta, chunk_size=16)
    assert model.mixers[0].chunk_op is triton_chunk and solve.solve is solve_seeing  # patches undone
    assert counter.changed > 0
    difference = (rounded - plain).abs().max().item()
    # bf16's rounding (2^-9 relative) moves the output, by far less than the output itself
    assert 0 < difference < 0.05 * plain.abs().max().item()
    # A_kk reaches the solve unrounded (fp32 in the 16-bit path too)
    assert seen and not _bf16_exact(seen[0])


def test_inputs_hands_the_op_q_and_k_as_bf16_hands_them_and_rounds_their_gradients() -> None:
    q, k, v, g, beta = _inputs()
    q.requires_grad_(True)
    model = SimpleNamespace(mixers=[SimpleNamespace(chunk_op=triton_chunk)])
    counter = lowp_buffers.Counter()
    with lowp_buffers.variant_patch("inputs", model, counter):
        o, _ = model.mixers[0].chunk_op(q, k, v, g, beta, chunk_size=16)
    o.square().sum().backward()
    # the op's fp32 path on q, k equal to their bf16 casts; dq comes back through the casts, rounded
    expected, _ = triton_chunk(q.detach().bfloat16().float(), k.bfloat16().float(), v, g, beta, chunk_size=16)
    assert counter.changed > 0 and o.dtype == torch.float32
    torch.testing.assert_close(o.detach(), expected, rtol=0, atol=0)
    assert _bf16_exact(q.grad) and not _bf16_exact(q.detach())


def test_bf16_all_runs_kdas_16_bit_kernels_not_the_widened_op(monkeypatch: pytest.MonkeyPatch) -> None:
    # the op widens bf16 q, k for KDA; bf16_all is the 16-bit path's variant, so it must get past that
    import kernels.triton

    q, k, v, g, beta = _inputs()
    model = SimpleNamespace(mixers=[SimpleNamespace(chunk_op=triton_chunk)])
    with lowp_buffers.variant_patch("bf16_all", model, lowp_buffers.Counter()):
        o, _ = model.mixers[0].chunk_op(q, k, v, g, beta, chunk_size=16)
    assert kernels.triton.WIDE_KDA_KEYS  # undone
    widened, _ = triton_chunk(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, chunk_size=16)
    monkeypatch.setattr(kernels.triton, "WIDE_KDA_KEYS", False)
    narrow, _ = triton_chunk(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, chunk_size=16)
    assert torch.equal(o, narrow) and not torch.equal(o, widened)


def test_output_hands_on_o_as_the_16_bit_path_returns_it_and_rounds_its_gradient() -> None:
    q, k, v, g, beta = _inputs()
    weights = torch.randn(q.shape[:-1] + (v.shape[-1],), generator=torch.Generator().manual_seed(1))
    leaf = q.clone().requires_grad_(True)
    model = SimpleNamespace(mixers=[SimpleNamespace(chunk_op=triton_chunk)])
    counter = lowp_buffers.Counter()
    with lowp_buffers.variant_patch("output", model, counter):
        o, _ = model.mixers[0].chunk_op(leaf, k, v, g, beta, chunk_size=16)
    (o * weights).sum().backward()
    # the same op with dO = the weights rounded to bf16, as the cast hands them back
    plain_leaf = q.clone().requires_grad_(True)
    plain, _ = triton_chunk(plain_leaf, k, v, g, beta, chunk_size=16)
    (plain * weights.bfloat16().float()).sum().backward()
    assert counter.changed > 0 and o.dtype == torch.float32
    torch.testing.assert_close(o.detach(), plain.detach().bfloat16().float(), rtol=0, atol=0)
    torch.testing.assert_close(leaf.grad, plain_leaf.grad, rtol=0, atol=0)


@pytest.mark.parametrize("variant", ["bwd_dvt", "bwd_dh", "partial"])
def test_a_backward_variant_moves_the_gradients_and_leaves_the_output(variant: str) -> None:
    q, k, v, g, beta = _inputs()
    grads = {}
    for name in ("fp32", variant):
        # dk: the reverse state pass's dVt and dh reach it (dq reads the forward's states, not these)
        leaf = k.clone().requires_grad_(True)
        model = SimpleNamespace(mixers=[SimpleNamespace(chunk_op=triton_chunk)])
        counter = lowp_buffers.Counter()
        with lowp_buffers.variant_patch(name, model, counter):
            o, _ = model.mixers[0].chunk_op(q, leaf, v, g, beta, chunk_size=16)
            o.square().sum().backward()
        grads[name] = (o.detach(), leaf.grad)
        assert counter.changed > 0
    (o_ref, dk_ref), (o_var, dk_var) = grads["fp32"], grads[variant]
    torch.testing.assert_close(o_var, o_ref, rtol=0, atol=0)
    difference = (dk_var - dk_ref).abs().max().item()
    assert 0 < difference < 0.05 * dk_ref.abs().max().item()


def test_a_variant_of_several_parts_applies_each_and_undoes_them() -> None:
    q, k, v, g, beta = _inputs()
    outputs, counts = {}, {}
    for variant in ("fwd_intra", "fwd_linv", "fwd_intra+fwd_linv"):
        model = SimpleNamespace(mixers=[SimpleNamespace(chunk_op=triton_chunk)])
        counter = lowp_buffers.Counter()
        with lowp_buffers.variant_patch(variant, model, counter):
            outputs[variant], _ = model.mixers[0].chunk_op(q, k, v, g, beta, chunk_size=16)
        assert model.mixers[0].chunk_op is triton_chunk
        counts[variant] = counter.changed
    both = outputs["fwd_intra+fwd_linv"]
    # both roundings in: the output is neither one's alone, and every value either rounded is counted
    assert not torch.equal(both, outputs["fwd_intra"]) and not torch.equal(both, outputs["fwd_linv"])
    assert counts["fwd_intra+fwd_linv"] >= max(counts["fwd_intra"], counts["fwd_linv"]) > 0
    assert lowp_buffers.parts("rounded") == list(lowp_buffers.SINGLE)
    for bad in ("m+fp32", "m+nope", "rounded+m"):
        with pytest.raises(ValueError, match="joined by"):
            lowp_buffers.parts(bad)


@pytest.mark.parametrize("variant", ["fwd_nope", "intra"])
def test_an_unknown_variant_names_the_choices(variant: str) -> None:
    model = SimpleNamespace(mixers=[])
    with pytest.raises(ValueError, match="fwd_wu"), lowp_buffers.variant_patch(variant, model,
                                                                               lowp_buffers.Counter()):
        pass
