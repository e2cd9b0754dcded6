"""Faults and bad input: nothing lost, nothing mislabelled.

Each test here replays one way a careful user broke the harness (two processes in one run directory,
impossible optimiser values, a changed config on resume, `+key` typos, a zero decay, corrupt files, a
killed worker, SIGTERM) and checks that the run directory stays consistent, or that the launch is refused
with a message naming the value and the fix. tests/fault_injection.py replays them end to end (with a kill
storm on a small sweep); `test_fault_injection_fast` runs its fast form.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers import CLI_TINY, rel_rms
from omegaconf import DictConfig
from test_analysis import write_run

import kernels
import kernels.ops
import train
from analysis import collect, plot
from runcheck import ConfigError
from rundir import FileUnreadable, ResumeRefused, RunDirBusy

ROOT = Path(__file__).resolve().parents[1]
MakeCfg = Callable[..., DictConfig]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _files(run_dir: Path) -> dict[str, bytes]:
    """Every file under a run directory (the lock's, empty while nobody holds it, aside), with its bytes."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ---- kernels: a zero decay, non-finite inputs, Triton without a GPU ----

SCALAR_AND_CHANNEL = [
    ("simple_gla", "scalar", False),
    ("gated_delta_rule", "scalar", True),
    ("gla", "channel", False),
    ("kda", "channel", True),
]


@pytest.mark.parametrize(("name", "decay", "delta"), SCALAR_AND_CHANNEL,
                         ids=[c[0] for c in SCALAR_AND_CHANNEL])
def test_zero_decay_matches_the_reference(name: str, decay: str, delta: bool) -> None:
    """g = -inf (exp(g) = 0: the state is forgotten) is legal; the chunked form must equal the token loop,
    in outputs, final state and every gradient, not turn NaN."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 40, 2, 8, 8
    shape = (B, T, H) if decay == "scalar" else (B, T, H, K)
    g = F.logsigmoid(torch.randn(shape, generator=gen))
    g[:, [5, 17, 39]] = -math.inf  # a chunk start, the middle of a chunk, the last token
    inputs = {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen),
        "g": g,
    }
    if delta:
        inputs["beta"] = torch.rand(B, T, H, generator=gen)
    initial = torch.randn(B, H, K, V, generator=gen)
    op = getattr(kernels, f"chunk_{name}")
    results = {}
    for backend in ("naive", "torch"):
        leaves = {key: value.clone().requires_grad_() for key, value in inputs.items()}
        state = initial.clone().requires_grad_()
        o, final = op(**leaves, initial_state=state, output_final_state=True, backend=backend, chunk_size=16)
        (o.square().sum() + final.square().sum()).backward()
        results[backend] = [o, final, state.grad] + [leaves[key].grad for key in inputs]
    for ref, out in zip(results["naive"], results["torch"], strict=True):
        assert torch.isfinite(out).all()
        assert rel_rms(ref, out) < 1e-5


@pytest.mark.parametrize("bad", ["q", "k", "v", "beta", "initial_state"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_inputs_are_named(bad: str, value: float, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 8, 2, 8, 8
    args = {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": torch.randn(B, T, H, K, generator=gen),
        "v": torch.randn(B, T, H, V, generator=gen),
        "g": -torch.rand(B, T, H, K, generator=gen),
        "beta": torch.rand(B, T, H, generator=gen),
        "initial_state": torch.zeros(B, H, K, V),
    }
    args[bad].view(-1)[3] = value
    with pytest.raises(ValueError, match=rf"chunk_kda: {bad} hold\(s\) NaN or infinite"):
        kernels.chunk_kda(**args, backend="torch")
    # the check is one of the value checks: the gate the training loop turns off between its log steps
    monkeypatch.setattr(kernels.ops, "_values_checked", lambda t: False)
    kernels.chunk_kda(**args, backend="torch")


def test_triton_without_gpu_or_interpreter_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises(ValueError, match=r"backend='triton' got tensors on cpu.*TRITON_INTERPRET=1"):
        kernels.chunk_linear_attn(q, q, q, backend="triton")
    with pytest.raises(ValueError, match=r"TRITON_INTERPRET=1"):
        kernels.linear_attn_step(q[:, 0], q[:, 0], q[:, 0], torch.zeros(1, 1, 8, 8), backend="triton")


# ---- the run directory: one writer, consistent files, clear refusals ----

SHORT = ["trainer.max_steps=20", "trainer.eval_every=10", "trainer.log_every=2", "trainer.checkpoint_every=5"]


def _interrupted_run(
    make_cfg: MakeCfg, run_dir: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str
) -> None:
    """A run stopped by Ctrl-C as step 13 starts: checkpoint of step 12, summary `incomplete`."""
    indices = train.EpochSampler.indices

    def stop_at_13(self: train.EpochSampler, step: int) -> torch.Tensor:
        if step == 12:
            raise KeyboardInterrupt
        return indices(self, step)

    with monkeypatch.context() as patch:
        patch.setattr(train.EpochSampler, "indices", stop_at_13)
        with pytest.raises(KeyboardInterrupt):
            train.train(make_cfg(*SHORT, *overrides), run_dir, mixer_name="attention")
    assert _summary(run_dir)["status"] == "incomplete"


def _hold_lock(run_dir: Path) -> subprocess.Popen[str]:
    """Another process that holds the run directory's lock until killed."""
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from rundir import RunDir\n"
            f"with RunDir({str(run_dir)!r}).lock():\n    print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_writer_is_refused_and_a_killed_one_holds_no_lock(make_cfg: MakeCfg, tmp_path: Path) -> None:
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(RunDirBusy, match=rf"in use by pid {holder.pid} .*wait for that run to end"):
            train.train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
        # refused before it touched anything
        assert not (tmp_path / "summary.json").exists() and not (tmp_path / "metrics.jsonl").exists()
    finally:
        holder.kill()  # SIGKILL: no chance to release anything
        holder.wait()
    assert train.train(make_cfg(*SHORT), tmp_path, mixer_name="attention")["status"] == "completed"


def test_a_refused_command_line_run_writes_nothing_into_the_directory(tmp_path: Path) -> None:
    # Hydra saves .hydra/ before train.py runs: the run-dir lock is taken before that (hydra.callbacks)
    run_dir = tmp_path / "run"
    holder = _hold_lock(run_dir)
    try:
        command = [sys.executable, "train.py", "trainer.max_steps=1", f"hydra.run.dir={run_dir}"]
        refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    finally:
        holder.kill()
        holder.wait()
    assert refused.returncode == 1 and f"in use by pid {holder.pid}" in refused.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("optim.grad_clip=-1", "optim.grad_clip=-1.0: must be > 0, or null"),
        ("optim.grad_clip=0", "optim.grad_clip=0.0: must be > 0, or null"),
        ("optim.weight_decay=-1", "optim.weight_decay=-1.0: must be >= 0"),
        ("trainer.acc_threshold=2", r"trainer.acc_threshold=2.0: must be in \[0, 1\]"),
        ("trainer.cpu_threads=0", r"trainer.cpu_threads=0: must be >= 1 \(or null\)"),
        ("optim.lr=inf", "optim.lr=inf is not a finite number"),
        ("+trainer.max_stepz=10", "unknown key trainer.max_stepz .did you mean trainer.max_steps"),
        ("+optim.lrr=1e-2", "unknown key optim.lrr .did you mean optim.lr"),
        ("+task.seq_lenn=64", "unknown key task.seq_lenn"),
        ("+sed=1", "unknown key sed .did you mean seed"),
        ("+model.d_modle=64", "unknown key model.d_modle .did you mean model.d_model"),
        # a batch larger than the train set was accepted and then filled memory with repeats
        ("trainer.batch_size=999", r"trainer.batch_size=999 > task.num_train=\d+: .*lower trainer.batch_size"),
        ("+mixer.head_dimm=8", r"unknown parameter\(s\) \['head_dimm'\]"),
        ("+task.params.num_pairs=99", r"num_pairs"),
    ],
)
def test_impossible_values_and_added_keys_are_refused(
    make_cfg: MakeCfg, tmp_path: Path, override: str, named: str
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=named):
        train.train(make_cfg(*SHORT, override, "task=mqar", "task.seq_len=32", "task.num_train=64",
                             "task.num_eval=16", "task.params.vocab_size=32"), run_dir, mixer_name="attention")
    # found before anything is written: not even the directory
    assert not run_dir.exists()


def test_resume_with_a_changed_config_is_refused_or_recorded(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupted_run(make_cfg, tmp_path, monkeypatch)
    before = _files(tmp_path)
    # the checkpoint's optimizer and schedule hold lr 1e-3: resuming at 1e-2 would record a value not used
    with pytest.raises(ResumeRefused, match=r"checkpoint.pt \(step 12\) holds the checkpoint of a run of "
                                            r"another config \(optim.lr=0.001 -> 0.01\). .*Launch with its"):
        train.train(make_cfg(*SHORT, "optim.lr=1e-2"), tmp_path, mixer_name="attention")
    # refused before anything was written: every file as it was, train.log included
    assert _files(tmp_path) == before
    # where it runs may change; the summary records the change and the step it took effect at
    summary = train.train(make_cfg(*SHORT, "trainer.checkpoint_every=4"), tmp_path, mixer_name="attention")
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert summary["config_changes"] == [{"step": 12, "key": "trainer.checkpoint_every", "old": 5, "new": 4}]


def test_a_corrupt_summary_is_rebuilt_from_the_checkpoint(make_cfg: MakeCfg, tmp_path: Path) -> None:
    first = train.train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    (tmp_path / "summary.json").write_text('{"status": "compl')
    again = train.train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    log = (tmp_path / "train.log").read_text()
    assert "summary.json: not valid JSON" in log and "resumes from checkpoint.pt" in log
    assert (tmp_path / "summary.json.corrupt").read_text() == '{"status": "compl'
    for key in ("status", "steps", "final_eval_acc", "best_eval_acc", "steps_to_threshold", "n_params"):
        assert again[key] == first[key]


def test_a_corrupt_checkpoint_is_named_with_the_fix(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupted_run(make_cfg, tmp_path, monkeypatch)
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    with pytest.raises(FileUnreadable, match=r"checkpoint.pt: cannot be read .*delete it to train the run"):
        train.train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and "checkpoint.pt" in summary["error"]


def test_gaps_and_cut_lines_in_metrics_are_reported(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupted_run(make_cfg, tmp_path, monkeypatch)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    assert steps == [1, 2, 4, 6, 8, 10, 12]
    # steps 4 and 6 lost, and a line cut mid-write in the middle
    kept = [lines[0], lines[1], lines[4][:20], *lines[4:]]
    (tmp_path / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    summary = train.train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    log = (tmp_path / "train.log").read_text()
    assert "metrics.jsonl line 3 is not JSON" in log
    assert "has no record of step(s) 4, 6, before the checkpoint's step 12" in log
    assert summary["status"] == "completed"
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        1, 2, 8, 10, 12, 14, 16, 18, 20
    ]


def test_a_normal_resume_warns_about_nothing(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics check knows the logging schedule: an ordinary resume has no gap to report."""
    schedule = ("trainer.log_every=3", "trainer.eval_every=7")
    _interrupted_run(make_cfg, tmp_path, monkeypatch, *schedule)
    train.train(make_cfg(*SHORT, *schedule), tmp_path, mixer_name="attention")
    log = (tmp_path / "train.log").read_text()
    assert "resumed from" in log and "train.rundir" not in log


def test_a_diverged_run_lists_only_the_files_it_wrote(make_cfg: MakeCfg, tmp_path: Path) -> None:
    cfg = make_cfg("optim.lr=1e30", "optim.warmup_steps=0", "trainer.max_steps=20")
    assert train.train(cfg, tmp_path, mixer_name="attention")["status"] == "diverged"
    assert not (tmp_path / "checkpoint.pt").exists()
    last = (tmp_path / "train.log").read_text().strip().splitlines()[-1]
    assert "outputs:" in last and "summary.json" in last and "checkpoint.pt" not in last




def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_sigterm_checkpoints_like_ctrl_c(tmp_path: Path) -> None:
    """SIGTERM (what SLURM, schedulers and `kill` send first) stops the run as Ctrl-C does: at a step
    boundary it checkpoints the last finished step (the only checkpoint here), summary `incomplete`, exit
    143. Inside a step's update, like Ctrl-C, it keeps the last checkpoint instead."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "train.py", *CLI_TINY, "trainer.max_steps=100000", "trainer.log_every=10",
         "trainer.checkpoint_every=100000", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )
    metrics = run_dir / "metrics.jsonl"
    try:
        started = lambda: metrics.exists() and metrics.stat().st_size > 400 or process.poll() is not None
        _wait_for(started, 120, "training to start")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    summary = _summary(run_dir)
    assert summary["status"] == "incomplete" and summary["error"] == "Terminated: SIGTERM"
    log = (run_dir / "train.log").read_text()
    if "interrupted (Terminated) after step" in log:
        assert "checkpoint saved" in log
        checkpointed = torch.load(run_dir / "checkpoint.pt", weights_only=True)["progress"]["step"]
        assert checkpointed == summary["steps"] >= json.loads(metrics.read_text().splitlines()[-1])["step"]
    else:
        assert "interrupted (Terminated) inside step" in log and not (run_dir / "checkpoint.pt").exists()


# ---- analysis: one bad file never stops a table or a figure ----


def _small_sweep(root: Path) -> list[Path]:
    dirs = []
    for mixer in ("kda", "gdn"):
        for seed in (0, 1):
            run_dir = root / f"mixer={mixer}/seed={seed}"
            write_run(run_dir, task="mqar", mixer=mixer, seq_len=64, lr=1e-3, seed=seed)
            dirs.append(run_dir)
    return dirs


def test_collect_reports_unreadable_files_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = tmp_path / "sweep"
    runs = _small_sweep(sweep)
    (runs[0] / "summary.json").write_text('{"status": "compl')
    (runs[1] / ".hydra" / "config.yaml").write_text("task: [unclosed\n")
    assert collect.main([str(sweep), "--out", str(tmp_path / "table.csv")]) == 0
    table = collect.read_table(tmp_path / "table.csv").set_index("run")
    bad_summary, bad_config = table.loc["mixer=kda/seed=0"], table.loc["mixer=kda/seed=1"]
    assert bad_summary["status"] == "failed"
    assert "summary.json cannot be read (JSONDecodeError" in bad_summary["reason"]
    assert "re-launch the run" in bad_summary["reason"] and bad_summary["task"] == "mqar"
    assert bad_config["status"] == "failed" and "config.yaml cannot be read" in bad_config["reason"]
    assert (table.loc[["mixer=gdn/seed=0", "mixer=gdn/seed=1"], "status"] == "completed").all()
    printed = capsys.readouterr().out
    assert "runs left out (2" in printed
    assert str(runs[0] / "summary.json") in printed and str(runs[1] / ".hydra" / "config.yaml") in printed


def test_collect_takes_the_config_the_run_used(tmp_path: Path) -> None:
    """Every launch into a directory rewrites .hydra/config.yaml, also one that was refused or found the
    run finished: the row's config is what train.py recorded in summary.json."""
    run_dir = tmp_path / "sweep" / "run"
    write_run(run_dir, task="mqar", mixer="kda", seq_len=64, lr=1e-3, seed=0)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["config"] = {"optim.lr": 1e-3, "task.seq_len": 64, "logger.wandb.tags": ["task:mqar"]}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    hydra_config = run_dir / ".hydra" / "config.yaml"
    hydra_config.write_text(hydra_config.read_text().replace("lr: 0.001", "lr: 0.01"))
    row = collect.collect_dirs([tmp_path / "sweep"]).iloc[0]
    assert row["optim.lr"] == 1e-3 and row["lr"] == 1e-3 and row["logger.wandb.tags"] == '["task:mqar"]'


def test_plot_leaves_out_a_cut_metrics_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = tmp_path / "sweep"
    runs = _small_sweep(sweep)
    metrics = runs[2] / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([*lines[:3], lines[3][:15], *lines[4:]]) + "\n")
    assert plot.main([str(sweep), "--out", str(tmp_path / "figs")]) == 0
    summary = (tmp_path / "figs" / "summary.md").read_text()
    assert "## Runs left out" in summary and f"{metrics}: metrics.jsonl line 4 is not JSON" in summary
    assert "left out of accuracy vs steps: mixer=gdn/seed=0" in capsys.readouterr().err
    curves = pd.read_csv(tmp_path / "figs" / "acc_vs_steps_len64.csv")
    # gdn's curve is its other seed alone
    assert set(curves[curves["mixer"] == "gdn"]["n_seeds"]) == {1}
    assert set(curves[curves["mixer"] == "kda"]["n_seeds"]) == {2}


# ---- end to end: the fault-injection script's fast form ----


@pytest.mark.slow
def test_fault_injection_fast(tmp_path: Path) -> None:
    """A kill storm on a small sweep (a job SIGKILLed as by the OOM killer: the sweep records it failed,
    finishes the other job and exits 1; a job SIGTERMed; the sweep's own process SIGKILLed) and a corrupt
    summary in the sweep: nothing lost. (Two writers and bad files in analysis: the tests above.)"""
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "fault_injection.py"), "--fast", "--out",
                             str(tmp_path / "faults")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    report = result.stdout
    assert result.returncode == 0, report + result.stderr[-3000:]
    for case in ("kill storm", "corrupt summary in a sweep"):
        assert f"{case}: nothing lost" in report, report
    assert "kill storm: nothing lost (3 kills" in report


def test_a_sweep_job_whose_run_dir_is_in_use_changes_nothing(tmp_path: Path) -> None:
    """A re-launched sweep while a job of an old one still trains in a run directory (orphaned workers of
    a killed sweep): the local launcher takes the directory's lock before Hydra writes into it, so the job
    is refused without touching the directory, and the sweep names it and exits 1."""
    sweep_dir = tmp_path / "sweep"
    run_dir = sweep_dir / "mixer=attention" / "optim.lr=0.01" / "trainer.max_steps=5"
    holder = _hold_lock(run_dir)
    try:
        result = subprocess.run(
            [sys.executable, "train.py", "-m", "experiment=smoke", "mixer=attention", "optim.lr=0.01",
             "trainer.max_steps=5", "hydra/launcher=local", f"hydra.sweep.dir={sweep_dir}"],
            cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    said = result.stdout + result.stderr
    # refused, not failed: the process in the directory records its run (the same sweep launched twice)
    assert result.returncode == 0, said[-3000:]
    assert re.search(rf"job 0 refused: RunDirBusy: run directory \S+ is in use by pid {holder.pid} ", said)
    assert re.search(rf"refused +1: {run_dir.relative_to(sweep_dir)} \(RunDirBusy: run directory", said), said
    assert "failed" not in said and "another process is training them" in said
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # no .hydra/, no train.log
