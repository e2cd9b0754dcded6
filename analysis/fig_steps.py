"""Accuracy against training steps at one length (Kimi Linear Fig. 4, bottom), from the runs' metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from analysis import draw
from analysis.cells import UNSCORED, series_order, task_order
from harness.rundir import read_metrics


def _read_curve(run_dir: str) -> tuple[pd.DataFrame, str | None]:
    """(step, acc %) of every eval step in a run's metrics.jsonl, and why the run is left out of the
    accuracy-vs-steps figure (None: it is not). A file with any bad line is left out whole, not drawn
    with holes."""
    path = Path(run_dir) / "metrics.jsonl"
    empty = pd.DataFrame({"step": pd.Series(dtype="int64"), "acc": pd.Series(dtype="float64")})
    if not path.exists():
        return empty, f"{path}: missing"
    try:
        records, problems = read_metrics(path)
        rows = [{"step": r["step"], "acc": float(r["eval/acc"]) * 100.0} for r in records
                if r.get("eval/acc") is not None]
    except (OSError, TypeError, ValueError) as error:
        return empty, f"{path}: {type(error).__name__}: {error}"
    if problems:
        return empty, f"{path}: " + "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
    return pd.DataFrame(rows, columns=["step", "acc"]), None


def eval_curve(run_dir: str) -> pd.DataFrame:
    """(step, acc %) of a run's evals at its training length; empty where metrics.jsonl cannot be read."""
    return _read_curve(run_dir)[0]


def curves_left_out(runs: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(run, status, reason) of each run with a run directory whose metrics.jsonl cannot be drawn."""
    left_out = []
    for _, run in runs.iterrows():
        if isinstance(run.get("run_dir"), str):
            problem = _read_curve(run["run_dir"])[1]
            if problem is not None:
                left_out.append((str(run.get("run") or run["run_dir"]), str(run["status"]), problem))
    return left_out


def _carry_solved(per_seed: list[tuple[pd.DataFrame, bool]]) -> pd.DataFrame:
    """The seeds' curves of one cell as one frame, each seed that stopped early (its task solved: eval acc
    held the early-stopping threshold) held at its last eval to the last step of the cell's longest seed
    (`carried` True there). Averaged without it, a solved seed drops out of the mean when it stops, and
    the mean falls to the other seeds' as if the cell had unlearned."""
    curves = [curve for curve, _ in per_seed if not curve.empty]
    if not curves:
        return pd.DataFrame(columns=["step", "acc", "seed", "carried"])
    steps = sorted(set().union(*(curve["step"] for curve in curves)))
    out = []
    for curve, stopped_early in per_seed:
        out.append(curve)
        if stopped_early and not curve.empty:
            last = curve.sort_values("step").iloc[-1]
            later = [step for step in steps if step > last["step"]]
            out.append(pd.DataFrame({"step": later, "acc": last["acc"], "seed": last["seed"],
                                     "carried": True}))
    return pd.concat([c for c in out if not c.empty], ignore_index=True)


def plot_acc_vs_steps(runs: pd.DataFrame, best: pd.DataFrame, unscored: pd.DataFrame, length: int,
                      out_dir: Path, pending: pd.DataFrame | None = None, note: str | None = None,
                      max_steps: int | None = None) -> list[Path]:
    """Kimi Fig. 4 (bottom): per task, eval accuracy vs steps at one length, one line per series at its best
    lr, seed band; runs at that length that diverged or failed are marked at the step they stopped.
    `pending`: the grid's cells not yet run (analysis.grid.not_run): a task with one at this length gets
    its panel, each such series a legend entry, a panel without a line says so. `note`: lines above the
    panels. `max_steps`: the x axis's end in every panel, the most steps a run trained (a line ending
    before its budget stopped early, its task solved: only completed runs are drawn; a seed that stopped
    so counts at its last eval while the cell's other seeds train on, the CSV's n_carried)."""
    if "run_dir" not in runs or runs["run_dir"].isna().all():
        raise ValueError("accuracy-vs-steps needs local run directories (metrics.jsonl); this table has none")
    pending = pending if pending is not None else unscored.iloc[:0]
    at_length = best[best["seq_len"] == length]
    todo = pending[pending["seq_len"] == length]
    if at_length.empty and todo.empty:
        raise ValueError(
            f"--length {length}: no completed runs at that length; lengths: "
            f"{sorted(int(v) for v in best['seq_len'].unique())}"
        )
    curves = []
    for _, cell in at_length.iterrows():
        members = runs[
            (runs["task"] == cell["task"])
            & (runs["series"] == cell["series"])
            & (runs["seq_len"] == length)
            & (runs["lr"] == cell["lr"])
        ]
        per_seed = [(eval_curve(run["run_dir"]).assign(seed=run["seed"], carried=False),
                     pd.notna(pd.to_numeric(run.get("early_stopped_at"), errors="coerce")))
                    for _, run in members.iterrows()]
        merged = _carry_solved(per_seed)
        if merged.empty:
            continue
        stats = (
            merged.groupby("step")
            .agg(
                acc_mean=("acc", "mean"),
                acc_std=("acc", lambda a: float(np.std(a, ddof=0))),
                acc_min=("acc", "min"),
                acc_max=("acc", "max"),
                n_seeds=("acc", "size"),
                n_carried=("carried", "sum"),
            )
            .reset_index()
        )
        for key in ("task", "series", "mixer", "variant", "seq_len", "lr"):
            stats[key] = cell[key]
        curves.append(stats)
    columns = ["task", "series", "mixer", "variant", "seq_len", "lr", "step", "acc_mean", "acc_std",
               "acc_min", "acc_max", "n_seeds", "n_carried"]
    data = pd.concat(curves, ignore_index=True)[columns] if curves else pd.DataFrame(columns=columns)
    stopped = unscored[unscored["seq_len"] == length]
    everything = pd.concat([at_length, stopped, todo], ignore_index=True)
    tasks = task_order(everything["task"])
    styles = draw.style(everything)
    rows = [s for s in UNSCORED if (stopped["status"] == s).any()]
    # a legend below each panel, one entry a line: the figure grows by their height
    in_panel = [series_order(everything[everything["task"] == t]) for t in tasks]
    entries = max(len(names) for names in in_panel) + len(rows)
    width = max([4.2] + [draw.legend_inches(names) for names in in_panel])
    fig, axes = draw.panels(len(tasks), width=width, height=3.4 + 0.19 * entries + 0.2 * bool(note))
    for ax, task in zip(axes, tasks, strict=True):
        frame, failed = data[data["task"] == task], stopped[stopped["task"] == task]
        series_names = series_order(everything[everything["task"] == task])
        last = float(max([*frame["step"], *failed["steps"].dropna(), 1]))
        # Series side by side around each eval step (markers at one step must not hide one another, as
        # when every run evaluates once): 1.5 % of the axis apart; the CSV keeps the true steps.
        end = float(max_steps) if max_steps else last
        gap = 0.015 * end
        drawn = [name for name in series_names if (frame["series"] == name).any()]
        for index, series in enumerate(drawn):
            line = frame[frame["series"] == series].sort_values("step")
            # a marker at every eval: the line joins measured points only
            style = dict(styles[series], markersize=3)
            step = line["step"].to_numpy(float) + gap * (index - (len(drawn) - 1) / 2)
            mean, std = line["acc_mean"].to_numpy(float), line["acc_std"].to_numpy(float)
            label = f"{draw.seeds_label(series, line['n_seeds'])}, lr {line['lr'].iloc[0]:g}"
            ax.plot(step, mean, label=label, **style)
            draw.band(ax, step, mean, std, line["n_seeds"].to_numpy(int), style["color"])
        ys = draw.accuracy_axis(ax, rows, "eval accuracy (%)")
        draw.mark_unscored(ax, failed, "steps", ys, series_names, styles, log=False)
        if not drawn:
            ax.text(0.5, 0.55, f"no completed run at L = {length:,} yet", transform=ax.transAxes,
                    ha="center", va="center", color="0.45")
        # Steps from 0 to the longest run (else the last one drawn), in whole steps: matplotlib's own limits
        # around a single eval step (19.0 to 21.0 for an eval at 20) read as fractional steps.
        ax.set_xlim(0, max(end, last) + gap * ((len(drawn) - 1) / 2 + 2))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        ax.set_title(f"{task}, length {length}")
        ax.set_xlabel("training steps")
        ax.grid(alpha=0.3)
        waiting = [name for name in series_names if (todo[todo["task"] == task]["series"] == name).any()]
        draw.panel_legend(ax, series_names, styles, rows if len(failed) else [],
                          draw.not_run_handles(waiting, styles))
    draw.note_above(fig, note)
    return draw.save_figure(fig, data, out_dir, f"acc_vs_steps_len{length}")
