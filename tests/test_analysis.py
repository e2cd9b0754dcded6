"""analysis.collect and analysis.plot on synthetic run dirs shaped like the harness's (docs/design.md §7)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import collect, draw, plot
from analysis.colours import MIXER_COLOURS, figure_colours, mixer_colour

TASKS = ["mqar", "palindrome"]
MIXERS = ["kda", "gdn"]
LENGTHS = [64, 128]
LRS = [1e-4, 1e-3]
SEEDS = [0, 1, 2]
EVAL_STEPS = [0, 50, 100, 150, 200]


def _accuracy(task: str, mixer: str, length: int, lr: float, seed: int, step: int) -> float:
    """A made-up learning curve with differences between every factor, so a wrong grouping shows."""
    rng = np.random.default_rng(abs(hash((task, mixer, length, lr, seed))) % 2**32)
    ceiling = {"kda": 0.95, "gdn": 0.85}[mixer] - (0.1 if task == "palindrome" else 0.0)
    ceiling -= 0.15 * math.log2(length / 64) + (0.2 if lr == 1e-4 else 0.0)
    ceiling += float(rng.uniform(-0.04, 0.04))
    return float(np.clip(ceiling * (1 - math.exp(-step / 60)), 0, 1))


def write_run(
    run_dir: Path,
    *,
    task: str,
    mixer: str,
    seq_len: int,
    lr: float,
    seed: int,
    status: str | None = "completed",
    extra_overrides: tuple[str, ...] = (),
    log: str = "",
    job_id: str | None = None,
    mixer_kwargs: dict | None = None,
) -> None:
    """A run dir as the harness writes it; status None = died before summary.json."""
    (run_dir / ".hydra").mkdir(parents=True)
    config = {
        "task": {
            "name": task,
            "seq_len": seq_len,
            "eval_seq_lens": [seq_len, 2 * seq_len],
            "num_train": 1000,
            "num_eval": 100,
            "params": {"vocab_size": 64},
        },
        "mixer": {"_target_": f"mixers.{mixer}.Mixer", "num_heads": 2, **(mixer_kwargs or {})},
        "optim": {"lr": lr, "weight_decay": 0.1},
        "trainer": {"max_steps": 200, "batch_size": 8, "eval_every": 50, "device": "auto"},
        "logger": {"wandb": {"mode": "disabled", "group": "synthetic", "tags": ["task:${task.name}"]}},
        "seed": seed,
    }
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    overrides = [
        f"task={task}",
        f"mixer={mixer}",
        f"task.seq_len={seq_len}",
        f"optim.lr={lr}",
        f"seed={seed}",
        *extra_overrides,
    ]
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    hydra = {
        "hydra": {
            "runtime": {"choices": {"task": task, "mixer": mixer}},
            "job": {"override_dirname": ",".join(sorted(overrides)), "id": job_id, "num": 0},
        }
    }
    (run_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    (run_dir / "train.log").write_text(log)
    if status is None:
        return
    accs = [_accuracy(task, mixer, seq_len, lr, seed, step) for step in EVAL_STEPS]
    with (run_dir / "metrics.jsonl").open("w") as handle:
        for step, acc in zip(EVAL_STEPS, accs, strict=True):
            handle.write(json.dumps({"step": step, "train/loss": 1.0, "lr": lr, "time_s": step * 0.1}) + "\n")
            handle.write(json.dumps({"step": step, "eval/acc": acc, "eval/seq_acc": acc**4}) + "\n")
    reached = [s for s, a in zip(EVAL_STEPS, accs, strict=True) if a >= 0.5]
    summary = {
        "status": status,
        "best_eval_acc": max(accs),
        "final_eval_acc": accs[-1],
        "steps": 200,
        "steps_to_threshold": reached[0] if reached else None,
        "wall_time_s": 3.0,
        "tokens_per_s": 1e4,
        "state_size": {"kda": 2 * 2 * 64 * 64, "gdn": 2 * 2 * 64 * 64 // 2}[mixer] * (1 + (seq_len == 128)),
        "n_params": 12345,
        "task": task,
        "mixer": mixer,
        "seq_len": seq_len,
        "lr": lr,
        "seed": seed,
    }
    if status == "failed":
        summary.update(best_eval_acc=None, final_eval_acc=None, error="ValueError: boom")
    if status == "diverged":
        summary.update(best_eval_acc=0.02, final_eval_acc=None, error="loss is nan at step 120")
    (run_dir / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweeps" / "synthetic"
    for task in TASKS:
        for mixer in MIXERS:
            for length in LENGTHS:
                for lr in LRS:
                    for seed in SEEDS:
                        name = f"mixer={mixer},optim.lr={lr},seed={seed},task.seq_len={length},task={task}"
                        write_run(root / name, task=task, mixer=mixer, seq_len=length, lr=lr, seed=seed)
    return root


def _add_broken_runs(root: Path) -> None:
    write_run(root / "failed", task="mqar", mixer="kda", seq_len=64, lr=1.0, seed=0, status="failed")
    write_run(
        root / "crashed",
        task="mqar",
        mixer="kda",
        seq_len=64,
        lr=2.0,
        seed=0,
        status=None,
        log="step 0\nTraceback (most recent call last):\n  File x\nValueError: num_pairs=999 > seq_len\n",
    )
    write_run(root / "interrupted", task="mqar", mixer="gdn", seq_len=64, lr=3.0, seed=0, status=None)
    (root / "interrupted" / "checkpoint.pt").write_bytes(b"\0")
    write_run(
        root / "cancelled", task="mqar", mixer="gdn", seq_len=64, lr=4.0, seed=0, status=None, job_id="17_3"
    )
    (root / ".submitit" / "17_3").mkdir(parents=True)
    (root / ".submitit" / "17_3" / "17_3_0_log.err").write_text(
        "slurmstepd: error: *** JOB 17 ON vm CANCELLED AT 2026-11-29T11:00:00 ***\n"
    )
    write_run(root / "diverged", task="mqar", mixer="gdn", seq_len=64, lr=5.0, seed=0, status="diverged")
    # Preempted under SLURM: submitit's requeue exits the run with SystemExit, which the harness records.
    write_run(root / "preempted", task="mqar", mixer="gdn", seq_len=64, lr=6.0, seed=0, status="failed")
    summary = json.loads((root / "preempted" / "summary.json").read_text())
    (root / "preempted" / "summary.json").write_text(json.dumps({**summary, "error": "SystemExit: -1"}))


def test_collect_one_row_per_run_with_status_and_reason(sweep: Path) -> None:
    _add_broken_runs(sweep)
    table = collect.collect_dirs([sweep])
    n_grid = len(TASKS) * len(MIXERS) * len(LENGTHS) * len(LRS) * len(SEEDS)
    assert len(table) == n_grid + 6
    by_lr = table.set_index("lr")
    assert by_lr.loc[1.0, "status"] == "failed" and by_lr.loc[1.0, "reason"] == "ValueError: boom"
    assert by_lr.loc[2.0, "status"] == "failed"
    assert by_lr.loc[2.0, "reason"] == "ValueError: num_pairs=999 > seq_len"
    assert by_lr.loc[3.0, "status"] == "incomplete" and "checkpoint" in by_lr.loc[3.0, "reason"]
    assert by_lr.loc[4.0, "status"] == "failed" and by_lr.loc[4.0, "reason"] == "SLURM job 17_3 cancelled"
    assert by_lr.loc[5.0, "status"] == "diverged"
    assert by_lr.loc[6.0, "status"] == "incomplete" and "SystemExit" in by_lr.loc[6.0, "reason"]
    # Identity columns are filled from the config even for runs that never wrote a summary.
    assert by_lr.loc[2.0, "task"] == "mqar" and by_lr.loc[3.0, "mixer"] == "gdn"
    assert by_lr.loc[3.0, "seq_len"] == 64 and by_lr.loc[3.0, "seed"] == 0
    grid = table[table["lr"].isin(LRS)]
    assert (grid["status"] == "completed").all()
    assert set(grid["mixer"]) == set(MIXERS) and set(grid["task"]) == set(TASKS)
    # Flattened config keys are columns; interpolations resolve against the run's own config.
    assert set(grid["trainer.batch_size"]) == {8}
    assert set(grid["logger.wandb.tags"]) == {'["task:mqar"]', '["task:palindrome"]'}
    assert set(table["sweep"]) == {"synthetic"}
    # The summary's numbers come through unchanged.
    one = grid[
        (grid["task"] == "mqar")
        & (grid["mixer"] == "kda")
        & (grid["seq_len"] == 64)
        & (grid["lr"] == 1e-3)
        & (grid["seed"] == 1)
    ].iloc[0]
    summary = json.loads((Path(one["run_dir"]) / "summary.json").read_text())
    assert one["best_eval_acc"] == pytest.approx(summary["best_eval_acc"])


def test_collect_cli_csv_and_parquet_round_trip(sweep: Path, tmp_path: Path) -> None:
    _add_broken_runs(sweep)
    expected = collect.collect_dirs([sweep])
    for name in ("table.csv", "table.parquet"):
        assert collect.main([str(sweep), "--out", str(tmp_path / name)]) == 0
        back = collect.read_table(tmp_path / name)
        assert len(back) == len(expected)
        assert list(back["status"]) == list(expected["status"])
        np.testing.assert_allclose(
            back["best_eval_acc"].astype(float), expected["best_eval_acc"].astype(float)
        )
    with pytest.raises(SystemExit):
        collect.main([str(sweep), "--out", str(tmp_path / "table.xlsx")])


def test_collect_missing_dir_names_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        collect.collect_dirs([tmp_path / "nope"])


def test_a_configs_hydra_references_resolve_against_the_runs_own_hydra_yaml(tmp_path: Path) -> None:
    """`${hydra:...}` in a run's config (W&B names and tags) reads the run's hydra.yaml, also through a
    reference of Hydra's own; the parts of hydra.yaml no reference reaches are not read, so one that
    cannot be resolved here (a resolver of Hydra's) changes nothing."""
    run_dir = tmp_path / "sweep" / "run"
    write_run(run_dir, task="mqar", mixer="kda", seq_len=64, lr=1e-3, seed=0)
    config = run_dir / ".hydra" / "config.yaml"
    config.write_text(config.read_text() + "name: ${hydra:job.override_dirname}\n"
                      "tag: mixer:${hydra:runtime.choices.mixer}\nlabel: ${hydra:job.label}\n"
                      "missing: ${hydra:sweep.dir}\n")
    hydra_yaml = run_dir / ".hydra" / "hydra.yaml"
    hydra = yaml.safe_load(hydra_yaml.read_text())
    hydra["hydra"]["job"]["label"] = "${hydra.runtime.choices.task}-${hydra.launcher.name}"
    hydra["hydra"]["launcher"] = {"name": "local"}
    hydra["hydra"]["run"] = {"dir": "outputs/${now:%Y-%m-%d}"}
    hydra_yaml.write_text(yaml.safe_dump(hydra))
    row = collect.collect_dirs([tmp_path / "sweep"]).iloc[0]
    assert row["name"] == hydra["hydra"]["job"]["override_dirname"] and "mixer=kda" in row["name"]
    assert row["tag"] == "mixer:kda" and row["label"] == "mqar-local"
    assert row["missing"] == "${hydra.sweep.dir}"  # hydra.yaml has no sweep: kept as text
    assert not any(str(key).startswith("hydra") for key in row.index)


def test_variant_from_overrides() -> None:
    assert collect.variant_of(["task=mqar", "mixer=kda", "optim.lr=1e-3", "seed=0"]) == ""
    assert collect.variant_of(["mixer=kda", "mixer.gate=bounded", "seed=1"]) == "gate=bounded"
    # where and how fast a run executes does not make it another series
    assert collect.variant_of(["mixer=kda", "trainer.cpu_threads=4", "trainer.device=cuda:1"]) == ""
    assert (
        collect.variant_of(["+experiment/ablation=no_short_conv", "logger.wandb.mode=offline"])
        == "no_short_conv"
    )


def _expected_best(table: pd.DataFrame) -> dict[tuple, tuple[float, float, float]]:
    """(task, mixer, length) -> (best lr, mean %, std %), computed the slow obvious way."""
    out = {}
    for task in TASKS:
        for mixer in MIXERS:
            for length in LENGTHS:
                best = None
                for lr in LRS:
                    accs = (
                        table[
                            (table["task"] == task)
                            & (table["mixer"] == mixer)
                            & (table["seq_len"] == length)
                            & (table["lr"] == lr)
                        ]["best_eval_acc"].to_numpy()
                        * 100
                    )
                    assert len(accs) == len(SEEDS)
                    if best is None or accs.mean() > best[1]:
                        best = (lr, accs.mean(), accs.std())
                out[(task, mixer, length)] = best
    return out


def test_plot_writes_every_figure_from_the_right_data(sweep: Path, tmp_path: Path) -> None:
    _add_broken_runs(sweep)
    table = collect.collect_dirs([sweep])
    out = tmp_path / "figs"
    assert plot.main([str(sweep), "--out", str(out)]) == 0
    for name in ("acc_vs_length", f"acc_vs_steps_len{max(LENGTHS)}", "lr_sensitivity", "acc_vs_state_size"):
        for suffix in (".png", ".pdf", ".csv"):
            assert (out / f"{name}{suffix}").stat().st_size > 0, name + suffix
    assert (out / "acc_vs_length.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "acc_vs_length.pdf").read_bytes()[:4] == b"%PDF"

    expected = _expected_best(table[table["lr"].isin(LRS)])
    by_length = pd.read_csv(out / "acc_vs_length.csv")
    # The diverged run (lr 5.0, mqar/gdn/64) has no accuracy, so it never becomes the best lr.
    assert len(by_length) == len(expected)
    for _, row in by_length.iterrows():
        lr, mean, std = expected[(row["task"], row["mixer"], row["seq_len"])]
        assert row["lr"] == pytest.approx(lr)
        assert row["acc_mean"] == pytest.approx(mean)
        assert row["acc_std"] == pytest.approx(std)
        assert row["n_seeds"] == len(SEEDS)

    steps = pd.read_csv(out / f"acc_vs_steps_len{max(LENGTHS)}.csv")
    assert set(steps["seq_len"]) == {max(LENGTHS)}
    for _, row in steps.iterrows():
        lr = expected[(row["task"], row["mixer"], row["seq_len"])][0]
        assert row["lr"] == pytest.approx(lr)
        accs = [_accuracy(row["task"], row["mixer"], row["seq_len"], lr, s, row["step"]) * 100 for s in SEEDS]
        assert row["acc_mean"] == pytest.approx(np.mean(accs))
        assert row["acc_min"] == pytest.approx(min(accs)) and row["acc_max"] == pytest.approx(max(accs))
    assert set(steps["step"]) == set(EVAL_STEPS)

    heat = pd.read_csv(out / "lr_sensitivity.csv")
    grid = table[table["lr"].isin(LRS)]
    # + a cell, without an accuracy, for each run that diverged or failed at its own lr (1, 2, 4, 5)
    assert len(heat) == len(TASKS) * len(MIXERS) * len(LENGTHS) * len(LRS) + 4
    not_scored = heat[~heat["lr"].isin(LRS)]
    assert not_scored["acc_mean"].isna().all() and (not_scored["n_seeds"] == 0).all()
    assert sorted(not_scored["n_diverged"] + 2 * not_scored["n_failed"]) == [1, 2, 2, 2]
    for _, row in heat[heat["lr"].isin(LRS)].iterrows():
        accs = (
            grid[
                (grid["task"] == row["task"])
                & (grid["mixer"] == row["mixer"])
                & (grid["seq_len"] == row["seq_len"])
                & (grid["lr"] == row["lr"])
            ]["best_eval_acc"]
            * 100
        )
        assert row["acc_mean"] == pytest.approx(accs.mean())

    state = pd.read_csv(out / "acc_vs_state_size.csv")
    for _, row in state.iterrows():
        sizes = grid[(grid["mixer"] == row["mixer"]) & (grid["seq_len"] == row["seq_len"])]["state_size"]
        assert row["state_size"] == sizes.iloc[0]

    summary = (out / "summary.md").read_text()
    lr, mean, std = expected[("mqar", "kda", 64)]
    assert f"{mean:.1f} ± {std:.1f} (n={len(SEEDS)}, lr {lr:g}" in summary
    assert "cancelled" in summary and "num_pairs=999" in summary
    assert f"{len(table)} runs: " in summary


def test_plot_from_table_file_matches_plot_from_dirs(sweep: Path, tmp_path: Path) -> None:
    collect.main([str(sweep), "--out", str(tmp_path / "t.parquet")])
    plot.main([str(tmp_path / "t.parquet"), "--out", str(tmp_path / "a"), "--length", "64"])
    plot.main([str(sweep), "--out", str(tmp_path / "b"), "--length", "64"])
    for name in ("acc_vs_length.csv", "acc_vs_steps_len64.csv", "lr_sensitivity.csv", "summary.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / name), pd.read_csv(tmp_path / "b" / name))


def test_plot_ablation_variants_are_separate_series(tmp_path: Path) -> None:
    root = tmp_path / "abl"
    for variant in ("", "gate=bounded"):
        extra = (f"mixer.{variant}",) if variant else ()
        for seed in SEEDS:
            write_run(
                root / f"{variant or 'base'}-{seed}",
                task="mqar",
                mixer="kda",
                seq_len=64,
                lr=1e-3,
                seed=seed,
                extra_overrides=extra,
            )
    plot.main([str(root), "--out", str(tmp_path / "f")])
    data = pd.read_csv(tmp_path / "f" / "acc_vs_length.csv", keep_default_na=False)
    assert sorted(data["series"]) == ["kda", "kda [gate=bounded]"]


def test_plot_with_nothing_scored_says_so(tmp_path: Path) -> None:
    write_run(tmp_path / "r", task="mqar", mixer="kda", seq_len=64, lr=1e-3, seed=0, status="failed")
    with pytest.raises(ValueError, match="no completed runs"):
        plot.plot_all(collect.collect_dirs([tmp_path]), tmp_path / "out")


def test_one_colour_per_mixer() -> None:
    colours = [mixer_colour(m) for m in MIXER_COLOURS]
    assert len(set(colours)) == len(colours)
    # A mixer nobody listed gets a stable colour that is not one of the listed mixers'.
    assert mixer_colour("my_new_mixer") == mixer_colour("my_new_mixer")
    assert mixer_colour("my_new_mixer") not in colours


def test_names_that_hash_alike_get_distinct_colours_in_one_figure() -> None:
    # these two hash to the same fallback colour: one figure must still tell them apart
    assert mixer_colour("my_mixer") == mixer_colour("kda*2,gdn*2")
    colours = figure_colours({"kda", "my_mixer", "kda*2,gdn*2", "gdn:attention 3:1"})
    assert colours["kda"] == MIXER_COLOURS["kda"]
    assert len(set(colours.values())) == 4
    assert colours["kda*2,gdn*2"] == mixer_colour("kda*2,gdn*2")  # the first in sorted order keeps its own
    assert colours == figure_colours(["gdn:attention 3:1", "kda*2,gdn*2", "my_mixer", "kda"])
    frame = pd.DataFrame({"series": ["my_mixer", "kda*2,gdn*2"], "mixer": ["my_mixer", "kda*2,gdn*2"],
                          "variant": ["", ""]})
    styles = draw.style(frame)
    assert styles["my_mixer"]["color"] != styles["kda*2,gdn*2"]["color"]


def test_collect_wandb_with_a_stand_in_api() -> None:
    def run(name: str, state: str, summary: dict, seed: int) -> SimpleNamespace:
        return SimpleNamespace(
            id=name,
            name=name,
            group="kimi_fig4",
            state=state,
            tags=["task:mqar", "mixer:kda"] if seed == 0 else ["task:mqar"],
            config={
                "task": {"name": "mqar", "seq_len": 256},
                "mixer": {"_target_": "mixers.kda.KDA"},
                "optim": {"lr": 1e-3},
                "seed": seed,
                "_wandb": {"x": 1},
            },
            summary=SimpleNamespace(_json_dict=summary),
        )

    runs = [
        run(
            "a",
            "finished",
            {"status": "completed", "best_eval_acc": 0.9, "steps_to_threshold": 300, "_runtime": 5},
            0,
        ),
        run("b", "crashed", {}, 1),
        run("c", "running", {"train/loss": 1.0}, 2),
    ]
    calls = []

    class Api:
        def runs(self, path: str, filters: dict | None = None) -> list[SimpleNamespace]:
            calls.append((path, filters))
            return runs

    table = collect.collect_wandb("team/proj", group="kimi_fig4", api=Api())
    assert calls == [("team/proj", {"group": "kimi_fig4"})]
    assert list(table["status"]) == ["completed", "failed", "incomplete"]
    assert table.loc[0, "best_eval_acc"] == 0.9 and table.loc[0, "steps_to_threshold"] == 300
    assert list(table["seq_len"]) == [256] * 3 and list(table["seed"]) == [0, 1, 2]
    assert list(table["mixer"]) == ["kda"] * 3
    assert "_wandb.x" not in table and "_runtime" not in table
    assert table.loc[1, "reason"] == "W&B run state crashed"
    with pytest.raises(ValueError, match="entity/project"):
        collect.collect_wandb("proj", api=Api())
