"""The training step on the GPU: no host-device sync between log steps, torch.compile equal to eager, the
lean backward as close to fp32 as the plain one, the short conv's taps as torch ops (compiled) equal to its
kernels, a non-finite step skipped on the device, and the compiled body replayed as CUDA graphs training as
it does launched kernel by kernel.
`TRITON_INTERPRET=0 python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from benchmarks.common import CHECK_BOUNDS, rel_rms

ROOT = Path(__file__).resolve().parents[2]

# skipped where there is no GPU or Triton interprets: tests/gpu/conftest.py
pytestmark = pytest.mark.gpu

MIXERS = ["kda", "gdn", "mamba2", "gla", "deltanet", "linear_attn", "attention"]
# Kimi Linear's hybrid (model.pattern): three KDA layers and one of attention, in the short form
HYBRID = "kda*3,attention"
# Kimi Linear's own KDA (the yaml's is K3's): the softplus gate takes the kernels' unbounded-gate path
KIMI_KDA = "kda_kimi"
KIMI_SWITCHES = {"gate": "softplus", "output_gate_rank": "low"}


def _ids(value: object) -> str:
    return "hybrid" if value == HYBRID else str(value)


def _setup(mixer: str, B: int = 8, T: int = 256, lean: bool = False, task_name: str = "mqar"):
    from harness import step as steps
    from mixers.model import LanguageModel
    from mixers.pattern import expand, mixer_yaml

    device = torch.device("cuda")
    task = OmegaConf.load(ROOT / "conf" / "task" / f"{task_name}.yaml")
    task.seq_len = T
    generate, vocab = steps.load_task(task)
    inputs, labels = generate(B, T, seed=0)
    torch.manual_seed(0)
    # a pattern's layers take their kinds' yamls; the `mixer` node is its first kind's
    pattern = expand(mixer.split(",")) if "," in mixer else None
    cfg = mixer_yaml(pattern[0] if pattern else "kda" if mixer == KIMI_KDA else mixer)
    if mixer == KIMI_KDA:
        cfg.update(KIMI_SWITCHES)
    model = LanguageModel(vocab, cfg, lean_backward=lean,
                          **({"num_layers": len(pattern), "pattern": pattern} if pattern else {})).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = steps.make_optimizer(params, OmegaConf.load(ROOT / "conf" / "optim" / "adamw.yaml"))
    autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    return steps, model, params, optimizer, autocast, inputs.to(device), labels, device


@pytest.mark.parametrize("lean", [False, True], ids=["plain", "lean"])
@pytest.mark.parametrize("mixer", [*MIXERS, HYBRID, KIMI_KDA], ids=_ids)
def test_no_sync_between_log_steps(mixer: str, lean: bool) -> None:
    steps, model, params, optimizer, autocast, inputs, labels, device = _setup(mixer, lean=lean)
    batch = steps.make_batch(inputs, labels, device)
    for step in range(4):
        # the first step compiles and autotunes (which may read back); the later ones must not sync
        if step == 2:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            batch = steps.make_batch(inputs, labels, device)
            loss, _ = steps.forward_backward(model, model.features, batch, optimizer, autocast, False)
            steps.clip_and_guard(params, 1.0, loss, optimizer)
            optimizer.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss).item()


def _loss_and_grads(steps, model, features, params, batch, autocast):
    with autocast():
        loss, _ = steps.batch_loss(model, features, batch)
    return loss.float(), [g.float() for g in torch.autograd.grad(loss, params)]


@pytest.mark.parametrize(("mixer", "lean"), [("kda", False), ("gdn", False), ("mamba2", False),
                                             ("attention", False), ("kda", True), ("mamba2", True),
                                             (HYBRID, False), (KIMI_KDA, False)],
                         ids=_ids)
def test_compiled_body_equals_eager(mixer: str, lean: bool) -> None:
    _compiled_equals_eager(mixer, lean)


@pytest.mark.parametrize("parts", [("qk", "mlp"), ("qk_norm", "swiglu")], ids="+".join)
@pytest.mark.parametrize("mixer", ["kda", "gdn"])
def test_recomputed_compiled_body_equals_eager(mixer: str, parts: tuple[str, ...]) -> None:
    """model.recompute (mixers.model.RECOMPUTABLE), compiled by inductor on the GPU: the same loss and
    gradients as the eager step (which it leaves as it is)."""
    _compiled_equals_eager(mixer, False, parts)


def _compiled_equals_eager(mixer: str, lean: bool, recompute: tuple[str, ...] = ()) -> None:
    steps, model, params, optimizer, autocast, inputs, labels, device = _setup(mixer, lean=lean)
    model.set_recompute(recompute)
    batch = steps.make_batch(inputs, labels, device)
    _dynamo_afresh()
    compiled = torch.compile(model.features)
    fp32 = contextlib.nullcontext
    # in fp32 the compiled graph differs from eager only by the order of its fused elementwise work
    ref_loss, ref_grads = _loss_and_grads(steps, model, model.features, params, batch, fp32)
    loss, grads = _loss_and_grads(steps, model, compiled, params, batch, fp32)
    assert abs(float(loss - ref_loss)) <= 1e-4 * abs(float(ref_loss))
    # 5e-3: a per-head parameter's gradient (A_log, dt_bias: two numbers) sums every position's term, with
    # cancellation, so rounding differences of 1e-7 in the fused glue show up at ~1e-3 there
    for ref, ours in zip(ref_grads, grads, strict=True):
        assert rel_rms(ref, ours) < 5e-3
    # under bf16 autocast each path rounds differently; compiled must be as close to fp32 as eager is
    _, eager_bf16 = _loss_and_grads(steps, model, model.features, params, batch, autocast)
    _, compiled_bf16 = _loss_and_grads(steps, model, compiled, params, batch, autocast)
    for ref, eager, ours in zip(ref_grads, eager_bf16, compiled_bf16, strict=True):
        assert rel_rms(ref, ours) <= 2 * rel_rms(ref, eager) + 1e-2
    _assert_compiled(2)  # one graph in fp32, one under autocast


@pytest.mark.parametrize("mixer", ["kda", "mamba2"])
def test_shifted_conv_compiled_equals_the_kernels_step(mixer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """kernels/conv.py CUDA_IMPL="shifted" (the taps as torch ops, fused by inductor), compiled: the loss and
    gradients of the step on the Triton conv kernels, in fp32 and as close to fp32 under bf16 autocast."""
    from kernels import conv as conv_ops

    steps, model, params, optimizer, autocast, inputs, labels, device = _setup(mixer)
    batch = steps.make_batch(inputs, labels, device)
    fp32 = contextlib.nullcontext
    ref_loss, ref_grads = _loss_and_grads(steps, model, model.features, params, batch, fp32)
    _, kernels_bf16 = _loss_and_grads(steps, model, model.features, params, batch, autocast)
    monkeypatch.setattr(conv_ops, "CUDA_IMPL", "shifted")
    _dynamo_afresh()
    compiled = torch.compile(model.features)
    loss, grads = _loss_and_grads(steps, model, compiled, params, batch, fp32)
    assert abs(float(loss - ref_loss)) <= 1e-4 * abs(float(ref_loss))
    for ref, ours in zip(ref_grads, grads, strict=True):
        assert rel_rms(ref, ours) < 5e-3
    _, shifted_bf16 = _loss_and_grads(steps, model, compiled, params, batch, autocast)
    for ref, kernels, ours in zip(ref_grads, kernels_bf16, shifted_bf16, strict=True):
        assert rel_rms(ref, ours) <= 2 * rel_rms(ref, kernels) + 1e-2
    _assert_compiled(2)


def _dynamo_afresh() -> None:
    # every model's `features` is one code object to dynamo, whose recompile limit (8) the models of these
    # tests would pass, and past it dynamo runs eager without a word: each test compiles from a clean slate
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def _assert_compiled(graphs: int) -> None:
    made = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert made >= graphs, f"torch.compile made {made} graph(s), expected {graphs}: a compiled case ran eager"


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_lean_step_is_as_close_to_fp32_as_the_plain_step(compiled: bool) -> None:
    """KDA at the grid's Palindrome 2,048, where a lean + compiled run did not learn what the plain one
    did: under bf16 autocast each gradient of the lean step no farther from the fp32 plain step's than the
    plain bf16 step's is (bf16 noise: the two round differently, so twice, plus 5e-3 for the few-element
    gradients of A_log and the biases), in either form."""
    def grads(lean: bool, autocast) -> list[torch.Tensor]:  # noqa: ANN001
        steps, model, params, _, _, inputs, labels, device = _setup("kda", B=4, T=2048, lean=lean,
                                                                     task_name="palindrome")
        batch = steps.make_batch(inputs, labels, device)
        features = torch.compile(model.features) if compiled and autocast is not None else model.features
        return _loss_and_grads(steps, model, features, params, batch, autocast or contextlib.nullcontext)[1]

    bf16 = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    _dynamo_afresh()
    ref, plain, lean = grads(False, None), grads(False, bf16), grads(True, bf16)
    if compiled:
        _assert_compiled(2)  # the plain model's graph and the lean one's
    errors = [(i, rel_rms(r, ours), rel_rms(r, theirs)) for i, (r, ours, theirs)
              in enumerate(zip(ref, lean, plain, strict=True))]
    worse = [(i, f"lean {e_lean:.2e}", f"plain {e_plain:.2e}") for i, e_lean, e_plain in errors
             if e_lean > 2 * e_plain + 5e-3]
    assert not worse, worse


def test_hybrid_decodes_step_by_step_as_its_forward_on_the_gpu() -> None:
    # the KDA layers' decode step is the Triton recurrent kernel here, the attention layer's a KV cache
    steps, model, params, optimizer, autocast, inputs, labels, device = _setup(HYBRID, B=4, T=75)
    with torch.no_grad():
        logits = model(inputs).float()
        caches = model.init_cache(4, device=device, dtype=torch.float32)
        stepped = torch.stack([model.step(inputs[:, t], caches) for t in range(inputs.shape[1])], dim=1)
    # fp32 on a GPU: the chunk kernels' dots run in TF32, so the forward meets the decode steps to the GPU
    # check's bound on o, not to fp32's rounding (1.7e-3 on the H200)
    assert rel_rms(logits, stepped.float()) < CHECK_BOUNDS["o"]


def test_non_finite_step_is_skipped_on_the_device() -> None:
    steps, model, params, optimizer, autocast, inputs, labels, device = _setup("kda")
    batch = steps.make_batch(inputs, labels, device)
    loss, _ = steps.forward_backward(model, model.features, batch, optimizer, autocast, False)
    params[0].grad.fill_(float("nan"))
    before = [p.detach().clone() for p in params]
    steps.clip_and_guard(params, 1.0, loss, optimizer)
    optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(before, params, strict=True))


@pytest.mark.parametrize("form", ["passes", "whole", "whole-w4", "whole-w8"])
@pytest.mark.parametrize("V", [64, 8192, 8200])
def test_fused_softmax_kernel_equals_torch_chain(V: int, form: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Both softmax kernels (kernels/triton/cross_entropy.py): rows in two passes, and held whole (on the
    default's warps and on 4 and 8, which the loss benchmark times)."""
    from kernels.triton import cross_entropy
    from mixers.loss import linear_cross_entropy

    whole = form.startswith("whole")
    monkeypatch.setattr(cross_entropy, "WHOLE_ROW_LIMIT", cross_entropy.WHOLE_ROW_MAX if whole else 0)
    warps = int(form.removeprefix("whole-w")) if form.startswith("whole-w") else None
    monkeypatch.setattr(cross_entropy, "WHOLE_ROW_WARPS", warps)

    generator = torch.Generator().manual_seed(V)
    hidden0 = torch.randn(5000, 256, generator=generator).cuda()
    weight0 = (torch.randn(V, 256, generator=generator) * 0.1).cuda()
    targets = torch.randint(0, V, (5000,), generator=generator).cuda()
    results = []
    for impl in ("torch", "triton"):
        hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        loss, hits = linear_cross_entropy(hidden, weight, targets, block_rows=1536, impl=impl)
        loss.backward()
        results.append((loss, hits, hidden.grad, weight.grad))
    (ref, ref_hits, ref_dh, ref_dw), (loss, hits, dh, dw) = results
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-3)
    assert (hits != ref_hits).float().mean() < 1e-3  # an exact tie may round either way under TF32
    assert rel_rms(ref_dh, dh) < 1e-4 and rel_rms(ref_dw, dw) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_kernel_equals_reference(dtype: torch.dtype) -> None:
    from kernels.swiglu import swiglu, swiglu_reference

    # the MLP's shape at d_model 256 (hidden 704), an odd row count; both against the fp32 reference
    generator = torch.Generator().manual_seed(0)
    h32 = (torch.randn(4099, 2 * 704, generator=generator) * 2).cuda()
    dout = torch.randn(4099, 704, generator=generator).cuda()
    exact = h32.clone().requires_grad_()
    ref_out = swiglu_reference(exact)
    (ref_dh,) = torch.autograd.grad(ref_out, exact, dout)
    errors = []
    for impl in ("torch", "triton"):
        h = h32.to(dtype).requires_grad_()
        out = swiglu(h, impl=impl)
        (dh,) = torch.autograd.grad(out, h, dout.to(dtype))
        errors.append((rel_rms(ref_out, out.float()), rel_rms(ref_dh, dh.float())))
    (torch_out, torch_dh), (out_err, dh_err) = errors
    # fp32: Triton's exp on the GPU is the approximate ex2 instruction, a few ulp from torch's expf
    bound = 1e-5 if dtype == torch.float32 else 2e-2
    assert out_err < bound and dh_err < bound
    assert out_err <= 2 * torch_out + 1e-5 and dh_err <= 2 * torch_dh + 1e-5


@pytest.mark.parametrize("mixer", ["kda", "gdn", "mamba2", "attention", "gla", "deltanet", "linear_attn",
                                   "longhorn"])
def test_cuda_graphs_train_as_the_kernel_by_kernel_step(make_cfg, tmp_path: Path, mixer: str) -> None:  # noqa: ANN001
    """trainer.cuda_graphs=auto on a GPU: inductor records and replays the compiled body (no skip), and a
    short run, evaluated at L and 2L as the Fig. 4 grid is, logs the losses, accuracies and evals of the
    same run launched kernel by kernel (the same kernels replayed), its summary saying which it took."""
    import json

    from harness.trainer import train

    common = (f"mixer={mixer}", "task=mqar", "task.seq_len=128", "trainer.device=cuda",
              "trainer.compile=true", "trainer.batch_size=32", "trainer.max_steps=40",
              "trainer.eval_every=20", "trainer.log_every=10", "trainer.cpu_threads=null",
              "task.num_train=4000", "task.eval_seq_lens=[128,256]")
    runs, peaks = {}, {}
    for graphs in (False, True):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        cfg = make_cfg(*common, f"trainer.cuda_graphs={'auto' if graphs else 'false'}", tiny=False)
        summary = train(cfg, tmp_path / str(graphs), mixer_name=mixer)
        assert summary["status"] == "completed" and summary["cuda_graphs"] is graphs, summary
        if graphs:
            assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0
        peaks[graphs] = summary["peak_memory_gib"]
        # the launch's peak is the higher of its steps' and its evals' (read at each switch of phase)
        phases = summary["train_peak_memory_gib"], summary["eval_peak_memory_gib"]
        assert min(phases) > 0 and peaks[graphs] == max(phases), summary
        lines = (tmp_path / str(graphs) / "metrics.jsonl").read_text().splitlines()
        runs[graphs] = [json.loads(line) for line in lines]
    plain, replayed = runs[False], runs[True]
    # the graphs' pool (a recording per shape: training, eval at L and at 2L) keeps about what the plain
    # step's allocator does
    assert 0 < peaks[True] <= 1.2 * peaks[False] + 0.25, peaks
    assert [r["step"] for r in plain] == [r["step"] for r in replayed]
    for a, b in zip(plain, replayed, strict=True):
        for key in a.keys() & b.keys():
            # An accuracy at chance flips with near-tied logits: KDA's kernel-by-kernel step alone differs
            # run to run by two of its 3,040 scored tokens, so accuracies get three tokens' leeway.
            if key.startswith(("train/", "eval/")):
                tol = {"rel": 2e-3, "abs": 1e-3 if "acc" in key else 1e-4}
                assert b[key] == pytest.approx(a[key], **tol), (a["step"], key, a[key], b[key])
