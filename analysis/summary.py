"""summary.md and summary.csv: per task, mixer x length -> best accuracy +- spread, steps to the threshold,
and the runs not scored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.cells import SCORED, UNSCORED, series_order, task_order, with_unscored_rows


def _steps_text(steps: float, reached: int, n: int) -> str:
    if reached == 0 or np.isnan(steps):
        return "not reached"
    return f"{steps:.0f}" + ("" if reached == n else f" ({reached}/{n} seeds)")


def _cell_text(cell: pd.Series) -> str:
    """95.0 ± 1.2 (n=3, lr 0.001, 150); 1 diverged: no spread for one seed, the runs not scored named."""
    n = int(cell["n_seeds"]) if pd.notna(cell["n_seeds"]) else 0
    counts = ", ".join(f"{int(cell[f'n_{s}'])} {s}" for s in UNSCORED
                       if pd.notna(cell.get(f"n_{s}")) and cell[f"n_{s}"])
    if n == 0:
        return f"– ({counts})" if counts else "–"
    spread = f" ± {cell['acc_std']:.1f}" if n >= 2 else ""
    steps = _steps_text(cell["steps_to_threshold"], int(cell["n_reached"]), n)
    text = f"{cell['acc_mean']:.1f}{spread} (n={n}, lr {cell['lr']:g}, {steps})"
    return f"{text}; {counts}" if counts else text


def write_summary(table: pd.DataFrame, best: pd.DataFrame, unscored: pd.DataFrame, out_dir: Path,
                  left_out: list[tuple[str, str, str]] | None = None) -> list[Path]:
    """summary.md (one table per task: mixer rows x length columns) and summary.csv (the same numbers);
    `left_out`: (run, status, reason) of runs whose files a figure could not use."""
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = ["task", "series", "mixer", "variant", "seq_len", "lr", "acc_mean", "acc_std", "n_seeds",
               "steps_to_threshold", "n_reached", "n_diverged", "n_failed"]
    every = with_unscored_rows(best, unscored, columns)
    lines = ["# Sweep summary", ""]
    counts = table["status"].value_counts()
    lines.append(
        f"{len(table)} runs: "
        + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("completed", "diverged", "failed", "incomplete"))
        + "."
    )
    lines += [
        "",
        "Cell: peak eval accuracy (%) at the best learning rate over its completed seeds, mean ± std "
        "(n seeds; no spread for one), the learning rate, the median steps to the accuracy threshold; then "
        "the runs at that length, over every learning rate, that diverged or failed (not scored: the "
        "figures mark them).",
        "",
    ]
    for task in task_order(every["task"]):
        frame = every[every["task"] == task]
        lengths = sorted(int(v) for v in frame["seq_len"].unique())
        lines += [
            f"## {task}",
            "",
            "| mixer | " + " | ".join(f"length {n}" for n in lengths) + " |",
            "|---|" + "---|" * len(lengths),
        ]
        for series in series_order(frame):
            row = [series]
            for length in lengths:
                cell = frame[(frame["series"] == series) & (frame["seq_len"] == length)]
                row.append(_cell_text(cell.iloc[0]) if len(cell) else "–")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    bad = table[~table["status"].isin(SCORED)]
    if len(bad):
        lines += ["## Runs not scored", "", "| run | status | reason |", "|---|---|---|"]
        for _, run in bad.iterrows():
            name = str(run.get("run") or run.get("run_dir") or "")
            reason = str(run.get("reason") or "").replace("|", "/").replace("\n", " ")[:200]
            lines.append(f"| {name} | {run['status']} | {reason} |")
        lines.append("")
    if left_out:
        lines += ["## Runs left out", "", "Their accuracy counts; their file could not be drawn.", "",
                  "| run | status | reason |", "|---|---|---|"]
        for name, status, reason in left_out:
            lines.append(f"| {name} | {status} | {reason.replace('|', '/')[:300]} |")
        lines.append("")
    md = out_dir / "summary.md"
    md.write_text("\n".join(lines))
    csv = out_dir / "summary.csv"
    every.to_csv(csv, index=False)
    return [md, csv]
