"""Fault injection: replay the ways runs and sweeps break, and report per case what was lost (nothing).

    python tests/fault_injection.py --out /tmp/faults            # the full form: more kills, a reference
    python tests/fault_injection.py --fast --out /tmp/faults     # CI's form (tests/test_faults.py), ~30 s

Cases, each on the CPU with a tiny model, as a user runs it (train.py in subprocesses):

- two writers: the same `python train.py hydra.run.dir=D` twice at once; the second is refused (it names
  the first's pid) and the first's run directory is complete.
- kill storm: a small sweep through `hydra/launcher=local` (2 jobs at once), re-launched after every
  kill until it is done; the kills are SIGKILL of one job (as the OOM killer does), SIGTERM of one job,
  and SIGKILL of the sweep's own process (its jobs get SIGTERM). After a job is killed its sweep must end
  with exit 1 and the job recorded `failed`, the other job of the launch finishing. At the end every run
  must be complete and consistent (summary, checkpoint and metrics agree; each logged step once), and in
  the full form equal to an uninterrupted sweep, record by record (time_s aside).
- corrupt summary in a sweep: a finished run's summary.json cut mid-write; re-launching rebuilds it from
  the checkpoint (a warning in train.log) and the sweep exits 0.
- bad files in analysis: a cut summary.json and a cut metrics.jsonl line; analysis.collect and
  analysis.plot exit 0 and name both files.
- relaunch, on the finished sweep: the grid in another order (every run found again and left alone, no
  file changed); one run relaunched with trainer.max_steps raised (extended from its checkpoint to the new
  step count, the change in its summary); one whose summary was lost after its last checkpoint, resumed
  with trainer.precision changed (refused, naming it; no file changed, .hydra/ included). A finished
  run relaunched with another config is tests/test_faults.py's (in one process).

The fast form runs the kill storm (3 kills, one of each kind), the corrupt summary and the relaunch cases:
what only a sweep shows. Two writers and bad files in analysis are left to tests/test_faults.py, which
asserts the same in one process (a launch refused while another process holds the lock, from Python and
from the command line; a cut summary.json and a cut metrics.jsonl line in collect and plot).

Every run directory is checked at the end: its summary, checkpoint, metrics and `.hydra/` record of the
config must agree (same step count, the last eval in metrics is the summary's, the config .hydra/ holds is
what the summary and the checkpoint say the run computed). Prints one line per case, `<case>: nothing lost,
nothing mislabelled` or `<case>: LOST <what>`, and exits 1 if anything was lost or mislabelled.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.collect import _load_config  # noqa: E402
from harness.config import computed  # noqa: E402
from harness.rundir import read_metrics  # noqa: E402

# The smoke experiment with softmax attention (the fastest mixer on a CPU: the faults are the point) at two
# learning rates; short runs, a checkpoint every few steps.
MAX_STEPS, LOG_EVERY, EVAL_EVERY, CHECKPOINT_EVERY = 200, 5, 50, 20
SWEEP = [
    "experiment=smoke",
    "mixer=attention",
    "optim.lr=3e-3,1e-2",
    f"trainer.max_steps={MAX_STEPS}",
    f"trainer.log_every={LOG_EVERY}",
    f"trainer.eval_every={EVAL_EVERY}",
    f"trainer.checkpoint_every={CHECKPOINT_EVERY}",
    "hydra/launcher=local",
    "hydra.launcher.n_jobs=2",
    "hydra.launcher.stop_timeout_s=30",
]
# long enough that the second writer, a few seconds behind, finds the first still training
TWO_WRITERS_STEPS = 1000
SINGLE = [
    "task=palindrome", "mixer=attention", "task.seq_len=16", "task.num_train=64", "task.num_eval=16",
    "task.params.vocab_size=8", "model.d_model=16", "mixer.head_dim=8", "trainer.batch_size=8",
    "trainer.device=cpu", "trainer.cpu_threads=1", f"trainer.max_steps={TWO_WRITERS_STEPS}",
    f"trainer.log_every={LOG_EVERY}", f"trainer.eval_every={EVAL_EVERY}",
    f"trainer.checkpoint_every={CHECKPOINT_EVERY}",
]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled",
            "PYTHONPATH": str(ROOT)}


def _train(*args: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, env=_env(), stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _holder(run_dir: Path, parent: int) -> int | None:
    """The pid of the job of sweep process `parent` that holds the run directory's lock (the lock file
    names its holder; a killed holder's name stays behind, and its pid may be reused, hence the check)."""
    try:
        match = re.match(r"pid (\d+) ", (run_dir / ".lock").read_text())
        if match is None:
            return None
        status = Path(f"/proc/{match.group(1)}/status").read_text()
    except OSError:
        return None
    ppid = re.search(r"^PPid:\s+(\d+)", status, re.M)
    return int(match.group(1)) if ppid and int(ppid.group(1)) == parent else None


def _no_holder(sweep_dir: Path) -> bool:
    """No live process holds a lock in the sweep (after its launcher died, its jobs must stop too)."""
    for run_dir in _run_dirs(sweep_dir):
        lock = run_dir / ".lock"
        match = re.match(r"pid (\d+) ", lock.read_text()) if lock.exists() else None
        if match and Path(f"/proc/{match.group(1)}").exists():
            cmdline = Path(f"/proc/{match.group(1)}/cmdline").read_bytes()
            if b"train.py" in cmdline:
                return False
    return True


def logged_steps(max_steps: int) -> list[int]:
    return [s for s in range(1, max_steps + 1)
            if s == 1 or s % LOG_EVERY == 0 or s % EVAL_EVERY == 0 or s == max_steps]


def check_run(run_dir: Path, max_steps: int) -> list[str]:
    """What is missing or inconsistent in a finished run directory (empty: nothing)."""
    import torch

    lost = []
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        return [f"{run_dir.name}: summary.json ({error})"]
    if summary.get("status") != "completed" or summary.get("steps") != max_steps:
        lost.append(f"{run_dir.name}: status {summary.get('status')} after {summary.get('steps')} steps "
                    f"({summary.get('error')})")
    records, problems = read_metrics(run_dir / "metrics.jsonl")
    lost += [f"{run_dir.name}: {p}" for p in problems]
    steps = [r["step"] for r in records]
    if steps != logged_steps(max_steps):
        missing = sorted(set(logged_steps(max_steps)) - set(steps))
        lost.append(f"{run_dir.name}: metrics steps missing {missing}, repeated "
                    f"{sorted({s for s in steps if steps.count(s) > 1})}")
    evals = [r for r in records if "eval/acc" in r]
    if not evals or evals[-1]["eval/acc"] != summary.get("final_eval_acc"):
        lost.append(f"{run_dir.name}: final_eval_acc {summary.get('final_eval_acc')} is not the last eval")
    if max(r["eval/acc"] for r in evals or [{"eval/acc": None}]) != summary.get("best_eval_acc"):
        lost.append(f"{run_dir.name}: best_eval_acc disagrees with metrics.jsonl")
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    if state["progress"]["step"] != max_steps:
        lost.append(f"{run_dir.name}: checkpoint at step {state['progress']['step']}")
    return lost + mislabelled(run_dir, summary, state)


def mislabelled(run_dir: Path, summary: dict, state: dict) -> list[str]:
    """Where a run directory's record of its config disagrees with what it computed: .hydra/config.yaml,
    the summary's config and the checkpoint's, compared on what a run computes (harness.config.computed)."""
    name = run_dir.name
    try:
        recorded = computed(_load_config(run_dir))
    except Exception as error:  # noqa: BLE001 - any unreadable record is a finding
        return [f"{name}: .hydra/config.yaml unreadable ({error})"]
    found = []
    for what, config in (("summary.json", summary.get("config") or {}), ("checkpoint.pt", state["config"])):
        # lists as .hydra/'s reading writes them (JSON text)
        config = {k: json.dumps(list(v)) if isinstance(v, (list, tuple)) else v
                  for k, v in computed(config).items()}
        differ = sorted(k for k in recorded.keys() | config.keys() if recorded.get(k) != config.get(k))
        if differ:
            found.append(f"{name}: .hydra/ and {what} disagree on " + ", ".join(
                f"{k} ({recorded.get(k)!r} vs {config.get(k)!r})" for k in differ[:4]))
    return found


def _records(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time_s"} for r in read_metrics(run_dir / "metrics.jsonl")[0]]


def _run_dirs(sweep_dir: Path) -> list[Path]:
    configs = sweep_dir.rglob(".hydra/config.yaml")
    return sorted(p.parent.parent for p in configs if ".submitit" not in p.parts)


def case_two_writers(out: Path) -> list[str]:
    run_dir = out / "two_writers"
    args = [*SINGLE, f"hydra.run.dir={run_dir}"]
    first = _train(*args, log=out / "two_writers.first.log")
    lost = []
    try:
        if not _wait_for(lambda: _holder(run_dir, os.getpid()) == first.pid, 120):
            return ["the first run never started"]
        second = _train(*args, log=out / "two_writers.second.log")
        second.wait(120)
        said = (out / "two_writers.second.log").read_text(errors="replace")
        if second.returncode == 0 or f"in use by pid {first.pid}" not in said:
            lost.append(f"the second writer was not refused (exit {second.returncode})")
        first.wait(300)
    finally:
        for process in (first,):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    if first.returncode != 0:
        lost.append(f"the first run exited {first.returncode}")
    return lost + check_run(run_dir, TWO_WRITERS_STEPS)


def _sweep(sweep_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    return _train("-m", *SWEEP, f"hydra.sweep.dir={sweep_dir}", log=log)


def _summary_of(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _victim(sweep_dir: Path, sweep: subprocess.Popen[bytes], lines: int) -> tuple[Path, int] | None:
    """A job of `sweep` that has logged `lines` metrics records in this launch, or None (the sweep ended)."""
    found: list[tuple[Path, int]] = []
    # a resumed run's file is cut back to its checkpoint first: count from its shortest
    start: dict[Path, int] = {}

    def training() -> bool:
        for run_dir in _run_dirs(sweep_dir):
            pid = _holder(run_dir, sweep.pid)
            if not pid:
                continue
            now = _lines(run_dir / "metrics.jsonl")
            start[run_dir] = min(start.get(run_dir, now), now)
            if now - start[run_dir] >= lines:
                found.append((run_dir, pid))
                return True
        return sweep.poll() is not None

    _wait_for(training, 120)
    return found[0] if found and sweep.poll() is None else None


def case_kill_storm(out: Path, kills: int, rng: random.Random,
                    reference: Path | None) -> tuple[list[str], str]:
    sweep_dir = out / "storm"
    lost: list[str] = []
    faults = ["kill_job", "term_job", "kill_sweep"]
    done = 0
    for attempt in range(kills + 4):
        log = out / f"storm.{attempt}.log"
        process = _sweep(sweep_dir, log)
        fault = faults[done % len(faults)] if done < kills else None
        # some jobs die with a checkpoint to resume from, some before their first
        victim = _victim(sweep_dir, process, rng.randint(1, 10)) if fault else None
        if victim is not None:
            try:
                os.kill(process.pid if fault == "kill_sweep" else victim[1],
                        signal.SIGTERM if fault == "term_job" else signal.SIGKILL)
            except ProcessLookupError:
                pass
            done += 1
        try:
            process.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            lost.append(f"launch {attempt} hung")
        said = log.read_text(errors="replace")
        if process.returncode == 0:  # done: every run complete (a kill that came too late leaves it so)
            break
        if victim is None:
            continue
        run_dir, where = victim[0], f"launch {attempt}, {victim[0].relative_to(sweep_dir)}"
        summary = _summary_of(run_dir)
        if fault == "kill_sweep" and not _wait_for(lambda: _no_holder(sweep_dir), 60):
            lost.append(f"{where}: jobs still training 60 s after their sweep was killed")
        if fault == "term_job" and (summary.get("status"), summary.get("error")) != (
                "incomplete", "Terminated: SIGTERM"):
            lost.append(f"{where}: SIGTERMed, but {summary.get('status')} ({summary.get('error')})")
        if fault == "kill_job":
            if process.returncode != 1 or "killed by SIGKILL" not in said:
                lost.append(f"{where}: a SIGKILLed job did not fail the sweep (exit {process.returncode})")
            if summary.get("status") != "failed" or "SIGKILL" not in str(summary.get("error")):
                lost.append(f"{where}: SIGKILLed, but recorded {summary.get('status')}")
            others = [_summary_of(d).get("status") for d in _run_dirs(sweep_dir) if d != run_dir]
            if any(status != "completed" for status in others):
                lost.append(f"{where}: the other job did not finish ({others})")
    else:
        lost.append("the sweep never completed")
    runs = _run_dirs(sweep_dir)
    if len(runs) != 2:
        lost.append(f"{len(runs)} run directories, not 2")
    for run_dir in runs:
        lost += check_run(run_dir, MAX_STEPS)
    if reference is not None:
        for run_dir in runs:
            twin = reference / run_dir.relative_to(sweep_dir)
            if _records(run_dir) != _records(twin):
                lost.append(f"{run_dir.relative_to(sweep_dir)}: metrics differ from the uninterrupted run")
    return lost, f"{done} kills, {attempt + 1} launches"


def case_corrupt_summary_in_sweep(out: Path) -> list[str]:
    sweep_dir = out / "storm"
    run_dir = _run_dirs(sweep_dir)[0]
    before = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text((run_dir / "summary.json").read_text()[:40])
    log = out / "corrupt_summary.log"
    process = _sweep(sweep_dir, log)
    process.wait(300)
    lost = [] if process.returncode == 0 else [f"the re-launch exited {process.returncode}"]
    if "summary.json: not valid JSON" not in (run_dir / "train.log").read_text():
        lost.append("no warning in train.log")
    after = json.loads((run_dir / "summary.json").read_text())
    for key in ("status", "steps", "final_eval_acc", "best_eval_acc", "steps_to_threshold"):
        if after.get(key) != before.get(key):
            lost.append(f"{key}: {before.get(key)} -> {after.get(key)}")
    return lost + check_run(run_dir, MAX_STEPS)


def case_bad_files_in_analysis(out: Path) -> list[str]:
    # two copies of the sweep: each cell keeps a readable run when one of its files is cut
    copy = out / "analysis_copy"
    for half in ("a", "b"):
        shutil.copytree(out / "storm", copy / half)
    runs = [_run_dirs(copy / "a")[0], _run_dirs(copy / "b")[1]]
    (runs[0] / "summary.json").write_text('{"status": "compl')
    metrics = runs[1] / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([*lines[:2], lines[2][:10], *lines[3:]]) + "\n")
    lost = []
    for module, args in (("analysis.collect", ["--out", str(out / "table.csv")]),
                         ("analysis.plot", ["--out", str(out / "figs")])):
        result = subprocess.run([sys.executable, "-m", module, str(copy), *args], cwd=ROOT, env=_env(),
                                capture_output=True, text=True)
        said = result.stdout + result.stderr
        if module == "analysis.plot" and (out / "figs" / "summary.md").exists():
            said += (out / "figs" / "summary.md").read_text()
        if result.returncode != 0:
            lost.append(f"{module} exited {result.returncode}: {said[-300:]}")
        for path in ([runs[0] / "summary.json"] if module == "analysis.collect" else [metrics]):
            if str(path) not in said:
                lost.append(f"{module} did not name {path.relative_to(copy)}")
    return lost


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the run directories under `root` with its bytes (lock files, empty while nobody holds
    them, aside; the sweep's own multirun.yaml, the record of its last launch, too)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock" and p.parent != root}


def _job_args(run_dir: Path, sweep_dir: Path) -> list[str]:
    """The overrides of a storm job, for launching it alone into its own directory."""
    args = [a for a in SWEEP if not a.startswith(("optim.lr=", "hydra/launcher", "hydra.launcher"))]
    lr = next(part for part in run_dir.relative_to(sweep_dir).parts if part.startswith("optim.lr="))
    return [*args, lr, f"hydra.run.dir='{run_dir}'"]  # quoted: the path holds `=`


def _said(log: Path) -> str:
    return log.read_text(errors="replace")


def _changed(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def case_relaunch(out: Path) -> tuple[list[str], str]:
    """Relaunches of the finished storm sweep: reordered, max_steps raised, a resume with the precision
    changed. What each must (and must not) change: see the module's docstring."""
    sweep_dir = out / "storm"
    runs = _run_dirs(sweep_dir)
    lost: list[str] = []
    before = _snapshot(sweep_dir)
    grid = [a if not a.startswith("optim.lr=") else "optim.lr=1e-2,3e-3" for a in SWEEP]
    process = _train("-m", *grid, f"hydra.sweep.dir={sweep_dir}", log=out / "relaunch.reorder.log")
    process.wait(300)
    said = (out / "relaunch.reorder.log").read_text(errors="replace")
    if process.returncode != 0 or said.count("already completed") != len(runs):
        found = said.count("already completed")
        lost.append(f"reordered grid: exit {process.returncode}, {found} runs found")
    changed = _changed(before, _snapshot(sweep_dir))
    if changed:
        lost.append(f"reordered grid changed {changed[:3]}")

    extended, interrupted = runs[0], runs[1]
    log = out / "relaunch.max_steps.log"
    process = _train(*_job_args(extended, sweep_dir), f"trainer.max_steps={MAX_STEPS + 40}", log=log)
    if process.wait(300) != 0 or "extending the completed run from its checkpoint" not in _said(log):
        lost.append(f"max_steps raised: exit {process.returncode}, not extended")
    changes = _summary_of(extended).get("config_changes") or []
    change = {"step": MAX_STEPS, "key": "trainer.max_steps", "old": MAX_STEPS, "new": MAX_STEPS + 40}
    if change not in changes:
        lost.append(f"max_steps raised: config_changes {changes}")

    # killed after its last checkpoint, before its summary: a resume with the precision changed is refused
    summary = (interrupted / "summary.json").read_bytes()
    (interrupted / "summary.json").unlink()
    before = _snapshot(sweep_dir)
    log = out / "relaunch.precision.log"
    process = _train(*_job_args(interrupted, sweep_dir), "trainer.precision=bf16", log=log)
    refused = "holds the checkpoint of a run of another config (trainer.precision='fp32' -> 'bf16')"
    if process.wait(300) != 1 or refused not in _said(log):
        lost.append(f"precision changed on resume: exit {process.returncode}, not refused with the key named")
    if _changed(before, _snapshot(sweep_dir)):
        lost.append(f"a refused resume changed {_changed(before, _snapshot(sweep_dir))[:3]}")
    (interrupted / "summary.json").write_bytes(summary)
    lost += check_run(extended, MAX_STEPS + 40) + check_run(interrupted, MAX_STEPS)
    return lost, "reordered, max_steps extended, precision refused on resume"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder for the runs (emptied first)")
    parser.add_argument("--fast", action="store_true",
                        help="CI's form: 3 kills, no reference sweep, the storm and the corrupt summary only")
    parser.add_argument("--kills", type=int, help="kills in the storm (default 3 fast, 9 full)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    rng = random.Random(args.seed)
    reference = None
    if not args.fast:
        reference = args.out / "reference"
        process = _sweep(reference, args.out / "reference.log")
        if process.wait(600) != 0:
            print(f"the reference sweep failed: see {args.out / 'reference.log'}")
            return 1
    kills = args.kills if args.kills is not None else (3 if args.fast else 9)
    results: list[tuple[str, list[str], str]] = []
    start = time.monotonic()
    storm, note = case_kill_storm(args.out, kills, rng, reference)
    results.append(("kill storm", storm, f"{note}, {time.monotonic() - start:.0f} s"))
    began = time.monotonic()
    results.append(("corrupt summary in a sweep", case_corrupt_summary_in_sweep(args.out),
                    f"{time.monotonic() - began:.0f} s"))
    began = time.monotonic()
    relaunch, note = case_relaunch(args.out)
    results.append(("relaunch", relaunch, f"{note}, {time.monotonic() - began:.0f} s"))
    if not args.fast:
        results.append(("bad files in analysis", case_bad_files_in_analysis(args.out), ""))
        results.append(("two writers", case_two_writers(args.out), ""))
    for case, lost, note in results:
        extra = f" ({note})" if note else ""
        print(f"{case}: nothing lost, nothing mislabelled{extra}" if not lost
              else f"{case}: LOST {'; '.join(lost)}{extra}")
    print(f"{time.monotonic() - start:.0f} s; logs in {args.out}")
    return 1 if any(lost for _, lost, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
