"""The chunk op's `recompute_states`: the forward keeps no chunk-entry states h, the backward rebuilds them by
the forward's state pass again (kernels/triton/state_fwd.py, `rebuild_states`). Under the interpreter, for
every op: the outputs, final state and every gradient of the op with h kept, bit for bit (within 1e-6 under
the bounded gate, see BOUNDED_TOL), and within the token loop's tolerance; h among no kept buffers, eager and
through the compiled path's custom ops; and the layers' lean backward asking for it.
"""

from __future__ import annotations

import os
from collections import Counter

# must precede the first triton import of the process
os.environ.setdefault("TRITON_INTERPRET", "1")

from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import kernels  # noqa: E402
import kernels.triton  # noqa: E402
from benchmarks.common import CHECK_BOUNDS, make_inputs, rel_rms  # noqa: E402
from kernels import family  # noqa: E402
from kernels.naive import naive_recurrent  # noqa: E402
from kernels.triton import chunk, plan, triton_chunk  # noqa: E402
from kernels.triton.chunk import INTERPRET  # noqa: E402
from kernels.triton.compile import compiled_chunk  # noqa: E402

pytestmark = pytest.mark.skipif(
    not INTERPRET, reason="kernels.triton was imported without TRITON_INTERPRET=1; run this file on its own"
)

# fp32 inputs against the float64 token loop (tests/test_triton.py's tolerance)
TOL = 1e-4
# the bounded gate's intra forward forms K_d and Gamma K as products of two exponentials from the block's
# anchor, the rebuild as one (the unbounded path's, which the reverse state pass takes too): an ulp or two
# of fp32 (1e-7) in the rebuilt states and the gradients through them, far below TOL
BOUNDED_TOL = 1e-6
B, H, K, V = 1, 2, 16, 32

# (name, decay, delta rule, lower_bound, 16-bit kernels): the seven ops, KDA also with its 16-bit kernels
# (WIDE_KDA_KEYS off: K_d kept, Gamma K formed by the rebuild)
OPS = [(o.name, o.decay, o.delta_rule, o.lower_bound, False) for o in family.OPS]
KDA_16 = [("kda", "channel", True, None, True)]
# (dtype, forms, T, chunk size, initial state): each op in both precisions and both plans' forms, a form at
# both lengths, every case several chunks with a partial last one. "many programs": the launch rules'
# thresholds at 0, as at the training shape (B = 256): the output inside the state pass (no h at all in
# the forward), the delta rule's WY form with X kept; "few programs": the output kernel (h written for it
# and dropped), the delta rule's W/U form (U rebuilt by the W/U pass)
CASES = [
    ("fp32", "few programs", 150, 64, True),
    ("fp32", "many programs", 37, 16, False),
    ("bf16", "many programs", 150, 64, True),
    ("bf16", "few programs", 37, 16, False),
]
PARAMS = [(*op, *case) for op in OPS for case in CASES] + [
    (*op, *case) for op in KDA_16 for case in CASES if case[0] == "bf16"
]


def _ids(p: tuple) -> str:
    name, _, _, lower_bound, lowp_kda, dtype, forms, T, _, state = p
    name = name + ("_16bit" if lowp_kda else "")
    return f"{name}-{dtype}-{forms.split()[0]}-T{T}" + ("-h0" if state else "")


def _many_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    # (tests/test_triton.py's many_programs)
    monkeypatch.setattr(plan, "FILL_PROGRAMS", 0)
    monkeypatch.setattr(plan, "MANY_HEADS", 0)


def _run(inputs: dict, lower_bound: float | None, chunk_size: int, recompute: bool) -> tuple[dict, list]:
    # o, the final state and every gradient of o . do + final state . dht; the shapes ChunkFunction saved
    names = [n for n, t in inputs.items() if t is not None]
    leaves = {n: inputs[n].detach().clone().requires_grad_(True) for n in names}
    args = (leaves["q"], leaves["k"], leaves["v"], leaves.get("g"), leaves.get("beta"), None)
    o, ht = triton_chunk(*args, leaves.get("initial_state"), True, chunk_size, lower_bound, recompute)
    node = o.grad_fn
    while type(node).__name__ != "ChunkFunctionBackward":  # (KDA's widened bf16 q, k: o cast back)
        node = node.next_functions[0][0]
    saved = [tuple(t.shape) for t in node.saved_tensors if t is not None]
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    ((o.float() * do).sum() + (ht * dht).sum()).backward()
    return {"o": o, "final_state": ht, **{f"d{n}": leaves[n].grad for n in names}}, saved


def _reference(inputs: dict) -> dict:
    # the float64 token loop on the same (rounded) inputs, the same loss
    names = [n for n, t in inputs.items() if t is not None]
    ref = {n: inputs[n].detach().double().requires_grad_(True) for n in names}
    o, ht = naive_recurrent(
        ref["q"], ref["k"], ref["v"], ref.get("g"), ref.get("beta"), None, ref.get("initial_state"), True
    )
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    ((o * do.double()).sum() + (ht * dht.double()).sum()).backward()
    return {"o": o.detach(), "final_state": ht.detach(), **{f"d{n}": ref[n].grad for n in names}}


@pytest.mark.parametrize(
    ("name", "decay", "delta", "lower_bound", "lowp_kda", "dtype", "forms", "T", "chunk_size", "with_state"),
    PARAMS,
    ids=[_ids(p) for p in PARAMS],
)
def test_rebuilt_states_give_the_kept_states_results(
    monkeypatch: pytest.MonkeyPatch, name: str, decay: str, delta: bool, lower_bound: float | None,
    lowp_kda: bool, dtype: str, forms: str, T: int, chunk_size: int, with_state: bool,
) -> None:  # fmt: skip
    if forms == "many programs":
        _many_programs(monkeypatch)
    if lowp_kda:
        monkeypatch.setattr(kernels.triton, "WIDE_KDA_KEYS", False)
    bf16 = dtype == "bf16"
    # bf16 with the layer's gates, as the GPU check's bounds are measured (tests/test_interpret.py)
    inputs = make_inputs(decay, delta, B, T, H, K, V, seed=T + 7 * with_state, lower_bound=lower_bound,
                         with_state=with_state, dtype=torch.bfloat16 if bf16 else torch.float32,
                         layer_gates=bf16)  # fmt: skip
    # the form the case means to reach (the fp32 problem the op runs for KDA's widened bf16 q, k)
    lowp = bf16 and not (decay == "channel" and delta and not lowp_kda)
    q = inputs["q"] if lowp else inputs["q"].float()
    fp = plan.plan_forward(chunk._problem(q, inputs["v"], inputs["g"], inputs["beta"], chunk_size,
                                          lower_bound, True))  # fmt: skip
    assert fp.out == (forms == "many programs") and fp.keep_x == (fp.out and delta)
    kept, kept_saved = _run(inputs, lower_bound, chunk_size, recompute=False)
    rebuilt, rebuilt_saved = _run(inputs, lower_bound, chunk_size, recompute=True)
    # ChunkFunction keeps h ([B, H, NT, K, V], the only buffer of that shape) only without the option, also
    # where the forward writes it for the output kernel (few programs), and with X kept (the WY form) no W
    # either, which only the reverse state pass reads; nothing else changes
    h = (B, H, -(-T // chunk_size), K, V)
    assert kept_saved.count(h) == 1
    dropped = {h: 1, (B, T, H, K): 1} if fp.keep_x else {h: 1}
    assert Counter(kept_saved) - Counter(rebuilt_saved) == Counter(dropped)
    assert not Counter(rebuilt_saved) - Counter(kept_saved)
    assert kept.keys() == rebuilt.keys()
    for n in ("o", "final_state"):  # (the forward computes them as before)
        assert torch.equal(kept[n], rebuilt[n]), n
    for n in kept:
        if lower_bound is None:
            assert torch.equal(kept[n], rebuilt[n]), (n, (kept[n] - rebuilt[n]).abs().max())
        else:
            assert rel_rms(kept[n], rebuilt[n]) <= BOUNDED_TOL, (n, rel_rms(kept[n], rebuilt[n]))
    ref = _reference(inputs)
    errors = {n: rel_rms(ref[n], rebuilt[n]) for n in rebuilt}
    bounds = CHECK_BOUNDS if bf16 else dict.fromkeys(errors, TOL)
    over = {n: f"{e:.1e} > {bounds[n]:.0e}" for n, e in errors.items() if not e <= bounds[n]}
    assert not over, over


def test_the_layout_states_no_h_with_recompute_states() -> None:
    # chunk.saved_layout, which the compiled path's fake forward returns (tests/test_compile.py checks it
    # against the real buffers for every op with and without the option)
    x = make_inputs("channel", True, B, 100, H, K, V, seed=0)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], 64, None)
    kept, rebuilt = chunk.saved_layout(*args), chunk.saved_layout(*args, recompute_states=True)
    assert kept.h == ((B, H, 2, K, V), torch.float32) and rebuilt.h is None
    assert kept._replace(h=None) == rebuilt
    # with X kept (the WY form of many programs) W is left to the backward too
    with pytest.MonkeyPatch.context() as mp:
        _many_programs(mp)
        kept, rebuilt = chunk.saved_layout(*args), chunk.saved_layout(*args, recompute_states=True)
    assert kept.x is not None and kept.w == ((B, 100, H, K), torch.float32)
    assert kept._replace(h=None, w=None) == rebuilt


@pytest.mark.parametrize(
    ("name", "decay", "forms"),
    [("gated_delta_rule", "scalar", "few programs"), ("kda", "channel", "many programs")],
)
def test_the_compiled_path_rebuilds_the_states(
    monkeypatch: pytest.MonkeyPatch, name: str, decay: str, forms: str
) -> None:
    # the custom ops (kernels/triton/compile.py): chunk_fwd returns h's empty placeholder, chunk_bwd
    # rebuilds h from the other buffers (the W/U form; KDA's WY form at the training shape's rules); the
    # eager op's results with h kept, bit for bit
    if forms == "many programs":
        _many_programs(monkeypatch)
    x = make_inputs(decay, True, B, 70, H, K, V, seed=3)
    results = []
    for fn, recompute in ((triton_chunk, False), (compiled_chunk, True)):
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items() if t is not None}
        args = (leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], K**-0.5)
        o, ht = fn(*args, leaves["initial_state"], True, 64, None, recompute)
        if recompute:
            assert type(o.grad_fn).__name__ != "ChunkFunctionBackward"  # (the custom op's node)
            assert (B, H, 2, K, V) not in [tuple(t.shape) for t in o.grad_fn.saved_tensors]
        loss = (o * torch.linspace(-1, 1, V)).sum() + (ht * 0.5).sum()
        results.append([o, ht, *torch.autograd.grad(loss, list(leaves.values()))])
    for kept, rebuilt in zip(*results, strict=True):
        assert torch.equal(kept, rebuilt)


def test_the_lean_layer_asks_the_op_for_it_and_other_backends_ignore_it(monkeypatch) -> None:
    from mixers.gdn import GatedDeltaNet

    seen: list[Any] = []
    real = kernels.triton.triton_chunk

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("recompute_states", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels.triton, "triton_chunk", recording)
    torch.manual_seed(0)
    x = torch.randn(1, 20, 32)
    outputs = []
    for backend in ("triton", "torch"):
        layer = GatedDeltaNet(32, num_heads=2, head_dim=16, chunk_size=16, backend=backend)
        for lean in (False, True):
            layer.lean_backward = lean
            outputs.append(layer(x))
    assert seen == [False, True]  # the two triton calls; the torch backend takes autograd's own buffers
    # (lean and plain differ in the glue's rounding: tests/test_saved_memory.py compares them)
    for plain, lean in (outputs[:2], outputs[2:]):
        torch.testing.assert_close(lean, plain, rtol=1e-5, atol=1e-6)
