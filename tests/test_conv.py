"""The short convolution: the Triton kernel (kernels/triton/conv.py) against its reference (kernels/conv.py).

Under Triton's CPU interpreter: output, final state and the gradients of x, weight and the initial state at
odd lengths and channel counts, W in {2, 3, 4}, with and without an initial state; a sequence cut in pieces
and decoded token by token equals one call; the ops pass torch.library.opcheck and compile without a graph
break. The bigger matrix and the sm_90 compile are marked slow; tests/gpu/check_conv.py is the GPU check.
"""

from __future__ import annotations

import contextlib
import os

# must precede the first triton import of the process; a GPU run of this file keeps the interpreter too
os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from benchmarks.common import rel_rms  # noqa: E402
from kernels.conv import MAX_TRITON_CONV_SIZE, short_conv, short_conv_reference  # noqa: E402
from kernels.triton import conv as triton_conv  # noqa: E402
from mixers.linear_base import ShortConvolution  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not triton_conv.INTERPRET,
    reason="kernels.triton.conv was imported without TRITON_INTERPRET=1; run this file on its own",
)

TOL = 1e-5


@pytest.fixture(params=triton_conv.BWD_FORMS)
def bwd_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each form of the backward (kernels/triton/conv.py's BWD_FORM) in turn."""
    monkeypatch.setattr(triton_conv, "BWD_FORM", request.param)
    return request.param


def make(B: int, T: int, C: int, W: int, with_state: bool, seed: int, dtype: torch.dtype = torch.float32):
    """x [B, T, C], weight [C, W] and an initial state [B, C, W - 1] (or None), as leaves needing grad."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=gen).to(dtype).requires_grad_(True)
    weight = torch.randn(C, W, generator=gen).requires_grad_(True)
    state = torch.randn(B, C, W - 1, generator=gen).to(dtype).requires_grad_(True) if with_state else None
    return x, weight, state


def run(x, weight, state, backend: str, dy: torch.Tensor, dstate: torch.Tensor) -> dict[str, torch.Tensor]:
    """Output, final state and the gradients of x, weight and state of sum(y dy) + sum(final_state dstate)."""
    y, final = short_conv(x, weight, state, backend=backend)
    leaves = [x, weight] + ([state] if state is not None else [])
    grads = torch.autograd.grad((y * dy).sum() + (final * dstate).sum(), leaves)
    out = {"y": y, "final_state": final, "dx": grads[0], "dweight": grads[1]}
    if state is not None:
        out["dstate"] = grads[2]
    return out


def double_leaves(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """float64 copies as new leaves needing grad (the reference's inputs); None stays None."""
    return [t.detach().double().requires_grad_(True) if t is not None else None for t in tensors]


@contextlib.contextmanager
def made_by_torch_empty() -> Iterator[list[torch.Tensor]]:
    """Every tensor torch.empty makes inside the block, in a list (the kernels' buffers and outputs)."""
    made, empty = [], torch.empty

    def recording(*shape, **kwargs):  # noqa: ANN002, ANN003
        out = empty(*shape, **kwargs)
        made.append(out)
        return out

    torch.empty = recording
    try:
        yield made
    finally:
        torch.empty = empty


def check(B: int, T: int, C: int, W: int, with_state: bool, seed: int = 0) -> None:
    x, weight, state = make(B, T, C, W, with_state, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    dy, dstate = torch.randn(B, T, C, generator=gen), torch.randn(B, C, W - 1, generator=gen)
    ours = run(x, weight, state, "triton", dy, dstate)
    ref = run(*double_leaves(x, weight, state), "torch", dy.double(), dstate.double())
    assert ours.keys() == ref.keys()
    for name in ref:
        assert ours[name].dtype == torch.float32, name
        err = rel_rms(ref[name], ours[name])
        assert err < TOL, f"{name}: relative RMS error {err:.2e} at {B=} {T=} {C=} {W=} {with_state=}"


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("T", [1, 17, 63, 100])
def test_matches_reference(T: int, W: int, with_state: bool, bwd_form: str) -> None:
    check(2, T, 48, W, with_state)


# Wider channel counts (a partial channel tile at 20, one and several full tiles at 96 and 256) at the tile
# configurations of short and long kernels (W <= 4, W > 4), with lengths around the time tiles' edges; the
# default path's W and T are covered at C=48 by test_matches_reference.
# Without an initial state at C=20 and 96 only: that branch reads no channel-dependent state, so C=256 adds
# nothing to it. Two sequences: the second's offsets are those of any later one.
WIDE = [(C, T, W) for C in (20, 256) for W in (4, 8) for T in (2, 63, 130)] + [
    (96, T, W) for W in (3, 5) for T in (1, 17, 100)]
WIDE_CASES = [(C, T, W, with_state) for C, T, W in WIDE for with_state in (False, True)
              if with_state or C != 256]


@pytest.mark.slow
@pytest.mark.parametrize("C,T,W,with_state", WIDE_CASES)
def test_matches_reference_wide(C: int, T: int, W: int, with_state: bool, bwd_form: str) -> None:
    check(2, T, C, W, with_state, seed=T + W)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs(dtype: torch.dtype, bwd_form: str) -> None:
    """16-bit x and state: outputs and gradients in their dtypes, dweight in the weight's (fp32); fp32 inside
    (the two-pass backward rounds da to x's dtype between its kernels), so the error is the outputs'
    rounding, against a float64 reference on the same rounded inputs."""
    x, weight, state = make(2, 33, 48, 4, True, seed=3, dtype=dtype)
    dy, dstate = torch.randn(2, 33, 48).to(dtype), torch.randn(2, 48, 3).to(dtype)
    ours = run(x, weight, state, "triton", dy, dstate)
    ref = run(*double_leaves(x, weight, state), "torch", dy.double(), dstate.double())
    dtypes = {"y": dtype, "final_state": dtype, "dx": dtype, "dweight": torch.float32, "dstate": dtype}
    for name, want in dtypes.items():
        assert ours[name].dtype == want, name
        # bf16 keeps 8 bits: a relative RMS of about 2^-9 from rounding alone
        assert rel_rms(ref[name], ours[name]) < (8e-3 if dtype == torch.bfloat16 else 1e-3), name


def test_pieces_equal_one_call(bwd_form: str) -> None:
    """A sequence cut in pieces (each starting from the previous final state), down to single decode steps,
    gives the output, final state and gradients of one call."""
    B, T, C, W = 2, 23, 48, 4
    x, weight, _ = make(B, T, C, W, False, seed=5)
    y_one, final_one = short_conv(x, weight, backend="triton")
    dy = torch.randn(B, T, C, generator=torch.Generator().manual_seed(6))
    dx_one, dw_one = torch.autograd.grad((y_one * dy).sum() + final_one.sum(), [x, weight])

    ys, state, start = [], None, 0
    # pieces shorter than W - 1 (the state then reaches back over several calls), single steps, a long piece
    for length in (2, 1, 1, 1, 10, 1, 7):
        y, state = short_conv(x[:, start : start + length], weight, state, backend="triton")
        ys.append(y)
        start += length
    assert start == T
    y_pieces = torch.cat(ys, dim=1)
    dx, dw = torch.autograd.grad((y_pieces * dy).sum() + state.sum(), [x, weight])
    for name, ref, out in (("y", y_one, y_pieces), ("final_state", final_one, state), ("dx", dx_one, dx),
                           ("dweight", dw_one, dw)):  # fmt: skip
        assert rel_rms(ref, out) < TOL, name


def test_decode_steps_equal_the_forward() -> None:
    """T = 1 steps from the module's zero state (the mixers' decoding) equal the full sequence."""
    B, T, C, W = 3, 9, 48, 3
    conv = ShortConvolution(C, W, backend="triton")
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        y_full, final_full = conv(x)
        state = conv.init_state(B, "cpu", x.dtype)
        steps = []
        for t in range(T):
            y, state = conv(x[:, t : t + 1], state)
            steps.append(y)
    assert rel_rms(y_full, torch.cat(steps, dim=1)) < TOL
    assert torch.equal(final_full, state)
    assert torch.equal(state, x[:, T - (W - 1) :].transpose(1, 2))


def test_module_backends_agree_and_auto_takes_the_reference_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    ours, ref = ShortConvolution(96, 4, backend="triton"), ShortConvolution(96, 4, backend="torch")
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 17, 96)
    assert rel_rms(ref(x)[0], ours(x)[0]) < TOL

    def no_kernel(*args: object) -> None:
        raise AssertionError("the Triton kernel ran for backend='auto' on CPU tensors")

    monkeypatch.setattr(triton_conv, "triton_short_conv", no_kernel)
    auto = ShortConvolution(96, 4)
    auto.load_state_dict(ours.state_dict())
    assert torch.equal(auto(x)[0], ref(x)[0])
    with pytest.raises(AssertionError, match="backend='auto'"):
        ours(x)


def test_mixer_backend_reaches_its_convs() -> None:
    """A linear mixer's `backend` picks its convs' path too: q, k, v of backend='triton' (the kernel) equal
    those of backend='torch' (the reference), with a cache (prefill) and without."""
    from mixers.deltanet import DeltaNet

    torch.manual_seed(0)
    ours = DeltaNet(32, num_heads=2, head_dim=16, backend="triton")
    ref = DeltaNet(32, num_heads=2, head_dim=16, backend="torch")
    ref.load_state_dict(ours.state_dict())
    assert {m.backend for m in (ours.q_conv, ours.k_conv, ours.v_conv)} == {"triton"}
    assert ref.q_conv.backend == "torch"
    x = torch.randn(2, 11, 32)
    for cache in (None, "prefill"):
        caches = [m.init_cache(2, "cpu", torch.float32) if cache else None for m in (ours, ref)]
        with torch.no_grad():
            for a, b in zip(ours._qkv(x, caches[0]), ref._qkv(x, caches[1]), strict=True):
                assert rel_rms(b, a) < TOL
        if cache:
            for name in ("conv_q", "conv_k", "conv_v"):
                assert torch.equal(caches[0][name], caches[1][name]), name


def test_opcheck() -> None:
    """Schema, fake (meta) implementation, autograd registration and AOT dispatch of both ops."""
    for with_state in (False, True):
        x, weight, state = make(2, 19, 32, 4, with_state, seed=8)
        torch.library.opcheck(torch.ops.kda_harness.short_conv_fwd.default, (x, weight, state))
        dy = torch.randn(2, 19, 32)
        args = (dy, x.detach(), weight.detach(), None if state is None else state.detach())
        torch.library.opcheck(torch.ops.kda_harness.short_conv_bwd.default, args)


def test_compiles_without_a_graph_break() -> None:
    """fullgraph=True fails on a graph break: the compiler must see the kernel as one opaque op."""
    x, weight, state = make(2, 17, 32, 4, True, seed=9)

    def f(x, weight, state):
        y, final = short_conv(x * 2, weight, state, backend="triton")
        return (y.sin().sum() + final.sum()), y

    torch._dynamo.reset()
    loss_c, y_c = torch.compile(f, backend="aot_eager", fullgraph=True)(x, weight, state)
    grads_c = torch.autograd.grad(loss_c, [x, weight, state])
    loss_e, y_e = f(x, weight, state)
    grads_e = torch.autograd.grad(loss_e, [x, weight, state])
    assert torch.allclose(y_c, y_e)
    for g_c, g_e in zip(grads_c, grads_e, strict=True):
        assert torch.allclose(g_c, g_e, atol=1e-6)


def test_bad_input_raises() -> None:
    x, weight, state = make(2, 5, 16, 4, True, seed=0)
    with pytest.raises(ValueError, match=r"weight is \[16, 1, 4\]; expected \[C, W\]"):
        short_conv(x, weight[:, None], backend="triton")
    with pytest.raises(ValueError, match=r"initial_state is \[2, 16, 4\]; expected \[B, C, W - 1\]"):
        short_conv(x, weight, torch.zeros(2, 16, 4), backend="triton")
    with pytest.raises(ValueError, match="x is .*expected a floating-point"):
        short_conv(torch.zeros(2, 5, 16, dtype=torch.long), weight)
    with pytest.raises(ValueError, match="W >= 2"):
        short_conv(x, weight[:, :1])
    long = torch.randn(16, MAX_TRITON_CONV_SIZE + 1)
    with pytest.raises(ValueError, match=f"W <= {MAX_TRITON_CONV_SIZE}.*backend='torch'"):
        short_conv(x, long, backend="triton")
    # auto takes the reference for what the kernel does not support
    assert short_conv(x, long)[0].shape == x.shape
    with pytest.raises(ValueError, match="float64.*backend='torch'"):
        short_conv(x.double(), weight.double(), backend="triton")
    with pytest.raises(ValueError, match="backend='cuda' is unknown"):
        short_conv(x, weight, backend="cuda")


def test_cpu_tensors_without_the_interpreter_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_conv, "INTERPRET", False)
    x, weight, _ = make(1, 3, 16, 4, False, seed=0)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1.*backend='torch'"):
        short_conv(x, weight, backend="triton")


def test_reference_is_the_definition() -> None:
    """The reference itself against the formula of kernels/conv.py, written out as a loop over taps."""
    B, T, C, W = 2, 6, 5, 3
    x, weight, state = make(B, T, C, W, True, seed=10)
    y, final = short_conv_reference(x, weight, state)
    padded = torch.cat([state.transpose(1, 2), x], dim=1)  # [B, W - 1 + T, C]
    a = sum(weight[:, j] * padded[:, j : j + T] for j in range(W))
    assert torch.allclose(y, torch.nn.functional.silu(a), atol=1e-6)
    assert torch.equal(final, padded[:, T:].transpose(1, 2))


def test_gpu_check_runs_its_cpu_part(tmp_path: Path) -> None:
    """tests/gpu/check_conv.py's correctness part at a tiny size under the interpreter (the GPU runs it at
    paper size, with the timing)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, str(ROOT / "tests/gpu/check_conv.py"), "--cpu", "--out", str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = (tmp_path / "conv_errors.csv").read_text().splitlines()
    assert rows[0].startswith("form,dtype,") and len(rows) > 4, rows
    # both forms of the backward, every case within its bound
    assert {row.split(",")[0] for row in rows[1:]} == set(triton_conv.BWD_FORMS), rows
    assert all(row.endswith(",True") for row in rows[1:]), rows


def test_the_gpu_sweep_checks_every_tile_against_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_conv --sweep reports each tile's worst error as a fraction of its bound, and `ok` false where
    a kernel is off (here the forward's output scaled, as a wrong tile's masking would leave it)."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    try:
        import check_conv
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(check_conv, "_bench", lambda fn: 1.0)
    kept = (dict(triton_conv.CONFIGS), dict(triton_conv.TWO_PASS_CONFIGS), triton_conv.BWD_FORM)
    rows = check_conv.sweep(B=2, T=40, C=32, W=4, device="cpu")
    assert (dict(triton_conv.CONFIGS), dict(triton_conv.TWO_PASS_CONFIGS), triton_conv.BWD_FORM) == kept
    assert len(rows) == len(check_conv.SWEEP)
    assert all(row["ok"] and 0 <= row["err_of_bound"] < 1 for row in rows), rows
    forward = triton_conv.short_conv_fwd
    monkeypatch.setattr(triton_conv, "short_conv_fwd", lambda *a: forward(*a) * 1.01)
    rows = check_conv.sweep(B=2, T=40, C=32, W=4, device="cpu")
    assert not any(row["ok"] for row in rows) and all(row["err_of_bound"] > 1 for row in rows), rows


@pytest.mark.parametrize("W", [3, 4])
def test_the_looped_backward_walks_several_tiles_a_program(monkeypatch: pytest.MonkeyPatch, W: int) -> None:
    """The looped form's first kernel with four tiles a program, over a length whose last program holds
    tiles past T, W = 3 padded to a block of 4 taps, with an initial state: every output and gradient
    equals the reference's, from one weight-gradient partial sum a program."""
    monkeypatch.setattr(triton_conv, "BWD_FORM", "looped")
    block_t = triton_conv._config("da_looped", True, 24, W)[0]
    monkeypatch.setattr(triton_conv, "LOOP_POSITIONS", 4 * block_t)
    assert triton_conv.loop_span(block_t) == 4
    B, T, C = 2, 5 * block_t + 7, 24
    check(B, T, C, W, with_state=True, seed=3)

    x, weight, state = make(B, T, C, W, True, seed=3)
    with made_by_torch_empty() as allocated:
        triton_conv.short_conv_bwd(torch.randn(B, T, C), x.detach(), weight.detach(), state.detach())
    (partials,) = [t for t in allocated if t.dtype == torch.float32 and t.dim() == 3 and t.shape[1] == W]
    assert partials.shape[0] == B * 2  # six tiles a sequence, four a program


def test_the_gpu_loop_sweep_checks_every_config_and_restores_the_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """check_conv --sweep's looped part: a row per LOOP_SWEEP config, each checked against the reference,
    the module's tiles, positions and form as they were afterwards, and `ok` false where dx is off."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    try:
        import check_conv
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(check_conv, "_bench", lambda fn: 1.0)
    kept = (dict(triton_conv.TWO_PASS_CONFIGS), triton_conv.LOOP_POSITIONS, triton_conv.BWD_FORM)
    rows = check_conv.loop_sweep(B=2, T=70, C=32, W=4, device="cpu")
    assert (dict(triton_conv.TWO_PASS_CONFIGS), triton_conv.LOOP_POSITIONS, triton_conv.BWD_FORM) == kept
    assert len(rows) == len(check_conv.LOOP_SWEEP)
    assert all(row["ok"] and 0 <= row["err_of_bound"] < 1 for row in rows), rows
    assert sum(row["default"] for row in rows) == 1
    backward = triton_conv.short_conv_bwd
    monkeypatch.setattr(triton_conv, "short_conv_bwd", lambda *a: (backward(*a)[0] * 1.01, *backward(*a)[1:]))
    rows = check_conv.loop_sweep(B=2, T=70, C=32, W=4, device="cpu")
    assert not any(row["ok"] for row in rows), rows


@pytest.mark.slow
def test_kernels_compile_for_sm90_without_spills() -> None:
    """The compiled path (which the interpreter does not take) builds for an H200 at W = 2, 4 and 8, bf16 x,
    all five kernels (forward, fused backward, the two-pass backward's two, the looped form's first) with
    and without an initial state, and keeps everything in registers."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(ROOT / "tests/gpu/check_conv.py"), "--compile", "--W", "2", "4", "8"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    header, *rows = [line.split() for line in done.stdout.strip().splitlines()]
    assert len(rows) == 3 * 5 * 2, done.stdout
    spills = header.index("spill_bytes")
    assert all(row[spills] == "0" for row in rows), done.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_check(tmp_path: Path) -> None:
    """tests/gpu/check_conv.py on the GPU, compiled (this process keeps the interpreter): within bounds."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(ROOT / "tests/gpu/check_conv.py"), "--out", str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_gpu_checks_least_traffic_counts_what_the_kernels_read_and_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """check_conv's bandwidth figures divide min_bytes by the kernels' time: its count is the tensors each
    launch reads and writes once, and the weight-gradient partials the backward allocates (then sums)."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    try:
        import check_conv
    finally:
        sys.path.pop(0)
    B, T, C, W = 2, 100, 48, 4
    x = torch.randn(B, T, C, dtype=torch.bfloat16)
    weight = torch.randn(C, W)

    monkeypatch.setattr(triton_conv, "BWD_FORM", "fused")
    with made_by_torch_empty() as allocated:
        y = triton_conv.short_conv_fwd(x, weight, None)
        dx, _, _ = triton_conv.short_conv_bwd(torch.randn_like(y), x, weight, None)
    tensor = x.nbytes
    assert check_conv.min_bytes("fwd", B, T, C, W) == y.nbytes + tensor
    (partials,) = [t for t in allocated if t.dtype == torch.float32 and t.dim() == 3]
    block_t = triton_conv._config("bwd", False, C, W)[0]
    assert partials.shape[0] == B * -(-T // block_t)
    assert check_conv.min_bytes("bwd", B, T, C, W, block_t=block_t) == \
        tensor + dx.nbytes + y.nbytes + 2 * partials.nbytes
    # the two-pass backward: da (x's dtype) written by its first kernel and read by its second besides
    monkeypatch.setattr(triton_conv, "BWD_FORM", "two_pass")
    with made_by_torch_empty() as allocated:
        dx, _, _ = triton_conv.short_conv_bwd(torch.randn_like(y), x, weight, None)
    (partials,) = [t for t in allocated if t.dtype == torch.float32 and t.dim() == 3]
    (da,) = [t for t in allocated if t.dtype == x.dtype and t.shape == x.shape and t is not dx]
    block_t = triton_conv._config("da", False, C, W)[0]
    assert partials.shape[0] == B * -(-T // block_t)
    assert check_conv.min_bytes("two_pass", B, T, C, W, block_t=block_t) == \
        tensor + dx.nbytes + y.nbytes + 2 * da.nbytes + 2 * partials.nbytes


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("T", [1, 17, 63])
def test_shifted_taps_match_reference(T: int, W: int, with_state: bool) -> None:
    """short_conv_shifted (CUDA_IMPL="shifted") against the reference: output and the gradients of x, weight
    and the initial state, in float64, at odd lengths, down to a sequence shorter than the kernel."""
    from kernels.conv import short_conv_shifted

    x, weight, state = double_leaves(*make(2, T, 20, W, with_state, seed=3))
    gen = torch.Generator().manual_seed(4)
    dy = torch.randn(2, T, 20, generator=gen, dtype=torch.float64)
    leaves = [x, weight] + ([state] if with_state else [])
    y = short_conv_shifted(x, weight, state)
    ref_y, _ = short_conv_reference(x, weight, state)
    grads = torch.autograd.grad((y * dy).sum(), leaves)
    ref_grads = torch.autograd.grad((ref_y * dy).sum(), leaves)
    assert y.dtype == torch.float64
    assert rel_rms(ref_y, y) < 1e-12
    for name, ours, ref in zip(["dx", "dweight", "dstate"], grads, ref_grads, strict=False):
        assert rel_rms(ref, ours) < 1e-12, name


def test_shifted_taps_compile_to_the_eager_gradients() -> None:
    """Compiled by inductor (the form the step runs on CUDA with CUDA_IMPL="shifted"), the taps give the
    eager output and gradients."""
    from kernels.conv import short_conv_shifted

    x, weight, state = make(2, 37, 24, 4, True, seed=5)
    dy = torch.randn(2, 37, 24, generator=torch.Generator().manual_seed(6))
    leaves = [x, weight, state]
    eager = short_conv_shifted(x, weight, state)
    compiled = torch.compile(short_conv_shifted, fullgraph=True)(x, weight, state)
    grads = torch.autograd.grad((eager * dy).sum(), leaves)
    cgrads = torch.autograd.grad((compiled * dy).sum(), leaves)
    assert rel_rms(eager, compiled) < TOL
    for ours, ref in zip(cgrads, grads, strict=True):
        assert rel_rms(ref, ours) < TOL
