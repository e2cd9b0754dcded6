"""Paper-style figures from a sweep, each as PNG + PDF with the data behind it as CSV.

    python -m analysis.plot runs/sweeps/kimi_fig4 --out runs/figures/kimi_fig4
    python -m analysis.plot table.csv --out figs --length 1024

Writes, into --out:
- `acc_vs_length.{png,pdf,csv}`: Kimi Linear Fig. 4 style; per task, peak eval accuracy vs training
  length, best learning rate per point, one line per mixer, the seed spread as a band.
- `acc_vs_steps_len<L>.{png,pdf,csv}`: per task, eval accuracy vs training steps at length L (default:
  the longest), each mixer at its best learning rate, seed band (from each run's metrics.jsonl).
- `lr_sensitivity.{png,pdf,csv}`: heat maps of accuracy per (mixer, lr), one per (task, length).
- `acc_vs_state_size.{png,pdf,csv}`: accuracy vs the state a mixer keeps per sequence (log x).
- `summary.md` + `summary.csv`: mixer x task x length -> best accuracy +- spread, steps to threshold.

Conventions: accuracy of a run = its `best_eval_acc` (peak over training); a cell over seeds is the
mean, its spread the standard deviation across seeds (population, so one seed has spread 0); the band is
mean +- spread clipped to [0, 100] %. The best learning rate is the one with the highest mean over seeds.
Completed and diverged runs count (a run that diverged scored what it reached before, or 0 when it never
evaluated); failed and incomplete runs are left out and listed in summary.md. Variants of one mixer
(ablations) keep the mixer's colour and differ by line style.
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

from analysis.collect import collect_dirs, read_table  # noqa: E402
from analysis.colours import VARIANT_STYLES, mixer_colour, mixer_order  # noqa: E402
from rundir import read_metrics  # noqa: E402

SCORED = ("completed", "diverged")
# Kimi Linear Fig. 4's panel order; other tasks follow alphabetically.
TASK_ORDER = ("palindrome", "mqar", "stack")
CELL = ["task", "series", "mixer", "variant", "seq_len", "lr"]


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


def _series_name(mixer: str, variant: str) -> str:
    return f"{mixer} [{variant}]" if variant else mixer


def scored_runs(table: pd.DataFrame) -> pd.DataFrame:
    """Runs that count for accuracy, with a `series` column (mixer, or mixer [variant])."""
    required = {"task", "mixer", "seq_len", "lr", "seed", "status", "best_eval_acc"}
    missing = required - set(table.columns)
    if missing:
        raise ValueError(f"table lacks columns {sorted(missing)}; make it with python -m analysis.collect")
    runs = table[table["status"].isin(SCORED)].copy()
    if "variant" not in runs:
        runs["variant"] = ""
    runs["variant"] = runs["variant"].fillna("").astype(str)
    runs["series"] = [_series_name(m, v) for m, v in zip(runs["mixer"], runs["variant"], strict=True)]
    diverged = runs["status"] == "diverged"
    runs.loc[diverged, "best_eval_acc"] = runs.loc[diverged, "best_eval_acc"].fillna(0.0)
    runs["acc"] = runs["best_eval_acc"].astype(float) * 100.0
    return runs


def cells(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, series, length, lr): accuracy over seeds (mean, spread, min, max, n)."""
    steps = (
        runs["steps_to_threshold"] if "steps_to_threshold" in runs else pd.Series(np.nan, index=runs.index)
    )
    runs = runs.assign(steps_to_threshold=pd.to_numeric(steps, errors="coerce").astype(float))
    state = runs["state_size"] if "state_size" in runs else pd.Series(np.nan, index=runs.index)
    runs = runs.assign(state_size=pd.to_numeric(state, errors="coerce").astype(float))
    grouped = runs.groupby(CELL, dropna=False, sort=True)
    out = grouped.agg(
        acc_mean=("acc", "mean"),
        acc_std=("acc", lambda a: float(np.std(a, ddof=0))),
        acc_min=("acc", "min"),
        acc_max=("acc", "max"),
        n_seeds=("acc", "size"),
        steps_to_threshold=("steps_to_threshold", "median"),
        n_reached=("steps_to_threshold", lambda s: int(s.notna().sum())),
        state_size=("state_size", "mean"),
    ).reset_index()
    return out


def best_lr(cell_table: pd.DataFrame) -> pd.DataFrame:
    """Per (task, series, length): the cell of the learning rate with the highest mean accuracy."""
    ordered = cell_table.sort_values(["acc_mean", "lr"], ascending=[False, True], kind="stable")
    best = ordered.groupby(["task", "series", "seq_len"], sort=False).head(1)
    return best.sort_values(["task", "series", "seq_len"]).reset_index(drop=True)


def _series_order(frame: pd.DataFrame) -> list[str]:
    pairs = frame[["series", "mixer", "variant"]].drop_duplicates()
    by_mixer = {m: sorted(pairs[pairs["mixer"] == m]["variant"]) for m in pairs["mixer"].unique()}
    return [_series_name(m, v) for m in mixer_order(set(by_mixer)) for v in by_mixer[m]]


def _style(frame: pd.DataFrame) -> dict[str, dict[str, object]]:
    """Series -> matplotlib kwargs: the mixer's colour, a line style per variant of that mixer."""
    styles: dict[str, dict[str, object]] = {}
    pairs = frame[["series", "mixer", "variant"]].drop_duplicates()
    for mixer in pairs["mixer"].unique():
        variants = sorted(pairs[pairs["mixer"] == mixer]["variant"])
        for index, variant in enumerate(variants):
            linestyle, marker = VARIANT_STYLES[index % len(VARIANT_STYLES)]
            styles[_series_name(mixer, variant)] = {
                "color": mixer_colour(mixer),
                "linestyle": linestyle,
                "marker": marker,
            }
    return styles


def _panels(n: int, width: float = 4.2, height: float = 3.4) -> tuple[plt.Figure, list[plt.Axes]]:
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False, constrained_layout=True)
    return fig, list(axes[0])


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


def plot_acc_vs_length(best: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Kimi Fig. 4 (top): per task, peak accuracy vs training length at the best lr, seed band."""
    tasks = _task_order(best["task"])
    styles = _style(best)
    fig, axes = _panels(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        frame = best[best["task"] == task]
        lengths = sorted(int(v) for v in frame["seq_len"].unique())
        for series in _series_order(frame):
            line = frame[frame["series"] == series].sort_values("seq_len")
            x = line["seq_len"].astype(int).to_numpy()
            mean = line["acc_mean"].to_numpy()
            std = line["acc_std"].to_numpy()
            ax.plot(x, mean, label=series, **styles[series])
            ax.fill_between(
                x,
                np.clip(mean - std, 0, 100),
                np.clip(mean + std, 0, 100),
                color=styles[series]["color"],
                alpha=0.18,
                linewidth=0,
            )
        _length_axis(ax, lengths)
        ax.set_ylim(-2, 102)
        ax.set_title(task)
        ax.set_xlabel("training sequence length (tokens)")
        ax.set_ylabel("peak eval accuracy (%)")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize="small", loc="best")
    columns = [
        "task",
        "series",
        "mixer",
        "variant",
        "seq_len",
        "lr",
        "acc_mean",
        "acc_std",
        "acc_min",
        "acc_max",
        "n_seeds",
    ]
    return save_figure(fig, best[columns], out_dir, "acc_vs_length")


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


def plot_acc_vs_steps(runs: pd.DataFrame, best: pd.DataFrame, length: int, out_dir: Path) -> list[Path]:
    """Kimi Fig. 4 (bottom): per task, eval accuracy vs steps at one length, best lr, seed band."""
    if "run_dir" not in runs or runs["run_dir"].isna().all():
        raise ValueError("accuracy-vs-steps needs local run directories (metrics.jsonl); this table has none")
    at_length = best[best["seq_len"] == length]
    if at_length.empty:
        raise ValueError(
            f"--length {length}: no scored runs at that length; lengths: "
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
    columns = [
        "task",
        "series",
        "mixer",
        "variant",
        "seq_len",
        "lr",
        "step",
        "acc_mean",
        "acc_std",
        "acc_min",
        "acc_max",
        "n_seeds",
    ]
    data = pd.concat(curves, ignore_index=True)[columns] if curves else pd.DataFrame(columns=columns)
    tasks = _task_order(at_length["task"])
    styles = _style(at_length)
    fig, axes = _panels(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        frame = data[data["task"] == task]
        for series in _series_order(at_length[at_length["task"] == task]):
            line = frame[frame["series"] == series].sort_values("step")
            if line.empty:
                continue
            style = dict(styles[series], marker=None)
            mean, std = line["acc_mean"].to_numpy(), line["acc_std"].to_numpy()
            lr = line["lr"].iloc[0]
            ax.plot(line["step"], mean, label=f"{series} (lr {lr:g})", **style)
            ax.fill_between(
                line["step"],
                np.clip(mean - std, 0, 100),
                np.clip(mean + std, 0, 100),
                color=style["color"],
                alpha=0.18,
                linewidth=0,
            )
        ax.set_ylim(-2, 102)
        ax.set_title(f"{task}, length {length}")
        ax.set_xlabel("training steps")
        ax.set_ylabel("eval accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="best")
    return save_figure(fig, data, out_dir, f"acc_vs_steps_len{length}")


def plot_lr_sensitivity(cell_table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Heat map of mean accuracy per (series, lr), one panel per (task, length)."""
    tasks = _task_order(cell_table["task"])
    lengths = sorted(int(v) for v in cell_table["seq_len"].unique())
    fig, axes = plt.subplots(
        len(tasks),
        len(lengths),
        squeeze=False,
        constrained_layout=True,
        figsize=(
            3.2 * len(lengths) + 1.0,
            0.45 * cell_table["series"].nunique() * len(tasks) + 1.4 * len(tasks),
        ),
    )
    image = None
    for row, task in enumerate(tasks):
        for col, length in enumerate(lengths):
            ax = axes[row][col]
            frame = cell_table[(cell_table["task"] == task) & (cell_table["seq_len"] == length)]
            series = _series_order(frame) if not frame.empty else []
            lrs = sorted(frame["lr"].unique())
            grid = np.full((len(series), len(lrs)), np.nan)
            for _, cell in frame.iterrows():
                grid[series.index(cell["series"]), lrs.index(cell["lr"])] = cell["acc_mean"]
            image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
            for i in range(len(series)):
                for j in range(len(lrs)):
                    if not np.isnan(grid[i, j]):
                        ax.text(
                            j,
                            i,
                            f"{grid[i, j]:.0f}",
                            ha="center",
                            va="center",
                            fontsize=7,
                            color="white" if grid[i, j] < 60 else "black",
                        )
            ax.set_xticks(range(len(lrs)))
            ax.set_xticklabels([f"{lr:g}" for lr in lrs], rotation=45, fontsize=7)
            ax.set_yticks(range(len(series)))
            ax.set_yticklabels(series, fontsize=7)
            for label in ax.get_yticklabels():
                label.set_color(mixer_colour(frame[frame["series"] == label.get_text()]["mixer"].iloc[0]))
            ax.set_title(f"{task}, length {length}", fontsize=9)
            ax.set_xlabel("learning rate", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=axes, label="mean peak eval accuracy (%)", shrink=0.8)
    columns = ["task", "seq_len", "series", "mixer", "variant", "lr", "acc_mean", "acc_std", "n_seeds"]
    data = cell_table[columns].sort_values(["task", "seq_len", "series", "lr"]).reset_index(drop=True)
    return save_figure(fig, data, out_dir, "lr_sensitivity")


def plot_acc_vs_state_size(best: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Zoology's view: accuracy at the best lr vs the numbers a mixer keeps per sequence (log x)."""
    data = best.dropna(subset=["state_size"])
    if data.empty:
        raise ValueError(
            "no state_size in the table (summary.json lacks it); cannot draw accuracy vs state size"
        )
    tasks = _task_order(data["task"])
    styles = _style(data)
    fig, axes = _panels(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        frame = data[data["task"] == task]
        for series in _series_order(frame):
            points = frame[frame["series"] == series].sort_values("seq_len")
            ax.plot(points["state_size"], points["acc_mean"], label=series, alpha=0.9, **styles[series])
            for _, point in points.iterrows():
                ax.annotate(
                    str(int(point["seq_len"])),
                    (point["state_size"], point["acc_mean"]),
                    textcoords="offset points",
                    xytext=(3, 3),
                    fontsize=6,
                    color=styles[series]["color"],
                )
        ax.set_xscale("log")
        ax.set_ylim(-2, 102)
        ax.set_title(f"{task} (labels: training length)")
        ax.set_xlabel("state size (numbers per sequence, log scale)")
        ax.set_ylabel("peak eval accuracy (%)")
        ax.grid(alpha=0.3, which="both")
    axes[-1].legend(fontsize="small", loc="best")
    columns = [
        "task",
        "series",
        "mixer",
        "variant",
        "seq_len",
        "lr",
        "state_size",
        "acc_mean",
        "acc_std",
        "n_seeds",
    ]
    return save_figure(fig, data[columns].reset_index(drop=True), out_dir, "acc_vs_state_size")


def _steps_text(steps: float, reached: int, n: int) -> str:
    if reached == 0 or np.isnan(steps):
        return "not reached"
    return f"{steps:.0f}" + ("" if reached == n else f" ({reached}/{n} seeds)")


def write_summary(table: pd.DataFrame, best: pd.DataFrame, out_dir: Path,
                  left_out: list[tuple[str, str, str]] | None = None) -> list[Path]:
    """summary.md (one table per task: mixer rows x length columns) and summary.csv (the same numbers);
    `left_out`: (run, status, reason) of runs whose files a figure could not use."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["# Sweep summary", ""]
    counts = table["status"].value_counts()
    lines.append(
        f"{len(table)} runs: "
        + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("completed", "diverged", "failed", "incomplete"))
        + "."
    )
    lines += [
        "",
        "Cell: peak eval accuracy (%) at the best learning rate, mean ± std over seeds, "
        "then the median steps to the accuracy threshold.",
        "",
    ]
    for task in _task_order(best["task"]):
        frame = best[best["task"] == task]
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
                if cell.empty:
                    row.append("–")
                    continue
                c = cell.iloc[0]
                row.append(
                    f"{c['acc_mean']:.1f} ± {c['acc_std']:.1f} (lr {c['lr']:g}, "
                    f"{_steps_text(c['steps_to_threshold'], int(c['n_reached']), int(c['n_seeds']))})"
                )
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    bad = table[~table["status"].isin(SCORED)]
    if len(bad):
        lines += ["## Runs left out", "", "| run | status | reason |", "|---|---|---|"]
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
    best[
        [
            "task",
            "series",
            "mixer",
            "variant",
            "seq_len",
            "lr",
            "acc_mean",
            "acc_std",
            "n_seeds",
            "steps_to_threshold",
            "n_reached",
        ]
    ].to_csv(csv, index=False)
    return [md, csv]


def plot_all(table: pd.DataFrame, out_dir: Path, length: int | None = None) -> list[Path]:
    """Every figure and the summary; returns the files written."""
    runs = scored_runs(table)
    if runs.empty:
        raise ValueError(
            "no completed or diverged runs in the table; nothing to plot "
            f"(statuses: {table['status'].value_counts().to_dict()})"
        )
    cell_table = cells(runs)
    best = best_lr(cell_table)
    written = plot_acc_vs_length(best, out_dir)
    has_dirs = "run_dir" in runs and runs["run_dir"].notna().any()
    if has_dirs:
        written += plot_acc_vs_steps(runs, best, length or int(best["seq_len"].max()), out_dir)
    else:
        print("skipping accuracy vs steps: the table has no local run directories", file=sys.stderr)
    written += plot_lr_sensitivity(cell_table, out_dir)
    if best["state_size"].notna().any():
        written += plot_acc_vs_state_size(best, out_dir)
    else:
        print("skipping accuracy vs state size: no state_size in the summaries", file=sys.stderr)
    left_out = curves_left_out(runs) if has_dirs else []
    for name, _, reason in left_out:
        print(f"left out of accuracy vs steps: {name}: {reason}", file=sys.stderr)
    written += write_summary(table, best, out_dir, left_out)
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
    args = parser.parse_args(argv)
    written = plot_all(load(args.inputs), args.out, args.length)
    print(f"wrote {len(written)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
