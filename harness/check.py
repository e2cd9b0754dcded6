"""What a launch is checked against before anything is written: its config (`preflight`), and what its run
directory already holds (`accept`).

    preflight   the config's values, the task's generator at every length, the mixer's switches (one
                layer built) and the device: a `ConfigError` naming the
                value and the fix, before the run directory is even made
    accept      a relaunch against the run directory's finished run or checkpoint, compared by what the run
                computes (harness.config.compare): nothing to do, resume, extend (trainer.max_steps
                raised), or `ResumeRefused` listing the keys old -> new; nothing is written either way
"""

from __future__ import annotations

import os
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from harness.config import EXTENDABLE, compare, effective_precision, validate
from harness.data import load_task
from harness.rundir import FINISHED, FileUnreadable, ResumeRefused, RunDir

# the GPU (an index among the visible ones) that hydra/launcher=local gave a job: trainer.device=auto takes it
GPU_ENV = "KDA_HARNESS_GPU"


class ConfigError(ValueError):
    """A config that cannot train, found before anything was written (the message names the value and the
    fix)."""


def one_line_error(error: ConfigError) -> str:
    """The console's line for a config error; its traceback too with HYDRA_FULL_ERROR=1."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        traceback.print_exception(error.__cause__ or error)
    return f"config error: {error}"


def resolve_device(spec: str, job_num: int | None = None) -> torch.device:
    """trainer.device -> a torch.device; `auto`: the GPU the local launcher gave the job (GPU_ENV: the
    least busy one when it started), else multirun jobs round-robin by number over the visible GPUs."""
    if spec == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        given = os.environ.get(GPU_ENV, "")
        index = int(given) if given.isdigit() else (job_num or 0)
        return torch.device("cuda", index % torch.cuda.device_count())
    if spec != "cpu" and not re.fullmatch(r"cuda(:\d+)?", spec):
        raise ValueError(f"trainer.device={spec!r}: choose auto, cpu, cuda or cuda:N")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={spec!r} but CUDA is not available: use trainer.device=cpu or auto")
    device = torch.device(spec)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"trainer.device={spec!r} but only {torch.cuda.device_count()} GPU(s) are visible")
    if device.type == "cuda" and device.index is None:
        # `cuda` is the current GPU: torch.cuda.set_device and the logs need its index
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _check_single_run_of_a_grid() -> None:
    """An experiment's grid (hydra.sweeper.params) is swept with -m only: launched without it, the run
    trains one point that no value of the command line chose (the yaml's value of every swept key)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.RUN:
        return
    hydra_cfg = HydraConfig.get()
    given = {line.lstrip("+~").split("=", 1)[0] for line in hydra_cfg.overrides.task}
    swept = [str(key) for key, values in (hydra_cfg.sweeper.get("params") or {}).items()
             if ("," in str(values) or re.fullmatch(r"\w+\(.*\)", str(values))) and key not in given]
    if swept:
        choice, pick = hydra_cfg.runtime.choices.get("experiment"), " ".join(f"{key}=..." for key in swept)
        raise ValueError(f"experiment={choice} sweeps {', '.join(swept)} (its hydra.sweeper.params), but "
                         "this is a single run: without -m it trains one run at the yaml's values of them; "
                         f"add -m to run the grid, or give {pick} to train one cell")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a SLURM allocation or `taskset` narrows it),
    where os.cpu_count() counts every core of the machine."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform (macOS)
        return os.cpu_count() or 1


def _check_threads(threads: int | None) -> None:
    """More torch threads than this process may use cores spin against each other: a run many times slower
    (60x here for 1000 threads on 2 cores)."""
    cores = usable_cores()
    if threads is not None and threads > cores:
        raise ValueError(f"trainer.cpu_threads={threads}: this machine gives the run {cores} CPU core(s), "
                         "and more threads than cores train many times slower; give "
                         f"trainer.cpu_threads<={cores} (or null: one per core)")


def _memory_bytes() -> int | None:
    """The memory this process may use: the machine's, or its cgroup's limit where that is lower."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def _check_data_size(task: DictConfig) -> None:
    """The data is generated whole before the first step (inputs and labels, int64): a set larger than the
    machine's memory would be killed or fail there, after the run directory was taken."""
    tokens = task.num_train * task.seq_len + task.num_eval * sum(dict.fromkeys([task.seq_len,
                                                                                *(task.eval_seq_lens or [])]))
    need, memory = 16 * tokens, _memory_bytes()
    if memory is not None and need > memory:
        raise ValueError(f"task.num_train={task.num_train}, task.num_eval={task.num_eval} at task.seq_len="
                         f"{task.seq_len}: the data set takes {need / 2**30:.1f} GiB (int64 inputs and "
                         "labels, generated before the first step), more than this machine's "
                         f"{memory / 2**30:.1f} GiB; lower task.num_train (batches repeat it epoch by "
                         "epoch), task.num_eval or the lengths")


def _check_wandb(mode: Any) -> None:
    """logger.wandb: the package for offline and online, and for online a W&B login; without one
    wandb.init stops the run after its directory was taken (or waits at a prompt in a sweep's worker)."""
    mode = str(getattr(mode, "value", mode))
    if mode == "disabled":
        return
    try:
        import wandb
    except ImportError:
        raise ValueError(f"logger.wandb.mode={mode}: the wandb package is not installed; pip install wandb, "
                         "or logger=default (W&B off)") from None
    # a key where wandb looks first: asked no further (wandb.login then waits seconds on the network)
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    if mode != "online" or os.environ.get("WANDB_API_KEY") or netrc.is_file():
        return
    try:
        # finds any other login wandb knows, prompts on a terminal, raises without either
        wandb.login(verify=False)
    except wandb.errors.Error as error:
        raise ValueError(f"logger.wandb.mode=online: no W&B login ({error}); run `wandb login` or set "
                         "WANDB_API_KEY, or log offline with logger.wandb.mode=offline (wandb sync later)") \
            from None


@dataclass
class Preflight:
    """What the checks found: where the run computes, and at which precision."""

    device: torch.device
    precision: str  # bf16 | fp32


def preflight(cfg: DictConfig, job_num: int | None = None, mixer_name: str | None = None) -> Preflight:
    """Every check that needs no training: `ConfigError` (one line: the value and the fix) if the config
    cannot train. Writes nothing."""
    from mixers.model import build_mixer
    from mixers.pattern import expand, mixer_configs

    try:
        validate(cfg)
        task = cfg.task
        # the task's name is a module of tasks/ and a level of the single run's directory
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(task.name)):
            raise ValueError(f"task.name={task.name!r}: not a task; use the name of a module in tasks/ "
                             "(e.g. task=mqar)")
        _check_single_run_of_a_grid()
        device = resolve_device(cfg.trainer.device, job_num)
        _check_threads(cfg.trainer.cpu_threads)
        _check_data_size(task)
        generate, vocab_size = load_task(task)
        # one sequence at every length the run generates: a length too short for the task's params fails
        # here, in milliseconds, instead of after the data of the other lengths was drawn
        for length in dict.fromkeys([task.seq_len, *(task.eval_seq_lens or [])]):
            generate(1, int(length), seed=cfg.seed)
        # one layer of each mixer kind checks its switches (a whole model adds nothing to check, only time)
        pattern = cfg.model.get("pattern")
        configs = mixer_configs(cfg.mixer, pattern)
        kinds = ({mixer_name: configs} if pattern is None
                 else {name: configs[name] for name in expand(pattern)})
        for name, mixer_cfg in kinds.items():
            layer = build_mixer(mixer_cfg, cfg.model.d_model, layer_idx=0, name=name)
            try:
                layer.check_device(device)
            except ValueError as error:
                raise ValueError(f"mixer {name!r}: {error}") from error
        _check_wandb(cfg.logger.wandb.mode)
    except ValueError as error:
        raise ConfigError(str(error)) from error
    return Preflight(device=device, precision=effective_precision(cfg.trainer.precision, device.type))


@dataclass
class Decision:
    """What a launch does in its run directory."""

    action: str  # new | resume | extend | skip
    message: str | None = None  # for skip and extend: what the console and train.log say
    state: dict[str, Any] | None = None  # the checkpoint, loaded (resume, extend)
    state_error: FileUnreadable | None = None  # a checkpoint that cannot be read (the run fails on it)
    changes: list[dict[str, Any]] = field(default_factory=list)  # config_changes, applied from the resume
    previous: dict[str, Any] | None = None  # the summary found
    summary_error: FileUnreadable | None = None  # an unreadable summary.json (set aside once accepted)
    notes: list[str] = field(default_factory=list)  # warnings for train.log once accepted


def _refuse(where: str, what: str, listed: str) -> ResumeRefused:
    return ResumeRefused(
        f"relaunch refused: {where} holds {what} of another config ({listed}); the directory would record "
        "one config and hold the numbers of the other. Launch with its values to keep it; give the new "
        "config its own directory (hydra.run.dir=..., another sweep dir, or an override that names it); or, "
        "to train it again from step 0, delete its checkpoint.pt, metrics.jsonl and summary.json")


def _fmt(value: Any) -> str:
    return "none" if value is None else f"{value:.4f}"


def accept(rundir: RunDir, config: dict[str, Any], precision: str) -> Decision:
    """Compare this launch (its flattened resolved `config`, at `precision`) with what `rundir` holds, by
    what the run computes; `ResumeRefused` (nothing written) when they differ in more than a raised
    trainer.max_steps."""
    summary_error = None
    try:
        previous = rundir.read_summary()
    except FileUnreadable as error:
        previous, summary_error = None, error
    if previous is not None and previous.get("status") in FINISHED:
        return _accept_finished(rundir, previous, config, precision)
    try:
        state = rundir.load_checkpoint("cpu")
    except FileUnreadable as error:
        # the run fails on it once accepted, naming the file and the fix (as a resume always did)
        return Decision("resume", state_error=error, previous=previous, summary_error=summary_error)
    if state is None:
        return Decision("new", previous=previous, summary_error=summary_error)
    step = int(state["progress"].get("step", 0))
    comparison = compare(state["config"], config, state.get("precision"), precision)
    if comparison.computed and not comparison.extends():
        raise _refuse(f"{rundir.checkpoint} (step {step})", "the checkpoint of a run",
                      comparison.listed(comparison.computed))
    return Decision("resume", state=state, changes=comparison.records(step), previous=previous,
                    summary_error=summary_error, notes=_unknown(comparison.unknown))


def _unknown(keys: list[str]) -> list[str]:
    return [f"the recorded config and this launch's differ in having {key} (another version of train.py); "
            "taken as unchanged" for key in keys]


def _accept_finished(rundir: RunDir, previous: dict[str, Any], config: dict[str, Any],
                     precision: str) -> Decision:
    status, steps = previous["status"], previous.get("steps")
    done = f"{rundir.path}: already {status} (final eval acc {_fmt(previous.get('final_eval_acc'))})"
    recorded = previous.get("config")
    if not isinstance(recorded, dict):
        raise ResumeRefused(f"relaunch refused: {rundir.summary} records no config to compare this launch "
                            "with; delete summary.json to train the run again (it resumes from checkpoint.pt "
                            "if the checkpoint's config is this launch's)")
    comparison = compare(recorded, config, previous.get("precision"), precision)
    if not comparison.computed:
        also = (f"; it differs from this launch only in where and how fast it runs "
                f"({comparison.listed(comparison.run_only)})" if comparison.run_only else "")
        return Decision("skip", message=f"{done}; nothing to do{also}. Delete summary.json to train it "
                                        "again.", previous=previous)
    if not comparison.extends():
        raise _refuse(str(rundir.path), f"a {status} run", comparison.listed(comparison.computed))
    old_max, new_max = comparison.old[EXTENDABLE], comparison.new[EXTENDABLE]
    if status != "completed" or previous.get("early_stopped_at") is not None:
        why = ("a diverged run is final" if status != "completed"
               else f"it stopped early at step {previous['early_stopped_at']}, its task solved")
        return Decision("skip", message=f"{done}; {EXTENDABLE} raised {old_max} -> {new_max}, but {why}: "
                                        "not trained on. Delete summary.json to train it again.",
                        previous=previous)
    try:
        state = rundir.load_checkpoint("cpu")
    except FileUnreadable as error:
        raise ResumeRefused(f"relaunch refused: {EXTENDABLE} raised {old_max} -> {new_max}, but {error}") \
            from None
    if state is None or int(state["progress"].get("step", -1)) != steps:
        raise ResumeRefused(
            f"relaunch refused: {rundir.path} holds a completed run of {steps} steps and {EXTENDABLE} was "
            f"raised {old_max} -> {new_max}, but it has no checkpoint of step {steps} to extend it from; "
            f"launch with {EXTENDABLE}={old_max}, or delete its summary.json and metrics.jsonl to train it "
            "again from step 0")
    from_checkpoint = compare(state["config"], config, state.get("precision"), precision)
    if from_checkpoint.computed != [EXTENDABLE]:
        raise _refuse(str(rundir.checkpoint), "the checkpoint of a run",
                      from_checkpoint.listed(from_checkpoint.computed))
    message = (f"{rundir.path}: extending the completed run from its checkpoint at step {steps} to "
               f"{EXTENDABLE}={new_max} (was {old_max}): the cosine schedule is recomputed for {new_max} "
               f"steps from step {steps} on, so the run differs from one trained for {new_max} steps from "
               "the start; the summary's config_changes records it")
    return Decision("extend", message=message, state=state, changes=from_checkpoint.records(steps),
                    previous=previous, notes=_unknown(from_checkpoint.unknown))
