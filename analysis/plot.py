"""Paper-style figures from a sweep, each as PNG + PDF with the data behind it as CSV.

    python -m analysis.plot runs/sweeps/kimi_fig4 --out runs/figures/kimi_fig4
    python -m analysis.plot table.csv --out figs --length 1024

Writes, into --out:
- `acc_vs_length.{png,pdf,csv}`: Kimi Linear Fig. 4 style; per task, peak eval accuracy vs training
  length, best learning rate per point, one line per mixer, the seed spread as a band.
- `length_generalisation.{png,pdf,csv}`: per task, final eval accuracy at the training length L and at
  2L vs L (runs evaluated at 2L: `task.eval_seq_lens`).
- `acc_vs_steps_len<L>.{png,pdf,csv}`: per task, eval accuracy vs training steps at length L (default:
  the longest), each mixer at its best learning rate, seed band (from each run's metrics.jsonl).
- `lr_sensitivity.{png,pdf,csv}`: heat maps of accuracy per (mixer, lr), one per (task, length).
- `acc_vs_state_size.{png,pdf,csv}`: accuracy vs the state a mixer keeps per sequence (log x).
- `summary.md` + `summary.csv`: mixer x task x length -> best accuracy +- spread, steps to threshold.

Conventions: accuracy of a run = its `best_eval_acc` (peak over training; `--metric train`: its
`best_train_acc`, the peak training accuracy that Kimi Linear's Fig. 4 plots), and only completed runs have
one. A cell over seeds is the mean, its spread the standard deviation across seeds (population), drawn
as a band (or an error bar) only where at least two seeds were measured; legends and the summary give n.
The best learning rate is the one with the highest mean over its completed seeds. Diverged and failed
runs are never an accuracy: each figure marks them in a grey strip below 0 % (a cross for diverged, a
plus for failed, in the mixer's colour, with a legend entry), the heat maps name them in their cells,
and the summary counts them per cell. Incomplete runs (interrupted, resumable) are listed in the summary
only. Lines join measured points only (a length without a completed run breaks the line). Variants of
one mixer (ablations) keep the mixer's colour and differ by line style.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import LogFormatterSciNotation, LogLocator, MaxNLocator, NullFormatter  # noqa: E402
from matplotlib.transforms import Bbox, Transform  # noqa: E402

from analysis.collect import collect_dirs, read_table  # noqa: E402
from analysis.colours import VARIANT_STYLES, mixer_colour, mixer_order  # noqa: E402
from rundir import read_metrics  # noqa: E402

SCORED = ("completed",)
# Shown in every figure as such (a marker in a strip below 0 %, a legend entry), never as an accuracy.
UNSCORED = ("diverged", "failed")
STATUS_MARKERS = {"diverged": "x", "failed": "+"}
# Kimi Linear Fig. 4's panel order; other tasks follow alphabetically.
TASK_ORDER = ("palindrome", "mqar", "stack")
CELL = ["task", "series", "mixer", "variant", "seq_len", "lr"]
ACC_TICKS = [0, 20, 40, 60, 80, 100]
# a run's accuracy: the held-out peak (default), or the paper's (Kimi Linear Fig. 4: peak training accuracy
# of the logged steps)
METRICS = {"eval": ("best_eval_acc", "peak eval accuracy (%)"),
           "train": ("best_train_acc", "peak training accuracy (%)")}


def load(paths: list[Path]) -> pd.DataFrame:
    """A table file (.csv/.parquet) or sweep directories, collected on the fly."""
    if len(paths) == 1 and paths[0].is_file():
        return read_table(paths[0])
    for path in paths:
        if not path.is_dir():
            raise ValueError(f"{path} is neither a table (.csv/.parquet) nor a sweep directory")
    return collect_dirs(paths)


def _task_order(tasks: pd.Series) -> list[str]:
    present = set(tasks.unique())
    return [t for t in TASK_ORDER if t in present] + sorted(present - set(TASK_ORDER))


def series_name(mixer: str, variant: str) -> str:
    """A series' label in figures and reports: the mixer, with its variant (an ablation) in brackets."""
    return f"{mixer} [{variant}]" if variant else mixer


def _check_columns(table: pd.DataFrame) -> None:
    required = {"task", "mixer", "seq_len", "lr", "seed", "status", "best_eval_acc"}
    missing = required - set(table.columns)
    if missing:
        raise ValueError(f"table lacks columns {sorted(missing)}; make it with python -m analysis.collect")


def _with_series(runs: pd.DataFrame) -> pd.DataFrame:
    runs = runs.copy()
    if "variant" not in runs:
        runs["variant"] = ""
    runs["variant"] = runs["variant"].fillna("").astype(str)
    runs["series"] = [series_name(m, v) for m, v in zip(runs["mixer"], runs["variant"], strict=True)]
    for column in ("steps", "steps_to_threshold", "state_size"):
        values = runs[column] if column in runs else pd.Series(np.nan, index=runs.index)
        runs[column] = pd.to_numeric(values, errors="coerce").astype(float)
    return runs


def scored_runs(table: pd.DataFrame, metric: str = "eval") -> pd.DataFrame:
    """Completed runs, the ones with an accuracy (`acc`, in % by `metric`, a key of METRICS), with a
    `series` column (mixer, or mixer [variant])."""
    _check_columns(table)
    column = METRICS[metric][0]
    completed = table[table["status"].isin(SCORED)]
    if len(completed) and (column not in table or completed[column].isna().all()):
        raise ValueError(f"--metric {metric} needs {column} in the runs' summaries, and no completed run has "
                         f"it (runs written before train.py recorded it); use --metric eval")
    runs = _with_series(table[table["status"].isin(SCORED)])
    runs["acc"] = pd.to_numeric(runs[column], errors="coerce").astype(float) * 100.0
    return runs


def unscored_runs(table: pd.DataFrame) -> pd.DataFrame:
    """Diverged and failed runs, with `series`: the figures mark them, the summary counts them."""
    _check_columns(table)
    return _with_series(table[table["status"].isin(UNSCORED)])


def _status_counts(unscored: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """n_diverged and n_failed per `keys`."""
    columns = [f"n_{s}" for s in UNSCORED]
    if unscored.empty:
        return pd.DataFrame(columns=keys + columns)
    counts = pd.crosstab([unscored[k] for k in keys], unscored["status"])
    counts = counts.reindex(columns=list(UNSCORED), fill_value=0)
    counts.columns = columns
    return counts.reset_index()


def cells(runs: pd.DataFrame, unscored: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (task, series, length, lr): accuracy over the completed seeds (mean, spread, min, max,
    n_seeds) and the diverged and failed runs there (n_diverged, n_failed; a cell may have only those)."""
    grouped = runs.groupby(CELL, dropna=False, sort=True)
    # A completed run whose summary lacks the metric is no seed of the cell: counted as one, it made a
    # cell of one measured seed read "n=2, ± 0.0".
    out = grouped.agg(
        acc_mean=("acc", "mean"),
        acc_std=("acc", lambda a: float(np.std(a.dropna().to_numpy(), ddof=0)) if a.notna().any()
                 else np.nan),
        acc_min=("acc", "min"),
        acc_max=("acc", "max"),
        n_seeds=("acc", "count"),
        steps_to_threshold=("steps_to_threshold", "median"),
        n_reached=("steps_to_threshold", lambda s: int(s.notna().sum())),
        state_size=("state_size", "mean"),
    ).reset_index()
    unscored = unscored if unscored is not None else runs.iloc[:0]
    counts = _status_counts(unscored, CELL)
    out = out.merge(counts, on=CELL, how="outer") if len(counts) else out.assign(n_diverged=0, n_failed=0)
    for column in ("n_seeds", "n_reached", "n_diverged", "n_failed"):
        out[column] = out[column].fillna(0).astype(int)
    return out.sort_values(CELL).reset_index(drop=True)


def best_lr(cell_table: pd.DataFrame) -> pd.DataFrame:
    """Per (task, series, length): the cell of the learning rate with the highest mean accuracy over its
    completed seeds, with n_diverged / n_failed summed over every learning rate at that length."""
    keys = ["task", "series", "seq_len"]
    scored = cell_table[cell_table["n_seeds"] > 0]
    ordered = scored.sort_values(["acc_mean", "lr"], ascending=[False, True], kind="stable")
    best = ordered.groupby(keys, sort=False).head(1).drop(columns=["n_diverged", "n_failed"])
    totals = cell_table.groupby(keys, as_index=False)[["n_diverged", "n_failed"]].sum()
    best = best.merge(totals, on=keys, how="left")
    return best.sort_values(keys).reset_index(drop=True)


def _series_order(frame: pd.DataFrame) -> list[str]:
    pairs = frame[["series", "mixer", "variant"]].drop_duplicates()
    by_mixer = {m: sorted(pairs[pairs["mixer"] == m]["variant"]) for m in pairs["mixer"].unique()}
    return [series_name(m, v) for m in mixer_order(set(by_mixer)) for v in by_mixer[m]]


def _style(frame: pd.DataFrame) -> dict[str, dict[str, object]]:
    """Series -> matplotlib kwargs: the mixer's colour, a line style per variant of that mixer."""
    styles: dict[str, dict[str, object]] = {}
    pairs = frame[["series", "mixer", "variant"]].drop_duplicates()
    for mixer in pairs["mixer"].unique():
        variants = sorted(pairs[pairs["mixer"] == mixer]["variant"])
        for index, variant in enumerate(variants):
            linestyle, marker = VARIANT_STYLES[index % len(VARIANT_STYLES)]
            styles[series_name(mixer, variant)] = {
                "color": mixer_colour(mixer),
                "linestyle": linestyle,
                "marker": marker,
            }
    return styles


def _panels(n: int, width: float = 4.2, height: float = 3.4, legend: float = 0.0
            ) -> tuple[plt.Figure, list[plt.Axes]]:
    """n panels side by side, plus `legend` inches on the right for a figure legend."""
    fig, axes = plt.subplots(1, n, figsize=(width * n + legend, height), squeeze=False, layout="constrained")
    return fig, list(axes[0])


def _legend_inches(series: list[str]) -> float:
    """The width a figure legend of these series takes: its longest label (a series with the longest
    suffix, " (no completed run)") at the small font, about 0.065 inches a character, plus the handle."""
    longest = max([len(name) for name in series] + [0]) + len(" (no completed run)")
    return 0.065 * max(longest, len("diverged (not scored)")) + 0.7


def save_figure(fig: plt.Figure, data: pd.DataFrame, out_dir: Path, name: str) -> list[Path]:
    """name.png, name.pdf and name.csv (the exact numbers drawn) in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf", out_dir / f"{name}.csv"]
    fig.savefig(paths[0], dpi=150)
    fig.savefig(paths[1])
    plt.close(fig)
    data.to_csv(paths[2], index=False)
    return paths


def _length_axis(ax: plt.Axes, lengths: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(length) for length in lengths])
    ax.minorticks_off()
    # room beside the first and last length for the markers dodged around them
    ax.set_xlim(lengths[0] / 1.25, lengths[-1] * 1.25)


def _accuracy_axis(ax: plt.Axes, rows: list[str], label: str) -> dict[str, float]:
    """0-100 % on y, and below it, when some runs were not scored, a grey strip with a row per status
    (diverged, failed) for their markers; returns each row's y."""
    ys = {status: -13.0 - 10.0 * index for index, status in enumerate(rows)}
    bottom = min(ys.values()) - 7.0 if rows else -2.0
    ax.set_ylim(bottom, 102)
    ax.set_yticks(ACC_TICKS + list(ys.values()))
    ax.set_yticklabels([str(t) for t in ACC_TICKS] + list(ys))
    if rows:
        ax.axhspan(bottom, -5.0, color="0.93", linewidth=0, zorder=0)
    ax.set_ylabel(label)
    return ys


def _dodge(values: pd.Series | np.ndarray, index: int, count: int, log: bool) -> np.ndarray:
    """x values moved a little per series (index of count), so that markers sharing an x stay apart:
    by a factor of 2^(0.05 (index - centre)) on a log axis, by 0.6 % of the largest value on a linear one.
    The figures' CSVs keep the true values."""
    values = np.asarray(values, dtype=float)
    shift = index - (count - 1) / 2
    if log:
        return values * 2.0 ** (0.05 * shift)
    return values + 0.006 * shift * (np.nanmax(np.abs(values)) if len(values) else 0.0)


def _mark_unscored(ax: plt.Axes, points: pd.DataFrame, x: str, ys: dict[str, float], series: list[str],
                   styles: dict[str, dict[str, object]], log: bool) -> None:
    """One marker per (series, x, status) in the strip: where runs diverged or failed."""
    for status, y in ys.items():
        at = points[points["status"] == status]
        for index, name in enumerate(series):
            xs = np.array(sorted(set(at[at["series"] == name][x].dropna())), dtype=float)
            if len(xs):
                ax.plot(_dodge(xs, index, len(series), log), [y] * len(xs), linestyle="none",
                        marker=STATUS_MARKERS[status], markersize=7, markeredgewidth=1.6,
                        color=styles[name]["color"], clip_on=False)


def _status_handles(rows: list[str]) -> list[Line2D]:
    return [Line2D([], [], linestyle="none", marker=STATUS_MARKERS[s], markersize=7, markeredgewidth=1.6,
                   color="0.35", label=f"{s} (not scored)") for s in rows]


def _seeds_label(series: str, n: pd.Series) -> str:
    low, high = int(n.min()), int(n.max())
    count = f"n={low}" if low == high else f"n={low}-{high}"
    return f"{series} ({count})"


def _band(ax: plt.Axes, x: np.ndarray, mean: np.ndarray, std: np.ndarray, n: np.ndarray,
          colour: object) -> None:
    """The seed spread (mean +- std) only where n >= 2 seeds: a band between neighbouring such points, an
    error bar at one without such a neighbour."""
    spread = n >= 2
    low, high = np.clip(mean - std, 0, 100), np.clip(mean + std, 0, 100)
    ax.fill_between(x, low, high, where=spread, color=colour, alpha=0.18, linewidth=0, interpolate=False)
    for i in np.flatnonzero(spread):
        neighbours = [j for j in (i - 1, i + 1) if 0 <= j < len(x) and spread[j]]
        if not neighbours:
            ax.errorbar(x[i], mean[i], yerr=[[mean[i] - low[i]], [high[i] - mean[i]]], color=colour,
                        capsize=3, linewidth=1)


def _figure_legend(fig: plt.Figure, axes: list[plt.Axes], series: list[str],
                   styles: dict[str, dict[str, object]], rows: list[str], n_seeds: pd.DataFrame) -> None:
    """One legend for the whole figure, outside the panels (it can hide no data and no label): a line per
    series with its number of seeds, a proxy for each series with no completed run, the status markers."""
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    labels = [_seeds_label(name, n_seeds[n_seeds["series"] == name]["n_seeds"]) for name in handles]
    extra = _missing_series_handles(series, list(handles), styles) + _status_handles(rows)
    if handles or extra:
        fig.legend(handles=list(handles.values()) + extra, labels=labels + [h.get_label() for h in extra],
                   loc="outside right upper", fontsize="small")


def plot_acc_vs_length(best: pd.DataFrame, unscored: pd.DataFrame, out_dir: Path,
                       label: str = METRICS["eval"][1], note: str | None = None) -> list[Path]:
    """Kimi Fig. 4 (top): per task, peak accuracy vs training length at the best lr, seed band. `note`:
    a line above the panels (e.g. the step budget, where it differs from the paper's)."""
    frame_all = pd.concat([best, unscored], ignore_index=True)
    tasks = _task_order(frame_all["task"])
    styles = _style(frame_all)
    rows = [s for s in UNSCORED if (unscored["status"] == s).any()]
    fig, axes = _panels(len(tasks), legend=_legend_inches(_series_order(frame_all)))
    for ax, task in zip(axes, tasks, strict=True):
        frame, failed = best[best["task"] == task], unscored[unscored["task"] == task]
        lengths = sorted({int(v) for v in frame_all[frame_all["task"] == task]["seq_len"]})
        series_names = _series_order(frame_all[frame_all["task"] == task])
        for index, series in enumerate(series_names):
            # Reindexed on every length of the panel: a length without a completed run breaks the line.
            line = frame[frame["series"] == series].set_index("seq_len").reindex(lengths)
            if line["acc_mean"].notna().any():
                # dodged: series that reach the same accuracy at a length stay visible side by side
                x = _dodge(np.array(lengths, dtype=float), index, len(series_names), log=True)
                mean, std = line["acc_mean"].to_numpy(float), line["acc_std"].to_numpy(float)
                n = line["n_seeds"].fillna(0).to_numpy(int)
                ax.plot(x, mean, label=series, **styles[series])
                _band(ax, x, mean, std, n, styles[series]["color"])
        ys = _accuracy_axis(ax, rows, label)
        _mark_unscored(ax, failed, "seq_len", ys, series_names, styles, log=True)
        _length_axis(ax, lengths)
        ax.set_title(task)
        ax.set_xlabel("training sequence length (tokens)")
        ax.grid(alpha=0.3)
    _figure_legend(fig, axes, _series_order(frame_all), styles, rows, best)
    if note:
        fig.suptitle(note, fontsize="small")
    columns = ["task", "series", "mixer", "variant", "seq_len", "lr", "acc_mean", "acc_std", "acc_min",
               "acc_max", "n_seeds", "n_diverged", "n_failed"]
    return save_figure(fig, _with_unscored_rows(best, unscored, columns), out_dir, "acc_vs_length")


def _with_unscored_rows(best: pd.DataFrame, unscored: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """best's rows, plus a row (no accuracy) per (task, series, length) whose runs all diverged or failed."""
    keys = ["task", "series", "mixer", "variant", "seq_len"]
    counts = _status_counts(unscored, keys)
    if counts.empty:
        return best[columns].reset_index(drop=True)
    merged = counts.merge(best[keys], on=keys, how="left", indicator=True)
    only = merged[merged["_merge"] == "left_only"].drop(columns="_merge").assign(n_seeds=0)
    data = pd.concat([best, only], ignore_index=True).reindex(columns=columns)
    return data.sort_values(keys).reset_index(drop=True)


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


def _eval_curve(run_dir: str) -> pd.DataFrame:
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


def plot_acc_vs_steps(runs: pd.DataFrame, best: pd.DataFrame, unscored: pd.DataFrame, length: int,
                      out_dir: Path) -> list[Path]:
    """Kimi Fig. 4 (bottom): per task, eval accuracy vs steps at one length, best lr, seed band; runs at
    that length that diverged or failed are marked at the step they stopped."""
    if "run_dir" not in runs or runs["run_dir"].isna().all():
        raise ValueError("accuracy-vs-steps needs local run directories (metrics.jsonl); this table has none")
    at_length = best[best["seq_len"] == length]
    if at_length.empty:
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
        per_seed = []
        for _, run in members.iterrows():
            curve = _eval_curve(run["run_dir"])
            per_seed.append(curve.assign(seed=run["seed"]))
        merged = pd.concat(per_seed, ignore_index=True) if per_seed else pd.DataFrame(columns=["step", "acc"])
        if merged.empty:
            continue
        stats = (
            merged.groupby("step")["acc"]
            .agg(
                acc_mean="mean",
                acc_std=lambda a: float(np.std(a, ddof=0)),
                acc_min="min",
                acc_max="max",
                n_seeds="size",
            )
            .reset_index()
        )
        for key in ("task", "series", "mixer", "variant", "seq_len", "lr"):
            stats[key] = cell[key]
        curves.append(stats)
    columns = ["task", "series", "mixer", "variant", "seq_len", "lr", "step", "acc_mean", "acc_std",
               "acc_min", "acc_max", "n_seeds"]
    data = pd.concat(curves, ignore_index=True)[columns] if curves else pd.DataFrame(columns=columns)
    stopped = unscored[unscored["seq_len"] == length]
    tasks = _task_order(pd.concat([at_length["task"], stopped["task"]]))
    styles = _style(pd.concat([at_length, stopped], ignore_index=True))
    rows = [s for s in UNSCORED if (stopped["status"] == s).any()]
    # a legend below each panel, one entry a line: the figure grows by their height
    in_panel = [_series_order(pd.concat([at_length[at_length["task"] == t], stopped[stopped["task"] == t]]))
                for t in tasks]
    entries = max(len(names) for names in in_panel) + len(rows)
    width = max([4.2] + [_legend_inches(names) for names in in_panel])
    fig, axes = _panels(len(tasks), width=width, height=3.4 + 0.19 * entries)
    for ax, task in zip(axes, tasks, strict=True):
        frame, failed = data[data["task"] == task], stopped[stopped["task"] == task]
        series_names = _series_order(pd.concat([at_length[at_length["task"] == task], failed]))
        last = float(max([*frame["step"], *failed["steps"].dropna(), 1]))
        # Series side by side around each eval step (markers at one step must not hide one another, as
        # when every run evaluates once): 1.5 % of the axis apart; the CSV keeps the true steps.
        gap = 0.015 * last
        drawn = [name for name in series_names if (frame["series"] == name).any()]
        for index, series in enumerate(drawn):
            line = frame[frame["series"] == series].sort_values("step")
            # a marker at every eval: the line joins measured points only
            style = dict(styles[series], markersize=3)
            step = line["step"].to_numpy(float) + gap * (index - (len(drawn) - 1) / 2)
            mean, std = line["acc_mean"].to_numpy(float), line["acc_std"].to_numpy(float)
            label = f"{_seeds_label(series, line['n_seeds'])}, lr {line['lr'].iloc[0]:g}"
            ax.plot(step, mean, label=label, **style)
            _band(ax, step, mean, std, line["n_seeds"].to_numpy(int), style["color"])
        ys = _accuracy_axis(ax, rows, "eval accuracy (%)")
        _mark_unscored(ax, failed, "steps", ys, series_names, styles, log=False)
        # Steps from 0 to the last one drawn, in whole steps: matplotlib's own limits around a single eval
        # step (19.0 to 21.0 for an eval at 20) read as fractional steps.
        ax.set_xlim(0, last + gap * ((len(drawn) - 1) / 2 + 2))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        ax.set_title(f"{task}, length {length}")
        ax.set_xlabel("training steps")
        ax.grid(alpha=0.3)
        _legend(ax, series_names, styles, rows if len(failed) else [])
    return save_figure(fig, data, out_dir, f"acc_vs_steps_len{length}")


def _legend(ax: plt.Axes, series: list[str], styles: dict[str, dict[str, object]], rows: list[str]) -> None:
    """The panel's legend, below it (it hides no data): its lines, a proxy for each series with no
    completed run, the status markers."""
    handles, labels = ax.get_legend_handles_labels()
    handles += _missing_series_handles(series, labels, styles) + _status_handles(rows)
    if handles:
        ax.legend(handles=handles, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16),
                  frameon=False)


def _missing_series_handles(series: list[str], labels: list[str], styles: dict[str, dict[str, object]]
                            ) -> list[Line2D]:
    """Legend entries for series drawn only as status markers (every run diverged or failed)."""
    drawn = {label.split(" (n=")[0] for label in labels}
    return [Line2D([], [], linestyle="none", marker="s", color=styles[name]["color"],
                   label=f"{name} (no completed run)") for name in series if name not in drawn]


def plot_lr_sensitivity(cell_table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Heat map of mean accuracy per (series, lr) over completed seeds, one panel per (task, length); a cell
    names its diverged and failed runs, and is grey when it has no completed one."""
    tasks = _task_order(cell_table["task"])
    lengths = sorted(int(v) for v in cell_table["seq_len"].unique())
    fig, axes = plt.subplots(
        len(tasks),
        len(lengths),
        squeeze=False,
        layout="constrained",
        figsize=(
            3.2 * len(lengths) + 1.6,
            0.5 * cell_table["series"].nunique() * len(tasks) + 1.5 * len(tasks),
        ),
    )
    colours = plt.get_cmap("viridis").with_extremes(bad="0.82")
    image = None
    for row, task in enumerate(tasks):
        for col, length in enumerate(lengths):
            ax = axes[row][col]
            frame = cell_table[(cell_table["task"] == task) & (cell_table["seq_len"] == length)]
            series = _series_order(frame) if not frame.empty else []
            lrs = sorted(frame["lr"].unique())
            grid = np.full((len(series), len(lrs)), np.nan)
            texts = [["" for _ in lrs] for _ in series]
            for _, cell in frame.iterrows():
                i, j = series.index(cell["series"]), lrs.index(cell["lr"])
                notes = [f"{int(cell[f'n_{s}'])} {'div.' if s == 'diverged' else 'fail'}" for s in UNSCORED
                         if cell[f"n_{s}"]]
                value = []
                if cell["n_seeds"]:
                    grid[i, j] = cell["acc_mean"]
                    value = [f"{cell['acc_mean']:.0f}"]
                texts[i][j] = "\n".join(value + ([", ".join(notes)] if notes else []))
            image = ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=100, cmap=colours, aspect="auto")
            for i in range(len(series)):
                for j in range(len(lrs)):
                    dark = not np.isnan(grid[i, j]) and grid[i, j] < 60
                    ax.text(j, i, texts[i][j], ha="center", va="center", fontsize=6.5,
                            color="white" if dark else "black", linespacing=1.0)
            ax.set_xticks(range(len(lrs)))
            ax.set_xticklabels([f"{lr:g}" for lr in lrs], rotation=45, fontsize=7)
            ax.set_yticks(range(len(series)))
            ax.set_yticklabels(series, fontsize=7)
            for label in ax.get_yticklabels():
                label.set_color(mixer_colour(frame[frame["series"] == label.get_text()]["mixer"].iloc[0]))
            ax.set_title(f"{task}, length {length}", fontsize=9)
            ax.set_xlabel("learning rate", fontsize=8)
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.8)
        bar.set_label("mean peak eval accuracy (%)\nof completed seeds; grey: none", fontsize=8)
    columns = ["task", "seq_len", "series", "mixer", "variant", "lr", "acc_mean", "acc_std", "n_seeds",
               "n_diverged", "n_failed"]
    data = cell_table[columns].sort_values(["task", "seq_len", "series", "lr"]).reset_index(drop=True)
    return save_figure(fig, data, out_dir, "lr_sensitivity")


def _log_ticks(ax: plt.Axes, low: float, high: float) -> None:
    """Labelled ticks at 1, 2, 5 x 10^k on a log x axis spanning up to two decades, at 10^k on a wider
    one, and no labelled minor ticks (matplotlib's own crowd into each other on a decade or so)."""
    decades = np.log10(max(high, low * 4) / low) if low > 0 else 0.0
    subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    # thresholds at infinity: label every tick the locator placed, not matplotlib's chosen subset
    every = LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(np.inf, np.inf))
    ax.xaxis.set_major_formatter(every)
    ax.xaxis.set_minor_formatter(NullFormatter())


def _overlap(a: Bbox, b: Bbox) -> float:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(width, 0.0) * max(height, 0.0)


def _place_labels(ax: plt.Axes, labels: list[tuple[float, float, str, str, Transform]],
                  obstacles: list[Bbox]) -> None:
    """Each point label at the first free spot around its point (beside it, then farther up or down with
    a leader line): over no other label or marker, inside the axes. Call after the layout is final."""
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    near = [(4, 1, "left", "bottom"), (4, -1, "left", "top"), (-4, 1, "right", "bottom"),
            (-4, -1, "right", "top")]
    far = [(dx, dy, ha, "center") for k in range(1, 10) for dy in (7 * k, -7 * k)
           for dx, ha in ((10, "left"), (-10, "right"))]
    taken = list(obstacles)
    for x, y, text, colour, transform in sorted(labels, key=lambda label: -label[1]):
        best: tuple[float, tuple[float, float, str, str]] | None = None
        for candidate in near + far:
            dx, dy, ha, va = candidate
            probe = ax.annotate(text, (x, y), xycoords=transform, xytext=(dx, dy), textcoords="offset points",
                                ha=ha, va=va, fontsize=6)
            box = probe.get_window_extent(renderer)
            probe.remove()
            outside = box.width * box.height - _overlap(box, frame)
            cost = sum(_overlap(box, t) for t in taken) + 10 * outside
            if best is None or cost < best[0]:
                best = (cost, candidate)
            if cost == 0:
                break
        assert best is not None
        dx, dy, ha, va = best[1]
        leader = {"arrowstyle": "-", "linewidth": 0.5, "color": colour, "shrinkA": 0, "shrinkB": 2}
        label = ax.annotate(text, (x, y), xycoords=transform, xytext=(dx, dy), textcoords="offset points",
                            ha=ha, va=va, fontsize=6, color=colour,
                            arrowprops=leader if abs(dy) > 2 else None)
        # the text's box only: a leader line may pass between labels
        label.update_positions(renderer)
        taken.append(Text.get_window_extent(label, renderer))


def plot_acc_vs_state_size(best: pd.DataFrame, unscored: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Zoology's view: accuracy at the best lr vs the numbers a mixer keeps per sequence (log x), each point
    labelled with its training length; runs that diverged or failed are marked at their state size."""
    data = best.dropna(subset=["state_size"])
    if data.empty:
        raise ValueError(
            "no state_size in the table (summary.json lacks it); cannot draw accuracy vs state size"
        )
    marks = unscored.dropna(subset=["state_size"])
    tasks = _task_order(pd.concat([data["task"], marks["task"]]))
    styles = _style(pd.concat([data, marks], ignore_index=True))
    rows = [s for s in UNSCORED if (marks["status"] == s).any()]
    fig, axes = _panels(len(tasks), width=4.6,
                        legend=_legend_inches(_series_order(pd.concat([data, marks], ignore_index=True))))
    pending = []
    for ax, task in zip(axes, tasks, strict=True):
        frame, failed = data[data["task"] == task], marks[marks["task"] == task]
        series_names = _series_order(pd.concat([frame, failed]))
        sizes = frame.groupby("state_size")["series"].nunique()
        # Mixers with the same state size (e.g. every recurrent one at any length) would hide each other.
        shared = bool((sizes > 1).any())
        labels = []
        for index, series in enumerate(series_names):
            points = frame[frame["series"] == series].sort_values("seq_len")
            if points.empty:
                continue
            x = _dodge(points["state_size"], index, len(series_names), log=True) if shared else points[
                "state_size"].to_numpy(float)
            ax.plot(x, points["acc_mean"], label=series, alpha=0.9, markersize=4, **styles[series])
            labels += [(xi, acc, str(int(length)), styles[series]["color"], ax.transData)
                       for xi, acc, length in zip(x, points["acc_mean"], points["seq_len"], strict=True)]
        ax.set_xscale("log")
        ax.margins(x=0.08)
        ys = _accuracy_axis(ax, rows, "peak eval accuracy (%)")
        _mark_unscored(ax, failed, "state_size", ys, series_names, styles, log=True)
        xs = pd.concat([frame["state_size"], failed["state_size"]])
        if xs.nunique() == 1:
            ax.set_xlim(xs.iloc[0] / 4, xs.iloc[0] * 4)
        _log_ticks(ax, float(xs.min()), float(xs.max()))
        ax.set_title(f"{task} (labels: training length)")
        ax.set_xlabel("state size (numbers per sequence, log scale)")
        ax.grid(alpha=0.3, which="both")
        pending.append((ax, labels))
    _figure_legend(fig, axes, _series_order(pd.concat([data, marks], ignore_index=True)), styles, rows, data)
    # The layout first, then frozen: the labels are placed in the axes' final positions.
    fig.canvas.draw()
    fig.set_layout_engine("none")
    pad = 3 * fig.dpi / 72  # a marker's half width, in pixels
    for ax, labels in pending:
        markers = [line.get_transform().transform(xy) for line in ax.get_lines() for xy in line.get_xydata()]
        obstacles = [Bbox.from_extents(x - pad, y - pad, x + pad, y + pad) for x, y in markers]
        _place_labels(ax, labels, obstacles)
    columns = ["task", "series", "mixer", "variant", "seq_len", "lr", "state_size", "acc_mean", "acc_std",
               "n_seeds", "n_diverged", "n_failed"]
    return save_figure(fig, data[columns].reset_index(drop=True), out_dir, "acc_vs_state_size")


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
    every = _with_unscored_rows(best, unscored, columns)
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
    for task in _task_order(every["task"]):
        frame = every[every["task"] == task]
        lengths = sorted(int(v) for v in frame["seq_len"].unique())
        lines += [
            f"## {task}",
            "",
            "| mixer | " + " | ".join(f"length {n}" for n in lengths) + " |",
            "|---|" + "---|" * len(lengths),
        ]
        for series in _series_order(frame):
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


def plot_length_generalisation(runs: pd.DataFrame, best: pd.DataFrame, out_dir: Path,
                               note: str | None = None) -> list[Path]:
    """Per task, the final eval accuracy at the training length L (solid) and at 2L (dashed) vs L, each
    series at its best lr (mean over seeds): how far what was learnt at L carries to twice the length.
    Drawn from the summaries' final_eval/acc@<len>; lengths without an eval at 2L are left out."""
    rows = []
    for _, cell in best.iterrows():
        length = int(cell["seq_len"])
        at = runs[(runs["task"] == cell["task"]) & (runs["series"] == cell["series"])
                  & (runs["seq_len"] == length) & (runs["lr"] == cell["lr"])]
        here, there = f"final_eval/acc@{length}", f"final_eval/acc@{2 * length}"
        if there not in at or at[there].isna().all():
            continue
        acc_l = pd.to_numeric(at[here] if here in at else at["final_eval_acc"], errors="coerce") * 100
        acc_2l = pd.to_numeric(at[there], errors="coerce") * 100
        rows.append({"task": cell["task"], "series": cell["series"], "mixer": cell["mixer"],
                     "variant": cell["variant"], "seq_len": length, "lr": cell["lr"],
                     "acc_at_L": acc_l.mean(), "acc_at_2L": acc_2l.mean(),
                     "n_seeds": int(acc_2l.notna().sum())})
    if not rows:
        print("skipping length generalisation: no run was evaluated at twice its training length "
              "(task.eval_seq_lens)", file=sys.stderr)
        return []
    data = pd.DataFrame(rows)
    tasks = _task_order(data["task"])
    styles = _style(data)
    series_all = _series_order(data)
    fig, axes = _panels(len(tasks), legend=_legend_inches(series_all))
    for ax, task in zip(axes, tasks, strict=True):
        frame = data[data["task"] == task]
        lengths = sorted({int(v) for v in frame["seq_len"]})
        names = _series_order(frame)
        for index, series in enumerate(names):
            line = frame[frame["series"] == series].set_index("seq_len").reindex(lengths)
            colour, marker = styles[series]["color"], styles[series]["marker"]
            x = _dodge(np.array(lengths, dtype=float), index, len(names), log=True)
            # 2L as a larger hollow marker beneath L's filled one: a single length has no line to be dashed,
            # and where both accuracies are equal the ring still shows around the dot
            ax.plot(x, line["acc_at_2L"], color=colour, marker=marker, linestyle="--", alpha=0.8,
                    markerfacecolor="white", markersize=10, zorder=2)
            ax.plot(x, line["acc_at_L"], color=colour, marker=marker, markersize=5, label=series, zorder=3)
        ax.set_ylim(-2, 102)
        ax.set_yticks(ACC_TICKS)
        ax.set_ylabel("final eval accuracy (%)")
        _length_axis(ax, lengths)
        ax.set_title(task)
        ax.set_xlabel("training sequence length L (tokens)")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=styles[s]["color"], marker=styles[s]["marker"], label=s)
               for s in series_all]
    handles += [Line2D([], [], color="0.35", marker="o", markersize=5, label="evaluated at L"),
                Line2D([], [], color="0.35", marker="o", markerfacecolor="white", markersize=10,
                       linestyle="--", label="evaluated at 2L")]
    fig.legend(handles=handles, loc="outside right upper", fontsize="small")
    if note:
        fig.suptitle(note, fontsize="small")
    return save_figure(fig, data, out_dir, "length_generalisation")


def max_trained_steps(table: pd.DataFrame) -> int | None:
    """The largest `trainer.max_steps` of the table's runs (None: no run recorded it)."""
    if "trainer.max_steps" not in table:
        return None
    steps = pd.to_numeric(table["trainer.max_steps"], errors="coerce")
    return int(steps.max()) if steps.notna().any() else None


def _step_budget_note(table: pd.DataFrame) -> str | None:
    # Kimi Linear trains up to 20,000 steps; a sweep with fewer says so on its figures
    steps = max_trained_steps(table)
    if steps is not None and steps < 20_000:
        return f"at most {steps:,} training steps per run (Kimi Linear: up to 20,000)"
    return None


def plot_all(table: pd.DataFrame, out_dir: Path, length: int | None = None,
             metric: str = "eval") -> list[Path]:
    """Every figure and the summary; returns the files written. `metric`: a key of METRICS."""
    runs = scored_runs(table, metric)
    if runs.empty:
        raise ValueError(
            "no completed runs in the table; nothing to plot "
            f"(statuses: {table['status'].value_counts().to_dict()})"
        )
    unscored = unscored_runs(table)
    cell_table = cells(runs, unscored)
    best = best_lr(cell_table)
    note = _step_budget_note(table)
    written = plot_acc_vs_length(best, unscored, out_dir, METRICS[metric][1], note)
    written += plot_length_generalisation(runs, best, out_dir, note)
    has_dirs = "run_dir" in runs and runs["run_dir"].notna().any()
    if has_dirs:
        written += plot_acc_vs_steps(runs, best, unscored, length or int(best["seq_len"].max()), out_dir)
    else:
        print("skipping accuracy vs steps: the table has no local run directories", file=sys.stderr)
    written += plot_lr_sensitivity(cell_table, out_dir)
    if best["state_size"].notna().any():
        written += plot_acc_vs_state_size(best, unscored, out_dir)
    else:
        print("skipping accuracy vs state size: no state_size in the summaries", file=sys.stderr)
    left_out = curves_left_out(runs) if has_dirs else []
    for name, _, reason in left_out:
        print(f"left out of accuracy vs steps: {name}: {reason}", file=sys.stderr)
    written += write_summary(table, best, unscored, out_dir, left_out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="a table (.csv/.parquet) or sweep directories")
    parser.add_argument("--out", type=Path, required=True, help="folder for the figures")
    parser.add_argument(
        "--length",
        type=int,
        help="training length of the accuracy-vs-steps figure (default: the longest in the table)",
    )
    parser.add_argument("--metric", choices=list(METRICS), default="eval",
                        help="a run's accuracy: peak held-out eval accuracy (default), or the paper's peak "
                             "training accuracy (Kimi Linear Fig. 4)")
    args = parser.parse_args(argv)
    try:
        written = plot_all(load(args.inputs), args.out, args.length, args.metric)
    except ValueError as error:
        # A wrong path or an unusable table: the message says what to do, a traceback would only bury it.
        parser.error(str(error))
    print(f"wrote {len(written)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
