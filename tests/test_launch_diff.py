"""`benchmarks.launches diff`: the launch code of kernels/triton/ recorded on meta tensors (no GPU, no
compile), at the working tree and at a git revision, and the two lists of launches diffed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import launches

pytest.importorskip("triton")

# launch tooling, compared against a git revision: the compiler-output tier, not the edit-test loop
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _launch(lines: list[str], kernel: str) -> str:
    (line,) = [line for line in lines if line.startswith(kernel + " ")]
    return line


def test_records_every_launch_with_its_settings() -> None:
    lines = launches.launch_lines(ROOT, "kda_bounded", 8, 8192, 16)
    # the no-grad forward, the differentiable one and the backward, in order
    assert [line for line in lines if line.startswith("--")] == [
        "-- forward without a gradient",
        "-- forward with a gradient",
        "-- backward",
    ]
    dqk = _launch(lines, "_dqk_bwd_kernel")
    # K blocks of 64 first (a chunk's two side by side, dqk.k_inner), then NT chunks, B * H
    assert dqk.startswith("_dqk_bwd_kernel (2, 128, 128) ")
    assert "DECAY=channel" in dqk and "K_INNER=1" in dqk and "num_warps=4" in dqk
    # the reverse state pass: 128-column blocks of 8 warps with many programs, 32 of 4 for a long pass of few
    wide = _launch(lines, "_state_bwd_kernel")
    assert wide.startswith("_state_bwd_kernel (1, 128) ") and "BV=128" in wide and "num_warps=8" in wide
    few = _launch(launches.launch_lines(ROOT, "kda_bounded", 1, 4096, 2), "_state_bwd_kernel")
    assert "BV=32" in few and "num_warps=4" in few and "num_stages=2" in few
    # linear attention: no delta rule, so no solve, W/U or dvt launch
    plain = launches.launch_lines(ROOT, "linear_attn", 1, 100, 2)
    assert not [line for line in plain if line.startswith(("_solve", "_wu", "_dvt"))]


def test_compare_matches_launches_in_order() -> None:
    old = ["-- backward", "_k (1, 2) A=1 B=2 num_warps=4", "_j (3,) C=0 num_warps=4"]
    # a constexpr only one side passes is listed, not a difference
    diff, one_sided = launches.compare(old, ["-- backward", "_k (1, 2) A=1 num_warps=4", old[2]])
    assert diff == [] and one_sided == {"_k": {"B=2 before"}}
    _, one_sided = launches.compare(old, [old[0], "_k (1, 2) A=1 B=2 D=7 num_warps=4", old[2]])
    assert one_sided == {"_k": {"D=7 now"}}
    # another value, grid, kernel or number of launches is
    for new in (
        [old[0], "_k (1, 2) A=0 B=2 num_warps=4", old[2]],
        [old[0], "_k (1, 2) A=1 B=2 num_warps=8", old[2]],
        [old[0], "_k (2, 2) A=1 B=2 num_warps=4", old[2]],
        [old[0], old[2], old[1]],
        old[:2],
    ):
        diff, _ = launches.compare(old, new)
        assert diff and any(line.startswith("+") or line.startswith("-") for line in diff), new


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True
    )


def _run_cli(repo: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.launches", *"diff HEAD --op gla --B 2 --T 100 --H 2".split()],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_compares_against_a_revision(tmp_path: Path) -> None:
    # a repository of its own (the kernels and the scripts, committed): the same launches as HEAD with a
    # clean tree (exit 0), and a launch rule changed in the working tree is seen (exit 1, the launch named)
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "kernels", repo / "kernels", ignore=ignore)
    shutil.copytree(
        ROOT / "benchmarks", repo / "benchmarks", ignore=shutil.ignore_patterns("__pycache__", "results")
    )
    _git(repo, "init", "-q")
    _git(repo, "add", "kernels", "benchmarks")
    _git(repo, "commit", "-q", "-m", "kernels")
    same = _run_cli(repo)
    assert same.returncode == 0, same.stderr[-2000:]
    assert same.stdout.startswith("gla B2 T100 H2 K=V=128 bf16: ") and "same launches" in same.stdout
    rules = repo / "kernels" / "triton" / "plan.py"
    src = rules.read_text()
    rule = '_setting("dvt.warps", 4)'
    assert rule in src
    rules.write_text(src.replace(rule, '_setting("dvt.warps", 2)'))
    changed = _run_cli(repo)
    assert changed.returncode == 1, changed.stderr[-2000:]
    assert "same launches" not in changed.stdout
    removed = [line for line in changed.stdout.splitlines() if line.startswith("-_dvt_bwd_kernel")]
    added = [line for line in changed.stdout.splitlines() if line.startswith("+_dvt_bwd_kernel")]
    assert len(removed) == len(added) == 1 and "num_warps=4" in removed[0] and "num_warps=2" in added[0]
