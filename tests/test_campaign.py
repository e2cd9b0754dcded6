"""tools/campaign.py on the CPU: a detached campaign of two stages, packed, unpacked into a checkout that then
skips what it holds; a stop mid-run; archives that must not unpack."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "tools" / "campaign.py"
TINY = ("experiment=smoke hydra/launcher=local hydra.sweep.dir=results/campaign_test trainer.max_steps=6 "
        "trainer.eval_every=3 trainer.log_every=3")


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
    assert "finished here 0, in flight 0, brought 3" in second.stdout
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
    deadline = time.monotonic() + 120
    # stopped once it has a checkpoint: a stop inside the first steps leaves none, and says so
    checkpoints: list[Path] = []
    while not checkpoints and time.monotonic() < deadline:
        time.sleep(0.5)
        checkpoints = list((work / "src" / "results" / "campaign_test").rglob("checkpoint.pt"))
    assert checkpoints, "the run never checkpointed"
    metrics = [checkpoints[0].parent / "metrics.jsonl"]
    status = _campaign("status", "--work", work)
    assert "supervisor running" in status.stdout and "in flight 1" in status.stdout
    stopped = _campaign("stop", "--work", work, "--out", tmp_path / "out")
    assert "campaign: stopped" in stopped.stdout and "finished here 0, in flight 1" in stopped.stdout
    assert not (tmp_path / "out").exists()
    run = metrics[0].parent
    assert json.loads((run / "summary.json").read_text())["status"] == "incomplete"
    assert (run / "checkpoint.pt").exists()
    state = json.loads((work / "state.json").read_text())
    assert state["stopped"] is True
    # nothing of the campaign is left running: the supervisor and its sweep's process group are gone
    stat = Path(f"/proc/{state['pid']}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # gone, or unreaped
    assert [p for p in Path("/proc").glob("[0-9]*") if str(work) in _where(p)] == []


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
