"""analysis.plot's figures as a reader sees them: every figure rendered from a Fig. 4-shaped fixture,
no text outside the canvas, no label over another, failed and diverged runs marked as such (never
as accuracy 0), bands only where two or more seeds were measured, lines only between measured points."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.text import Text

from analysis import collect, draw, fig_steps, grid, plot
from analysis.colours import mixer_colour

# Under `pytest -n`: one worker runs this file, so its module fixtures draw each figure once.
pytestmark = pytest.mark.xdist_group("figures")

TASKS = ["palindrome", "mqar", "stack"]
LENGTHS = [256, 512, 1024, 2048]
MIXERS = ["kda", "gdn", "mamba2", "attention"]
LRS = [5e-4, 1e-3]
# Recurrent mixers keep the same state at every length (KDA and GDN even the same size); attention's
# KV cache grows with it: the state-size figure must keep coinciding points and their labels apart.
STATE = {"kda": 65536, "gdn": 65536, "mamba2": 16384}


def _status(task: str, mixer: str, length: int, lr: float, seed: int) -> str:
    if mixer == "attention" and task == "mqar":
        return "diverged"  # every attention run on MQAR: the figures must not read "attention scores 0"
    if (task, mixer, length, lr) == ("palindrome", "mamba2", 2048, 1e-3):
        return "failed"
    if (task, mixer, length, lr, seed) == ("palindrome", "gdn", 1024, 1e-3, 1):
        return "diverged"
    if (task, mixer, length) == ("stack", "gdn", 512):
        return "diverged"  # no completed GDN run at 512: its Stack line must break there
    return "completed"


def _seeds(task: str, mixer: str) -> list[int]:
    return [0] if task == "stack" or mixer == "attention" else [0, 1]


def _eval_steps(task: str) -> list[int]:
    # Stack evaluates twice only: its curve must show two measured points, not a line "with data between".
    return [500, 1000] if task == "stack" else list(range(100, 1001, 100))


def _acc(task: str, mixer: str, length: int, lr: float, seed: int, step: int) -> float:
    ceiling = {"kda": 0.97, "gdn": 0.9, "mamba2": 0.6, "attention": 0.99}[mixer]
    # On Stack accuracy barely falls with length: the labels of a recurrent mixer's points (one state size
    # at every length) crowd together there.
    per_doubling = 0.015 if task == "stack" else 0.12
    ceiling -= per_doubling * math.log2(length / 256) * (mixer != "attention")
    ceiling -= 0.05 * (lr == 5e-4) + 0.02 * seed
    ceiling -= {"palindrome": 0.0, "mqar": 0.05, "stack": 0.1}[task]
    return float(np.clip(ceiling * (1 - math.exp(-step / 250)), 0, 1))


def _write_run(root: Path, task: str, mixer: str, length: int, lr: float, seed: int, status: str,
               steps: list[int], extra_overrides: tuple[str, ...] = (), extra: dict | None = None) -> None:
    """A run directory as train.py leaves it: .hydra/, metrics.jsonl (an eval at each of `steps`; a
    diverged run stops half way), summary.json (`extra`: more of its fields, e.g. the config it records)."""
    overrides = [f"task={task}", f"mixer={mixer}", f"task.seq_len={length}", f"optim.lr={lr}", f"seed={seed}",
                 *extra_overrides]
    run_dir = root / "/".join(sorted(overrides))
    (run_dir / ".hydra").mkdir(parents=True)
    config = {"task": {"name": task, "seq_len": length}, "mixer": {"_target_": f"mixers.{mixer}.Mixer"},
              "optim": {"lr": lr}, "seed": seed}
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    hydra = {"hydra": {"runtime": {"choices": {"task": task, "mixer": mixer}},
                       "job": {"override_dirname": ",".join(sorted(overrides)), "id": None, "num": 0}}}
    (run_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    (run_dir / "train.log").write_text("")
    if status == "diverged":
        steps = steps[: len(steps) // 2]
    accs = [_acc(task, mixer, length, lr, seed, s) for s in steps]
    with (run_dir / "metrics.jsonl").open("w") as handle:
        for step, acc in zip(steps, accs, strict=True):
            handle.write(json.dumps({"step": step, "train/loss": 1.0, "train/acc": acc, "lr": lr,
                                     "time_s": step / 10, "eval/acc": acc, "eval/seq_acc": acc**4}) + "\n")
    reached = [s for s, a in zip(steps, accs, strict=True) if a >= 0.9]
    summary = {
        "status": status, "best_eval_acc": max(accs), "final_eval_acc": accs[-1],
        "steps": steps[-1] + (37 if status == "diverged" else 0), "steps_to_threshold": reached[0] if reached
        else None, "state_size": STATE.get(mixer, 2 * 2 * length * 128), "task": task, "mixer": mixer,
        "seq_len": length, "lr": lr, "seed": seed,
    }
    if status == "failed":
        summary.update(best_eval_acc=None, final_eval_acc=None, steps=0, state_size=None,
                       error="RuntimeError: CUDA out of memory")
    if status == "diverged":
        summary["error"] = "loss became non-finite at step 537 (lr 0.001)"
    summary.update(extra or {})
    (run_dir / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(scope="module")
def fig4_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fig4")
    for task, mixer, length, lr in itertools.product(TASKS, MIXERS, LENGTHS, LRS):
        for seed in _seeds(task, mixer):
            _write_run(root, task, mixer, length, lr, seed, _status(task, mixer, length, lr, seed),
                       _eval_steps(task))
    return root


@pytest.fixture(scope="module")
def smoke_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shaped like the smoke sweep: one task at one length (one panel), attention diverged, and a failed
    run whose extra override makes it a series with a long name."""
    root = tmp_path_factory.mktemp("smoke")
    steps = [50, 100, 150, 200]
    for mixer, lr in itertools.product(["kda", "gdn"], [3e-3, 1e-2]):
        _write_run(root, "mqar", mixer, 32, lr, 0, "completed", steps)
    _write_run(root, "mqar", "attention", 32, 1e4, 0, "diverged", steps)
    _write_run(root, "mqar", "kda", 32, 3e-3, 0, "failed", steps, ("task.params.num_pairs=20",))
    return root


def _drawn_texts(fig: Figure) -> list[Text]:
    """The text artists a render draws: visible, non-empty, tick labels only of the ticks in view."""
    fig.canvas.draw()
    ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            # private, but the only list of the ticks a draw actually renders
            for tick in axis._update_ticks():
                ticks.update((tick.label1, tick.label2))
    texts = []
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip():
            continue
        is_tick_label = any(text is t.label1 or text is t.label2 for ax in fig.axes
                            for axis in (ax.xaxis, ax.yaxis)
                            for t in axis.get_major_ticks() + axis.get_minor_ticks())
        if is_tick_label and text not in ticks:
            continue
        texts.append(text)
    return texts


def text_problems(fig: Figure) -> list[str]:
    """Texts that leave the canvas, and pairs of texts whose boxes overlap (by more than a pixel)."""
    renderer = fig.canvas.get_renderer()
    texts = _drawn_texts(fig)
    # Text's own extent: an annotation's would include its leader line
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts]
    canvas = fig.bbox
    problems = [
        f"{name!r} leaves the canvas: {box.extents.round(1)} not within {canvas.extents.round(1)}"
        for name, box in boxes
        if box.x0 < canvas.x0 - 0.5 or box.y0 < canvas.y0 - 0.5 or box.x1 > canvas.x1 + 0.5
        or box.y1 > canvas.y1 + 0.5
    ]
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        width = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        height = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        if width > 1 and height > 1:
            problems.append(f"{a!r} overlaps {b!r}")
    return problems


def _describe(fig: Figure) -> dict[str, object]:
    """What a figure draws, as the tests check it."""
    return {
        "problems": text_problems(fig),
        "texts": [t.get_text() for t in _drawn_texts(fig)],
        "lines": [{"panel": ax.get_title(), "label": line.get_label(), "xy": line.get_xydata().copy(),
                   "marker": line.get_marker(), "colour": line.get_color(),
                   "open": str(line.get_markerfacecolor()) == "none"}
                  for ax in fig.axes for line in ax.get_lines()],
        "bands": [(ax.get_title(), len(c.get_paths())) for ax in fig.axes for c in ax.collections
                  if isinstance(c, PolyCollection)],
        "legends": [t.get_text() for legend in fig.legends + [ax.get_legend() for ax in fig.axes]
                    if legend is not None for t in legend.get_texts()],
        "x_axes": [{"panel": ax.get_title(), "limits": ax.get_xlim(),
                    "ticks": [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]}
                   for ax in fig.axes if ax.get_title()],
    }


def _render(sweep: Path, out: Path, *args: str) -> dict[str, object]:
    """plot.main on `sweep`, with every figure checked and described as it is saved."""
    figures: dict[str, object] = {"out": out}
    save = draw.save_figure

    def checked_save(fig: Figure, data: pd.DataFrame, out_dir: Path, name: str) -> list[Path]:
        figures[name] = _describe(fig)
        return save(fig, data, out_dir, name)

    mp = pytest.MonkeyPatch()
    mp.setattr(draw, "save_figure", checked_save)
    try:
        assert plot.main([str(sweep), "--out", str(out), *args]) == 0
    finally:
        mp.undo()
    return figures


@pytest.fixture(scope="module")
def rendered(fig4_sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    return _render(fig4_sweep, tmp_path_factory.mktemp("figs"), "--length", "1024")


@pytest.fixture(scope="module")
def rendered_committed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The Fig. 4 issue's committed run files (tests/fixtures/fig4_h200): state sizes within a decade."""
    return _render(Path(__file__).parent / "fixtures" / "fig4_h200", tmp_path_factory.mktemp("committed"))


@pytest.fixture(scope="module")
def rendered_smoke(smoke_sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    return _render(smoke_sweep, tmp_path_factory.mktemp("smoke_figs"))


NAMES = ["acc_vs_length", "acc_vs_steps_len1024", "lr_sensitivity", "acc_vs_state_size"]


@pytest.mark.parametrize("name", NAMES)
def test_every_text_inside_the_canvas_and_none_over_another(rendered: dict, name: str) -> None:
    assert rendered[name]["problems"] == []
    assert (rendered["out"] / f"{name}.png").stat().st_size > 0


def test_the_committed_fig4_fixture_renders_cleanly(rendered_committed: dict) -> None:
    # a state-size axis of about one decade: matplotlib's own minor-tick labels ran into each other there
    figures = {k: v for k, v in rendered_committed.items() if k != "out"}
    # its runs were evaluated at 2L too: the length-generalisation figure is the fifth
    assert "length_generalisation" in figures
    assert len(figures) == 5 and all(figure["problems"] == [] for figure in figures.values()), {
        name: figure["problems"] for name, figure in figures.items()}


SMOKE_NAMES = ["acc_vs_length", "acc_vs_steps_len32", "lr_sensitivity", "acc_vs_state_size"]


@pytest.mark.parametrize("name", SMOKE_NAMES)
def test_one_panel_figures_keep_their_texts_inside_too(rendered_smoke: dict, name: str) -> None:
    # one panel beside a legend of long series names: the case that squeezed the panel before
    assert rendered_smoke[name]["problems"] == []
    if name == "lr_sensitivity":
        assert {"1 div.", "1 fail"} <= set(rendered_smoke[name]["texts"])
    else:
        legends = rendered_smoke[name]["legends"]
        assert "attention (no completed run)" in legends and "diverged (not scored)" in legends


def test_the_overlap_check_can_fail() -> None:
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.text(0.5, 0.5, "one label")
    ax.text(0.52, 0.5, "another label")
    ax.set_ylabel("a y label far too long to fit into a figure of two inches " * 2)
    problems = text_problems(fig)
    plt.close(fig)
    assert any("overlaps" in p for p in problems) and any("leaves the canvas" in p for p in problems)


@pytest.mark.parametrize("name", ["acc_vs_length", "acc_vs_steps_len1024", "acc_vs_state_size"])
def test_diverged_and_failed_runs_are_marked_never_accuracy_zero(rendered: dict, name: str) -> None:
    lines = rendered[name]["lines"]
    # Every attention run on MQAR diverged: in that panel its only marks are crosses in the strip below 0 %.
    attention = [line for line in lines
                 if line["panel"].startswith("mqar") and line["colour"] == mixer_colour("attention")]
    assert attention, "the diverged attention runs are not drawn at all"
    for line in attention:
        assert line["marker"] == draw.STATUS_MARKERS["diverged"] and (line["xy"][:, 1] < -5).all()
    # and no status marker anywhere sits on the accuracy scale
    for line in lines:
        if line["marker"] in draw.STATUS_MARKERS.values():
            assert (line["xy"][:, 1] < -5).all(), line
    legends = rendered[name]["legends"]
    assert "diverged (not scored)" in legends
    # the failed runs (palindrome, mamba2, 2048, no state size) are in the length figure only
    assert ("failed (not scored)" in legends) == (name == "acc_vs_length")
    if name == "acc_vs_steps_len1024":  # a legend per panel: MQAR's names attention, which has no line
        assert "attention (no completed run)" in legends


def test_summary_counts_what_was_not_scored_and_shows_n(rendered: dict, fig4_sweep: Path) -> None:
    summary = (rendered["out"] / "summary.md").read_text()
    table = collect.collect_dirs([fig4_sweep])
    counts = table["status"].value_counts()
    assert (f"{len(table)} runs: {counts['completed']} completed, {counts['diverged']} diverged, "
            f"{counts['failed']} failed, 0 incomplete.") in summary
    mqar = summary.split("## mqar")[1].split("##")[0]
    attention_row = [line for line in mqar.splitlines() if line.startswith("| attention |")][0]
    # 2 lrs x 1 seed, all diverged, at every length: counted, no accuracy
    assert attention_row.count("– (2 diverged)") == len(LENGTHS)
    palindrome = summary.split("## palindrome")[1].split("##")[0]
    gdn = [line for line in palindrome.splitlines() if line.startswith("| gdn |")][0]
    assert "; 1 diverged" in gdn  # seed 1 at lr 1e-3, length 1024
    mamba2 = [line for line in palindrome.splitlines() if line.startswith("| mamba2 |")][0]
    assert mamba2.rstrip(" |").endswith("; 2 failed")  # both seeds at lr 1e-3, length 2048
    stack = summary.split("## stack")[1]
    # one seed: n=1 and no "± 0.0"
    assert "(n=1, lr" in stack and "± 0.0" not in stack
    assert "± " in palindrome and "(n=2, lr" in palindrome
    csv = pd.read_csv(rendered["out"] / "acc_vs_length.csv")
    attention = csv[(csv["task"] == "mqar") & (csv["mixer"] == "attention")]
    assert len(attention) == len(LENGTHS) and attention["acc_mean"].isna().all()
    assert (attention["n_diverged"] == 2).all() and (attention["n_seeds"] == 0).all()


def test_bands_only_where_two_seeds(rendered: dict) -> None:
    # Stack and attention have one seed per cell: no band (and no "± 0"); the others two, so a band each.
    # At 1024 one of GDN's two Palindrome seeds diverged: one seed left, so no band in the steps figure.
    for name, banded in (("acc_vs_length", 3), ("acc_vs_steps_len1024", 2)):
        bands = rendered[name]["bands"]
        assert bands and all(paths == 0 for panel, paths in bands if panel.startswith("stack"))
        palindrome = [paths for panel, paths in bands if panel.startswith("palindrome")]
        assert sum(paths > 0 for paths in palindrome) == banded
    # n in the legends: a range where it differs between cells
    legends = rendered["acc_vs_length"]["legends"]
    assert "kda (n=1-2)" in legends and "attention (n=1)" in legends
    assert "kda (n=2), lr 0.001" in rendered["acc_vs_steps_len1024"]["legends"]


def test_lines_join_measured_points_only(rendered: dict) -> None:
    # Stack evaluates twice: two points, each with a marker, and so every curve of the steps figure.
    steps = pd.read_csv(rendered["out"] / "acc_vs_steps_len1024.csv")
    assert steps[steps["task"] == "stack"].groupby("series").size().eq(2).all()
    curves = [line for line in rendered["acc_vs_steps_len1024"]["lines"]
              if line["marker"] not in draw.STATUS_MARKERS.values() and not line["label"].startswith("_")]
    assert len(curves) == 3 * len(MIXERS) - 1
    assert all(line["marker"] not in ("None", "", None) for line in curves)
    stack = [line for line in curves if line["panel"].startswith("stack")]
    assert stack and all(len(line["xy"]) == 2 for line in stack)
    # GDN has no completed run on Stack at 512: its line breaks there instead of bridging 256 to 1024.
    gdn = [line for line in rendered["acc_vs_length"]["lines"]
           if line["panel"] == "stack" and line["label"] == "gdn"][0]
    np.testing.assert_allclose(gdn["xy"][:, 0], LENGTHS, rtol=0.1)  # dodged around each length
    assert np.isnan(gdn["xy"][1, 1]) and not np.isnan(gdn["xy"][[0, 2, 3], 1]).any()


@pytest.mark.parametrize("name", ["acc_vs_length", "length_generalisation"])
def test_series_at_one_length_are_drawn_side_by_side(rendered_committed: dict, name: str) -> None:
    # two series at the same accuracy and length must not hide one another: each series' markers sit a
    # little to its own side of the length (the CSV keeps the true length)
    lines = [line for line in rendered_committed[name]["lines"]
             if line["marker"] not in draw.STATUS_MARKERS.values() and not line["label"].startswith("_")]
    for panel in {line["panel"] for line in lines}:
        xs = {}
        for line in lines:
            if line["panel"] == panel:
                xs.setdefault(line["colour"], set()).update(np.round(line["xy"][:, 0], 6))
        assert len(xs) >= 2, f"{name} {panel}: the fixture must draw two series for the test to mean anything"
        for a, b in itertools.combinations(xs.values(), 2):
            assert not a & b, f"{name} {panel}: two series share an x position"
    data = pd.read_csv(rendered_committed["out"] / f"{name}.csv")
    assert set(data["seq_len"]) <= {256, 512, 1024, 2048}


def test_steps_axis_of_a_sweep_with_one_eval_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run evaluated once, at step 20: the axis runs from 0 past 20 in whole steps, and the series,
    all at that step, sit side by side rather than on one point."""
    sweep = tmp_path / "one_eval"
    for mixer, lr in itertools.product(["kda", "gdn", "mamba2"], [3e-3, 1e-2]):
        _write_run(sweep, "mqar", mixer, 32, lr, 0, "completed", [20])
    drawn, save = {}, draw.save_figure

    def described_save(fig: Figure, *args: object) -> list[Path]:
        drawn["figure"] = _describe(fig)
        return save(fig, *args)

    monkeypatch.setattr(draw, "save_figure", described_save)
    table = collect.collect_dirs([sweep])
    runs, unscored = plot.scored_runs(table), plot.unscored_runs(table)
    best = plot.best_lr(plot.cells(runs, unscored), runs)
    fig_steps.plot_acc_vs_steps(runs, best, unscored, 32, tmp_path / "figs")
    figure = drawn["figure"]
    assert figure["problems"] == []
    (axis,) = figure["x_axes"]
    low, high = axis["limits"]
    assert low == 0 and 20 < high <= 22, axis["limits"]
    assert len(axis["ticks"]) >= 3 and all(float(t).is_integer() for t in axis["ticks"]), axis["ticks"]
    xs = [line["xy"][0, 0] for line in figure["lines"] if not line["label"].startswith("_")]
    assert len(xs) == 3 and len(set(xs)) == 3 and all(abs(x - 20) < 1 for x in xs), xs
    steps = pd.read_csv(tmp_path / "figs" / "acc_vs_steps_len32.csv")["step"]
    assert set(steps) == {20}  # the data keeps the true step


def test_heat_map_names_the_runs_not_scored(rendered: dict) -> None:
    texts = rendered["lr_sensitivity"]["texts"]
    assert "2 fail" in texts  # palindrome mamba2 2048 lr 1e-3: grey cell, no number
    assert any(t.endswith("\n1 div.") for t in texts)  # palindrome gdn 1024 lr 1e-3: 1 of 2 seeds
    assert "1 div." in texts  # attention on MQAR: each cell one diverged run, no number
    heat = pd.read_csv(rendered["out"] / "lr_sensitivity.csv")
    cell = heat[(heat["task"] == "palindrome") & (heat["mixer"] == "mamba2") & (heat["seq_len"] == 2048)
                & (heat["lr"] == 1e-3)].iloc[0]
    assert math.isnan(cell["acc_mean"]) and cell["n_failed"] == 2 and cell["n_seeds"] == 0


def test_a_missing_path_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        plot.main([str(tmp_path / "no_such_sweep"), "--out", str(tmp_path / "figs")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in error
    assert f"error: {tmp_path / 'no_such_sweep'} is neither a table" in error


# The grid of experiment=kimi_fig4_h200 and _noconv, partly filled as it is over several sessions.
GRID = ["kimi_fig4_h200", "kimi_fig4_h200_noconv"]
BUDGET = {"trainer.max_steps": 5000, "trainer.batch_size": 256, "trainer.eval_every": 250,
          "trainer.early_stop.enabled": True, "trainer.early_stop.acc": 0.99, "trainer.early_stop.evals": 2}


@pytest.fixture(scope="module")
def partial_grid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Four finished runs of the 48 cells (KDA's MQAR at 1,024 stopped early, solved), one run cut off
    (GDN's MQAR at 1,024: incomplete) and one diverged (Mamba2's Stack at 256), drawn with --grid."""
    root = tmp_path_factory.mktemp("partial_grid")
    full = list(range(250, 5001, 250))
    for task, mixer, length, steps, stop in (("palindrome", "kda", 1024, full, None),
                                             ("mqar", "kda", 1024, [250, 500, 750, 1000, 1250], 1250),
                                             ("palindrome", "kda", 2048, full, None),
                                             ("stack", "gdn", 512, full, None)):
        _write_run(root, task, mixer, length, 1e-3, 0, "completed", steps,
                   extra={"config": BUDGET, "early_stopped_at": stop})
    _write_run(root, "stack", "mamba2", 256, 1e-3, 0, "diverged", full, extra={"config": BUDGET})
    _write_run(root, "mqar", "gdn", 1024, 1e-3, 0, "incomplete", full[:6],
               extra={"config": BUDGET, "best_eval_acc": 0.2, "error": "interrupted"})
    return _render(root, tmp_path_factory.mktemp("partial_figs"), "--grid", *GRID, "--length", "1024",
                   "--figures", "acc_vs_length", "acc_vs_steps")


def test_the_grid_has_the_48_cells_of_the_two_experiments() -> None:
    cells = grid.grid_cells(GRID)
    assert len(cells) == 48 and not cells.duplicated().any()
    assert set(cells["task"]) == set(TASKS[:3]) and set(cells["seq_len"]) == set(LENGTHS)
    assert {s.lower() for s in cells["series"]} == {"kda", "gdn", "mamba2", "mamba2 [use_short_conv=false]"}


def test_a_cell_cut_off_is_not_run_and_takes_the_runs_spelling() -> None:
    cells = grid.grid_cells(GRID)
    table = pd.DataFrame([
        {"task": "mqar", "mixer": "gdn", "variant": "", "seq_len": 1024, "status": "incomplete"},
        {"task": "stack", "mixer": "mamba2", "variant": "", "seq_len": 256, "status": "diverged"},
        {"task": "stack", "mixer": "mamba2", "variant": "use_short_conv=false", "seq_len": 256,
         "status": "completed"},
    ])
    pending = grid.not_run(cells, table)
    keys = set(zip(pending["task"], pending["series"], pending["seq_len"], strict=True))
    assert len(pending) == 46 and ("mqar", "gdn", 1024) in keys  # cut off: trained again, so not run
    assert ("stack", "mamba2", 256) not in keys  # diverged: run, and marked as such, not as not run
    assert "mamba2 [use_short_conv=false]" in set(pending["series"])  # the runs' spelling, not False
    assert grid.fill_note(cells, pending) == "2 of 48 cells run"


def test_cells_not_yet_run_are_open_markers_below_zero_never_an_accuracy(partial_grid: dict) -> None:
    figure = partial_grid["acc_vs_length"]
    assert figure["problems"] == []
    open_marks = [line for line in figure["lines"] if line["open"]]
    # one mark per cell not run: 48 less the four completed and the diverged one (run, marked as such);
    # the cut-off one is among them
    assert sum(len(line["xy"]) for line in open_marks) == 48 - 5
    assert all((line["xy"][:, 1] < -5).all() for line in open_marks)
    on_scale = [line for line in figure["lines"] if not line["open"] and (line["xy"][:, 1] >= 0).any()]
    drawn = {(line["panel"], line["colour"]) for line in on_scale}
    assert drawn == {("palindrome", mixer_colour("kda")), ("mqar", mixer_colour("kda")),
                     ("stack", mixer_colour("gdn"))}
    texts = " ".join(figure["texts"])
    for part in ("at most 5,000 steps a run", "batch 256", "lr 1e-3", "eval every 250 steps at L",
                 "≥ 0.99 for 2 evals", "5 of 48 cells run"):
        assert part in texts, part
    assert "not yet run (open marker)" in figure["legends"]
    data = pd.read_csv(partial_grid["out"] / "acc_vs_length.csv")
    assert data["not_run"].sum() == 43 and data[data["not_run"]]["acc_mean"].isna().all()
    assert (partial_grid["out"] / "acc_vs_length.png").stat().st_size < 300_000


def test_steps_figure_has_a_panel_per_task_and_names_what_has_not_run(partial_grid: dict) -> None:
    figure = partial_grid["acc_vs_steps_len1024"]
    assert figure["problems"] == []
    # the paper's layout: every task at L = 1,024, even Stack with no run there yet
    assert [axis["panel"] for axis in figure["x_axes"]] == [f"{t}, length 1024" for t in TASKS[:3]]
    assert all(axis["limits"][1] >= 5000 for axis in figure["x_axes"])  # the budget's whole x axis
    curves = [line for line in figure["lines"] if not line["label"].startswith("_")]
    assert {(line["panel"], line["label"]) for line in curves} == {
        ("palindrome, length 1024", "kda (n=1), lr 0.001"), ("mqar, length 1024", "kda (n=1), lr 0.001")}
    mqar = [line for line in curves if line["panel"].startswith("mqar")][0]
    assert mqar["xy"][:, 0].max() < 1300  # stopped early, solved: the line ends there
    legends = figure["legends"]
    assert legends.count("gdn (not yet run)") == 3 and legends.count("kda (not yet run)") == 1
    texts = figure["texts"]
    assert "no completed run at L = 1,024 yet" in texts
    assert any("2 of 12 cells at L = 1,024 run (5 of 48 cells in the grid)" in t for t in texts)
    assert any("at most 5,000 steps a run" in t for t in texts)
    steps = pd.read_csv(partial_grid["out"] / "acc_vs_steps_len1024.csv")
    assert set(steps["series"]) == {"kda"}  # the run cut off is no curve


def test_a_seed_that_stopped_solved_counts_at_its_last_eval_while_the_others_train_on() -> None:
    """Seed 0 solves the task and stops at step 500; seed 1 trains to 1,000 at 20 %. The cell's mean
    stays 60 % after 500 (without the carry it fell to 20 %, a cell that unlearned), one value carried a
    step; a seed that ran its budget out is never carried."""
    solved = pd.DataFrame({"step": [250, 500], "acc": [50.0, 100.0], "seed": 0, "carried": False})
    stuck = pd.DataFrame({"step": [250, 500, 750, 1000], "acc": [0.0, 20.0, 20.0, 20.0], "seed": 1,
                          "carried": False})
    merged = fig_steps._carry_solved([(solved, True), (stuck, False)])
    mean = merged.groupby("step")["acc"].mean()
    assert mean.to_dict() == {250: 25.0, 500: 60.0, 750: 60.0, 1000: 60.0}
    assert merged.groupby("step")["carried"].sum().to_dict() == {250: 0, 500: 0, 750: 1, 1000: 1}
    # the same seed not stopped early (it ran out of steps, say): not held beyond its last eval
    merged = fig_steps._carry_solved([(solved, False), (stuck, False)])
    assert merged.groupby("step")["acc"].mean().to_dict() == {250: 25.0, 500: 60.0, 750: 20.0, 1000: 20.0}
