"""Learning-rate sensitivity: heat maps of accuracy per (series, lr), one per (task, length)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis import draw
from analysis.cells import UNSCORED, series_order, task_order
from analysis.colours import figure_colours


def plot_lr_sensitivity(cell_table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Heat map of mean accuracy per (series, lr) over completed seeds, one panel per (task, length); a cell
    names its diverged and failed runs, and is grey when it has no completed one."""
    tasks = task_order(cell_table["task"])
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
    label_colours = figure_colours(set(cell_table["mixer"]))
    image = None
    for row, task in enumerate(tasks):
        for col, length in enumerate(lengths):
            ax = axes[row][col]
            frame = cell_table[(cell_table["task"] == task) & (cell_table["seq_len"] == length)]
            series = series_order(frame) if not frame.empty else []
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
                label.set_color(label_colours[frame[frame["series"] == label.get_text()]["mixer"].iloc[0]])
            ax.set_title(f"{task}, length {length}", fontsize=9)
            ax.set_xlabel("learning rate", fontsize=8)
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.8)
        bar.set_label("mean peak eval accuracy (%)\nof completed seeds; grey: none", fontsize=8)
    columns = ["task", "seq_len", "series", "mixer", "variant", "lr", "acc_mean", "acc_std", "n_seeds",
               "n_diverged", "n_failed"]
    data = cell_table[columns].sort_values(["task", "seq_len", "series", "lr"]).reset_index(drop=True)
    return draw.save_figure(fig, data, out_dir, "lr_sensitivity")
