"""The typed trunk config of a run (docs/design.md §6): the dataclasses Hydra validates, stored in its
ConfigStore as `base_config` when this module is imported, the checks their types cannot express, and what
a resumed run may change.

A misspelt key is an error (Hydra's struct mode) and a bad Enum value names the choices; the mixer group is
free-form (`_target_` + the mixer's own kwargs, checked against its constructor). `validate` covers keys
added with `+`, keys left without a value, non-finite numbers and value ranges.

The dataclasses give the types only (MISSING); the values are the yaml's, conf/<group>/<option>.yaml:
that is what `--cfg job` prints and a reader opens, each option complete on its own (as conf/task/ always
was), and a script can load one alone (benchmarks/ take conf/optim/adamw.yaml).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import logging
import math
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from harness.rundir import ResumeRefused
from mixers.pattern import check_pattern, expand

# The `train` logger: in a sweep, its lines carry the run's name (harness.log.name_log_lines).
log = logging.getLogger("train")


class Precision(str, Enum):
    """trainer.precision: auto (bf16 autocast on CUDA, fp32 on the CPU), bf16 or fp32."""

    auto = "auto"
    bf16 = "bf16"
    fp32 = "fp32"


class MlpKind(str, Enum):
    """model.mlp: the channel mixer of a block (mixers/model.py)."""

    swiglu = "swiglu"
    gelu = "gelu"


class WandbMode(str, Enum):
    """logger.wandb.mode: disabled (wandb not even imported), offline (sync later), online."""

    disabled = "disabled"
    offline = "offline"
    online = "online"


@dataclass
class TaskConfig:
    """A synthetic task: `tasks.<name>.generate(num, seq_len, seed=..., **params)`, `num_tokens(**params)`."""

    name: str = MISSING
    seq_len: int = MISSING
    # Lengths to evaluate at besides seq_len (length generalisation); seq_len itself is always evaluated.
    eval_seq_lens: list[int] | None = MISSING
    num_train: int = MISSING
    num_eval: int = MISSING
    # The generator's keyword arguments. Open (not struct), so that `task.params.<key>=` needs no `+` for a
    # parameter the task's yaml leaves out; harness.data.load_task checks the keys against the generator.
    params: dict[str, Any] = field(default_factory=lambda: OmegaConf.create({}, flags={"struct": False}))


@dataclass
class ModelConfig:
    """The backbone (mixers/model.py); the mixer's own sizes (num_heads, head_dim) are in conf/mixer."""

    d_model: int = MISSING
    num_layers: int = MISSING
    # A hybrid stack: one conf/mixer name per layer ([kda,kda,kda,attention]); null: `mixer` in every layer.
    # mixers/pattern.py says how each kind's switches are set.
    pattern: list[str] | None = MISSING
    mlp: MlpKind = MISSING
    mlp_ratio: float = MISSING
    norm_eps: float = MISSING
    tie_embeddings: bool = MISSING
    # keep less for the backward (recompute in it): mixers/README.md says what and at what cost.
    # auto | true | false; auto: off (fast_step says why)
    lean_backward: Any = MISSING
    # what the compiled body recomputes in its backward instead of keeping: parts of
    # mixers.model.RECOMPUTABLE ([] keeps everything)
    recompute: list[str] = MISSING


@dataclass
class OptimConfig:
    """AdamW with linear warmup, then cosine decay to min_lr_ratio * lr at max_steps."""

    lr: float = MISSING
    weight_decay: float = MISSING
    betas: list[float] = MISSING
    eps: float = MISSING
    warmup_steps: int = MISSING
    min_lr_ratio: float = MISSING
    grad_clip: float | None = MISSING  # null: no clipping


@dataclass
class EarlyStopConfig:
    """Stop once eval/acc has held >= `acc` for `evals` evaluations in a row (a solved task need not
    train on); the summary records the step as `early_stopped_at`."""

    enabled: bool = MISSING
    acc: float = MISSING
    evals: int = MISSING


@dataclass
class TrainerConfig:
    max_steps: int = MISSING
    batch_size: int = MISSING
    eval_batch_size: int = MISSING
    eval_every: int = MISSING
    log_every: int = MISSING
    checkpoint_every: int = MISSING
    # auto | cpu | cuda | cuda:N. auto in a multirun with several GPUs: the GPU hydra/launcher=local gave
    # the job (the one running the fewest of the sweep's jobs when it started), else cuda:(job.num % GPUs).
    device: str = MISSING
    precision: Precision = MISSING
    # torch.compile the model's body (embedding to final norm; the scored loss stays eager). Our Triton
    # ops are opaque custom ops to the compiler, so the glue between them fuses. auto | true | false;
    # auto: on CUDA, off on the CPU (fast_step).
    compile: Any = MISSING
    # what the compiled graph may keep for its backward, as a fraction of what it keeps by default: the
    # partitioner recomputes the rest in the backward (torch._functorch.config.activation_memory_budget);
    # null: keep it all (torch's default). Only with the body compiled.
    compile_memory_budget: float | None = MISSING
    # the compiled body's forward and backward recorded as CUDA graphs and replayed (torch.compile's
    # reduce-overhead mode): one launch each instead of one per kernel, for steps the host bounds. CUDA and
    # a compiled body only. auto | true | false; auto: on wherever the body is compiled on CUDA.
    cuda_graphs: Any = MISSING
    # steps_to_threshold = first eval step with eval/acc >= acc_threshold
    acc_threshold: float = MISSING
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    # torch's CPU threads; null: torch's default (one per core). Small models on a busy or shared CPU run
    # several times faster on 1 thread (no spinning OpenMP workers), as do CPU sweeps with parallel jobs.
    cpu_threads: int | None = MISSING


@dataclass
class WandbConfig:
    mode: WandbMode = MISSING
    project: str = MISSING
    entity: str | None = MISSING
    group: str | None = MISSING  # None: the sweep directory's name in a multirun
    tags: list[str] = MISSING  # the task and mixer names are added
    name: str | None = MISSING  # None: <task>/<mixer>/<run dir name>


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    # The mixer group has no schema: `_target_` + the mixer's kwargs, checked against its constructor. Open
    # (not struct), so that a misspelt `mixer.<key>=` override reaches that check, which lists the valid keys.
    mixer: Any = field(default_factory=lambda: OmegaConf.create({}, flags={"struct": False}))
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    # Seeds the data (train: seed, eval: seed + harness.run.EVAL_SEED_OFFSET), the model's init and the
    # batch order.
    seed: int = MISSING


ConfigStore.instance().store(name="base_config", node=Config)
# `${mul:${task.seq_len},2}`: lengths relative to the training length (e.g. evaluating at 2L)
OmegaConf.register_new_resolver("mul", lambda a, b: int(a) * int(b), replace=True)

# A file name holds at most 255 bytes; a longer override keeps a readable head and a hash of the whole.
NAME_MAX = 255


def _path_part(line: str) -> str:
    """One override as one path component: `/` and `%` percent-encoded (so no value can add a level, climb
    out with `..`, or equal another value), shortened with a hash past NAME_MAX bytes."""
    part = line.replace("%", "%25").replace("/", "%2F")
    if len(part.encode()) <= NAME_MAX:
        return part
    digest = hashlib.sha256(line.encode()).hexdigest()[:16]
    head = part.encode()[:NAME_MAX - len(digest) - 1].decode(errors="ignore")
    return f"{head}~{digest}"


def override_path(overrides: list[str], exclude_keys: list[str] = (), kv_sep: str = "=") -> str:
    """A sweep job's subdirectory: one level per override that changes what the run computes (sorted, as
    Hydra's override_dirname with item_sep `/`), leaving out `exclude_keys` and the RUN_ONLY keys; a job
    without such overrides gets `default`."""
    lines = []
    for line in overrides:
        key = line.lstrip("+~").split("=", 1)[0]
        if key not in exclude_keys and not run_only(key):
            lines.append(line)
    parts = [_path_part(line.replace("=", kv_sep)) for line in sorted(lines)]
    return "/".join(parts) or "default"


def _override_path_resolver(*, _root_: DictConfig) -> str:
    """`${override_path:}` in hydra.sweep.subdir: the job's overrides and its override_dirname settings
    (exclude_keys, kv_sep) read from the job's own config."""
    hydra_node = _root_.hydra
    settings = hydra_node.job.config.override_dirname
    return override_path(list(hydra_node.overrides.task), list(settings.exclude_keys or []),
                         str(settings.kv_sep))


OmegaConf.register_new_resolver("override_path", _override_path_resolver, replace=True)


def _schema_problems(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Keys of `node` that the dataclass `schema` lacks (a `+key=value` override adds them past Hydra's typed
    config), and floats that are not finite; free-form fields (`mixer`, `task.params`) are not walked."""
    # A nested group is a field whose default is made by a dataclass. (Not read from the annotations: they
    # are strings here, and a job that submitit runs from a pickle has no module to evaluate them in.)
    hints = {f.name: f.default_factory if is_dataclass(f.default_factory) else None for f in fields(schema)}
    problems = []
    for key in node.keys():
        name = f"{prefix}{key}"
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=1)
            hint = f"did you mean {prefix}{close[0]}?" if close else f"known: {list(hints)}"
            problems.append(f"unknown key {name} ({hint})")
            continue
        if OmegaConf.is_interpolation(node, key):  # resolved in the run; train.py reads it there
            continue
        value = node[key]
        if hints[key] is not None and isinstance(value, DictConfig):
            problems += _schema_problems(value, hints[key], f"{name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{name}={value} is not a finite number")
    return problems


def validate(cfg: DictConfig) -> None:
    """Check what the schema's types cannot: keys added with `+`, keys without a value, non-finite numbers
    and value ranges; each error names the key and the fix."""
    try:
        # unresolved: a ${hydra:} interpolation resolves inside a run only
        OmegaConf.to_container(cfg, throw_on_missing=True)
    except MissingMandatoryValue as error:
        raise ValueError(f"config: no value for {error.full_key}: every key takes its value from its "
                         "group's yaml (conf/<group>/<option>.yaml); give it there or as key=value") from None
    problems = _schema_problems(cfg, Config)
    unknown = [p for p in problems if p.startswith("unknown key")]
    if unknown:
        raise ValueError("config: " + "; ".join(unknown) + ". A key given with `+` must still be one of "
                         "train.py's schema (only mixer.* and task.params.* are free-form): fix the "
                         "spelling, or drop the `+` to let Hydra check it")
    if problems:
        raise ValueError("config: " + "; ".join(problems) + ": give a finite value")
    _check_values(cfg)


def _check_values(cfg: DictConfig) -> None:
    """Value ranges and the rules between keys: a ValueError naming the first key that breaks one."""
    t, tr, o, m = cfg.task, cfg.trainer, cfg.optim, cfg.model
    positive = {"task.seq_len": t.seq_len, "task.num_train": t.num_train, "task.num_eval": t.num_eval,
                "trainer.max_steps": tr.max_steps, "trainer.batch_size": tr.batch_size,
                "trainer.eval_batch_size": tr.eval_batch_size, "trainer.eval_every": tr.eval_every,
                "trainer.log_every": tr.log_every, "trainer.checkpoint_every": tr.checkpoint_every,
                "model.d_model": m.d_model, "model.num_layers": m.num_layers}
    for key, value in positive.items():
        if value < 1:
            raise ValueError(f"{key}={value}: must be >= 1")
    check_pattern(m.pattern, m.num_layers)
    if tr.batch_size > t.num_train:
        raise ValueError(f"trainer.batch_size={tr.batch_size} > task.num_train={t.num_train}: every batch "
                         "would hold each training sequence several times over; lower trainer.batch_size "
                         "or raise task.num_train")
    if any(length < 1 for length in t.eval_seq_lens or []):
        raise ValueError(f"task.eval_seq_lens={list(t.eval_seq_lens)}: lengths must be >= 1")
    ranges = [
        ("optim.lr", o.lr, o.lr > 0, "must be > 0"),
        ("optim.weight_decay", o.weight_decay, o.weight_decay >= 0, "must be >= 0 (0: no weight decay)"),
        ("optim.eps", o.eps, o.eps > 0, "must be > 0"),
        ("optim.warmup_steps", o.warmup_steps, o.warmup_steps >= 0, "must be >= 0"),
        ("optim.min_lr_ratio", o.min_lr_ratio, 0 <= o.min_lr_ratio <= 1, "must be in [0, 1]"),
        ("optim.betas", list(o.betas), len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas),
         "must be two numbers in [0, 1)"),
        # 0 would read as "no clipping" through `or`, a negative value flips every update (trains backwards)
        ("optim.grad_clip", o.grad_clip, o.grad_clip is None or o.grad_clip > 0,
         "must be > 0, or null for no clipping"),
        ("trainer.acc_threshold", tr.acc_threshold, 0 <= tr.acc_threshold <= 1,
         "must be in [0, 1] (an accuracy)"),
        ("trainer.early_stop.acc", tr.early_stop.acc, 0 <= tr.early_stop.acc <= 1,
         "must be in [0, 1] (an accuracy)"),
        ("trainer.early_stop.evals", tr.early_stop.evals, tr.early_stop.evals >= 1,
         "must be >= 1 (evaluations in a row)"),
        ("trainer.cpu_threads", tr.cpu_threads, tr.cpu_threads is None or tr.cpu_threads >= 1,
         "must be >= 1 (or null)"),
        ("trainer.compile_memory_budget", tr.compile_memory_budget,
         tr.compile_memory_budget is None or 0 < tr.compile_memory_budget <= 1,
         "must be in (0, 1], the fraction of the compiled graph's saved activations it keeps (or null: all)"),
        ("model.mlp_ratio", m.mlp_ratio, m.mlp_ratio > 0, "must be > 0"),
        ("model.norm_eps", m.norm_eps, m.norm_eps > 0, "must be > 0"),
    ]
    for key, value, ok, rule in ranges:
        if not ok:
            raise ValueError(f"{key}={value}: {rule}")
    # mixers/model.py sizes the MLP int(mlp_ratio * d_model) wide, SwiGLU 2/3 of that: at 0 the blocks
    # have no MLP and the run trains without one
    mlp, hidden = str(getattr(m.mlp, "value", m.mlp)), int(m.mlp_ratio * m.d_model)
    if (int(2 * hidden / 3) if mlp == "swiglu" else hidden) < 1:
        raise ValueError(f"model.mlp_ratio={m.mlp_ratio}: the {mlp} MLP's hidden width at model.d_model="
                         f"{m.d_model} comes to 0; raise model.mlp_ratio (Kimi Linear's: 4.0)")
    if cfg.seed < 0:
        raise ValueError(f"seed={cfg.seed}: must be >= 0")
    # the batch order's generator is seeded with seed * 7919 + epoch, a 64-bit integer (harness.data)
    if cfg.seed >= 2**32:
        raise ValueError(f"seed={cfg.seed}: must be < 2**32 = {2**32} (the batch order's 64-bit generator "
                         "seed is seed x 7919 + epoch); give a smaller seed, e.g. 0, 1, 2")
    for key, value in (("trainer.compile", tr.compile), ("model.lean_backward", m.lean_backward),
                       ("trainer.cuda_graphs", tr.cuda_graphs)):
        if not (isinstance(value, bool) or value == "auto"):
            raise ValueError(f"{key}={value!r}: choose auto, true or false")
    from mixers.model import check_recompute

    check_recompute(list(m.recompute))
    if tr.cuda_graphs is True and str(tr.device) == "cpu":
        raise ValueError("trainer.cuda_graphs=true: CUDA graphs need a CUDA device, and trainer.device=cpu; "
                         "set trainer.device=auto (or cuda) on a GPU machine, or trainer.cuda_graphs=false")
    if tr.cuda_graphs is True and tr.compile is False:
        raise ValueError("trainer.cuda_graphs=true: it replays the compiled body, and trainer.compile=false; "
                         "set trainer.compile=auto (or true), or leave trainer.cuda_graphs=false")


def replays_graphs(cfg: DictConfig, compiled: bool, device_type: str) -> bool:
    """trainer.cuda_graphs as a run takes it: `auto` replays wherever the body is compiled on CUDA, true
    and false force it (a caller refuses true where it cannot replay)."""
    graphs = cfg.trainer.cuda_graphs
    return compiled and device_type == "cuda" if graphs == "auto" else bool(graphs)


def fast_step(cfg: DictConfig, device_type: str) -> tuple[bool, bool]:
    """(compile, lean_backward) as this run takes them; true/false force either. `auto` compiles on CUDA
    (the step in two thirds of the eager time there) and not on the CPU (where compiling costs more than
    it saves), and leaves the lean backward off everywhere: compiled on the GPU it keeps less memory but
    takes longer than the plain compiled step (benchmarks/results/h100_step/), so it is a memory switch."""
    compile_ = device_type == "cuda" if cfg.trainer.compile == "auto" else bool(cfg.trainer.compile)
    lean = False if cfg.model.lean_backward == "auto" else bool(cfg.model.lean_backward)
    return compile_, lean


# What a run computes is every key of its config but these, which say only where and how fast it runs: a
# change to one of them moves its numbers by rounding at most, never by what it trains on or how. The one
# definition for comparing a relaunch with what a run directory holds (a change here is applied from the
# resume step on and recorded in the summary's `config_changes`) and for naming sweep directories.
# eval_batch_size is here: it splits the eval set into batches, so it changes memory and the eval loss's
# last bits, never the weights. trainer.precision is not: bf16 autocast and fp32 train different numbers
# (compared as the precision the run took, `auto` resolved on its device).
RUN_ONLY = ("trainer.device", "trainer.cpu_threads", "trainer.checkpoint_every", "trainer.compile",
            "trainer.compile_memory_budget", "trainer.cuda_graphs", "model.lean_backward", "model.recompute",
            "trainer.eval_batch_size", "logger.")
# The one key of what a run computes that a relaunch may raise: the run is trained on from its checkpoint.
EXTENDABLE = "trainer.max_steps"


def run_only(key: str) -> bool:
    """True for a (dotted) config key that says where or how fast a run executes, not what it computes."""
    return any(key == k or key.startswith(k if k.endswith(".") else k + ".") for k in RUN_ONLY)


def effective_precision(precision: str, device_type: str) -> str:
    """trainer.precision as a run on `device_type` takes it: bf16 or fp32 (auto: bf16 on CUDA)."""
    precision = str(getattr(precision, "value", precision))
    if precision == "auto":
        return "bf16" if device_type == "cuda" else "fp32"
    return precision


def computed(flat: dict[str, Any], precision: str | None = None) -> dict[str, Any]:
    """What a run computes, from its flattened config: the keys of RUN_ONLY dropped, and trainer.precision
    replaced by the precision the run took when it is known (`precision`)."""
    kept = {k: v for k, v in flat.items() if not run_only(k)}
    if isinstance(kept.get("model.pattern"), list):
        # `kda*3` and `kda,kda,kda` build one model: compared layer by layer
        with contextlib.suppress(ValueError):
            kept["model.pattern"] = expand(kept["model.pattern"])
    if precision is not None and "trainer.precision" in kept:
        kept["trainer.precision"] = precision
    return kept


@dataclass
class Comparison:
    """A relaunch's config against what a run directory recorded."""

    computed: list[str]  # keys whose change alters what the run computes
    run_only: list[str]  # keys that only change where and how fast it runs
    unknown: list[str]  # keys that one side lacks (another version of train.py): taken as unchanged
    old: dict[str, Any]
    new: dict[str, Any]

    def extends(self) -> bool:
        """True when the only change to what the run computes is a raised trainer.max_steps."""
        return self.computed == [EXTENDABLE] and self.new[EXTENDABLE] > self.old[EXTENDABLE]

    def listed(self, keys: list[str]) -> str:
        return ", ".join(f"{k}={self.old.get(k)!r} -> {self.new.get(k)!r}" for k in keys)

    def records(self, step: int) -> list[dict[str, Any]]:
        """config_changes records of every applied change, taking effect at `step`."""
        return [{"step": step, "key": k, "old": self.old[k], "new": self.new[k]}
                for k in sorted(self.computed + self.run_only)]


def compare(old: dict[str, Any], new: dict[str, Any], old_precision: str | None = None,
            new_precision: str | None = None) -> Comparison:
    """Compare two flattened configs (`old` as a run directory recorded it, `new` this launch's), with the
    precision each took where known (an old record may lack it: then trainer.precision is compared as
    written)."""
    if old_precision is None or new_precision is None:
        old_precision = new_precision = None
    old_c, new_c = computed(old, old_precision), computed(new, new_precision)
    changed = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
    computed_changed = sorted(k for k in old_c.keys() & new_c.keys() if old_c[k] != new_c[k])
    old_shown = {**old, **({"trainer.precision": old_precision} if old_precision else {})}
    new_shown = {**new, **({"trainer.precision": new_precision} if new_precision else {})}
    return Comparison(computed=computed_changed, run_only=[k for k in changed if run_only(k)],
                      unknown=sorted(old.keys() ^ new.keys()), old=old_shown, new=new_shown)


def config_changes(old: dict[str, Any], new: dict[str, Any], step: int, checkpoint: Path,
                   old_precision: str | None = None,
                   new_precision: str | None = None) -> list[dict[str, Any]]:
    """The changes from the checkpoint's flattened config `old` to this launch's `new` that a resume
    applies (as records with the step they take effect at): where and how it runs, and a raised
    trainer.max_steps; `ResumeRefused` for any other change."""
    comparison = compare(old, new, old_precision, new_precision)
    if comparison.computed and not comparison.extends():
        raise ResumeRefused(
            f"resume refused: {checkpoint} (step {step}) was trained with another config "
            f"({comparison.listed(comparison.computed)}). Its optimizer state, schedule and data order are "
            "those of the old values, so the run would go on under the old config while recording the new "
            "one. Launch with the checkpoint's values to resume; give the new config its own run directory "
            "(hydra.run.dir=..., or another sweep dir); or, to train this directory again from step 0, "
            "delete its checkpoint.pt, metrics.jsonl and summary.json")
    return comparison.records(step)
