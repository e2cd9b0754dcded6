"""torch.compile over the Triton chunk op: the custom ops of kernels/triton/compile.py, under the interpreter.

`torch.library.opcheck` checks the ops' schema, fake (shape-only) implementations and registered autograd;
compiled functions around the op must give the eager op's outputs and gradients, and the compiler must see
our op as one node (never the Triton kernels inside it, which inductor cannot analyse).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import kernels  # noqa: E402
from benchmarks.common import make_inputs, rel_rms  # noqa: E402
from kernels import family  # noqa: E402
from kernels.triton import triton_chunk  # noqa: E402
from kernels.triton.chunk import INTERPRET  # noqa: E402
from kernels.triton.compile import chunk_fwd, compiled_chunk  # noqa: E402

pytestmark = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (CPU tensors)")

# (name, decay, delta rule, lower_bound): the family's ops (kernels.family)
VARIANTS = [(o.name, o.decay, o.delta_rule, o.lower_bound) for o in family.OPS]
SHAPE = {"B": 1, "T": 21, "H": 2, "K": 16, "V": 16}


def _args(decay, delta, lower_bound, seed=0, grad=True):
    x = make_inputs(decay, delta, **SHAPE, seed=seed, lower_bound=lower_bound)
    if grad:
        for t in x.values():
            if t is not None:
                t.requires_grad_()
    return x


@pytest.mark.parametrize("name,decay,delta,lower_bound", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_custom_op_matches_eager_outputs_states_and_gradients(name, decay, delta, lower_bound) -> None:
    x = _args(decay, delta, lower_bound)
    inputs = [t for t in x.values() if t is not None]
    scale = SHAPE["K"] ** -0.5
    results = []
    for fn in (triton_chunk, compiled_chunk):
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], scale, x["initial_state"], True, 16, lower_bound)
        o, ht = fn(*args)
        # both outputs feed the loss, so both upstream gradients reach the backward
        loss = (o * torch.linspace(-1, 1, o.shape[-1])).sum() + (ht * 0.5).sum()
        results.append([o, ht, *torch.autograd.grad(loss, inputs)])
    for ours, eager in zip(results[1], results[0], strict=True):
        assert rel_rms(eager, ours) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name,decay,delta,lower_bound",
                         [v for v in VARIANTS if v[0] in ("gla", "gated_delta_rule", "kda_bounded")],
                         ids=["gla", "gated_delta_rule", "kda_bounded"])
def test_opcheck(name, decay, delta, lower_bound) -> None:
    x = _args(decay, delta, lower_bound)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], SHAPE["K"] ** -0.5, x["initial_state"], True, 16,
            lower_bound)
    torch.library.opcheck(chunk_fwd, args)


def test_opcheck_without_state_or_gradient() -> None:
    x = _args("channel", True, None, grad=False)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], SHAPE["K"] ** -0.5, None, False, 16, None)
    torch.library.opcheck(chunk_fwd, args, test_utils=("test_schema", "test_faketensor"))


def test_compiled_function_calls_the_op_opaquely_and_matches_eager() -> None:
    x = _args("channel", True, None)
    graphs: list[torch.fx.GraphModule] = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        keep = lambda g, _: make_boxed_func(g)  # run the traced graphs as they are
        return aot_autograd(fw_compiler=keep, bw_compiler=keep)(gm, example_inputs)

    def layer(q, k, v, g, beta, h0):
        # glue on both sides of the op, as a mixer has
        q = torch.nn.functional.normalize(q * 1.5, dim=-1)
        o, ht = kernels.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                  backend="triton", chunk_size=16)
        return torch.nn.functional.silu(o).sum() + ht.square().sum()

    names = ["q", "k", "v", "g", "beta", "initial_state"]
    eager = layer(*(x[n] for n in names))
    eager_grads = torch.autograd.grad(eager, [x[n] for n in names])
    compiled = torch.compile(layer, backend=recording_backend, fullgraph=True)
    out = compiled(*(x[n] for n in names))
    grads = torch.autograd.grad(out, [x[n] for n in names])
    assert rel_rms(eager, out) < 1e-6
    for ours, ref in zip(grads, eager_grads, strict=True):
        assert rel_rms(ref, ours) < 1e-5
    targets = {str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"}
    assert any("kda_harness.chunk_fwd" in t for t in targets), targets
    assert not any("triton_kernel_wrapper" in t for t in targets), targets


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["kda"])  # ~1 min of inductor compilation per mixer on 2 cores
def test_inductor_compiled_model_matches_eager(mixer: str) -> None:
    # the path train.py takes with trainer.compile=true: the body compiled by inductor, the loss eager
    from mixers.model import LanguageModel
    from mixers.pattern import mixer_yaml

    cfg = mixer_yaml(mixer)
    cfg.num_heads, cfg.head_dim = 2, 16
    if "backend" in cfg:
        cfg.backend, cfg.chunk_size = "triton", 16
    torch.manual_seed(0)
    model = LanguageModel(37, cfg, d_model=32, num_layers=2, mlp_ratio=2.0)
    tokens = torch.randint(0, 37, (2, 19))
    positions = torch.arange(1, 38, 2)
    targets = torch.randint(0, 37, (len(positions),))
    results = []
    for features in (model.features, torch.compile(model.features)):
        loss, _ = model.scored_loss(features(tokens), positions, targets)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results.append((loss, grads))
    (eager, eager_grads), (compiled, grads) = results
    assert rel_rms(eager, compiled) < 1e-5
    for ref, ours in zip(eager_grads, grads, strict=True):
        assert rel_rms(ref, ours) < 1e-4
