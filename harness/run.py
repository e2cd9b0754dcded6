"""A run built from its config (`build_run`: device, data, model, optimizer, schedule, resumed from the
accepted checkpoint), its progress (what a checkpoint carries to resume exactly) and its summary."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch._functorch.config as functorch_config
from omegaconf import DictConfig, OmegaConf

from harness.caches import share_compile_caches
from harness.check import Decision, resolve_device
from harness.config import EXTENDABLE, effective_precision, fast_step, replays_graphs, validate
from harness.data import EpochSampler, load_task
from harness.gpus import visible_subset
from harness.rundir import FileUnreadable, RunDir, flatten
from harness.step import graph_steps, lr_factor, make_optimizer
from mixers.model import LanguageModel

log = logging.getLogger("train")

# The eval set's seed is the run's seed shifted by a large prime, so train and eval never share a stream.
EVAL_SEED_OFFSET = 1_000_003


@dataclass
class Progress:
    """Everything about a run's progress that a checkpoint must carry to resume exactly."""

    step: int = 0
    best_eval_acc: float | None = None
    # the largest train/acc of a logged step: the metric of Kimi Linear's Fig. 4 (peak training accuracy)
    best_train_acc: float | None = None
    steps_to_threshold: int | None = None
    evals_above: int = 0  # consecutive evaluations at or above trainer.early_stop.acc
    early_stopped_at: int | None = None
    last_eval: dict[str, float] = field(default_factory=dict)
    wall_time_s: float = 0.0
    train_time_s: float = 0.0
    train_tokens: int = 0
    wandb_id: str | None = None


def run_meta(cfg: DictConfig, run_dir: Path, mixer_name: str) -> dict[str, Any]:
    """The summary's identifying fields and the whole resolved config, flattened."""
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return {"state_size": None, "n_params": None, "task": cfg.task.name, "mixer": mixer_name,
            "seq_len": cfg.task.seq_len, "lr": cfg.optim.lr, "seed": cfg.seed, "run_dir": str(run_dir),
            "config": flatten(config)}


def make_summary(status: str, progress: Progress, meta: dict[str, Any],
                 extra: dict[str, Any]) -> dict[str, Any]:
    """summary.json: the outcome and progress, then `meta` (run_meta's fields and what the run added),
    the final accuracy at every eval length, then `extra` (an error)."""
    return {
        "status": status,
        "best_eval_acc": progress.best_eval_acc,
        "best_train_acc": progress.best_train_acc,
        "final_eval_acc": progress.last_eval.get("eval/acc"),
        "early_stopped_at": progress.early_stopped_at,
        "steps": progress.step,
        "steps_to_threshold": progress.steps_to_threshold,
        "wall_time_s": round(progress.wall_time_s, 3),
        "tokens_per_s": (round(progress.train_tokens / progress.train_time_s, 1)
                         if progress.train_time_s else None),
        **meta,
        **{f"final_{key}": value for key, value in progress.last_eval.items() if "@" in key},
        **extra,
    }


@dataclass
class Run:
    """A run built from its config, ready to train: where it computes, its data, model and optimizer."""

    cfg: DictConfig
    rundir: RunDir
    device: torch.device
    autocast: Callable[[], Any]
    model: LanguageModel
    features: Callable[[torch.Tensor], torch.Tensor]  # the model's body, compiled with trainer.compile
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    inputs: torch.Tensor  # [N, T] the train set's inputs, on the device
    labels: torch.Tensor  # [N, T] its labels, on the host: each batch's scored positions are found there
    eval_sets: dict[int, tuple[torch.Tensor, torch.Tensor]]  # length -> (inputs, labels), on the host
    sampler: EpochSampler


def build_run(cfg: DictConfig, run_dir: Path, meta: dict[str, Any], progress: Progress,
              job_num: int | None, decision: Decision) -> Run:
    """Device, data, model, optimizer and schedule from the config, resumed from the checkpoint that
    `decision` accepted, if any (filling `progress`); fills `meta`'s device and sizes."""
    validate(cfg)
    task, trainer, optim = cfg.task, cfg.trainer, cfg.optim
    device, autocast, compiled, lean = _placement(cfg, run_dir, meta, job_num)
    vocab_size, (train_inputs, train_labels), eval_sets = _data(cfg)
    model = _model(cfg, vocab_size, lean, meta, device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, optim.warmup_steps, trainer.max_steps, optim.min_lr_ratio))

    rundir = RunDir(run_dir)
    if decision.state_error is not None:
        raise decision.state_error
    if decision.state is not None:
        _resume(decision, model, optimizer, scheduler, progress, meta, rundir)
        log.info("resumed from %s at step %d", rundir.checkpoint, progress.step)
    rundir.cut_metrics(progress.step, logged_steps(trainer, progress.step))
    log.info("%s on %s: %d parameters, state %d numbers at length %d, vocab %d", meta["mixer"], task.name,
             meta["n_params"], meta["state_size"], task.seq_len, vocab_size)
    model.train()
    features = model.features
    if compiled:
        # An in-process sweep (hydra's basic launcher) compiles job after job into the same code object's
        # cache, and past torch's recompile limit dynamo runs the body eager without failing: each run
        # starts from an empty cache (its graphs come back from the on-disk caches in seconds).
        torch._dynamo.reset()
        features = torch.compile(model.features, mode="reduce-overhead" if meta["cuda_graphs"] else None)
        if meta["cuda_graphs"]:
            features = graph_steps(features)
    return Run(cfg=cfg, rundir=rundir, device=device, autocast=autocast, model=model, features=features,
               params=params, optimizer=optimizer, scheduler=scheduler, inputs=train_inputs.to(device),
               labels=train_labels, eval_sets=eval_sets,
               sampler=EpochSampler(task.num_train, trainer.batch_size, cfg.seed))


def _placement(cfg: DictConfig, run_dir: Path, meta: dict[str, Any],
               job_num: int | None) -> tuple[torch.device, Callable[[], Any], bool, bool]:
    """(device, autocast, compiled, lean backward) as this run takes them, the device made current and the
    CPU threads set; the log's first line and `meta` say which."""
    trainer = cfg.trainer
    device = resolve_device(trainer.device, job_num)
    if device.type == "cuda":
        # Triton launches on the current device, not the tensors': make them the same GPU.
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)  # the summary's peak_memory_gib is this run's
    if trainer.cpu_threads is not None:
        torch.set_num_threads(trainer.cpu_threads)
    use_bf16 = effective_precision(trainer.precision, device.type) == "bf16"
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else nullcontext
    compiled, lean = fast_step(cfg, device.type)
    meta["compile"], meta["lean_backward"] = compiled, lean
    budget = trainer.compile_memory_budget if compiled else None
    meta["compile_memory_budget"] = budget
    replayable = compiled and device.type == "cuda"
    if trainer.cuda_graphs is True and not replayable:
        where = f"on {device}" if device.type != "cuda" else "not compiled"
        raise ValueError(f"trainer.cuda_graphs=true: CUDA graphs replay the compiled body on a CUDA device, "
                         f"and this run is {where}; run it on a GPU with trainer.compile=auto, or set "
                         "trainer.cuda_graphs=false")
    meta["cuda_graphs"] = replays_graphs(cfg, compiled, device.type)
    log.info("run dir %s | device %s | %s | %s%s | %s", run_dir, device,
             "bf16 autocast" if use_bf16 else "fp32",
             "eager" if not compiled else "compiled" if budget is None
             else f"compiled, memory budget {budget}",
             ", CUDA graphs" if meta["cuda_graphs"] else "",
             "lean backward" if lean else "plain backward")
    if compiled:
        # read when the graph is partitioned (its first call, and any recompile); set for every compiled
        # run, since jobs of an in-process sweep share the process. Part of the compile caches' keys.
        functorch_config.activation_memory_budget = 1.0 if budget is None else float(budget)
        # before the first compile: every job of a sweep on this machine reuses what the first one built
        meta["compile_cache"] = share_compile_caches()
        log.info("compile caches: inductor %s, triton %s", meta["compile_cache"]["inductor"],
                 meta["compile_cache"]["triton"])
    # `auto` in the config does not say where the wall time was spent; analysis.report needs to know
    meta["device"] = str(device)
    if device.type == "cuda":
        meta["gpu"] = gpu_identity(device)
    return device, autocast, compiled, lean


def gpu_identity(device: torch.device) -> dict[str, Any]:
    """Which of the machine's GPUs `device` is: a job given a subset of them (CUDA_VISIBLE_DEVICES, as the
    campaign tool places a block) calls its first one cuda:0 whichever it is, so the index alone does not say.
    `machine_index`: the CUDA_VISIBLE_DEVICES entry the device maps to (the index itself where none is set);
    `name` and `uuid` from the driver."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    found: dict[str, Any] = {"machine_index": visible_subset([index])}
    try:
        props = torch.cuda.get_device_properties(index)
    except (RuntimeError, AssertionError):  # no driver: the entry alone
        return found
    found["name"] = props.name
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        found["uuid"] = str(uuid)
    return found


def _data(cfg: DictConfig) -> tuple[int, tuple[torch.Tensor, torch.Tensor],
                                    dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """(vocabulary size, the train set [N, T], {length: eval set}) on the host; the training length first."""
    task = cfg.task
    generate, vocab_size = load_task(task)
    train_set = generate(task.num_train, task.seq_len, seed=cfg.seed)
    eval_lens = [task.seq_len] + [n for n in dict.fromkeys(task.eval_seq_lens or []) if n != task.seq_len]
    eval_sets = {n: generate(task.num_eval, n, seed=cfg.seed + EVAL_SEED_OFFSET) for n in eval_lens}
    return vocab_size, train_set, eval_sets


def _model(cfg: DictConfig, vocab_size: int, lean: bool, meta: dict[str, Any],
           device: torch.device) -> LanguageModel:
    """The model, initialised from the run's seed, on its device; its sizes go into `meta`."""
    # A scoped seed: the model's init is reproducible without touching the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model_kwargs = {**OmegaConf.to_container(cfg.model, enum_to_str=True), "lean_backward": lean}
        # recomputing is the compiled graph's; an eager run keeps everything, and its summary says so
        model_kwargs["recompute"] = model_kwargs["recompute"] if meta.get("compile") else []
        meta["recompute"] = sorted(model_kwargs["recompute"])
        model = LanguageModel(vocab_size, cfg.mixer, **model_kwargs, mixer_name=meta["mixer"])
    model.to(device)
    meta["n_params"] = sum(p.numel() for p in model.parameters())
    meta["state_size"] = model.state_size(cfg.task.seq_len)
    return model


def _resume(decision: Decision, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
            progress: Progress, meta: dict[str, Any], rundir: RunDir) -> None:
    """Load the accepted checkpoint's state into the run (harness.check.accept compared its config)."""
    state, changes = decision.state, decision.changes
    assert state is not None
    step = int(state["progress"].get("step", 0))
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    except (RuntimeError, KeyError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        reason = f"does not fit this model and optimizer ({type(error).__name__}: {first})"
        raise FileUnreadable(rundir.checkpoint, reason, "delete it to train the run from step 0") from None
    if any(change["key"] == EXTENDABLE for change in changes):
        # "Extended" means: the schedule of the new max_steps from this step on (the lr jumps to the value
        # that schedule has here), not a replay of the steps before it
        for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas,
                                       strict=True):
            group["lr"] = base * factor(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    progress.__dict__.update(state["progress"])
    meta["config_changes"] = state.get("config_changes", []) + changes
    if changes:
        log.info("resuming with %s changed from step %d on", ", ".join(
            f"{c['key']}={c['old']!r} -> {c['new']!r}" for c in changes), step)


def logged_steps(trainer: DictConfig, up_to: int) -> list[int]:
    """The steps through `up_to` that write a metrics record: the first, every log_every-th and eval_every-th,
    and the last."""
    last = trainer.max_steps
    return [s for s in range(1, min(up_to, last) + 1)
            if s == 1 or s % trainer.log_every == 0 or s % trainer.eval_every == 0 or s == last]


def save_checkpoint(run: Run, progress: Progress, meta: dict[str, Any]) -> None:
    """checkpoint.pt: the model, optimizer and schedule after `progress.step` steps, and what a relaunch
    compares and records (the config, the precision, the changes applied so far)."""
    run.rundir.save_checkpoint({
        "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(), "progress": asdict(progress),
        "data_position": progress.step * run.cfg.trainer.batch_size, "config": meta["config"],
        "precision": meta.get("precision"), "config_changes": meta.get("config_changes", [])})
