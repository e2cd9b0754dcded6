"""A cell trained again at a longer budget (`tools/campaign.py extend`): its longer run stands for it in the
figures and the report, never as a second seed beside the shorter one, and what both cost is still spent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from analysis.cells import at_budget, budgets, longest_budget, max_steps_run, point_runs
from analysis.fig_length import _label_longer
from analysis.plot import main as plot_main
from analysis.plot import plot_all
from analysis.report import render


def _run(mixer: str, task: str, acc: float, max_steps: int = 5000, seed: int = 0, lr: float = 1e-3,
         status: str = "completed", steps_to: float | None = None, length: int = 1024) -> dict:
    return {"task": task, "mixer": mixer, "variant": "", "seq_len": length, "lr": lr, "seed": seed,
            "status": status, "best_train_acc": acc, "best_eval_acc": acc, "final_eval_acc": acc,
            "steps_to_threshold": steps_to, "trainer.max_steps": max_steps, "steps": max_steps,
            "wall_time_s": max_steps / 10, "device": "cuda:0", "run_dir": None}


def test_a_longer_completed_run_of_the_same_cell_lr_and_seed_supersedes_the_shorter() -> None:
    table = pd.DataFrame([
        _run("kda", "palindrome", 0.79),                            # superseded
        _run("kda", "palindrome", 0.99, max_steps=20000),
        _run("kda", "palindrome", 0.70, lr=5e-4),                    # another lr: kept
        _run("kda", "palindrome", 0.80, seed=1),                     # another seed: kept
        _run("gdn", "palindrome", 0.94),                             # its longer run failed: kept
        _run("gdn", "palindrome", float("nan"), max_steps=20000, status="failed"),
    ])
    kept = longest_budget(table)
    assert list(kept.index) == [1, 2, 3, 4, 5]
    assert longest_budget(kept).equals(kept)


def _mixed_budgets() -> pd.DataFrame:
    """KDA's Palindrome cell: seed 0 trained again at 20,000 steps and solved, seed 1 below 0.99 at the
    grid's 5,000, seed 2 solved at 5,000; GDN's at one budget on two seeds, one below."""
    return pd.DataFrame([
        _run("kda", "palindrome", 0.79, steps_to=None),                       # superseded by the next
        _run("kda", "palindrome", 0.993, max_steps=20000, steps_to=3000),
        _run("kda", "palindrome", 0.68, seed=1, steps_to=None),               # left out of the point
        _run("kda", "palindrome", 0.995, seed=2, steps_to=1500),              # solved: stays
        _run("kda", "palindrome", 0.60, lr=5e-4, seed=1, steps_to=None),      # another lr: its own
        _run("gdn", "palindrome", 0.99, steps_to=1000), _run("gdn", "palindrome", 0.80, seed=1),
    ])


def test_a_point_stands_at_one_budget_its_seeds_below_at_a_shorter_one_left_out() -> None:
    table = _mixed_budgets()
    kept, left_out = point_runs(table, "best_train_acc")
    assert list(kept.index) == [1, 3, 4, 5, 6] and list(left_out.index) == [2]
    # at one budget nothing leaves; solved seeds stay; applied again it is the same
    assert point_runs(table.iloc[[5, 6]], "best_train_acc")[1].empty
    assert point_runs(kept, "best_train_acc")[0].equals(kept)


def test_the_report_keeps_a_point_at_one_budget_and_names_the_seeds_left_out() -> None:
    text = render(_mixed_budgets(), "train", "x")
    assert "1 superseded by a longer run of its cell, lr and seed" in text
    assert "1 left out of their cell's point until trained as long as its other seeds there" in text
    # KDA's point: seeds 0 (20,000 steps) and 2 (solved at 5,000), not seed 1's 0.68 at 5,000
    assert "| palindrome | kda | 1024 | 0.994 (0.993–0.995) |" in text
    assert "| palindrome | kda | 1024 | 0.001 | 1 | 5,000 | 0.680 | 20,000 |" in text
    # every seed at the grid's budget judged on its own: all three of KDA's, seed 0's 5,000-step run too
    assert "| every seed at 5,000 steps |" in text
    assert "kda never (median of 3 runs: 1500, never, never)" in text
    assert "kda 2250 (median of 2 runs: 1500, 3000)" in text
    # how seed 1 failed is still told, beside the seeds that learnt it
    apart = text.split("### Seeds apart")[1].split("###")[0]
    assert "| palindrome | kda | 1024 | 0.001 | 1 | 0.680 |" in apart


def test_the_figures_draw_a_point_at_one_budget_and_say_what_they_left_out(tmp_path: Path) -> None:
    plot_all(_mixed_budgets(), tmp_path, figures=("acc_vs_length",), metric="train")
    drawn = pd.read_csv(tmp_path / "acc_vs_length.csv").set_index("series")
    assert drawn.loc["kda", "n_seeds"] == 2 and drawn.loc["kda", "acc_mean"] == 99.4
    assert drawn.loc["kda", "longer_budget"] == "1 of 2 seeds at 20,000 steps; 1 at 5,000 left out"
    assert drawn.loc["gdn", "n_seeds"] == 2


def test_a_figure_at_one_budget_draws_every_seed_that_ran_it(tmp_path: Path, capsys) -> None:
    table = _mixed_budgets()
    plot_all(at_budget(table, 5000), tmp_path, figures=("acc_vs_length",), metric="train")
    drawn = pd.read_csv(tmp_path / "acc_vs_length.csv").set_index("series")
    # KDA at 1e-3 on all three seeds at 5,000 steps, seed 0's superseded run among them
    assert drawn.loc["kda", "n_seeds"] == 3
    assert abs(drawn.loc["kda", "acc_mean"] - 100 * (0.79 + 0.68 + 0.995) / 3) < 1e-9
    assert at_budget(table, 20000)["trainer.max_steps"].eq(20000).all()
    # a budget no run had: one line naming the ones there are, nothing written
    csv = tmp_path / "table.csv"
    table.to_csv(csv, index=False)
    with pytest.raises(SystemExit) as exit_:
        plot_main([str(csv), "--out", str(tmp_path / "none"), "--metric", "train", "--budget", "7000"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and err.endswith(
        "--budget 7000: no run has trainer.max_steps=7000; the runs' budgets: 5000, 20000")
    assert not (tmp_path / "none").exists()


def test_the_step_axis_ends_at_the_longest_run_not_the_longest_budget() -> None:
    # a failed seed trained again at 20,000 steps that stopped early at 5,000 does not stretch the axis
    # to 20,000, past every line; a run that trained its 20,000 does
    stopped = {**_run("gdn", "mqar", 0.999, max_steps=20000), "steps": 5000}
    table = pd.DataFrame([_run("kda", "mqar", 1.0), stopped])
    assert max_steps_run(table) == 5000
    assert max_steps_run(pd.concat([table, pd.DataFrame([_run("kda", "palindrome", 0.8, 20000)])])) == 20000
    # summaries without `steps`: the largest budget
    assert max_steps_run(table.drop(columns="steps")) == 20000


def test_budgets_in_words() -> None:
    one = pd.DataFrame([_run("kda", "mqar", 1.0), _run("gdn", "mqar", 1.0)])
    assert budgets(one) == "at most 5,000 steps a run"
    mixed = pd.DataFrame([_run("kda", "mqar", 1.0), _run("gdn", "mqar", 0.9, max_steps=20000),
                          _run("kda", "stack", 1.0), _run("gdn", "stack", 1.0)])
    assert budgets(mixed) == "5,000 steps a run, 20,000 for 1 of 4 cells"


def test_the_report_judges_the_longer_run_and_spends_both() -> None:
    table = pd.DataFrame([
        _run("kda", "palindrome", 0.79, steps_to=None),
        _run("kda", "palindrome", 0.995, max_steps=20000, steps_to=9000),
        _run("gdn", "palindrome", 0.99, steps_to=750),
        _run("kda", "mqar", 1.0, steps_to=750), _run("gdn", "mqar", 1.0, steps_to=2250),
    ])
    text = render(table, "train", "x")
    assert "Runs: 5 (5 completed; 1 superseded by a longer run of its cell, lr and seed" in text
    # one run a cell: the 20,000-step run's accuracy and steps, not a median with the shorter one
    assert "| palindrome | kda | 1024 | 0.995 | 0.995 | – | 0.001 | 9000 | 1 |" in text
    assert "palindrome: kda ran 20,000 steps, gdn 5,000, so their schedules differ" in text
    assert "mqar: kda ran" not in text
    assert "this grid 5,000 steps a run, 20,000 for 1 of 4 cells" in text
    # the compute time counts all five runs: 4 x 500 s + 2,000 s
    assert "Spent over the finished runs: 1.11 GPU-hours (5 runs on GPUs)" in text


def test_the_figures_draw_the_longer_run_as_the_cell(tmp_path: Path) -> None:
    table = pd.DataFrame([
        _run("kda", "palindrome", 0.79), _run("kda", "palindrome", 0.995, max_steps=20000),
        _run("gdn", "palindrome", 0.99),
    ])
    plot_all(table, tmp_path, figures=("acc_vs_length",), metric="train")
    drawn = pd.read_csv(tmp_path / "acc_vs_length.csv").set_index("series")
    assert drawn.loc["kda", "acc_mean"] == 99.5 and drawn.loc["kda", "n_seeds"] == 1


def test_a_point_trained_longer_than_the_rest_is_labelled_with_its_budget(tmp_path: Path) -> None:
    """acc_vs_length labels (and its CSV names) each point whose runs at its best lr had a larger budget
    than the figure's smallest, with how many of its seeds had it; points at the common budget have none."""
    table = pd.DataFrame([
        _run("kda", "palindrome", 0.79), _run("gdn", "palindrome", 0.94),
        _run("mamba2", "palindrome", 0.99, max_steps=20000),
        _run("kda", "mqar", 1.0), _run("kda", "mqar", 0.99, seed=1, max_steps=20000),
        _run("kda", "mqar", 1.0, seed=2),
        # a longer run at a worse lr: not the point drawn
        _run("mamba2", "mqar", 0.4, max_steps=20000, lr=5e-4),
        _run("mamba2", "mqar", 0.6),
    ])
    plot_all(table, tmp_path, figures=("acc_vs_length",), metric="train")
    drawn = pd.read_csv(tmp_path / "acc_vs_length.csv").set_index(["task", "series"])["longer_budget"]
    assert drawn.loc[("palindrome", "mamba2")] == "20,000 steps"
    assert drawn.loc[("mqar", "kda")] == "1 of 3 seeds at 20,000 steps"
    assert drawn.drop([("palindrome", "mamba2"), ("mqar", "kda")]).isna().all()
    # and so does length_generalisation, drawn from the same cells' evals at L and 2L
    table["final_eval/acc@1024"], table["final_eval/acc@2048"] = table["final_eval_acc"], 0.5
    plot_all(table, tmp_path / "gen", figures=("length_generalisation",), metric="train")
    drawn = pd.read_csv(tmp_path / "gen" / "length_generalisation.csv").set_index(["task", "series"])
    assert drawn.loc[("palindrome", "mamba2"), "longer_budget"] == "20,000 steps"
    assert drawn.loc[("mqar", "kda"), "longer_budget"] == "1 of 3 seeds at 20,000 steps"
    assert drawn["longer_budget"].isna().sum() == len(drawn) - 2


def test_a_budget_label_stays_on_the_axes_for_a_point_near_zero() -> None:
    """Below a point at 5 % the label would fall under the axis onto the length labels: it goes above
    there, while a high point's goes below; two labels on one side of a length stack apart."""
    ax = Figure().add_subplot()
    longer = {("mqar", "a", 1024): "20,000 steps", ("mqar", "a", 2048): "20,000 steps",
              ("mqar", "b", 2048): "1 of 3 seeds at 20,000 steps"}
    labelled: dict = {}
    _label_longer(ax, "mqar", "a", np.array([1024.0, 2048.0]), np.array([5.0, 90.0]), [1024, 2048], longer,
                  labelled, "k")
    _label_longer(ax, "mqar", "b", np.array([2048.0]), np.array([95.0]), [2048], longer, labelled, "k")
    offsets = {(a.get_text(), a.xy): a.xyann[1] for a in ax.texts}
    assert offsets[("20,000 steps", (1024.0, 5.0))] > 0
    assert offsets[("20,000 steps", (2048.0, 90.0))] < 0
    below_first = offsets[("20,000 steps", (2048.0, 90.0))]
    assert offsets[("1 of 3 seeds at 20,000 steps", (2048.0, 95.0))] < below_first
