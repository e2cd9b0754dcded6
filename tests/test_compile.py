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
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

pytest.importorskip("triton")

import kernels  # noqa: E402
from benchmarks.common import make_inputs, rel_rms  # noqa: E402
from kernels import family  # noqa: E402
from kernels.triton import chunk, plan, triton_chunk  # noqa: E402
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


def _described(out) -> list[tuple[tuple[int, ...], torch.dtype]]:
    o, ht, saved = out
    return [(tuple(t.shape), t.dtype) for t in (o, ht, *saved)]


# the layouts with the plan's keep_x and vt_x (X kept, no Vt) too: FILL_PROGRAMS lowered, so that the state
# pass counts as filling the GPU at the tests' shapes (the interpreter's cost grows with B * H)
@pytest.mark.parametrize("recompute_states", [False, True], ids=["h", "rebuilt"])
@pytest.mark.parametrize("wide", [False, True], ids=["narrow", "wide"])
@pytest.mark.parametrize("name,decay,delta,lower_bound", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_fake_forward_states_the_real_buffers(
    name, decay, delta, lower_bound, wide, recompute_states, monkeypatch
) -> None:
    # the compiled graph is traced with the fake forward's outputs and runs on the real one's: every saved
    # buffer's shape and dtype must agree, for every op, precision, state and plan form, and with
    # recompute_states h's place holds the empty placeholder
    if wide:
        monkeypatch.setattr(plan, "FILL_PROGRAMS", 1)
    for dtype, with_state in ((torch.float32, True), (torch.bfloat16, False)):
        x = make_inputs(decay, delta, **SHAPE, seed=0, lower_bound=lower_bound, with_state=with_state,
                        dtype=dtype)
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], SHAPE["K"] ** -0.5, x["initial_state"], with_state,
                16, lower_bound, True, recompute_states)
        fp = plan.plan_forward(chunk._problem(x["q"], x["v"], x["g"], x["beta"], 16, lower_bound, True))
        assert fp.keep_x == (wide and delta)
        real = chunk_fwd(*args)
        with FakeTensorMode() as mode:
            fake = chunk_fwd(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
        assert len(real[2]) == len(chunk.Saved._fields)
        assert _described(fake) == _described(real), dtype
        h = real[2][chunk.Saved._fields.index("h")]
        assert (h.shape == (0,)) == recompute_states, h.shape


def test_fake_forward_asks_no_device() -> None:
    # the layout is a function of shapes, dtypes and switches: a fake CUDA forward (here without a GPU: the
    # device is never asked) states the CPU one's buffers
    x = make_inputs("channel", True, **SHAPE, seed=0)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], SHAPE["K"] ** -0.5, x["initial_state"], True, 16, None,
            True, False)
    layouts = []
    for device in ("cpu", "cuda"):
        with FakeTensorMode():
            fake = [torch.empty(a.shape, dtype=a.dtype, device=device) if isinstance(a, torch.Tensor) else a
                    for a in args]
            out = chunk_fwd(*fake)
        assert {t.device.type for t in (out[0], out[1], *out[2])} == {device}
        layouts.append(_described(out))
    assert layouts[0] == layouts[1]


def test_backward_runs_no_forward_kernels(monkeypatch) -> None:
    # the forward keeps its buffers for the backward (as ChunkFunction does) instead of being run again
    calls = []
    forward = chunk.chunk_forward

    def counted(*args, **kwargs):
        calls.append(kwargs.get("keep"))
        return forward(*args, **kwargs)

    monkeypatch.setattr(chunk, "chunk_forward", counted)
    x = _args("channel", True, None)
    inputs = [t for t in x.values() if t is not None]
    o, ht = compiled_chunk(x["q"], x["k"], x["v"], x["g"], x["beta"], SHAPE["K"] ** -0.5, x["initial_state"],
                           True, 16, None)
    assert calls == [True]
    torch.autograd.grad(o.sum() + ht.sum(), inputs)
    assert calls == [True]
    with torch.no_grad():
        compiled_chunk(x["q"], x["k"], x["v"], x["g"], x["beta"], SHAPE["K"] ** -0.5, None, False, 16, None)
    assert calls == [True, False]  # no gradient wanted: nothing kept


@pytest.mark.parametrize("name,decay,delta,lower_bound",
                         [v for v in VARIANTS if v[0] in ("gated_delta_rule", "kda")],
                         ids=["gated_delta_rule", "kda"])
def test_custom_op_matches_eager_with_x_kept(name, decay, delta, lower_bound, monkeypatch) -> None:
    # the plan's keep_x (and, without the per-channel decay, vt_x): the backward reads X through the op's
    # buffer list
    monkeypatch.setattr(plan, "FILL_PROGRAMS", 1)
    test_custom_op_matches_eager_outputs_states_and_gradients(name, decay, delta, lower_bound)


@pytest.mark.slow
@pytest.mark.parametrize("name,decay,delta,lower_bound",
                         [v for v in VARIANTS if v[0] in ("gla", "gated_delta_rule", "kda_bounded")],
                         ids=["gla", "gated_delta_rule", "kda_bounded"])
def test_opcheck(name, decay, delta, lower_bound) -> None:
    x = _args(decay, delta, lower_bound)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], SHAPE["K"] ** -0.5, x["initial_state"], True, 16,
            lower_bound, True, False)
    torch.library.opcheck(chunk_fwd, args)


@pytest.mark.parametrize("keep", [False, True])
def test_opcheck_without_state_or_gradient(keep: bool) -> None:
    x = _args("channel", True, None, grad=False)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], SHAPE["K"] ** -0.5, None, False, 16, None, keep, False)
    torch.library.opcheck(chunk_fwd, args, test_utils=("test_schema", "test_faketensor"))


def test_compiled_graph_keeps_the_op_buffers_and_no_gate() -> None:
    # the gate computed in the graph is handed to the op, whose backward reads its cumsum (Saved.gc): the
    # partitioner keeps nothing for the op's backward but its buffers (softplus's input is a graph input)
    import contextlib

    import torch.nn.functional as F

    from benchmarks import memory

    x = make_inputs("channel", True, **SHAPE, seed=0, with_state=False)
    z = torch.randn(x["q"].shape, requires_grad=True)
    args = (x["q"].requires_grad_(), x["k"].requires_grad_(), x["v"].requires_grad_(), z,
            x["beta"].requires_grad_())

    def layer(q, k, v, z, beta):
        return triton_chunk(q, k, v, -F.softplus(z), beta)[0]

    rows = memory.compiled_rows(layer, args, contextlib.nullcontext)
    assert any(r["op"] == "chunk_fwd: Saved.gc" for r in rows)
    assert all(r["op"].startswith("chunk_fwd") for r in rows), [r["op"] for r in rows]


def test_compiled_function_calls_the_op_opaquely_and_matches_eager() -> None:
    x = _args("channel", True, None)
    graphs: list[torch.fx.GraphModule] = []
    # aot_autograd's forward and backward graphs, by name
    joint: dict[str, list[torch.fx.GraphModule]] = {"fw": [], "bw": []}

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def keep(name):
            def compiler(g, _):
                joint[name].append(g)
                return make_boxed_func(g)  # run the traced graphs as they are

            return compiler

        return aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"))(gm, example_inputs)

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

    # the forward graph keeps the buffers, the backward graph reads them and runs no forward
    def ops(name: str) -> list[str]:
        return [str(n.target) for g in joint[name] for n in g.graph.nodes if n.op == "call_function"]

    assert any("kda_harness.chunk_fwd" in t for t in ops("fw")), ops("fw")
    assert any("kda_harness.chunk_bwd" in t for t in ops("bw")), ops("bw")
    assert not any("kda_harness.chunk_fwd" in t for t in ops("bw")), ops("bw")


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["kda"])  # ~1 min of inductor compilation per mixer on 2 cores
def test_inductor_compiled_model_matches_eager(mixer: str) -> None:
    # the path train.py takes with trainer.compile=true: the body compiled by inductor, the loss eager
    _compiled_model_matches_eager(mixer, {}, 1e-5, 1e-4)


def _compiled_model_matches_eager(mixer: str, compile_kwargs: dict, loss_tol: float, grad_tol: float,
                                  recompute: tuple[str, ...] = ()) -> None:
    """A 2-layer model of `mixer` (2 heads of 16, the Triton ops): its body compiled with `compile_kwargs`
    gives the eager body's scored loss and every parameter's gradient."""
    from mixers.model import LanguageModel
    from mixers.pattern import mixer_yaml

    cfg = mixer_yaml(mixer)
    cfg.num_heads, cfg.head_dim = 2, 16
    if "backend" in cfg:
        cfg.backend, cfg.chunk_size = "triton", 16
    torch.manual_seed(0)
    model = LanguageModel(37, cfg, d_model=32, num_layers=2, mlp_ratio=2.0, recompute=recompute)
    tokens = torch.randint(0, 37, (2, 19))
    positions = torch.arange(1, 38, 2)
    targets = torch.randint(0, 37, (len(positions),))
    results = []
    torch._dynamo.reset()
    for features in (model.features, torch.compile(model.features, **compile_kwargs)):
        loss, _ = model.scored_loss(features(tokens), positions, targets)
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (eager, eager_grads), (compiled, grads) = results
    assert rel_rms(eager, compiled) < loss_tol
    for ref, ours in zip(eager_grads, grads, strict=True):
        assert rel_rms(ref, ours) < grad_tol


def _kda_saved_gib(*parts: str) -> dict[str, float]:
    """What KDA's compiled model (B=3, T=64) keeps for its backward, GiB by module group, with `parts` of
    mixers.model.RECOMPUTABLE recomputed and the others kept."""
    from benchmarks import memory

    args = ["--device", "cpu", "--bf16", "--compiled", "--plain", "--mixers", "kda", "--scale-batch", "3",
            "--scale-len", "64"]
    return memory.main([*args, "--recompute", *parts] if parts else args)["kda"]


@pytest.mark.slow
def test_recomputed_unit_qk_and_swiglu_keep_less_and_train_the_same() -> None:
    """The recompute candidates (mixers.model.RECOMPUTABLE): compiled, KDA's model keeps no fp32 unit
    q, k and norms (qk_norm) and no SwiGLU product (swiglu) for the backward, exactly those and nothing else
    fewer in inductor's partition, and gives the eager model's loss and every gradient."""
    kept = _kda_saved_gib()
    no_qk = _kda_saved_gib("qk_norm")
    neither = _kda_saved_gib("qk_norm", "swiglu")
    tokens, layers = 3 * 64, 2
    # the yaml's 2 heads of 128, fp32: q and k and their norms
    assert kept["mixer"] - no_qk["mixer"] == pytest.approx(layers * 2 * tokens * 2 * (128 + 1) * 4 / 2**30)
    # the product [tokens, hidden] in bf16, hidden = int(2/3 of 4 x 256) rounded as mixers/model.py rounds it
    assert no_qk["mlp"] - neither["mlp"] == pytest.approx(layers * tokens * 704 * 2 / 2**30)
    assert kept["mlp"] == no_qk["mlp"] and no_qk["mixer"] == neither["mixer"]
    assert kept["rest"] == neither["rest"] and kept["norms"] == neither["norms"]
    # aot_eager: AOTAutograd's partition with the checkpoints' recompute, without inductor's code generation
    _compiled_model_matches_eager("kda", {"backend": "aot_eager"}, 1e-6, 1e-5, ("qk_norm", "swiglu"))


@pytest.mark.slow
def test_recomputed_q_k_projections_keep_none_of_q_k_and_train_the_same() -> None:
    """The q, k candidate (RECOMPUTABLE's qk): compiled, KDA's model keeps none of q's and k's projections,
    short-conv outputs, unit rows and norms for the backward, nor the projections' shared input cast (the
    partition recasts it for v's weight gradient), exactly those fewer and nothing else, and gives the
    eager model's loss and every gradient."""

    kept = _kda_saved_gib()
    recomputed = _kda_saved_gib("qk")
    tokens, layers, width = 3 * 64, 2, 256
    # a token: W x and conv(W x) for q and k (bf16), their unit rows (fp32) and 2 heads' norms (fp32), the
    # shared input cast (bf16); a layer: the two weights' bf16 casts
    per_token = 4 * width * 2 + 2 * width * 4 + 2 * 2 * 4 + width * 2
    per_layer = tokens * per_token + 2 * width * width * 2
    assert kept["mixer"] - recomputed["mixer"] == pytest.approx(layers * per_layer / 2**30)
    assert (kept["mlp"], kept["norms"], kept["rest"]) == \
        (recomputed["mlp"], recomputed["norms"], recomputed["rest"])
    _compiled_model_matches_eager("kda", {"backend": "aot_eager"}, 1e-6, 1e-5, ("qk",))

@pytest.mark.slow
def test_a_recomputed_mlp_keeps_only_its_input_and_trains_the_same() -> None:
    """The whole-MLP candidate (RECOMPUTABLE's mlp): compiled, the model keeps neither the up projection's
    output nor the SwiGLU product for the backward, exactly those fewer and nothing else, and gives the
    eager model's loss and every gradient."""

    kept = _kda_saved_gib()
    recomputed = _kda_saved_gib("mlp")
    tokens, layers = 3 * 64, 2
    # bf16 each: the MLP's input [tokens, 256], the up projection's output [tokens, 2 hidden], the product
    # [tokens, hidden] (hidden = int(2/3 of 4 x 256) rounded as mixers/model.py rounds it) and the two
    # weights' casts
    per_layer = tokens * (256 + 1408 + 704) * 2 + (1408 * 256 + 256 * 704) * 2
    assert kept["mlp"] - recomputed["mlp"] == pytest.approx(layers * per_layer / 2**30)
    assert recomputed["mlp"] == 0
    assert (kept["mixer"], kept["norms"], kept["rest"]) == \
        (recomputed["mixer"], recomputed["norms"], recomputed["rest"])
    _compiled_model_matches_eager("kda", {"backend": "aot_eager"}, 1e-6, 1e-5, ("mlp",))
