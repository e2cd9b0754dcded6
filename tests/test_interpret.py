"""The kernels' 16-bit path on the CPU: Triton's interpreter computing bf16 as the GPU does (kernels/triton/
interpret.py), then every op of the family fed bf16 inputs against the float64 token loop within the GPU
check's bounds (tests/gpu/check_kernels.py, FLA's test bounds).

Without the patch the interpreter's bf16 dots multiply bit patterns and its bf16 casts truncate: the ops'
bf16 errors are 1e10 and more, and the casts miss torch's rounding.
"""

from __future__ import annotations

import os

# must precede the first triton import of the process
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks.common import CHECK_BOUNDS, errors_of, make_inputs  # noqa: E402
from kernels.naive import naive_recurrent  # noqa: E402
from kernels.triton import VARIANTS, triton_chunk  # noqa: E402
from kernels.triton.chunk import INTERPRET  # noqa: E402

pytestmark = pytest.mark.skipif(
    not INTERPRET, reason="kernels.triton was imported without TRITON_INTERPRET=1; run this file on its own"
)

BOUNDS = CHECK_BOUNDS
# fp32 inputs meet the token loop to 1e-4 (tests/test_triton.py); bf16's rounding alone is about 2e-3
FP32_TOL = 1e-4


@triton.jit
def _dot_kernel(a, b, c, N: tl.constexpr):
    o = tl.arange(0, N)
    b_a = tl.load(a + o[:, None] * N + o[None, :])
    b_b = tl.load(b + o[:, None] * N + o[None, :])
    tl.store(c + o[:, None] * N + o[None, :], tl.dot(b_a, b_b))


@triton.jit
def _cast_kernel(x, y, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o, tl.load(x + o).to(tl.bfloat16))


def test_a_bf16_dot_is_the_fp32_product_of_the_bf16_values() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(32, 32, generator=gen).to(torch.bfloat16) for _ in range(2))
    c = torch.empty(32, 32)
    _dot_kernel[(1,)](a, b, c, N=32)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-6, atol=1e-5)


def test_a_cast_to_bf16_rounds_to_nearest_even_as_torch_does() -> None:
    gen = torch.Generator().manual_seed(0)
    ulp = 2.0**-7  # bf16's spacing in [1, 2)
    x = torch.cat([
        torch.randn(200, generator=gen) * 10.0 ** torch.randint(-30, 30, (200,), generator=gen),
        torch.tensor([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 + 2**-20,  # ties, near-ties
                      3.3e38, 3.4e38, -3.4e38, float("inf"), -float("inf"), 0.0, -0.0,  # to max, past it
                      1e-39, -3e-40, 1.1754942e-38]),  # subnormals
    ])
    x = torch.cat([x, torch.zeros(256 - len(x))])
    y = torch.empty(256, dtype=torch.bfloat16)
    _cast_kernel[(1,)](x, y, N=256)
    assert torch.equal(y.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    nan = torch.full((256,), float("nan"))
    _cast_kernel[(1,)](nan, y, N=256)
    assert y.isnan().all()


def _bf16_errors(decay: str, delta: bool, lower_bound: float | None, T: int, chunk_size: int) -> dict:
    # as the GPU check measures them: bf16 q, k, v and beta (g and the initial state fp32, as a layer emits
    # them), the layer's gates, against the token loop on the same rounded inputs, here in float64
    inputs = make_inputs(decay, delta, 1, T, 2, 32, 32, seed=T, lower_bound=lower_bound, dtype=torch.bfloat16,
                         layer_gates=True)  # fmt: skip
    names = [n for n, t in inputs.items() if t is not None]
    ref = {n: inputs[n].detach().double().requires_grad_(True) for n in names}
    o_ref, ht_ref = naive_recurrent(
        ref["q"], ref["k"], ref["v"], ref.get("g"), ref.get("beta"), None, ref["initial_state"], True
    )
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(o_ref.shape, generator=gen), torch.randn(ht_ref.shape, generator=gen)
    ((o_ref * do.double()).sum() + (ht_ref * dht.double()).sum()).backward()

    def ours(q, k, v, g, beta, initial_state, output_final_state):
        return triton_chunk(
            q, k, v, g, beta, None, initial_state, output_final_state, chunk_size, lower_bound
        )

    errors, note = errors_of(
        ours, inputs, (o_ref.detach(), ht_ref.detach()), {n: t.grad for n, t in ref.items()}, do, dht,
        infer=True,
    )  # fmt: skip
    assert not note, note
    return errors


# the edit-test loop (`-m "not slow"`) keeps T = 100 in the forms of few programs
SHAPES = [(100, 64, "few programs")] + [
    pytest.param(*shape, marks=pytest.mark.slow)
    for shape in [(63, 16, "few programs"), (100, 64, "many programs"), (63, 16, "many programs")]
]


@pytest.mark.parametrize(("T", "chunk_size", "forms"), SHAPES)
@pytest.mark.parametrize(("name", "decay", "delta", "lower_bound"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_the_bf16_path_meets_the_gpu_checks_bounds(
    monkeypatch: pytest.MonkeyPatch, name: str, decay: str, delta: bool, lower_bound: float | None, T: int,
    chunk_size: int, forms: str,
) -> None:
    # odd lengths with an initial state: T = 100 ends inside a chunk of 64; T = 63 is four chunks of 16,
    # the last one short. Output, final state, every gradient and the no-grad forward. "many programs": the
    # forms the launch rules pick where the state passes fill the GPU, as at the training shapes (B = 256),
    # with the thresholds at 0 (tests/test_triton.py's many_programs)
    if forms == "many programs":
        from kernels.triton import plan

        monkeypatch.setattr(plan, "FILL_PROGRAMS", 0)
        monkeypatch.setattr(plan, "MANY_HEADS", 0)
    errors = _bf16_errors(decay, delta, lower_bound, T, chunk_size)
    over = {n: f"{e:.1e} > {BOUNDS[n]:.0e}" for n, e in errors.items() if not e <= BOUNDS[n]}
    assert not over, over
    # the 16-bit path really ran: its output is bf16's rounding away from the token loop, not fp32's
    assert errors["o"] > 10 * FP32_TOL, errors


@triton.jit
def _f32_dot_kernel(a, b, c, N: tl.constexpr):
    o = tl.arange(0, N)
    b_a = tl.load(a + o[:, None] * N + o[None, :])
    b_b = tl.load(b + o[:, None] * N + o[None, :])
    tl.store(c + o[:, None] * N + o[None, :], tl.dot(b_a, b_b))  # the default input precision: tf32


@pytest.mark.parametrize("mode", ["rne", "trunc"])
def test_emulated_tf32_rounds_the_fp32_operands_of_a_tf32_dot(mode: str) -> None:
    from kernels.triton import interpret

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 32, generator=gen), torch.randn(32, 32, generator=gen)

    def tf32(x: torch.Tensor) -> torch.Tensor:  # 10 mantissa bits, by arithmetic on the value
        mantissa, exponent = torch.frexp(x.double())
        scaled = mantissa * 2.0**11
        scaled = torch.round(scaled) if mode == "rne" else torch.trunc(scaled)  # (round: half to even)
        return torch.ldexp(scaled / 2.0**11, exponent).float()

    c = torch.empty(32, 32)
    try:
        interpret.emulate_tf32(mode)
        _f32_dot_kernel[(1,)](a, b, c, N=32)
    finally:
        interpret.emulate_tf32(None)
    torch.testing.assert_close(c, tf32(a) @ tf32(b), rtol=1e-6, atol=1e-5)
    assert not torch.allclose(c, a @ b, rtol=1e-5, atol=1e-5)  # the rounding is there
    _f32_dot_kernel[(1,)](a, b, c, N=32)  # and gone again with None
    torch.testing.assert_close(c, a @ b, rtol=1e-6, atol=1e-5)


def test_lowp_regimes_writes_every_form_per_regime(tmp_path) -> None:
    # benchmarks/lowp_regimes.py at a small shape: a row per op, regime and input form, the bf16 path's
    # errors bf16's, the fp32 path's fp32's, the layer's form (v alone in bf16) between, and the table
    from benchmarks import lowp_regimes
    from kernels.triton import plan

    rules = plan.FILL_PROGRAMS, plan.MANY_HEADS
    assert lowp_regimes.main(["--out", str(tmp_path), "--device", "cpu", "--T", "40", "--K", "16",
                              "--ops", "gated_delta_rule", "--regimes", "layer", "same_keys"]) == 0
    import csv

    rows = list(csv.DictReader(open(tmp_path / "lowp_regimes.csv")))
    forms = ["fp32 (exact)", "bf16", "layer (v bf16)"]
    assert [(r["regime"], r["inputs"]) for r in rows] == [(regime, form) for regime in ("layer", "same_keys")
                                                          for form in forms]
    for fp32, bf16, layer in zip(rows[::3], rows[1::3], rows[2::3], strict=True):
        assert float(fp32["o"]) < 1e-5 < 1e-3 < float(bf16["o"]) < 1e-2, (fp32, bf16)
        assert 1e-5 < float(layer["o"]) < 5e-3, layer  # v's rounding shows, within the GPU check's bound
        assert fp32["finite"] == bf16["finite"] == layer["finite"] == "1.0"
    table = (tmp_path / "lowp_regimes.md").read_text()
    assert "| gated_delta_rule | same_keys | bf16 |" in table
    assert "| gated_delta_rule | same_keys | layer (v bf16) |" in table
    # the launch rules it set for itself are undone: later tests of the same process plan as before
    assert (plan.FILL_PROGRAMS, plan.MANY_HEADS) == rules


def test_kda_widens_16_bit_keys_where_its_16_bit_kernels_lose_a_recurring_key(tmp_path) -> None:
    # a recurring key with beta near 1 (lowp_regimes' same_keys): KDA's 16-bit kernels go past the GPU
    # check's bounds already at T=40, K=16; the op as called (bf16 in, bf16 out) widens q, k, beta and stays
    # within them, and the layer's form (v alone in bf16) too
    import csv

    import kernels.triton
    from benchmarks import lowp_regimes

    assert lowp_regimes.main(["--out", str(tmp_path), "--device", "cpu", "--T", "40", "--K", "16",
                              "--ops", "kda_bounded", "--regimes", "same_keys"]) == 0
    assert kernels.triton.WIDE_KDA_KEYS  # restored
    rows = {r["inputs"]: r for r in csv.DictReader(open(tmp_path / "lowp_regimes.csv"))}
    assert set(rows) == {"fp32 (exact)", "bf16", "bf16, 16-bit kernels", "layer (v bf16)"}
    bounds = lowp_regimes.BOUNDS

    def over(row: dict) -> list[str]:
        return [name for name in bounds if float(row[name]) > bounds[name]]

    assert over(rows["bf16, 16-bit kernels"]), rows["bf16, 16-bit kernels"]
    assert over(rows["bf16"]) == over(rows["layer (v bf16)"]) == [], (rows["bf16"], rows["layer (v bf16)"])
    # bf16 in, bf16 out, gradients in the inputs' dtypes
    q, k, v = (torch.nn.functional.normalize(torch.randn(1, 20, 1, 16), dim=-1).bfloat16().requires_grad_()
               for _ in range(3))
    beta = torch.rand(1, 20, 1).bfloat16().requires_grad_()
    g = -torch.rand(1, 20, 1, 16)
    o, _ = kernels.triton.triton_chunk(q, k, v, g, beta, lower_bound=-5.0)
    assert o.dtype == torch.bfloat16
    wide, _ = kernels.triton.triton_chunk(q.float(), k.float(), v, g, beta.float(), lower_bound=-5.0)
    assert torch.equal(o, wide.bfloat16())  # what the op runs by default: the fp32 kernels
    o.float().sum().backward()
    assert (q.grad.dtype, k.grad.dtype, v.grad.dtype, beta.grad.dtype) == (torch.bfloat16,) * 4


def test_lowp_regimes_keeps_named_saved_buffers_in_bf16_for_the_backward(tmp_path) -> None:
    # --saved: the layer's form again with kept buffers rounded to bf16 between forward and backward, a row
    # per form: the forward's output is unchanged, the gradients that read them move
    import csv

    from benchmarks import lowp_regimes

    assert lowp_regimes.main(["--out", str(tmp_path), "--device", "cpu", "--T", "40", "--K", "16", "--ops",
                              "kda_bounded", "--regimes", "layer", "--saved", "h", "w", "h+w"]) == 0
    rows = {r["inputs"]: r for r in csv.DictReader(open(tmp_path / "lowp_regimes.csv"))}
    layer = rows["layer (v bf16)"]
    for label in ("layer (v bf16), saved h bf16", "layer (v bf16), saved w bf16",
                  "layer (v bf16), saved h+w bf16"):
        row = rows[label]
        assert row["o"] == layer["o"] and row["final_state"] == layer["final_state"], label
        assert any(row[n] != layer[n] for n in ("dq", "dk", "dv", "dg", "dbeta", "dinitial_state")), label
    # a buffer the plan does not keep (GDN has no per-channel decayed keys; KDA's fp32 path forms them in
    # the reverse state pass) is refused, not a silent row
    for op in ("gated_delta_rule", "kda_bounded"):
        with pytest.raises(RuntimeError, match="saved kd in bf16 changed 0 values, absent"):
            lowp_regimes.main(["--out", str(tmp_path / op), "--device", "cpu", "--T", "40", "--K", "16",
                               "--ops", op, "--regimes", "layer", "--saved", "kd"])
