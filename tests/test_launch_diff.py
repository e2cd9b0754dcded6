"""benchmarks/launch_diff.py: the launch code of kernels/triton/chunk.py recorded on meta tensors (no GPU, no
compile), at the working tree and at a git revision, and the two lists of launches diffed."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

# launch tooling, compared against a git revision: the compiler-output tier, not the edit-test loop
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import launch_diff  # noqa: E402


def _args(op: str, B: int, T: int, H: int) -> argparse.Namespace:
    return argparse.Namespace(op=op, B=B, T=T, H=H, D=128)


def _launch(lines: list[str], kernel: str) -> str:
    (line,) = [line for line in lines if line.startswith(kernel + " ")]
    return line


def test_records_every_launch_with_its_settings() -> None:
    lines = launch_diff.record(ROOT, _args("kda_bounded", 8, 8192, 16))
    # the no-grad forward, the differentiable one and the backward, in order
    assert [line for line in lines if line.startswith("--")] == [
        "-- forward without a gradient",
        "-- forward with a gradient",
        "-- backward",
    ]
    dqk = _launch(lines, "_dqk_bwd_kernel")
    # K blocks of 64 first (a chunk's two side by side, dqk.k_inner), then NT chunks, B * H
    assert dqk.startswith("_dqk_bwd_kernel (2, 128, 128) ")
    assert "DELTA=True" in dqk and "K_INNER=1" in dqk and "num_warps=4" in dqk
    # the reverse state pass: 128-column blocks of 8 warps with many programs, 32 of 4 for a long pass of few
    wide = _launch(lines, "_state_bwd_kernel")
    assert wide.startswith("_state_bwd_kernel (1, 128) ") and "BV=128" in wide and "num_warps=8" in wide
    few = _launch(launch_diff.record(ROOT, _args("kda_bounded", 1, 4096, 2)), "_state_bwd_kernel")
    assert "BV=32" in few and "num_warps=4" in few and "num_stages=2" in few
    # linear attention: no delta rule, so no solve, W/U or dvt launch
    plain = launch_diff.record(ROOT, _args("linear_attn", 1, 100, 2))
    assert not [line for line in plain if line.startswith(("_solve", "_wu", "_dvt"))]


def test_compares_against_a_revision() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "benchmarks/launch_diff.py", "HEAD", "--op", "gla"] + "--B 2 --T 100 --H 2".split(),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # 0: the same launches as HEAD (a clean checkout), 1: the working tree launches differently
    assert res.returncode in (0, 1), res.stderr[-2000:]
    assert res.stdout.startswith("gla B2 T100 H2 K=V=128 bf16: ")
    assert ("same launches" in res.stdout) == (res.returncode == 0)
