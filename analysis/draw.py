"""The drawing helpers the figures share: each series' style, panels, the length and accuracy axes, the seed
band, the strip of runs not scored, legends, and a figure saved with the numbers it draws."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from analysis.cells import NOT_RUN, series_name  # noqa: E402
from analysis.colours import VARIANT_STYLES, figure_colours  # noqa: E402

STATUS_MARKERS = {"diverged": "x", "failed": "+"}


# A cell not yet run: the series' own marker, open, in the strip (mamba2 and its variants stay apart).
NOT_RUN_STYLE = {"markerfacecolor": "none", "markersize": 6, "markeredgewidth": 1.4}


ACC_TICKS = [0, 20, 40, 60, 80, 100]


def style(frame: pd.DataFrame) -> dict[str, dict[str, object]]:
    """Series -> matplotlib kwargs: the mixer's colour, a line style per variant of that mixer."""
    styles: dict[str, dict[str, object]] = {}
    pairs = frame[["series", "mixer", "variant"]].drop_duplicates()
    colours = figure_colours(set(pairs["mixer"]))
    for mixer in pairs["mixer"].unique():
        variants = sorted(pairs[pairs["mixer"] == mixer]["variant"])
        for index, variant in enumerate(variants):
            linestyle, marker = VARIANT_STYLES[index % len(VARIANT_STYLES)]
            styles[series_name(mixer, variant)] = {
                "color": colours[mixer],
                "linestyle": linestyle,
                "marker": marker,
            }
    return styles


def panels(n: int, width: float = 4.2, height: float = 3.4, legend: float = 0.0
            ) -> tuple[plt.Figure, list[plt.Axes]]:
    """n panels side by side, plus `legend` inches on the right for a figure legend."""
    fig, axes = plt.subplots(1, n, figsize=(width * n + legend, height), squeeze=False, layout="constrained")
    return fig, list(axes[0])


def legend_inches(series: list[str]) -> float:
    """The width a figure legend of these series takes: its longest label (a series with the longest
    suffix, " (no completed run)") at the small font, about 0.065 inches a character, plus the handle."""
    longest = max([len(name) for name in series] + [0]) + len(" (no completed run)")
    return 0.065 * max(longest, len("diverged (not scored)")) + 0.7


def note_above(fig: plt.Figure, note: str | None, legend: float = 0.0) -> None:
    """`note` above the panels: centred on them, not on the figure legend `legend` inches wide at their
    right, and wrapped to their width at the small font (about 0.07 inches a character)."""
    if not note:
        return
    width = fig.get_figwidth() - legend
    lines = [part for line in note.splitlines() for part in textwrap.wrap(line, max(24, int(width / 0.07)))]
    fig.suptitle("\n".join(lines), fontsize="small", x=0.5 * width / fig.get_figwidth())


def save_figure(fig: plt.Figure, data: pd.DataFrame, out_dir: Path, name: str) -> list[Path]:
    """name.png, name.pdf and name.csv (the exact numbers drawn) in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf", out_dir / f"{name}.csv"]
    fig.savefig(paths[0], dpi=150)
    # no creation date: the same runs give the same committed file
    fig.savefig(paths[1], metadata={"CreationDate": None})
    plt.close(fig)
    data.to_csv(paths[2], index=False)
    return paths


def length_axis(ax: plt.Axes, lengths: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(length) for length in lengths])
    ax.minorticks_off()
    # room beside the first and last length for the markers dodged around them
    ax.set_xlim(lengths[0] / 1.25, lengths[-1] * 1.25)


def accuracy_axis(ax: plt.Axes, rows: list[str], label: str) -> dict[str, float]:
    """0-100 % on y, and below it, when some runs were not scored or some cells not run, a grey strip with
    a row per status (diverged, failed, not yet run) for their markers; returns each row's y."""
    ys = {status: -13.0 - 10.0 * index for index, status in enumerate(rows)}
    bottom = min(ys.values()) - 7.0 if rows else -2.0
    ax.set_ylim(bottom, 102)
    ax.set_yticks(ACC_TICKS + list(ys.values()))
    ax.set_yticklabels([str(t) for t in ACC_TICKS] + list(ys))
    if rows:
        ax.axhspan(bottom, -5.0, color="0.93", linewidth=0, zorder=0)
    ax.set_ylabel(label)
    return ys


def dodge(values: pd.Series | np.ndarray, index: int, count: int, log: bool, spread: float = 1.0
          ) -> np.ndarray:
    """x values moved a little per series (index of count), so that markers sharing an x stay apart:
    by a factor of 2^(0.05 (index - centre)) on a log axis, by 0.6 % of the largest value on a linear one
    (times `spread`). The figures' CSVs keep the true values."""
    values = np.asarray(values, dtype=float)
    shift = (index - (count - 1) / 2) * spread
    if log:
        return values * 2.0 ** (0.05 * shift)
    return values + 0.006 * shift * (np.nanmax(np.abs(values)) if len(values) else 0.0)


def mark_unscored(ax: plt.Axes, points: pd.DataFrame, x: str, ys: dict[str, float], series: list[str],
                   styles: dict[str, dict[str, object]], log: bool) -> None:
    """One marker per (series, x, status) in the strip: where runs diverged or failed, or a cell is not
    yet run (open markers, twice as far apart: a row of them at every length)."""
    for status, y in ys.items():
        at = points[points["status"] == status]
        for index, name in enumerate(series):
            xs = np.array(sorted(set(at[at["series"] == name][x].dropna())), dtype=float)
            if not len(xs):
                continue
            if status == NOT_RUN:
                ax.plot(dodge(xs, index, len(series), log, spread=2.0), [y] * len(xs), linestyle="none",
                        marker=styles[name]["marker"], color=styles[name]["color"], clip_on=False,
                        **NOT_RUN_STYLE)
            else:
                ax.plot(dodge(xs, index, len(series), log), [y] * len(xs), linestyle="none",
                        marker=STATUS_MARKERS[status], markersize=7, markeredgewidth=1.6,
                        color=styles[name]["color"], clip_on=False)


def status_handles(rows: list[str]) -> list[Line2D]:
    return [Line2D([], [], linestyle="none", marker="o", color="0.35", label=f"{NOT_RUN} (open marker)",
                   **NOT_RUN_STYLE) if s == NOT_RUN else
            Line2D([], [], linestyle="none", marker=STATUS_MARKERS[s], markersize=7, markeredgewidth=1.6,
                   color="0.35", label=f"{s} (not scored)") for s in rows]


def not_run_handles(series: list[str], styles: dict[str, dict[str, object]]) -> list[Line2D]:
    """Legend entries for series with a cell not yet run where the figure has no x to mark it at."""
    return [Line2D([], [], linestyle="none", marker=styles[name]["marker"], color=styles[name]["color"],
                   label=f"{name} ({NOT_RUN})", **NOT_RUN_STYLE) for name in series]


def seeds_label(series: str, n: pd.Series) -> str:
    low, high = int(n.min()), int(n.max())
    count = f"n={low}" if low == high else f"n={low}-{high}"
    return f"{series} ({count})"


def band(ax: plt.Axes, x: np.ndarray, mean: np.ndarray, std: np.ndarray, n: np.ndarray,
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


def figure_legend(fig: plt.Figure, axes: list[plt.Axes], series: list[str],
                   styles: dict[str, dict[str, object]], rows: list[str], n_seeds: pd.DataFrame) -> None:
    """One legend for the whole figure, outside the panels (it can hide no data and no label): a line per
    series with its number of seeds, a proxy for each series with no completed run, the status markers."""
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    labels = [seeds_label(name, n_seeds[n_seeds["series"] == name]["n_seeds"]) for name in handles]
    extra = missing_series_handles(series, list(handles), styles) + status_handles(rows)
    if handles or extra:
        fig.legend(handles=list(handles.values()) + extra, labels=labels + [h.get_label() for h in extra],
                   loc="outside right upper", fontsize="small")


def panel_legend(ax: plt.Axes, series: list[str], styles: dict[str, dict[str, object]], rows: list[str],
                 not_run: list[Line2D] | None = None) -> None:
    """The panel's legend, below it (it hides no data): its lines, an entry per series not yet run there
    (`not_run`), a proxy for each other series with no completed run, the status markers."""
    handles, labels = ax.get_legend_handles_labels()
    handles += not_run or []
    labels += [h.get_label() for h in not_run or []]
    handles += missing_series_handles(series, labels, styles) + status_handles(rows)
    if handles:
        ax.legend(handles=handles, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16),
                  frameon=False)


def missing_series_handles(series: list[str], labels: list[str], styles: dict[str, dict[str, object]]
                            ) -> list[Line2D]:
    """Legend entries, in the series' own style, for series drawn only as markers in the strip (every run
    diverged or failed, or none has run)."""
    drawn = {label.split(" (n=")[0].split(f" ({NOT_RUN})")[0] for label in labels}
    return [Line2D([], [], **styles[name], label=f"{name} (no completed run)")
            for name in series if name not in drawn]
