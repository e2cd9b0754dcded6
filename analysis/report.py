"""Kimi Linear §5.1's four claims about Fig. 4, judged on a sweep's runs, with what the sweep cost.

    python -m analysis.report results/kimi_fig4_h200 results/kimi_fig4_h200_load \\
        results/kimi_fig4_h200_repeats results/kimi_fig4_h200_gate --out results/kimi_fig4_h200/REPORT.md

Each claim is marked `reproduced`, `not reproduced` (with the cells that contradict it) or `not testable`
(the cells it needs are missing or unfinished, or the step budget cannot show it), from:

- the accuracy of a cell (task, mixer, length) = its mean over the runs (seeds) of its best learning rate,
  the lr of the highest mean over the seeds every lr ran, as the figures draw it, in either metric:
  `train` (the paper's: peak training accuracy of the logged steps, `best_train_acc`) or `eval` (held-out,
  `best_eval_acc`); both are tabulated, the claims are judged on `--metric` (default: the paper's);
- convergence = `steps_to_threshold` (first eval step at eval acc >= 0.9) at the cell's best lr: with several
  runs there (seeds, same-seed repeats), their median, a run that never got there counting as slowest;
  claim 2 says where a gap is not yet a ranking (single runs against a larger spread between the runs of
  any one cell, or runs that overlap).

Where the grid can differ from the paper: per cell where claim 1's order breaks, what could hold back the
mixer behind (a budget it ended still learning, fewer learning rates than the paper's, one seed); which KDA
the grid ran against Kimi Linear's (softplus gate, low-rank output gate) and, where runs of Kimi Linear's
exist (a variant, e.g. results/kimi_fig4_h200_gate), the claims' cells with both side by side; the cells
below 0.99 that ran their whole step budget, with their eval acc at 80% of the steps and at the end (still
learning or not); Mamba2 beside Mamba2 without its short convolution where both ran; where one seed of a
cell learnt it (0.9) and another did not, how the other one failed (never left the uniform guess's plateau,
learnt part and stalled, or still learning) beside when the seeds that learnt it took off; MQAR's load per
length (pairs, queries, pairs per key dimension of a layer, recall targets a step) and, where KDA solves
MQAR at 2048 against claim 4, which unpinned choice makes it easier and the cell that would test it; the
open parameters' values as the runs' configs set them.

What more seeds and the paper's longer budget changed, once such runs have finished: each claim judged on
the first runs (the first seed at the shortest budget) and on all, and the cells that moved.

Cost: the wall time each finished run took (`wall_time_s`) summed by the kind of device it trained on
(summary.json's `device`: GPU-hours and CPU-hours apart), GPU-minutes per cell, seconds per step by mixer,
length and device,
and from the GPU runs only the projected cost of the paper's whole grid (`experiment=kimi_fig4`: 432 runs
of 20,000 steps) on one GPU and on a cluster of 8, serial per GPU. A CPU sweep projects nothing: its
seconds per step say nothing about a GPU's.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.cells import (
    SOLVED_AT,
    budgets,
    longest_budget,
    max_trained_steps,
    point_runs,
    seed_number,
    series_name,
)
from analysis.collect import collect_dirs, read_table
from analysis.curves import read_curve
from analysis.fig_steps import eval_curve
from analysis.lr_rule import TIE, cell_lr, median_steps

MIXERS = ("kda", "gdn", "mamba2")  # the paper's order: the claims compare these
METRICS = {"train": "best_train_acc", "eval": "best_eval_acc"}
# the paper's grid (experiment=kimi_fig4): 3 tasks x 4 lengths x 4 lr x 3 mixers x 3 seeds
PAPER_RUNS_PER_CELL = 4 * 3
PAPER_STEPS = 20_000
PAPER_LENGTHS = (256, 512, 1024, 2048)
PAPER_LRS = (5e-5, 1e-4, 5e-4, 1e-3)  # experiment/kimi_fig4: a cell is its best of these
SLACK = 0.01  # "KDA >= GDN" holds within one accuracy point (seed noise of a single run)
DEVICE_KINDS = ("GPU", "CPU", "unknown")
# A run is still learning at its budget's end if its eval acc rose by more than this over its last 20% of
# steps: above the wobble of one eval on 1,000 held-out sequences.
STILL_LEARNING = 0.02
LATE_FRACTION = 0.8  # where "the last 20% of steps" begins
# A run has taken off once its training accuracy reaches this: until then MQAR's and Palindrome's loss sits
# at the uniform guess's, for a number of steps that varies by seed
TOOK_OFF = 0.1
# ... and has stalled from the step after which its training accuracy stays within this of its last value
STALLED = 0.02
# A seed has learnt its cell's task from this accuracy on (claim 2's threshold), and failed it below: a cell
# with seeds on both sides parts on whether its seeds learnt the task, not on how well
FAILED = 0.9
# Mamba2 without its short convolution (experiment/kimi_fig4_h200_noconv): the variant its override makes.
NOCONV_VARIANT = "use_short_conv=false"
# The open parameters the paper does not pin: (label, config column, the task whose runs have it or None)
OPEN_PARAMETERS = (
    ("MQAR key-value pairs", "task.params.num_pairs", "mqar"),
    ("MQAR vocabulary", "task.params.vocab_size", "mqar"),
    ("Palindrome vocabulary", "task.params.vocab_size", "palindrome"),
    ("Stack: stacks", "task.params.num_stacks", "stack"),
    ("Stack: elements", "task.params.num_elements", "stack"),
    ("batch size", "trainer.batch_size", None),
    ("max_steps", "trainer.max_steps", None),
)
MISSING = "–"  # a cell with no value (no 2L eval, a metric the run did not record)
# Kimi Linear's KDA, whose Fig. 4 this is: a softplus gate and a low-rank output gate
# (conf/experiment/ablation/kimi_linear.yaml); the harness's KDA is K3's (conf/mixer/kda.yaml)
PAPER_KDA = {"gate": "softplus", "output_gate_rank": "low"}
# the variant name (analysis.collect.variant_of) of KDA runs with exactly Kimi Linear's pair
PAPER_KDA_VARIANT = ",".join(f"{key}={value}" for key, value in sorted(PAPER_KDA.items()))
PAPER_KDA_SERIES = series_name("kda", PAPER_KDA_VARIANT)


def device_kind(device: Any, configured: Any = None) -> str:
    """GPU, CPU or unknown: where a run spent its wall time, from the device it resolved (summary.json's
    `device`, e.g. cuda:0) or, for a run that predates that field, an explicit `trainer.device`."""
    for spec in (device, configured):
        if isinstance(spec, str) and spec.startswith("cuda"):
            return "GPU"
        if spec == "cpu":
            return "CPU"
    return "unknown"


def _fmt(value: Any, spec: str) -> str:
    """`value` formatted, or a dash where it is missing (None or NaN), never a raw `nan`."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
        return MISSING
    return format(value, spec)


def _series(frame: pd.DataFrame) -> pd.Series:
    variant = frame.get("variant", pd.Series("", index=frame.index)).fillna("").astype(str)
    return pd.Series([series_name(str(m), v) for m, v in zip(frame["mixer"], variant, strict=True)],
                     index=frame.index)


def cell_table(runs: pd.DataFrame, metric: str = "train") -> pd.DataFrame:
    """Per (task, series, length): the cell's best lr by `metric` (analysis.lr_rule, as the figures pick
    it: the highest mean over the seeds every lr ran, the fewest steps to 0.9 among means within
    lr_rule.TIE of it), both
    metrics at that lr, steps to 0.9, acc at 2L."""
    done = runs[runs["status"] == "completed"].copy()
    if done.empty:
        return pd.DataFrame(
            columns=["task", "series", "seq_len", "train", "eval", "lr", "lrs", "steps_to_0.9", "steps_all",
                     "eval@2L", "runs", "run_dir", "steps_run", "max_steps", "early_stopped_at"]
        )
    done["series"] = _series(done)
    rows = []
    for (task, series, length), group in done.groupby(["task", "series", "seq_len"]):
        row = {"task": task, "series": series, "seq_len": int(length)}
        lrs = pd.to_numeric(group["lr"], errors="coerce")
        score = _score(group, metric)
        to_threshold = group.get("steps_to_threshold", pd.Series(math.nan, index=group.index))
        seeds = group.get("seed", pd.Series(None, index=group.index))
        runs_by_lr = zip(lrs, score, to_threshold, seeds, strict=True)
        picked = cell_lr((lr, acc, _steps(steps), seed_number(seed)) for lr, acc, steps, seed in runs_by_lr
                         if lr == lr)
        row["lr"] = float(picked[0]) if picked else float(lrs.iloc[0])
        row["lrs"] = tuple(sorted(set(lrs.dropna().astype(float))))
        # every run at that lr (seeds, repeats): the cell's steps to 0.9 is their median, its spread kept
        at_lr = group[lrs == row["lr"]]
        # with seeds: their mean, as the figures draw it, and their range beside it
        for name, column in METRICS.items():
            values = pd.to_numeric(at_lr[column], errors="coerce") if column in at_lr else None
            seen = values is not None and values.notna().any()
            row[name] = float(values.mean()) if seen else float("nan")
            row[f"{name}_range"] = (float(values.min()), float(values.max())) if seen else None
            # each seed's (a seed's repeats averaged): to set two cells side by side on the seeds both ran
            row[f"{name}_by_seed"] = (values.groupby(seeds[at_lr.index].map(seed_number)).mean().dropna()
                                      .to_dict() if seen else {})
        best = at_lr.loc[score[at_lr.index].fillna(-math.inf).idxmax()]
        row["runs"] = len(at_lr)
        reached = at_lr["steps_to_threshold"] if "steps_to_threshold" in at_lr else [None] * len(at_lr)
        row["steps_all"] = tuple(sorted(_steps(v) for v in reached))
        row["steps_to_0.9"] = median_steps(row["steps_all"])
        by_seed = pd.Series([_steps(v) for v in reached], index=at_lr.index).groupby(
            seeds[at_lr.index].map(seed_number))
        row["steps_by_seed"] = {seed: median_steps(v) for seed, v in by_seed}
        twice = f"final_eval/acc@{2 * int(length)}"
        row["eval@2L"] = float(best[twice]) if twice in best and pd.notna(best[twice]) else float("nan")
        # the best run itself, for the step-budget check: where its curve is and whether it ran to the end
        row["run_dir"] = best.get("run_dir")
        row["steps_run"] = pd.to_numeric(best.get("steps"), errors="coerce")
        row["max_steps"] = pd.to_numeric(best.get("trainer.max_steps"), errors="coerce")
        # the budgets of the runs averaged: a cell's seeds may not all have run the longer one
        budgets_at_lr = pd.to_numeric(at_lr.get("trainer.max_steps", pd.Series(dtype=float)), errors="coerce")
        row["budgets"] = tuple(sorted(int(b) for b in budgets_at_lr.dropna().unique()))
        row["early_stopped_at"] = pd.to_numeric(best.get("early_stopped_at"), errors="coerce")
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["task", "seq_len", "series"], ignore_index=True)


def _with_range(cell: pd.Series, name: str) -> str:
    """A cell's mean of `name`, with its runs' range where they differ: "0.980 (0.970–0.990)"."""
    spread = cell.get(f"{name}_range")
    text = _fmt(cell[name], ".3f")
    if isinstance(spread, tuple) and spread[0] != spread[1]:
        text += f" ({spread[0]:.3f}–{spread[1]:.3f})"
    return text


def _score(group: pd.DataFrame, metric: str) -> pd.Series:
    """The runs' `metric`, else the other one where no run has it (a summary from before it was logged)."""
    for column in (METRICS[metric], *METRICS.values()):
        if column in group and pd.to_numeric(group[column], errors="coerce").notna().any():
            return pd.to_numeric(group[column], errors="coerce")
    return pd.Series(math.nan, index=group.index)


def _steps(value: Any) -> float:
    """Steps to 0.9 of one run; inf where it never got there."""
    number = pd.to_numeric(value, errors="coerce")
    return math.inf if pd.isna(number) else float(number)


def _steps_text(value: float) -> str:
    return "never" if math.isinf(value) or pd.isna(value) else f"{value:.0f}"


def spreads(cells: pd.DataFrame) -> list[tuple[str, float, tuple[float, ...]]]:
    """(cell, slowest / fastest, the runs' steps) per cell with several runs at its lr, all reaching 0.9."""
    found = []
    for _, c in cells.iterrows():
        steps = c.get("steps_all") if "steps_all" in c else None
        if isinstance(steps, tuple) and len(steps) > 1 and not any(math.isinf(v) for v in steps):
            found.append((f"{c['series']} {c['task']}@{c['seq_len']}", max(steps) / min(steps), steps))
    return sorted(found, key=lambda f: -f[1])


def _pivot(cells: pd.DataFrame, metric: str) -> pd.DataFrame:
    return cells.pivot_table(index=["task", "seq_len"], columns="series", values=metric, aggfunc="max")


def judge(
    cells: pd.DataFrame,
    metric: str = "train",
    lengths: tuple[int, ...] = (256, 512, 1024, 2048),
    max_steps: int | None = None,
    learning: set[tuple[str, str, int]] | None = None,
) -> list[dict[str, str]]:
    """The four claims: [{claim, verdict, evidence}]. `learning`: the (task, series, length) cells still
    learning when their step budget ended (budget_table), named where they break claim 1's order."""
    table = _pivot(cells, metric) if not cells.empty else pd.DataFrame()
    tasks = ("palindrome", "mqar", "stack")

    def acc(task: str, length: int, series: str) -> float:
        try:
            return float(table.loc[(task, length), series])
        except KeyError:
            return float("nan")

    verdicts = []
    # 1. KDA >= GDN >= Mamba2 everywhere
    missing, against = [], []
    learning = learning or set()
    for task in tasks:
        for length in lengths:
            k, g, m = (acc(task, length, s) for s in MIXERS)
            if any(pd.isna(x) for x in (k, g, m)):
                missing.append(f"{task}@{length}")
            elif not (k >= g - SLACK and g >= m - SLACK):
                behind = [low for low, _ in _order_breaks({"kda": k, "gdn": g, "mamba2": m})
                          if (task, low, length) in learning]
                notes = [f"{' and '.join(behind)} still learning at its last step"] if behind else []
                if unequal := _unequal_budgets(cells, task, length):
                    notes.insert(0, unequal)
                note = f" ({'; '.join(notes)})" if notes else ""
                against.append(f"{task}@{length}: kda {k:.2f}, gdn {g:.2f}, mamba2 {m:.2f}{note}")
    verdicts.append(
        _verdict(
            "1. KDA >= GDN >= Mamba2 on every task at every length",
            against,
            missing,
            f"{3 * len(lengths) - len(missing)} of {3 * len(lengths)} cells measured",
        )
    )
    # 2. KDA converges much faster than GDN at 1024 on Palindrome and MQAR
    missing, against, evidence, caveats, against_tasks = [], [], [], [], []
    measured = spreads(cells) if "steps_all" in cells else []
    for task in ("palindrome", "mqar"):
        steps, ranges, budget = {}, {}, {}
        for series in ("kda", "gdn"):
            row = cells[(cells["task"] == task) & (cells["series"] == series) & (cells["seq_len"] == 1024)]
            steps[series] = None if row.empty else row["steps_to_0.9"].iloc[0]
            runs = row["steps_all"].iloc[0] if not row.empty and "steps_all" in row else ()
            ranges[series] = runs if isinstance(runs, tuple) else ()
            budget[series] = row["max_steps"].iloc[0] if not row.empty and "max_steps" in row else None
        if any(v is None for v in steps.values()):
            missing.append(f"{task}@1024")
            continue
        k, g = (None if pd.isna(v) else int(v) for v in (steps["kda"], steps["gdn"]))
        shown = {}
        for series, value in (("kda", k), ("gdn", g)):
            runs = ranges[series]
            text = "never" if value is None else str(value)
            if len(runs) > 1:
                text += f" (median of {len(runs)} runs: {', '.join(_steps_text(v) for v in runs)})"
            shown[series] = text
        evidence.append(f"{task}: kda {shown['kda']}, gdn {shown['gdn']}")
        if k is None and g is None:
            # the two cells' own budgets: another cell's longer run does not lengthen these
            own = [int(b) for b in budget.values() if pd.notna(b)]
            cap = max(own) if own else max_steps
            missing.append(f"{task}@1024 (neither reaches 0.9 in {cap or 'the'} steps)")
            continue
        if not _much_sooner(k, g):
            against.append(evidence[-1])
            against_tasks.append(task)
        caveat = _spread_caveat(task, k, g, ranges["kda"], ranges["gdn"], measured)
        if caveat:
            caveats.append(caveat)
        if all(pd.notna(b) for b in budget.values()) and budget["kda"] != budget["gdn"]:
            # a longer cosine schedule keeps the lr high for longer, which moves the steps to 0.9 too
            caveats.append(f"{task}: kda ran {int(budget['kda']):,} steps, gdn {int(budget['gdn']):,}, so "
                           "their schedules differ")
    verdicts.append(
        _verdict(
            "2. KDA reaches 90% much sooner than GDN at length 1024 (Palindrome, MQAR; "
            "'much': at least 1.5x fewer steps)",
            against,
            missing,
            "; ".join(evidence) or "no cell at 1024",
        )
    )
    if against and not missing:
        # two tasks only: the one that holds is part of the picture too
        verdicts[-1]["evidence"] = "; ".join(evidence) + f" (against the claim: {', '.join(against_tasks)})"
    if caveats:
        verdicts[-1]["evidence"] += ". " + "; ".join(caveats)
    # 3. Mamba2 fails beyond the shortest length
    missing, against = [], []
    for task in tasks:
        for length in lengths[1:]:
            m = acc(task, length, "mamba2")
            if pd.isna(m):
                missing.append(f"{task}@{length}")
            elif m >= 0.5:
                against.append(f"{task}@{length}: mamba2 {m:.2f}")
    verdicts.append(
        _verdict(
            "3. Mamba2 fails (< 50%) beyond the shortest length",
            against,
            missing,
            f"lengths {list(lengths[1:])}",
        )
    )
    # 4. At 2048: Palindrome and MQAR < 50% even for KDA, Stack solved (>= 90%)
    missing, against = [], []
    for task, solved in (("palindrome", False), ("mqar", False), ("stack", True)):
        k = acc(task, 2048, "kda")
        if pd.isna(k):
            missing.append(f"{task}@2048")
        elif solved != (k >= 0.9) or (not solved and k >= 0.5):
            against.append(f"{task}@2048: kda {k:.2f}")
    verdicts.append(
        _verdict(
            "4. At 2048 KDA stays below 50% on Palindrome and MQAR and solves Stack",
            against,
            missing,
            "kda at 2048",
        )
    )
    return verdicts


def _much_sooner(kda: int | None, gdn: int | None) -> bool:
    """Claim 2 at one task: KDA reaches 0.9 in at least 1.5x fewer steps than GDN (None: never, the
    slowest)."""
    return kda is not None and (gdn is None or kda * 1.5 <= gdn)


def _claim1_breaks(cells: pd.DataFrame, metric: str) -> list[tuple[str, int, dict[str, float],
                                                                  list[tuple[str, str]]]]:
    """(task, length, the three mixers' accuracies, _order_breaks) of each cell holding all three where
    claim 1's order breaks."""
    table = _pivot(cells, metric) if not cells.empty else pd.DataFrame()
    if table.empty or not set(MIXERS) <= set(table.columns):
        return []
    found = []
    for (task, length), row in table[list(MIXERS)].dropna().iterrows():
        acc = {m: float(row[m]) for m in MIXERS}
        if breaks := _order_breaks(acc):
            found.append((task, int(length), acc, breaks))
    return found


def _unequal_budgets(cells: pd.DataFrame, task: str, length: int) -> str:
    """Claim 1's three mixers' step budgets (`trainer.max_steps` of each one's best run) at one cell, as
    "mamba2 at 20,000 steps, kda and gdn at 5,000", where they differ; "" where they are alike or unknown:
    a mixer given more steps than the others is not ahead on equal terms."""
    budgets = _budgets(cells, task, length, MIXERS)
    if len(budgets) < 2 or len(set(budgets.values())) < 2:
        return ""
    groups: dict[float, list[str]] = {}
    for series in MIXERS:
        if series in budgets:
            groups.setdefault(budgets[series], []).append(series)
    parts = [f"{' and '.join(names)} at {int(steps):,}"
             for steps, names in sorted(groups.items(), reverse=True)]
    parts[0] += " steps"
    return ", ".join(parts)


def _budgets(cells: pd.DataFrame, task: str, length: int, series: tuple[str, ...]) -> dict[str, int]:
    """{series: trainer.max_steps of its best run} at one cell, for those of `series` that record one."""
    budgets = {}
    for name in series:
        cell = _cell(cells, task, length, name)
        if cell is not None and "max_steps" in cell and pd.notna(cell["max_steps"]):
            budgets[name] = int(cell["max_steps"])
    return budgets


def _longer_marks(cells: pd.DataFrame, task: str, length: int, series: tuple[str, ...]) -> dict[str, str]:
    """{series: " (20,000 steps)"} for those of `series` whose best run at one cell had a larger step budget
    than the least among them, "" for the others (and for all where the budgets are alike or unknown)."""
    budgets = _budgets(cells, task, length, series)
    least = min(budgets.values(), default=None)
    return {name: f" ({budgets[name]:,} steps)" if budgets.get(name, least) != least else ""
            for name in series}


def _order_breaks(acc: dict[str, float]) -> list[tuple[str, str]]:
    """Claim 1's order at one cell: each (mixer behind, the mixer it should not be behind) beyond SLACK."""
    return [(first, second) for first, second in zip(MIXERS, MIXERS[1:], strict=False)
            if acc[first] < acc[second] - SLACK]


def _spread_caveat(
    task: str,
    kda: int | None,
    gdn: int | None,
    kda_runs: tuple[float, ...],
    gdn_runs: tuple[float, ...],
    measured: list[tuple[str, float, tuple[float, ...]]],
) -> str:
    """Why a claim-2 gap at `task` is not yet a ranking, or "" where the runs settle it."""
    if kda is None or gdn is None:
        return ""
    gap = max(kda, gdn) / min(kda, gdn)
    if len(kda_runs) > 1 and len(gdn_runs) > 1:
        # several runs each: a ranking only where every run of the faster mixer beats every run of the other
        fast, slow = (kda_runs, gdn_runs) if kda <= gdn else (gdn_runs, kda_runs)
        if max(fast) < min(slow):
            return ""
        return f"{task}: the runs' steps overlap, so this gap is not a ranking"
    if measured and measured[0][1] >= gap:
        where, ratio, runs = measured[0]
        return (f"{task}: one run a mixer, and the runs of one cell ({where}: "
                f"{', '.join(_steps_text(v) for v in runs)}) differ {ratio:.1f}x, no less than this gap "
                f"({gap:.1f}x), so it is not yet a ranking")
    return ""


def _verdict(claim: str, against: list[str], missing: list[str], evidence: str) -> dict[str, str]:
    if against:
        verdict = "not reproduced"
        evidence = "; ".join(against) + (f" (missing: {', '.join(missing)})" if missing else "")
    elif missing:
        verdict = "not testable"
        evidence = f"{evidence}; missing or unfinished: {', '.join(missing)}"
    else:
        verdict = "reproduced"
    return {"claim": claim, "verdict": verdict, "evidence": evidence}


def _acc_at(curve: pd.DataFrame, step: float) -> float:
    """Eval acc (a fraction) of the last eval at or before `step`; NaN if there is none."""
    before = curve[curve["step"] <= step]
    return float(before["acc"].iloc[-1]) / 100.0 if len(before) else float("nan")


def budget_table(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells whose best run stayed below SOLVED_AT and ran its whole `trainer.max_steps` (not stopped
    early), with its eval acc at LATE_FRACTION of the steps run and at its last eval, and whether it was
    still learning (rose by more than STILL_LEARNING in between; None where the curve cannot tell)."""
    rows = []
    for _, c in cells.iterrows():
        ran, budget = c.get("steps_run"), c.get("max_steps")
        if pd.isna(c["eval"]) or c["eval"] >= SOLVED_AT or pd.isna(ran) or pd.isna(budget) or ran < budget:
            continue
        if pd.notna(c.get("early_stopped_at")):
            continue
        run_dir = c.get("run_dir")
        curve = eval_curve(run_dir) if isinstance(run_dir, str) else pd.DataFrame(columns=["step", "acc"])
        curve = curve.sort_values("step")
        late = _acc_at(curve, LATE_FRACTION * float(ran))
        end = float(curve["acc"].iloc[-1]) / 100.0 if len(curve) else float("nan")
        learning = None if pd.isna(late) or pd.isna(end) else bool(end - late > STILL_LEARNING)
        rows.append({"task": c["task"], "series": c["series"], "seq_len": int(c["seq_len"]),
                     "steps_run": int(ran), "acc_late": late, "acc_end": end, "still_learning": learning})
    columns = ["task", "series", "seq_len", "steps_run", "acc_late", "acc_end", "still_learning"]
    return pd.DataFrame(rows, columns=columns)


def claim1_section(cells: pd.DataFrame, metric: str, budget: pd.DataFrame,
                   kda_not_papers: bool = False) -> list[str]:
    """Per cell where claim 1's order breaks, what of this grid could hold back the mixer that falls behind:
    a step budget it ended still learning (or flat), fewer learning rates than the paper's, one seed, and
    (`kda_not_papers`) a KDA other than Kimi Linear's (kda_form_section). More steps and more learning rates
    can only raise a cell, so they explain a mixer behind, never one ahead."""
    breaking = _claim1_breaks(cells, metric)
    if not breaking:
        return []
    ended = {(r["task"], r["series"], r["seq_len"]): r for _, r in budget.iterrows()}
    by_cell = cells.set_index(["task", "series", "seq_len"])
    lines = []
    for task, length, acc, breaks in breaking:
        order = "; ".join(f"{low} {acc[low]:.2f} behind {high} {acc[high]:.2f}" for low, high in breaks)
        if unequal := _unequal_budgets(cells, task, length):
            order += f" ({unequal})"
        reasons = []
        for low in dict.fromkeys(low for low, _ in breaks):
            cell = by_cell.loc[(task, low, length)]
            said = []
            end = ended.get((task, low, length))
            if end is not None:
                rise = (f"eval acc {_fmt(end['acc_late'], '.3f')} at 80% of its steps, "
                        f"{_fmt(end['acc_end'], '.3f')} at the end")
                if end["still_learning"] and end["steps_run"] < PAPER_STEPS:
                    said.append(f"still learning when its {end['steps_run']:,} steps ended ({rise}): the "
                                f"paper's {PAPER_STEPS:,} steps may lift it")
                elif end["still_learning"]:
                    said.append(f"still learning when its {end['steps_run']:,} steps ended ({rise}), the "
                                "paper's budget or more")
                elif end["still_learning"] is None:
                    said.append(f"ran its whole {end['steps_run']:,} steps (no curve tells whether it was "
                                "still learning)")
                else:
                    said.append(f"flat over the last 20% of its {end['steps_run']:,} steps ({rise}): more "
                                "steps alone are unlikely to lift it")
            lrs = cell["lrs"] if isinstance(cell.get("lrs"), tuple) else ()
            if 0 < len(lrs) < len(PAPER_LRS):
                said.append(f"{len(lrs)} of the paper's {len(PAPER_LRS)} learning rates run ({_lrs(lrs)})")
            runs = cell.get("runs")
            if pd.notna(runs) and int(runs) == 1:
                said.append("one seed, so where it lies in the seed spread is unknown")
            spread = cell.get(f"{metric}_range")
            several = pd.notna(runs) and int(runs) > 1 and isinstance(spread, tuple)
            if several and spread[1] - spread[0] > 0.01:
                ahead = max(acc[high] for behind, high in breaks if behind == low)
                level = (": its best seed is level with the mixer ahead, so the order breaks on a seed, not "
                         "on every one" if spread[1] >= ahead - TIE else "")
                said.append(f"its {int(runs)} seeds span {spread[0]:.2f} to {spread[1]:.2f}{level}")
            if low == "kda" and kda_not_papers:
                kimi = _acc_of(cells, task, length, PAPER_KDA_SERIES, metric)
                said.append("the grid's KDA, not Kimi Linear's (KDA's gate, below)" + (
                    f"; Kimi Linear's reaches {kimi:.2f} here" if pd.notna(kimi) else ""))
            reasons.append(f"{low}: " + ("; ".join(said) if said else "none of the step budget, the learning "
                                         "rates or the seeds holds it back here"))
        lines.append(f"- {task}@{length}: {order}. {'. '.join(reasons)}.")
    return ["### Claim 1's cells", "",
            "Where the order KDA >= GDN >= Mamba2 breaks, what of this grid could hold back the mixer behind "
            "(more steps and more learning rates can only raise a cell; one seed may lie anywhere in the "
            "seed spread, and a mean over seeds that span much says so):",
            "", *lines, ""]


def _grid_kda_form(runs: pd.DataFrame) -> dict[str, str]:
    """The grid's own KDA runs' (no variant) values of PAPER_KDA's keys, as their configs set them."""
    kda = runs[(runs["mixer"] == "kda") & (runs.get("variant", pd.Series("", index=runs.index))
                                          .fillna("") == "")]
    return {key: _distinct(kda[f"mixer.{key}"]) for key in PAPER_KDA if f"mixer.{key}" in kda and len(kda)}


def _differs_from_papers(form: dict[str, str]) -> bool:
    """Whether a KDA form (_grid_kda_form) states one other than Kimi Linear's (PAPER_KDA)."""
    return bool(form) and any(form.get(key) != value for key, value in PAPER_KDA.items())


def _cell(cells: pd.DataFrame, task: str, length: int, series: str) -> pd.Series | None:
    row = cells[(cells["task"] == task) & (cells["seq_len"] == length) & (cells["series"] == series)]
    return row.iloc[0] if len(row) else None


def _acc_of(cells: pd.DataFrame, task: str, length: int, series: str, metric: str) -> float:
    cell = _cell(cells, task, length, series)
    return float(cell[metric]) if cell is not None else float("nan")


def _seeds_both_ran(ours: pd.Series | None, theirs: pd.Series | None, column: str
                    ) -> tuple[dict, dict, list] | None:
    """(our {seed: value}, theirs, the seeds both ran, sorted) of a per-seed `column` of two cells, where
    they ran different seeds and share some (a value over one cell's other seeds would set seed luck
    against a mixer); None otherwise (their values over all seeds compare alike)."""
    a = ours.get(column) if ours is not None else None
    b = theirs.get(column) if theirs is not None else None
    if not isinstance(a, dict) or not isinstance(b, dict) or set(a) == set(b):
        return None
    shared = sorted(set(a) & set(b))
    return (a, b, shared) if shared else None


def _steps_on_shared_seeds(kda: pd.Series, gdn: pd.Series | None
                           ) -> tuple[int | None, int | None, str] | None:
    """(KDA's, GDN's median steps to 0.9, the seeds) over the seeds both cells ran (_seeds_both_ran); None
    where that does not apply. None in place of steps: never got there."""
    both = _seeds_both_ran(kda, gdn, "steps_by_seed")
    if both is None:
        return None
    a, b, shared = both

    def median(by_seed: dict) -> int | None:
        value = median_steps(by_seed[k] for k in shared)
        return None if pd.isna(value) else int(value)
    return median(a), median(b), ", ".join(map(str, shared))


def _steps_value(cells: pd.DataFrame, task: str, length: int, series: str) -> int | None:
    """A cell's steps to 0.9; None where it has no run or never got there."""
    cell = _cell(cells, task, length, series)
    steps = cell["steps_to_0.9"] if cell is not None else None
    return None if steps is None or pd.isna(steps) else int(steps)


def _steps_of(cells: pd.DataFrame, task: str, length: int, series: str) -> str:
    if _cell(cells, task, length, series) is None:
        return MISSING
    steps = _steps_value(cells, task, length, series)
    return "never" if steps is None else f"{steps:,}"


def _on_shared_seeds(ours: pd.Series | None, theirs: pd.Series, metric: str
                     ) -> tuple[tuple[float, str] | None, float]:
    """((our mean, the seeds) and their mean) over the seeds both cells ran (_seeds_both_ran); (None, nan)
    where that does not apply."""
    both = _seeds_both_ran(ours, theirs, f"{metric}_by_seed")
    if both is None:
        return None, float("nan")
    a, b, shared = both
    mean = (sum(a[k] for k in shared) / len(shared), ", ".join(map(str, shared)))
    return mean, sum(b[k] for k in shared) / len(shared)


def kda_form_section(form: dict[str, str], cells: pd.DataFrame, metric: str,
                     verdicts: list[dict[str, str]]) -> list[str]:
    """Which KDA the grid ran (`form`, _grid_kda_form) against Kimi Linear's (PAPER_KDA) and, where KDA runs
    with Kimi Linear's pair exist (results/kimi_fig4_h200_gate), the cells the claims turn on with both side
    by side; else the cells that would test it. Nothing where the grid's KDA is Kimi Linear's."""
    if not _differs_from_papers(form):
        return []
    paper = ", ".join(f"{key}={value}" for key, value in PAPER_KDA.items())
    ours = ", ".join(f"{key}={value}" for key, value in form.items())
    k3 = form == {"gate": "bounded", "output_gate_rank": "full"}
    lines = ["### KDA's gate", "",
             f"This grid's KDA is the harness's default ({ours}" + (
                 ", K3's: a log-decay bounded below by `mixer.g_min`, a full-rank output gate" if k3 else "")
             + "; conf/mixer/kda.yaml); Kimi Linear's KDA, whose Fig. 4 this is, has "
             f"{paper} (conf/experiment/ablation/kimi_linear.yaml). The paper pins it; this grid differs "
             "from it there."]
    against = {v["claim"][:2]: v["verdict"] == "not reproduced" for v in verdicts}
    # the cells where KDA's form can move a verdict: KDA behind (claim 1), claim 2's, KDA at 2048 (claim 4)
    wanted: list[tuple[str, int]] = []
    if against.get("1."):
        wanted += [(task, length) for task, length, _, breaks in _claim1_breaks(cells, metric)
                   if any(low == "kda" for low, _ in breaks)]
    if against.get("2."):
        wanted += [("palindrome", 1024), ("mqar", 1024)]
    if against.get("4."):
        wanted += [(t, 2048) for t in ("palindrome", "mqar")
                   if _acc_of(cells, t, 2048, "kda", metric) >= 0.5]
    wanted = list(dict.fromkeys(wanted))
    ran = cells[cells["series"] == PAPER_KDA_SERIES] if not cells.empty else cells
    if ran.empty:
        where = ", ".join(f"{t}@{n}" for t, n in wanted) or "the cells the claims turn on"
        return lines + ["", f"No run of Kimi Linear's KDA yet. The runs that test it: KDA with `{paper}` "
                        f"(`mixer.gate=softplus mixer.output_gate_rank=low`) at {where}, everything else as "
                        "in the grid (`results/kimi_fig4_h200_gate/`).", ""]
    lines += ["", f"KDA with Kimi Linear's gate pair beside the grid's (best lr each; {METRICS[metric]}):",
              "", "| task | L | kda (the grid's) | kda (Kimi Linear's) | gdn | mamba2 | steps to 0.9, the "
              "grid's kda | Kimi Linear's | gdn |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    said, longer = [], False
    for _, cell in ran.sort_values(["task", "seq_len"]).iterrows():
        task, length = cell["task"], int(cell["seq_len"])
        grid, kimi = _acc_of(cells, task, length, "kda", metric), float(cell[metric])
        g, m = (_acc_of(cells, task, length, s, metric) for s in ("gdn", "mamba2"))
        steps = " | ".join(_steps_of(cells, task, length, s) for s in ("kda", PAPER_KDA_SERIES, "gdn"))
        marks = _longer_marks(cells, task, length, ("kda", PAPER_KDA_SERIES, "gdn", "mamba2"))
        longer = longer or any(marks.values())
        lines.append(f"| {task} | {length} | {_fmt(grid, '.3f')}{marks['kda']} | {kimi:.3f}"
                     f"{marks[PAPER_KDA_SERIES]} | {_fmt(g, '.3f')}{marks['gdn']} | {_fmt(m, '.3f')}"
                     f"{marks['mamba2']} | {steps} |")
        if (task, length) in wanted and length == 2048 and against.get("4.") and task != "stack":
            said.append(f"{task}@{length} (claim 4): Kimi Linear's KDA " + (
                f"stays below 50% ({kimi:.2f}) as the paper's figure shows, where the grid's reaches "
                f"{grid:.2f}: the KDA form explains the difference" if kimi < 0.5 else
                f"passes 50% too ({kimi:.2f}): the KDA form does not explain claim 4 here"))
        ahead = max(v for v in (g, m) if pd.notna(v)) if pd.notna(g) or pd.notna(m) else float("nan")
        if pd.notna(ahead) and pd.notna(grid) and grid < ahead - SLACK:
            mine, theirs = _on_shared_seeds(_cell(cells, task, length, "kda"), cell, metric)
            # the two KDAs on like seeds: the grid's on those Kimi Linear's ran, where they ran others
            ours, papers = (mine[0], theirs) if mine is not None else (grid, kimi)
            if mine is not None and ours >= ahead - SLACK:
                said.append(f"{task}@{length} (claim 1): on the seeds both ran ({mine[1]}) the grid's KDA "
                            f"reaches {ours:.2f} and Kimi Linear's {papers:.2f}; the grid's mean of "
                            f"{grid:.2f} falls behind on seeds Kimi Linear's KDA has not run, so its form is "
                            "not what this gap tests")
            else:
                said.append(f"{task}@{length} (claim 1): Kimi Linear's KDA " + (
                    f"reaches {papers:.2f}, at or above the best of GDN and Mamba2 ({ahead:.2f}) where the "
                    f"grid's {ours:.2f} falls behind: the KDA form explains claim 1 here"
                    if papers >= ahead - SLACK else
                    f"reaches {papers:.2f}, still behind the best of GDN and Mamba2 ({ahead:.2f}): the KDA "
                    "form does not explain claim 1 here"))
        if length == 1024 and task in ("palindrome", "mqar") and against.get("2."):
            shared = _steps_on_shared_seeds(cell, _cell(cells, task, length, "gdn"))
            steps_kimi, steps_gdn = shared[:2] if shared else (
                _steps_value(cells, task, length, s) for s in (PAPER_KDA_SERIES, "gdn"))
            much = _much_sooner(steps_kimi, steps_gdn)
            shown = {name: "never" if v is None else f"{v:,} steps"
                     for name, v in (("kimi", steps_kimi), ("gdn", steps_gdn))}
            on = f" on the seeds both ran ({shared[2]})" if shared else ""
            said.append(f"{task}@{length} (claim 2): Kimi Linear's KDA reaches 0.9 in {shown['kimi']}, GDN "
                        f"in {shown['gdn']}{on}: " + ("much sooner, as the paper says" if much else
                                                      "not much sooner (the claim asks 1.5x fewer steps)"))
    missing = [f"{t}@{n}" for t, n in wanted
               if not ((ran["task"] == t) & (ran["seq_len"] == n)).any()]
    if longer:
        lines += ["", "A value followed by its steps was trained longer than the least in its row: it is not "
                  "ahead of that row's others on equal terms."]
    lines += ["", *(f"- {line}." for line in said)]
    if missing:
        lines.append(f"- Not run yet with Kimi Linear's pair: {', '.join(missing)}.")
    return lines + [""]


def _lrs(lrs: tuple[float, ...]) -> str:
    """Learning rates as the configs write them: 5e-5, 1e-3."""
    return ", ".join(re.sub(r"e-0*(\d)", r"e-\1", f"{lr:.0e}") for lr in lrs)


def lr_section(cells: pd.DataFrame, metric: str = "train") -> list[str]:
    """Which learning rates the cells ran against the paper's four, and the cells below SOLVED_AT that another
    learning rate could still raise (and with them a claim's verdict)."""
    if cells.empty:
        return ["No finished run yet."]
    paper = _lrs(PAPER_LRS)
    counts = cells["lrs"].apply(_lrs).value_counts()
    ran = "; ".join(f"{n} cell(s) at {lrs}" for lrs, n in sorted(counts.items(), key=lambda c: (-c[1], c[0])))
    lines = [f"Kimi Linear takes each cell at its best of four learning rates ({paper}); here {ran}."]
    short = cells[(cells[metric] < SOLVED_AT) & (cells["lrs"].apply(len) < len(PAPER_LRS))]
    if short.empty:
        return lines + [f"Every cell below {SOLVED_AT} ran all four."]
    lines += [f"Below {SOLVED_AT} on fewer learning rates than the paper's, so another may still raise them:",
              "", "| task | mixer | L | peak train acc | best eval acc | learning rates run |",
              "|---|---|---:|---:|---:|---|"]
    lines += [f"| {c['task']} | {c['series']} | {c['seq_len']} | {_fmt(c['train'], '.3f')} | "
              f"{_fmt(c['eval'], '.3f')} | {_lrs(c['lrs'])} |"
              for _, c in short.iterrows()]
    return lines


def short_conv_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (task, length) with both Mamba2 and Mamba2 without its short conv: both metrics side by side."""
    noconv = series_name("mamba2", NOCONV_VARIANT)
    lowered = cells["series"].astype(str).str.lower()
    with_conv = cells[cells["series"] == "mamba2"].set_index(["task", "seq_len"])
    without = cells[lowered == noconv].set_index(["task", "seq_len"])
    both = with_conv.index.intersection(without.index)
    rows = [{"task": task, "seq_len": int(length),
             **{f"{metric}_conv": with_conv.loc[(task, length), metric] for metric in METRICS},
             **{f"{metric}_noconv": without.loc[(task, length), metric] for metric in METRICS}}
            for task, length in both]
    columns = ["task", "seq_len", "train_conv", "train_noconv", "eval_conv", "eval_noconv"]
    return pd.DataFrame(rows, columns=columns).sort_values(["task", "seq_len"], ignore_index=True)


def short_conv_verdict(side: pd.DataFrame, metric: str) -> list[str]:
    """What the twins say of claim 3 (Mamba2 below 50% beyond the shortest length): the cells where the
    short convolution alone lifts Mamba2 over 50%, and those where it fails either way."""
    conv, noconv = side[f"{metric}_conv"], side[f"{metric}_noconv"]
    named = {
        key: ", ".join(f"{r['task']}@{r['seq_len']} ({r[f'{metric}_conv']:.2f} with, "
                       f"{r[f'{metric}_noconv']:.2f} without)" for _, r in side[mask].iterrows())
        for key, mask in (("lifts", (conv >= 0.5) & (noconv < 0.5)), ("fails", (conv < 0.5) & (noconv < 0.5)),
                          ("holds", noconv >= 0.5))
    }
    lines = []
    if named["lifts"]:
        lines.append(f"The short convolution is why Mamba2 passes 50% at {named['lifts']}: without it Mamba2 "
                     "fails there as claim 3 says, so where this grid's Mamba2 (with its conv) holds beyond "
                     "the shortest length, the conv explains the difference from the paper.")
    if named["fails"]:
        lines.append(f"Mamba2 fails with and without it at {named['fails']}.")
    if named["holds"]:
        lines.append(f"Mamba2 passes 50% even without it at {named['holds']}: there the conv does not "
                     "explain the difference.")
    return lines


def _distinct(values: pd.Series) -> str:
    """A column's distinct values, `null` for an unset one (the task's own default)."""
    shown = {"null" if v is None or (isinstance(v, float) and math.isnan(v)) else
             format(int(v), ",") if isinstance(v, (int, float)) and float(v).is_integer() else str(v)
             for v in values}
    return ", ".join(sorted(shown, key=lambda v: (len(v), v)))


def open_parameters(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """(label, the distinct values the runs' configs give it) of each OPEN_PARAMETERS entry the table has."""
    found = []
    for label, column, task in OPEN_PARAMETERS:
        if column not in runs:
            continue
        rows = runs if task is None else runs[runs["task"] == task]
        if not len(rows):
            continue
        values = _distinct(rows[column])
        unset = rows[rows[column].isna()]
        if column == "task.params.num_pairs" and len(unset):
            from tasks.mqar import default_num_pairs  # imports torch: only for a table that needs it

            lengths = sorted({int(n) for n in unset["seq_len"].dropna()})
            pairs = ", ".join(f"{default_num_pairs(n)} at {n}" for n in lengths)
            values += f" (tasks/mqar.py's seq_len // 8{': ' + pairs if pairs else ''})"
        found.append((label, values))
    return found


def _int(value: Any) -> int | None:
    number = pd.to_numeric(value, errors="coerce")
    return None if pd.isna(number) else int(number)


def mqar_load(runs: pd.DataFrame) -> pd.DataFrame:
    """Per MQAR length (and config) of the runs: the form, vocabulary, pairs, queries a sequence and a pair,
    the key dimensions of one layer's heads together (heads x head dim) and the pairs per such dimension,
    and the recall targets of one step (queries x batch); defaults as tasks/mqar.py applies them."""
    columns = ["seq_len", "form", "vocab", "pairs", "queries", "per_pair", "key_dims", "pairs_per_dim",
               "targets_per_step"]
    mqar = runs[runs["task"] == "mqar"] if "task" in runs else runs.iloc[:0]
    if mqar.empty:
        return pd.DataFrame(columns=columns)
    from tasks.mqar import counts  # imports torch: only for a table with MQAR runs

    rows = set()
    for _, run in mqar.iterrows():
        length = int(run["seq_len"])
        form = run.get("task.params.form")
        form = form if isinstance(form, str) else "kimi"
        pairs, queries = counts(length, form, _int(run.get("task.params.num_pairs")),
                                _int(run.get("task.params.num_queries")))
        heads, dim = _int(run.get("mixer.num_heads")), _int(run.get("mixer.head_dim"))
        batch = _int(run.get("trainer.batch_size"))
        rows.add((length, form, _int(run.get("task.params.vocab_size")), pairs, queries,
                  heads * dim if heads and dim else None, batch))
    out = []
    for length, form, vocab, pairs, queries, key_dims, batch in sorted(rows, key=lambda r: (r[0], str(r))):
        out.append({"seq_len": length, "form": form, "vocab": vocab, "pairs": pairs, "queries": queries,
                    "per_pair": queries / pairs, "key_dims": key_dims,
                    "pairs_per_dim": pairs / key_dims if key_dims else float("nan"),
                    "targets_per_step": queries * batch if batch else None})
    return pd.DataFrame(out, columns=columns)


def _n(value: Any, spec: str = ",") -> str:
    return MISSING if value is None or pd.isna(value) else format(value, spec)


def mqar_section(runs: pd.DataFrame, cells: pd.DataFrame, metric: str) -> list[str]:
    """MQAR's load beside what the paper states of it, and, where KDA solves MQAR at 2048 (against claim
    4), the unpinned choices that make this MQAR easier and the runs that would test them."""
    # the grid's own MQAR (runs with no variant); the load-test runs, which set pairs or queries, come after
    plain = runs[runs["variant"].fillna("") == ""] if "variant" in runs else runs
    load = mqar_load(plain)
    if load.empty:
        return []
    lines = ["", "### MQAR's load (claim 4)", "",
             "Kimi Linear §5.1 states neither MQAR's number of pairs nor its number of queries (its example: "
             "6 pairs, then 2 queries), nor its vocabulary or batch. This grid's MQAR, as the runs' configs "
             "set it (tasks/mqar.py's defaults where a value is null):", "",
             "| L | form | vocabulary | pairs | queries a sequence | queries a pair | key dimensions of a "
             "layer (heads x head dim) | pairs per key dimension | recall targets a step |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seq_len']} | {r['form']} | {_n(r['vocab'])} | {r['pairs']:,} | {r['queries']:,} | "
              f"{r['per_pair']:.1f} | {_n(r['key_dims'])} | {_n(r['pairs_per_dim'], '.2f')} | "
              f"{_n(r['targets_per_step'])} |" for _, r in load.iterrows()]
    kda = cells[(cells["task"] == "mqar") & (cells["series"] == "kda") & (cells["seq_len"] == 2048)]
    acc = float(kda[metric].iloc[0]) if len(kda) else float("nan")
    lines.append("")
    if pd.isna(acc) or acc < 0.5:
        lines.append("KDA's MQAR cell at 2048 " + ("has not run yet" if pd.isna(acc) else
                     f"stays below 50% ({acc:.2f}), as the paper's figure shows") + ".")
        return lines
    at = load[load["seq_len"] == 2048].iloc[0] if (load["seq_len"] == 2048).any() else load.iloc[-1]
    pairs, queries, dims = int(at["pairs"]), int(at["queries"]), at["key_dims"]
    if pd.isna(dims):
        fits = f"{pairs:,} pairs at 2048"
    elif pairs <= dims:
        fits = (f"{pairs:,} pairs at 2048, no more than the {int(dims):,} key dimensions of one layer's "
                "heads together: a delta-rule state can hold every pair on keys it keeps apart, so the "
                "length does not overload the memory (more pairs than key dimensions cannot all be held)")
    else:
        fits = f"{pairs:,} pairs at 2048, more than the {int(dims):,} key dimensions of one layer's heads"
    targets = f"{int(at['targets_per_step']):,}" if pd.notna(at["targets_per_step"]) else "every query's"
    mqar = runs[runs["task"] == "mqar"]
    batch = _int(mqar["trainer.batch_size"].max()) if "trainer.batch_size" in mqar else None
    # the budget of the cell the claim turns on (a longer run elsewhere does not lift this one)
    kda_runs = mqar[(mqar["seq_len"] == 2048) & (_series(mqar) == "kda").to_numpy()]
    budget = max_trained_steps(kda_runs if len(kda_runs) else mqar)
    below = f", below the paper's {PAPER_STEPS:,}," if budget and budget < PAPER_STEPS else ""
    tested = not _load_cells(cells).empty
    gdn = cells[(cells["task"] == "mqar") & (cells["series"] == "gdn") & (cells["seq_len"] == 2048)]
    g = float(gdn[metric].iloc[0]) if len(gdn) else float("nan")
    if pd.isna(g):
        check = ("The grid's own GDN cell at 2048 is a check too: claim 1 puts GDN at or below KDA, so GDN "
                 "solving it as well would say that this MQAR is easier than the paper's for delta-rule "
                 "mixers in general.")
    elif g >= 0.5:
        check = (f"The grid's GDN cell at 2048 passes 50% too ({g:.2f}): this MQAR is within reach of "
                 "delta-rule mixers in general here, not of KDA alone.")
    else:
        check = (f"The grid's GDN cell at 2048 stays below 50% ({g:.2f}): here KDA alone solves it, which "
                 "the load runs below weigh.")
    tests = (f"Runs that would test it, KDA at 2048 with everything else as in the grid: `python train.py "
             "experiment=kimi_fig4_h200 task=mqar task.seq_len=2048 optim.lr=1e-3 mixer=kda "
             f"task.params.num_pairs={2 * pairs}` (twice the pairs: more than the key dimensions) and the "
             f"same with `task.params.num_queries={pairs}` (one query a pair); if KDA falls below 50% there, "
             "the difference is the task's load, not the mixer." if not tested else
             f"The load-test runs below test the two: KDA at 2048, everything else as in the grid, with "
             f"{2 * pairs:,} pairs (more than the key dimensions) or {pairs:,} queries (one a pair).")
    lines += [
        f"Claim 4 is not reproduced on MQAR: KDA reaches {acc:.2f} at 2048, where the paper's figure shows "
        "it below 50%. " + ("The likeliest reason is that this MQAR asks less of a mixer than the paper's, "
                            "through two choices the paper leaves open:" if not tested else
                            "Two choices the paper leaves open could make this MQAR ask less of a mixer than "
                            "the paper's:"),
        "",
        f"- **pairs** (`task.params.num_pairs`): {fits};",
        f"- **queries** (`task.params.form` {at['form']}, `task.params.num_queries`): {queries:,} a sequence "
        f"at 2048, {at['per_pair']:.1f} for each pair on average, so one step of the batch trains on "
        f"{targets} recalls; the paper's example asks fewer queries than pairs, and Zoology asks each key "
        "once.",
        "",
        f"The other unpinned choices do not explain a success: the vocabulary ({_n(at['vocab'])}; Zoology "
        "uses 8,192) sets how many keys there are to tell apart, not how many a state must hold; the batch "
        f"({_n(batch)}; the paper gives none) adds to the recalls a step, as above, not to what a state "
        f"must hold; and a budget of at most {_n(budget)} steps{below} can only lower a cell. "
        f"{tests} {check}",
    ]
    return lines + load_tests(runs, cells, metric)


LOAD_KEYS = ("task.params.num_pairs", "task.params.num_queries")


def _load_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """KDA's MQAR cells at 2048 that set the pairs or the queries."""
    if cells.empty:
        return cells
    return cells[(cells["task"] == "mqar") & (cells["seq_len"] == 2048)
                 & cells["series"].str.startswith("kda [")
                 & cells["series"].str.contains("|".join(LOAD_KEYS), regex=True)]


def load_tests(runs: pd.DataFrame, cells: pd.DataFrame, metric: str) -> list[str]:
    """KDA's MQAR cells at 2048 that set the pairs or the queries (results/kimi_fig4_h200_load, given to the
    report beside the grid), with their load and whether KDA falls below 50% under it."""
    tests = _load_cells(cells)
    if tests.empty:
        return ["", "No load-test run yet (`results/kimi_fig4_h200/campaign.txt` holds them, in "
                "`results/kimi_fig4_h200_load/`)."]
    lines = ["", "The load-test runs (KDA, MQAR at 2048, lr as in the grid, best over lrs run):", "",
             "| run's variant | pairs | queries a sequence | pairs per key dimension | "
             f"{METRICS[metric]} | steps to 0.9 |", "|---|---:|---:|---:|---:|---:|"]
    below = []
    for _, cell in tests.iterrows():
        match = runs[(runs["task"] == "mqar") & (runs["seq_len"] == 2048) & (_series(runs) == cell["series"])]
        load = mqar_load(match.iloc[:1]) if len(match) else pd.DataFrame()
        row = load.iloc[0] if len(load) else {}
        acc = float(cell[metric])
        below.append(acc < 0.5)
        steps = cell.get("steps_to_0.9")
        lines.append(f"| {cell['series'][len('kda ['):-1]} | {_n(row.get('pairs'))} | "
                     f"{_n(row.get('queries'))} | {_n(row.get('pairs_per_dim'), '.2f')} | {acc:.3f} | "
                     f"{'never' if steps is None or pd.isna(steps) else f'{int(steps):,}'} |")
    lines.append("")
    if all(below):
        lines.append("Under the heavier load KDA falls below 50%, as the paper's figure shows at 2048: the "
                     "difference on claim 4 is this MQAR's load, not the mixer.")
    elif any(below):
        lines.append("KDA falls below 50% under some of these loads only (the rows below 0.500): that load "
                     "is what separates this MQAR from the paper's.")
    else:
        # where the grid's KDA is not Kimi Linear's, its own run at this cell (results/kimi_fig4_h200_gate)
        # says whether the form is what is left
        other = ""
        if _differs_from_papers(_grid_kda_form(runs)):
            kimi = _cell(cells, "mqar", 2048, PAPER_KDA_SERIES)
            if kimi is None:
                other = "; the KDA form is the candidate left (KDA's gate, above)"
            else:
                acc = float(kimi[metric])
                other = ("; nor is the KDA form: Kimi Linear's KDA passes 50% there too" if acc >= 0.5
                         else "; the KDA form is: Kimi Linear's KDA stays below 50% there")
                other += f" ({acc:.2f}; KDA's gate, above)"
        lines.append("KDA still solves MQAR at 2048 under every load tried here, so neither the pairs nor "
                     "the queries explains claim 4: what separates this MQAR (or this KDA) from the paper's "
                     f"is none of the choices varied here{other}.")
    return lines


def train_curve(run_dir: Any) -> list[tuple[int, float]]:
    """(step, train acc) of every record of a run's metrics.jsonl that logs it; empty where none can be
    read."""
    if not isinstance(run_dir, str):
        return []
    try:
        return sorted(read_curve(Path(run_dir), "train/acc").items())
    except ValueError:  # no metrics.jsonl, or none that logs train/acc
        return []


def took_off_and_stalled(curve: list[tuple[int, float]]) -> tuple[int | None, int | None]:
    """(the first step at train acc >= TOOK_OFF, the step from which it stayed within STALLED of its last
    value) of a curve; None for either that did not happen (a run that never took off has not stalled).
    A flat stretch shorter than the run's last 1 - LATE_FRACTION of steps is no stall: the learning rate's
    schedule ends there, and every run that is still learning flattens."""
    took = next((step for step, acc in curve if acc >= TOOK_OFF), None)
    if took is None or len(curve) < 2:
        return took, None
    last_step, last = curve[-1]
    apart = [i for i, (_, acc) in enumerate(curve) if abs(acc - last) > STALLED]
    start = apart[-1] + 1 if apart else 0
    if start >= len(curve) - 1 or curve[start][0] > LATE_FRACTION * last_step:
        return took, None
    return took, curve[start][0]


def seeds_apart(runs: pd.DataFrame, cells: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Each run at its cell's lr, for the cells where one seed learnt the task (>= FAILED by `metric`) and
    another failed it (< FAILED): seed, peak, steps run, when it took off and when it stalled
    (took_off_and_stalled)."""
    columns = ["task", "series", "seq_len", "lr", "seed", "acc", "steps", "took_off", "stalled"]
    done = runs[runs["status"] == "completed"].copy() if "status" in runs else runs.iloc[0:0]
    if done.empty or cells.empty:
        return pd.DataFrame(columns=columns)
    done["series"] = _series(done)
    lrs = pd.to_numeric(done["lr"], errors="coerce")
    rows = []
    for _, c in cells.iterrows():
        spread = c.get(f"{metric}_range")
        if c["runs"] < 2 or not isinstance(spread, tuple) or not spread[0] < FAILED <= spread[1]:
            continue
        # the runs cell_table averaged at the cell's lr (the same lr values, compared as it compares them)
        at = done[(done["task"] == c["task"]) & (done["series"] == c["series"])
                  & (done["seq_len"] == c["seq_len"]) & (lrs == c["lr"])]
        for _, run in at.iterrows():
            took, stalled = took_off_and_stalled(train_curve(run.get("run_dir")))
            rows.append({"task": c["task"], "series": c["series"], "seq_len": int(c["seq_len"]),
                         "lr": c["lr"], "seed": seed_number(run.get("seed")),
                         "acc": pd.to_numeric(run.get(METRICS[metric]), errors="coerce"),
                         "steps": pd.to_numeric(run.get("steps"), errors="coerce"),
                         "took_off": took, "stalled": stalled})
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["task", "seq_len", "series", "seed"], ignore_index=True)


def seeds_section(runs: pd.DataFrame, cells: pd.DataFrame, metric: str) -> list[str]:
    """Where a cell's seeds part: which failed, and how (never took off, or took off and stalled), beside
    when its seeds that learnt the task took off."""
    apart = seeds_apart(runs, cells, metric)
    if apart.empty:
        return []
    lines = ["### Seeds apart", "",
             f"Cells where one seed learnt the task at the cell's lr (>= {FAILED}) and another failed it "
             f"(< {FAILED}; {METRICS[metric]}). Took off: the first logged step at train acc >= {TOOK_OFF} "
             "(on these tasks the loss stays near the uniform guess's until then); stalled, for a failed "
             f"seed: from that step on, train acc stayed within {STALLED} of its last value.", "",
             "| task | mixer | L | lr | seed | peak | steps run | took off | stalled from |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]

    def step(value: Any) -> str:
        return MISSING if value is None or pd.isna(value) else f"{int(value):,}"
    for _, r in apart.iterrows():
        lines.append(f"| {r['task']} | {r['series']} | {r['seq_len']} | {r['lr']:g} | {r['seed']} | "
                     f"{_fmt(r['acc'], '.3f')} | {step(r['steps'])} | {step(r['took_off'])} | "
                     f"{step(r['stalled'] if r['acc'] < FAILED else None)} |")
    said = []
    for (task, series, length), cell in apart.groupby(["task", "series", "seq_len"], sort=False):
        learnt = cell[cell["acc"] >= FAILED]
        seeds = ", ".join(str(seed) for seed in learnt["seed"])
        off = (f"{' and '.join(step(t) for t in learnt['took_off'])} "
               f"(seed{'s' if len(learnt) > 1 else ''} {seeds})")
        for _, r in cell[cell["acc"] < FAILED].iterrows():
            if r["took_off"] is None or pd.isna(r["took_off"]):
                said.append(f"{task}@{length} {series}, seed {r['seed']}: never took off in its "
                            f"{step(r['steps'])} steps, where its seeds that learnt it took off at steps "
                            f"{off}: a plateau longer than this budget, whose length the seed sets; more "
                            "steps may end it")
            elif r["stalled"] is not None and pd.notna(r["stalled"]):
                said.append(f"{task}@{length} {series}, seed {r['seed']}: took off at step "
                            f"{step(r['took_off'])}, its seeds that learnt it at {off}, and stalled at "
                            f"{r['acc']:.2f} from step {step(r['stalled'])} to its end ({step(r['steps'])}): "
                            "part of the task learnt, then no progress")
            else:
                said.append(f"{task}@{length} {series}, seed {r['seed']}: took off at step "
                            f"{step(r['took_off'])}, its seeds that learnt it at {off}, and was still "
                            f"learning at its end ({step(r['steps'])}, {r['acc']:.2f})")
    return lines + ["", *(f"- {line}." for line in said), ""]


def differences(runs: pd.DataFrame, cells: pd.DataFrame, metric: str = "train",
                verdicts: list[dict[str, str]] | None = None,
                budget: pd.DataFrame | None = None,
                seed_view: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> list[str]:
    """The report's section on the grid's unpinned choices, each with the cells that show its effect.
    `verdicts` and `budget` (judge's, budget_table's of `cells`) where the caller has them already;
    `seed_view` (runs, their cell_table) sets seeds apart on other runs than the points' (all seeds)."""
    budget = budget if budget is not None else budget_table(cells)
    verdicts = verdicts if verdicts is not None else judge(cells, metric)
    form = _grid_kda_form(runs)
    lines = ["## Where this grid can differ from the paper", "",
             *claim1_section(cells, metric, budget, _differs_from_papers(form)),
             *kda_form_section(form, cells, metric, verdicts), "### The step budget", ""]
    ran = budgets(runs)
    lines.append(
        f"The paper trains {PAPER_STEPS:,} steps, this grid {ran or 'the max_steps it ran'}, so a cell still "
        "learning at its end may reach more with the paper's budget (best lr; "
        f"below {SOLVED_AT} and run to its max_steps; still learning: eval acc rose by more than "
        f"{STILL_LEARNING} over the last {1 - LATE_FRACTION:.0%} of its steps).")
    lines.append("")
    if budget.empty:
        lines.append(f"No cell stayed below {SOLVED_AT} through its whole step budget.")
    else:
        lines += ["| task | mixer | L | steps run | eval acc at 80% | at the end | still learning |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for _, r in budget.iterrows():
            learning = MISSING if r["still_learning"] is None else ("yes" if r["still_learning"] else "no")
            lines.append(f"| {r['task']} | {r['series']} | {r['seq_len']} | {r['steps_run']:,} | "
                         f"{_fmt(r['acc_late'], '.3f')} | {_fmt(r['acc_end'], '.3f')} | {learning} |")
    lines += ["", *seeds_section(*(seed_view or (runs, cells)), metric)]
    lines += ["### The learning rates", "", *lr_section(cells, metric)]
    lines += ["", "### Mamba2's short convolution", ""]
    side = short_conv_table(cells)
    noconv = series_name("mamba2", NOCONV_VARIANT)
    if side.empty:
        mamba = cells[cells["series"] == "mamba2"]
        where = ", ".join(f"{t}@{int(n)}" for t, n in zip(mamba["task"], mamba["seq_len"], strict=True))
        lines.append(f"No Mamba2 cell has a `{noconv}` twin yet (experiment/kimi_fig4_h200_noconv); the "
                     f"cells that would show it: mamba2 at {where or 'every task and length of the grid'}.")
    else:
        lines += ["| task | L | peak train acc, conv | no conv | best eval acc, conv | no conv |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['task']} | {r['seq_len']} | {_fmt(r['train_conv'], '.3f')} | "
                  f"{_fmt(r['train_noconv'], '.3f')} | {_fmt(r['eval_conv'], '.3f')} | "
                  f"{_fmt(r['eval_noconv'], '.3f')} |" for _, r in side.iterrows()]
        lines += ["", *short_conv_verdict(side, metric)]
    lines += mqar_section(runs, cells, metric)
    # the grid's own runs: a variant (the load tests, Mamba2 without its conv) is described where it is shown
    plain = runs[runs["variant"].fillna("") == ""] if "variant" in runs else runs
    found = open_parameters(plain)
    if found:
        lines += ["", "### The other open parameters, as the grid's runs' configs set them", ""]
        lines += [f"- {label}: {values}" for label, values in found]
    return lines + [""]


def first_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs a grid starts with: its first seed, at its shortest step budget (the single-GPU grid's one
    seed of 5,000 steps), against which more seeds and the paper's budget are weighed."""
    if runs.empty or "seed" not in runs:
        return runs
    seed = pd.to_numeric(runs["seed"], errors="coerce")
    keep = seed == seed.min()
    if "trainer.max_steps" in runs:
        budget = pd.to_numeric(runs["trainer.max_steps"], errors="coerce")
        keep &= budget.isna() | (budget == budget.min())
    return runs[keep]


def waiting_runs(waiting: pd.DataFrame, metric: str) -> list[str]:
    """Lines naming the runs analysis.cells.point_runs left out of their cells' points: below SOLVED_AT at a
    shorter budget than other seeds of their cell and lr, so no sample of the longer budget the point
    stands at (`campaign.py extend` trains them that long); empty where there are none."""
    if waiting.empty:
        return []
    column = METRICS[metric]
    lines = ["", f"Left out of their cell's point, below {SOLVED_AT} at a shorter budget than its other "
             "seeds at that lr (a point stands at one budget; `tools/campaign.py extend` trains these as "
             "long):",
             "",
             "| task | mixer | L | lr | seed | budget | " + f"{column} | the point's budget |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    waiting = waiting.assign(series=_series(waiting))
    for _, run in waiting.sort_values(["task", "seq_len", "series", "seed"]).iterrows():
        lines.append(f"| {run['task']} | {run['series']} | {int(run['seq_len'])} | {float(run['lr']):g} | "
                     f"{seed_number(run.get('seed'))} | {_n(int(run['trainer.max_steps']))} | "
                     f"{_fmt(pd.to_numeric(run.get(column), errors='coerce'), '.3f')} | "
                     f"{_n(int(run['point_max_steps']))} |")
    return lines


def _cell_text(cell: pd.Series | None, name: str) -> str:
    if cell is None:
        return "not run"
    steps = "never" if pd.isna(cell["steps_to_0.9"]) else f"{int(cell['steps_to_0.9']):,}"
    return f"{_with_range(cell, name)} at {cell['lr']:g}, 0.9 at {steps} (n={cell['runs']})"


def what_changed(runs: pd.DataFrame, metric: str = "train") -> list[str]:
    """The section on what the runs beyond the first ones (more seeds, the paper's longer budget) changed:
    each claim's verdict on the first runs and on all, and every cell whose accuracy moved by more than
    SLACK, whose steps to 0.9 or best lr moved. Empty where no such run has finished."""
    done = runs[runs["status"] == "completed"] if "status" in runs else runs
    first = first_runs(done)
    if len(done) == len(first):
        return []
    seed = pd.to_numeric(done["seed"], errors="coerce")
    budget = pd.to_numeric(done.get("trainer.max_steps", pd.Series(math.nan, index=done.index)),
                           errors="coerce")
    more_seeds, long_runs = int((seed != seed.min()).sum()), int((budget > budget.min()).sum())
    before = cell_table(longest_budget(first), metric)
    after = cell_table(point_runs(done, METRICS[metric])[0], metric)
    shortest = _n(int(budget.min())) if budget.notna().any() else MISSING
    lines = ["## What the seeds and the longer budget changed", "",
             f"Against the first runs (seed {int(seed.min())}, {shortest} steps each; {len(first)} runs): "
             f"{more_seeds} run(s) of further seeds and {long_runs} at a longer budget (a longer run stands "
             "for its cell, lr and seed; a point stands at one budget, its seeds left below "
             f"{SOLVED_AT} at a shorter one left out of it). Every seed at {shortest} steps: all seeds, no "
             "longer run, so each cell's spread over seeds at the grid's budget.", "",
             f"| claim | first runs | every seed at {shortest} steps | all runs |", "|---|---|---|---|"]
    grid_budget = done if budget.isna().all() else done[budget.isna() | (budget == budget.min())]
    seeded = cell_table(grid_budget, metric)
    verdicts = zip(judge(before, metric, max_steps=max_trained_steps(first)),
                   judge(seeded, metric, max_steps=max_trained_steps(grid_budget)),
                   judge(after, metric, max_steps=max_trained_steps(done)), strict=True)
    for old, at_grid, new in verdicts:
        moved = "" if old["verdict"] == new["verdict"] else " (changed)"
        lines.append(f"| {new['claim']} | {old['verdict']} | {at_grid['verdict']}: {at_grid['evidence']} | "
                     f"**{new['verdict']}**{moved}: {new['evidence']} |")
    keys = ["task", "series", "seq_len"]
    old_cells = {tuple(r[k] for k in keys): r for _, r in before.iterrows()}
    rows = []
    for _, cell in after.iterrows():
        old = old_cells.get(tuple(cell[k] for k in keys))
        if old is not None and abs(cell[metric] - old[metric]) <= SLACK and old["lr"] == cell["lr"] \
                and _steps_text(old["steps_to_0.9"]) == _steps_text(cell["steps_to_0.9"]):
            continue
        steps = " and ".join(_n(b) for b in cell["budgets"]) or MISSING
        rows.append(f"| {cell['task']} | {cell['series']} | {cell['seq_len']} | {_cell_text(old, metric)} "
                    f"| {_cell_text(cell, metric)} | {steps} |")
    lines += ["", f"Cells that moved ({METRICS[metric]} by more than {SLACK}, steps to 0.9 or best lr; "
              "the mean over the runs at the cell's best lr, their range in brackets):", ""]
    head = ["| task | mixer | L | first runs | all runs | steps |", "|---|---|---:|---|---|---:|"]
    lines += [*head, *rows, ""] if rows else ["None.", ""]
    return lines + _seeds_elsewhere(done[seed != seed.min()], after)


def _seeds_elsewhere(extra: pd.DataFrame, cells: pd.DataFrame) -> list[str]:
    """A line naming the further seeds that ran at an lr other than their cell's (which a cell's mean
    leaves out: planned before the cell's best lr moved), if any."""
    if extra.empty or cells.empty:
        return []
    lr_of = {(r["task"], r["series"], int(r["seq_len"])): r["lr"] for _, r in cells.iterrows()}
    series = _series(extra)
    away = sorted({f"{t} {s} {int(n)} (lr {float(lr):g}, the cell's {lr_of[(t, s, int(n))]:g})"
                   for t, s, n, lr in zip(extra["task"], series, extra["seq_len"], extra["lr"], strict=True)
                   if (t, s, int(n)) in lr_of and not math.isclose(float(lr), lr_of[(t, s, int(n))])})
    if not away:
        return []
    return [f"Further seeds at an lr that is not their cell's, so in no mean above: {'; '.join(away)}.", ""]


def _timed_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs whose wall time counts (completed or diverged, after a step), with `series` and `device`
    as the kind of device they trained on (GPU, CPU, unknown)."""
    done = runs[runs["status"].isin(["completed", "diverged"])].copy()
    done = done[pd.to_numeric(done["steps"], errors="coerce") > 0]
    if done.empty:
        return done
    done["series"] = _series(done)
    none = pd.Series(None, index=done.index, dtype=object)
    done["device"] = [device_kind(d, c) for d, c in
                      zip(done.get("device", none), done.get("trainer.device", none), strict=True)]
    return done


GPU_NOT_RECORDED = "not recorded"


def gpu_models(runs: pd.DataFrame) -> dict[str, int]:
    """Finished GPU runs per GPU model their summary names (`gpu.name`; runs that predate the field:
    GPU_NOT_RECORDED), most first: a grid filled over sessions may have trained on more than one kind."""
    done = _timed_runs(runs)
    if done.empty:
        return {}
    done = done[done["device"] == "GPU"]
    names = done.get("gpu.name", pd.Series(None, index=done.index, dtype=object))
    counts = names.fillna(GPU_NOT_RECORDED).astype(str).value_counts()
    return {str(name): int(count) for name, count in counts.items()}


def cost(runs: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """Wall seconds per step by (mixer, length, device kind) from finished runs, hours spent per device kind,
    and from the GPU runs the projected cost of the paper's grid: 3 tasks x 12 runs per (mixer, length) x
    20,000 steps each (`paper_grid_gpu_h`, absent when no run trained on a GPU)."""
    done = _timed_runs(runs)
    if done.empty:
        return pd.DataFrame(columns=["series", "seq_len", "device", "runs", "wall_s", "s_per_step"]), {}
    per = (
        done.groupby(["series", "seq_len", "device"])
        .agg(runs=("wall_time_s", "size"), wall_s=("wall_time_s", "sum"), steps=("steps", "sum"))
        .reset_index()
    )
    per["s_per_step"] = per["wall_s"] / per["steps"]
    totals = {f"spent_{kind.lower()}_h": float(done.loc[done["device"] == kind, "wall_time_s"].sum()) / 3600
              for kind in DEVICE_KINDS}
    totals.update({f"{kind.lower()}_runs": float((done["device"] == kind).sum()) for kind in DEVICE_KINDS})
    paper = per[per["series"].isin(MIXERS) & (per["device"] == "GPU")]
    totals["paper_grid_cells_measured"] = float(len(paper))
    totals["paper_grid_cells"] = float(len(MIXERS) * len(PAPER_LENGTHS))
    if paper.empty:
        return per, totals
    # a cell not measured yet costs its mixer's nearest measured length scaled by length (the step's work
    # is linear in T for the linear mixers; a mixer with no cell at all is left out)
    projected = 0.0
    for _, rows in paper.groupby("series"):
        measured = dict(zip(rows["seq_len"].astype(int), rows["s_per_step"], strict=True))
        for length in PAPER_LENGTHS:
            near = min(measured, key=lambda m: abs(m - length))
            per_step = measured.get(length, measured[near] * length / near)
            projected += per_step * 3 * PAPER_RUNS_PER_CELL * PAPER_STEPS
    totals["paper_grid_gpu_h"] = projected / 3600
    return per, totals


def cell_minutes(runs: pd.DataFrame) -> pd.DataFrame:
    """GPU-minutes per cell: (task, L) rows, one column per series, the wall time of every finished run
    of the cell on a GPU summed (all its lrs, seeds and budgets); empty where none ran on a GPU."""
    done = _timed_runs(runs)
    done = done[done["device"] == "GPU"].copy() if len(done) else done
    if done.empty:
        return pd.DataFrame()
    done["minutes"] = pd.to_numeric(done["wall_time_s"], errors="coerce") / 60
    table = done.pivot_table(index=["task", "seq_len"], columns="series", values="minutes", aggfunc="sum")
    order = {mixer: i for i, mixer in enumerate(MIXERS)}
    return table[sorted(table.columns, key=lambda c: (order.get(c.split(" ")[0], len(order)), c))]


def render(runs: pd.DataFrame, metric: str, source: str) -> str:
    all_runs = runs
    runs, waiting = point_runs(runs, METRICS[metric])
    superseded = len(all_runs) - len(runs) - len(waiting)
    cells = cell_table(runs, metric)
    budget = budget_table(cells)
    learning = {(r["task"], r["series"], r["seq_len"]) for _, r in budget.iterrows() if r["still_learning"]}
    verdicts = judge(cells, metric, max_steps=max_trained_steps(runs), learning=learning)
    counts = all_runs["status"].value_counts().to_dict() if "status" in all_runs else {}
    lines = [
        f"# Kimi Linear Fig. 4 on this harness: {source}",
        "",
        f"Runs: {len(all_runs)} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items())) or 'none'}"
        + (f"; {superseded} superseded by a longer run of its cell, lr and seed, counted only in the compute "
           "time" if superseded else "")
        + (f"; {len(waiting)} left out of their cell's point until trained as long as its other seeds there "
           "(below)" if len(waiting) else "") + "). "
        f"Claims judged on the {'paper' if metric == 'train' else 'held-out'} metric "
        f"(`{METRICS[metric]}`, best over the learning rates). The open parameters (vocabularies, batch, "
        "pairs, optimizer, warm-up, Mamba2's short conv) are this harness's choices: conf/task/*.yaml, "
        "conf/experiment/kimi_fig4.yaml, docs/sweeps.md.",
        "",
        "## The claims",
        "",
        "| claim | verdict | evidence |",
        "|---|---|---|",
    ]
    lines += [f"| {v['claim']} | **{v['verdict']}** | {v['evidence']} |" for v in verdicts]
    lines += [
        "",
        "## Cells (best lr per cell)",
        "",
        "Steps to 0.9: the first eval at or above 0.9; with several runs at the best lr (seeds, repeats), "
        "their median, each run's in brackets. Runs: those at the cell's best lr; the other lrs run follow "
        "it.",
        "",
        "| task | mixer | L | peak train acc | best eval acc | eval acc at 2L | lr | steps to 0.9 | runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _, c in cells.iterrows():
        steps = "never" if pd.isna(c["steps_to_0.9"]) else int(c["steps_to_0.9"])
        if len(c["steps_all"]) > 1:
            steps = f"{steps} ({', '.join(_steps_text(v) for v in c['steps_all'])})"
        others = tuple(lr for lr in c["lrs"] if lr != c["lr"])
        lr = f"{c['lr']:g}" + (f" (also {_lrs(others)})" if others else "")
        lines.append(
            f"| {c['task']} | {c['series']} | {c['seq_len']} | {_with_range(c, 'train')} | "
            f"{_with_range(c, 'eval')} | {_fmt(c['eval@2L'], '.3f')} | {lr} | {steps} | {c['runs']} |"
        )
    if cells.empty:
        lines.append("| (no finished run yet) | | | | | | | | |")
    lines += waiting_runs(waiting, metric)
    # seeds are set apart on every seed, a point's left-out ones too: how a seed failed is the question there
    every = longest_budget(all_runs)
    seed_view = (every, cell_table(every, metric)) if len(waiting) else None
    lines += ["", *differences(runs, cells, metric, verdicts, budget, seed_view),
              *what_changed(all_runs, metric)]
    per, totals = cost(all_runs)
    lines += ["## Compute time", ""]
    if totals:
        where = {"GPU": "on GPUs", "CPU": "on the CPU", "unknown": "on a device not recorded"}
        spent = []
        for kind in DEVICE_KINDS:
            hours, count = totals[f"spent_{kind.lower()}_h"], int(totals[f"{kind.lower()}_runs"])
            if count:
                spent.append(f"{hours:.2f} {kind}-hours ({count} runs {where[kind]})")
        lines += [f"Spent over the finished runs: {', '.join(spent)}; each run's wall time, so runs packed n "
                  "to a device count it n times over.", ""]
        models = gpu_models(all_runs)
        if models:
            named = [f"{name} {count}" for name, count in models.items()]
            mixed = sum(name != GPU_NOT_RECORDED for name in models) > 1
            lines += [f"GPU runs by the GPU their summary records: {', '.join(named)}"
                      + ("; the seconds per step below mix these GPUs." if mixed else "."), ""]
        if "paper_grid_gpu_h" in totals:
            hours = totals["paper_grid_gpu_h"]
            measured, needed = int(totals["paper_grid_cells_measured"]), int(totals["paper_grid_cells"])
            lines.append(
                f"The paper's whole grid (432 runs x 20,000 steps) at these GPU runs' speeds: "
                f"**{hours:.0f} GPU-hours on one GPU, {hours / 8:.0f} hours on a cluster of 8** (runs one "
                f"at a time per GPU; {measured} of {needed} mixer x length cells measured on a GPU, the "
                "others scaled by length from the nearest measured one; for a packed sweep these are upper "
                "bounds).")
        else:
            lines.append("No finished run of KDA, GDN or Mamba2 trained on a GPU, so the paper's grid (432 "
                         "runs x 20,000 steps) is not projected: seconds per step on a CPU say nothing about "
                         "a GPU's.")
        lines += [
            "",
            "| mixer | L | device | runs | wall s | s/step |",
            "|---|---:|---|---:|---:|---:|",
        ]
        lines += [
            f"| {r['series']} | {int(r['seq_len'])} | {r['device']} | {r['runs']} | {r['wall_s']:.0f} | "
            f"{r['s_per_step']:.4f} |"
            for _, r in per.iterrows()
        ]
        minutes = cell_minutes(all_runs)
        if not minutes.empty:
            lines += ["", "GPU-minutes per cell: every finished run of it on a GPU (all its lrs, seeds and "
                      "budgets), each run's wall time.", "",
                      "| task | L | " + " | ".join(minutes.columns) + " |",
                      "|---|---:|" + "---:|" * len(minutes.columns)]
            lines += [f"| {task} | {int(length)} | " + " | ".join(_fmt(v, ".1f") for v in row) + " |"
                      for (task, length), row in minutes.iterrows()]
    else:
        lines.append("No finished run yet.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="sweep directories or a collected table")
    parser.add_argument("--out", type=Path, required=True, help="the report's markdown file")
    parser.add_argument(
        "--metric",
        choices=list(METRICS),
        default="train",
        help="judge the claims on the paper's peak training accuracy or on held-out eval",
    )
    args = parser.parse_args(argv)
    for path in args.inputs:
        if not path.exists():
            parser.error(f"{path} does not exist: give sweep directories or a table from analysis.collect")
    tables = [read_table(p) if p.is_file() else collect_dirs([p]) for p in args.inputs]
    runs = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if "best_train_acc" not in runs:
        runs["best_train_acc"] = float("nan")
    text = render(runs, args.metric, ", ".join(str(p) for p in args.inputs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
