"""Which learning rate stands for a cell: one rule for the figures (analysis.cells), the report
(analysis.report) and the plans that add seeds or steps to a cell (tools/campaign.py). Standard library
only: the campaign imports it on a bare machine."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

# Mean accuracies (fractions) this close are one accuracy: two lrs that both solve a task peak at 0.99998
# and 0.99997, and which is higher says nothing. The steps to the threshold decide between them instead
# (Kimi Linear's claim 2 compares exactly those steps), then the higher mean, then the smaller lr.
TIE = 0.005


def median_steps(steps: Iterable[float | None]) -> float:
    """The median of runs' steps to the threshold, a run that never got there (None, NaN or inf) counted
    as the slowest; NaN where the median run never got there, or there are no runs."""
    values = sorted(math.inf if s is None or s != s else float(s) for s in steps)
    if not values:
        return math.nan
    half = len(values) // 2
    middle = values[half] if len(values) % 2 else (values[half - 1] + values[half]) / 2
    return math.nan if math.isinf(middle) else middle


def pick_lr(scores: Mapping[float, tuple[float, float | None]]) -> float:
    """The lr of `scores` ({lr: (mean accuracy as a fraction, median steps to the threshold or NaN)}) that
    stands for the cell: the highest mean; among the lrs within TIE of it, the fewest steps to the
    threshold (never reaching it counts as the most), then the higher mean, then the smaller lr. Lrs whose
    mean is NaN (no run with the metric) are left out; ValueError where none is left."""
    scored = {lr: (mean, steps) for lr, (mean, steps) in scores.items() if mean == mean}
    if not scored:
        raise ValueError("no learning rate with a mean accuracy to pick from")
    top = max(mean for mean, _ in scored.values())

    def order(lr: float) -> tuple[float, float, float]:
        mean, steps = scored[lr]
        return (math.inf if steps is None or steps != steps else steps, -mean, lr)

    return min((lr for lr, (mean, _) in scored.items() if mean >= top - TIE), key=order)


def shared_seeds(seeds_by_lr: Mapping[Any, set[Any]]) -> set[Any]:
    """The seeds every lr of a cell ran; empty where there is none (or a run's seed is unknown)."""
    sets = list(seeds_by_lr.values())
    if not sets or any(None in seeds for seeds in sets):
        return set()
    return set.intersection(*sets)


def cell_lr(runs: Iterable[tuple[Any, float | None, float | None, Any]]) -> tuple[Any, float] | None:
    """(the lr pick_lr takes, the mean accuracy there over all its runs) from a cell's runs as (lr,
    accuracy as a fraction, steps to the threshold or None / NaN, seed or None); None where no run has an
    accuracy. The lrs are compared on the seeds they all ran: further seeds go to the picked lr only, and
    counting them there but not at the others would let one seed's luck move the pick (a second seed that
    fails halves its lr's mean against a single run elsewhere). Where no seed is shared, on all runs."""
    by_lr: dict[Any, list[tuple[float, float | None, Any]]] = {}
    for lr, acc, steps, seed in runs:
        if acc is not None and acc == acc:
            by_lr.setdefault(lr, []).append((acc, steps, seed))
    if not by_lr:
        return None
    common = shared_seeds({lr: {seed for _, _, seed in group} for lr, group in by_lr.items()})

    def score(group: list[tuple[float, float | None, Any]]) -> tuple[float, float]:
        return (math.fsum(acc for acc, _, _ in group) / len(group), median_steps(s for _, s, _ in group))

    compared = {lr: [run for run in group if not common or run[2] in common] for lr, group in by_lr.items()}
    lr = pick_lr({lr: score(group) for lr, group in compared.items()})
    return lr, score(by_lr[lr])[0]
