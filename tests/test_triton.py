"""The Triton kernel family against the token-loop reference, under Triton's CPU interpreter.

fp32 at small shapes (the interpreter runs every program in numpy): outputs, final states and the
gradients of q, k, v, g, beta and the initial state must match `naive_recurrent` in float64 to a
relative RMS error of 1e-4. Plus the decode step, and causality of the bounded-gate fast path.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import os
import re
import types

# must precede the first triton import of the process; a GPU run of this file keeps the interpreter too
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from benchmarks.common import Recorder, make_inputs, rel_rms  # noqa: E402
from kernels import family  # noqa: E402
from kernels.naive import naive_recurrent, recurrent_step  # noqa: E402
from kernels.triton import triton_chunk, triton_recurrent_step  # noqa: E402
from kernels.triton.chunk import INTERPRET  # noqa: E402

# compiled kernels cannot take the CPU tensors below; the GPU checks live in tests/gpu/
pytestmark = pytest.mark.skipif(
    not INTERPRET, reason="kernels.triton was imported without TRITON_INTERPRET=1; run this file on its own"
)

# (name, decay, delta rule): the six points of the family table (kernels.family), each with its plain gate
OPS = [(o.name, o.decay, o.delta_rule) for o in family.PLAIN]
TOL = 1e-4
# (name, decay, delta rule, lower_bound): the per-channel decay's variants, for the tests of its alternatives
PER_CHANNEL = [(o.name, o.decay, o.delta_rule, o.lower_bound) for o in family.OPS if o.decay == "channel"]
# (name, decay, delta rule, lower_bound): all seven, the bounded gate beside the six ops
ALL_SEVEN = [(o.name, o.decay, o.delta_rule, o.lower_bound) for o in family.OPS]
# (name, decay, lower_bound): the delta-rule ops, for the tests of the solve and the WY state pass
DELTA_OPS = [(o.name, o.decay, o.lower_bound) for o in family.OPS if o.delta_rule]

def errors_against_naive(inputs: dict, lower_bound: float | None = None, chunk_size: int = 64) -> dict:
    # relative RMS errors of the output, final state and every gradient against the float64 token loop
    names = [n for n, t in inputs.items() if t is not None]
    ours = {n: inputs[n].clone().requires_grad_(True) for n in names}
    ref = {n: inputs[n].double().requires_grad_(True) for n in names}
    o, ht = triton_chunk(
        ours["q"],
        ours["k"],
        ours["v"],
        ours.get("g"),
        ours.get("beta"),
        None,
        ours.get("initial_state"),
        True,
        chunk_size,
        lower_bound,
    )
    o_ref, ht_ref = naive_recurrent(
        ref["q"], ref["k"], ref["v"], ref.get("g"), ref.get("beta"), None, ref.get("initial_state"), True
    )
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(o.shape, generator=gen)
    dht = torch.randn(ht.shape, generator=gen)
    ((o * do).sum() + (ht * dht).sum()).backward()
    ((o_ref * do.double()).sum() + (ht_ref * dht.double()).sum()).backward()
    errors = {"o": rel_rms(o_ref, o), "final_state": rel_rms(ht_ref, ht)}
    errors.update({f"d{n}": rel_rms(ref[n].grad, ours[n].grad) for n in names})
    return errors


def check_against_naive(
    inputs: dict, lower_bound: float | None = None, chunk_size: int = 64, tol: float = TOL
) -> None:
    errors = errors_against_naive(inputs, lower_bound, chunk_size)
    bad = {n: e for n, e in errors.items() if not e <= tol}
    assert not bad, f"relative RMS error above {tol}: {bad} (all: {errors})"


def tune(monkeypatch: pytest.MonkeyPatch, key: str, value: int | None) -> None:
    # a launch setting (kernels.triton.plan.overrides) for the rest of the test: the settings in force live
    # in a context variable, swapped here for one that holds the override too and restored at teardown
    from kernels.triton import plan

    settings = {**plan.current_overrides(), **plan.parse_overrides({key: value})}
    var = contextvars.ContextVar("test_overrides", default=types.MappingProxyType(settings))
    monkeypatch.setattr(plan, "_OVERRIDES", var)


def many_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    # the launch rules as at the benchmark shapes, where the state passes fill the GPU (FILL_PROGRAMS) and
    # B * H >= MANY_HEADS: the thresholds set to 0, so that these small shapes take the forms the rules pick
    # there (the output and the WY products inside the state pass, X kept, L and A_qk triangular, ...)
    from kernels.triton import plan

    monkeypatch.setattr(plan, "FILL_PROGRAMS", 0)
    monkeypatch.setattr(plan, "MANY_HEADS", 0)


def nan_buffers(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    # every buffer the launch code allocates (torch.empty) filled with NaN, so that a read of an entry no
    # kernel wrote shows in the result; returns the list the buffers are appended to, in allocation order
    from kernels.triton import chunk

    real_empty = torch.empty
    made: list[torch.Tensor] = []

    def nan_empty(*shape, **kw):
        x = real_empty(*shape, **kw)
        # (integer buffers, the plan's g16 uint16 decays: their largest value, a decay of 2^-128)
        x.fill_(float("nan") if x.is_floating_point() else torch.iinfo(x.dtype).max)
        made.append(x)
        return x

    monkeypatch.setattr(chunk.torch, "empty", nan_empty)
    return made


def check_no_grad_against_naive(
    inputs: dict, lower_bound: float | None = None, chunk_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    # the forward without a gradient wanted (the kernels' no-grad forms): output and final state against
    # the float64 token loop; returns them
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    h0 = inputs["initial_state"]
    with torch.no_grad():
        o, ht = triton_chunk(*args, None, h0, True, chunk_size, lower_bound)
    o_ref, ht_ref = naive_recurrent(
        *[a.double() if a is not None else None for a in args],
        None,
        h0.double() if h0 is not None else None,
        True,
    )
    assert rel_rms(o_ref, o) <= TOL and rel_rms(ht_ref, ht) <= TOL
    return o, ht


# (T, with_state): from an initial state at every length; without one (the kernels' other branch, which
# does not depend on the number of chunks) at the lengths of one chunk
LENGTHS = [(1, False), (63, False), (64, False), (1, True), (63, True), (64, True), (100, True), (200, True)]


@pytest.mark.parametrize("T,with_state", LENGTHS)
@pytest.mark.parametrize("name,decay,delta", OPS, ids=[op[0] for op in OPS])
def test_chunk_matches_naive(name: str, decay: str, delta: bool, T: int, with_state: bool) -> None:
    B, H = (2, 1) if T <= 64 else (1, 2)
    inputs = make_inputs(decay, delta, B, T, H, K=16, V=32, seed=T + 7 * with_state, with_state=with_state)
    check_against_naive(inputs)


@pytest.mark.parametrize("T,with_state", LENGTHS)
def test_kda_bounded_gate_matches_naive(T: int, with_state: bool) -> None:
    inputs = make_inputs(
        "channel", True, 1, T, 2, K=16, V=32, seed=3 * T, lower_bound=-5.0, with_state=with_state
    )
    check_against_naive(inputs, lower_bound=-5.0)


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("name,decay", [("linear_attn", "none"), ("simple_gla", "scalar")])
def test_intra_gradients_inside_the_dqk_kernel(
    monkeypatch: pytest.MonkeyPatch, name: str, decay: str, T: int
) -> None:
    # without the delta rule and the per-channel decay, the dqk kernel also does the intra-chunk gradients,
    # and the dvt and intra backward kernels do not run
    launched = record_launches(monkeypatch, "_dvt_bwd_kernel", "_intra_bwd_kernel")
    inputs = make_inputs(decay, False, 1, T, 2, K=16, V=32, seed=T + 7)
    check_against_naive(inputs)
    assert launched == []


def record_launches(monkeypatch: pytest.MonkeyPatch, *kernels: str, run: bool = True) -> list:
    # each kernel replaced, in the stage module that holds and launches it, by a Recorder that appends to
    # the list returned and (run) launches the real kernel
    from kernels.triton import chunk

    launched: list = []
    for name in kernels:
        (module,) = [m for m in chunk.STAGES if name in vars(m)]
        real = getattr(module, name)
        if not isinstance(real, Recorder):
            params = inspect.signature(real.fn).parameters.values()
            _RUNTIME_PARAMS[name] = [p.name for p in params if "constexpr" not in str(p.annotation)]
            _KERNEL_SOURCE[name] = inspect.getsource(real.fn)
        monkeypatch.setattr(module, name, Recorder(name, launched, real if run else None))
    return launched


# each recorded kernel's run-time parameters, in order (the positional arguments of its launch)
_RUNTIME_PARAMS: dict[str, list[str]] = {}
_KERNEL_SOURCE: dict[str, str] = {}


def given(launch, pointer: str) -> bool:
    # whether a recorded launch passes the buffer `pointer` (a switch the kernel reads from its buffers: the
    # state pass's out is o given, its WY form L given, the dvt backward's VT_X vt absent); a pointer inside a
    # tuple parameter is named by the kernel's own unpacking of it at entry (`v, vt, x, o = vals`)
    args = dict(zip(_RUNTIME_PARAMS[launch.kernel], launch.args, strict=True))
    if pointer in args:
        return args[pointer] is not None
    for names, param in re.findall(r"^ +((?:\w+, )+\w+) = (\w+)$", _KERNEL_SOURCE[launch.kernel], re.M):
        if param in args and pointer in names.split(", "):
            return args[param][names.split(", ").index(pointer)] is not None
    raise KeyError(f"{launch.kernel} has no pointer {pointer!r}")


@pytest.mark.parametrize("T", [63, 100])
@pytest.mark.parametrize("name,decay,delta", [("gla", "channel", False), ("kda", "channel", True)])
def test_unbounded_gates_dense_where_safe(name: str, decay: str, delta: bool, T: int) -> None:
    # unbounded gates: each 16-row block whose own decay is at most e^75 takes the bounded gate's dense
    # diagonal product, the others the per-position loop, decided at run time. The gates here give both
    # kinds of block: log-sigmoid gates (almost all blocks safe), one block with a decay of e^(15 * 30) in
    # half its channels, and one at e^(15 * 4.6), just inside the limit
    inputs = make_inputs(decay, delta, 1, T, 2, K=16, V=32, seed=T + 11)
    g = inputs["g"]
    g[:, 16:32, :, :8] = -30.0
    g[:, 48:63, 1] = -4.6
    check_against_naive(inputs)


@pytest.mark.parametrize("T", [63, 127])
@pytest.mark.parametrize(
    "name,decay,delta,lower_bound",
    [
        ("delta_rule", "none", True, None),
        ("gated_delta_rule", "scalar", True, None),
        ("kda_bounded", "channel", True, -5.0),
    ],
)
def test_bf16_inverse(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    decay: str,
    delta: bool,
    lower_bound: float | None,
    T: int,
) -> None:
    # 16-bit inputs: L stored in bf16, written by the solve and read by W/U, dqk and dvt. Here fp32 inputs
    # with that one buffer in bf16 (tests/test_interpret.py runs the whole 16-bit path): the errors are
    # then bf16's rounding of L, about 1e-3, while a mis-cast buffer or a missed store is O(1)
    from kernels.triton import solve

    monkeypatch.setattr(solve, "_l_dtype", lambda lowp: torch.bfloat16)
    inputs = make_inputs(
        decay, delta, 1, T, 2, K=16, V=32, seed=T + 5, lower_bound=lower_bound, with_state=True
    )
    errors = errors_against_naive(inputs, lower_bound)
    assert all(e <= 2e-2 for e in errors.values()), errors
    assert not all(e <= TOL for e in errors.values()), errors  # the bf16 buffer is really in use


@pytest.mark.parametrize(
    "helper,name,decay,delta,lower_bound",
    [
        ("_m_dtype", "gla", "channel", False, None),
        ("_m_dtype", "delta_rule", "none", True, None),
        ("_m_dtype", "kda_bounded", "channel", True, -5.0),
    ],
)
def test_bf16_backward_buffers(
    monkeypatch: pytest.MonkeyPatch,
    helper: str,
    name: str,
    decay: str,
    delta: bool,
    lower_bound: float | None,
) -> None:
    # buffers of the backward that 16-bit inputs keep in bf16, loaded into fp32 by their readers: _m_dtype,
    # M_qk and M_kk (the dvt kernel's [C, C] gradients, read by the intra backward). With fp32 inputs in the
    # interpreter the errors are bf16's rounding (about 1e-3) while a mis-cast buffer or a missed conversion
    # is O(1)
    from kernels.triton import chunk

    monkeypatch.setattr(chunk, helper, lambda lowp: torch.bfloat16)
    inputs = make_inputs(
        decay, delta, 1, 100, 2, K=16, V=32, seed=7, lower_bound=lower_bound, with_state=True
    )
    errors = errors_against_naive(inputs, lower_bound)
    assert all(e <= 2e-2 for e in errors.values()), errors
    assert not all(e <= TOL for e in errors.values()), errors  # the bf16 buffers are really in use


class _Allocations(TorchDispatchMode):
    """The shapes and dtypes of the tensors the factory ops allocate inside the block."""

    FACTORIES = ("empty", "empty_like", "empty_strided", "new_empty", "zeros", "zeros_like")

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[tuple[int, ...], torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in self.FACTORIES:
            self.made.append((tuple(out.shape), out.dtype))
        return out


@pytest.mark.parametrize("name,decay,delta", [("kda", "channel", True), ("gla", "channel", False),
                                              ("gdn", "scalar", True), ("delta_rule", "none", True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_keeps_no_gate_copy_and_sums_in_place(
    monkeypatch: pytest.MonkeyPatch, name: str, decay: str, delta: bool, dtype: torch.dtype
) -> None:
    # the backward reads g's values through its cumsum G (kept), so the op keeps no copy of g; and where the
    # partial dq, dk, dG have the final sums' dtype they are the final buffers: one [B, T, H, K] tensor
    # allocated for each of dq, dk and dg (dG per key channel for a scalar g), not two. K != V keeps the
    # shapes apart; the gradients stay those of the reference (the other tests)
    import kernels.triton as kt

    monkeypatch.setattr(kt, "WIDE_KDA_KEYS", False)  # (the 16-bit kernels for bf16, as given)
    B, T, H, K, V = 1, 40, 2, 32, 16
    inputs = make_inputs(decay, delta, B, T, H, K=K, V=V, seed=3, with_state=False, dtype=dtype)
    leaves = {n: t.requires_grad_(True) for n, t in inputs.items() if t is not None}
    g = leaves["g"] * 1.0 if "g" in leaves else None  # a value of its own, as a layer's gate is
    kept: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.add(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o, _ = triton_chunk(leaves["q"], leaves["k"], leaves["v"], g, leaves.get("beta"))
    if g is not None:
        assert g.untyped_storage().data_ptr() not in kept
    made = _Allocations()
    with made:
        o.float().square().sum().backward()
    rows = [m for m in made.made if m[0] == (B, T, H, K)]
    dq_dk_dg = 3 if decay != "none" else 2
    # 16-bit inputs keep bf16 partial sums (their own dtype, fp16's excepted), dG fp32 as the gate
    assert len(rows) == dq_dk_dg, rows
    assert all(torch.isfinite(t.grad).all() for t in leaves.values())


@pytest.mark.parametrize("name,delta,lower_bound", [("kda", True, None), ("kda_bounded", True, -5.0),
                                                    ("gla", False, None)])
@pytest.mark.parametrize("wide", [False, True])
def test_reverse_state_pass_forms_the_decayed_operands_of_fp32_inputs(
    monkeypatch: pytest.MonkeyPatch, name: str, delta: bool, lower_bound: float | None, wide: bool
) -> None:
    # the per-channel decay with fp32 inputs keeps neither Q exp(G) nor K_d: the reverse state pass forms
    # them from q, k and G (16-bit inputs keep the rounded copies the forward used). Both forms give the same
    # gradients to fp32 rounding, on both of the pass's load orders (wide: the differentiable KDA's late one)
    import dataclasses

    from kernels.triton import chunk, plan

    if wide:
        monkeypatch.setattr(plan, "FILL_PROGRAMS", 1)
    inputs = make_inputs("channel", delta, 1, 100, 2, K=16, V=32, seed=5, lower_bound=lower_bound)
    layout = chunk.saved_layout(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], 16,
                                lower_bound)
    assert layout.qg is None and layout.kd is None
    bf16 = {n: t.bfloat16() if n in ("q", "k") else t for n, t in inputs.items() if t is not None}
    layout16 = chunk.saved_layout(bf16["q"], bf16["k"], bf16["v"], bf16["g"], bf16.get("beta"), 16,
                                  lower_bound)
    assert layout16.qg is not None and layout16.kd is not None

    def grads() -> dict[str, torch.Tensor]:
        leaves = {n: t.clone().requires_grad_(True) for n, t in inputs.items() if t is not None}
        o, ht = triton_chunk(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves.get("beta"), None,
                             leaves["initial_state"], True, chunk_size=16, lower_bound=lower_bound)
        (o.square().sum() + ht.square().sum()).backward()
        return {n: t.grad for n, t in leaves.items()}

    formed = grads()
    rule = plan.plan_forward
    monkeypatch.setattr(plan, "plan_forward", lambda p: dataclasses.replace(rule(p), keep_decayed=True))
    kept = grads()
    for n, ref in kept.items():
        assert rel_rms(formed[n], ref) < 1e-6, n


@pytest.mark.parametrize("chunk_size", [16, 32])
@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_kda_small_chunks_and_wide_heads(chunk_size: int, lower_bound: float | None) -> None:
    # other chunk sizes, and K, V large enough that the V-block loops run more than once
    inputs = make_inputs("channel", True, 1, 50, 1, K=32, V=64, seed=chunk_size, lower_bound=lower_bound)
    check_against_naive(inputs, lower_bound=lower_bound, chunk_size=chunk_size)


@pytest.mark.parametrize("T", [64, 100])
@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_kda_is_causal(T: int, lower_bound: float | None) -> None:
    # FLA issue #1240: a sub-chunk anchor after t made o_t depend on later gates; ours anchors in the past.
    # T=64: one full chunk; T=100: the cut lands inside a partial last chunk.
    inputs = make_inputs("channel", True, 1, T, 2, K=16, V=16, seed=11, lower_bound=lower_bound or -5.0)
    gen = torch.Generator().manual_seed(5)
    for t in (T - 40, T - 9):
        g2, beta2 = inputs["g"].clone(), inputs["beta"].clone()
        g2[:, t + 1 :] = -5.0 * torch.rand(g2[:, t + 1 :].shape, generator=gen)
        beta2[:, t + 1 :] = torch.rand(beta2[:, t + 1 :].shape, generator=gen)
        args = (inputs["q"], inputs["k"], inputs["v"])
        o1, _ = triton_chunk(
            *args, inputs["g"], inputs["beta"], None, inputs["initial_state"], lower_bound=lower_bound
        )
        o2, _ = triton_chunk(*args, g2, beta2, None, inputs["initial_state"], lower_bound=lower_bound)
        assert torch.equal(o1[:, : t + 1], o2[:, : t + 1]), f"o[:, :{t + 1}] changed with gates after t={t}"
        assert not torch.equal(o1[:, t + 1 :], o2[:, t + 1 :])


@pytest.mark.parametrize("name,decay,delta", OPS, ids=[op[0] for op in OPS])
def test_recurrent_step_matches_naive(name: str, decay: str, delta: bool) -> None:
    B, H, K, V = 2, 2, 16, 32
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(B, H, K, generator=gen), F.normalize(torch.randn(B, H, K, generator=gen), dim=-1)
    v = torch.randn(B, H, V, generator=gen)
    g = (
        None
        if decay == "none"
        else F.logsigmoid(torch.randn((B, H) if decay == "scalar" else (B, H, K), generator=gen))
    )
    beta = torch.rand(B, H, generator=gen) if delta else None
    state = torch.randn(B, H, K, V, generator=gen)
    o, new_state = triton_recurrent_step(q, k, v, g, beta, state, None)
    as64 = [None if x is None else x.double() for x in (q, k, v, g, beta, state)]
    o_ref, state_ref = recurrent_step(*as64, K**-0.5)
    assert new_state.dtype == torch.float32 and o.dtype == q.dtype
    assert rel_rms(o_ref, o) <= TOL and rel_rms(state_ref, new_state) <= TOL


def test_bad_arguments_raise() -> None:
    q = torch.randn(1, 8, 1, 24)
    with pytest.raises(ValueError, match="K=24"):
        triton_chunk(q, q, q, None, None)
    q = torch.randn(1, 8, 1, 16)
    with pytest.raises(ValueError, match="chunk_size=48"):
        triton_chunk(q, q, q, None, None, chunk_size=48)
    with pytest.raises(ValueError, match="lower_bound=0.5"):
        triton_chunk(q, q, q, -torch.rand(1, 8, 1, 16), torch.rand(1, 8, 1), lower_bound=0.5)


def test_too_loose_lower_bound_takes_the_general_path() -> None:
    # g_min = -8 cannot use the dense diagonal (e^{8 * 15} overflows); the promise is then ignored
    inputs = make_inputs("channel", True, 1, 40, 1, K=16, V=16, seed=4, lower_bound=-8.0)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    o_loose, _ = triton_chunk(*args, lower_bound=-8.0)
    o_general, _ = triton_chunk(*args)
    assert torch.equal(o_loose, o_general)


def test_out_of_gpu_resources_names_the_call_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # a GPU that cannot fit a kernel (e.g. K = V = 256 in fp32) raises Triton's OutOfResources from the
    # launch; the op turns it into an error naming the head sizes, the dtype and what to change
    from triton.runtime.errors import OutOfResources

    from kernels.triton import chunk

    def too_big(*args, **kwargs):
        raise OutOfResources(245760, 232448, "shared memory")

    x = make_inputs("channel", True, B=1, T=20, H=1, K=32, V=16, seed=0)
    monkeypatch.setattr(chunk, "chunk_forward", too_big)
    for grad in (True, False):  # the differentiable call and the no-grad forward
        args = [x[n].clone().requires_grad_(grad) for n in ("q", "k", "v", "g", "beta")]
        with pytest.raises(
            chunk.KernelResourceError, match=r"K=32, V=16 with float32 inputs.*backend='torch'"
        ):
            triton_chunk(*args)


def test_overrides_apply_inside_their_block_and_name_bad_ones() -> None:
    # the scripts' --set KEY=VALUE (`benchmarks.speed`, check_kernels.py) and the tests' settings
    from kernels.triton import plan

    problem = plan.Problem(8, 8192, 16, 128, 128, 64, "channel", True, bounded=True, lowp=True, keep=True)
    assert plan.plan_forward(problem).solve.warps == 1 and plan.current_overrides() == {}
    with plan.overrides(["solve.warps=2", "dqk.bk=none"]) as changed:
        assert changed == {"solve.warps": 2, "dqk.bk": None}
        assert plan.plan_forward(problem).solve.warps == 2
        with plan.overrides({"state_fwd.warps": 8}):  # nested: adds to the outer block
            inner = plan.plan_forward(problem)
            assert inner.solve.warps == 2 and inner.state.warps == 8 and inner.state_unchain
        assert plan.plan_forward(problem).state.warps == 4  # (the interpreter's)
    assert plan.plan_forward(problem).solve.warps == 1 and plan.current_overrides() == {}
    with pytest.raises(ValueError, match=r"unknown key 'solve.warp'.*solve.warps"):
        plan.parse_overrides(["solve.warp=2"])
    with pytest.raises(ValueError, match=r"'two' is not an integer"):
        plan.parse_overrides(["solve.warps=two"])
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        plan.parse_overrides(["solve.warps"])
    # the plan is a frozen value
    with pytest.raises(ValueError, match=r"unknown key 'state_fwd.output'"):
        plan.parse_overrides(["state_fwd.output=0"])  # a form, not a setting: the rules pick it
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.plan_forward(problem).out = False  # type: ignore[misc]


@pytest.mark.parametrize("chunk_size", [16, 32])
def test_solve_at_every_chunk_size(chunk_size: int) -> None:
    # the UT transform's inverse by products, chunks of 1 and 2 blocks of 16 (the interpreter computes its
    # products in fp32: this checks the launch and the block algebra); 4 blocks (chunks of 64) at the same
    # shape is test_kda_bounded_gate_matches_naive at T=100 from an initial state
    inputs = make_inputs("channel", True, 1, 100, 2, K=16, V=32, seed=chunk_size + 1, lower_bound=-5.0)
    check_against_naive(inputs, lower_bound=-5.0, chunk_size=chunk_size)


@pytest.mark.parametrize("T", [63, 127])
@pytest.mark.parametrize("name,decay,delta,lower_bound", ALL_SEVEN, ids=[op[0] for op in ALL_SEVEN])
def test_many_programs_forms_match_naive(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    decay: str,
    delta: bool,
    lower_bound: float | None,
    T: int,
) -> None:
    # the forms the launch rules pick where the state passes fill the GPU (the benchmark shapes): the output
    # and the WY products inside the forward state pass, X kept for the backward and (without the
    # per-channel decay) no Vt, the chunk's small inputs where used for KDA's differentiable forward, L and
    # A_qk triangular without a gradient. Forward and every gradient, and the no-grad forward, from an
    # initial state, at one partial chunk and at two chunks with a partial last one
    many_programs(monkeypatch)
    launched = record_launches(monkeypatch, "_state_fwd_kernel", "_dqk_bwd_kernel")
    inputs = make_inputs(decay, delta, 1, T, 2, K=16, V=32, seed=T + 3, lower_bound=lower_bound)
    check_against_naive(inputs, lower_bound=lower_bound)
    state = [x for x in launched if x.kernel == "_state_fwd_kernel"]
    assert len(state) == 1 and given(state[0], "o") and given(state[0], "linv") == delta
    # (X kept and, without the per-channel decay, no Vt: the backward forms it from X)
    fp, bp = _plans(1, 2, lower_bound, True, decay, delta, T=T, D=16)
    assert fp.keep_x == delta and fp.vt_x == (delta and decay != "channel")
    assert [kw["VT_X"] for n, _, kw in launched if n == "_dqk_bwd_kernel"] == [fp.vt_x]
    launched.clear()
    check_no_grad_against_naive(inputs, lower_bound)
    assert [n for n, _, _ in launched] == ["_state_fwd_kernel"]  # (no W/U pass: the WY form)
    assert given(launched[0], "linv") == delta and launched[0].kwargs["TRIL"]


@pytest.mark.parametrize("T,chunk_size", [(17, 64), (100, 64), (50, 16), (50, 32)])
@pytest.mark.parametrize("name,decay,lower_bound", DELTA_OPS)
def test_no_grad_intra_forward_without_kk_zeros(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    decay: str,
    lower_bound: float | None,
    T: int,
    chunk_size: int,
) -> None:
    # the no-grad intra forward does not store A_kk's zeros after the diagonal (the solve reads only the
    # blocks up to it). The A_kk buffer is filled with NaN first, so that a read of a block not written
    # shows; partial blocks and chunks of 1, 2 and 4 blocks, with an initial state. With a gradient the
    # zeros are stored (the dvt backward reads whole rows)
    nan_buffers(monkeypatch)
    inputs = make_inputs(decay, True, 1, T, 2, K=16, V=32, seed=T, lower_bound=lower_bound)
    assert inputs["initial_state"] is not None
    check_no_grad_against_naive(inputs, lower_bound, chunk_size)
    if (T, chunk_size) == (100, 64):
        check_against_naive(inputs, lower_bound=lower_bound, chunk_size=chunk_size)


@pytest.mark.parametrize("T", [1, 63, 100])
def test_bounded_intra_forward_unmasked_blocks(monkeypatch: pytest.MonkeyPatch, T: int) -> None:
    # the bounded intra forward's decayed operands from the products' own fp32 tiles (Q E_r, K E_r, K E_d)
    # times [K] vectors, and its loop's blocks (all before the rows' own) stored without masks; with and
    # without a gradient, partial chunks, an initial state. Buffers filled with NaN first, so that an entry
    # left unwritten shows
    nan_buffers(monkeypatch)
    for delta in (True, False):
        inputs = make_inputs("channel", delta, 2, T, 2, K=16, V=32, seed=T + 1, lower_bound=-5.0)
        check_no_grad_against_naive(inputs, -5.0, chunk_size=64)
        check_against_naive(inputs, lower_bound=-5.0, chunk_size=64)


@pytest.mark.parametrize("many", [False, True])
@pytest.mark.parametrize("T", [1, 63, 100])
def test_bounded_no_grad_log2(monkeypatch: pytest.MonkeyPatch, T: int, many: bool) -> None:
    # the bounded gate's no-grad forward stores G times log2(e) and its readers (the intra forward's fold
    # form, the state pass's exp(G_last)) take 2^x; with and without the delta rule, partial chunks, an
    # initial state, both regimes of the launch rules. Half the channels decay slowly (g in [-0.05, 0]), so
    # that the state carries across chunks and exp(G_last) shows in the outputs of the next chunk (with g in
    # [-5, 0] alone, a full chunk's decay is e^-160). Buffers filled with NaN first
    if many:
        many_programs(monkeypatch)
    launched = record_launches(monkeypatch, "_state_fwd_kernel")
    nan_buffers(monkeypatch)
    slow = torch.where(torch.arange(16) % 2 == 0, 0.01, 1.0)
    for delta in (True, False):
        inputs = make_inputs("channel", delta, 2, T, 2, K=16, V=32, seed=T + 3 * many, lower_bound=-5.0)
        inputs["g"] = inputs["g"] * slow
        check_no_grad_against_naive(inputs, -5.0, chunk_size=64)
    assert {kw["LOG2"] for _, _, kw in launched} == {True}


@pytest.mark.parametrize(
    "T,chunk_size", [(1, 64), (17, 64), (63, 64), (64, 64), (100, 64), (50, 32), (50, 16)]
)
def test_bounded_no_grad_g16(monkeypatch: pytest.MonkeyPatch, T: int, chunk_size: int) -> None:
    # the plan's g16: for 16-bit inputs the bounded gate's no-grad forward stores each row's decay from
    # its 16-row block's first row as uint16 in steps of 1/512 (log2 units), and fp32 G only at the blocks'
    # first rows and the chunks' last valid rows. The interpreter runs fp32 inputs, so the form is forced
    # for them here: outputs and final state match the token loop to the steps' rounding (a few 1e-4), not
    # to fp32's; the fp32 G buffer (NaN-filled first) is written at those rows and nowhere else. With and
    # without the delta rule, half the channels decaying slowly, both regimes of the launch rules, chunks of
    # 64, 32 and 16 rows
    from kernels.triton import plan

    assert plan._g16(True) and not plan._g16(False)
    monkeypatch.setattr(plan, "_g16", lambda lowp: True)
    made = nan_buffers(monkeypatch)
    slow = torch.where(torch.arange(16) % 2 == 0, 0.01, 1.0)
    for delta in (True, False):
        inputs = make_inputs("channel", delta, 2, T, 2, K=16, V=32, seed=T + 7, lower_bound=-5.0)
        inputs["g"] = inputs["g"] * slow
        args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
        o_ref, ht_ref = naive_recurrent(
            *[a.double() if a is not None else None for a in args],
            None,
            inputs["initial_state"].double(),
            True,
        )
        for many in (False, True):
            if many:
                many_programs(monkeypatch)
            made.clear()
            with torch.no_grad():
                o, ht = triton_chunk(*args, None, inputs["initial_state"], True, chunk_size, -5.0)
            errs = rel_rms(o_ref, o), rel_rms(ht_ref, ht)
            # (4.9e-4 at most at these seeds; 8.0e-4 where the steps truncate instead of rounding)
            assert max(errs) <= 6e-4, errs
            if T > 1:
                assert max(errs) > TOL  # the steps' rounding shows: the uint16 decays were read
            (i,) = [n for n, x in enumerate(made) if x.dtype == torch.uint16]
            gc = made[i + 1]
            assert gc.shape == inputs["g"].shape and gc.dtype == torch.float32
            t = torch.arange(T)
            kept = (t % 16 == 0) | (t == torch.clamp(t // chunk_size * chunk_size + chunk_size, max=T) - 1)
            assert not gc[:, kept].isnan().any() and gc[:, ~kept].isnan().all()


@pytest.mark.parametrize("T", [1, 63, 127])
@pytest.mark.parametrize("name,decay,lower_bound", DELTA_OPS)
def test_no_grad_akk_in_bf16(
    monkeypatch: pytest.MonkeyPatch, name: str, decay: str, lower_bound: float | None, T: int
) -> None:
    # without a gradient, 16-bit inputs keep A_kk in bf16 (the intra forward stores it
    # rounded, the solve takes it to fp32 on load). Here fp32 inputs with that one buffer forced to bf16, so
    # that its rounding alone shows: the output and final state match the token
    # loop to bf16's rounding of A_kk, not to fp32's (the A_kk buffer is bf16, NaN-filled first)
    from kernels.triton import intra_fwd

    assert intra_fwd._akk_dtype(True, False) == torch.bfloat16
    assert intra_fwd._akk_dtype(True, True) == intra_fwd._akk_dtype(False, False) == torch.float32
    monkeypatch.setattr(intra_fwd, "_akk_dtype", lambda lowp, keep: torch.float32 if keep else torch.bfloat16)
    made = nan_buffers(monkeypatch)
    inputs = make_inputs(decay, True, 1, T, 2, K=16, V=32, seed=T + 1, lower_bound=lower_bound)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    with torch.no_grad():
        o, ht = triton_chunk(*args, None, inputs["initial_state"], True, 64, lower_bound)
    o_ref, ht_ref = naive_recurrent(
        *[a.double() if a is not None else None for a in args], None, inputs["initial_state"].double(), True
    )
    errs = rel_rms(o_ref, o), rel_rms(ht_ref, ht)
    assert max(errs) <= 1e-2, errs  # (9e-5 to 4e-3 here)
    assert [x.dtype for x in made if x.dim() == 4 and x.shape[-1] == 64].count(torch.bfloat16) == 1
    if T > 1:
        # the rounding shows (the bf16 buffer was read): fp32 throughout meets the token loop to ~1e-7
        assert max(errs) > 1e-5, errs


@pytest.mark.parametrize("many", [True, False])
@pytest.mark.parametrize("T", [63, 127])
@pytest.mark.parametrize("name,decay,delta,lower_bound", ALL_SEVEN)
def test_no_grad_tril_loads(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    decay: str,
    delta: bool,
    lower_bound: float | None,
    T: int,
    many: bool,
) -> None:
    # without a gradient, where the state pass is the only reader of L and A_qk (many programs: the output
    # and Vt inside it), it loads them block lower-triangular (16-column blocks up to the row's) and the solve
    # and the intra forward do not store the zeros above; with few programs they are stored and read whole.
    # Every buffer is filled with NaN first, so that a read of an entry not written shows; with the triangular
    # loads, L's and A_qk's blocks above the diagonal are left unwritten (still NaN)
    if many:
        many_programs(monkeypatch)
    made = nan_buffers(monkeypatch)
    inputs = make_inputs(decay, delta, 1, T, 2, K=16, V=32, seed=T + many, lower_bound=lower_bound)
    check_no_grad_against_naive(inputs, lower_bound, chunk_size=64)
    # the [B, T, H, 64] buffers: A_qk, then (the delta rule) A_kk and L; block (0, 1) of the first chunk
    square = [x for x in made if x.dim() == 4 and x.shape[-1] == 64 and x.shape[1] == T]
    assert len(square) == (3 if delta else 1)
    # (A_qk's zeros come with the whole-chunk tile where there is no per-channel decay)
    written = [not many or decay != "channel"] + ([not many] if delta else [])
    for x, zeros in zip((square[0], square[-1]) if delta else square, written, strict=True):
        upper = x[0, :16, :, 16:32]
        assert (upper == 0).all() if zeros else upper.isnan().all()
    if T > 64:
        check_against_naive(inputs, lower_bound=lower_bound, chunk_size=64)  # the backward reads them whole


@pytest.mark.parametrize("T", [63, 127])
@pytest.mark.parametrize("name,decay,delta,lower_bound", ALL_SEVEN)
def test_state_passes_unchained_at_eight_warps(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    decay: str,
    delta: bool,
    lower_bound: float | None,
    T: int,
) -> None:
    # with 8 warps (what the state passes take on a GPU at the benchmark shapes; the interpreter runs 4), the
    # state passes' chained products (X, Vt, the output's state term; dVt) go through _unchain's run-time
    # branch. With the forms of many programs, which read and write every buffer, with a gradient (checked
    # in full) and without one, at one partial chunk and at two chunks with a partial last one, with an
    # initial state
    many_programs(monkeypatch)
    tune(monkeypatch, "state_fwd.warps", 8)
    tune(monkeypatch, "state_bwd.warps", 8)
    launched = record_launches(monkeypatch, "_state_fwd_kernel", "_state_bwd_kernel")
    inputs = make_inputs(decay, delta, 1, T, 2, K=16, V=32, seed=T + 7, lower_bound=lower_bound)
    assert inputs["initial_state"] is not None
    check_against_naive(inputs, lower_bound=lower_bound)
    check_no_grad_against_naive(inputs, lower_bound)
    assert {(n, kw["UNCHAIN"]) for n, _, kw in launched} == {
        ("_state_fwd_kernel", True),
        ("_state_bwd_kernel", True),
    }


@pytest.mark.parametrize("T,chunk_size", [(63, 64), (127, 64), (50, 16), (50, 32)])
@pytest.mark.parametrize("name,decay,lower_bound", DELTA_OPS)
def test_wy_state_pass(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    decay: str,
    lower_bound: float | None,
    T: int,
    chunk_size: int,
) -> None:
    # the WY state pass's Vt = L diag(beta) X, beta on the rows of X (L as loaded); at chunks of 1, 2 and 4
    # blocks of 16, partial last chunks, with an initial state; without a gradient and with one (X kept), in
    # full, as the rules of many programs pick them
    many_programs(monkeypatch)
    seed = T
    inputs = make_inputs(decay, True, 1, T, 2, K=16, V=32, seed=seed, lower_bound=lower_bound)
    check_no_grad_against_naive(inputs, lower_bound, chunk_size)
    check_against_naive(inputs, lower_bound=lower_bound, chunk_size=chunk_size)


@pytest.mark.parametrize("many", [True, False])
@pytest.mark.parametrize("T", [1, 100])
@pytest.mark.parametrize("name,decay,delta,lower_bound", ALL_SEVEN)
def test_forward_without_gradient(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    decay: str,
    delta: bool,
    lower_bound: float | None,
    T: int,
    many: bool,
) -> None:
    # with no gradient wanted the forward skips the buffers kept for the backward (h, Vt) and, with many
    # programs, the W/U pass for the delta rule (Vt from L, Gamma K and V in the state pass). Its output and
    # final state match the reference, and are those of the differentiable call bit for bit where the same
    # kernels compute them (few programs)
    if many:
        many_programs(monkeypatch)
    inputs = make_inputs(decay, delta, 1, T, 2, K=16, V=32, seed=T + 11, lower_bound=lower_bound)
    o, ht = check_no_grad_against_naive(inputs, lower_bound)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    h0 = inputs["initial_state"]
    leaves = [a.clone().requires_grad_(True) if a is not None else None for a in args]
    o_grad, ht_grad = triton_chunk(*leaves, None, h0, True, 64, lower_bound)
    assert not o.requires_grad and o_grad.requires_grad
    # (the bounded per-channel gate's no-grad G comes times log2(e), the plan's log2: other roundings; with
    # many programs the two forwards take other forms)
    if not many and not (decay == "channel" and lower_bound is not None):
        assert torch.equal(o, o_grad.detach()) and torch.equal(ht, ht_grad.detach())
    else:
        assert rel_rms(o_grad, o) <= TOL and rel_rms(ht_grad, ht) <= TOL


@pytest.mark.parametrize("T", [63, 100])
@pytest.mark.parametrize(
    "name,decay,lower_bound",
    [("delta_rule", "none", None), ("gated_delta_rule", "scalar", None), ("kda_bounded", "channel", -5.0)],
)
def test_dqk_delta_term_first(
    monkeypatch: pytest.MonkeyPatch, name: str, decay: str, lower_bound: float | None, T: int
) -> None:
    # the dqk kernel forms the delta rule's d(Gamma K) = T^T dW before loading the decay's tiles (fewer
    # registers live at once); with and without an initial state
    inputs = make_inputs(
        decay, True, 1, T, 2, K=16, V=32, seed=T + 29, lower_bound=lower_bound, with_state=T % 2 == 1
    )
    check_against_naive(inputs, lower_bound=lower_bound)


@pytest.mark.parametrize("k_inner", [1, 0])
@pytest.mark.parametrize("name,delta,lower_bound", [("gla", False, None), ("kda_bounded", True, -5.0)])
def test_dqk_key_blocks_side_by_side(
    monkeypatch: pytest.MonkeyPatch, name: str, delta: bool, lower_bound: float | None, k_inner: int
) -> None:
    # K = 128: two key blocks of 64 in dqk, launched with the key blocks first (the default) or, for a
    # sequence of more chunks than grid axis 1 holds (MAX_GRID_Y, here moved to 3), the chunks first; each
    # program finds its chunk and key block
    from kernels.triton import plan

    if not k_inner:
        monkeypatch.setattr(plan, "MAX_GRID_Y", 3)
    launched = record_launches(monkeypatch, "_dqk_bwd_kernel", "_intra_bwd_kernel")
    inputs = make_inputs("channel", delta, 1, 130, 1, K=128, V=16, seed=k_inner, lower_bound=lower_bound)
    check_against_naive(inputs, lower_bound=lower_bound)
    grids = {n: grid for n, grid, _ in launched}
    assert grids["_dqk_bwd_kernel"] == ((2, 3, 1) if k_inner else (3, 2, 1))
    assert grids["_intra_bwd_kernel"] == (12, 2, 1)


FWD_KERNELS = [
    "_cumsum_kernel",
    "_cumsum16_kernel",
    "_intra_fwd_kernel",
    "_solve_kernel",
    "_wu_kernel",
    "_state_fwd_kernel",
]


BWD_KERNELS = [
    "_state_bwd_kernel",
    "_dqk_bwd_kernel",
    "_dvt_bwd_kernel",
    "_intra_bwd_kernel",
    "_rev_cumsum_kernel",
]


def _forward_launches(
    monkeypatch,
    B: int,
    H: int,
    lower_bound: float | None,
    keep: bool,
    decay: str = "channel",
    delta: bool = True,
) -> dict:
    # the launches of KDA's forward (and with keep, its backward) at B, T=100, H, K = V = 128, bf16 (without
    # decay: the delta rule's; without delta: GLA's, or linear attention's)
    from kernels.triton import chunk

    log = record_launches(monkeypatch, *FWD_KERNELS, "_output_kernel", *BWD_KERNELS, run=False)  # none runs
    T, D = 100, 128
    bf = torch.bfloat16
    q, k, v = (torch.zeros(B, T, H, D, dtype=bf) for _ in range(3))
    g = (torch.zeros(B, T, H) if decay == "scalar" else torch.zeros(B, T, H, D)) if decay != "none" else None
    beta = torch.zeros(B, T, H, dtype=bf) if delta else None
    _, _, saved = chunk.chunk_forward(q, k, v, g, beta, 1.0, None, False, 64, lower_bound, keep=keep)
    if keep:
        chunk.chunk_backward(q, k, v, g, beta, 1.0, None, torch.zeros_like(v), None, 64, lower_bound, saved)
    launches = {}
    for launch in log:
        assert launch.kernel not in launches  # one launch per kernel
        launches[launch.kernel] = (launch.grid, launch.kwargs, launch)
    return launches


def _plans(
    B: int,
    H: int,
    lower_bound: float | None,
    keep: bool,
    decay: str = "channel",
    delta: bool = True,
    T: int = 100,
    D: int = 128,
) -> tuple:
    # (forward plan, backward plan) of the problem _forward_launches launches (fp32 at D = 16, as the tests
    # that run the kernels have it)
    from kernels.triton import chunk, plan

    dtype = torch.bfloat16 if D == 128 else torch.float32
    q = torch.zeros(B, T, H, D, dtype=dtype)
    g = (torch.zeros(B, T, H) if decay == "scalar" else torch.zeros(B, T, H, D)) if decay != "none" else None
    beta = torch.zeros(B, T, H) if delta else None
    problem = chunk._problem(q, q if D == 128 else torch.zeros(B, T, H, 32), g, beta, 64, lower_bound, keep)
    fp = plan.plan_forward(problem)
    return fp, plan.plan_backward(problem, fp.vt_x, fp.keep_x)


@pytest.mark.parametrize("keep", [True, False])
def test_launch_rules_follow_the_number_of_programs(monkeypatch: pytest.MonkeyPatch, keep: bool) -> None:
    # which forms of the forward the launcher picks (kernels.triton.plan's rules; the figures behind each rule
    # are in PERF.md): KDA with 16-bit inputs at K = V = 128, no kernel run
    wide = _forward_launches(monkeypatch, B=64, H=4, lower_bound=-5.0, keep=keep)  # B * H * V / 64 = 512
    state = wide["_state_fwd_kernel"][1]
    # the output and the WY products inside the state pass (o and L given)
    assert given(wide["_state_fwd_kernel"][2], "o") and given(wide["_state_fwd_kernel"][2], "linv")
    fp, bp = _plans(64, 4, -5.0, keep)
    assert fp.keep_x == keep and fp.store_h == keep and fp.store_vt == keep  # (X, h, Vt kept for a backward)
    if keep:
        assert "_wu_kernel" in wide  # W alone: X serves the backward
    else:
        assert "_wu_kernel" not in wide and "_output_kernel" not in wide
    # 4 warps (2 for GLA); the bounded gate's no-grad intra forward 2 at 168 registers
    assert wide["_intra_fwd_kernel"][1]["num_warps"] == (4 if keep else 2)
    assert wide["_intra_fwd_kernel"][1]["num_stages"] == 1  # the triangular loop's 1-4 steps unpipelined
    if keep:
        assert wide["_wu_kernel"][1]["num_warps"] == 4  # W alone
        assert bp.pre_x and wide["_dvt_bwd_kernel"][1]["num_stages"] == 3  # dvt reads X
        assert wide["_intra_bwd_kernel"][1]["num_stages"] == 1
        assert wide["_state_bwd_kernel"][1]["num_stages"] == 2
        # the intra backward before dqk, which finishes dq, dk and reverse-cumsums dG: no cumsum kernel
        assert bp.first and "_rev_cumsum_kernel" not in wide
        assert wide["_dqk_bwd_kernel"][1]["K_INNER"] == 1  # a chunk's key blocks side by side
        assert not wide["_dqk_bwd_kernel"][1]["VT_X"] and given(wide["_dvt_bwd_kernel"][2], "vt")
        assert not bp.seq  # KDA: q, k, G loaded together
        assert bp.dv_w  # d(Gamma K) from dvt's dv
        # the state passes' small inputs where used: KDA's differentiable wide forward and its reverse pass
        assert state["EARLY"] == 0 and wide["_state_bwd_kernel"][1]["EARLY"] == 0
        gla = _forward_launches(monkeypatch, B=64, H=4, lower_bound=None, keep=True, delta=False)
        gla_bp = _plans(64, 4, None, True, delta=False)[1]
        assert gla_bp.seq and gla_bp.first and "_rev_cumsum_kernel" not in gla
        # the delta rule (no per-channel decay) keeps no Vt: its backward forms it from X (the plan's vt_x)
        rule = _forward_launches(monkeypatch, B=64, H=4, lower_bound=None, keep=True, decay="none")
        rule_fp = _plans(64, 4, None, True, decay="none")[0]
        assert rule_fp.keep_x and not rule_fp.store_vt
        assert rule["_dqk_bwd_kernel"][1]["VT_X"] and not given(rule["_dvt_bwd_kernel"][2], "vt")
    else:
        assert state["EARLY"] == 1  # at the top of each chunk's step without a gradient
    # L and A_qk block lower-triangular, their upper zeros not stored, where the state pass is their only
    # reader (no gradient, the output and Vt inside it: the plan's tril); the backward reads them whole
    assert state["TRIL"] == (not keep)
    assert wide["_intra_fwd_kernel"][1]["ZERO"] == ("both" if keep else "none")
    assert wide["_solve_kernel"][1]["ZERO_L"] == keep

    few = _forward_launches(monkeypatch, B=1, H=2, lower_bound=None, keep=keep)  # a long sequential pass
    state = few["_state_fwd_kernel"][1]
    assert not given(few["_state_fwd_kernel"][2], "o") and not given(few["_state_fwd_kernel"][2], "linv")
    fp, bp = _plans(1, 2, None, keep)
    assert not fp.keep_x
    # (the W/U and output passes read L and A_qk whole)
    assert not state["TRIL"] and few["_intra_fwd_kernel"][1]["ZERO"] != "none"
    assert few["_solve_kernel"][1]["ZERO_L"]
    assert "_wu_kernel" in few and "_output_kernel" in few
    assert fp.store_vt and fp.store_h  # read by the output pass (and kept for the backward)
    if keep:
        assert not few["_dqk_bwd_kernel"][1]["VT_X"] and given(few["_dvt_bwd_kernel"][2], "vt")
        assert not bp.pre_x and few["_dvt_bwd_kernel"][1]["num_stages"] == 2
        assert few["_state_bwd_kernel"][1]["num_stages"] == 2  # a long reverse pass keeps its pipelining
        assert bp.first and "_rev_cumsum_kernel" not in few
        # the scalar decay's dG: reverse-cumsummed by a pass of its own
        assert "_rev_cumsum_kernel" in _forward_launches(monkeypatch, B=1, H=2, lower_bound=None, keep=True,
                                                         decay="scalar", delta=False)  # fmt: skip
        assert few["_state_bwd_kernel"][1]["EARLY"] == 1  # per-channel decay, few programs
        # the scalar decay (GDN) loads its small inputs where used, in both passes
        gdn = _forward_launches(monkeypatch, B=1, H=2, lower_bound=None, keep=True, decay="scalar")
        assert gdn["_state_fwd_kernel"][1]["EARLY"] == 0 and gdn["_state_bwd_kernel"][1]["EARLY"] == 0
    assert state["EARLY"] == 1
    # unbounded KDA: capped at 128 registers a thread, where 2 warps lost; the bounded gate's too
    assert few["_intra_fwd_kernel"][1]["num_warps"] == 4
    assert few["_intra_fwd_kernel"][1]["maxnreg"] == 128
    assert wide["_intra_fwd_kernel"][1]["maxnreg"] == (128 if keep else 168)
    # the state pass: 8 warps at K = 128 and 64 columns or more (as launched on a GPU: the interpreter runs
    # every kernel with 4), its chained products unchained there (with 4 warps they are laid out alike)

    from kernels.triton import plan

    monkeypatch.setattr(plan, "INTERPRET", False)
    wide = _forward_launches(monkeypatch, B=64, H=4, lower_bound=-5.0, keep=keep)
    assert wide["_state_fwd_kernel"][1]["num_warps"] == 8 and wide["_state_fwd_kernel"][1]["UNCHAIN"]
    # the solve capped at 128 registers for 16-bit inputs; on a GPU the per-channel intra kernels'
    # exponentials are ex2.approx.ftz (never under the interpreter, which has no inline PTX)
    assert wide["_solve_kernel"][1]["maxnreg"] == 128
    from kernels.triton import common

    assert common.EX2_FTZ.value == (not common.INTERPRET)
    if keep:
        # the reverse state pass with many programs: 128-column blocks and 8 warps, as the forward's, for
        # every op, unchained
        state = wide["_state_bwd_kernel"]
        assert state[0] == (1, 64 * 4) and state[1]["BV"] == 128 and state[1]["num_warps"] == 8
        assert state[1]["UNCHAIN"]
        for decay, delta in [("channel", False), ("none", False), ("none", True), ("scalar", True)]:
            state = _forward_launches(
                monkeypatch, B=64, H=4, lower_bound=None, keep=True, decay=decay, delta=delta
            )["_state_bwd_kernel"]
            assert (state[1]["BV"], state[1]["num_warps"], state[1]["UNCHAIN"]) == (128, 8, True)
        state = _forward_launches(monkeypatch, B=1, H=2, lower_bound=-5.0, keep=True)["_state_bwd_kernel"]
        assert state[1]["BV"] == 32 and state[1]["num_warps"] == 4 and state[1]["num_stages"] == 2
        assert not state[1]["UNCHAIN"]
    rule = _forward_launches(monkeypatch, B=64, H=4, lower_bound=None, keep=keep, decay="none")
    assert rule["_state_fwd_kernel"][1]["num_warps"] == 8 and rule["_state_fwd_kernel"][1]["UNCHAIN"]
    state = _forward_launches(monkeypatch, B=1, H=2, lower_bound=None, keep=keep, decay="none")[
        "_state_fwd_kernel"
    ]
    assert state[1]["num_warps"] == (8 if state[1]["BV"] >= 64 else 4)  # few programs: the size rule alone
    assert state[1]["UNCHAIN"] == (state[1]["num_warps"] == 8)


def test_launch_rules_yield_to_tune(monkeypatch: pytest.MonkeyPatch) -> None:
    # a launch setting (plan.SETTINGS) takes the place of its rule, and the rules that follow from it follow
    tune(monkeypatch, "intra_fwd.warps", 2)
    tune(monkeypatch, "state_fwd.warps", 8)
    tune(monkeypatch, "dqk.bk", 32)
    wide = _forward_launches(monkeypatch, B=64, H=4, lower_bound=-5.0, keep=True)
    assert wide["_intra_fwd_kernel"][1]["num_warps"] == 2
    state = wide["_state_fwd_kernel"][1]
    assert state["num_warps"] == 8 and state["UNCHAIN"]  # 8 warps: the chained products unchained
    grid, dqk, _ = wide["_dqk_bwd_kernel"]
    assert dqk["BK"] == 32 and grid == (4, 2, 64 * 4)  # (key blocks, chunks, B H)
