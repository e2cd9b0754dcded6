"""Paper-style figures from a sweep, each as PNG + PDF with the data behind it as CSV.

    python -m analysis.plot runs/sweeps/kimi_fig4 --out runs/figures/kimi_fig4
    python -m analysis.plot table.csv --out figs --length 1024
    python -m analysis.plot results/kimi_fig4_h200 --grid kimi_fig4_h200 kimi_fig4_h200_noconv \
        --metric train --length 1024 --figures acc_vs_length acc_vs_steps length_generalisation \
        --out results/kimi_fig4_h200/figures

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

`--figures` writes only the ones named (acc_vs_length, length_generalisation, acc_vs_steps, lr_sensitivity,
acc_vs_state_size, summary). `--budget STEPS` draws only the runs trained with trainer.max_steps=STEPS, so
every seed of a grid at its own budget stands beside the others on equal steps.

`--grid EXPERIMENT...` names the experiments (conf/experiment/) whose sweeps the runs fill, for a grid that
fills over time: their cells (task x series x length, analysis.grid) without a finished run are marked as
not yet run (an open marker in the strip below 0 % of the accuracy-vs-length figure; a legend entry, and
a panel for a task with none run, in the accuracy-vs-steps figure), never drawn as an accuracy, and the
titles say how many of the grid's cells have run. The accuracy-vs-length, length-generalisation and
accuracy-vs-steps figures state above their panels what a run was allowed (steps, batch, learning rates,
eval interval, early stop: from the runs' configs).

One module a figure: fig_length (the first two), fig_steps, fig_lr, fig_state, and summary; the numbers
they draw come from analysis.cells, their shared drawing helpers from analysis.draw.

Conventions: accuracy of a run = its `best_eval_acc` (peak over training; `--metric train`: its
`best_train_acc`, the peak training accuracy that Kimi Linear's Fig. 4 plots), and only completed runs have
one. A cell over seeds is the mean, its spread the standard deviation across seeds (population), drawn
as a band (or an error bar) only where at least two seeds were measured; legends and the summary give n.
A point stands at one budget (analysis.cells.point_runs): a run at a longer trainer.max_steps supersedes its
cell, lr and seed's shorter one, and a seed left below 0.99 at a shorter budget than its point's is left out,
the figure's note and the point's label saying how many.
The best learning rate (analysis.lr_rule) is the one with the highest mean over the seeds every lr ran;
where two means lie within lr_rule.TIE, the one that reaches the threshold in fewer steps. Diverged and failed
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

import pandas as pd

from analysis.cells import (
    METRICS,
    SOLVED_AT,
    at_budget,
    best_lr,
    budget_note,
    cells,
    distinct,
    longer_budgets,
    max_steps_run,
    point_runs,
    scored_runs,
    unscored_runs,
)
from analysis.collect import collect_dirs, read_table
from analysis.fig_length import plot_acc_vs_length, plot_length_generalisation
from analysis.fig_lr import plot_lr_sensitivity
from analysis.fig_state import plot_acc_vs_state_size
from analysis.fig_steps import curves_left_out, plot_acc_vs_steps
from analysis.grid import fill_note, grid_cells, not_run
from analysis.summary import write_summary

FIGURES = ("acc_vs_length", "length_generalisation", "acc_vs_steps", "lr_sensitivity", "acc_vs_state_size",
           "summary")


def load(paths: list[Path]) -> pd.DataFrame:
    """A table file (.csv/.parquet) or sweep directories, collected on the fly."""
    if len(paths) == 1 and paths[0].is_file():
        return read_table(paths[0])
    for path in paths:
        if not path.is_dir():
            raise ValueError(f"{path} is neither a table (.csv/.parquet) nor a sweep directory")
    return collect_dirs(paths)


def _lines(*parts: str | None) -> str | None:
    return "\n".join(p for p in parts if p) or None


def plot_all(table: pd.DataFrame, out_dir: Path, length: int | None = None,
             metric: str = "eval", grid: pd.DataFrame | None = None,
             figures: tuple[str, ...] = FIGURES) -> list[Path]:
    """The figures named in `figures` (all by default) and the summary; returns the files written.
    `metric`: a key of METRICS. `grid`: the cells the runs are meant to fill (analysis.grid.grid_cells)."""
    table, waiting = point_runs(table, METRICS[metric][0])
    runs = scored_runs(table, metric)
    if runs.empty:
        raise ValueError(
            "no completed runs in the table; nothing to plot "
            f"(statuses: {table['status'].value_counts().to_dict()})"
        )
    unscored = unscored_runs(table)
    cell_table = cells(runs, unscored)
    best = best_lr(cell_table, runs)
    pending = not_run(grid, table) if grid is not None else None
    budget = budget_note(table)
    filled = fill_note(grid, pending) if grid is not None else None
    note = _lines(budget, filled and f"{filled}; an open marker in the grey strip: a cell not yet run")
    written = []
    longer = longer_budgets(runs, best, waiting)
    longer_note = longer and "a point labelled with steps: trained longer than the rest"
    if len(waiting):
        longer_note = _lines(longer_note or None, f"{len(waiting)} seed run(s) below {SOLVED_AT:g} at a "
                             "shorter budget than their point's left out of it until trained as long")
    if "acc_vs_length" in figures:
        length_note = _lines(note, longer_note)
        written += plot_acc_vs_length(best, unscored, out_dir, METRICS[metric][1], length_note, pending,
                                      longer)
    if "length_generalisation" in figures:
        written += plot_length_generalisation(runs, best, out_dir, _lines(budget, filled, longer_note),
                                              longer)
    has_dirs = "run_dir" in runs and runs["run_dir"].notna().any()
    if "acc_vs_steps" in figures and has_dirs:
        at = length or int(best["seq_len"].max())
        ran = distinct(table[table["seq_len"] == at], "trainer.max_steps")
        ends = ("a line that ends before the budget stopped early, its task solved" if len(ran) < 2 else
                f"a line ends at its run's budget ({' or '.join(f'{int(v):,}' for v in ran)} steps) or "
                "before it, stopped early, its task solved")
        if (best[best["seq_len"] == at]["n_seeds"] > 1).any():
            ends += "; a seed stopped so counts at its last eval while its cell's other seeds train on"
        steps_note = _lines(budget, fill_note(grid, pending, at) if grid is not None else None, ends)
        axis_end = max_steps_run(table[table["seq_len"] == at])
        written += plot_acc_vs_steps(runs, best, unscored, at, out_dir, pending, steps_note, axis_end)
    elif "acc_vs_steps" in figures:
        print("skipping accuracy vs steps: the table has no local run directories", file=sys.stderr)
    if "lr_sensitivity" in figures:
        written += plot_lr_sensitivity(cell_table, out_dir)
    if "acc_vs_state_size" in figures and best["state_size"].notna().any():
        written += plot_acc_vs_state_size(best, unscored, out_dir)
    elif "acc_vs_state_size" in figures:
        print("skipping accuracy vs state size: no state_size in the summaries", file=sys.stderr)
    left_out = curves_left_out(runs) if has_dirs and "acc_vs_steps" in figures else []
    for name, _, reason in left_out:
        print(f"left out of accuracy vs steps: {name}: {reason}", file=sys.stderr)
    if "summary" in figures:
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
    parser.add_argument("--grid", nargs="+", metavar="EXPERIMENT",
                        help="experiments (conf/experiment/) whose sweeps the runs fill: their cells "
                             "without a finished run are marked as not yet run")
    parser.add_argument("--figures", nargs="+", choices=FIGURES, default=list(FIGURES),
                        help="write only these (default: all)")
    parser.add_argument("--budget", type=int, metavar="STEPS",
                        help="only the runs trained with trainer.max_steps=STEPS: every seed at one budget "
                             "(default: all runs, each point at its cell's longest)")
    args = parser.parse_args(argv)
    try:
        grid = grid_cells(args.grid) if args.grid else None
        table = load(args.inputs)
        table = at_budget(table, args.budget) if args.budget is not None else table
        written = plot_all(table, args.out, args.length, args.metric, grid, tuple(args.figures))
    except ValueError as error:
        # A wrong path or an unusable table: the message says what to do, a traceback would only bury it.
        parser.error(str(error))
    print(f"wrote {len(written)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
