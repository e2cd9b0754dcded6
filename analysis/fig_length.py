"""Accuracy against training length: Kimi Linear Fig. 4 (top), and what was learnt at L evaluated at 2L."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from analysis import draw
from analysis.cells import METRICS, NOT_RUN, UNSCORED, series_order, task_order, with_unscored_rows

# accuracy (%) under which a point's budget label goes above it: 13 points below would leave the axes
LABEL_ABOVE_UNDER = 15.0


def plot_acc_vs_length(best: pd.DataFrame, unscored: pd.DataFrame, out_dir: Path,
                       label: str = METRICS["eval"][1], note: str | None = None,
                       pending: pd.DataFrame | None = None,
                       longer: dict[tuple[str, str, int], str] | None = None) -> list[Path]:
    """Kimi Fig. 4 (top): per task, peak accuracy vs training length at the best lr, seed band. `note`:
    lines above the panels (the budget, the grid's fill). `pending`: the grid's cells not yet run
    (analysis.grid.not_run), each an open marker in the strip below 0 %, their lengths and series
    on the axes. `longer` (analysis.cells.longer_budgets): the points trained longer than the rest, each
    labelled with its budget, so that a point ahead on a longer budget does not read as ahead on equal
    terms."""
    longer = longer or {}
    pending = pending if pending is not None else unscored.iloc[:0].assign(status=NOT_RUN)
    marked = pd.concat([unscored, pending], ignore_index=True)
    frame_all = pd.concat([best, marked], ignore_index=True)
    tasks = task_order(frame_all["task"])
    styles = draw.style(frame_all)
    rows = [s for s in (*UNSCORED, NOT_RUN) if (marked["status"] == s).any()]
    legend = draw.legend_inches(series_order(frame_all))
    fig, axes = draw.panels(len(tasks), legend=legend)
    for ax, task in zip(axes, tasks, strict=True):
        frame, failed = best[best["task"] == task], marked[marked["task"] == task]
        lengths = sorted({int(v) for v in frame_all[frame_all["task"] == task]["seq_len"]})
        series_names = series_order(frame_all[frame_all["task"] == task])
        labelled: dict[tuple[int, bool], int] = {}
        for index, series in enumerate(series_names):
            # Reindexed on every length of the panel: a length without a completed run breaks the line.
            line = frame[frame["series"] == series].set_index("seq_len").reindex(lengths)
            if line["acc_mean"].notna().any():
                # dodged: series that reach the same accuracy at a length stay visible side by side
                x = draw.dodge(np.array(lengths, dtype=float), index, len(series_names), log=True)
                mean, std = line["acc_mean"].to_numpy(float), line["acc_std"].to_numpy(float)
                n = line["n_seeds"].fillna(0).to_numpy(int)
                ax.plot(x, mean, label=series, **styles[series])
                draw.band(ax, x, mean, std, n, styles[series]["color"])
                _label_longer(ax, task, series, x, mean, lengths, longer, labelled, styles[series]["color"])
        ys = draw.accuracy_axis(ax, rows, label)
        draw.mark_unscored(ax, failed, "seq_len", ys, series_names, styles, log=True)
        draw.length_axis(ax, lengths)
        ax.set_title(task)
        ax.set_xlabel("training sequence length (tokens)")
        ax.grid(alpha=0.3)
    draw.figure_legend(fig, axes, series_order(frame_all), styles, rows, best)
    draw.note_above(fig, note, legend)
    columns = ["task", "series", "mixer", "variant", "seq_len", "lr", "acc_mean", "acc_std", "acc_min",
               "acc_max", "n_seeds", "n_diverged", "n_failed"]
    data = with_unscored_rows(best, unscored, columns).assign(not_run=False)
    data["longer_budget"] = _longer_column(data, longer)
    if len(pending):
        todo = pending[["task", "series", "mixer", "variant", "seq_len"]].assign(n_seeds=0, n_diverged=0,
                                                                                   n_failed=0, not_run=True)
        data = pd.concat([data, todo], ignore_index=True).sort_values(["task", "series", "seq_len"],
                                                                      ignore_index=True)
    return draw.save_figure(fig, data, out_dir, "acc_vs_length")


def _longer_column(data: pd.DataFrame, longer: dict[tuple[str, str, int], str]) -> list[str | None]:
    """The CSV's `longer_budget`: each row's label where the figure labels its point (_label_longer)."""
    return [longer.get((t, s, int(n))) for t, s, n in zip(data["task"], data["series"], data["seq_len"],
                                                          strict=True)]


def _label_longer(ax: Any, task: str, series: str, x: np.ndarray, y: np.ndarray, lengths: list[int],
                  longer: dict[tuple[str, str, int], str], labelled: dict[tuple[int, bool], int],
                  colour: str) -> None:
    """Each of the series' points trained longer than the rest labelled with its budget below it, or above
    it near 0 % (below, it would fall under the axis onto the length labels); labels of several series at
    one length and side stack away from their points instead of overprinting."""
    for xi, yi, length in zip(x, y, lengths, strict=True):
        if (task, series, length) in longer and not np.isnan(yi):
            above = yi < LABEL_ABOVE_UNDER
            stacked = labelled.setdefault((length, above), 0)
            labelled[(length, above)] += 1
            offset = 7 + 10 * stacked if above else -13 - 10 * stacked
            ax.annotate(longer[(task, series, length)], (xi, yi), xytext=(0, offset),
                        textcoords="offset points", ha="center", fontsize="x-small", color=colour)


def plot_length_generalisation(runs: pd.DataFrame, best: pd.DataFrame, out_dir: Path,
                               note: str | None = None,
                               longer: dict[tuple[str, str, int], str] | None = None) -> list[Path]:
    """Per task, the final eval accuracy at the training length L (solid) and at 2L (dashed) vs L, each
    series at its best lr (mean over seeds): how far what was learnt at L carries to twice the length.
    Drawn from the summaries' final_eval/acc@<len>; lengths without an eval at 2L are left out. `longer`:
    the points trained longer than the rest, labelled as in plot_acc_vs_length."""
    longer = longer or {}
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
    data["longer_budget"] = _longer_column(data, longer)
    tasks = task_order(data["task"])
    styles = draw.style(data)
    series_all = series_order(data)
    legend = draw.legend_inches(series_all)
    fig, axes = draw.panels(len(tasks), legend=legend)
    for ax, task in zip(axes, tasks, strict=True):
        frame = data[data["task"] == task]
        lengths = sorted({int(v) for v in frame["seq_len"]})
        names = series_order(frame)
        labelled: dict[tuple[int, bool], int] = {}
        for index, series in enumerate(names):
            line = frame[frame["series"] == series].set_index("seq_len").reindex(lengths)
            colour, marker = styles[series]["color"], styles[series]["marker"]
            x = draw.dodge(np.array(lengths, dtype=float), index, len(names), log=True)
            _label_longer(ax, task, series, x, line["acc_at_L"].to_numpy(float), lengths, longer, labelled,
                          colour)
            # 2L as a larger hollow marker beneath L's filled one: a single length has no line to be dashed,
            # and where both accuracies are equal the ring still shows around the dot
            ax.plot(x, line["acc_at_2L"], color=colour, marker=marker, linestyle="--", alpha=0.8,
                    markerfacecolor="white", markersize=10, zorder=2)
            ax.plot(x, line["acc_at_L"], color=colour, marker=marker, markersize=5, label=series, zorder=3)
        ax.set_ylim(-2, 102)
        ax.set_yticks(draw.ACC_TICKS)
        ax.set_ylabel("final eval accuracy (%)")
        draw.length_axis(ax, lengths)
        ax.set_title(task)
        ax.set_xlabel("training sequence length L (tokens)")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=styles[s]["color"], marker=styles[s]["marker"], label=s)
               for s in series_all]
    handles += [Line2D([], [], color="0.35", marker="o", markersize=5, label="evaluated at L"),
                Line2D([], [], color="0.35", marker="o", markerfacecolor="white", markersize=10,
                       linestyle="--", label="evaluated at 2L")]
    fig.legend(handles=handles, loc="outside right upper", fontsize="small")
    draw.note_above(fig, note, legend)
    return draw.save_figure(fig, data, out_dir, "length_generalisation")
