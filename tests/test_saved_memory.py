"""The layer's lean backward (mixers/recompute.py, LinearMixer.lean_backward): the same loss and gradients
as the plain torch expressions it replaces, and fewer bytes saved for the backward.

The Functions are gradchecked in float64; the whole model's loss and every parameter's gradient are
compared with `lean_backward = False` in float64 and fp32; the bytes the mixer saves outside its op (the
glue this file is about; the op's own buffers are kernels/triton's) are bounded per token under bf16
autocast, with the plain path above the bound, so reverting the reduction fails.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from benchmarks.common import rel_rms
from benchmarks.memory import saved_storages
from mixers.linear_base import LinearMixer
from mixers.model import LanguageModel
from mixers.pattern import mixer_yaml
from mixers.recompute import gated_rms_norm_projection, kda_gate, l2_norm, shared_cast
from tests.test_mixers import CONF

SMALL = {"num_heads": 2, "head_dim": 16, "chunk_size": 16, "backend": "torch"}
# (mixer yaml, overrides): the three mixers of the memory goal and the switches the Functions branch on
VARIANTS = [
    ("kda", {}),
    ("kda", {"gate": "softplus", "output_gate_rank": "low"}),
    ("kda", {"output_gate": "swish", "output_norm": False}),
    ("gdn", {}),
    ("gdn", {"output_gate": "none"}),
    ("mamba2", {}),
    ("deltanet", {}),
]


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_shared_cast_is_one_copy_and_sums_the_gradients_in_fp32() -> None:
    x = torch.ones(4, 3, requires_grad=True)
    a, b = shared_cast(x * 1, torch.bfloat16, 2)
    assert a.dtype == torch.bfloat16 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    # 1 + 2^-9 rounds to 1 in bf16 (8 significant bits), not in fp32
    (a.float().sum() + 2**-9 * b.float().sum()).backward()
    assert x.grad.dtype == torch.float32 and (x.grad == 1 + 2**-9).all()


def test_l2_norm_matches_normalize_and_keeps_the_dtype() -> None:
    x = torch.randn(3, 5, 2, 8, dtype=torch.float64, generator=_generator(), requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: l2_norm(t, 1e-12), (x,))
    # one row below eps (too close to it for finite differences): F.normalize clamps its norm, and the
    # backward must not project that row
    with torch.no_grad():
        x[0, 0, 0] = 1e-14
    dy = torch.randn(x.shape, dtype=x.dtype, generator=_generator(1))
    ours = torch.autograd.grad(l2_norm(x), x, dy)[0]
    ref = torch.autograd.grad(F.normalize(x, dim=-1), x, dy)[0]
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    assert l2_norm(x.detach().bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize("bounded", [True, False])
def test_kda_gate_matches_autograd(bounded: bool) -> None:
    g = _generator()
    z = torch.randn(2, 7, 2 * 4, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(8, dtype=torch.float64, generator=g, requires_grad=True)
    A_log = torch.randn(2, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: kda_gate(*t, bounded, -5.0), (z, bias, A_log))
    u = (z + bias).view(2, 7, 2, 4)
    ref = -5.0 * torch.sigmoid(A_log.exp()[:, None] * u) if bounded else -A_log.exp()[:, None] * F.softplus(u)
    torch.testing.assert_close(kda_gate(z, bias, A_log, bounded, -5.0), ref)


@pytest.mark.parametrize("activation", ["none", "sigmoid", "swish"])
def test_gated_rms_norm_projection_matches_autograd(activation: str) -> None:
    g = _generator()
    o = torch.randn(2, 5, 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    gate = torch.randn(2, 5, 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(8, dtype=torch.float64, generator=g, requires_grad=True)
    proj = torch.randn(6, 16, dtype=torch.float64, generator=g, requires_grad=True)
    gate_in = None if activation == "none" else gate

    def lean(o: torch.Tensor, w: torch.Tensor, p: torch.Tensor, *gt: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm_projection(o, gt[0] if gt else None, w, 1e-5, activation, p)

    assert torch.autograd.gradcheck(lean, (o, weight, proj) + (() if gate_in is None else (gate,)))
    norm = torch.nn.RMSNorm(8, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(weight)
    ref = norm(o)
    if activation != "none":
        ref = ref * (torch.sigmoid(gate) if activation == "sigmoid" else F.silu(gate))
    ref = ref.flatten(-2) @ proj.T
    torch.testing.assert_close(gated_rms_norm_projection(o, gate_in, weight, 1e-5, activation, proj), ref)
    with pytest.raises(ValueError, match="needs the gate"):
        gated_rms_norm_projection(o, None, weight, 1e-5, "sigmoid", proj)
    with pytest.raises(ValueError, match=r"expected \[D, H\*V\] = \[D, 16\]"):
        gated_rms_norm_projection(o, gate, weight, 1e-5, "sigmoid", proj[:, :8])


def _model(name: str, overrides: dict[str, Any], lean: bool, d_model: int = 32) -> LanguageModel:
    cfg = mixer_yaml(name, CONF)
    for key, value in {**SMALL, **overrides}.items():
        if key in cfg:
            cfg[key] = value
    torch.manual_seed(0)
    model = LanguageModel(11, cfg, d_model=d_model, num_layers=2, mixer_name=name)
    for mixer in model.mixers:
        assert isinstance(mixer, LinearMixer)
        mixer.lean_backward = lean
    return model


def _loss_and_grads(model: LanguageModel,
                    tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.roll(-1, 1).flatten())
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize(("name", "overrides"), VARIANTS)
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-10), (torch.float32, 5e-5)])
def test_lean_backward_gives_the_plain_loss_and_every_gradient(name: str, overrides: dict[str, Any],
                                                               dtype: torch.dtype, tolerance: float) -> None:
    # float64: the same function to round-off (a wrong term in a backward shows as a large error); fp32:
    # within its tolerance (A_log's gradient sums many small terms, ~1e-5 apart in fp32)
    tokens = torch.randint(0, 11, (2, 37), generator=_generator())
    loss, grads = _loss_and_grads(_model(name, overrides, lean=True).to(dtype), tokens)
    ref_loss, ref_grads = _loss_and_grads(_model(name, overrides, lean=False).to(dtype), tokens)
    torch.testing.assert_close(loss, ref_loss, rtol=tolerance, atol=tolerance)
    assert grads.keys() == ref_grads.keys()
    for key, ref in ref_grads.items():
        assert grads[key] is not None and ref is not None, key
        assert rel_rms(ref, grads[key]) < tolerance, key


def _glue_bytes_per_token(name: str, lean: bool) -> float:
    """Bytes layer 0's mixer saves for its backward outside its op, per token, under bf16 autocast."""
    model = _model(name, {}, lean, d_model=64)
    mixer = model.mixers[0]
    in_op = []
    op = mixer.chunk_op

    def marked(*args: Any, **kwargs: Any) -> Any:
        in_op.append(True)
        try:
            return op(*args, **kwargs)
        finally:
            in_op.pop()

    mixer.chunk_op = marked
    B, T = 3, 64

    def glue(t: torch.Tensor) -> bool:
        # per-token tensors only (their first dim the batch or its tokens), not the weights' casts
        return not in_op and t.dim() > 0 and t.shape[0] in (B, B * T)

    leaf = torch.randn(B, T, 64, generator=_generator(), requires_grad=True)
    # not a leaf, as the block's norm output: autocast caches its casts of leaves (weights) only
    x = leaf * 1
    with saved_storages(keep=glue) as live, torch.autocast("cpu", torch.bfloat16):
        out = mixer(x)
    # the mixer's input itself (the residual stream's norm output) belongs to the block, not to the mixer
    saved = sum(r["bytes"] for r in live if r["ptr"] != x.untyped_storage().data_ptr())
    del out
    return saved / (B * T)


# bytes per token the glue of one layer saves at d_model 64, H*K = H*V = 32, under the CPU's bf16 autocast:
# measured with the lean path kda 536, gdn 552, mamba2 276; the plain path 2265, 2057, 1701. (q, k after the
# L2 norm are fp32, so is the op's output the output norm keeps: the op's fp32 path, as on CUDA.)
GLUE_BOUND = {"kda": 560, "gdn": 575, "mamba2": 295}


@pytest.mark.parametrize("name", sorted(GLUE_BOUND))
def test_the_mixer_glue_saves_less_than_the_bound(name: str) -> None:
    lean, plain = _glue_bytes_per_token(name, True), _glue_bytes_per_token(name, False)
    assert lean <= GLUE_BOUND[name] < plain, (name, lean, plain)


@pytest.mark.parametrize("name", ["kda", "gdn", "mamba2"])
def test_lean_backward_under_bf16_autocast_is_as_close_to_fp32_as_the_plain_path(name: str) -> None:
    # the Functions' dtypes under autocast (the projections' gradients in bf16, then fp32 as autograd's):
    # each gradient as far from the fp32 step's as the plain path's, to bf16 noise (both are ~1-20% off
    # at this tiny size, most on A_log, whose gradient sums many small terms of both signs)
    tokens = torch.randint(0, 11, (2, 37), generator=_generator())
    ref_loss, ref_grads = _loss_and_grads(_model(name, {}, lean=False), tokens)
    results = []
    for lean in (True, False):
        with torch.autocast("cpu", torch.bfloat16):
            results.append(_loss_and_grads(_model(name, {}, lean=lean), tokens))
    (loss, grads), (plain_loss, plain_grads) = results
    assert abs(loss - ref_loss) < 1e-2 * ref_loss
    for key, ref in ref_grads.items():
        assert grads[key].dtype == torch.float32, key
        ours, plain = rel_rms(ref, grads[key]), rel_rms(ref, plain_grads[key])
        assert ours < 2 * plain + 1e-2, (key, ours, plain)


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", ["kda", "gdn"])
def test_compiled_lean_backward_is_as_close_to_fp32_as_the_compiled_plain_path(name: str,
                                                                              autocast: bool) -> None:
    # the Functions of mixers/recompute.py as Dynamo and AOTAutograd trace them (their backward traced
    # under the forward's autocast, `recomputed` falling back to the plain call): the form the compiled
    # lean step takes on CUDA, here on the CPU's ops. Under torch 2.11 an L2 norm whose output was a no-op
    # cast of its fp32 result got no gradient here (q, k and all before them 100 % off): its fp32 inputs
    # come under autocast too, after the short conv
    tokens = torch.randint(0, 11, (2, 37), generator=_generator())
    ref_loss, ref_grads = _loss_and_grads(_model(name, {}, lean=False), tokens)
    results = []
    for lean in (True, False):
        model = _model(name, {}, lean=lean)
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            logits = compiled(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.roll(-1, 1).flatten())
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss, grads), (plain_loss, plain_grads) = results
    assert abs(loss - ref_loss) < 1e-2 * ref_loss
    for key, ref in ref_grads.items():
        ours, plain = rel_rms(ref, grads[key]), rel_rms(ref, plain_grads[key])
        assert ours < 2 * plain + 1e-2, (key, ours, plain)


def _op_input_dtypes(name: str, lean: bool) -> list[torch.dtype]:
    """The dtypes of (q, k, v, g?, beta?) layer 0's op receives under the trainer's bf16 autocast."""
    model = _model(name, {}, lean)
    mixer = model.mixers[0]
    seen: list[torch.dtype] = []

    class Reached(Exception):
        pass

    def recording(*args: Any, **kwargs: Any) -> Any:
        # the dtypes are all this asks: stop at the op instead of running the model through
        seen.extend(t.dtype for t in args)
        raise Reached

    mixer.chunk_op = recording
    tokens = torch.randint(0, 11, (2, 37), generator=_generator())
    with torch.autocast("cpu", torch.bfloat16), pytest.raises(Reached):
        model(tokens)
    return seen


@pytest.mark.parametrize("name", ["kda", "gdn", "deltanet", "mamba2", "gla"])
def test_lean_and_plain_hand_the_op_the_same_dtypes_under_autocast(name: str) -> None:
    # the op picks its precision from q's dtype and its 16-bit path diverged in training: an L2-normed q, k
    # reach it in fp32 on either path (CUDA's autocast gives F.normalize fp32, the CPU's would give bf16)
    lean, plain = _op_input_dtypes(name, True), _op_input_dtypes(name, False)
    assert lean == plain, (name, lean, plain)
    if mixer_yaml(name, CONF)["qk_norm"]:
        assert lean[:2] == [torch.float32, torch.float32], (name, lean)


@pytest.mark.parametrize("name", ["kda", "mamba2"])
def test_lean_backward_on_the_triton_ops_gives_the_plain_gradients(name: str) -> None:
    # the Triton short conv (a torch custom op with its own backward) and chunk op under the interpreter:
    # the conv's recompute differentiates through them
    tokens = torch.randint(0, 11, (1, 32), generator=_generator())
    triton = {"backend": "triton"}
    results = [_loss_and_grads(_model(name, triton, lean=lean), tokens) for lean in (True, False)]
    (loss, grads), (ref_loss, ref_grads) = results
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for key, ref in ref_grads.items():
        assert rel_rms(ref, grads[key]) < 5e-5, key


def test_the_recompute_is_invisible_to_an_enclosing_saved_tensor_hook() -> None:
    # benchmarks.memory's saved_split counts what a whole step packs: the backward's recomputed graphs are
    # transient and must not add to it
    model = _model("kda", {}, lean=True)
    tokens = torch.randint(0, 11, (2, 37), generator=_generator())
    with torch.autocast("cpu", torch.bfloat16):
        loss = model(tokens).float().mean()
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
        loss.backward()
    assert packed == []
    assert all(p.grad is not None for p in model.parameters())


def test_model_lean_backward_switch_reaches_every_layer_and_the_mlp() -> None:
    cfg = mixer_yaml("kda", CONF)
    for key, value in SMALL.items():
        if key in cfg:
            cfg[key] = value
    plain = LanguageModel(11, cfg, d_model=32, num_layers=2, mixer_name="kda")
    lean = LanguageModel(11, cfg, d_model=32, num_layers=2, mixer_name="kda", lean_backward=True)
    assert [m.lean_backward for m in plain.mixers] == [False, False]
    assert [b.mlp.fused for b in plain.blocks] == [False, False]
    assert [m.lean_backward for m in lean.mixers] == [True, True]
    assert [b.mlp.fused for b in lean.blocks] == [True, True]
    # the switch is a model config key, typed by harness.config and passed to the model by harness.run
    from dataclasses import fields

    from harness.config import ModelConfig

    assert "lean_backward" in {f.name for f in fields(ModelConfig)}
    assert OmegaConf.load(CONF.parent / "model" / "default.yaml").lean_backward == "auto"
