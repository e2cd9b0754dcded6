"""What a run reports while it trains: its lines on the console and in train.log, and its W&B run.

The lines are the `train` logger's, the same in a terminal, a log file, a sweep's worker or a SLURM job
(no progress bar): a line per logged step (ProgressLog), once the projected wall time, and in a sweep every
line led by the run's name (name_log_lines), since parallel jobs share a console.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mixers.pattern import ratio, short_form

log = logging.getLogger("train")


# A run's wall time is projected this many steps after its first (which pays one-time costs: compiling,
# allocator warm-up), or once this many seconds have passed since it, whichever comes first.
PROJECT_AFTER_STEPS = 5
PROJECT_AFTER_S = 20.0
# A CPU run projected to take longer than this is sized for a GPU, and says so.
CPU_WARN_S = 3 * 3600.0


def format_duration(seconds: float) -> str:
    """42s, 3m 05s, 2h 07m, 3d 04h: two units are enough for an ETA."""
    seconds = max(0, round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _short_number(value: float) -> str:
    """980, 12.3k, 4.56M: a rate at a glance."""
    for divisor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= divisor:
            return f"{value / divisor:.3g}{suffix}"
    return f"{value:.3g}"


def _short_float(value: float) -> str:
    """1e-3, 5e-5, 1.5e-4, 1e4: a learning rate as a run name spells it."""
    mantissa, exponent = f"{value:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def run_name(task: str, mixer: str, seq_len: int, lr: float, seed: int, variant: str | None = None) -> str:
    """A run's short name in a sweep's log lines: mqar/kda/L1024/lr1e-3/s0 (mqar/kda:<variant>/... for a
    KDA ablation)."""
    mixer = f"{mixer}:{variant}" if variant else mixer
    return f"{task}/{mixer}/L{seq_len}/lr{_short_float(lr)}/s{seed}"


class _RunNamePrefix(logging.Filter):
    """Leads every line of the `train` logger with the run's name: a sweep's parallel jobs share a console."""

    def __init__(self, run: str) -> None:
        super().__init__()
        self.run = run

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = f"[{self.run}] {record.msg}"
        return True


def name_log_lines(run: str | None) -> None:
    """Prefix the log's lines with `run` from now on (None: no prefix); replaces an earlier run's prefix
    (the basic launcher runs a sweep's jobs one after another in one process)."""
    for old in [f for f in log.filters if isinstance(f, _RunNamePrefix)]:
        log.removeFilter(old)
    if run is not None:
        log.addFilter(_RunNamePrefix(run))


def format_acc(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"


class ProgressLog:
    """What a run says while it trains, the same in a terminal, a log file, a sweep's worker or a SLURM job.

    - A line per logged step (every trainer.log_every steps, the first, and every eval): step, loss,
      accuracy, steps/s and tokens/s over the training time since the previous line (evals excluded), the
      ETA (the remaining steps at the wall-clock pace since the first step, evals included), and on eval
      steps the eval results.
    - Once, a few steps in, the projected wall time; on a CPU, past CPU_WARN_S, a warning naming the GPU
      path and how to shrink the run instead.
    """

    def __init__(self, *, start_step: int, max_steps: int, batch_size: int, seq_len: int,
                 device: torch.device, train_time_s: float = 0.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.start_step, self.max_steps, self.seq_len = start_step, max_steps, seq_len
        self.tokens_per_step = batch_size * seq_len
        self.device, self.clock = device, clock
        self.started = clock()
        self.first_step_end: float | None = None
        self.projected = False
        self.last_step, self.last_train_time_s = start_step, train_time_s

    def seconds_per_step(self, step: int) -> float | None:
        """Wall-clock seconds a step since the segment's first; None until a second step is done."""
        if self.first_step_end is None or step <= self.start_step + 1:
            return None
        return (self.clock() - self.first_step_end) / (step - self.start_step - 1)

    def after_step(self, step: int, train_time_s: float, record: dict[str, Any]) -> None:
        """Called after every optimizer step with the run's training time so far and the step's metrics
        record (empty on steps that are not logged)."""
        if step == self.start_step + 1:
            self.first_step_end = self.clock()
        elif not self.projected and step < self.max_steps:
            since_first = self.clock() - (self.first_step_end or self.started)
            if step - self.start_step - 1 >= PROJECT_AFTER_STEPS or since_first >= PROJECT_AFTER_S:
                self.project(step)
        if record:
            self.line(step, train_time_s, record)

    def project(self, step: int) -> None:
        self.projected = True
        per_step = self.seconds_per_step(step)
        if per_step is None:
            return
        total = self.clock() - self.started + per_step * (self.max_steps - step)
        steps = self.max_steps - self.start_step
        log.info("projected wall time %s for %s steps (%.3g s/step on %s; evals add to it)",
                 format_duration(total), f"{steps:,}", per_step, self.device)
        if self.device.type == "cpu" and total > CPU_WARN_S:
            log.warning(
                "this run would take about %s on the CPU: it is sized for a GPU. Run it there "
                "(trainer.device=cuda; a sweep: hydra/launcher=joblib_gpu or hydra/launcher=slurm, see "
                "docs/sweeps.md), or shrink it for the CPU (trainer=default, a lower trainer.max_steps, "
                "trainer.batch_size or task.seq_len)", format_duration(total))

    def line(self, step: int, train_time_s: float, record: dict[str, Any]) -> None:
        parts = [f"step {step}/{self.max_steps}"]
        if "train/loss" in record:
            parts.append(f"loss {record['train/loss']:.4f} acc {format_acc(record.get('train/acc'))}")
        window = train_time_s - self.last_train_time_s
        if step > self.last_step and window > 0:
            rate = (step - self.last_step) / window
            parts.append(f"{rate:.3g} steps/s {_short_number(rate * self.tokens_per_step)} tok/s")
        per_step = self.seconds_per_step(step)
        if per_step is not None:
            parts.append(f"ETA {format_duration(per_step * (self.max_steps - step))}")
        if "eval/acc" in record:
            parts.append(f"eval acc {format_acc(record['eval/acc'])} "
                         f"seq_acc {format_acc(record.get('eval/seq_acc'))}")
            trained = f"eval/acc@{self.seq_len}"
            parts += [f"{key[len('eval/'):]} {format_acc(value)}" for key, value in record.items()
                      if key.startswith("eval/acc@") and key != trained]
        self.last_step, self.last_train_time_s = step, train_time_s
        log.info(" | ".join(parts))


def log_to_file(path: Path, level: int, message: str) -> None:
    """A record for the log file at `path` (attached by attach_log_file or Hydra) and no other handler."""
    target = str(path.resolve())
    record = log.makeRecord(log.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers + log.handlers:
        if isinstance(handler, logging.FileHandler) and handler.baseFilename == target:
            handler.handle(record)


def attach_log_file(path: Path) -> None:
    """Log to run_dir/train.log unless Hydra's job logging already does (its file is <job name>.log)."""
    log.setLevel(logging.INFO)
    target = str(path.resolve())
    for handler in logging.getLogger().handlers + log.handlers:
        if isinstance(handler, logging.FileHandler) and handler.baseFilename == target:
            return
    for handler in [h for h in log.handlers if isinstance(h, logging.FileHandler)]:
        log.removeHandler(handler)
        handler.close()
    handler = logging.FileHandler(target)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    log.addHandler(handler)


def start_wandb(cfg: DictConfig, run_dir: Path, meta: dict[str, Any], resume_id: str | None,
                sweep_dir: str | None) -> Any:
    """A W&B run (None when disabled), resuming the W&B run `resume_id` if given; wandb is imported only
    here, so disabled runs never need it."""
    wb = cfg.logger.wandb
    if wb.mode == "disabled":
        return None
    import wandb

    group = wb.group or (Path(sweep_dir).name if sweep_dir else None)
    tags = {*wb.tags, str(meta["task"]), str(meta["mixer"])}
    pattern = cfg.model.get("pattern")
    if pattern is not None:
        # a hybrid: its layers and its ratio, so that a dashboard can filter either (W&B: <= 64 characters)
        tags |= {f"pattern:{short_form(pattern)}"[:64], f"ratio:{ratio(pattern)}"[:64]}
    return wandb.init(
        project=wb.project, entity=wb.entity, group=group, mode=wb.mode.value, dir=str(run_dir),
        name=wb.name or f"{meta['task']}/{meta['mixer']}/{run_dir.name}",
        tags=sorted(tags),
        # Top-level copies of what dashboards group by; the mixer's yaml name is not in the config itself.
        config={"mixer_name": meta["mixer"], "task_name": meta["task"], "seq_len": meta["seq_len"],
                "lr": meta["lr"], **OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)},
        id=resume_id, resume="allow" if resume_id else None,
    )
