"""tools/campaign.py on the CPU: a detached campaign of two stages, packed, unpacked into a checkout that then
skips what it holds; a stop mid-run; archives that must not unpack."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import caches

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "tools" / "campaign.py"
TINY = ("experiment=smoke hydra/launcher=local hydra.sweep.dir=results/campaign_test trainer.max_steps=6 "
        "trainer.eval_every=3 trainer.log_every=3")


@pytest.fixture(autouse=True)
def registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The record of campaign work directories that every start of a test writes, in process or in the
    subprocesses that inherit the variable: the test's own, never the machine's (~/.cache)."""
    path = tmp_path_factory.mktemp("registry") / "campaigns.json"
    monkeypatch.setenv("KDA_CAMPAIGN_REGISTRY", str(path))
    return path


def _campaign(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, CAMPAIGN, *map(str, args)], capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _checkout(tmp_path: Path) -> Path:
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "runs", "__pycache__", ".*cache",
                                                              "campaign_test"))
    return copy


@pytest.mark.slow  # real training runs through the detached supervisor: a minute on 2 cores
def test_a_campaign_runs_its_stages_detached_and_a_fresh_one_skips_what_the_checkout_holds(
        tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    plan = tmp_path / "plan.txt"
    plan.write_text(f"# two stages\n{TINY} hydra.launcher.n_jobs=2 mixer=kda optim.lr=3e-3,1e-2\n\n"
                    f"{TINY} hydra.launcher.n_jobs=1 mixer=gdn optim.lr=3e-3  # a comment\n")
    out = tmp_path / "out"
    started = _campaign("start", plan, "--source", checkout, "--work", tmp_path / "work", "--minutes", 3,
                        "--out", out)
    assert "supervisor stopped; finished here 3, in flight 0" in started.stdout
    state = json.loads((tmp_path / "work" / "state.json").read_text())
    assert state["exits"] == [0, 0] and state["stopped"] is False
    (archive,) = out.glob("campaign-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    runs = {Path(n).parent for n in names if n.endswith("summary.json")}
    assert len(runs) == 3 and all(str(run).startswith("results/campaign_test/mixer=") for run in runs)
    assert not any("checkpoint" in n for n in names)
    assert all(any(n == f"{run}/{f}" for n in names) for run in runs
               for f in ("metrics.jsonl", "train.log", ".hydra/config.yaml", ".hydra/overrides.yaml"))

    # unpacked into the checkout (as one commits them), a new campaign on a new machine trains nothing
    unpacked = _campaign("unpack", archive, "--into", checkout)
    assert "3 run(s) unpacked" in unpacked.stdout
    again = _campaign("unpack", archive, "--into", checkout)
    assert "0 run(s) unpacked" in again.stdout and "3 already there" in again.stdout
    before = {run: (checkout / run / "metrics.jsonl").read_text() for run in runs}
    second = _campaign("start", plan, "--source", checkout, "--work", tmp_path / "work2", "--minutes", 3,
                       "--out", tmp_path / "out2")
    # the checkout's committed results are brought too
    held = len(_module().run_dirs(checkout))
    assert held >= 3 and f"finished here 0, in flight 0, brought {held}" in second.stdout
    assert not (tmp_path / "out2").exists()
    assert {run: (tmp_path / "work2" / "src" / run / "metrics.jsonl").read_text() for run in runs} == before
    assert "already completed" in (tmp_path / "work2" / "stage-01.log").read_text()


def test_stop_ends_the_runs_in_flight_which_checkpoint_and_are_not_packed(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    plan = tmp_path / "plan.txt"
    plan.write_text(f"{TINY} hydra.launcher.n_jobs=1 mixer=gdn trainer.max_steps=100000 "
                    "trainer.checkpoint_every=2\n")
    work = tmp_path / "work"
    _campaign("start", plan, "--source", checkout, "--work", work)
    # stopped once it has a checkpoint: a stop inside the first steps leaves none, and says so
    checkpoints = _first_checkpoint(work)
    metrics = [checkpoints[0].parent / "metrics.jsonl"]
    status = _campaign("status", "--work", work)
    assert "supervisor running" in status.stdout and "in flight 1" in status.stdout
    stopped = _campaign("stop", "--work", work, "--out", tmp_path / "out", "--without-checkpoints")
    assert "campaign: stopped" in stopped.stdout and "finished here 0, in flight 1" in stopped.stdout
    assert not (tmp_path / "out").exists()
    run = metrics[0].parent
    assert f"not packed: {run.relative_to(work / 'src')} " in stopped.stdout
    assert json.loads((run / "summary.json").read_text())["status"] == "incomplete"
    assert (run / "checkpoint.pt").exists()
    state = json.loads((work / "state.json").read_text())
    assert state["stopped"] is True
    # nothing of the campaign is left running: the supervisor and its sweep's process group are gone
    stat = Path(f"/proc/{state['pid']}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # gone, or unreaped
    assert [p for p in Path("/proc").glob("[0-9]*") if str(work) in _where(p)] == []


def _empty_work(tmp_path: Path) -> Path:
    """A campaign's work copy that holds no run and brought none."""
    work = tmp_path / "work"
    (work / "src" / "results").mkdir(parents=True)
    (work / "brought.json").write_text("{}")
    return work


def _first_checkpoint(work: Path) -> list[Path]:
    """The checkpoints of the campaign in `work` once its run has written one (within two minutes)."""
    deadline = time.monotonic() + 120
    checkpoints: list[Path] = []
    while not checkpoints and time.monotonic() < deadline:
        time.sleep(0.5)
        checkpoints = list((work / "src" / "results" / "campaign_test").rglob("checkpoint.pt"))
    assert checkpoints, "the run never checkpointed"
    return checkpoints


def _where(proc: Path) -> str:
    """A process's command line and working directory ('' once it is gone)."""
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace") + " " + os.readlink(proc / "cwd")
    except OSError:
        return ""


def _archive(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("name", ["../evil/summary.json", "/tmp/evil/summary.json", "src/summary.json",
                                  "results/../../x/summary.json"])
def test_unpack_refuses_files_outside_the_run_roots(tmp_path: Path, name: str) -> None:
    archive = _archive(tmp_path / "a.tar.gz", {name: b"{}"})
    result = subprocess.run([sys.executable, CAMPAIGN, "unpack", archive, "--into", tmp_path / "co"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "refuses to unpack" in result.stderr
    assert not (tmp_path / "co").exists() and not (tmp_path / "evil").exists()


def test_unpack_keeps_a_finished_run_whose_summary_differs(tmp_path: Path) -> None:
    run = tmp_path / "co" / "results" / "x" / "r"
    run.mkdir(parents=True)
    (run / "summary.json").write_text('{"status": "completed", "steps": 5000}')
    archive = _archive(tmp_path / "a.tar.gz", {"results/x/r/summary.json": b'{"status": "completed"}',
                                               "results/x/r/metrics.jsonl": b'{"step": 1}\n'})
    result = _campaign("unpack", archive, "--into", tmp_path / "co")
    assert "kept results/x/r" in result.stdout
    assert json.loads((run / "summary.json").read_text())["steps"] == 5000
    assert not (run / "metrics.jsonl").exists()


@pytest.mark.parametrize("text, message", [("", "has no stage"),
                                           ("-m mixer=kda\n", "key=value overrides only"),
                                           ("mixer=kda foo\n", "key=value overrides only")])
def test_a_bad_plan_is_one_line_naming_it(tmp_path: Path, text: str, message: str) -> None:
    plan = tmp_path / "plan.txt"
    plan.write_text(text)
    result = subprocess.run([sys.executable, CAMPAIGN, "start", plan, "--work", tmp_path / "work"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "work").exists()


def _module():
    spec = importlib.util.spec_from_file_location("campaign", CAMPAIGN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # real training runs through the detached supervisor: a minute on 2 cores
def test_a_deadline_runs_cell_by_cell_into_the_directories_of_the_stages_multirun(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    plan = tmp_path / "plan.txt"
    stage = f"{TINY} hydra.launcher.n_jobs=2 mixer=kda,gdn optim.lr=3e-3,1e-2"
    plan.write_text(stage + "\n")
    holds = {"plain": (), "deadline": ("--hold-minutes", 28)}
    # the two campaigns side by side (each its own work copy): most of a start's time is its supervisor's
    # startup and its wait's polling, which overlap
    with concurrent.futures.ThreadPoolExecutor(len(holds)) as pool:
        results = {name: pool.submit(_campaign, "start", plan, "--source", checkout, "--work",
                                     tmp_path / name, *hold, "--minutes", 3) for name, hold in holds.items()}
    dirs = {}
    for name, result in results.items():
        assert "supervisor stopped; finished here 4, in flight 0" in result.result().stdout
        sweep = tmp_path / name / "src" / "results" / "campaign_test"
        dirs[name] = {str(p.parent.relative_to(sweep)) for p in sweep.rglob("summary.json")}
    assert len(dirs["plain"]) == 4 and dirs["deadline"] == dirs["plain"]
    # without a deadline the stage runs as its one multirun; with one, a multirun per pair of cells that
    # differ in the last key only (n_jobs=2), one mixer after the other
    assert f"stage 1/1: train.py -m {stage}" in (tmp_path / "plain" / "campaign.log").read_text()
    log = (tmp_path / "deadline" / "campaign.log").read_text()
    assert log.count("train.py -m") == 2 and "done: every cell has run" in log
    assert log.index("mixer=kda optim.lr=3e-3,1e-2") < log.index("mixer=gdn optim.lr=3e-3,1e-2")


def test_cells_expand_in_order_and_pack_n_jobs_to_a_multirun() -> None:
    campaign = _module()
    cells = campaign.expand([["experiment=e", "hydra.launcher.n_jobs=3", "task.seq_len=512", "mixer=kda,gdn",
                              "task=a,'b,c',d"], ["experiment=e", "task.seq_len=[1,2]"]])
    assert [c.overrides[3:] for c in cells[:6]] == [
        ["mixer=kda", "task=a"], ["mixer=kda", "task='b,c'"], ["mixer=kda", "task=d"],
        ["mixer=gdn", "task=a"], ["mixer=gdn", "task='b,c'"], ["mixer=gdn", "task=d"]]
    assert cells[6].overrides == ["experiment=e", "task.seq_len=[1,2]"] and len(cells) == 7
    group, postponed = campaign.choose(cells, list(range(7)), 600.0, {})
    assert group == [0, 1, 2] and postponed == []
    assert campaign.group_overrides([cells[i] for i in group])[3:] == ["mixer=kda", "task=a,'b,c',d"]


def _finished(root: Path, name: str, mixer: str, seq_len: int, wall: float, given: list[str],
              status: str = "completed", n_jobs: int | None = None, layers: int | None = None,
              jobs_per_gpu: int | None = None, gpu: str | None = None, task: str = "mqar",
              n_params: int | None = None) -> None:
    run = root / "results" / "x" / name
    (run / ".hydra").mkdir(parents=True)
    config = {"trainer.max_steps": 1000, **({"model.num_layers": layers} if layers else {})}
    (run / "summary.json").write_text(json.dumps({
        "status": status, "steps": 1001, "wall_time_s": wall + 10.0, "first_step_s": 10.0, "mixer": mixer,
        "seq_len": seq_len, "task": task, "config": config, **({"gpu": {"name": gpu}} if gpu else {}),
        **({"n_params": n_params} if n_params else {})}))
    overrides = [f"task={task}", f"task.seq_len={seq_len}", f"mixer={mixer}", "seed=0", *given]
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    launcher = f"  launcher:\n    _target_: x\n    n_jobs: {n_jobs}\n" if n_jobs else ""
    if jobs_per_gpu:  # as joblib_gpu records it: n_jobs null
        launcher = (f"  launcher:\n    _target_: x\n    n_jobs: {n_jobs or 'null'}\n"
                    f"    jobs_per_gpu: {jobs_per_gpu}\n")
    (run / ".hydra" / "hydra.yaml").write_text(
        f"hydra:\n{launcher}  sweeper:\n    params:\n      seed: '0'\n  help:\n")


def test_under_a_deadline_a_long_cell_waits_and_shorter_later_ones_run(tmp_path: Path) -> None:
    campaign = _module()
    # kda: 0.4 s a step at 2048 (410 s for 1000 steps), 0.05 at 256; a pilot with compilation off is slower
    # and is not counted; gdn was measured nowhere
    _finished(tmp_path, "a", "kda", 2048, 400.0, ["experiment=e"])
    _finished(tmp_path, "b", "kda", 256, 50.0, ["experiment=e"])
    _finished(tmp_path, "c", "kda", 1024, 900.0, ["experiment=e", "trainer.compile=false"])
    _finished(tmp_path, "d", "kda", 1024, 1.0, ["experiment=e"], status="failed")
    stages = [["experiment=e", "task.seq_len=2048", "mixer=kda,gdn", "task=mqar,stack"],
              ["experiment=e", "task.seq_len=1024", "mixer=kda", "task=mqar"],
              ["experiment=e", "task.seq_len=512", "mixer=gdn", "task=mqar"]]
    cells = campaign.expand(stages)
    runs = campaign.finished_runs(tmp_path)
    pending = [i for i, cell in enumerate(cells) if not campaign.is_finished(cell, runs)]
    assert pending == [1, 2, 3, 4, 5]  # kda mqar 2048 is there; the failed run at 1024 is trained again
    estimates = {i: campaign.estimate(cells[i], runs) for i in pending}
    assert estimates[1] == pytest.approx(410.0)
    assert estimates[2] == pytest.approx(410.0)  # gdn at 2048: kda's speed there
    assert estimates[4] == pytest.approx(0.05 * 4 * 1000 + 10.0)  # kda at 1024: from 256, times 4
    # no gdn anywhere, no run at 512: any mixer's at the nearest length (256), times 2
    assert estimates[5] == pytest.approx(0.05 * 2 * 1000 + 10.0)
    assert campaign.estimate(cells[5], []) is None
    group, postponed = campaign.choose(cells, pending, 8 * 60.0, estimates)
    assert group == [1] and postponed == []
    group, postponed = campaign.choose(cells, pending, 6 * 60.0, estimates)
    assert group == [4] and postponed == [1, 2, 3]
    group, postponed = campaign.choose(cells, [1, 2, 3, 5], 6 * 60.0, estimates)
    assert group == [5] and postponed == [1, 2, 3]
    assert campaign.choose(cells, [1, 2, 3], 6 * 60.0, estimates) == ([], [1, 2, 3])


def test_a_lone_cell_is_timed_from_lone_runs_not_from_packed_ones(tmp_path: Path) -> None:
    campaign = _module()
    # gdn measured only three to a GPU at 512 (0.3 s a step); kda and mamba2 alone at 2048
    _finished(tmp_path, "a", "gdn", 512, 300.0, ["experiment=e"], n_jobs=3)
    _finished(tmp_path, "b", "kda", 2048, 100.0, ["experiment=e"], n_jobs=1)
    _finished(tmp_path, "c", "mamba2", 2048, 60.0, ["experiment=e"])
    runs = campaign.finished_runs(tmp_path)
    assert sorted(run["n_jobs"] for run in runs) == [1, 1, 3]
    alone, packed = campaign.expand([
        ["experiment=e", "hydra.launcher.n_jobs=1", "task.seq_len=2048", "mixer=gdn", "task=mqar"],
        ["experiment=e", "hydra.launcher.n_jobs=3", "task.seq_len=256", "mixer=gdn", "task=mqar"]])
    # alone: the lone runs at its length (kda, mamba2), not gdn's packed step times four
    assert campaign.estimate(alone, runs) == pytest.approx((0.1 + 0.06) / 2 * 1000 + 10.0)
    # packed: gdn's own packed runs, halved for half the length
    assert campaign.estimate(packed, runs) == pytest.approx(0.3 / 2 * 1000 + 10.0)
    # n_jobs counts over the machine's GPUs: eight jobs on eight GPUs run alone, 24 three to a GPU
    (spread,) = campaign.expand([["experiment=e", "hydra.launcher.n_jobs=8", "task.seq_len=2048",
                                  "mixer=gdn", "task=mqar"]])
    assert campaign.estimate(spread, runs, gpus=8) == campaign.estimate(alone, runs)
    (three,) = campaign.expand([["experiment=e", "hydra.launcher.n_jobs=24", "task.seq_len=256",
                                 "mixer=gdn", "task=mqar"]])
    assert campaign.estimate(three, runs, gpus=8) == campaign.estimate(packed, runs)


def test_a_cell_is_timed_from_runs_of_its_own_experiment_and_group_choices_first(tmp_path: Path) -> None:
    campaign = _module()
    # kda at 2048 in the 2-layer grid (0.1 s a step); a 4-layer hybrid of another experiment is slower
    _finished(tmp_path, "a", "kda", 2048, 100.0, ["experiment=grid"])
    _finished(tmp_path, "b", "kda", 2048, 200.0, ["experiment=hybrid", "experiment/hybrid=kda3_attn1"])
    runs = campaign.finished_runs(tmp_path)
    grid, ratio, other_ratio, first = campaign.expand([
        ["experiment=grid", "task.seq_len=2048", "mixer=kda", "task=mqar"],
        ["experiment=hybrid", "experiment/hybrid=kda3_attn1", "task.seq_len=2048", "mixer=kda", "task=mqar"],
        ["experiment=hybrid", "experiment/hybrid=kda1_attn1", "task.seq_len=2048", "mixer=kda", "task=mqar"],
        ["experiment=new", "task.seq_len=2048", "mixer=kda", "task=mqar"]])
    assert campaign.estimate(grid, runs) == pytest.approx(0.1 * 1000 + 10.0)
    assert campaign.estimate(ratio, runs) == pytest.approx(0.2 * 1000 + 10.0)
    # a ratio not yet run: the runs of its experiment (the other ratio), not the 2-layer grid's
    assert campaign.estimate(other_ratio, runs) == pytest.approx(0.2 * 1000 + 10.0)
    # an experiment not yet run at all is timed from every alike run, as before (the hybrid's run set a
    # group this cell does not, so only the grid's)
    assert campaign.estimate(first, runs) == pytest.approx(0.1 * 1000 + 10.0)


def test_a_cell_is_timed_from_runs_on_the_machines_gpu_where_there_are_any(tmp_path: Path) -> None:
    campaign = _module()
    # kda at 2048: 0.1 s a step on the H200, 0.13 on the H100; gdn at 2048 measured on the H200 alone
    _finished(tmp_path, "a", "kda", 2048, 100.0, ["experiment=grid"], gpu="NVIDIA H200")
    _finished(tmp_path, "b", "kda", 2048, 130.0, ["experiment=grid"], gpu="NVIDIA H100 80GB HBM3")
    _finished(tmp_path, "c", "gdn", 2048, 80.0, ["experiment=grid"], gpu="NVIDIA H200")
    runs = campaign.finished_runs(tmp_path)
    kda, gdn = campaign.expand([["experiment=grid", "task.seq_len=2048", "mixer=kda", "task=mqar"],
                                ["experiment=grid", "task.seq_len=2048", "mixer=gdn", "task=mqar"]])
    assert campaign.estimate(kda, runs, gpu="NVIDIA H100 80GB HBM3") == pytest.approx(0.13 * 1000 + 10.0)
    assert campaign.estimate(kda, runs, gpu="NVIDIA H200") == pytest.approx(0.1 * 1000 + 10.0)
    # no GPU named (a CPU's `left`), or one with no run: every run, as before
    assert campaign.estimate(kda, runs) == pytest.approx(0.115 * 1000 + 10.0)
    assert campaign.estimate(kda, runs, gpu="NVIDIA B200") == pytest.approx(0.115 * 1000 + 10.0)
    # a cell whose runs are all of another GPU keeps them
    assert campaign.estimate(gdn, runs, gpu="NVIDIA H100 80GB HBM3") == pytest.approx(0.08 * 1000 + 10.0)
    estimates = campaign.estimates_of([kda, gdn], [0, 1], runs, [], gpu="NVIDIA H100 80GB HBM3")
    assert estimates[0] == pytest.approx(0.13 * 1000 + 10.0)


def test_a_deeper_stack_is_timed_in_proportion_to_its_layers(tmp_path: Path) -> None:
    campaign = _module()
    # only the 2-layer grid's kda at 2048 is measured (0.1 s a step): a hybrid of 8 layers (its group's
    # yaml), 4 (model.num_layers) or a pattern of 4 would otherwise be priced as 2 layers and cut off
    _finished(tmp_path, "a", "kda", 2048, 100.0, ["experiment=grid"], layers=2)
    runs = campaign.finished_runs(tmp_path)
    deep, four, pattern, same = campaign.expand([
        ["experiment=hybrid", "experiment/hybrid=kda7_attn1", "task.seq_len=2048", "mixer=kda", "task=mqar"],
        ["experiment=grid", "model.num_layers=4", "task.seq_len=2048", "mixer=kda", "task=mqar"],
        ["experiment=grid", "model.pattern=[kda*3,attention]", "task.seq_len=2048", "mixer=kda",
         "task=mqar"],
        ["experiment=grid", "task.seq_len=2048", "mixer=kda", "task=mqar"]])
    assert campaign.cell_layers(deep) == 8 and campaign.cell_layers(four) == 4
    assert campaign.cell_layers(pattern) == 4 and campaign.cell_layers(same) is None
    assert campaign.estimate(deep, runs) == pytest.approx(0.1 * 4 * 1000 + 10.0)
    assert campaign.estimate(four, runs) == pytest.approx(0.1 * 2 * 1000 + 10.0)
    assert campaign.estimate(pattern, runs) == pytest.approx(0.1 * 2 * 1000 + 10.0)
    assert campaign.estimate(same, runs) == pytest.approx(0.1 * 1000 + 10.0)
    # a run that did not record its depth is not scaled from
    _finished(tmp_path / "old", "b", "kda", 2048, 100.0, ["experiment=grid"])
    unknown = campaign.finished_runs(tmp_path / "old")
    assert campaign.estimate(deep, unknown) == pytest.approx(0.1 * 1000 + 10.0)


@pytest.mark.parametrize("trained_one", [False, True])
def test_a_campaign_whose_first_runs_fail_before_a_step_stops_there(tmp_path: Path,
                                                                    trained_one: bool) -> None:
    # a kernel that does not compile on the machine fails every run at step 0: the supervisor stops after
    # three instead of launching the plan's other cells; one run that trained a step keeps it going
    campaign, work = _module(), _empty_work(tmp_path)
    campaign._write_state(work, {"stages": [["experiment=e", "mixer=a,b,c,d,e,f"]],
                                 "deadline": time.time() + 3600})
    launched = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        run = work / "src" / "results" / "x" / overrides[-1]
        run.mkdir(parents=True)
        steps = 40 if trained_one and not launched else 0
        (run / "summary.json").write_text(json.dumps(
            {"status": "failed", "steps": steps, "error": "CompilationError: at 36:15:\n    q, k = ..."}))
        launched.append(overrides[-1])
        return 1

    ending = campaign.run_cells(work, campaign._state(work), launch, [])
    if trained_one:
        assert len(launched) == 6 and ending.startswith("done") and campaign.broken(work) is None
        return
    assert launched == ["mixer=a", "mixer=b", "mixer=c"]
    assert ending.startswith("stopped: the 3 runs of this campaign all failed before their first step "
                             "(CompilationError: at 36:15:)")


def test_compile_caches_travel_in_parts_and_restore_beside_what_is_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # a lent machine starts bare and sends back files of at most 16 MiB: its compile caches go back in
    # parts, and the next machine's start adds them to its own, keeping what it has
    campaign = _module()
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "first"))
    inductor = caches.inductor_name()
    entries = {f"{inductor}/fxgraph/ab/entry": os.urandom(300_000), "triton/XYZ/k.cubin": os.urandom(200_000)}
    for name, data in entries.items():
        path = tmp_path / "first" / "kda_harness" / "compile" / name
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
    monkeypatch.setattr(campaign, "PART_BYTES", 100_000)
    parts = campaign.save_caches(tmp_path / "out")
    assert len(parts) == 6 and all(part.stat().st_size <= 100_000 for part in parts)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in parts)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "next"))
    root = tmp_path / "next" / "kda_harness" / "compile"
    (root / "triton" / "XYZ").mkdir(parents=True)
    (root / "triton" / "XYZ" / "k.cubin").write_bytes(b"its own")
    assert campaign.restore_caches(list(reversed(parts))) == 1
    restored = root / inductor / "fxgraph" / "ab" / "entry"
    assert restored.read_bytes() == entries[f"{inductor}/fxgraph/ab/entry"]
    assert (root / "triton" / "XYZ" / "k.cubin").read_bytes() == b"its own"

    # a machine on another version of kernels/ takes the Triton binaries and none of inductor's graphs
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
    monkeypatch.setattr(caches, "code_version", lambda: "0" * 12)
    assert campaign.restore_caches(parts) == 1
    other = tmp_path / "other" / "kda_harness" / "compile"
    assert sorted(p.name for p in other.iterdir()) == ["triton"]
    assert "1 of inductor's from another version of kernels/ left out" in capsys.readouterr().out


def test_with_caches_needs_out_before_anything_is_packed(tmp_path: Path) -> None:
    command = [sys.executable, CAMPAIGN, "status", "--work", str(tmp_path / "w"), "--with-caches"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == \
        "campaign: --with-caches packs the compile caches into --out: give --out DIR"


def test_a_stage_of_many_jobs_runs_a_product_block_of_its_pending_cells() -> None:
    # n_jobs = GPUs x runs per GPU: one multirun takes every pending cell it can express (a product of the
    # swept keys' values), not only those that differ in the last key, so eight GPUs are not left with three
    campaign = _module()
    stage = ["experiment=e", "hydra.launcher.n_jobs=8", "mixer=a,b,c", "task=x,y,z"]
    cells = campaign.expand([stage])
    everything = list(range(9))
    group, _ = campaign.choose(cells, everything, 600.0, {})
    # 3 x 3 is more than 8: the block grows along the task first (a x {x,y,z}), then by whole rows (b)
    assert group == [0, 1, 2, 3, 4, 5]
    assert campaign.group_overrides([cells[i] for i in group])[2:] == ["mixer=a,b", "task=x,y,z"]
    # (a, y) and (c, x) already ran: the lead's row takes x and z, then b's x and z; c's z waits for c's x
    pending = [0, 2, 3, 4, 5, 7, 8]
    group, _ = campaign.choose(cells, pending, 600.0, {})
    assert group == [0, 2, 3, 5]
    assert campaign.group_overrides([cells[i] for i in group])[2:] == ["mixer=a,b", "task=x,z"]
    # nine jobs run the whole stage as its own multirun would
    cells = campaign.expand([["experiment=e", "hydra.launcher.n_jobs=9", "mixer=a,b,c", "task=x,y,z"]])
    group, _ = campaign.choose(cells, everything, 600.0, {})
    assert group == everything
    assert campaign.group_overrides([cells[i] for i in group]) == cells[0].overrides[:2] + ["mixer=a,b,c",
                                                                                            "task=x,y,z"]
    # a cell that does not fit before the deadline stays out, and so does the rest of its row (b): the
    # block takes the rows that are whole
    group, postponed = campaign.choose(cells, everything, 600.0, {4: 900.0})
    assert postponed == [4] and group == [0, 1, 2, 6, 7, 8]


def test_left_prices_what_a_plan_still_has_to_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    campaign = _module()
    # kda at 2048 ran (0.4 s a step); gdn at 2048 is priced from it, two cells at 256 run together
    _finished(tmp_path, "a", "kda", 2048, 400.0, ["experiment=e"])
    _finished(tmp_path, "b", "kda", 256, 50.0, ["experiment=e"], n_jobs=2)
    plan = tmp_path / "plan.txt"
    plan.write_text("experiment=e task.seq_len=2048 mixer=kda,gdn task=mqar\n"
                    "experiment=e hydra.launcher.n_jobs=2 task.seq_len=256 mixer=kda task=stack,palindrome\n")
    seconds = campaign.left([plan], tmp_path)
    # gdn at 2048: 0.4 s x 1,000 steps + 10 s; the pair at 256: one launch of 0.05 x 1,000 + 10 s
    assert seconds == pytest.approx(410.0 + 60.0)
    out = capsys.readouterr().out
    assert "3 of 4 cells left" in out and "at most 8 min of device time" in out
    assert "stage 2 task=stack" in out and "(with 1 other(s) at once)" in out
    # each line says when its group ends, from the first launch: gdn's 410 s, then the pair's 60 s after it
    assert "stage 1 mixer=gdn" in out and "done by   6.8" in out and out.count("done by   7.8") == 2
    # on two GPUs gdn takes one for 410 s; the pair, one run a GPU there (n_jobs=2 over 2 GPUs, so timed
    # from the lone kda run scaled to 256: 60 s each), runs one after the other on the second GPU beside it
    two = campaign.left([plan], tmp_path, gpus=2)
    assert two == pytest.approx(410.0)


def _ran(src: Path, mixer: str, status: str = "completed", steps: int = 10) -> Path:
    """The run of the cell `experiment=e mixer=MIXER` as train.py leaves it in the copy `src`."""
    run = src / "results" / "x" / mixer
    (run / ".hydra").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"status": status, "steps": steps}))
    (run / ".hydra" / "overrides.yaml").write_text(f"- experiment=e\n- mixer={mixer}\n")
    (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  sweeper:\n    params:\n  help:\n")
    return run


def test_a_cell_that_an_earlier_stage_ran_is_not_launched_again(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    # a plan that runs a claim's cells first holds them again in the grid's stages: each runs once
    campaign, work = _module(), _empty_work(tmp_path)
    stages = [["experiment=e", "mixer=b"], ["experiment=e", "mixer=a,b,c"]]
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 3600})
    launched = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        mixer = overrides[-1].split("=")[1]
        _ran(work / "src", mixer)
        launched.append(mixer)
        return 0

    assert campaign.run_cells(work, campaign._state(work), launch, []).startswith("done")
    assert launched == ["b", "a", "c"]
    plan = tmp_path / "plan.txt"
    plan.write_text("experiment=e mixer=b\nexperiment=e mixer=a,b,c\n")
    capsys.readouterr()
    assert campaign.left([plan], work / "src") == 0.0
    assert "0 of 3 cells left" in capsys.readouterr().out


def test_a_second_start_on_the_same_machine_keeps_the_runs_the_first_finished(tmp_path: Path) -> None:
    # a hold that ran one plan and starts another: its finished runs, packed or not, must survive the new
    # copy, stay out of `brought` (so the next pack takes them) and lose to the checkout's own copy
    campaign = _module()
    checkout = tmp_path / "checkout"
    committed = checkout / "results" / "g" / "committed"
    committed.mkdir(parents=True)
    (committed / "summary.json").write_text('{"status": "completed", "steps": 7}')
    work = tmp_path / "work"
    campaign.snapshot(work, checkout)
    for name, steps in (("new", 5), ("committed", 9)):
        run = work / "src" / "results" / "g" / name
        run.mkdir(parents=True, exist_ok=True)
        (run / "summary.json").write_text(json.dumps({"status": "completed", "steps": steps}))
        (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    flight = work / "src" / "results" / "g" / "in_flight"
    flight.mkdir()
    (flight / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    assert {n for n, _ in campaign.classify(work)["finished"]} == {"results/g/new", "results/g/committed"}

    campaign.snapshot(work, checkout)
    groups = campaign.classify(work)
    assert [n for n, _ in groups["finished"]] == ["results/g/new"]
    assert [n for n, _ in groups["brought"]] == ["results/g/committed"]
    assert json.loads((work / "src" / "results/g/committed/summary.json").read_text())["steps"] == 7
    assert not (work / "src" / "results/g/in_flight").exists() and not (work / "kept").exists()
    archive = campaign.pack(work, tmp_path / "out")
    with tarfile.open(archive) as tar:
        assert "results/g/new/summary.json" in tar.getnames()


def _starts_in_process(campaign: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """`start` without the plan check (Hydra) or the detached supervisor: the copy and what it records."""
    monkeypatch.setattr(campaign, "check_stages", lambda *args: None)

    def popen(*args: Any, stdout: io.BufferedWriter, **kwargs: Any) -> types.SimpleNamespace:
        stdout.close()  # campaign.log, which the supervisor would hold
        return types.SimpleNamespace(pid=0)  # no process: the campaign reads as ended

    monkeypatch.setattr(campaign, "subprocess", types.SimpleNamespace(
        Popen=popen, STDOUT=subprocess.STDOUT, DEVNULL=subprocess.DEVNULL))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _in_process_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     cells: str) -> tuple[types.ModuleType, Path, Path]:
    """The module whose `start` runs in process (_starts_in_process), an empty checkout and a plan of
    `cells` under tmp_path: (module, checkout, plan)."""
    campaign = _module()
    _starts_in_process(campaign, monkeypatch)
    checkout = tmp_path / "checkout"
    (checkout / "results").mkdir(parents=True)
    plan = tmp_path / "plan.txt"
    plan.write_text(f"{cells}\n")
    return campaign, checkout, plan


def _finished_in_first_campaign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture) -> tuple[types.ModuleType, Path, Path, Path]:
    """A campaign of the cells mixer=a,b started in tmp_path/first, where a finished (and f failed, and
    flight trains on); its archive not unpacked into the checkout: (module, checkout, plan, first)."""
    campaign, checkout, plan = _in_process_plan(tmp_path, monkeypatch, "experiment=e mixer=a,b")
    first = tmp_path / "first"
    campaign.start([plan], first, checkout, hold_minutes=60)
    (_ran(first / "src", "a") / "metrics.jsonl").write_text('{"step": 10, "loss": 0.1}\n')
    _ran(first / "src", "f", status="failed", steps=0)
    flight = first / "src" / "results" / "x" / "flight"
    flight.mkdir()
    (flight / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    capsys.readouterr()
    return campaign, checkout, plan, first


def test_a_start_in_another_work_dir_takes_the_runs_the_machines_other_campaign_finished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        registry: Path) -> None:
    # a second campaign on the machine before the first one's archive reached the checkout: what the first
    # finished must not train again, and the next pack takes it (the first archive may be lost)
    campaign, checkout, plan, first = _finished_in_first_campaign(tmp_path, monkeypatch, capsys)
    before = _files(first)
    second = tmp_path / "second"
    campaign.start([plan], second, checkout, hold_minutes=60)
    assert (f"kept 1 run(s) that the campaign in {first.resolve()} finished (packed again by the next wait "
            "or stop)") in capsys.readouterr().out
    assert json.loads(registry.read_text()) == [str(first.resolve()), str(second.resolve())]
    a = "results/x/a"
    assert _files(second / "src" / a) == _files(first / "src" / a)
    # a failed run trains again anyway; one in flight travels by its checkpoint
    assert not (second / "src/results/x/f").exists() and not (second / "src/results/x/flight").exists()
    assert _files(first) == before
    assert [n for n, _ in campaign.classify(second)["finished"]] == [a]
    archive = campaign.pack(second, tmp_path / "out")
    with tarfile.open(archive) as tar:
        assert f"{a}/summary.json" in tar.getnames()
    # taken, not trained here: its checkout's runs that all fail before a step still read as broken
    for name in ("f1", "f2", "f3"):
        _ran(second / "src", name, status="failed", steps=0)
    assert campaign.broken(second) is not None
    for name in ("f1", "f2", "f3"):
        shutil.rmtree(second / "src" / "results" / "x" / name)

    launched = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        launched.append(overrides[-1])
        _ran(second / "src", overrides[-1].split("=")[1])
        return 0

    assert campaign.run_cells(second, campaign._state(second), launch, []).startswith("done")
    assert launched == ["mixer=b"]


def test_a_run_the_checkout_holds_is_not_taken_from_the_machines_other_campaign(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    campaign, checkout, plan, first = _finished_in_first_campaign(tmp_path, monkeypatch, capsys)
    _ran(checkout, "a", steps=7)  # unpacked from another machine's archive
    campaign.start([plan], tmp_path / "second", checkout, hold_minutes=60)
    assert "kept" not in capsys.readouterr().out
    src = tmp_path / "second" / "src"
    assert json.loads((src / "results/x/a/summary.json").read_text())["steps"] == 7
    assert not (src / "results/x/a/metrics.jsonl").exists()
    groups = campaign.classify(tmp_path / "second")
    assert groups["finished"] == [] and [n for n, _ in groups["brought"]] == ["results/x/a"]


def test_the_record_of_the_machines_campaigns_drops_deleted_dirs_and_survives_garbage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        registry: Path) -> None:
    campaign, checkout, plan = _in_process_plan(tmp_path, monkeypatch, "experiment=e mixer=a")
    registry.write_bytes(b"\x00{not json")
    campaign.start([plan], tmp_path / "first", checkout)
    assert "unreadable" in capsys.readouterr().err
    first = str((tmp_path / "first").resolve())
    assert json.loads(registry.read_text()) == [first]
    gone = tmp_path / "gone"
    campaign.start([plan], gone, checkout)
    _ran(gone / "src", "a")
    shutil.rmtree(gone)
    campaign.start([plan], tmp_path / "second", checkout)
    assert "kept" not in capsys.readouterr().out
    assert json.loads(registry.read_text()) == [first, str((tmp_path / "second").resolve())]
    # a record that cannot be written is named, and the campaign starts without it
    monkeypatch.setenv("KDA_CAMPAIGN_REGISTRY", str(plan / "campaigns.json"))
    campaign.start([plan], tmp_path / "third", checkout)
    out, err = capsys.readouterr()
    assert "cannot be written" in err and "campaign started in" in out


def test_a_stage_that_places_its_run_is_finished_by_that_directory_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # two stages of one config into two directories (a run and its repeat) are two runs; a boolean typed
    # False in the run's overrides and false in the plan is the same value
    campaign = _module()
    run = tmp_path / "results" / "check" / "eager"
    (run / ".hydra").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"status": "completed", "steps": 10}))
    (run / ".hydra" / "overrides.yaml").write_text("- mixer=kda\n- seed=0\n- trainer.compile=False\n")
    (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  sweeper:\n    params:\n  help:\n")
    common = "mixer=kda trainer.compile=false hydra.sweep.dir=results/check"
    plan = tmp_path / "plan.txt"
    plan.write_text(f"{common} seed=0 hydra.sweep.subdir=eager\n"
                    f"{common} seed=0 hydra.sweep.subdir=eager_repeat\n"
                    f"{common} seed=0,1 hydra.sweep.subdir=eager_seed${{seed}}\n")
    cells = campaign.expand([stage for stage in campaign.read_plan(plan)])
    assert [c.run_dir() for c in cells] == ["results/check/eager", "results/check/eager_repeat",
                                            "results/check/eager_seed0", "results/check/eager_seed1"]
    runs = campaign.finished_runs(tmp_path)
    assert [campaign.is_finished(c, runs) for c in cells] == [True, False, False, False]
    campaign.left([plan], tmp_path)
    assert "3 of 4 cells left" in capsys.readouterr().out
    # without a place of its own, the overrides decide, booleans in either case
    (loose,) = campaign.expand([["mixer=kda", "trainer.compile=false", "seed=0"]])
    assert loose.run_dir() is None and campaign.is_finished(loose, runs)


def _training_until_it_checkpoints(tmp_path: Path) -> tuple[Path, Path, Path, Path, list[Path]]:
    """A campaign of one long run checkpointing every 2 steps, once it has checkpointed: (checkout, plan,
    work, out, checkpoints)."""
    checkout = _checkout(tmp_path)
    plan = tmp_path / "plan.txt"
    plan.write_text(f"{TINY} hydra.launcher.n_jobs=1 mixer=gdn trainer.max_steps=100000 "
                    "trainer.checkpoint_every=2\n")
    work, out = tmp_path / "work", tmp_path / "out"
    _campaign("start", plan, "--source", checkout, "--work", work)
    return checkout, plan, work, out, _first_checkpoint(work)


def _resumes_on_a_fresh_machine(plan: Path, checkout: Path, work: Path, archive: Path, name: str,
                                step: int, hold: tuple[str, ...] = ()) -> None:
    """A new copy of `checkout` started with the resume `archive` (and `hold`'s arguments) trains run
    `name` on from `step`."""
    started = _campaign("start", plan, "--source", checkout, "--work", work, "--resume", archive, *hold)
    assert "resume: 1 run(s) put back with their checkpoints" in started.stdout
    # a hold without --fill postpones a carried run that outlasts it: start says so
    note = "note: without --fill, a run of the 1 carried in starts only if it can end within"
    assert (note in started.stdout) == bool(hold), started.stdout
    log = work / "src" / name / "train.log"
    deadline = time.monotonic() + 120
    while "resumed from" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.5)
    # launched here, the carried run counts in flight
    status = _campaign("status", "--work", work).stdout
    assert "in flight 1," in status and "not launched" not in status, status
    _campaign("stop", "--work", work)
    assert f"at step {step}" in log.read_text().split("resumed from", 1)[1].splitlines()[0]
    records = [json.loads(line)["step"] for line in (work / "src" / name / "metrics.jsonl").read_text()
               .splitlines()]
    assert records == sorted(set(records)), "the resumed run logged a step twice"


def test_stop_with_checkpoints_carries_the_runs_in_flight_to_the_next_machine(tmp_path: Path) -> None:
    # a hold ends mid-run: the stopped run travels with its checkpoint, and a fresh machine (a new copy of
    # the same checkout, the run not in it) resumes it from that step instead of step 0
    checkout, plan, work, out, checkpoints = _training_until_it_checkpoints(tmp_path)
    stopped = _campaign("stop", "--work", work, "--out", out, "--with-checkpoints")
    assert "in flight (at step" in stopped.stdout and "with its checkpoint" in stopped.stdout
    run = checkpoints[0].parent
    name = str(run.relative_to(work / "src"))
    summary = json.loads((run / "summary.json").read_text())
    step = summary["checkpoint_step"]
    assert step >= 2 and summary["steps"] >= step
    (archive,) = out.glob("resume-*.tar.gz")
    with tarfile.open(archive) as tar:
        assert f"{name}/checkpoint.pt" in tar.getnames() and f"{name}/.hydra/overrides.yaml" in tar.getnames()
    assert not list(out.glob("campaign-*.tar.gz"))  # nothing finished: only the resume archive

    _resumes_on_a_fresh_machine(plan, checkout, tmp_path / "work2", archive, name, step)


def test_wait_with_checkpoints_carries_a_training_runs_last_checkpoint_and_leaves_it_training(
        tmp_path: Path) -> None:
    # the machine can go back between two calls: each call's archive already holds the runs in flight at
    # their last checkpoint, while they train on, and a fresh machine resumes from there
    checkout, plan, work, out, checkpoints = _training_until_it_checkpoints(tmp_path)
    run = checkpoints[0].parent
    name = str(run.relative_to(work / "src"))
    waited = _campaign("wait", "--work", work, "--out", out, "--with-checkpoints")
    assert "in flight (logged to step" in waited.stdout and "with its checkpoint" in waited.stdout
    (archive,) = out.glob("resume-*.tar.gz")
    with tarfile.open(archive) as tar:
        carried = torch.load(io.BytesIO(tar.extractfile(f"{name}/checkpoint.pt").read()), weights_only=False)
    step = carried["progress"]["step"]
    assert step >= 2
    # still training: its metrics grow after the pack
    before = len((run / "metrics.jsonl").read_text().splitlines())
    deadline = time.monotonic() + 60
    while len((run / "metrics.jsonl").read_text().splitlines()) <= before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len((run / "metrics.jsonl").read_text().splitlines()) > before
    _campaign("stop", "--work", work)

    # cell by cell this time: a run whose estimate is unknown fits, so the carried run starts
    _resumes_on_a_fresh_machine(plan, checkout, tmp_path / "work2", archive, name, step,
                                ("--hold-minutes", "30"))


def test_restore_puts_back_only_unfinished_runs_below_the_run_roots(tmp_path: Path) -> None:
    campaign = _module()
    src = tmp_path / "src"
    done = src / "results" / "x" / "done"
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"status": "completed", "steps": 10}))
    archive = _archive(tmp_path / "resume.tar.gz", {
        "results/x/done/checkpoint.pt": b"old", "results/x/done/summary.json": b"{}",
        "results/x/cut/checkpoint.pt": b"ckpt", "results/x/cut/.hydra/overrides.yaml": b"- mixer=kda\n"})
    data = archive.read_bytes()
    parts = [tmp_path / "resume.tar.gz.part01", tmp_path / "resume.tar.gz.part00"]
    parts[1].write_bytes(data[:100])
    parts[0].write_bytes(data[100:])
    assert campaign.restore_checkpoints(campaign.read_parts(parts, "--resume"), src) == ["results/x/cut"]
    assert (src / "results" / "x" / "cut" / "checkpoint.pt").read_bytes() == b"ckpt"
    assert (src / "results" / "x" / "cut" / ".hydra" / "overrides.yaml").exists()
    assert not (done / "checkpoint.pt").exists()
    evil = _archive(tmp_path / "evil.tar.gz", {"src/x/checkpoint.pt": b"x"})
    with pytest.raises(campaign.CampaignError, match="refuses to restore"):
        campaign.restore_checkpoints(campaign.read_parts([evil], "--resume"), src)


def _in_flight(work: Path, steps: dict[str, int]) -> None:
    """Runs in flight under work's copy (results/x/NAME), each with a 200 kB checkpoint of its step."""
    for name, step in steps.items():
        run = work / "src" / "results" / "x" / name
        (run / ".hydra").mkdir(parents=True)
        (run / "checkpoint.pt").write_bytes(os.urandom(200_000))
        (run / "summary.json").write_text(json.dumps({"status": "incomplete", "steps": step,
                                                      "checkpoint_step": step}))
        (run / ".hydra" / "overrides.yaml").write_text(f"- mixer={name}\n")


def test_checkpoints_travel_one_archive_a_run_the_furthest_first_within_what_a_call_brings_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # three runs in flight whose checkpoints together pass what a call brings back: one archive a run, so
    # the two furthest on come back whole and the third is named as not carried, not cut off with the rest
    campaign, work = _module(), _empty_work(tmp_path)
    monkeypatch.setattr(campaign, "PART_BYTES", 150_000)
    monkeypatch.setattr(campaign, "CARRY_BYTES", 500_000)
    _in_flight(work, {"near": 500, "far": 3000, "mid": 1500})
    files = campaign.save_checkpoints(work, tmp_path / "out")
    printed = capsys.readouterr().out
    assert "not carried: results/x/near at step 500" in printed
    assert "results/x/far in flight (at step 3000) with its checkpoint" in printed
    assert all(path.stat().st_size <= 150_000 for path in files)
    assert sum(path.stat().st_size for path in files) <= 500_000 and len(files) == 4
    # the parts of both archives, in any order, make both again, and a fresh copy gets both runs back
    archives = campaign.read_archives(list(reversed(files)), "--resume")
    assert len(archives) == 2
    src = tmp_path / "fresh"
    assert sum(len(campaign.restore_checkpoints(data, src)) for data in archives) == 2
    assert sorted(p.name for p in (src / "results" / "x").iterdir()) == ["far", "mid"]
    assert (src / "results" / "x" / "far" / "checkpoint.pt").read_bytes() == \
        (work / "src" / "results" / "x" / "far" / "checkpoint.pt").read_bytes()


def test_a_resumed_run_that_checkpointed_since_is_carried_and_priced_from_its_metrics_not_its_old_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a run resumed at step 4,801 trains on under the summary its stopped launch wrote; once it has
    # checkpointed again that summary's step is stale: the pack names the logged step and puts the run
    # first, and the next machine, given the archive, prices it from there too
    campaign, work = _module(), _empty_work(tmp_path)
    _in_flight(work, {"resumed": 4801, "fresh": 9000})
    run = work / "src" / "results" / "x" / "resumed"
    stopped = time.time() - 3600
    os.utime(run / "summary.json", (stopped, stopped))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": step, "train/acc": 0.5}) + "\n"
                                               for step in range(4850, 17001, 50)))
    runs = {name: work / "src" / "results" / "x" / name for name in ("resumed", "fresh")}
    assert {name: campaign._held_step(path)[0] for name, path in runs.items()} == \
        {"resumed": 17000, "fresh": 9000}
    files = campaign.save_checkpoints(work, tmp_path / "out")
    printed = capsys.readouterr().out
    assert "results/x/resumed in flight (logged to step 17000)" in printed
    assert "results/x/fresh in flight (at step 9000)" in printed
    assert printed.index("results/x/resumed") < printed.index("results/x/fresh")
    # restored on the next machine, the files keep the times they were packed with
    fresh = tmp_path / "next"
    for data in campaign.read_archives(files, "--resume"):
        campaign.restore_checkpoints(data, fresh)
    assert {name: campaign._held_step(fresh / "results" / "x" / name)[0] for name in runs} == \
        {"resumed": 17000, "fresh": 9000}
    # a run stopped where it was resumed, not checkpointed since: its summary still names its step
    os.utime(run / "checkpoint.pt", (stopped - 60, stopped - 60))
    assert campaign._held_step(run) == (4801, "at step 4801")


def test_a_stop_with_carry_calls_stages_what_one_call_cannot_bring_and_fetch_brings_it_in_shares(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # five runs in flight, 2 parts each: two calls bring back four archives (files and bytes both bound a
    # call), the fifth, nearest run is named as not carried; fetch moves the rest, a share a call
    campaign, work = _module(), _empty_work(tmp_path)
    monkeypatch.setattr(campaign, "PART_BYTES", 150_000)
    monkeypatch.setattr(campaign, "CARRY_BYTES", 500_000)
    _in_flight(work, {"a": 500, "b": 3000, "c": 1500, "d": 2500, "e": 100})
    calls = [campaign.save_checkpoints(work, tmp_path / "call0", calls=2)]
    printed = capsys.readouterr().out
    assert "not carried: results/x/e at step 100" in printed and "past what 2 calls" in printed
    assert "4 more" in printed and "fetch --out" in printed
    calls.append(campaign.fetch(work, tmp_path / "call1"))
    assert "no checkpoint waits" in (capsys.readouterr(), campaign.fetch(work, tmp_path / "call2"),
                                     capsys.readouterr().out)[2]
    assert [len(files) for files in calls] == [4, 4]
    for files in calls:
        assert len(files) <= campaign.CARRY_FILES and sum(p.stat().st_size for p in files) <= 500_000
    # both calls' files make all four archives whole, each run as it was
    archives = campaign.read_archives(calls[0] + calls[1], "--resume")
    src = tmp_path / "fresh"
    assert sum(len(campaign.restore_checkpoints(data, src)) for data in archives) == 4
    assert sorted(p.name for p in (src / "results" / "x").iterdir()) == ["a", "b", "c", "d"]
    for name in "abcd":
        assert (src / "results" / "x" / name / "checkpoint.pt").read_bytes() == \
            (work / "src" / "results" / "x" / name / "checkpoint.pt").read_bytes()
    # a later pack replaces what an earlier one staged: no stale part waits beside a newer archive
    (work / campaign.CARRY_DIR / "resume-old-00.tar.gz.part01").write_bytes(b"stale")
    campaign.save_checkpoints(work, tmp_path / "again", calls=2)
    assert len(list((work / campaign.CARRY_DIR).iterdir())) == 4
    assert len(campaign.read_archives(list((tmp_path / "again").iterdir())
                                      + list((work / campaign.CARRY_DIR).iterdir()), "--resume")) == 4


def test_a_stop_takes_the_calls_its_start_gave_and_start_and_wait_stay_within_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    campaign, work = _module(), _empty_work(tmp_path)
    monkeypatch.setattr(campaign, "PART_BYTES", 150_000)
    monkeypatch.setattr(campaign, "CARRY_BYTES", 250_000)
    _in_flight(work, {"a": 500, "b": 3000})
    campaign._write_state(work, {"stages": [], "carry_calls": 2})
    keep = ["--work", str(work), "--with-checkpoints", "--out"]
    assert campaign.main(["wait", *keep, str(tmp_path / "w")]) == 0
    assert "not carried: results/x/a" in capsys.readouterr().out
    assert campaign.main(["stop", *keep, str(tmp_path / "s")]) == 0
    assert "not carried" not in capsys.readouterr().out
    assert campaign.main(["fetch", "--work", str(work), "--out", str(tmp_path / "f")]) == 0
    files = [*(tmp_path / "s").glob("resume-*"), *(tmp_path / "f").glob("resume-*")]
    assert len(campaign.read_archives(files, "--resume")) == 2
    # given on the stop, it overrides the start's
    assert campaign.main(["stop", *keep, str(tmp_path / "s1"), "--carry-calls", "1"]) == 0
    assert "not carried: results/x/a" in capsys.readouterr().out


def test_a_stop_without_checkpoints_names_the_runs_it_leaves_and_a_second_stop_still_packs_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --fill starts a cell for the stop to carry: a stop that does not pack it must say what it leaves
    # behind, and the remedy it names (a stop with --out) must work once the supervisor is gone
    campaign, work = _module(), _empty_work(tmp_path)
    _in_flight(work, {"a": 500, "b": 3000})
    finished = work / "src" / "results" / "x" / "done"
    finished.mkdir(parents=True)
    (finished / "summary.json").write_text(json.dumps({"status": "completed", "steps": 10}))
    campaign._write_state(work, {"stages": []})
    for leave in (["--out", str(tmp_path / "s"), "--without-checkpoints"], []):
        assert campaign.main(["stop", "--work", str(work), *leave]) == 0
        printed = capsys.readouterr().out
        assert "not packed: results/x/a at step 500 stays on this machine (`stop --out DIR`" in printed
        assert "not packed: results/x/b at step 3000" in printed and "results/x/done stays" not in printed
    assert not list(tmp_path.glob("s/resume-*"))
    assert campaign.main(["stop", "--work", str(work), "--out", str(tmp_path / "s2")]) == 0
    assert "not packed" not in capsys.readouterr().out
    archives = campaign.read_archives(sorted((tmp_path / "s2").glob("resume-*")), "--resume")
    assert len(archives) == 2
    assert campaign.main(["stop", "--work", str(work), "--out", str(tmp_path / "s3"), "--with-checkpoints",
                          "--without-checkpoints"]) == 2
    assert "give one of them" in capsys.readouterr().err and not (tmp_path / "s3").exists()


def test_an_archive_whose_parts_come_back_in_two_calls_folders_is_read_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a call that brings back one file: each archive's two parts land in two calls' folders, which the
    # next machine reads as /tmp/resume/ (an earlier call's) and .resume/N/ (this one's)
    campaign, work = _module(), _empty_work(tmp_path)
    monkeypatch.setattr(campaign, "PART_BYTES", 150_000)
    monkeypatch.setattr(campaign, "CARRY_FILES", 1)
    _in_flight(work, {"a": 500, "b": 3000})
    calls = [campaign.save_checkpoints(work, tmp_path / ".resume" / "0", calls=4)]
    while (work / campaign.CARRY_DIR).is_dir() and any((work / campaign.CARRY_DIR).iterdir()):
        calls.append(campaign.fetch(work, tmp_path / ".resume" / str(len(calls))))
    assert [len(files) for files in calls] == [1, 1, 1, 1]
    # given in an order where a folder's name sorts a later part first
    files = [path for files in reversed(calls) for path in files]
    archives = campaign.read_archives(files, "--resume")
    src = tmp_path / "fresh"
    assert sum(len(campaign.restore_checkpoints(data, src)) for data in archives) == 2
    for name in "ab":
        assert (src / "results" / "x" / name / "checkpoint.pt").read_bytes() == \
            (work / "src" / "results" / "x" / name / "checkpoint.pt").read_bytes()
    # a file given twice (two copies of one call's folder) is refused, naming it
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(files[0], copy / files[0].name)
    with pytest.raises(campaign.CampaignError, match=f"{files[0].name} is given twice"):
        campaign.read_archives(files + [copy / files[0].name], "--resume")


def _work_with_gdn_checkpointed(tmp_path: Path) -> tuple[types.ModuleType, Path, Path]:
    """(campaign module, work dir, its copy) holding a finished kda run at 2048 (0.4 s a step, 10 s first
    step, 1000 steps: 410 s) and gdn's run at 2048 cut off with a checkpoint at step 750 (110 s left)."""
    campaign = _module()
    work = tmp_path / "work"
    src = work / "src"
    _finished(src, "a", "kda", 2048, 400.0, ["experiment=e"])
    _finished(src, "b", "gdn", 2048, 400.0, ["experiment=e"], status="incomplete")
    (src / "results" / "x" / "b" / "checkpoint.pt").write_bytes(b"ckpt")
    summary = json.loads((src / "results" / "x" / "b" / "summary.json").read_text())
    (src / "results" / "x" / "b" / "summary.json").write_text(json.dumps({**summary, "steps": 750}))
    (work / "brought.json").write_text("{}")
    return campaign, work, src

def test_a_checkpointed_cell_is_priced_for_its_steps_left_and_fill_starts_one_that_does_not_fit(
        tmp_path: Path) -> None:
    campaign, work, src = _work_with_gdn_checkpointed(tmp_path)
    stages = [["experiment=e", "task=mqar", "task.seq_len=2048", "mixer=gdn,mamba2"]]
    cells = campaign.expand(stages)
    estimates = campaign.estimates_of(cells, [0, 1], campaign.finished_runs(src), campaign.partial_runs(src))
    assert estimates[0] == pytest.approx(0.4 * 250 + 10.0) and estimates[1] == pytest.approx(410.0)

    launched: list[list[str]] = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        launched.append(overrides)
        return 0

    # 3 min left: gdn (110 s) fits, mamba2 (410 s) does not; with fill it starts anyway, once
    for fill, expected in ((False, [["mixer=gdn"]]), (True, [["mixer=gdn"], ["mixer=mamba2"]])):
        launched.clear()
        campaign._write_state(work, {"stages": stages, "deadline": time.time() + 180, "fill": fill})
        ending = campaign.run_cells(work, campaign._state(work), launch, [])
        assert [o[-1:] for o in launched] == expected
        assert ending.startswith("done") and ("none of the 1 pending" in ending) != fill
    # below FILL_MIN_S nothing is filled
    launched.clear()
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 60, "fill": True})
    campaign.run_cells(work, campaign._state(work), launch, [])
    assert launched == []


def test_with_fill_a_cell_longer_than_the_hold_keeps_its_plan_order(tmp_path: Path) -> None:
    campaign = _module()
    work = tmp_path / "work"
    src = work / "src"
    # kda: 0.4 s a step at 2048 (410 s for 1000 steps), 0.05 s at 256 (60 s)
    _finished(src, "a", "kda", 2048, 400.0, ["experiment=e"])
    _finished(src, "b", "kda", 256, 50.0, ["experiment=e"])
    (work / "brought.json").write_text("{}")
    stages = [["experiment=e", "task=mqar", "task.seq_len=2048", "mixer=kda", "seed=1"],
              ["experiment=e", "task=mqar", "task.seq_len=256", "mixer=kda", "seed=1,2"]]
    launched: list[str] = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        launched.append(" ".join(o for o in overrides if o.startswith(("task.seq_len=", "seed="))))
        return 0

    def hold(fill: bool, began_s_ago: float, left_s: float) -> list[str]:
        launched.clear()
        now = time.time()
        campaign._write_state(work, {"stages": stages, "started": now - began_s_ago,
                                     "deadline": now + left_s, "fill": fill})
        campaign.run_cells(work, campaign._state(work), launch, [])
        return list(launched)

    long, short = "task.seq_len=2048 seed=1", ["task.seq_len=256 seed=1", "task.seq_len=256 seed=2"]
    # a 300-s hold, all of it left: the 410-s cell fits no such hold, so with fill it runs first, as planned
    assert hold(True, 0.0, 300.0) == [long, *short]
    # without fill it waits behind every shorter cell and never starts
    assert hold(False, 0.0, 300.0) == short
    # under half the hold left: the shorter cells fill it, and fill starts the long one only when none fits
    assert hold(True, 170.0, 130.0) == [*short, long]
    # a hold it fits (600 s, 250 s left): postponed for the shorter ones, as a cell that fits a later hold is
    assert hold(True, 350.0, 250.0) == [*short, long]
    assert campaign.beyond_hold([0, 1, 2], set(), {0: 410.0, 1: 60.0, 2: None}, 300.0) == {0}
    assert campaign.beyond_hold([0, 1], {0}, {0: 410.0, 1: 60.0}, 300.0) == set()  # not carryable


def _with_a_large_mqar_model(root: Path, campaign: types.ModuleType) -> None:
    """Finished runs at 256 (0.05 s a step, 60 s a run): kda's MQAR model over what a call carries, its Stack
    model and gdn's MQAR model under it."""
    large = campaign.CARRY_BYTES // campaign.CHECKPOINT_BYTES_PER_PARAM + 1
    _finished(root, "a", "kda", 256, 50.0, ["experiment=e"], n_params=large)
    _finished(root, "b", "kda", 256, 50.0, ["experiment=e"], task="stack", n_params=large // 4)
    _finished(root, "c", "gdn", 256, 50.0, ["experiment=e"], n_params=large // 2)


def test_a_cell_is_timed_by_the_runs_of_its_task_where_there_are_any(tmp_path: Path) -> None:
    campaign = _module()
    # kda at 2048: MQAR (8,192 ids) steps at 0.6 s, Stack at 0.3 s, both on the H100; gdn only on Stack
    _finished(tmp_path, "a", "kda", 2048, 600.0, ["experiment=e"], gpu="H100")
    _finished(tmp_path, "b", "kda", 2048, 300.0, ["experiment=e"], task="stack", gpu="H100")
    _finished(tmp_path, "c", "gdn", 2048, 300.0, ["experiment=e"], task="stack")
    runs = campaign.finished_runs(tmp_path)
    cells = campaign.expand([["experiment=e", "task=mqar,stack,palindrome", "task.seq_len=2048",
                              "mixer=kda,gdn", "seed=1"]])
    priced = {(c.values["task"], c.values["mixer"]): campaign.estimate(c, runs, gpu="H100") for c in cells}
    assert priced["mqar", "kda"] == pytest.approx(610.0) and priced["stack", "kda"] == pytest.approx(310.0)
    # a task not measured for the mixer: all its runs at that length, as before
    assert priced["palindrome", "kda"] == pytest.approx(460.0)
    assert priced["mqar", "gdn"] == pytest.approx(310.0)


def test_a_checkpoint_too_large_to_carry_is_sized_from_the_runs_of_its_model(tmp_path: Path) -> None:
    campaign = _module()
    _with_a_large_mqar_model(tmp_path, campaign)
    runs = campaign.finished_runs(tmp_path)
    large = campaign.CARRY_BYTES // campaign.CHECKPOINT_BYTES_PER_PARAM + 1
    cells = campaign.expand([["experiment=e", "task=mqar,stack", "task.seq_len=2048", "mixer=kda,gdn,mamba2",
                              "seed=1", "optim.lr=5e-4"]])
    by_name = {(c.values["task"], c.values["mixer"]): i for i, c in enumerate(cells)}
    # the length, seed and lr do not change the model: its runs at 256 size the cell at 2048
    assert campaign.checkpoint_bytes(cells[by_name["mqar", "kda"]], runs) == 12 * large
    assert campaign.checkpoint_bytes(cells[by_name["stack", "kda"]], runs) == 12 * (large // 4)
    assert campaign.checkpoint_bytes(cells[by_name["mqar", "mamba2"]], runs) is None  # not measured
    assert campaign.hold_bound(cells, list(range(len(cells))), runs, []) == {by_name["mqar", "kda"]}
    # two calls carry it
    assert campaign.hold_bound(cells, list(range(len(cells))), runs, [], calls=2) == set()
    # a cell whose run holds a checkpoint came carried: not hold-bound
    carried = cells[by_name["mqar", "kda"]].run_values
    partial = [{"overrides": {k: campaign._number(v) for k, v in carried.items()}, "given": set(carried),
                "steps": 500}]
    assert campaign.hold_bound(cells, list(range(len(cells))), runs, partial) == set()
    # a run launched with another override (another model) does not size a cell without it
    other = campaign.expand([["experiment=e", "task=mqar", "task.seq_len=2048", "mixer=kda",
                              "model.d_model=512"]])
    assert campaign.checkpoint_bytes(other[0], runs) is None


def test_a_hold_runs_the_longest_cell_it_alone_can_take_first_and_fill_skips_it(tmp_path: Path) -> None:
    campaign = _module()
    work = tmp_path / "work"
    src = work / "src"
    _with_a_large_mqar_model(src, campaign)
    (work / "brought.json").write_text("{}")
    # plan order: gdn mqar (carryable, 1000 steps: 60 s), then kda mqar at 1000 and 4000 steps (hold-bound:
    # 60 s and 210 s), then kda stack (carryable, 4000 steps: 210 s)
    stages = [["experiment=e", "task=mqar", "task.seq_len=256", "mixer=gdn", "seed=1"],
              ["experiment=e", "task=mqar", "task.seq_len=256", "mixer=kda", "seed=1"],
              ["experiment=e", "task=mqar", "task.seq_len=256", "mixer=kda", "seed=2",
               "trainer.max_steps=4000"],
              ["experiment=e", "task=stack", "task.seq_len=256", "mixer=kda", "seed=2",
               "trainer.max_steps=4000"]]
    launched: list[str] = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        launched.append(" ".join(o for o in overrides if o.startswith(("task=", "mixer=", "seed="))))
        return 0

    # 5 min left: the longer hold-bound cell first, then the shorter, then the rest in plan order
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 300})
    campaign.run_cells(work, campaign._state(work), launch, [])
    assert launched == ["task=mqar mixer=kda seed=2", "task=mqar mixer=kda seed=1",
                        "task=mqar mixer=gdn seed=1", "task=stack mixer=kda seed=2"]
    # nothing fits 3 min: fill starts the carryable stack cell, never a hold-bound one that would be lost
    launched.clear()
    stages = [stages[2], stages[3]]
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 180, "fill": True})
    campaign.run_cells(work, campaign._state(work), launch, [])
    assert launched == ["task=stack mixer=kda seed=2"]


def test_left_prices_a_carried_run_for_the_steps_its_checkpoint_has_left(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    campaign = _module()
    # kda at 2048: 0.4 s a step, 10 s first step, 1000 steps; gdn's run is not in the checkout but in the
    # archive that the last hold's stop --with-checkpoints brought back, at step 750 (110 s left)
    _finished(tmp_path, "a", "kda", 2048, 400.0, ["experiment=e"])
    carried = tmp_path / "elsewhere"
    _finished(carried, "b", "gdn", 2048, 400.0, ["experiment=e"], status="incomplete")
    run = carried / "results" / "x" / "b"
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "steps": 750}))
    (run / "checkpoint.pt").write_bytes(b"ckpt")
    archive = _archive(tmp_path / "resume.tar.gz", {
        str(path.relative_to(carried)): path.read_bytes() for path in run.rglob("*") if path.is_file()})
    plan = tmp_path / "plan.txt"
    plan.write_text("experiment=e task.seq_len=2048 mixer=gdn task=mqar\n")
    assert campaign.left([plan], tmp_path) == pytest.approx(410.0)
    assert campaign.left([plan], tmp_path, carried=[archive]) == pytest.approx(0.4 * 250 + 10.0)
    assert "carried: results/x/b from step 750" in capsys.readouterr().out
    # the checkout is read, never written: the carried run is not put into it
    assert not (tmp_path / "results" / "x" / "b").exists()


@pytest.mark.parametrize("flag", ["--resume", "--caches"])
def test_missing_or_partial_parts_are_one_line_before_anything_starts(tmp_path: Path, flag: str) -> None:
    work = tmp_path / "work"
    archive = _archive(tmp_path / "a.tar.gz", {"results/x/cut/checkpoint.pt": os.urandom(50_000)})
    half = tmp_path / "a.tar.gz.part00"
    half.write_bytes(archive.read_bytes()[:20_000])  # its second part left behind
    for given, message in ((tmp_path / "nowhere.part00", f"campaign: {flag} {tmp_path / 'nowhere.part00'} "
                            "does not exist"),
                           (half, f"campaign: {flag} a.tar.gz.part00: not one whole archive")):
        result = subprocess.run([sys.executable, CAMPAIGN, "start", str(ROOT / "results" / "kimi_fig4_h200" /
                                 "campaign.txt"), "--work", str(work), flag, str(given)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stderr.startswith(message), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not work.exists()


def _scored(root: Path, name: str, overrides: list[str], acc: float | None, max_steps: int = 1000,
            status: str = "completed", seq_len: int = 256, to_threshold: int | None = None,
            seed: int | None = None) -> None:
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    summary = {"status": status, "steps": max_steps, "seq_len": seq_len, "best_train_acc": acc,
               "steps_to_threshold": to_threshold, "config": {"trainer.max_steps": max_steps}}
    (run / "summary.json").write_text(json.dumps(summary | ({} if seed is None else {"seed": seed})))
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))


def test_extend_plans_the_unsolved_cells_again_at_their_best_run_merged_into_products(tmp_path: Path) -> None:
    campaign = _module()
    root = tmp_path / "results" / "grid"
    for task, length, lr, acc in (("a", 1024, "0.001", 0.5), ("a", 1024, "0.0005", 0.7),  # best: 5e-4
                                  ("b", 1024, "0.001", 0.6), ("b", 1024, "0.0005", 0.4),
                                  ("c", 1024, "0.001", 0.999),  # solved: not again
                                  ("a", 2048, "0.001", 0.3), ("b", 2048, "0.001", 0.2)):
        _scored(root, f"{task}{length}{lr}", ["experiment=e", f"task={task}", f"task.seq_len={length}",
                                              f"optim.lr={lr}", "seed=0"], acc, seq_len=length)
    # a cell that already has a run of the longer budget, and one whose only run diverged
    _scored(root, "d", ["experiment=e", "task=d", "task.seq_len=512", "optim.lr=0.001", "seed=0"], 0.4)
    _scored(root, "d_long", ["experiment=e", "task=d", "task.seq_len=512", "optim.lr=0.001", "seed=0",
                             "trainer.max_steps=20000"], 0.6, max_steps=20000)
    _scored(root, "e", ["experiment=e", "task=e", "task.seq_len=512", "optim.lr=0.001", "seed=0"], None,
            status="diverged")
    plan = campaign.extend([root], tmp_path, 20000, 0.99, "best_train_acc", ["hydra/launcher=x"])
    lines = [line for line in plan.splitlines() if not line.startswith("#")]
    tail = "hydra.sweep.dir=results/grid trainer.max_steps=20000"
    # longest first, then lowest first; the two cells at 2048 differ in the task alone and share a stage,
    # the two at 1024 differ in their best lr too and do not
    assert lines == [
        f"experiment=e hydra/launcher=x task=b,a task.seq_len=2048 optim.lr=0.001 seed=0 {tail}",
        f"experiment=e hydra/launcher=x task=b task.seq_len=1024 optim.lr=0.001 seed=0 {tail}",
        f"experiment=e hydra/launcher=x task=a task.seq_len=1024 optim.lr=0.0005 seed=0 {tail}",
    ]
    assert "(5 run(s))" not in plan and "(4 run(s))" in plan
    assert "all diverged" in plan and str(root / "e") in plan
    # the same cells in another results directory are stages of their own, never hydra.sweep.dir=a,b
    other = tmp_path / "results" / "other"
    shutil.copytree(root / "b20480.001", other / "b")
    both = campaign.extend([root, other], tmp_path, 20000, 0.99, "best_train_acc", [])
    assert "hydra.sweep.dir=results/other" in both and "results/grid,results/other" not in both
    # what it plans is a plan: its stages expand into exactly those cells
    written = tmp_path / "plan.txt"
    written.write_text(plan)
    cells = campaign.expand(campaign.read_plan(written))
    assert sorted((c.values["task"], c.values["task.seq_len"]) for c in cells) == [
        ("a", "1024"), ("a", "2048"), ("b", "1024"), ("b", "2048")]


def _seed_0_extended(root: Path) -> list[str]:
    """Cell a@2048 at lr 1e-3 (its overrides, returned): seed 0 at 0.8 after the grid's 5,000 steps, then
    extended to 20,000, where it solved the task (0.995)."""
    common = ["experiment=e", "task=a", "task.seq_len=2048", "optim.lr=0.001"]
    _scored(root, "s0", [*common, "seed=0"], 0.8, seq_len=2048, max_steps=5000)
    _scored(root, "s0_long", [*common, "seed=0", "trainer.max_steps=20000"], 0.995, seq_len=2048,
            max_steps=20000)
    return common


def test_extend_brings_a_cells_other_seeds_to_the_budget_one_of_them_ran(tmp_path: Path) -> None:
    campaign = _module()
    root = tmp_path / "results" / "grid"
    # seed 0 was extended and solved it; seed 1 is below at the grid's budget, seed 2 solved it there;
    # the cell's mean at the longer budget would pass 0.99 without seed 1, so only the budget flags it
    common = _seed_0_extended(root)
    _scored(root, "s1", [*common, "seed=1"], 0.7, seq_len=2048, max_steps=5000)
    _scored(root, "s2", [*common, "seed=2"], 0.995, seq_len=2048, max_steps=5000)
    # a cell solved at the grid's budget on every seed: nothing to extend
    _scored(root, "b", ["experiment=e", "task=b", "task.seq_len=2048", "optim.lr=0.001", "seed=0"], 0.999,
            seq_len=2048, max_steps=5000)
    plan = campaign.extend([root], tmp_path, 20000, 0.99, "best_train_acc", [])
    lines = [line for line in plan.splitlines() if not line.startswith("#")]
    assert lines == ["experiment=e task=a task.seq_len=2048 optim.lr=0.001 seed=1 "
                     "hydra.sweep.dir=results/grid trainer.max_steps=20000"]
    assert "(1 run(s))" in plan
    # once seed 1 holds its long run, whatever it reached, the cell is done
    _scored(root, "s1_long", [*common, "seed=1", "trainer.max_steps=20000"], 0.9, seq_len=2048,
            max_steps=20000)
    assert "(0 run(s))" in campaign.extend([root], tmp_path, 20000, 0.99, "best_train_acc", [])


def test_extend_of_a_real_sweep_runs_the_longer_budget_beside_it(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    tiny = TINY.replace("hydra.sweep.dir=results/campaign_test", f"hydra.sweep.dir={sweep}")
    train = [sys.executable, str(ROOT / "train.py"), "-m", *tiny.split(), "mixer=kda", "optim.lr=3e-3,1e-2"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    subprocess.run(train, cwd=ROOT, env=env, check=True, capture_output=True, timeout=240)
    accs = {json.loads(p.read_text())["lr"]: json.loads(p.read_text())["best_train_acc"]
            for p in sweep.rglob("summary.json")}
    best = max(accs, key=accs.get)
    plan = _campaign("extend", sweep, "--max-steps", 8, "--with", "hydra/launcher=local").stdout
    (line,) = [line for line in plan.splitlines() if not line.startswith("#")]
    assert float(line.split("optim.lr=")[1].split()[0]) == best
    subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", *line.split()], cwd=ROOT, env=env,
                   check=True, capture_output=True, timeout=240)
    longer = [json.loads(p.read_text()) for p in sweep.rglob("summary.json")]
    assert sorted(s["steps"] for s in longer) == [6, 6, 8]
    assert [s["lr"] for s in longer if s["steps"] == 8] == [best]
    # planned again, the cell is held at that budget now: nothing left
    again = _campaign("extend", sweep, "--max-steps", 8).stdout
    assert "(0 run(s))" in again and len(again.splitlines()) == 1


def test_extend_names_a_missing_results_directory_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, CAMPAIGN, "extend", tmp_path / "nope", "--max-steps", "10"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "nope is not a directory" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_seeds_plans_every_cell_at_its_best_lr_of_the_grid_budget_leaving_held_seeds_out(
        tmp_path: Path) -> None:
    campaign = _module()
    root = tmp_path / "results" / "grid"
    common = ["experiment=e", "seed=0"]
    for task, length, lr, acc in (("a", 1024, "0.001", 0.5), ("a", 1024, "0.0005", 0.7),  # best: 5e-4
                                  ("b", 1024, "0.001", 0.999), ("b", 256, "0.001", 0.9)):
        _scored(root, f"{task}{length}{lr}", [*common, f"task={task}", f"task.seq_len={length}",
                                              f"optim.lr={lr}"], acc, seq_len=length)
    # b@1024 holds seed 1 at its best lr already (typed 1e-3 there): only seed 2 is left
    _scored(root, "b1024s1", ["experiment=e", "seed=1", "task=b", "task.seq_len=1024", "optim.lr=1e-3"], 0.98,
            seq_len=1024)
    # a longer run of b@256 at another lr scores higher: it does not pick the lr of the seeds
    _scored(root, "b256long", [*common, "task=b", "task.seq_len=256", "optim.lr=0.0005",
                               "trainer.max_steps=20000"], 1.0, max_steps=20000)
    _scored(root, "c", [*common, "task=c", "task.seq_len=512", "optim.lr=0.001"], None, status="diverged")
    plan = campaign.seeds([root], tmp_path, [1, 2], "best_train_acc", ["hydra/launcher=x"], {1024: "8"})
    lines = [line for line in plan.splitlines() if not line.startswith("#")]
    where = "hydra.sweep.dir=results/grid"
    assert lines == [
        f"experiment=e hydra/launcher=x task=a task.seq_len=1024 optim.lr=0.0005 {where} seed=1,2 "
        "hydra.launcher.n_jobs=8",
        f"experiment=e hydra/launcher=x task=b task.seq_len=1024 optim.lr=0.001 {where} seed=2 "
        "hydra.launcher.n_jobs=8",
        f"experiment=e hydra/launcher=x task=b task.seq_len=256 optim.lr=0.001 {where} seed=1,2",
    ]
    assert "(3 cell(s) with seeds to run)" in plan and "all diverged" in plan
    written = tmp_path / "plan.txt"
    written.write_text(plan)
    cells = campaign.expand(campaign.read_plan(written))
    assert sorted((c.values["task"], c.values["task.seq_len"], c.values["seed"]) for c in cells) == [
        ("a", "1024", "1"), ("a", "1024", "2"), ("b", "1024", "2"), ("b", "256", "1"), ("b", "256", "2")]
    # every seed held: nothing left
    assert campaign.seeds([root], tmp_path, [0], "best_train_acc", [], {}).count("\nexperiment=") == 0
    # runs per GPU instead: the plan fills whatever machine runs it (n_jobs null over a yaml's n_jobs)
    per_gpu = campaign.seeds([root], tmp_path, [1, 2], "best_train_acc", ["hydra/launcher=local"], {},
                             {1024: "1", 256: "3"})
    lines = [line for line in per_gpu.splitlines() if not line.startswith("#")]
    assert lines[0].endswith("seed=1,2 hydra.launcher.n_jobs=null hydra.launcher.jobs_per_gpu=1")
    assert lines[-1].endswith("seed=1,2 hydra.launcher.n_jobs=null hydra.launcher.jobs_per_gpu=3")
    written.write_text(per_gpu)
    cells = campaign.expand(campaign.read_plan(written))
    assert {(c.values["task.seq_len"], campaign.at_once(c, 8), campaign.per_gpu(c, 8)) for c in cells} == {
        ("1024", 8, 1), ("256", 24, 3)}
    with pytest.raises(campaign.CampaignError, match="both give length 1024"):
        campaign.seeds([root], tmp_path, [1], "best_train_acc", [], {1024: "8"}, {1024: "1"})


def test_seeds_of_a_cell_extended_to_a_longer_budget_run_at_that_budget(tmp_path: Path) -> None:
    campaign = _module()
    root = tmp_path / "results" / "grid"
    # seed 0 below 0.99 at the grid's 5,000 steps, then extended to 20,000; seed 1 was run at 20,000 alone
    common = _seed_0_extended(root)
    _scored(root, "s1_long", [*common, "seed=1", "trainer.max_steps=20000"], 0.97, seq_len=2048,
            max_steps=20000)
    # a cell at the grid's budget alone: its seeds stay there
    _scored(root, "b", ["experiment=e", "task=b", "task.seq_len=2048", "optim.lr=0.001", "seed=0"], 0.999,
            seq_len=2048, max_steps=5000)
    plan = campaign.seeds([root], tmp_path, [1, 2], "best_train_acc", [], {})
    lines = [line for line in plan.splitlines() if not line.startswith("#")]
    where = "hydra.sweep.dir=results/grid"
    # the lower metric first
    assert lines == [
        f"experiment=e task=a task.seq_len=2048 optim.lr=0.001 {where} seed=2 trainer.max_steps=20000",
        f"experiment=e task=b task.seq_len=2048 optim.lr=0.001 {where} seed=1,2",
    ]
    # once seed 2 holds its run at that budget, the cell has its seeds; extend plans none of them again
    _scored(root, "s2_long", [*common, "seed=2", "trainer.max_steps=20000"], 0.99, seq_len=2048,
            max_steps=20000)
    again = campaign.seeds([root], tmp_path, [1, 2], "best_train_acc", [], {})
    assert [line for line in again.splitlines() if not line.startswith("#")] == [lines[1]]
    assert "(0 run(s))" in campaign.extend([root], tmp_path, 20000, 0.99, "best_train_acc", [])


def test_seeds_extend_the_report_and_the_figures_pick_one_lr_for_a_cell(tmp_path: Path) -> None:
    campaign = _module()
    import pandas as pd

    from analysis import cells as figures
    from analysis import report
    root = tmp_path / "results" / "grid"
    # (task, lr, seed, peak acc, steps to 0.9)
    runs = [
        # a: both lrs solve it, 5e-4 higher by noise: within lr_rule.TIE, the faster one (1e-3)
        ("a", 1e-3, 0, 0.99998, 750), ("a", 5e-4, 0, 0.99999, 1500),
        # b: one lucky seed at 1e-3 (0.95, 0.5) against two that agree at 5e-4 (0.9, 0.9): 5e-4 by the mean
        ("b", 1e-3, 0, 0.95, 900), ("b", 1e-3, 1, 0.5, None), ("b", 5e-4, 0, 0.9, 2000),
        ("b", 5e-4, 1, 0.9, 2100),
        # c: the same peak and speed at both: the smaller lr, whichever run is read first
        ("c", 1e-3, 0, 1.0, 500), ("c", 5e-4, 0, 1.0, 500),
        # d: neither reaches 0.9 and the peaks are within TIE: the higher peak, never the speed
        ("d", 1e-3, 0, 0.301, None), ("d", 5e-4, 0, 0.304, None),
        # e: seed 0 at both, 1e-3 the faster; a failed seed 1 at 1e-3 alone (planned there) keeps 1e-3:
        # the lrs are compared on the seeds both ran
        ("e", 1e-3, 0, 1.0, 750), ("e", 5e-4, 0, 1.0, 1500), ("e", 1e-3, 1, 0.213, None),
    ]
    for task, lr, seed, acc, steps in runs:
        _scored(root, f"{task}{lr}{seed}", ["experiment=e", "task.seq_len=1024", f"task={task}",
                                            f"optim.lr={lr}", f"seed={seed}"], acc, seq_len=1024,
                to_threshold=steps)
    expected = {"a": 1e-3, "b": 5e-4, "c": 5e-4, "d": 5e-4, "e": 1e-3}
    plan = campaign.seeds([root], tmp_path, [1, 2], "best_train_acc", [], {})
    picked = {task: float(line.split("optim.lr=")[1].split()[0])
              for line in plan.splitlines() if not line.startswith("#")
              for task in line.split("task=")[1].split()[0].split(",")}  # cells alike share a stage
    assert picked == expected
    # the report's table and the figures' cells say the same lrs
    table = pd.DataFrame([{"task": t, "mixer": "kda", "seq_len": 1024, "lr": lr, "seed": seed,
                           "status": "completed", "best_train_acc": acc, "best_eval_acc": acc,
                           "steps_to_threshold": steps} for t, lr, seed, acc, steps in runs])
    assert dict(zip(*report.cell_table(table)[["task", "lr"]].T.values, strict=True)) == expected
    scored = figures.scored_runs(table, "train")
    best = figures.best_lr(figures.cells(scored), scored)
    assert dict(zip(*best[["task", "lr"]].T.values, strict=True)) == expected
    # extend judges a cell by that mean: b's lucky 0.95 does not hide a 0.9 cell (nor d's 0.301 and 0.304
    # cells); b runs at 5e-4 with both its seeds there, both being below (a point of two seeds is two runs
    # of the longer budget); e's failed seed makes it a 0.61 cell, and that seed (1) runs again at 1e-3,
    # not seed 0, which solved it
    extended = [line for line in campaign.extend([root], tmp_path, 20000, 0.99, "best_train_acc", [])
                .splitlines() if not line.startswith("#")]
    assert extended == ["experiment=e task.seq_len=1024 task=d optim.lr=0.0005 seed=0 "
                        "hydra.sweep.dir=results/grid trainer.max_steps=20000",
                        "experiment=e task.seq_len=1024 task=e optim.lr=0.001 seed=1 "
                        "hydra.sweep.dir=results/grid trainer.max_steps=20000",
                        "experiment=e task.seq_len=1024 task=b optim.lr=0.0005 seed=0,1 "
                        "hydra.sweep.dir=results/grid trainer.max_steps=20000"]


def test_the_seed_that_picks_a_cells_lr_is_the_summarys_where_the_sweep_did_not_name_it(
        tmp_path: Path) -> None:
    """Runs whose overrides leave the seed at the experiment's default: the summary's seed is theirs, so a
    failed further seed at 1e-3 does not move the cell to 5e-4 (the lrs compared on seed 0, both ran)."""
    campaign = _module()
    root = tmp_path / "results" / "grid"
    head = ["experiment=e", "task=a", "task.seq_len=1024"]
    _scored(root, "fast", [*head, "optim.lr=1e-3"], 1.0, seq_len=1024, to_threshold=750, seed=0)
    _scored(root, "slow", [*head, "optim.lr=5e-4"], 1.0, seq_len=1024, to_threshold=1500, seed=0)
    _scored(root, "failed", [*head, "optim.lr=1e-3", "seed=1"], 0.2, seq_len=1024, seed=1)
    ((_, runs),) = list(campaign._cells_of([root], tmp_path, "best_train_acc"))
    best, mean = campaign._best_run(runs, "best_train_acc", [])
    assert best["values"]["optim.lr"] == 1e-3 and mean == pytest.approx(0.6)


def test_a_best_lr_cell_waits_for_its_cells_other_runs_then_takes_the_reports_lr(tmp_path: Path) -> None:
    campaign = _module()
    root = tmp_path / "results" / "grid"
    head = ["experiment=e", "task.seq_len=1024"]
    # kda: 1e-3 done (0.99998 at 750 steps); its 5e-4 run is still planned. gdn: both lrs done, 5e-4
    # faster within the tie. mamba2: only one lr, done.
    for mixer, lr, acc, steps in (("kda", "1e-3", 0.99998, 750), ("gdn", "1e-3", 0.99997, 2250),
                                  ("gdn", "5e-4", 0.99999, 1500), ("mamba2", "1e-3", 0.5, None)):
        _scored(root, f"{mixer}{lr}", [*head, "task=mqar", f"mixer={mixer}", f"optim.lr={lr}", "seed=0"], acc,
                seq_len=1024, to_threshold=steps)
    plan = tmp_path / "plan.txt"
    # (the last stage, a longer run of gdn's cell, does not hold its seeds back: the grid's budget picks)
    plan.write_text("experiment=e task.seq_len=1024 task=mqar mixer=kda optim.lr=5e-4 seed=0\n"
                    "experiment=e hydra.launcher.n_jobs=4 hydra.sweep.dir=results/grid optim.lr=best "
                    "task.seq_len=1024 task=mqar mixer=kda,gdn,mamba2 seed=1,2\n"
                    "experiment=e task.seq_len=1024 task=mqar mixer=gdn optim.lr=5e-4 seed=0 "
                    "trainer.max_steps=20000\n")
    cells = campaign.expand(campaign.read_plan(plan))
    pending = list(range(len(cells)))
    waiting = campaign.resolve_best(cells, pending, tmp_path)
    # kda waits for its 5e-4 run; gdn takes 5e-4 (the faster within the tie), mamba2 its one lr
    assert sorted(repr(cells[i]) for i in waiting) == ["stage 2 mixer=kda seed=1 optim.lr=best",
                                                       "stage 2 mixer=kda seed=2 optim.lr=best"]
    assert {c.values["mixer"]: c.values["optim.lr"] for c in cells[1:-1] if c.values["mixer"] != "kda"} == {
        "gdn": "5e-4", "mamba2": "1e-3"}
    # one multirun never mixes lrs: gdn's seeds go together, mamba2's apart
    ready = [i for i in pending[1:-1] if i not in waiting]
    group, _ = campaign.choose(cells, ready, float("inf"), {}, None)
    assert [cells[i].values["mixer"] for i in group] == ["gdn", "gdn"]
    assert campaign.group_overrides([cells[i] for i in group])[3:5] == ["optim.lr=5e-4", "task.seq_len=1024"]
    # its 5e-4 run in (slower: 1,250 steps), kda's seeds take 1e-3
    _scored(root, "kda5e-4", [*head, "task=mqar", "mixer=kda", "optim.lr=5e-4", "seed=0"], 0.99999,
            seq_len=1024, to_threshold=1250)
    waiting = campaign.resolve_best(cells, pending[1:-1], tmp_path)
    assert waiting == {} and cells[1].values["optim.lr"] == "1e-3" and cells[1].values["seed"] == "1"


@pytest.mark.slow  # three tiny training runs through the detached supervisor
def test_a_campaign_runs_a_best_lr_seed_after_its_cells_lrs_at_the_one_the_report_takes(
        tmp_path: Path) -> None:
    from analysis.lr_rule import pick_lr

    checkout = _checkout(tmp_path)
    plan = tmp_path / "plan.txt"
    # the seed is planned first; it waits for its cell's two lrs and then runs at the one picked
    plan.write_text(f"{TINY} mixer=kda optim.lr=best seed=1\n"
                    f"{TINY} hydra.launcher.n_jobs=2 mixer=kda optim.lr=3e-3,1e-2\n")
    result = _campaign("start", plan, "--source", checkout, "--work", tmp_path / "w", "--hold-minutes", 28,
                       "--minutes", 3)
    assert "supervisor stopped; finished here 3, in flight 0" in result.stdout, result.stdout
    sweep = tmp_path / "w" / "src" / "results" / "campaign_test"
    summaries = [json.loads(p.read_text()) for p in sweep.rglob("summary.json")]
    first = {s["lr"]: (s["best_train_acc"], s["steps_to_threshold"]) for s in summaries if s["seed"] != 1}
    (seeded,) = [s for s in summaries if s["seed"] == 1]
    assert len(first) == 2 and seeded["lr"] == pick_lr(first)
    log = (tmp_path / "w" / "campaign.log").read_text()
    assert log.index("optim.lr=3e-3,1e-2") < log.index("seed=1") and "done: every cell has run" in log


@pytest.mark.parametrize(("stage", "message"), [
    ("experiment=e optim.lr=best mixer=kda",
     "optim.lr=best stands alone and needs the stage's hydra.sweep.dir"),
    ("experiment=e hydra.sweep.dir=r optim.lr=best,1e-3", "optim.lr=best stands alone"),
])
def test_a_best_lr_stage_is_refused_without_its_results_directory(tmp_path: Path, stage: str,
                                                                   message: str) -> None:
    plan = tmp_path / "plan.txt"
    plan.write_text(stage + "\n")
    result = subprocess.run([sys.executable, CAMPAIGN, "left", str(plan)], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1
    plan.write_text("experiment=e hydra.sweep.dir=r optim.lr=best\n")
    whole = subprocess.run([sys.executable, CAMPAIGN, "start", str(plan), "--work", str(tmp_path / "w")],
                           capture_output=True, text=True)
    assert whole.returncode == 2 and "optim.lr=best in a plan needs --hold-minutes" in whole.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--n-jobs", "2048:8", "campaign: --n-jobs '2048:8': each item is LENGTH=JOBS, e.g. 2048=8,256=24"),
    ("--seeds", "one", "campaign: --seeds 'one': give integers, e.g. 1,2"),
    ("--jobs-per-gpu", "512=0", "campaign: --jobs-per-gpu '512=0': each item is LENGTH=JOBS, JOBS >= 1, "
     "e.g. 2048=8,256=24"),
])
def test_seeds_names_a_bad_option_in_one_line(tmp_path: Path, flag: str, value: str, message: str) -> None:
    args = ["--seeds", "1,2", "--n-jobs", "2048=8", "--jobs-per-gpu", "512=3"]
    args[args.index(flag) + 1] = value
    result = subprocess.run([sys.executable, CAMPAIGN, "seeds", str(tmp_path), *args], capture_output=True,
                            text=True)
    assert result.returncode == 2 and result.stderr.strip() == message


def test_on_several_gpus_groups_run_side_by_side_and_the_next_takes_the_gpu_that_freed(
        tmp_path: Path) -> None:
    campaign, work = _module(), _empty_work(tmp_path)
    # one run at a time a stage (n_jobs=1), two GPUs: a and b side by side; b ends first, so c takes its
    # GPU while a still runs, then d (a later stage) the same one
    stages = [["experiment=e", "hydra.launcher.n_jobs=1", "mixer=a,b,c"], ["experiment=e", "mixer=d"]]
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 3600, "gpus": 2})
    lock = threading.Lock()
    started, active, most = [], [0], [0]
    took = {"a": 3.0, "b": 0.2, "c": 0.2, "d": 0.1}

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        name = overrides[-1].split("=")[1]
        with lock:
            started.append((name, devices))
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(took[name])
        run = work / "src" / "results" / "x" / name
        (run / ".hydra").mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"status": "completed", "steps": 10}))
        (run / ".hydra" / "overrides.yaml").write_text(f"- experiment=e\n- mixer={name}\n")
        (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  sweeper:\n    params:\n  help:\n")
        with lock:
            active[0] -= 1
        return 0

    ending = campaign.run_cells(work, campaign._state(work), launch, [])
    assert ending.startswith("done: every cell has run")
    assert started == [("a", [0]), ("b", [1]), ("c", [1]), ("d", [1])]
    assert most[0] == 2 and campaign._state(work)["cells_run"] == 4


def test_a_later_stages_copy_of_a_cell_in_flight_does_not_start_beside_it(tmp_path: Path) -> None:
    campaign, work = _module(), _empty_work(tmp_path)
    # a plan that runs one cell first (typed 1e-3) and again in a later stage (typed 0.001): on two GPUs the
    # copy must not start on the free one while the first runs, nor after it finished
    stages = [["experiment=e", "hydra.launcher.n_jobs=1", "optim.lr=1e-3", "mixer=a"],
              ["experiment=e", "hydra.launcher.n_jobs=1", "optim.lr=0.001", "mixer=b,a"]]
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 3600, "gpus": 2})
    started = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        name = overrides[-1].split("=")[1]
        started.append(name)
        time.sleep(1.0 if name == "a" else 0.1)
        run = work / "src" / "results" / "x" / f"{name}{len(started)}"
        (run / ".hydra").mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"status": "completed", "steps": 10}))
        (run / ".hydra" / "overrides.yaml").write_text(f"- experiment=e\n- optim.lr={overrides[2][8:]}\n"
                                                       f"- mixer={name}\n")
        (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  sweeper:\n    params:\n  help:\n")
        return 0

    ending = campaign.run_cells(work, campaign._state(work), launch, [])
    assert ending.startswith("done: every cell has run")
    assert started == ["a", "b"]


def test_a_group_on_some_gpus_sees_those_of_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.gpus import visible_subset

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_subset([2, 3]) == "2,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert visible_subset([0, 2]) == "4,6"


def test_a_stage_that_packs_runs_takes_only_the_gpus_it_needs() -> None:
    campaign = _module()
    cells = campaign.expand([["experiment=e", "hydra.launcher.n_jobs=24", "mixer=a,b,c,d,e,f,g"]])
    # 24 jobs on 8 GPUs: three a GPU; with two GPUs free a block holds six cells
    group, _ = campaign.choose(cells, list(range(7)), 600.0, {}, free=2, gpus=8)
    assert len(group) == 6 and campaign.per_gpu(cells[0], 8) == 3
    group, _ = campaign.choose(cells, list(range(7)), 600.0, {}, free=8, gpus=8)
    assert len(group) == 7


def test_a_stage_of_jobs_per_gpu_runs_that_many_on_each_of_the_machines_gpus() -> None:
    campaign = _module()
    cells = campaign.expand([["experiment=e", "hydra.launcher.jobs_per_gpu=3", "mixer=a,b,c,d,e,f,g"]])
    assert (cells[0].n_jobs, cells[0].jobs_per_gpu) == (None, 3)
    # 3 a GPU whatever the machine: 3 at once on one GPU (or none), 24 on eight
    assert [campaign.at_once(cells[0], gpus) for gpus in (1, 2, 8)] == [3, 6, 24]
    assert [campaign.per_gpu(cells[0], gpus) for gpus in (1, 2, 8)] == [3, 3, 3]
    assert campaign.choose(cells, list(range(7)), 600.0, {})[0] == [0, 1, 2]
    # on eight GPUs with two free a block holds six cells (three a GPU), with all eight free every cell
    assert len(campaign.choose(cells, list(range(7)), 600.0, {}, free=2, gpus=8)[0]) == 6
    assert len(campaign.choose(cells, list(range(7)), 600.0, {}, free=8, gpus=8)[0]) == 7
    # n_jobs given beside it wins, as in the launcher: 8 at once on eight GPUs is one a GPU
    (both,) = campaign.expand([["experiment=e", "hydra.launcher.jobs_per_gpu=3", "hydra.launcher.n_jobs=8"]])
    assert (both.n_jobs, campaign.at_once(both, 8), campaign.per_gpu(both, 8)) == (8, 8, 1)


def test_a_stage_without_n_jobs_or_jobs_per_gpu_takes_its_launchers_yaml(tmp_path: Path) -> None:
    import yaml

    campaign = _module()
    yamls = ROOT / "conf" / "hydra" / "launcher"
    joblib_gpu = yaml.safe_load((yamls / "joblib_gpu.yaml").read_text())
    local = yaml.safe_load((yamls / "local.yaml").read_text())
    assert joblib_gpu["n_jobs"] is None and local["jobs_per_gpu"] is None

    def jobs(*overrides: str, conf: Path = yamls) -> tuple[int | None, int | None]:
        (cell,) = campaign.expand([["experiment=e", *overrides]], conf)
        return cell.n_jobs, cell.jobs_per_gpu

    assert jobs("hydra/launcher=joblib_gpu") == (None, joblib_gpu["jobs_per_gpu"])
    assert jobs("hydra/launcher=joblib_gpu", "hydra.launcher.n_jobs=1") == (1, None)
    assert jobs("hydra.launcher.jobs_per_gpu=2", "hydra/launcher=joblib_gpu") == (None, 2)
    # local's n_jobs: 2 wins over a jobs_per_gpu given alone (the launcher's rule), not once it is null
    assert jobs("hydra/launcher=local") == (local["n_jobs"], None)
    assert jobs("hydra/launcher=local", "hydra.launcher.jobs_per_gpu=2") == (local["n_jobs"], None)
    assert jobs("hydra/launcher=local", "hydra.launcher.n_jobs=null",
                "hydra.launcher.jobs_per_gpu=2") == (None, 2)
    # Hydra's own launchers, and none: one at a time unless the stage says
    assert jobs("hydra/launcher=joblib") == jobs() == jobs("hydra/launcher=slurm") == (1, None)
    # a checkout's own yaml, its defaults list followed (the file's keys over those it names)
    (tmp_path / "base.yaml").write_text("_target_: x\nn_jobs: 4\njobs_per_gpu: null\n")
    (tmp_path / "packed.yaml").write_text("# one a GPU\ndefaults:\n  - base\n\nn_jobs: null  # per GPU\n"
                                          "jobs_per_gpu: 1\n")
    assert jobs("hydra/launcher=base", conf=tmp_path) == (4, None)
    assert jobs("hydra/launcher=packed", conf=tmp_path) == (None, 1)


def test_a_plan_with_a_jobs_per_gpu_the_launcher_would_refuse_is_refused(tmp_path: Path) -> None:
    campaign = _module()
    plan = tmp_path / "plan.txt"
    for bad in ("0", "-1", "2.5", "abc", "True"):
        plan.write_text(f"experiment=e hydra/launcher=joblib_gpu hydra.launcher.jobs_per_gpu={bad} mixer=a\n")
        with pytest.raises(campaign.CampaignError,
                           match=rf"jobs_per_gpu={bad}: give the runs per GPU, an integer >= 1"):
            campaign.read_plan(plan)
    plan.write_text("experiment=e hydra/launcher=joblib_gpu hydra.launcher.jobs_per_gpu=null mixer=a\n")
    assert campaign.read_plan(plan)[0][2] == "hydra.launcher.jobs_per_gpu=null"


def test_a_jobs_per_gpu_cell_is_timed_from_runs_as_packed_and_priced_over_the_gpus(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    campaign = _module()
    # kda alone at 2048 (0.4 s a step); two a GPU at 256 under jobs_per_gpu (0.1 s a step)
    _finished(tmp_path, "a", "kda", 2048, 400.0, ["experiment=e"], n_jobs=1)
    _finished(tmp_path, "b", "kda", 256, 100.0, ["experiment=e"], jobs_per_gpu=2)
    _finished(tmp_path, "c", "kda", 512, 100.0, ["experiment=e"], n_jobs=6, jobs_per_gpu=2)  # n_jobs wins
    assert sorted(run["n_jobs"] for run in campaign.finished_runs(tmp_path)) == [1, 2, 6]
    plan = tmp_path / "plan.txt"
    plan.write_text("experiment=e hydra.launcher.jobs_per_gpu=2 task.seq_len=256 mixer=kda "
                    "task=stack,palindrome,copy,sort\n")
    (cell, *_) = campaign.expand(campaign.read_plan(plan))
    runs = campaign.finished_runs(tmp_path)
    # two a GPU on any machine: timed from the runs two shared a GPU, not the lone one scaled (60 s)
    assert campaign.estimate(cell, runs, gpus=1) == campaign.estimate(cell, runs, gpus=8) \
        == pytest.approx(0.1 * 1000 + 10.0)
    # one GPU: two at once, two launches of 110 s; two GPUs: the four at once, two on each
    assert campaign.left([plan], tmp_path, gpus=1) == pytest.approx(220.0)
    assert "(with 1 other(s) at once)" in capsys.readouterr().out
    assert campaign.left([plan], tmp_path, gpus=2) == pytest.approx(110.0)
    assert capsys.readouterr().out.count("(with 3 other(s) at once)") == 4


def test_a_jobs_per_gpu_block_takes_the_gpus_its_runs_need_and_the_next_starts_beside_it(
        tmp_path: Path) -> None:
    campaign, work = _module(), _empty_work(tmp_path)
    # four GPUs, two runs a GPU: the five cells are one multirun on three GPUs (its launcher sees those
    # three, so runs all five at once), and the next stage's cell starts on the fourth beside it
    stages = [["experiment=e", "hydra.launcher.jobs_per_gpu=2", "mixer=a,b,c,d,e"],
              ["experiment=e", "mixer=z"]]
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 3600, "gpus": 4})
    started = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        mixers = overrides[-1].split("=")[1].split(",")
        started.append((mixers, devices))
        time.sleep(0.5 if len(mixers) > 1 else 0.0)
        for mixer in mixers:
            run = work / "src" / "results" / "x" / mixer
            (run / ".hydra").mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps({"status": "completed", "steps": 10}))
            (run / ".hydra" / "overrides.yaml").write_text(f"- experiment=e\n- mixer={mixer}\n")
            (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  sweeper:\n    params:\n  help:\n")
        return 0

    assert campaign.run_cells(work, campaign._state(work), launch, []).startswith("done: every cell has run")
    assert started == [(["a", "b", "c", "d", "e"], [0, 1, 2]), (["z"], [3])]


def test_a_moved_hold_decides_what_still_starts(tmp_path: Path) -> None:
    campaign = _module()
    work = tmp_path / "work"
    src = work / "src"
    _finished(src, "a", "kda", 2048, 400.0, ["experiment=e"])  # 410 s a kda run at 2048
    (work / "brought.json").write_text("{}")
    stages = [["experiment=e", "task=mqar", "task.seq_len=2048", "mixer=kda", "seed=1"]]
    launched: list[list[str]] = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        launched.append(overrides)
        return 0

    # started with 3 min left: the run does not fit; a later command that knows the machine has 20 min
    # left moves the hold, and it starts
    for moved, expected in ((None, 0), (20.0, 1), (1.0, 0), (0.0, 0)):
        launched.clear()
        campaign._write_state(work, {"stages": stages, "deadline": time.time() + 180})
        (work / campaign.HOLD_FILE).unlink(missing_ok=True)
        if moved is not None:
            (work / campaign.HOLD_FILE).write_text(repr(time.time() + 60 * moved))
        ending = campaign.run_cells(work, campaign._state(work), launch, [])
        assert len(launched) == expected, (moved, ending)


def test_a_hold_moved_to_now_lets_the_run_in_flight_end_and_starts_no_other(tmp_path: Path) -> None:
    # `wait --hold-minutes 0`: a call that knows the machine is nearly spent lets the run in flight finish
    # before the stop that follows it, and no pending cell starts
    campaign = _module()
    work = tmp_path / "work"
    _finished(work / "src", "a", "kda", 2048, 400.0, ["experiment=e"])
    (work / "brought.json").write_text("{}")
    cell = ["experiment=e", "task=mqar", "task.seq_len=2048", "mixer=kda"]
    stages = [[*cell, f"seed={seed}"] for seed in (1, 2)]
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 3600, "pid": os.getpid()})
    launched: list[list[str]] = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        launched.append(overrides)
        campaign.move_hold(work, 0.0)
        return 0

    ending = campaign.run_cells(work, campaign._state(work), launch, [])
    assert len(launched) == 1 and ending.startswith("done for this hold: none of the 1 pending"), ending
    campaign._write_state(work, {**campaign._state(work), "pid": None})
    cli = subprocess.run([sys.executable, CAMPAIGN, "wait", "--work", work, "--hold-minutes", "0"],
                         capture_output=True, text=True)
    assert cli.returncode == 0 and "give minutes" not in cli.stderr, cli.stderr


def test_moving_the_hold_of_a_campaign_that_ended_still_packs_its_runs(tmp_path: Path) -> None:
    # the supervisor ended for want of time before the call that moves the hold: that call is the one
    # that brings back what it finished, so it says so in a line and packs
    work = tmp_path / "work"
    run = work / "src" / "results" / "x" / "a"
    (run / ".hydra").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"status": "completed", "steps": 10}))
    (run / ".hydra" / "overrides.yaml").write_text("- mixer=a\n")
    (work / "brought.json").write_text("{}")
    (work / "state.json").write_text(json.dumps({"stages": [], "deadline": time.time(), "pid": None}))
    result = subprocess.run([sys.executable, CAMPAIGN, "wait", "--work", work, "--hold-minutes", "20",
                             "--out", tmp_path / "out"], capture_output=True, text=True)
    assert result.returncode == 0 and "no campaign running" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and len(list((tmp_path / "out").glob("campaign-*"))) == 1


def _stop_if_started(work: Path) -> None:
    """A start that should have been refused but was not leaves no campaign training behind the test."""
    if (work / "state.json").exists():
        subprocess.run([sys.executable, CAMPAIGN, "stop", "--work", work, "--grace", "20"],
                       capture_output=True, timeout=120)


@pytest.mark.parametrize(("text", "message"), [
    # launched, these stages failed whole, and the supervisor reported "every cell has run"
    ("experiment=smoke trainer.max_stepz=10\n",
     "Could not override 'trainer.max_stepz'. : Key 'max_stepz' not in 'TrainerConfig'; fix the line"),
    ("experiment=smoke mixer=kda,kdaa\n", "Could not find 'mixer/kdaa' Available options in 'mixer':"),
    ("experiment=smoke optim.lr=1e-3,abc\n",
     "optim.lr=abc: Value 'abc' of type 'str' could not be converted"),
    ("experiment=smoke hydra/launcher=lokal\n", "Could not find 'hydra/launcher/lokal'"),
    # an unclosed quote: shlex's error, named by its line
    ('experiment=smoke "optim.lr=1e-3\n',
     "line 2: No closing quotation in 'experiment=smoke \"optim.lr=1e-3'"),
])
def test_a_plan_train_py_cannot_compose_is_one_line_before_anything_is_copied(
        tmp_path: Path, text: str, message: str) -> None:
    plan = tmp_path / "plan.txt"
    plan.write_text("experiment=smoke seed=0,1\n" + text)
    result = subprocess.run([sys.executable, CAMPAIGN, "start", plan, "--work", tmp_path / "work"],
                            capture_output=True, text=True, timeout=120)
    _stop_if_started(tmp_path / "work")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("campaign: plan ") and message in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "work").exists()


def test_a_campaign_command_on_a_work_dir_without_a_campaign_says_so(tmp_path: Path) -> None:
    """A --work that no start used (a typo, another CAMPAIGN_WORK): it read as a campaign that had ended with
    nothing finished, exit 0."""
    for command in ("wait", "stop", "status", "fetch"):
        extra = ["--out", tmp_path / "out"] if command == "fetch" else []
        result = subprocess.run([sys.executable, CAMPAIGN, command, "--work", tmp_path / "nowhere", *extra],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip() == (f"campaign: no campaign in {tmp_path / 'nowhere'} (no state.json): "
                                         "give the --work that start used, or start one there "
                                         "(start PLAN...)")
    assert not (tmp_path / "nowhere").exists()


def test_unpack_checks_every_archive_before_it_unpacks_any(tmp_path: Path) -> None:
    good = _archive(tmp_path / "good.tar.gz", {"results/x/r/summary.json": b'{"status": "completed"}'})
    bad = tmp_path / "bad.tar.gz"
    bad.write_text("not an archive")
    into = tmp_path / "co"
    gone = tmp_path / "gone.tar.gz"
    for archives, message in (([good, bad], f"campaign: unpack: {bad} is not a whole campaign archive "
                                            "(not a gzip file): give a campaign-*.tar.gz"),
                              ([good, gone], f"campaign: unpack: {gone} does not exist: give a "
                                             "campaign-*.tar.gz")):
        result = subprocess.run([sys.executable, CAMPAIGN, "unpack", *archives, "--into", into],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stderr.startswith(message), result.stderr
        assert len(result.stderr.splitlines()) == 1 and not into.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["extend", "{results}", "--max-steps", "0"], "--max-steps 0: give the longer budget in steps, >= 1"),
    (["extend", "{results}", "--max-steps", "20000", "--below", "2"],
     "--below 2: give an accuracy in (0, 1]"),
    (["extend", "{results}", "--max-steps", "20000", "--metric", "best_eval_ac"],
     "--metric best_eval_ac: no finished run's summary.json under {results} has it"),
    (["seeds", "{results}", "--seeds", "-1"], "--seeds '-1': train.py takes seeds >= 0"),
    (["left", "{plan}", "--gpus", "0"], "--gpus 0: give GPUs, >= 1"),
    (["left", "{plan}", "--carry-calls", "0"], "--carry-calls 0: give the calls a stop's checkpoints"),
    (["start", "{plan}", "--work", "{work}", "--carry-calls", "0"], "--carry-calls 0: give the calls"),
    (["start", "{plan}", "--work", "{work}", "--hold-minutes", "-5"],
     "--hold-minutes -5: give minutes from now"),
    (["start", "{plan}", "--work", "{work}", "--hold-minutes", "0"],
     "--hold-minutes 0: give minutes from now, > 0"),
    (["wait", "--work", "{work}", "--hold-minutes", "-1"], "--hold-minutes -1: give minutes from now, >= 0"),
    (["wait", "--work", "{work}", "--minutes", "-1"], "--minutes -1: give minutes to wait, >= 0"),
])
def test_an_option_whose_number_means_nothing_is_one_line(tmp_path: Path, args: list[str],
                                                           message: str) -> None:
    """Accepted before: --max-steps 0 planned nothing, --below 2 every cell, a misspelt --metric called every
    cell diverged, seed -1 planned runs train.py refuses, a hold that ended 5 minutes ago started a run."""
    results = tmp_path / "results" / "grid"
    _scored(results, "a", ["experiment=e", "task=a", "task.seq_len=256", "optim.lr=0.001", "seed=0"], 0.5)
    plan = tmp_path / "plan.txt"
    plan.write_text("experiment=smoke\n")
    names = {"results": str(results), "plan": str(plan), "work": str(tmp_path / "work")}
    result = subprocess.run([sys.executable, CAMPAIGN, *(arg.format(**names) for arg in args)],
                            capture_output=True, text=True, timeout=60)
    _stop_if_started(tmp_path / "work")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("campaign: " + message.format(**names)), result.stderr
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "work").exists()


def test_the_plan_check_keeps_the_callers_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lent GPU machine finds Hydra on PYTHONPATH only (its wheels, unpacked beside): the check that
    composes the plan's stages must add the checkout to it, not replace it, or every start is refused."""
    campaign = _module()
    seen: dict[str, str] = {}

    def run(command, **kwargs):
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(campaign.subprocess, "run", run)
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    campaign.check_stages([["experiment=smoke", "seed=0,1"]], ROOT, [Path("plan.txt")])
    assert seen["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/tmp/site"]


def test_a_cell_resumed_from_its_checkpoint_runs_before_the_plans_earlier_cells(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # a later stage's run carried with its checkpoint goes on before an earlier stage's fresh run takes
    # the hold (and, with --fill, its end); left prices them in that order
    campaign, work, src = _work_with_gdn_checkpointed(tmp_path)
    stages = [["experiment=e", "task=mqar", "task.seq_len=2048", "mixer=mamba2"],
              ["experiment=e", "task=mqar", "task.seq_len=2048", "mixer=gdn"]]
    launched: list[list[str]] = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        launched.append(overrides)
        return 0

    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 3600, "fill": True})
    campaign.run_cells(work, campaign._state(work), launch, [])
    assert [o[-1] for o in launched] == ["mixer=gdn", "mixer=mamba2"]
    # without the checkpoint the plan's order holds
    (src / "results" / "x" / "b" / "checkpoint.pt").unlink()
    launched.clear()
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 3600, "fill": True})
    campaign.run_cells(work, campaign._state(work), launch, [])
    assert [o[-1] for o in launched] == ["mixer=mamba2", "mixer=gdn"]
    plan = tmp_path / "plan.txt"
    plan.write_text("experiment=e task.seq_len=2048 mixer=mamba2 task=mqar\n"
                    "experiment=e task.seq_len=2048 mixer=gdn task=mqar\n")
    (src / "results" / "x" / "b" / "checkpoint.pt").write_bytes(b"ckpt")
    capsys.readouterr()
    campaign.left([plan], src)
    lines = [line for line in capsys.readouterr().out.splitlines() if "done by" in line]
    assert lines[0].split()[:2] == ["stage", "2"] and lines[1].split()[:2] == ["stage", "1"], lines


def test_a_carried_run_not_launched_here_is_listed_as_carried_not_in_flight_and_its_postponement_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # start --resume put gdn's run back, but a hold too short for its steps left, without --fill, leaves it
    # waiting: the status table must not count it in flight, and the postponed line names the reason
    campaign, work, src = _work_with_gdn_checkpointed(tmp_path)
    run = src / "results" / "x" / "b"
    (run / "train.log").write_text("[train] step 750/1000\n")
    (work / campaign.CARRIED_FILE).write_text(json.dumps({"results/x/b": campaign._log_size(run)}))
    stages = [["experiment=e", "task=mqar", "task.seq_len=2048", "mixer=gdn"]]
    launched: list[list[str]] = []

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        launched.append(overrides)
        return 0

    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 100, "fill": False})
    campaign.run_cells(work, campaign._state(work), launch, [])
    assert launched == []
    assert [n for n, _ in campaign.classify(work)["carried"]] == ["results/x/b"]
    assert campaign.classify(work)["running"] == []
    campaign.pack(work, None)
    printed = capsys.readouterr().out
    assert "in flight 0, carried in and not launched 1," in printed
    assert "carried  results/x/b: carried in at step 750, not launched here" in printed
    assert ("postponed stage 1 (single run): about 1.8 min (carried in; without --fill a run "
            "that outlasts the hold waits for a longer one)" in printed), printed
    # a stop still carries it on (its checkpoint is the one it came with)
    assert campaign._checkpointed_in_flight(work) == [run]
    # with --fill it waits too in the hold's last minutes, and says what would start it
    campaign._write_state(work, {"stages": stages, "deadline": time.time() + 100, "fill": True})
    campaign.run_cells(work, campaign._state(work), launch, [])
    campaign.pack(work, None)
    assert launched == []
    assert "(carried in; --fill starts it once no other cell runs or fits, 2 min or more left)" in \
        capsys.readouterr().out
    # once train.py writes to its log here, it is in flight
    with open(run / "train.log", "a") as log:
        log.write("[train] resumed from step 750\n")
    groups = campaign.classify(work)
    assert [n for n, _ in groups["running"]] == ["results/x/b"] and groups["carried"] == []
