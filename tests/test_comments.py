"""Code comments say why the code is as it is; the history of how it got there lives in git log and in
benchmarks/results/ (and kernels/triton/PERF.md). This check fails on the markers of a measurement log in a
.py file: a run number ("run 45", "runs 60-61") or a date."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# "run 45", "(runs 60-61", "runs 48, 49"; not "runs 1-4 steps" (a loop's trip count)
HISTORY = re.compile(r"\b[Rr]un \d+\b|\b[Rr]uns \d+(?:-\d+|(?:, \d+)+)\b(?! steps)|\b20\d\d-\d\d-\d\d\b")
SKIP = {"runs", ".git", ".venv", "node_modules"}


def history_markers(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line of `text` with a run number or a date."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def test_the_pattern_finds_run_numbers_and_dates_only() -> None:
    found = history_markers(
        "x = 1  # H200 (run 45): 0.3 -> 0.2 ms\n"
        "# runs 60-61 and runs 48, 49\n"
        "# measured 2026-11-29\n"
        "# the triangular loop runs 1-4 steps\n"
        "# a run of 8 warps; rerun 3 times\n"
    )
    assert [n for n, _ in found] == [1, 2, 3]


def test_python_files_carry_no_measurement_history() -> None:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        if SKIP & set(path.relative_to(ROOT).parts) or path == Path(__file__).resolve():
            continue  # (this file's examples are the markers themselves)
        for n, line in history_markers(path.read_text(encoding="utf-8", errors="replace")):
            bad.append(f"{path.relative_to(ROOT)}:{n}: {line}")
    where = "move them to git log or benchmarks/results"
    assert not bad, f"run numbers or dates in code ({where}):\n" + "\n".join(bad)
