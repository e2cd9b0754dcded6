"""Accuracy against the state a mixer keeps per sequence (zoology's view), each point labelled with its
training length where no other label or marker is."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.text import Text
from matplotlib.ticker import LogFormatterSciNotation, LogLocator, NullFormatter
from matplotlib.transforms import Bbox, Transform

from analysis import draw
from analysis.cells import UNSCORED, series_order, task_order


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
    tasks = task_order(pd.concat([data["task"], marks["task"]]))
    styles = draw.style(pd.concat([data, marks], ignore_index=True))
    every = series_order(pd.concat([data, marks], ignore_index=True))
    rows = [s for s in UNSCORED if (marks["status"] == s).any()]
    fig, axes = draw.panels(len(tasks), width=4.6, legend=draw.legend_inches(every))
    pending = []
    for ax, task in zip(axes, tasks, strict=True):
        frame, failed = data[data["task"] == task], marks[marks["task"] == task]
        series_names = series_order(pd.concat([frame, failed]))
        sizes = frame.groupby("state_size")["series"].nunique()
        # Mixers with the same state size (e.g. every recurrent one at any length) would hide each other.
        shared = bool((sizes > 1).any())
        labels = []
        for index, series in enumerate(series_names):
            points = frame[frame["series"] == series].sort_values("seq_len")
            if points.empty:
                continue
            x = draw.dodge(points["state_size"], index, len(series_names), log=True) if shared else points[
                "state_size"].to_numpy(float)
            ax.plot(x, points["acc_mean"], label=series, alpha=0.9, markersize=4, **styles[series])
            labels += [(xi, acc, str(int(length)), styles[series]["color"], ax.transData)
                       for xi, acc, length in zip(x, points["acc_mean"], points["seq_len"], strict=True)]
        ax.set_xscale("log")
        ax.margins(x=0.08)
        ys = draw.accuracy_axis(ax, rows, "peak eval accuracy (%)")
        draw.mark_unscored(ax, failed, "state_size", ys, series_names, styles, log=True)
        xs = pd.concat([frame["state_size"], failed["state_size"]])
        if xs.nunique() == 1:
            ax.set_xlim(xs.iloc[0] / 4, xs.iloc[0] * 4)
        _log_ticks(ax, float(xs.min()), float(xs.max()))
        ax.set_title(f"{task} (labels: training length)")
        ax.set_xlabel("state size (numbers per sequence, log scale)")
        ax.grid(alpha=0.3, which="both")
        pending.append((ax, labels))
    draw.figure_legend(fig, axes, every, styles, rows, data)
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
    return draw.save_figure(fig, data[columns].reset_index(drop=True), out_dir, "acc_vs_state_size")
