"""The numbers behind every figure and the summary: the runs scored or not, the cells over seeds, the best
learning rate (the conventions: analysis.plot's docstring)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.colours import mixer_order
from analysis.lr_rule import cell_lr, median_steps

SCORED = ("completed",)


# Shown in every figure as such (a marker in a strip below 0 %, a legend entry), never as an accuracy.
UNSCORED = ("diverged", "failed")


# A cell of the expected grid (analysis.grid) with no finished run: marked in the same strip, never drawn as
# an accuracy.
NOT_RUN = "not yet run"


# Kimi Linear Fig. 4's panel order; other tasks follow alphabetically.
TASK_ORDER = ("palindrome", "mqar", "stack")


CELL = ["task", "series", "mixer", "variant", "seq_len", "lr"]


# a run's accuracy: the held-out peak (default), or the paper's (Kimi Linear Fig. 4: peak training accuracy
# of the logged steps)
METRICS = {"eval": ("best_eval_acc", "peak eval accuracy (%)"),
           "train": ("best_train_acc", "peak training accuracy (%)")}


def task_order(tasks: pd.Series) -> list[str]:
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


def status_counts(unscored: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
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
        # the median run's, a run that never reached the threshold counted as the slowest: what picks the lr
        steps_median=("steps_to_threshold", median_steps),
        state_size=("state_size", "mean"),
    ).reset_index()
    unscored = unscored if unscored is not None else runs.iloc[:0]
    counts = status_counts(unscored, CELL)
    out = out.merge(counts, on=CELL, how="outer") if len(counts) else out.assign(n_diverged=0, n_failed=0)
    for column in ("n_seeds", "n_reached", "n_diverged", "n_failed"):
        out[column] = out[column].fillna(0).astype(int)
    return out.sort_values(CELL).reset_index(drop=True)


def seed_number(value: Any) -> int | None:
    """A run's seed as an int; None where the table has none for it."""
    number = pd.to_numeric(value, errors="coerce")
    return None if pd.isna(number) else int(number)


def best_lr(cell_table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per (task, series, length): the cell of the learning rate that stands for it (analysis.lr_rule, from
    `runs`, the scored runs `cell_table` was made of: the highest mean accuracy over the seeds every lr
    ran, the fewest steps to the threshold among means within lr_rule.TIE of it), with n_diverged /
    n_failed summed over every learning rate at that length."""
    keys = ["task", "series", "seq_len"]
    scored = cell_table[cell_table["n_seeds"] > 0]
    seeds = runs["seed"] if "seed" in runs else pd.Series(None, index=runs.index, dtype=object)
    picks = {}
    for key, group in runs.assign(seed_=seeds).groupby(keys, sort=False):
        picked = cell_lr((row.lr, row.acc / 100.0, row.steps_to_threshold, seed_number(row.seed_))
                         for row in group.itertuples())
        if picked is not None:
            picks[key] = picked[0]
    chosen = [index for index, row in scored.iterrows()
              if picks.get((row["task"], row["series"], row["seq_len"])) == row["lr"]]
    best = scored.loc[chosen].drop(columns=["n_diverged", "n_failed"])
    totals = cell_table.groupby(keys, as_index=False)[["n_diverged", "n_failed"]].sum()
    best = best.merge(totals, on=keys, how="left")
    return best.sort_values(keys).reset_index(drop=True)


def series_order(frame: pd.DataFrame) -> list[str]:
    pairs = frame[["series", "mixer", "variant"]].drop_duplicates()
    by_mixer = {m: sorted(pairs[pairs["mixer"] == m]["variant"]) for m in pairs["mixer"].unique()}
    return [series_name(m, v) for m in mixer_order(set(by_mixer)) for v in by_mixer[m]]


def with_unscored_rows(best: pd.DataFrame, unscored: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """best's rows, plus a row (no accuracy) per (task, series, length) whose runs all diverged or failed."""
    keys = ["task", "series", "mixer", "variant", "seq_len"]
    counts = status_counts(unscored, keys)
    if counts.empty:
        return best[columns].reset_index(drop=True)
    merged = counts.merge(best[keys], on=keys, how="left", indicator=True)
    only = merged[merged["_merge"] == "left_only"].drop(columns="_merge").assign(n_seeds=0)
    data = pd.concat([best, only], ignore_index=True).reindex(columns=columns)
    return data.sort_values(keys).reset_index(drop=True)


def max_trained_steps(table: pd.DataFrame) -> int | None:
    """The largest `trainer.max_steps` of the table's runs (None: no run recorded it)."""
    if "trainer.max_steps" not in table:
        return None
    steps = pd.to_numeric(table["trainer.max_steps"], errors="coerce")
    return int(steps.max()) if steps.notna().any() else None


def max_steps_run(table: pd.DataFrame) -> int | None:
    """The most steps a run of the table trained (its summary's `steps`), else its largest budget: the
    step axis's end, so that a longer budget a run stopped early within does not stretch the axis past
    every line."""
    steps = pd.to_numeric(table["steps"], errors="coerce") if "steps" in table else pd.Series(dtype=float)
    return int(steps.max()) if steps.notna().any() else max_trained_steps(table)


# What one run of a cell repeats: a run of these at a larger trainer.max_steps supersedes it.
SAME_RUN = ["task", "mixer", "variant", "seq_len", "lr", "seed"]


def longest_budget(table: pd.DataFrame) -> pd.DataFrame:
    """The table less each run that a completed run of the same cell, lr and seed at a larger
    trainer.max_steps supersedes: a cell trained again at a longer budget (the paper's, for the cells the
    shorter one left unsolved) counts at that budget, never as a second seed beside its shorter run."""
    if "trainer.max_steps" not in table or table.empty:
        return table
    keys = [k for k in SAME_RUN if k in table]
    frame = table.assign(_budget=pd.to_numeric(table["trainer.max_steps"], errors="coerce"),
                         _variant=table["variant"].fillna("") if "variant" in table else "")
    keys = [("_variant" if k == "variant" else k) for k in keys]
    done = frame[frame["status"].isin(SCORED)]
    longest = done.groupby(keys, dropna=False)["_budget"].max().rename("_longest").reset_index()
    merged = frame.reset_index().merge(longest, on=keys, how="left").set_index("index")
    superseded = merged["_budget"] < merged["_longest"]
    return table.loc[~superseded.reindex(table.index, fill_value=False)]


# A cell counts as solved from this accuracy on (experiment/kimi_fig4_h200 stops a run early there); a run
# at or above it at a shorter budget than its cell's longest has nothing left to learn, so it stays a sample
# of the cell's point beside the longer runs.
SOLVED_AT = 0.99


def point_runs(table: pd.DataFrame, column: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs a cell's point averages, the runs left out of it, each with `point_max_steps`, the budget
    of its point) after longest_budget: where some seeds of a cell's lr were trained longer than others
    (the paper's budget, given to the cells the shorter one left unsolved), a seed still below SOLVED_AT on
    `column` at the shorter budget is no sample of the longer one, so it leaves the mean until it too is
    trained that long; one point is one budget."""
    table = longest_budget(table)
    if "trainer.max_steps" not in table or table.empty:
        return table, table.iloc[:0].assign(point_max_steps=pd.Series(dtype=float))
    keys = [table[k].fillna("") if k == "variant" else table[k]
            for k in ("task", "mixer", "variant", "seq_len", "lr") if k in table]
    budget = pd.to_numeric(table["trainer.max_steps"], errors="coerce")
    done = table["status"].isin(SCORED)
    top = budget.where(done).groupby(keys, dropna=False).transform("max")
    acc = pd.to_numeric(table[column], errors="coerce") if column in table else pd.Series(np.nan,
                                                                                        index=table.index)
    shorter = done & (budget < top) & ~(acc >= SOLVED_AT)
    return table.loc[~shorter], table.loc[shorter].assign(point_max_steps=top[shorter])


def at_budget(table: pd.DataFrame, steps: int) -> pd.DataFrame:
    """The runs of `table` trained with trainer.max_steps == `steps`: every seed at one budget, for a figure
    that sets cells side by side on equal steps (a longer run does not supersede its shorter one there).
    ValueError, naming the budgets there are, where none ran it."""
    budget = pd.to_numeric(table.get("trainer.max_steps", pd.Series(np.nan, index=table.index)),
                           errors="coerce")
    ran = sorted(int(b) for b in budget.dropna().unique())
    if steps not in ran:
        raise ValueError(f"--budget {steps}: no run has trainer.max_steps={steps}; the runs' budgets: "
                         f"{', '.join(map(str, ran)) or 'none recorded'}")
    return table[budget == steps]


def longer_budgets(runs: pd.DataFrame, best: pd.DataFrame,
                   waiting: pd.DataFrame | None = None) -> dict[tuple[str, str, int], str]:
    """{(task, series, length): "20,000 steps"} for the cells whose runs at their best lr were given a
    larger trainer.max_steps than the smallest any cell had ("1 of 3 seeds at 20,000 steps" where only some
    were): a point trained longer than the rest of its figure, to be labelled so there. `waiting`
    (point_runs' left-out runs) adds how many seeds at a shorter budget the point leaves out."""
    if "trainer.max_steps" not in runs or runs.empty or best.empty:
        return {}
    frame = runs.assign(_budget=pd.to_numeric(runs["trainer.max_steps"], errors="coerce"))
    at_best = frame.merge(best[["task", "series", "seq_len", "lr"]], on=["task", "series", "seq_len", "lr"])
    at_best = at_best[at_best["_budget"].notna()]
    if at_best.empty:
        return {}
    base = at_best.groupby(["task", "series", "seq_len"])["_budget"].max().min()
    labels = {}
    for (task, series, length), group in at_best.groupby(["task", "series", "seq_len"]):
        top = group["_budget"].max()
        if top > base:
            n_top = int((group["_budget"] == top).sum())
            some = "" if n_top == len(group) else f"{n_top} of {len(group)} seeds at "
            labels[(task, series, int(length))] = f"{some}{int(top):,} steps"
    if waiting is not None and len(waiting):
        left = waiting.assign(series=[series_name(str(m), v) for m, v in zip(
            waiting["mixer"], waiting["variant"].fillna("") if "variant" in waiting else [""] * len(waiting),
            strict=True)])
        chosen = best[["task", "series", "seq_len", "lr"]]
        for (task, series, length), group in left.merge(chosen, on=list(chosen.columns)).groupby(
                ["task", "series", "seq_len"]):
            key = (task, series, int(length))
            if key in labels:
                shorter = int(pd.to_numeric(group["trainer.max_steps"], errors="coerce").max())
                labels[key] += f"; {len(group)} at {shorter:,} left out"
    return labels


def _min_budget(table: pd.DataFrame) -> float:
    return float(pd.to_numeric(table["trainer.max_steps"], errors="coerce").min())


def budgets(table: pd.DataFrame) -> str | None:
    """The step budgets of the table's runs in words: "at most 5,000 steps a run", or with cells trained
    longer "5,000 steps a run, 20,000 for 3 of 48 cells"; None where no run recorded one."""
    if "trainer.max_steps" not in table:
        return None
    frame = _with_series(table).assign(_budget=pd.to_numeric(table["trainer.max_steps"], errors="coerce"))
    frame = frame[frame["_budget"].notna()]
    if frame.empty:
        return None
    per_cell = frame.groupby(["task", "series", "seq_len"])["_budget"].max()
    values = sorted(per_cell.unique())
    if len(values) == 1:
        return f"at most {int(values[0]):,} steps a run"
    longer = ", ".join(f"{int(v):,} for {int((per_cell == v).sum())}" for v in values[1:])
    return f"{int(values[0]):,} steps a run, {longer} of {len(per_cell)} cells"


def distinct(table: pd.DataFrame, column: str) -> list:
    """The column's distinct values, sorted (none where the table lacks it)."""
    if column not in table:
        return []
    return sorted({v for v in table[column].dropna().tolist() if not isinstance(v, (list, dict))})


def lr_text(lr: float) -> str:
    """1e-3, 5e-4, 1.5e-3: a learning rate as the configs write it."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def budget_note(table: pd.DataFrame) -> str | None:
    """What one run of the table was allowed, from the runs' configs: the step budget (beside Kimi Linear's
    20,000), batch, learning rates, eval interval, early stop; None where no run recorded any of them."""
    parts = []
    steps = max_trained_steps(table)
    if steps is not None:
        parts.append(budgets(table) + (" (Kimi Linear: 20,000)" if _min_budget(table) < 20_000 else ""))
    batch = distinct(table, "trainer.batch_size")
    if batch:
        parts.append("batch " + "/".join(f"{int(b):,}" for b in batch))
    lrs = distinct(table, "lr")
    if lrs:
        parts.append(("lr " if len(lrs) == 1 else "best of lr ") + ", ".join(lr_text(lr) for lr in lrs))
    every = distinct(table, "trainer.eval_every")
    if every:
        parts.append("eval every " + "/".join(f"{int(e):,}" for e in every) + " steps at L")
    enabled = "trainer.early_stop.enabled"
    stops = table[table[enabled].eq(True)] if enabled in table else table.iloc[:0]
    if len(stops):
        acc, evals = distinct(stops, "trainer.early_stop.acc"), distinct(stops, "trainer.early_stop.evals")
        if len(acc) == 1 and len(evals) == 1:
            parts.append(f"stopped early once eval acc ≥ {acc[0]:g} for {int(evals[0])} evals in a row")
    return ", ".join(parts) if parts else None
