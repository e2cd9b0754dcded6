"""kernels/triton/plan.py: the launch plan as a frozen value, its rules at the benchmark shapes, overrides
within a block, and `python -m kernels.triton.plan`; kernels/family.py: the one table of ops."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # (as test_triton.py: the interpreter for the whole process)
pytest.importorskip("triton")

from kernels import family  # noqa: E402
from kernels.triton import VARIANTS, plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _problem(B: int, T: int, H: int, decay: str = "channel", delta: bool = True, bounded=True, keep=True):
    return plan.Problem(B, T, H, 128, 128, 64, decay, delta, bounded, lowp=True, keep=keep)


def test_the_rules_at_the_benchmark_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "INTERPRET", False)  # as on a GPU (the interpreter takes 4 warps, 32 columns)
    wide, few = _problem(8, 8192, 16), _problem(1, 65536, 16)
    # B8 H16: 256 state-pass programs of 64 columns, the GPU filled; B1 H16: 32
    assert wide.wide and not few.wide and wide.programs == plan.FILL_PROGRAMS
    fw, ff = plan.plan_forward(wide), plan.plan_forward(few)
    assert fw.out and fw.keep_x and not fw.vt_x and fw.state_bv == 128 and fw.state.warps == 8
    assert not ff.out and not ff.keep_x and ff.state_bv == 32 and ff.state.warps == 4
    infer = plan.plan_forward(dataclasses.replace(wide, keep=False))
    # the bounded no-grad forward: WY in the state pass, triangular L and A_qk, G in log2 units as uint16,
    # the intra forward on 2 warps at 168 registers
    assert infer.wy and infer.tril and infer.log2 and infer.g16 and not infer.runs_wu
    assert infer.intra == plan.Kernel(2, stages=1, maxnreg=168)
    bw = plan.plan_backward(wide, fw.vt_x, fw.keep_x)
    assert bw.first and bw.dv_w and not bw.fused and bw.k_inner == 1 and bw.state_bv == 128
    assert bw.intra == plan.Kernel(4, stages=1, maxnreg=96)
    # a sequence longer than the grid's y axis holds chunks: dqk's chunks go on axis 0
    assert plan.plan_backward(_problem(1, 64 * plan.MAX_GRID_Y, 1), False, False).k_inner == 0
    # linear attention: the intra-chunk gradients inside dqk
    linear = _problem(8, 8192, 16, decay="none", delta=False, bounded=False)
    assert plan.plan_backward(linear, False, False).fused


def test_a_bad_setting_is_named_and_the_plan_cannot_change() -> None:
    with pytest.raises(ValueError, match=r"unknown key 'state_fwd.wraps'"):
        with plan.overrides({"state_fwd.wraps": 8}):
            pass
    fp = plan.plan_forward(_problem(8, 8192, 16))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fp.intra = plan.Kernel(8)  # type: ignore[misc]
    with plan.overrides(["state_fwd.warps=8", "intra_fwd.maxnreg=0"]):
        inside = plan.plan_forward(_problem(8, 8192, 16))
    assert inside.state.warps == 8 and inside.intra.maxnreg is None  # 0: no cap
    assert plan.plan_forward(_problem(8, 8192, 16)) == fp  # the block ended


def test_settings_are_launch_options_not_forms() -> None:
    # what a kernel computes in (the output inside the state pass, the WY form, ...) follows the rules alone;
    # a setting changes how a kernel is launched
    options = ("warps", "stages", "maxnreg", "bv", "bk", "pdl")
    assert all(key.split(".")[1] in options for key in plan.SETTINGS)


def test_the_command_line_prints_what_launches() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = [sys.executable, "-m", "kernels.triton.plan", "kda_bounded", "--B", "1", "--T", "4096", "--H", "2"]
    res = subprocess.run(args + ["--set", "solve.warps=2"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("kda_bounded B1 T4096 H2 K=V=128 bf16")
    sections = [line for line in res.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert sections == ["no-grad forward:", "forward with a gradient:", "backward:"]
    assert "  solve: warps=2 maxnreg=128" in res.stdout and "  state_bv: 32" in res.stdout
    assert "RuntimeWarning" not in res.stderr
    bad = subprocess.run(args + ["--set", "solve.warps=x"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "'x' is not an integer" in bad.stderr


def test_one_family_table() -> None:
    # every point of the two switches' 3 x 2 table once, plus the bounded gate of KDA
    assert sorted((op.decay, op.delta_rule) for op in family.PLAIN) == sorted(
        (decay, delta) for decay in family.DECAYS for delta in (False, True)
    )
    assert family.op("kda_bounded").lower_bound == -5.0 and family.op("kda_bounded").takes_lower_bound
    assert family.by_switches("scalar", True).name == "gated_delta_rule"
    with pytest.raises(ValueError, match="unknown op 'gdn'"):
        family.op("gdn")
    # the kernels, the ops and the mixers read it
    import kernels
    from mixers.linear_base import OPS

    assert [v[0] for v in VARIANTS] == [op.name for op in family.OPS]
    for op in family.OPS:
        assert callable(getattr(kernels, op.chunk)) and callable(getattr(kernels, op.step))
    assert OPS == {
        ("none", False): (kernels.chunk_linear_attn, kernels.linear_attn_step),
        ("scalar", False): (kernels.chunk_simple_gla, kernels.simple_gla_step),
        ("channel", False): (kernels.chunk_gla, kernels.gla_step),
        ("none", True): (kernels.chunk_delta_rule, kernels.delta_rule_step),
        ("scalar", True): (kernels.chunk_gated_delta_rule, kernels.gated_delta_rule_step),
        ("channel", True): (kernels.chunk_kda, kernels.kda_step),
    }
