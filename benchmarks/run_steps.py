"""What training runs cost a step, read back from their run directories: one row per run with its switches
(compile, CUDA graphs, lean backward), the median step time between logged steps, its peak memory and its
first step, as CSV and markdown. For comparing whole training runs of the same config that differ only in
how they execute (e.g. `trainer.cuda_graphs=false` against `auto` at the Fig. 4 grid's lengths, evals
included), where benchmarks.step times the step alone.

    python -m benchmarks.run_steps DIR [DIR ...] --out OUT
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import pandas as pd

from benchmarks.common import commit, versions


def step_ms(metrics: Path) -> float | None:
    """The median training time a step between consecutive logged steps after the first (which pays the
    compile), from metrics.jsonl's `time_s`; None with fewer than two such intervals."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    points = [(r["step"], r["time_s"]) for r in rows if "time_s" in r and "train/loss" in r]
    rates = [(t1 - t0) / (s1 - s0) * 1e3 for (s0, t0), (s1, t1) in zip(points[1:], points[2:], strict=False)
             if s1 > s0]
    return statistics.median(rates) if len(rates) >= 2 else None


def collect(dirs: list[Path]) -> pd.DataFrame:
    """One row per finished run (a summary.json) under `dirs`."""
    rows = []
    for root in dirs:
        for summary_file in sorted(root.rglob("summary.json")):
            summary = json.loads(summary_file.read_text())
            metrics = summary_file.parent / "metrics.jsonl"
            ms = step_ms(metrics) if metrics.exists() else None
            rows.append({
                "run": str(summary_file.parent.relative_to(root)), "status": summary.get("status"),
                "mixer": summary.get("mixer"), "task": summary.get("task"), "T": summary.get("seq_len"),
                "compile": summary.get("compile"), "cuda_graphs": summary.get("cuda_graphs"),
                "lean_backward": summary.get("lean_backward"),
                "recompute": ",".join(summary.get("recompute") or []) or None, "steps": summary.get("steps"),
                "step_ms": None if ms is None else round(ms, 2),
                "peak_gib": summary.get("peak_memory_gib"),
                "train_peak_gib": summary.get("train_peak_memory_gib"),
                "eval_peak_gib": summary.get("eval_peak_memory_gib"),
                "first_step_s": summary.get("first_step_s"),
                "gpu": (summary.get("gpu") or {}).get("name", summary.get("device")),
            })
    return pd.DataFrame(rows)


def _markdown(table: pd.DataFrame) -> str:
    cells = [[("–" if pd.isna(v) else str(v)) for v in row] for row in table.itertuples(index=False)]
    return "\n".join(["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns),
                      *("| " + " | ".join(row) + " |" for row in cells)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run_steps",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run or sweep directories")
    parser.add_argument("--out", type=Path, required=True, help="folder for run_steps.csv and .md")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(missing)}; give the run or sweep directories to read")
    table = collect(args.dirs)
    if table.empty:
        parser.error(f"no summary.json under {', '.join(map(str, args.dirs))}: no run has finished there")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "run_steps.csv", index=False)
    command = "python -m benchmarks.run_steps " + " ".join(map(str, args.dirs))
    # the runs' GPUs from their summaries: this script may read them back on another machine
    gpus = ", ".join(sorted({str(g) for g in table["gpu"].dropna()})) or "device not recorded"
    header = (f"{datetime.date.today()}, runs on {gpus}, read with {versions()}, commit {commit()}; "
              f"`{command}`")
    text = "\n".join(["# Training runs, step time from their logs", "", header, "", _markdown(table), ""])
    (args.out / "run_steps.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
