"""Sweeps end to end: the experiment configs, joblib with a failing job, re-launch, and real SLURM.

The smoke sweep runs for real (train.py in subprocesses, as a user runs it): 2 mixers x 2 learning
rates through joblib with 2 jobs at once, plus one job that fails on purpose; then analysis.collect
and analysis.plot, checked against the run directories. The SLURM tests start a one-node cluster
(tests/slurm/) and skip without it, naming tests/slurm/install.sh.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
import yaml

from analysis import collect, plot

if TYPE_CHECKING:
    from slurm.fixture import SlurmCluster

# The session's SLURM cluster fixture (`slurm_cluster`), started only when a SLURM test runs.
pytest_plugins = ["slurm.fixture"]

# Under `pytest -n`: one worker runs this file, so its module fixture (the smoke sweep) runs once and
# only one SLURM test cluster starts (two would contend for its ports).
pytestmark = pytest.mark.xdist_group("sweeps")

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SMOKE_MIXERS = {"gdn", "kda"}
SMOKE_LRS = {3e-3, 1e-2}
SMOKE_STEPS = 200


def _experiment_key() -> str:
    """`experiment` when conf/config.yaml lists the group in its defaults, else `+experiment`."""
    defaults = yaml.safe_load((CONF / "config.yaml").read_text()).get("defaults", [])
    listed = any(isinstance(d, dict) and any(k.split(" ")[-1] == "experiment" for k in d) for d in defaults)
    return "experiment" if listed else "+experiment"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # One intra-op thread per job: two jobs on two cores, no oversubscription (10x slower otherwise).
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled", HYDRA_FULL_ERROR="1")
    env.update(extra or {})
    return env


def _command(experiment: str, sweep_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "train.py",
        "-m",
        f"{_experiment_key()}={experiment}",
        f"hydra.sweep.dir={sweep_dir}",
        *overrides,
    ]


def run_sweep(
    experiment: str, sweep_dir: Path, *overrides: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        _command(experiment, sweep_dir, *overrides),
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result


def run_sweeps(
    sweep_dir: Path, *launches: tuple[str, ...], timeout: float = 300
) -> list[subprocess.CompletedProcess[str]]:
    """Several sweeps into one sweep dir at once, each `(experiment, *overrides)`; their results in order.
    They may share the directory: each sweep reports only its own jobs, and each run has its own."""
    with contextlib.ExitStack() as stack:
        # files, not pipes: a sweep never waits for the test to read its output
        outputs = [(stack.enter_context(tempfile.TemporaryFile("w+")), stack.enter_context(
            tempfile.TemporaryFile("w+"))) for _ in launches]
        processes = [
            subprocess.Popen(_command(experiment, sweep_dir, *overrides), cwd=ROOT, env=_env(),
                             stdout=stdout, stderr=stderr, text=True)
            for (experiment, *overrides), (stdout, stderr) in zip(launches, outputs, strict=True)
        ]
        try:
            deadline = time.monotonic() + timeout
            for process in processes:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        results = []
        for process, (stdout, stderr) in zip(processes, outputs, strict=True):
            stdout.seek(0)
            stderr.seek(0)
            results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout.read(),
                                                       stderr.read()))
        return results


def _ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (
        f"sweep failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


def _log_start(run_dir: Path) -> datetime:
    first = (run_dir / "train.log").read_text().splitlines()[0]
    return datetime.strptime(first[1:24], "%Y-%m-%d %H:%M:%S,%f")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke sweep through the local launcher (2 at once) plus the failing and the diverging job, in one
    sweep dir, the three sweeps launched together."""
    sweep_dir = tmp_path_factory.mktemp("sweeps") / "smoke"
    # The failing job goes through submitit_local, the SLURM launcher's code path without a cluster.
    done, failing, diverging = run_sweeps(
        sweep_dir,
        ("smoke", "hydra/launcher=local", "hydra.launcher.n_jobs=2"),
        ("smoke_fail", "hydra/launcher=submitit_local"),
        ("smoke_diverge",),
    )
    _ok(done)
    # The failing job is recorded, and its sweep ends with the status lines and exit 1.
    said = failing.stdout + failing.stderr
    assert failing.returncode == 1 and "1 of 1 jobs did not finish" in said, said[-3000:]
    assert re.search(r"failed +1: mixer=kda/optim.lr=0.003/task.params.num_pairs=20 \(ValueError", said)
    _ok(diverging)
    return sweep_dir


@pytest.mark.slow
def test_smoke_sweep_records_every_run_with_its_status(smoke: Path) -> None:
    table = collect.collect_dirs([smoke])
    assert len(table) == len(SMOKE_MIXERS) * len(SMOKE_LRS) + 2
    diverged = table[table["status"] == "diverged"]
    assert len(diverged) == 1 and diverged.iloc[0]["mixer"] == "attention"
    assert "non-finite" in diverged.iloc[0]["reason"] and diverged.iloc[0]["steps"] < SMOKE_STEPS
    failed = table[table["status"] == "failed"]
    assert len(failed) == 1
    assert "num_pairs=20" in failed.iloc[0]["reason"] and failed.iloc[0]["task.params.num_pairs"] == 20
    assert "ValueError" in (Path(failed.iloc[0]["run_dir"]) / "train.log").read_text()
    assert list((smoke / ".submitit").glob("*/*_log.out")), "smoke_fail did not go through submitit_local"
    done = table[table["status"] == "completed"]
    assert {(m, lr) for m, lr in zip(done["mixer"], done["lr"], strict=True)} == {
        (m, lr) for m in SMOKE_MIXERS for lr in SMOKE_LRS
    }
    assert (done["steps"] == SMOKE_STEPS).all()
    # No terminal in the launcher's workers: still a progress line every trainer.log_every (25) steps, each
    # line led by the run's name, as the console shows them too.
    for _, run in done.iterrows():
        name = f"[mqar/{run['mixer']}/L32/lr{'3e-3' if run['lr'] == 3e-3 else '1e-2'}/s0] "
        log = (Path(run["run_dir"]) / "train.log").read_text().splitlines()
        lines = [line.split(" - ", 1)[1] for line in log if "][train][" in line]
        assert lines and all(line.startswith(name) for line in lines), lines[:3]
        progress = [line for line in lines if line.startswith(name + "step ")]
        logged = [int(line.split()[2].split("/")[0]) for line in progress]
        assert logged == [1, *range(25, SMOKE_STEPS + 1, 25)]
        assert all("steps/s" in line and "tok/s" in line for line in progress)
    assert done["best_eval_acc"].between(0, 1).all() and (done["state_size"] > 0).all()
    # Run dirs are named by their overrides, so that a re-launch finds them.
    assert set(done["run"]) == {f"mixer={m}/optim.lr={lr}" for m in SMOKE_MIXERS for lr in SMOKE_LRS}
    # W&B group and tags by interpolation, resolved in the run.
    summary = json.loads((Path(done.iloc[0]["run_dir"]) / "summary.json").read_text())
    tags = summary["config"]["logger.wandb.tags"]
    assert summary["config"]["logger.wandb.group"] == "smoke"
    assert tags == ["task:mqar", f"mixer:{summary['mixer']}", "len:32", f"lr:{summary['lr']}"]


@pytest.mark.slow
def test_joblib_ran_two_jobs_at_once(smoke: Path) -> None:
    done = [
        p.parent for p in smoke.rglob("summary.json") if json.loads(p.read_text())["status"] == "completed"
    ]
    spans = sorted(
        (_log_start(d), datetime.fromtimestamp((d / "summary.json").stat().st_mtime)) for d in done
    )
    # Two workers: the second job starts before the first one ends.
    assert spans[1][0] < spans[0][1], spans


@pytest.mark.slow
def test_collect_and_plot_the_smoke_sweep(smoke: Path, tmp_path: Path) -> None:
    assert collect.main([str(smoke), "--out", str(tmp_path / "table.csv")]) == 0
    table = collect.read_table(tmp_path / "table.csv")
    assert plot.main([str(tmp_path / "table.csv"), "--out", str(tmp_path / "figs")]) == 0
    figs = tmp_path / "figs"
    for name in ("acc_vs_length", "acc_vs_steps_len32", "lr_sensitivity", "acc_vs_state_size"):
        for suffix in (".png", ".pdf", ".csv"):
            assert (figs / f"{name}{suffix}").stat().st_size > 0
    done = table[table["status"] == "completed"]
    # Only completed runs have an accuracy: the diverged and the failed run are rows without one.
    by_length = pd.read_csv(figs / "acc_vs_length.csv")
    assert set(by_length["mixer"]) == SMOKE_MIXERS | {"attention"}
    scored = by_length[by_length["n_seeds"] > 0]
    assert set(scored["mixer"]) == SMOKE_MIXERS
    # Peak accuracy per mixer = the best learning rate's (one seed here).
    for _, row in scored.iterrows():
        runs = done[done["mixer"] == row["mixer"]]
        best = runs.loc[runs["best_eval_acc"].idxmax()]
        assert row["acc_mean"] == pytest.approx(best["best_eval_acc"] * 100)
        assert row["lr"] == pytest.approx(best["lr"])
    unscored = by_length[by_length["n_seeds"] == 0]
    assert unscored["acc_mean"].isna().all()
    # the failing job's extra override makes it a series of its own (a variant of kda)
    assert sorted(zip(unscored["mixer"], unscored["n_diverged"], unscored["n_failed"], strict=True)) == [
        ("attention", 1, 0), ("kda", 0, 1)]
    # The curve is that run's metrics.jsonl.
    steps = pd.read_csv(figs / "acc_vs_steps_len32.csv")
    for mixer in SMOKE_MIXERS:
        curve = steps[steps["mixer"] == mixer]
        run_dir = Path(
            done[(done["mixer"] == mixer) & (done["lr"] == curve["lr"].iloc[0])]["run_dir"].iloc[0]
        )
        evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        evals = {r["step"]: r["eval/acc"] * 100 for r in evals if "eval/acc" in r}
        assert dict(zip(curve["step"], curve["acc_mean"], strict=True)) == pytest.approx(evals)
    heat = pd.read_csv(figs / "lr_sensitivity.csv")
    assert len(heat) == len(table)  # a cell per run here
    for _, row in heat[heat["n_seeds"] > 0].iterrows():
        run = done[(done["mixer"] == row["mixer"]) & (done["lr"] == row["lr"])].iloc[0]
        assert row["acc_mean"] == pytest.approx(run["best_eval_acc"] * 100)
    assert heat[heat["n_seeds"] == 0]["acc_mean"].isna().all()
    state = pd.read_csv(figs / "acc_vs_state_size.csv")
    assert set(state["mixer"]) == SMOKE_MIXERS
    for _, row in state.iterrows():
        assert row["state_size"] == done[done["mixer"] == row["mixer"]]["state_size"].iloc[0]
    summary = (figs / "summary.md").read_text()
    assert "6 runs: 4 completed, 1 diverged, 1 failed, 0 incomplete." in summary
    assert "num_pairs=20" in summary


@pytest.mark.slow
def test_relaunch_skips_completed_runs(smoke: Path) -> None:
    done = [p for p in smoke.rglob("summary.json") if json.loads(p.read_text())["status"] != "failed"]
    before = {p: (p.stat().st_mtime_ns, p.read_text()) for p in done}
    metrics = {p: (p.parent / "metrics.jsonl").read_text() for p in done}
    # Both sweeps again (at once): completed and diverged runs are final.
    result, again = run_sweeps(smoke, ("smoke",), ("smoke_diverge",))
    _ok(result)
    _ok(again)
    assert {p: (p.stat().st_mtime_ns, p.read_text()) for p in done} == before
    assert {p: (p.parent / "metrics.jsonl").read_text() for p in done} == metrics
    output = result.stdout + result.stderr + again.stdout + again.stderr
    assert output.count("already completed") == len(done) - 1 and output.count("already diverged") == 1
    # No new run directories: the re-launch landed in the same ones.
    assert len(collect.find_run_dirs(smoke)) == len(SMOKE_MIXERS) * len(SMOKE_LRS) + 2


@pytest.mark.slow
def test_relaunch_resumes_an_interrupted_run(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "smoke"
    # Half the smoke run with a checkpoint every quarter: the kill comes after the first, 75 steps before
    # the end.
    steps = SMOKE_STEPS // 2
    one = ["mixer=gdn", "optim.lr=1e-2", f"trainer.max_steps={steps}",
           f"trainer.checkpoint_every={steps // 4}"]
    process = subprocess.Popen(
        _command("smoke", sweep_dir, *one),
        cwd=ROOT,
        env=_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        checkpoint = None
        while time.monotonic() < deadline and process.poll() is None:
            found = list(sweep_dir.rglob("checkpoint.pt"))
            if found:
                checkpoint = found[0]
                break
            time.sleep(0.2)
        assert checkpoint is not None, "no checkpoint written before the run ended"
        # A hard kill, as a node failure or an out-of-time job: no chance to write anything more.
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    run_dir = checkpoint.parent
    assert not (run_dir / "summary.json").exists()
    assert collect.collect_dirs([sweep_dir])["status"].tolist() == ["incomplete"]

    _ok(run_sweep("smoke", sweep_dir, *one))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == steps
    log = (run_dir / "train.log").read_text()
    resumed = re.search(r"resumed from .* at step (\d+)", log)
    assert resumed and int(resumed.group(1)) % (steps // 4) == 0 and 0 < int(resumed.group(1)) < steps
    logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [s for s in logged if s > 0]
    assert max(logged) == steps and train_steps == sorted(train_steps)
    # Each logged step once: the resumed run neither repeats nor skips a log line.
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["step"], "eval/acc" in r) for r in records]
    assert len(keys) == len(set(keys))


def _expand_grid(params: Any) -> dict[str, list[str]]:
    """The values of each key of a sweeper's `params` as the sweeper expands them (comma lists, and
    `glob(*)` over a config group's options), against the config tree initialised by the caller."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    overrides = parser.parse_overrides([f"{key}={value}" for key, value in params.items()])
    return {o.key_or_group: list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(o.value())]
            for o in overrides}


def test_experiment_grids_compose() -> None:
    """Every experiment composes against the real config tree, with the grid it documents."""
    from hydra import compose, initialize_config_dir

    import harness.config  # noqa: F401  (registers the structured base config)

    mixers = {p.stem for p in (CONF / "mixer").glob("*.yaml")}
    variants = {p.stem for p in (CONF / "experiment" / "ablation").glob("*.yaml")}
    key = _experiment_key()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        grids = {}
        for name in ("kimi_fig4", "all_mixers", "kda_ablations", "smoke", "smoke_fail", "smoke_diverge"):
            cfg = compose("config", overrides=[f"{key}={name}"], return_hydra_config=True)
            grids[name] = _expand_grid(cfg.hydra.sweeper.params)
            assert cfg.hydra.sweep.dir == f"runs/sweeps/{'smoke' if name.startswith('smoke') else name}"
            assert cfg.logger.wandb.group == ("smoke" if name.startswith("smoke") else name)
            if name in ("kimi_fig4", "all_mixers", "kda_ablations"):
                assert (cfg.model.num_layers, cfg.mixer.num_heads, cfg.mixer.head_dim) == (2, 2, 128)
                assert cfg.trainer.max_steps == 20000
                assert {float(x) for x in grids[name]["optim.lr"]} == {5e-5, 1e-4, 5e-4, 1e-3}
                assert set(grids[name]["task.seq_len"]) == {"256", "512", "1024", "2048"}
                assert set(grids[name]["task"]) == {"palindrome", "mqar", "stack"}
                assert set(grids[name]["seed"]) == {"0", "1", "2"}
        assert set(grids["kimi_fig4"]["mixer"]) == {"kda", "gdn", "mamba2"}
        # every conf/mixer/*.yaml, a mixer added as docs/adding_a_mixer.md says included
        assert sorted(grids["all_mixers"]["mixer"]) == sorted(mixers)
        assert set(grids["kda_ablations"]["experiment/ablation"]) == variants
        # The launcher configs compose onto the real launchers.
        for launcher, target in (("local", "LocalLauncher"), ("joblib_gpu", "LocalLauncher"),
                                 ("slurm", "SlurmLauncher")):
            cfg = compose(
                "config", overrides=[f"{key}=smoke", f"hydra/launcher={launcher}"], return_hydra_config=True
            )
            assert cfg.hydra.launcher._target_.endswith(target)
        cfg = compose("config", overrides=[f"{key}=smoke", "hydra/launcher=slurm"], return_hydra_config=True)
        assert cfg.hydra.launcher.max_num_timeout > 0 and cfg.hydra.launcher.gpus_per_node == 1
        # Each ablation is KDA with at most two switches changed from the yaml's defaults.
        base = compose("config", overrides=[f"{key}=kda_ablations"])
        for variant in variants:
            cfg = compose("config", overrides=[f"{key}=kda_ablations", f"experiment/ablation={variant}"])
            changed = {k for k in base.mixer if cfg.mixer[k] != base.mixer[k]}
            assert cfg.mixer._target_ == "mixers.kda.KDA"
            assert (len(changed) == 0) == (variant == "baseline") and len(changed) <= 2, (variant, changed)


def _slurm_overrides() -> list[str]:
    # The test cluster: one partition, 2 CPUs, no GPU. timeout_min well above 10 min: submitit counts a
    # signal within the first 80% of the limit as preemption (requeue), later as a timeout.
    return [
        "hydra/launcher=slurm",
        "hydra.launcher.partition=debug",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.gpus_per_node=null",
        "hydra.launcher.mem_gb=null",
        "hydra.launcher.timeout_min=60",
        "hydra.launcher.array_parallelism=2",
    ]


def _job_of(run_dir: Path) -> str:
    hydra = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]
    return str(hydra["job"]["id"])


@pytest.mark.slow
@pytest.mark.slurm
def test_smoke_sweep_on_slurm_survives_preemption(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The smoke sweep through submitit on SLURM; one job preempted mid-run is requeued and resumes."""
    sweep_dir = tmp_path / "smoke"
    overrides = [*_slurm_overrides(), "trainer.checkpoint_every=25"]
    process = subprocess.Popen(
        _command("smoke", sweep_dir, *overrides),
        cwd=ROOT,
        env=_env(slurm_cluster.env),
        stdout=(tmp_path / "hydra.out").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    preempted = None
    signaller: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 150
        while preempted is None and time.monotonic() < deadline and process.poll() is None:
            for checkpoint in sweep_dir.rglob("checkpoint.pt"):
                run_dir = checkpoint.parent
                if not (run_dir / "summary.json").exists():
                    job = _job_of(run_dir)
                    # What SLURM sends before a time limit or preemption (--signal=USR2@...): submitit
                    # requeues the job. scancel retries while the job is in transition, and a retry that
                    # reaches the restarted job kills it: stop scancel once submitit has caught the signal.
                    signaller = subprocess.Popen(
                        ["scancel", "--signal=USR2", job],
                        env=slurm_cluster.env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    caught = time.monotonic() + 30
                    while time.monotonic() < caught and not any(
                        "Caught signal SIGUSR2" in err.read_text()
                        for err in sweep_dir.glob(f".submitit/{job}/*.err")
                    ):
                        time.sleep(0.1)
                    signaller.kill()
                    preempted = run_dir
                    break
            time.sleep(0.2)
        process.wait(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        if signaller is not None and signaller.poll() is None:
            signaller.kill()
    output = (tmp_path / "hydra.out").read_text()
    assert preempted is not None, "no run was caught between its first checkpoint and its end"
    assert process.returncode == 0, output[-4000:]
    table = collect.collect_dirs([sweep_dir])
    assert len(table) == len(SMOKE_MIXERS) * len(SMOKE_LRS)
    assert (table["status"] == "completed").all(), table[["run_dir", "status", "reason"]]
    assert set(table["mixer"]) == SMOKE_MIXERS and {float(x) for x in table["lr"]} == SMOKE_LRS
    assert all(re.fullmatch(r"\d+_\d", job) for job in table["job_id"]), table["job_id"]
    log = (preempted / "train.log").read_text()
    assert re.search(r"resumed from .* at step \d+", log), log[-2000:]
    assert json.loads((preempted / "summary.json").read_text())["steps"] == SMOKE_STEPS


@pytest.mark.slow
@pytest.mark.slurm
def test_slurm_cancelled_job_is_failed_and_sweep_ends(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """scancel kills a running job: the sweep ends (not hangs) and the run is reported failed."""
    sweep_dir = tmp_path / "cancel"
    one = ["mixer=gdn", "optim.lr=1e-2", "trainer.max_steps=100000"]
    process = subprocess.Popen(
        _command("smoke", sweep_dir, *_slurm_overrides(), *one),
        cwd=ROOT,
        env=_env(slurm_cluster.env),
        stdout=(tmp_path / "hydra.out").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        logs: list[Path] = []
        while not logs and time.monotonic() < deadline and process.poll() is None:
            logs = [p for p in sweep_dir.rglob("metrics.jsonl") if p.stat().st_size > 0]
            time.sleep(0.5)
        assert logs, "the job never started training"
        job = _job_of(logs[0].parent)
        slurm_cluster.run("scancel", job)
        slurm_cluster.wait_for_state(job, {"CANCELLED"}, timeout_s=30)
        process.wait(timeout=150)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = (tmp_path / "hydra.out").read_text()
    assert process.returncode != 0
    assert "UncompletedJobError" in output and "CANCELLED" in output, output[-3000:]
    table = collect.collect_dirs([sweep_dir])
    assert table["status"].tolist() == ["failed"]
    assert table["reason"].iloc[0] == f"SLURM job {job} cancelled"
