"""benchmarks/gpu.sh's compare steps: the GPU check and timings of two trees side by side (the GPU parts run
on the device; here the table from made-up CSVs and the run-sheet's refusal of a bad revision or step)."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from pathlib import Path

from benchmarks import speed

ROOT = Path(__file__).resolve().parents[1]


def _bench(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    with (path / "h200_bench.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["shape", "op", "impl", "ms_fwd", "ms_fwdbwd"])
        writer.writeheader()
        writer.writerows(rows)


def test_medians_over_rounds_side_by_side(tmp_path: Path) -> None:
    row = {"shape": "B8T8K", "op": "kda", "impl": "ours"}
    _bench(tmp_path / "rev" / "bench_1", [{**row, "ms_fwd": "1.0", "ms_fwdbwd": "7.0"}])
    _bench(tmp_path / "rev" / "bench_2", [{**row, "ms_fwd": "3.0", "ms_fwdbwd": "SKIP(time)"}])
    _bench(tmp_path / "tree" / "bench_1", [{**row, "ms_fwd": "2.2", "ms_fwdbwd": "7.7"}])
    before = speed.medians(tmp_path / "rev")
    after = speed.medians(tmp_path / "tree")
    # the median of 1.0 and 3.0; a skipped timing left out
    assert before == {("B8T8K", "kda", "ours", "ms_fwd"): 2.0, ("B8T8K", "kda", "ours", "ms_fwdbwd"): 7.0}
    lines = speed.compare_table(before, after, "REV")
    assert lines[2] == "| B8T8K | kda | ours | ms_fwd | 2.0000 | 2.2000 | 1.100 |"
    assert lines[3] == "| B8T8K | kda | ours | ms_fwdbwd | 7.0000 | 7.7000 | 1.100 |"


def _sheet(out: Path, steps: str, rev: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "REV": rev} if rev else dict(os.environ)
    return subprocess.run(["bash", "benchmarks/gpu.sh", str(out), steps], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_revision_that_is_neither_folder_nor_commit_is_refused(tmp_path: Path) -> None:
    res = _sheet(tmp_path / "out", "compare", "no-such-revision")
    assert res.returncode == 2 and "neither a folder nor a git revision" in res.stderr
    # a folder without the scripts is refused before anything runs
    (tmp_path / "empty").mkdir()
    res = _sheet(tmp_path / "out", "revcheck", str(tmp_path / "empty"))
    assert res.returncode == 2 and "has no tests/gpu/check_kernels.py" in res.stderr
    # and so is a step the sheet does not have
    res = _sheet(tmp_path / "out", "check nonsense")
    assert res.returncode == 2 and "unknown step nonsense" in res.stderr


def test_every_step_the_sheet_runs_is_one_it_accepts() -> None:
    # the sheet names its steps twice, in the parser of its arguments and in the dispatch that runs them; a
    # step written only into the dispatch is refused as unknown on the device, after the machine has started
    text = (ROOT / "benchmarks" / "gpu.sh").read_text()
    parser = text.split('case "$s" in', 1)[1].split("esac", 1)[0]
    accepted = set()
    for arm in parser.replace("\\\n", "").split(";;"):
        head = arm.strip().split(")", 1)[0]
        if head and head != "*" and "steps+=(\"$s\")" in arm:
            accepted |= set(head.split("|"))
    dispatch = text.split('case "$step" in', 1)[1].split("\n  esac", 1)[0]
    run = set(re.findall(r"^    ([a-z_]+)\)$", dispatch, flags=re.M))
    assert run and run == accepted, (run - accepted, accepted - run)


def test_a_check_part_stopped_at_its_limit_or_over_its_bounds_fails_the_sheet(tmp_path: Path) -> None:
    # check_kernels.py stood in for by a script that answers as a part stopped by `timeout` (124), one over
    # its bounds (1) or one within them would: the sheet must say which parts did not finish and exit 1
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = tests/gpu/check_kernels.py ]; then\n'
        '  echo "op T H who o"; echo "kda 63 16 ours 2e-03"\n'
        '  case "$*" in *"--T 8192"*) exit 124 ;; *"--dtype fp16"*) exit 1 ;; esac\n'
        '  echo "ALL WITHIN BOUNDS"; exit 0\n'
        "fi\n"
        f'exec "{shutil.which("python3")}" "$@"\n'
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run(["bash", "benchmarks/gpu.sh", str(tmp_path / "out"), "check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "check_long INCOMPLETE: stopped at its 60 s limit" in res.stdout
    assert "check_fp16 FAILED: exit 1" in res.stdout
    assert "check_bf16 INCOMPLETE" not in res.stdout and "check_fp32 FAILED" not in res.stdout
    assert res.stdout.count("ALL WITHIN BOUNDS") == 2  # bf16 and fp32
