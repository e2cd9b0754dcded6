"""Training one run: `train` checks the launch, takes the run directory and records the outcome; `Trainer`
owns the built run and its progress and steps it to trainer.max_steps (docs/design.md §7).

Each step: the batch, forward and backward, the update; on logged steps a metrics record (and the eval on
eval steps); a checkpoint every trainer.checkpoint_every steps. A step or an eval that raises, or that
leaves the loss or the gradient norm non-finite, ends the run `diverged` when values went non-finite,
and re-raises otherwise (a real bug). An interrupt checkpoints the last finished step.
"""

from __future__ import annotations

import json
import logging
import math
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.caches import cache_counts, compiled_frames, graph_skips
from harness.check import Decision, Preflight, accept, preflight
from harness.data import Batch, make_batch, to_device
from harness.log import (
    ProgressLog,
    attach_log_file,
    format_acc,
    format_duration,
    log_to_file,
    name_log_lines,
    run_name,
    start_wandb,
)
from harness.run import Progress, Run, build_run, make_summary, run_meta, save_checkpoint
from harness.rundir import RunDir
from harness.signals import signals_held, sigterm_interrupts
from harness.step import clip_and_guard, evaluate_lengths, first_nonfinite, forward_backward
from mixers.pattern import pattern_name

log = logging.getLogger("train")


def train(cfg: DictConfig, run_dir: Path | str, *, mixer_name: str | None = None, job_num: int | None = None,
          sweep_dir: str | None = None, hydra_files: dict[str, str] | None = None) -> dict[str, Any]:
    """Train (or resume, extend, or leave alone if finished) the run in `run_dir`; returns its summary.

    Nothing is written before the launch is accepted: a `ConfigError` (harness.check.preflight: the config
    cannot train) and a `RunDirError` (another process writes into `run_dir`; the directory holds a run of
    another config, harness.check.accept) leave the directory as it was. Once accepted, `hydra_files`
    (Hydra's record of the config) go to `.hydra/`. On an exception the summary says `failed` with the
    error, the traceback goes to train.log, and the exception is re-raised (the caller decides whether a
    sweep goes on). An interrupt (KeyboardInterrupt, SystemExit, SIGTERM) checkpoints the last finished
    step, leaves status `incomplete` and is re-raised.
    """
    mixer_name = mixer_name or str(cfg.mixer.get("_target_", "mixer")).rsplit(".", 1)[-1]
    # a one-process sweep's previous job named the lines; this job's checks are not its
    name_log_lines(None)
    checked = preflight(cfg, job_num, mixer_name)
    rundir = RunDir(run_dir)
    with rundir.lock(), sigterm_interrupts():
        return _train(cfg, rundir, mixer_name, job_num, sweep_dir, checked, hydra_files)


def _train(cfg: DictConfig, rundir: RunDir, mixer_name: str, job_num: int | None, sweep_dir: str | None,
           checked: Preflight, hydra_files: dict[str, str] | None) -> dict[str, Any]:
    run_dir = rundir.path
    mixer_name = _model_name(cfg, mixer_name)
    meta = run_meta(cfg, run_dir, mixer_name)
    decision = accept(rundir, meta["config"], checked.precision)
    if decision.action == "skip":
        print(decision.message, flush=True)
        assert decision.previous is not None
        return decision.previous
    _take_directory(rundir, decision, hydra_files)
    meta["precision"] = checked.precision
    # In a sweep every line names its run: parallel jobs share one console.
    name_log_lines(run_name(cfg.task.name, mixer_name, cfg.task.seq_len, cfg.optim.lr, cfg.seed,
                            _ablation()) if sweep_dir is not None else None)
    progress = Progress()
    try:
        run = build_run(cfg, run_dir, meta, progress, job_num, decision)
        trainer = Trainer(run, progress, meta, sweep_dir)
        status = trainer.fit()
        meta.update(trainer.peaks.summary())
    except (KeyboardInterrupt, SystemExit) as interrupt:
        # Not a failure: analysis/collect.py counts `incomplete` runs as resumable, not broken.
        extra = {"error": f"{type(interrupt).__name__}: {interrupt}"}
        rundir.write_summary(make_summary("incomplete", progress, meta, extra))
        raise
    except BaseException as error:
        # The traceback once on the console: Hydra prints a single run's; a sweep's is in train.log.
        log_to_file(run_dir / "train.log", logging.ERROR, "run failed:\n" + traceback.format_exc())
        log.error("run failed: %s: %s (traceback in %s)", type(error).__name__, error, run_dir / "train.log")
        extra = {"error": f"{type(error).__name__}: {error}"}
        rundir.write_summary(make_summary("failed", progress, meta, extra))
        raise
    summary = make_summary(status, progress, meta, {})
    rundir.write_summary(summary)
    log.info("%s: %s after %d steps, final eval acc %s, best %s, %s", meta["mixer"], status, progress.step,
             format_acc(summary["final_eval_acc"]), format_acc(summary["best_eval_acc"]),
             format_duration(progress.wall_time_s))
    log.info("outputs: %s (%s)", run_dir.resolve(), ", ".join(rundir.existing()))
    return summary


def _take_directory(rundir: RunDir, decision: Decision, hydra_files: dict[str, str] | None) -> None:
    """The launch is accepted: from here on the directory records it (.hydra/, train.log), and train.log
    says what the relaunch found there."""
    if hydra_files:
        rundir.write_hydra(hydra_files)
    attach_log_file(rundir.log)
    if decision.summary_error is not None:
        # set aside (the run resumes from its checkpoint and writes a new summary), with a warning
        moved = rundir.set_aside_summary()
        resume = "resumes from checkpoint.pt" if rundir.checkpoint.exists() else "starts over (no checkpoint)"
        log.warning("%s: %s; moved to %s, the run %s and writes a new summary", rundir.summary,
                    decision.summary_error.reason, moved.name, resume)
    for note in decision.notes:
        log.warning("relaunch: %s", note)
    if decision.message:
        log.info("%s", decision.message)


def _model_name(cfg: DictConfig, mixer_name: str) -> str:
    """The run's `mixer` in its summary, tables and W&B: the mixer= choice, or a hybrid's pattern name
    (`kda:attention 3:1`, mixers/pattern.py)."""
    try:
        return pattern_name(cfg.model.get("pattern")) or mixer_name
    except ValueError:  # a malformed pattern: validate() makes it the run's error
        return mixer_name


def _ablation() -> str | None:
    """The KDA ablation variant (conf/experiment/ablation/) of the Hydra job, if any."""
    return HydraConfig.get().runtime.choices.get("experiment/ablation") if HydraConfig.initialized() else None


def graphs_after_a_skip(setting: Any) -> bool:
    """trainer.cuda_graphs once inductor has skipped the first step's graphs: `auto` goes on without them
    (false, as the summary must say); `true` asked for them, and the run fails with one line."""
    if setting is True:
        raise RuntimeError("trainer.cuda_graphs=true: inductor skipped the CUDA graphs of the first step "
                           "(its warning above says why), so the body ran kernel by kernel; set "
                           "trainer.cuda_graphs=auto to train without them where they cannot replay")
    return False


class PhasePeaks:
    """This launch's peak CUDA memory, split into the training steps' and the evals' (a no-grad forward over
    longer sequences can outgrow the step). Each switch of phase reads the allocator's peak since the last
    one into the phase that ran and resets it; `_placement` reset it before the first step. No-op off CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peaks = {"train": 0, "eval": 0}

    def ended(self, phase: str) -> None:
        """`phase` ran since the last call (or since the run's start): count its peak, start a new one."""
        if self.device.type == "cuda":
            self.peaks[phase] = max(self.peaks[phase], torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)

    def summary(self) -> dict[str, float]:
        """peak_memory_gib (the whole launch's) and the two phases' (an eval that never ran: 0.0); nothing off
        CUDA."""
        if self.device.type != "cuda":
            return {}
        self.ended("train")
        gib = {phase: round(peak / 2**30, 2) for phase, peak in self.peaks.items()}
        return {"peak_memory_gib": max(gib.values()), "train_peak_memory_gib": gib["train"],
                "eval_peak_memory_gib": gib["eval"]}


class Trainer:
    """One launch's training loop: owns the built run and its progress, and what the progress goes to
    (metrics.jsonl, the console, W&B, checkpoint.pt)."""

    def __init__(self, run: Run, progress: Progress, meta: dict[str, Any], sweep_dir: str | None) -> None:
        self.run, self.progress, self.meta = run, progress, meta
        self.trainer = run.cfg.trainer
        # The step the checkpoint on disk holds (None: no checkpoint yet), for what an interrupt says.
        self.saved = progress.step if run.rundir.checkpoint.exists() else None
        self.wandb = start_wandb(run.cfg, run.rundir.path, meta, progress.wandb_id, sweep_dir)
        if self.wandb is not None:
            progress.wandb_id = self.wandb.id
        self.segment_start, self.wall_before = time.perf_counter(), progress.wall_time_s
        # True while model, optimizer and scheduler hold exactly the state after `progress.step` steps.
        self.at_step_boundary = True
        # the first step whose loss or gradient norm was not finite, on the device (0: none)
        self.bad_step = torch.zeros((), dtype=torch.long, device=run.device)
        self.progress_log = ProgressLog(
            start_step=progress.step, max_steps=self.trainer.max_steps, batch_size=self.trainer.batch_size,
            seq_len=run.cfg.task.seq_len, device=run.device, train_time_s=progress.train_time_s)
        self.metrics: IO[str] | None = None
        # the compile caches' counts before this launch's first step, to say in the summary what it found
        self.cache_counts_before = cache_counts() if meta.get("compile") else None
        self.frames_before = compiled_frames()
        self.skips_before = graph_skips()
        self.peaks = PhasePeaks(run.device)

    def fit(self) -> str:
        """Train from `progress.step` on; returns the status (completed | diverged). An interrupt saves the
        last finished step's checkpoint and is re-raised."""
        try:
            with open(self.run.rundir.metrics, "a") as self.metrics:
                status = self._steps()
        except (KeyboardInterrupt, SystemExit) as interrupt:
            self._interrupted(interrupt)
            raise
        except BaseException:
            if self.wandb is not None:
                self.wandb.finish(exit_code=1)
            raise
        self.progress.wall_time_s = self._wall_time()
        self._finish_wandb(status)
        return status

    def _steps(self) -> str:
        for step in range(self.progress.step + 1, self.trainer.max_steps + 1):
            status = self._step(step)
            if status is not None:
                return status
        return "completed"

    def _step(self, step: int) -> str | None:
        """One step and its bookkeeping; the status if the run ends here."""
        trainer = self.trainer
        step_start = time.perf_counter()
        is_eval = step % trainer.eval_every == 0 or step == trainer.max_steps
        is_log = is_eval or step % trainer.log_every == 0 or step == 1
        # The host reads values back from the GPU only on logged, evaluated and checkpointed steps (a read
        # waits for the queue to drain); on the CPU reading costs nothing, so every step.
        host_check = is_log or step % trainer.checkpoint_every == 0 or self.run.device.type != "cuda"
        lr = self.run.scheduler.get_last_lr()[0]
        result = train_step(self.run, step, host_check, self.bad_step)
        self.bad_step = result.bad_step
        if result.divergence is not None:
            return self._diverged(result.divergence)
        self._update(step, step_start, host_check, result.batch)
        record, divergence = self._record(step, lr, result, is_log, is_eval)
        if divergence is not None:
            return self._diverged(divergence)
        if record:
            record = self._write(step, record)
        stop = self.progress.early_stopped_at == step
        if step % trainer.checkpoint_every == 0 or step == trainer.max_steps or stop:
            self._checkpoint()
        self.at_step_boundary = True
        self.progress_log.after_step(step, self.progress.train_time_s, record)
        if stop:
            log.info("early stop at step %d: eval acc >= %g for %d evaluations in a row", step,
                     trainer.early_stop.acc, trainer.early_stop.evals)
            return "completed"
        return None

    def _update(self, step: int, step_start: float, host_check: bool, batch: Batch) -> None:
        """Apply the step's update and count it in the progress."""
        # From the update until the step's bookkeeping is done, the weights are ahead of `progress`: an
        # interrupt there must not checkpoint them.
        self.at_step_boundary = False
        self.run.optimizer.step()
        self.run.scheduler.step()
        if host_check and self.run.device.type == "cuda":
            torch.cuda.synchronize(self.run.device)  # so that train_time_s counts the GPU's time
        progress = self.progress
        progress.step = step
        progress.train_time_s += time.perf_counter() - step_start
        # this launch's first step pays the one-time costs (compiling): the summary shows them
        if "first_step_s" not in self.meta:
            self.meta["first_step_s"] = round(time.perf_counter() - step_start, 3)
            if self.cache_counts_before is not None:
                before = self.cache_counts_before
                self.meta["first_step_cache_counts"] = {k: n - before[k] for k, n in cache_counts().items()}
                if compiled_frames() == self.frames_before:
                    # the summary would say `compile: true` of an eager run
                    raise RuntimeError("trainer.compile: the first step compiled nothing, so the body ran "
                                       "eager (torch's warnings above say why: a recompile limit, or code it "
                                       "cannot trace); set trainer.compile=false to train eager on purpose")
            if self.meta.get("cuda_graphs") and graph_skips() > self.skips_before:
                # the summary would say `cuda_graphs: true` of a run stepping kernel by kernel
                self.meta["cuda_graphs"] = graphs_after_a_skip(self.run.cfg.trainer.cuda_graphs)
                log.warning("trainer.cuda_graphs=auto: inductor skipped the CUDA graphs (its warning above "
                            "says why); this run steps kernel by kernel, and its summary says "
                            "cuda_graphs: false")
        progress.train_tokens += batch.inputs.numel()
        progress.wall_time_s = self._wall_time()

    def _record(self, step: int, lr: float, result: StepResult, is_log: bool,
                is_eval: bool) -> tuple[dict[str, Any], str | None]:
        """The step's metrics (empty on a step that is not logged), the eval's on eval steps; and a
        divergence the eval found."""
        record: dict[str, Any] = {}
        if is_log:
            record = {"train/loss": result.loss, "train/acc": result.acc, "lr": lr}
            self.progress.best_train_acc = max(self.progress.best_train_acc or 0.0, result.acc)
        if is_eval:
            self.peaks.ended("train")
            evals, divergence = eval_step(self.run, step, lr, self.progress, result.batch)
            self.peaks.ended("eval")
            if divergence is not None:
                return record, divergence
            record.update(evals)
        return record, None

    def _write(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        """Append the record, with its step and wall time, to metrics.jsonl (and W&B); returns it so."""
        assert self.metrics is not None
        self.progress.wall_time_s = self._wall_time()
        record = {"step": step, **record, "time_s": round(self.progress.wall_time_s, 3)}
        self.metrics.write(json.dumps(record) + "\n")
        self.metrics.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if k != "step"}, step=step)
        return record

    def _checkpoint(self) -> None:
        # an interrupt between the file and `saved` would record the older step as the checkpoint's
        with signals_held():
            save_checkpoint(self.run, self.progress, self.meta)
            self.saved = self.progress.step

    def _diverged(self, divergence: str) -> str:
        self.meta["error"] = divergence
        log.error("diverged: %s", divergence)
        return "diverged"

    def _wall_time(self) -> float:
        """The run's wall time: the earlier launches', and this one's so far."""
        return self.wall_before + time.perf_counter() - self.segment_start

    def _interrupted(self, interrupt: BaseException) -> None:
        """Stopped from outside (Ctrl-C; submitit exits with SystemExit after SLURM's SIGUSR2 and requeues
        the job): keep every finished step, so that re-launching resumes exactly here."""
        try:
            if self.at_step_boundary:
                self._checkpoint()
                log.warning("interrupted (%s) after step %d: checkpoint saved, re-launch to resume",
                            type(interrupt).__name__, self.progress.step)
            else:
                saved = self.saved
                resume = (f"re-launching resumes from the checkpoint of step {saved}" if saved is not None
                          else "no checkpoint was saved yet: re-launching starts again from step 0")
                log.warning("interrupted (%s) inside step %d: %s", type(interrupt).__name__,
                            self.progress.step, resume)
        finally:
            # an interrupt inside a step leaves `steps` one step or more past what the checkpoint keeps; a
            # second Ctrl-C, held through the checkpoint above, is raised as it ends
            self.meta["checkpoint_step"] = self.saved
        if self.wandb is not None:
            self.wandb.summary["status"] = "incomplete"
            self.wandb.finish(exit_code=1)

    def _finish_wandb(self, status: str) -> None:
        if self.wandb is None:
            return
        final = make_summary(status, self.progress, self.meta, {})
        # Commit the last step's history row first: committed later, it would overwrite the summary keys
        # that are also metrics (`lr`: the configured rate, not the last scheduled one).
        self.wandb.log({}, commit=True)
        self.wandb.summary.update({k: v for k, v in final.items() if k != "config"})
        self.wandb.finish(exit_code=0 if status == "completed" else 1)


@dataclass
class StepResult:
    batch: Batch
    bad_step: torch.Tensor  # the first non-finite step since the last host check, on the device (0: none)
    divergence: str | None = None
    loss: float | None = None  # read back on host-check steps only
    acc: float | None = None


def train_step(run: Run, step: int, host_check: bool, bad_step: torch.Tensor) -> StepResult:
    """One step's batch, forward and backward, clipped gradients and the update armed; nothing is applied
    (the caller steps the optimizer). The host reads values back only when `host_check`."""
    index = run.sampler.indices(step - 1)
    batch = make_batch(run.inputs[to_device(index, run.device)], run.labels[index], run.device)
    lr = run.scheduler.get_last_lr()[0]
    try:
        loss, hits = forward_backward(run.model, run.features, batch, run.optimizer, run.autocast, host_check)
    except Exception as error:
        divergence = _divergence(run, batch.inputs, error, f"at step {step} (lr {lr:.3g})")
        return StepResult(batch, bad_step, divergence)
    grad_norm, finite = clip_and_guard(run.params, run.cfg.optim.grad_clip, loss, run.optimizer)
    bad_step = torch.where(finite | (bad_step > 0), bad_step, step)
    result = StepResult(batch, bad_step)
    if host_check:
        loss_value, grad_value, first_bad, correct = torch.stack(
            [loss.float(), grad_norm.float(), bad_step.float(), hits.sum().float()]).tolist()
        result.loss, result.acc = loss_value, correct / batch.num_scored
        if first_bad and first_bad < step:
            result.divergence = (f"loss or gradient norm became non-finite at step {int(first_bad)} "
                                 f"(its update skipped; found at step {step}, lr {lr:.3g})")
        elif not (math.isfinite(loss_value) and math.isfinite(grad_value)):
            what = "loss" if not math.isfinite(loss_value) else "gradient norm"
            result.divergence = f"{what} became non-finite at step {step} (lr {lr:.3g})"
    return result


def eval_step(run: Run, step: int, lr: float, progress: Progress,
              batch: Batch) -> tuple[dict[str, float], str | None]:
    """Evaluate at every length and update `progress`'s bests, threshold and early-stop count; returns
    (the eval metrics, a divergence if the step's update made the weights unusable)."""
    trainer = run.cfg.trainer
    try:
        evals = evaluate_lengths(run.model, run.eval_sets, run.cfg.task.seq_len, trainer.eval_batch_size,
                                 run.device, run.autocast, run.features)
    except Exception as error:
        return {}, _divergence(run, batch.inputs, error, f"after step {step} (lr {lr:.3g})")
    progress.last_eval = evals
    progress.best_eval_acc = max(progress.best_eval_acc or 0.0, evals["eval/acc"])
    if progress.steps_to_threshold is None and evals["eval/acc"] >= trainer.acc_threshold:
        progress.steps_to_threshold = step
    progress.evals_above = progress.evals_above + 1 if evals["eval/acc"] >= trainer.early_stop.acc else 0
    if trainer.early_stop.enabled and progress.evals_above >= trainer.early_stop.evals:
        progress.early_stopped_at = step
    return evals, None


def _divergence(run: Run, inputs: torch.Tensor, error: Exception, when: str) -> str:
    """The one test of what an exception in a step or an eval means (see first_nonfinite): the divergence
    it reveals, or, where nothing is non-finite, the exception re-raised (a real bug)."""
    where = first_nonfinite(run.model, inputs, run.autocast)
    if where is None:
        raise error
    return f"{where} became non-finite {when}, and then {type(error).__name__}: {error}"
