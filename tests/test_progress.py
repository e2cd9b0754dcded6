"""What a run tells its user: progress lines without a terminal, the projected wall time, run names in
sweeps, and the messages of train.py (final accuracy, interrupts, failures, misspelt mixer keys, --help)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import CLI_TINY
from omegaconf import DictConfig

from harness.log import ProgressLog, format_duration, run_name
from harness.trainer import train

ROOT = Path(__file__).resolve().parents[1]
MakeCfg = Callable[..., DictConfig]


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "train"]


def test_a_line_every_log_every_steps_without_a_terminal(
    make_cfg: MakeCfg, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # pytest's captured stderr is no TTY, like a log file, nohup, joblib's workers or a SLURM job.
    cfg = make_cfg("trainer.max_steps=20", "trainer.log_every=5", "trainer.eval_every=10",
                   "task.eval_seq_lens=[32]")
    with caplog.at_level(logging.INFO, logger="train"):
        train(cfg, tmp_path, mixer_name="attention")
    lines = [m for m in _messages(caplog) if m.startswith("step ")]
    assert [int(re.match(r"step (\d+)/20 ", m).group(1)) for m in lines] == [1, 5, 10, 15, 20]
    pattern = (r"step \d+/20 \| loss \d+\.\d{4} acc \d\.\d{4} \| [\d.]+ steps/s [\d.]+k? tok/s"
               r" \| ETA \d+s")
    for line in lines[1:]:
        assert re.match(pattern, line), line
    evals = [m for m in lines if "eval acc" in m]
    assert len(evals) == 2 and all(re.search(r"eval acc \d\.\d{4} seq_acc \d\.\d{4} \| acc@32 \d\.\d{4}$", m)
                                   for m in evals)
    # Exactly one projection, after the first steps (the first pays one-time costs, so it is not timed).
    projections = [m for m in _messages(caplog) if m.startswith("projected wall time")]
    assert len(projections) == 1 and re.match(r"projected wall time \d+s for 20 steps \(", projections[0])
    assert not [m for m in _messages(caplog) if "sized for a GPU" in m]  # a short run: no warning
    # The final line: accuracies with four digits, not Python's float repr.
    final = [m for m in _messages(caplog) if "completed after" in m][0]
    assert re.search(r"final eval acc \d\.\d{4}, best \d\.\d{4}, \d+s$", final), final


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _simulate(device: str, seconds_per_step: float, max_steps: int, steps: int,
              caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    clock = FakeClock()
    progress = ProgressLog(start_step=0, max_steps=max_steps, batch_size=256, seq_len=1024,
                                  device=torch.device(device), clock=clock)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="train"):
        for step in range(1, steps + 1):
            # the first step pays one-time costs (compilation); the pace is measured from its end
            clock.now += seconds_per_step * (10 if step == 1 else 1)
            progress.after_step(step, train_time_s=clock.now, record={})
    return [r for r in caplog.records if r.name == "train"]


def test_a_run_sized_for_a_gpu_says_so_early_on_a_cpu(caplog: pytest.LogCaptureFixture) -> None:
    # trainer=paper on a CPU: ~50 s a step, 20,000 steps. Two steps are enough when each takes that long.
    records = _simulate("cpu", 50.0, 20_000, 2, caplog)
    assert [r.levelno for r in records] == [logging.INFO, logging.WARNING]
    projection, warning = (r.getMessage() for r in records)
    # 500 s for the first step + 50 s + 19,998 more steps at 50 s = 11d 13h
    assert projection.startswith("projected wall time 11d 13h for 20,000 steps (50 s/step on cpu")
    assert "11d 13h on the CPU" in warning
    for hint in ("trainer.device=cuda", "hydra/launcher=joblib_gpu", "hydra/launcher=slurm",
                 "trainer=default"):
        assert hint in warning
    # Fast steps: the projection comes after five timed steps, and a short run is not warned about.
    records = _simulate("cpu", 0.01, 200, 10, caplog)
    assert len(records) == 1 and records[0].getMessage().startswith("projected wall time 2s for 200 steps")
    # The same long run on a GPU: projected, not warned about.
    records = _simulate("cuda", 50.0, 20_000, 3, caplog)
    assert [r.levelno for r in records] == [logging.INFO]


def test_progress_line_rates_and_eta(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    progress = ProgressLog(start_step=100, max_steps=300, batch_size=4, seq_len=250,
                                  device=torch.device("cpu"), train_time_s=7.0, clock=clock)
    clock.now = 1.0
    with caplog.at_level(logging.INFO, logger="train"):
        progress.after_step(101, 7.5, {})
        # 100 steps in 50 s of training time since the last line: 2 steps/s; 99 steps in 99 s of wall time
        # (evals included) since the first one's end: 1 s a step for the ETA's 100 steps left.
        clock.now = 100.0
        progress.after_step(200, 57.0, {"train/loss": 1.23456, "train/acc": 0.5, "eval/acc": 0.25,
                                        "eval/seq_acc": 0.0, "eval/acc@250": 0.25, "eval/acc@500": 0.125})
    line = [m for m in _messages(caplog) if m.startswith("step ")][0]
    assert line == ("step 200/300 | loss 1.2346 acc 0.5000 | 2 steps/s 2k tok/s | ETA 1m 40s"
                    " | eval acc 0.2500 seq_acc 0.0000 | acc@500 0.1250")


def test_format_helpers() -> None:
    assert [format_duration(s) for s in (0.4, 42, 185, 7620, 3 * 86400 + 4 * 3600 + 59)] == [
        "0s", "42s", "3m 05s", "2h 07m", "3d 04h"]
    assert run_name("mqar", "kda", 1024, 1e-3, 0) == "mqar/kda/L1024/lr1e-3/s0"
    ablation = run_name("stack", "kda", 256, 1.5e-4, 2, "gate_softplus")
    assert ablation == "stack/kda:gate_softplus/L256/lr1.5e-4/s2"
    assert run_name("mqar", "attention", 32, 1e4, 1) == "mqar/attention/L32/lr1e4/s1"


def test_sweep_lines_carry_the_run_name(make_cfg: MakeCfg, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    cfg = make_cfg("trainer.max_steps=4", "trainer.log_every=2", "optim.lr=3e-3", "seed=1")
    with caplog.at_level(logging.INFO, logger="train"):
        train(cfg, tmp_path / "job", mixer_name="attention", job_num=0, sweep_dir=str(tmp_path))
    messages = _messages(caplog)
    name = f"[stand_in/attention/L{cfg.task.seq_len}/lr3e-3/s1] "
    assert len(messages) > 5 and all(m.startswith(name) for m in messages), messages
    assert all(line.split(" - ", 1)[1].startswith(name)
               for line in (tmp_path / "job" / "train.log").read_text().splitlines() if " - " in line)
    # A single run after it (the basic launcher reuses the process): no stale name.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="train"):
        train(make_cfg("trainer.max_steps=2"), tmp_path / "single", mixer_name="attention")
    assert _messages(caplog) and not any(m.startswith("[") for m in _messages(caplog))


@pytest.mark.parametrize("checkpoint_every", [100, 10])
def test_an_interrupt_says_where_a_relaunch_resumes(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    checkpoint_every: int,
) -> None:
    cfg = make_cfg("trainer.max_steps=30", f"trainer.checkpoint_every={checkpoint_every}")
    adamw_step, calls = torch.optim.AdamW.step, []

    def interrupt_after_update_15(self: torch.optim.AdamW, *args: object, **kwargs: object) -> object:
        result = adamw_step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 15:
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", interrupt_after_update_15)
    with caplog.at_level(logging.WARNING, logger="train"), pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path, mixer_name="attention")
    warning = [m for m in _messages(caplog) if m.startswith("interrupted")][0]
    if checkpoint_every == 100:
        assert warning.endswith("no checkpoint was saved yet: re-launching starts again from step 0")
        assert not (tmp_path / "checkpoint.pt").exists()
    else:
        assert warning.endswith("re-launching resumes from the checkpoint of step 10")
        assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["progress"]["step"] == 10


def test_misspelt_mixer_key_without_plus_lists_the_valid_keys(make_cfg: MakeCfg, tmp_path: Path) -> None:
    # Without `+`: composed (the mixer group is open), then rejected by the check against the constructor.
    cfg = make_cfg("mixer.num_head=4")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['num_head'\]; it accepts \[.*'num_heads"):
        train(cfg, tmp_path, mixer_name="attention")


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "train.py", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_failing_run_prints_its_traceback_once(tmp_path: Path) -> None:
    """A single run that fails once training has started (here on an unreadable checkpoint) exits non-zero,
    is recorded `failed`, and its traceback is printed once (Hydra's, on stderr) and written once to
    train.log."""
    run_dir = tmp_path / "single"
    run_dir.mkdir()
    (run_dir / "checkpoint.pt").write_bytes(b"not a checkpoint")
    single = _cli(*CLI_TINY, "trainer.max_steps=2", f"hydra.run.dir={run_dir}")
    output = single.stdout + single.stderr
    assert single.returncode != 0 and output.count("Traceback (most recent call last)") == 1, output
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert "run failed: FileUnreadable: " in output and "checkpoint.pt: cannot be read" in output
    log = (run_dir / "train.log").read_text()
    assert log.count("Traceback (most recent call last)") == 1 and "checkpoint.pt: cannot be read" in log


def test_a_config_error_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """A config error found before training prints one line and leaves no run directory; its traceback
    comes with HYDRA_FULL_ERROR=1 only."""
    for full in ("0", "1"):
        run_dir = tmp_path / full
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HYDRA_FULL_ERROR": full}
        bad = subprocess.run([sys.executable, "train.py", *CLI_TINY, "mixer.head_dimm=8",
                              f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
        assert bad.returncode == 1 and not run_dir.exists()
        last = bad.stderr.strip().splitlines()[-1]
        assert last.startswith("config error: mixer 'attention'") and "['head_dimm']" in last
        assert bad.stderr.count("Traceback (most recent call last)") == (full == "1"), bad.stderr


def test_help_lists_the_launchers() -> None:
    result = _cli("--help")
    assert result.returncode == 0
    launchers = result.stdout.split("== Launchers", 1)[1].split("==", 2)[1]
    names = {p.stem for p in (ROOT / "conf" / "hydra" / "launcher").glob("*.yaml")}
    names |= {"basic", "joblib", "submitit_local"}
    listed = {line.split()[0] for line in launchers.splitlines() if line and not line.startswith(" ")}
    assert names <= listed, (names, listed)
    # a CPU sweep's command in the header, the details' place in the footer
    assert "-m experiment=smoke hydra/launcher=local" in result.stdout and "docs/sweeps.md" in result.stdout
