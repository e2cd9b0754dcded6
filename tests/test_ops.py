"""The ops of kernels/: the torch chunkwise backend against the naive token loop (outputs, final state, every
gradient), the single-token steps against the recurrence, numerical safety, and input validation."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest
import torch

import kernels
from benchmarks.common import rel_rms, token_loop_inputs
from kernels import family
from kernels.family import Op

# the six points of the switches' table (kernels.family)
OPS = family.PLAIN
OP_IDS = [op.name for op in OPS]
B, H, K, V = 2, 2, 16, 32
FP32_BOUND = 1e-5
BF16_BOUND = 1e-2


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """These tensors are tiny: one thread avoids thread start-up and, on a busy machine, the OpenMP
    oversubscription that makes small ops 10x slower. Restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def chunk(op: Op) -> Callable:
    return getattr(kernels, op.chunk)


def step(op: Op) -> Callable:
    return getattr(kernels, op.step)


def make_inputs(op: Op, T: int, seed: int, strong_decay: bool = True) -> list[torch.Tensor]:
    """The op's positional inputs at this file's sizes, a few decays strongly negative (helpers)."""
    return token_loop_inputs(op.decay, op.delta_rule, B, T, H, K, V, torch.Generator().manual_seed(seed),
                             strong_decay=strong_decay)


def run_with_grads(
    op: Op,
    inputs: list[torch.Tensor],
    h0: torch.Tensor | None,
    backend: str,
    cotangents: tuple[torch.Tensor, torch.Tensor],
    **kwargs: object,
) -> list[torch.Tensor]:
    """[o, S_T, grad of each input, grad of h0 (if given)] for loss = <o, do> + <S_T, dS>."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    h0_leaf = None if h0 is None else h0.detach().clone().requires_grad_()
    o, S_T = chunk(op)(*leaves, initial_state=h0_leaf, output_final_state=True, backend=backend, **kwargs)
    do, dS = cotangents
    ((o.double() * do).sum() + (S_T.double() * dS).sum()).backward()
    grads = [x.grad for x in leaves] + ([] if h0_leaf is None else [h0_leaf.grad])
    return [o, S_T, *grads]


def names(op: Op, with_h0: bool) -> list[str]:
    return (
        ["o", "S_T", "dq", "dk", "dv"]
        + (["dg"] if op.decay != "none" else [])
        + (["dbeta"] if op.delta_rule else [])
        + (["dh0"] if with_h0 else [])
    )


def cotangents(T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(B, T, H, V, generator=gen, dtype=torch.float64), torch.randn(
        B, H, K, V, generator=gen, dtype=torch.float64
    )


@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
@pytest.mark.parametrize("T", [1, 63, 64, 100, 300])
@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
def test_torch_matches_naive_fp32(op: Op, T: int, with_h0: bool) -> None:
    """fp32 inputs: chunkwise vs the token loop run in float64 on the same values, rel. RMS <= 1e-5 on the
    output, the final state and every gradient."""
    inputs = make_inputs(op, T, seed=T)
    h0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(7)) if with_h0 else None
    cot = cotangents(T, seed=T)
    ref = run_with_grads(op, [x.double() for x in inputs], None if h0 is None else h0.double(), "naive", cot)
    out = run_with_grads(op, inputs, h0, "torch", cot)
    assert out[0].dtype == torch.float32 and out[1].dtype == torch.float32
    errors = {name: rel_rms(r, o) for name, r, o in zip(names(op, with_h0), ref, out, strict=True)}
    assert max(errors.values()) <= FP32_BOUND, errors


@pytest.mark.parametrize("T", [63, 300])
@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
def test_torch_matches_naive_bf16(op: Op, T: int) -> None:
    """bf16 inputs (fp32 initial state): against a float64 loop on the same bf16-rounded values; the bound is
    looser because o and the input gradients come back in bf16."""
    inputs = [x.bfloat16() for x in make_inputs(op, T, seed=100 + T)]
    h0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(8))
    cot = cotangents(T, seed=100 + T)
    ref = run_with_grads(op, [x.double() for x in inputs], h0.double(), "naive", cot)
    out = run_with_grads(op, inputs, h0, "torch", cot)
    assert out[0].dtype == torch.bfloat16 and out[1].dtype == torch.float32
    errors = {name: rel_rms(r, o) for name, r, o in zip(names(op, True), ref, out, strict=True)}
    assert max(errors.values()) <= BF16_BOUND, errors


@pytest.mark.parametrize("chunk_size", [16, 32, 128])
def test_chunk_size_does_not_change_the_result(chunk_size: int) -> None:
    op = OPS[-1]
    inputs = make_inputs(op, 150, seed=3)
    o_ref, S_ref = chunk(op)(*inputs, output_final_state=True, backend="torch", chunk_size=64)
    o, S = chunk(op)(*inputs, output_final_state=True, backend="torch", chunk_size=chunk_size)
    assert rel_rms(o_ref, o) <= FP32_BOUND and rel_rms(S_ref, S) <= FP32_BOUND


@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
def test_scale_and_no_final_state(op: Op) -> None:
    inputs = make_inputs(op, 40, seed=5)
    o_ref, _ = chunk(op)(*[x.double() for x in inputs], scale=0.3, backend="naive")
    o, S_T = chunk(op)(*inputs, scale=0.3, backend="torch")
    assert S_T is None
    assert rel_rms(o_ref, o) <= FP32_BOUND


@pytest.mark.parametrize("backend", ["torch", "naive", "auto"])
@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
def test_steps_equal_the_recurrence(op: Op, backend: str) -> None:
    """Decoding token by token with the step equals the full-sequence op, output by output, and the state."""
    T = 20
    inputs = make_inputs(op, T, seed=11)
    h0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(9))
    o_ref, S_ref = chunk(op)(*[x.double() for x in inputs], initial_state=h0.double(),
                             output_final_state=True, backend="naive")  # fmt: skip
    state = h0
    for t in range(T):
        o_t, state = step(op)(*[x[:, t] for x in inputs], state, backend=backend)
        assert o_t.shape == (B, H, V) and o_t.dtype == torch.float32 and state.dtype == torch.float32
        assert rel_rms(o_ref[:, t], o_t) <= FP32_BOUND, t
    assert rel_rms(S_ref, state) <= FP32_BOUND


def test_step_output_has_q_dtype() -> None:
    op = OPS[-1]
    q, k, v, g, beta = (x[:, 0].bfloat16() for x in make_inputs(op, 1, seed=2))
    o, state = step(op)(q, k, v, g, beta, torch.zeros(B, H, K, V), backend="torch")
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32


@pytest.mark.parametrize("op", [op for op in OPS if op.decay != "none"],
                         ids=[op.name for op in OPS if op.decay != "none"])
def test_strongly_negative_g_is_finite_and_exact(op: Op) -> None:
    """g = -50 at scattered positions and a whole chunk at -20 per token (cumulative -1280: exp(-G) would
    overflow a thousand times over): no inf/NaN anywhere, and still the naive result."""
    T = 200
    inputs = make_inputs(op, T, seed=13, strong_decay=False)
    g = inputs[3]
    g[:, 5] = -50.0
    g[:, 70:134] = -20.0
    g[:, 150::7] = -50.0
    h0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(4))
    cot = cotangents(T, seed=13)
    out = run_with_grads(op, inputs, h0, "torch", cot)
    assert all(torch.isfinite(x).all() for x in out)
    ref = run_with_grads(op, [x.double() for x in inputs], h0.double(), "naive", cot)
    errors = {name: rel_rms(r, o) for name, r, o in zip(names(op, True), ref, out, strict=True)}
    assert max(errors.values()) <= FP32_BOUND, errors


@pytest.mark.parametrize("backend", ["torch", "naive"])
@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
def test_empty_sequence(op: Op, backend: str) -> None:
    inputs = [x[:, :0] for x in make_inputs(op, 4, seed=1)]
    h0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(2))
    o, S_T = chunk(op)(*inputs, initial_state=h0, output_final_state=True, backend=backend)
    assert o.shape == (B, 0, H, V) and torch.equal(S_T, h0)


def test_lower_bound_is_checked_and_changes_nothing() -> None:
    op = OPS[-1]
    q, k, v, g, beta = make_inputs(op, 50, seed=6, strong_decay=False)
    g[:, 3] = -5.0
    o_ref, _ = chunk(op)(q, k, v, g, beta, backend="torch")
    o, _ = chunk(op)(q, k, v, g, beta, backend="torch", lower_bound=-5.0)
    assert torch.equal(o, o_ref)
    with pytest.raises(ValueError, match=r"g has a minimum value of -5 below lower_bound=-2.0"):
        chunk(op)(q, k, v, g, beta, backend="torch", lower_bound=-2.0)
    with pytest.raises(ValueError, match=r"lower_bound=1.0"):
        chunk(op)(q, k, v, g, beta, backend="torch", lower_bound=1.0)


def test_autocast_does_not_lower_the_reference_precision() -> None:
    op = OPS[-1]
    inputs = make_inputs(op, 70, seed=1)
    o_ref, _ = chunk(op)(*inputs, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o, _ = chunk(op)(*inputs, backend="torch")
        o_step, _ = step(op)(*[x[:, 0] for x in inputs], torch.zeros(B, H, K, V), backend="torch")
    assert o.dtype == torch.float32 and torch.equal(o, o_ref)
    assert o_step.dtype == torch.float32 and rel_rms(o_ref[:, 0], o_step) <= FP32_BOUND


def test_auto_backend_is_torch_on_cpu() -> None:
    op = OPS[-1]
    inputs = make_inputs(op, 70, seed=1)
    o_auto, _ = chunk(op)(*inputs, backend="auto")
    o_torch, _ = chunk(op)(*inputs, backend="torch")
    assert torch.equal(o_auto, o_torch)


def test_triton_backend_missing_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # simulate a checkout without kernels/triton (None in sys.modules makes the import fail)
    monkeypatch.setitem(sys.modules, "kernels.triton", None)
    op = OPS[-1]
    inputs = make_inputs(op, 8, seed=1)
    with pytest.raises(RuntimeError, match="backend='triton' needs the Triton kernels"):
        chunk(op)(*inputs, backend="triton")
    with pytest.raises(RuntimeError, match="backend='triton' needs the Triton kernels"):
        step(op)(*[x[:, 0] for x in inputs], torch.zeros(B, H, K, V), backend="triton")


def test_triton_backend_on_the_cpu_without_the_interpreter_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    op = OPS[-1]
    inputs = make_inputs(op, 8, seed=1)
    with pytest.raises(ValueError, match="backend='triton' got tensors on cpu but Triton's interpreter is"):
        chunk(op)(*inputs, backend="triton")
    with pytest.raises(ValueError, match="Triton's interpreter is off"):
        step(op)(*[x[:, 0] for x in inputs], torch.zeros(B, H, K, V), backend="triton")


def _kda_inputs(T: int = 8) -> dict[str, torch.Tensor]:
    q, k, v, g, beta = make_inputs(OPS[-1], T, seed=0)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}


BAD_CHUNK_CALLS = [
    # (id, op name, changes to the kda inputs / extra kwargs, message fragment naming the value)
    ("q_rank", "kda", {"q": torch.randn(B, 8, K)}, r"q has shape \[2, 8, 16\] \(rank 3\)"),
    ("k_shape", "kda", {"k": torch.randn(B, 8, H, K + 1)}, r"k has shape \[2, 8, 2, 17\]"),
    ("v_T", "kda", {"v": torch.randn(B, 9, H, V)}, r"v has shape \[2, 9, 2, 32\]"),
    ("q_int", "kda", {"q": torch.ones(B, 8, H, K, dtype=torch.long)}, r"q has dtype torch.int64"),
    (
        "g_scalar_to_kda",
        "kda",
        {"g": -torch.rand(B, 8, H)},
        r"g has shape \[2, 8, 2\]; expected \[B, T, H, K\]",
    ),
    ("g_channel_to_gdn", "gated_delta_rule", {}, r"g has shape \[2, 8, 2, 16\]; expected \[B, T, H\]"),
    ("g_positive", "kda", {"g": torch.full((B, 8, H, K), 0.5)}, r"g has a maximum value of 0.5"),
    ("g_nan", "kda", {"g": torch.full((B, 8, H, K), float("nan"))}, r"g contains NaN.*diverged"),
    ("g_missing", "kda", {"g": None}, r"g \(log-decay of shape \[B, T, H, K\]"),
    ("beta_shape", "kda", {"beta": torch.rand(B, 8, H, 1)}, r"beta has shape \[2, 8, 2, 1\]"),
    ("beta_missing", "kda", {"beta": None}, r"beta \(the delta-rule write strength"),
    (
        "h0_shape",
        "kda",
        {"initial_state": torch.zeros(B, H, V, K)},
        r"initial_state has shape \[2, 2, 32, 16\]",
    ),
    (
        "h0_dtype",
        "kda",
        {"initial_state": torch.zeros(B, H, K, V, dtype=torch.bfloat16)},
        r"initial_state has dtype torch.bfloat16",
    ),
    ("backend", "kda", {"backend": "cuda"}, r"backend='cuda' is unknown"),
    ("chunk_not_pow2", "kda", {"chunk_size": 48}, r"chunk_size=48"),
    ("chunk_small", "kda", {"chunk_size": 8}, r"chunk_size=8"),
    ("scale", "kda", {"scale": -1.0}, r"scale=-1.0"),
    ("head_dim_zero", "kda", {"q": torch.randn(B, 8, H, 0), "k": torch.randn(B, 8, H, 0)}, r"K=0"),
]


@pytest.mark.parametrize(("op_name", "changes", "message"), [c[1:] for c in BAD_CHUNK_CALLS],
                         ids=[c[0] for c in BAD_CHUNK_CALLS])  # fmt: skip
def test_chunk_validation(op_name: str, changes: dict, message: str) -> None:
    args = _kda_inputs() | changes
    q, k, v, g, beta = (args.pop(n) for n in ("q", "k", "v", "g", "beta"))
    fn = getattr(kernels, f"chunk_{op_name}")
    with pytest.raises(ValueError, match=message):
        fn(q, k, v, g, beta, **args)


BAD_STEP_CALLS = [
    ("state_missing", {"state": None}, r"state \[B, H, K, V\] \(float32\) is required"),
    ("state_shape", {"state": torch.zeros(B, H, K)}, r"state has shape \[2, 2, 16\]"),
    ("state_dtype", {"state": torch.zeros(B, H, K, V, dtype=torch.float16)}, r"torch.float16"),
    (
        "q_rank",
        {"q": torch.randn(B, 1, H, K)},
        r"q has shape \[2, 1, 2, 16\] \(rank 4\); expected \[B, H, K\]",
    ),
    ("g_shape", {"g": -torch.rand(B, H)}, r"g has shape \[2, 2\]; expected \[B, H, K\]"),
    ("beta_shape", {"beta": torch.rand(B, H, 1)}, r"beta has shape \[2, 2, 1\]"),
    ("backend", {"backend": "fast"}, r"backend='fast' is unknown"),
]


@pytest.mark.parametrize(
    ("changes", "message"), [c[1:] for c in BAD_STEP_CALLS], ids=[c[0] for c in BAD_STEP_CALLS]
)
def test_step_validation(changes: dict, message: str) -> None:
    args = {n: x[:, 0] for n, x in _kda_inputs().items()} | {"state": torch.zeros(B, H, K, V)} | changes
    q, k, v, g, beta, state = (args.pop(n) for n in ("q", "k", "v", "g", "beta", "state"))
    with pytest.raises(ValueError, match=message):
        kernels.kda_step(q, k, v, g, beta, state, **args)
