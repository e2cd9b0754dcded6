"""The cells a sweep is meant to fill, from its experiments' sweeper params (conf/experiment/<name>.yaml):
the figures mark a cell without a finished run as not yet run, never as an accuracy.

A cell is (task, series, length), a point of the figures over every learning rate and seed. Finished: a
completed, diverged or failed run at any learning rate; a run cut off (incomplete) is trained again, so its
cell counts as not yet run.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from analysis.cells import NOT_RUN, SCORED, UNSCORED, series_name
from analysis.collect import variant_of
from mixers.pattern import pattern_name

CONF = Path(__file__).resolve().parents[1] / "conf"
COLUMNS = ["task", "series", "mixer", "variant", "seq_len"]
# the sweep keys a cell collapses: its points over these are one cell
_OVER = ("optim.lr", "seed")


def sweeper_params(experiment: str, conf_dir: Path = CONF) -> dict[str, list[str]]:
    """key -> the values the experiment's hydra.sweeper.params sweeps, spelt as Hydra's basic sweeper
    spells them in a run's overrides."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    import harness.config  # noqa: F401  (stores `base_config`, which conf/config.yaml names)

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params or {}
    parser = OverridesParser.create()
    swept = {}
    for key, value in params.items():
        override = parser.parse_overrides([f"{key}={value}"])[0]
        swept[str(key)] = (list(override.sweep_string_iterator()) if override.is_sweep_override()
                           else [override.get_value_element_as_str()])
    return swept


def _pattern_of(experiment: str, overrides: tuple[str, ...], conf_dir: Path) -> str | None:
    """The name of the model.pattern the experiment composes with `overrides` (None: a single-mixer model)."""
    from hydra import compose, initialize_config_dir

    import harness.config  # noqa: F401  (stores `base_config`, which conf/config.yaml names)

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}", *overrides])
    pattern = cfg.model.get("pattern")
    return None if pattern is None else pattern_name(list(pattern))


def grid_cells(experiments: list[str], conf_dir: Path = CONF) -> pd.DataFrame:
    """The cells of the experiments' sweeps together (COLUMNS), one row each. A hybrid cell's mixer is its
    pattern's name, as analysis.collect names its runs (`kda:attention 3:1`)."""
    rows = set()
    for experiment in experiments:
        swept = sweeper_params(experiment, conf_dir)
        missing = {"task", "mixer", "task.seq_len"} - set(swept)
        if missing:
            raise ValueError(f"--grid {experiment}: its hydra.sweeper.params lack {sorted(missing)}, so its "
                             "cells (task x mixer x length) are unknown")
        others = [k for k in swept if k not in ("task", "mixer", "task.seq_len", *_OVER)]
        # the keys that can set model.pattern: itself and the config groups (experiment/hybrid=kda3_attn1);
        # the experiment is composed once per distinct choice of them
        shaping = [k for k in others if k == "model.pattern" or "/" in k]
        patterns: dict[tuple[str, ...], str | None] = {}
        for task, mixer, length, *rest in itertools.product(
                swept["task"], swept["mixer"], swept["task.seq_len"], *(swept[k] for k in others)):
            chosen = dict(zip(others, rest, strict=True))
            variant = variant_of(f"{k}={v}" for k, v in chosen.items())
            key = tuple(f"{k}={chosen[k]}" for k in shaping)
            if key not in patterns:
                patterns[key] = _pattern_of(experiment, key, conf_dir)
            name = patterns[key] or mixer
            rows.add((task, series_name(name, variant), name, variant, int(float(length))))
    return pd.DataFrame(sorted(rows), columns=COLUMNS)


def not_run(grid: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The grid's cells with no finished run in `table` (COLUMNS + status NOT_RUN). Series match without
    regard to case (a boolean override reads `false` in a hand-written override, `False` as the sweeper
    spells it), and take the runs' spelling where a run has one, so that a figure names a series once."""
    runs = table.assign(variant=table["variant"].fillna("") if "variant" in table else "")
    runs = runs.assign(series=[series_name(str(m), str(v)) for m, v in zip(runs["mixer"], runs["variant"],
                                                                          strict=True)])
    spelling = {s.lower(): (s, v) for s, v in zip(runs["series"], runs["variant"], strict=True)}
    grid = grid.copy()
    for index, series in grid["series"].items():
        if series.lower() in spelling:
            grid.loc[index, ["series", "variant"]] = spelling[series.lower()]
    finished = runs[runs["status"].isin((*SCORED, *UNSCORED))]
    done = set(zip(finished["task"].astype(str), finished["series"], finished["seq_len"].astype(int),
                   strict=True))
    keep = [(t, s, int(n)) not in done for t, s, n in zip(grid["task"], grid["series"], grid["seq_len"],
                                                          strict=True)]
    return grid[keep].assign(status=NOT_RUN).reset_index(drop=True)


def fill_note(grid: pd.DataFrame, pending: pd.DataFrame, length: int | None = None) -> str:
    """'5 of 48 cells run' (at `length`: 'n of m cells at L = ... run; 5 of 48 in the grid')."""
    whole = f"{len(grid) - len(pending)} of {len(grid)} cells run"
    if length is None:
        return whole
    at, left = grid[grid["seq_len"] == length], pending[pending["seq_len"] == length]
    whole = whole.removesuffix(" run")
    return f"{len(at) - len(left)} of {len(at)} cells at L = {length:,} run ({whole} in the grid)"
