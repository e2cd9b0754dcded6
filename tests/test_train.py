"""train.py end to end on the CPU: learning, the run directory's files, resume, errors, W&B offline."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CLI_TINY, read_wandb_records
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from harness.check import GPU_ENV, resolve_device
from harness.cli import CONFIG_DIR
from harness.data import EpochSampler
from harness.step import lr_factor
from harness.trainer import train

ROOT = Path(__file__).resolve().parents[1]
MakeCfg = Callable[..., DictConfig]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_short_run_learns_and_writes_the_run_directory(make_cfg: MakeCfg, tmp_path: Path) -> None:
    cfg = make_cfg(
        "trainer.max_steps=120",
        "trainer.eval_every=40",
        "trainer.log_every=10",
        "trainer.checkpoint_every=50",
        "optim.lr=3e-3",
        "task.eval_seq_lens=[16,32]",
    )
    summary = train(cfg, tmp_path, mixer_name="attention")
    metrics = _metrics(tmp_path)
    steps = [m["step"] for m in metrics]
    assert steps == [1, *range(10, 121, 10)]
    assert all({"train/loss", "train/acc", "lr", "time_s"} <= m.keys() for m in metrics)
    evals = [m for m in metrics if "eval/acc" in m]
    assert [m["step"] for m in evals] == [40, 80, 120]
    assert {"eval/seq_acc", "eval/acc@16", "eval/acc@32"} <= evals[0].keys()
    # It learns: the loss falls well below chance (ln 16 = 2.77) and accuracy rises far above 1/16.
    assert metrics[-1]["train/loss"] < 0.5 * metrics[0]["train/loss"]
    assert evals[-1]["eval/acc"] > 0.8 and evals[-1]["eval/acc"] > evals[0]["eval/acc"]
    assert summary == _summary(tmp_path)
    assert summary["status"] == "completed" and summary["steps"] == 120
    assert summary["final_eval_acc"] == evals[-1]["eval/acc"]
    assert summary["best_eval_acc"] == max(m["eval/acc"] for m in evals)
    first_above = [m["step"] for m in evals if m["eval/acc"] >= 0.9]
    assert summary["steps_to_threshold"] == (first_above[0] if first_above else None)
    assert summary["final_eval/acc@32"] == evals[-1]["eval/acc@32"]
    assert (summary["task"], summary["mixer"], summary["seq_len"], summary["lr"], summary["seed"]) == (
        "stand_in",
        "attention",
        16,
        3e-3,
        0,
    )
    # State: K and V caches, 2 layers x 2 heads x (16 + 16) x 16 tokens.
    assert summary["state_size"] == 2 * 2 * 32 * 16
    assert summary["n_params"] > 0 and summary["tokens_per_s"] > 0 and summary["wall_time_s"] > 0
    assert summary["config"]["trainer.max_steps"] == 120
    assert (tmp_path / "checkpoint.pt").exists() and "eval acc" in (tmp_path / "train.log").read_text()
    # Re-running a completed directory does nothing.
    before = (tmp_path / "metrics.jsonl").read_text()
    assert train(cfg, tmp_path, mixer_name="attention") == summary
    assert (tmp_path / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("where", ["step_start", "after_update"])
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_resume_after_interruption_matches_an_uninterrupted_run(
    make_cfg: MakeCfg,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    interrupt: type[BaseException],
    where: str,
) -> None:
    cfg = make_cfg(
        "trainer.max_steps=30",
        "trainer.eval_every=10",
        "trainer.log_every=1",
        "trainer.checkpoint_every=10",
        "task.num_train=200",
    )  # 200 / 16: batches cross epochs
    whole = tmp_path / "whole"
    train(cfg, whole, mixer_name="attention")

    # Ctrl-C or submitit's requeue (SystemExit) during step 25: either as it starts, or just after its
    # weight update, before its bookkeeping (then the weights are ahead of the step count).
    indices, adamw_step = EpochSampler.indices, torch.optim.AdamW.step
    calls = []

    def interrupt_step_25(self: EpochSampler, step: int) -> torch.Tensor:
        if step == 24:
            raise interrupt("killed")
        return indices(self, step)

    def interrupt_after_update_25(self: torch.optim.AdamW, *args: object, **kwargs: object) -> object:
        result = adamw_step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 25:
            raise interrupt("killed")
        return result

    parts = tmp_path / "parts"
    if where == "step_start":
        monkeypatch.setattr(EpochSampler, "indices", interrupt_step_25)
    else:
        monkeypatch.setattr(torch.optim.AdamW, "step", interrupt_after_update_25)
    with pytest.raises(interrupt):
        train(cfg, parts, mixer_name="attention")
    # Not a failure: incomplete, and at a step boundary checkpointed so no finished step is lost.
    assert _summary(parts)["status"] == "incomplete" and interrupt.__name__ in _summary(parts)["error"]
    assert _metrics(parts)[-1]["step"] == 24
    checkpointed = torch.load(parts / "checkpoint.pt", weights_only=True)["progress"]["step"]
    assert checkpointed == (24 if where == "step_start" else 20)
    monkeypatch.undo()
    resumed = train(cfg, parts, mixer_name="attention")
    log = (parts / "train.log").read_text()
    assert f"resumed from {parts / 'checkpoint.pt'} at step {checkpointed}" in log

    def without_time(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "time_s"} for row in rows]

    assert [m["step"] for m in _metrics(parts)] == list(range(1, 31))  # nothing repeated, nothing lost
    assert without_time(_metrics(parts)) == without_time(_metrics(whole))
    reference = _summary(whole)
    for key in ("status", "steps", "final_eval_acc", "best_eval_acc", "steps_to_threshold"):
        assert resumed[key] == reference[key]
    # Done: an interrupt is not a finished status, a completed run is.
    assert _summary(parts)["status"] == "completed"


def test_the_trunk_values_are_stated_in_the_yaml_alone() -> None:
    """The dataclasses type the trunk and leave every value to conf/<group>/*.yaml (MISSING): one place."""
    from dataclasses import fields, is_dataclass

    from omegaconf import MISSING

    from harness.config import Config

    def values(schema: type, prefix: str = "") -> dict[str, Any]:
        found: dict[str, Any] = {}
        for f in fields(schema):
            if is_dataclass(f.default_factory):
                found.update(values(f.default_factory, f"{prefix}{f.name}."))
            elif f.name not in ("mixer", "params"):  # free-form nodes: their keys are the yaml's own
                found[prefix + f.name] = f.default
        return found

    stated = values(Config)
    assert "trainer.max_steps" in stated and "logger.wandb.mode" in stated
    assert {key: value for key, value in stated.items() if value != MISSING} == {}


def test_main_job_and_experiments_compose() -> None:
    """`python train.py` composes the main job from conf/ alone; `experiment=` needs no `+`."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        main_job = compose("config", return_hydra_config=True)
        smoke = compose("config", overrides=["experiment=smoke"], return_hydra_config=True)
    assert main_job.hydra.runtime.choices["task"] == "mqar_small"
    assert (main_job.task.name, main_job.task.seq_len, main_job.task.num_train, main_job.task.num_eval) == (
        "mqar",
        32,
        10_000,
        500,
    )
    assert dict(main_job.task.params) == {"form": "kimi", "vocab_size": 64}
    choices = main_job.hydra.runtime.choices
    assert choices["mixer"] == "kda" and choices["experiment"] is None
    assert smoke.task.seq_len == 32 and smoke.model.d_model == 32 and smoke.trainer.max_steps == 200
    assert smoke.hydra.sweeper.params["mixer"] == "gdn,kda"


def test_misspelt_keys_are_errors(make_cfg: MakeCfg, tmp_path: Path) -> None:
    for override in [
        "trainer.max_stepz=3",
        "model.d_modle=64",
        "optim.learning_rate=1e-3",
        "sede=1",
        "logger.wandb.mdoe=offline",
        "task.seqlen=8",
    ]:
        with pytest.raises(ConfigCompositionException):
            make_cfg(override)
    # The mixer group is free-form, so its keys are checked against the mixer's constructor instead.
    cfg = make_cfg("+mixer.num_head=4")
    with pytest.raises(ValueError, match=r"'attention'.*num_head"):
        train(cfg, tmp_path / "run", mixer_name="attention")
    assert not (tmp_path / "run").exists()  # found before anything was written


def test_task_params_take_generator_parameters_without_plus() -> None:
    """`task.params.<name>=` needs no `+` for a generator parameter the task's yaml leaves out (mqar_small
    lists form and vocab_size only); a misspelt one is a one-line error naming the valid parameters."""
    from hydra import compose, initialize_config_dir

    from harness.data import load_task

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["task.params.num_pairs=3"])
        misspelt = compose("config", overrides=["task.params.num_pair=3"])
    assert "num_pairs" not in OmegaConf.load(CONFIG_DIR / "task" / "mqar_small.yaml").params
    generate, _ = load_task(cfg.task)
    inputs, _ = generate(8, cfg.task.seq_len, seed=0)
    # kimi form: k1 v1 k2 v2 k3 v3 <sep> queries, so <sep> (id 1) first appears at position 2 * 3
    assert ((inputs == 1).int().argmax(dim=1) == 6).all()
    with pytest.raises(ValueError) as error:
        load_task(misspelt.task)
    message = str(error.value)
    assert "\n" not in message and "task.params.num_pair=3 (did you mean num_pairs?)" in message
    assert message.endswith("its parameters: vocab_size, form, num_pairs, num_queries, power_a, noise")
    with pytest.raises(ValueError, match=r"task.params=5: give the generator's parameters one by one"):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            load_task(compose("config", overrides=["task.params=5"]).task)


def test_bad_values_fail_with_the_key_named(make_cfg: MakeCfg, tmp_path: Path) -> None:
    cases = {
        "unknown_param": ("+task.params.vocab_sise=8", "vocab_sise"),
        "device": ("trainer.device=tpu", "trainer.device"),
        "steps": ("trainer.max_steps=0", "trainer.max_steps"),
        "task": ("task.name=no_such_task", "no_such_task"),
    }
    for name, (override, expected) in cases.items():
        with pytest.raises(ValueError, match=expected):
            train(make_cfg(override), tmp_path / name, mixer_name="attention")
        assert not (tmp_path / name).exists()  # found before anything was written


def test_nan_loss_stops_with_status_diverged(make_cfg: MakeCfg, tmp_path: Path) -> None:
    # AdamW's first steps move every weight by about lr: at 1e30 the next forward overflows.
    cfg = make_cfg("optim.lr=1e30", "optim.warmup_steps=0", "trainer.max_steps=20")
    summary = train(cfg, tmp_path, mixer_name="attention")
    assert summary["status"] == "diverged" and "non-finite" in summary["error"]
    assert 0 < summary["steps"] < 20
    assert all(m["step"] <= summary["steps"] for m in _metrics(tmp_path))
    # A diverged run is finished: launching it again does not train.
    assert train(cfg, tmp_path, mixer_name="attention")["steps"] == summary["steps"]


def test_diverging_linear_mixer_is_diverged_not_failed(make_cfg: MakeCfg, tmp_path: Path) -> None:
    # GDN at lr 1e4 (after warmup's 100 at step 1): that update makes A_log ~ 100, exp(A_log) overflows,
    # 0 * inf puts NaN in g, and the chunk kernel's input check raises a ValueError before any loss exists.
    cfg = make_cfg(
        "mixer=gdn",
        "optim.lr=1e4",
        "optim.warmup_steps=100",
        "trainer.max_steps=10",
        "task=mqar",
        "task.seq_len=32",
        "task.params.vocab_size=64",
        "task.num_train=256",
        "task.num_eval=32",
    )
    summary = train(cfg, tmp_path, mixer_name="gdn")
    assert summary["status"] == "diverged", summary.get("error")
    assert "mixer" in summary["error"] and "non-finite" in summary["error"]
    assert 0 < summary["steps"] < 10
    assert "Traceback" not in (tmp_path / "train.log").read_text()


def test_forward_error_with_finite_values_is_a_failure(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The divergence test does not hide bugs: an error raised with every value finite fails the run."""
    from mixers.attention import Attention

    forward = Attention.forward
    calls = []

    def broken_after_3(self: Attention, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) > 6:  # 2 layers per forward: fails in step 4
            raise ValueError("a bug")
        return forward(self, x)

    monkeypatch.setattr(Attention, "forward", broken_after_3)
    with pytest.raises(ValueError, match="a bug"):
        train(make_cfg("trainer.max_steps=10"), tmp_path, mixer_name="attention")
    assert _summary(tmp_path)["status"] == "failed" and "a bug" in _summary(tmp_path)["error"]


def test_wandb_config_names_the_mixer_and_task(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dashboards group by the mixer's yaml name, the task, length and lr: top-level config fields."""
    seen: dict = {}

    class FakeRun:
        id, summary = "fake", {}

        def log(self, *args: object, **kwargs: object) -> None: ...

        def finish(self, exit_code: int = 0) -> None:
            seen["exit_code"] = exit_code

    def init(**kwargs: object) -> FakeRun:
        seen.update(kwargs)
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    cfg = make_cfg("logger.wandb.mode=offline", "trainer.max_steps=2", "optim.lr=2e-3")
    train(cfg, tmp_path, mixer_name="attention")
    config = seen["config"]
    assert (config["mixer_name"], config["task_name"], config["seq_len"], config["lr"]) == (
        "attention",
        "stand_in",
        16,
        2e-3,
    )
    assert config["model"]["d_model"] == 32 and seen["exit_code"] == 0


def _wandb_items(items: Any) -> dict[str, Any]:
    """A history row's, summary update's or config's items as {key: value}; a nested key joined by dots."""
    return {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in items}


def test_wandb_offline_run_holds_the_metrics_config_group_tags_and_summary(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offline run file, read back record by record: every metrics.jsonl line in its history at its
    step, the resolved config, the group and tags, and summary.json in the run's summary."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = make_cfg(
        "logger.wandb.mode=offline",
        "logger.wandb.group=newcomer",
        "logger.wandb.tags=[smoke]",
        "trainer.max_steps=4",
        "trainer.eval_every=2",
        "trainer.log_every=1",
        "task.eval_seq_lens=[16,32]",
    )
    run_dir = tmp_path / "run"
    train(cfg, run_dir, mixer_name="attention")
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = read_wandb_records(path)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert kinds.count("run") == 1 and kinds.count("exit") == 1
    assert records[kinds.index("exit")].exit.exit_code == 0

    run = records[kinds.index("run")].run
    assert run.run_group == "newcomer" and sorted(run.tags) == ["attention", "smoke", "stand_in"]
    assert run.display_name == "stand_in/attention/run"
    config = _wandb_items(run.config.update)
    for r in records:
        if r.WhichOneof("record_type") == "config":
            config.update(_wandb_items(r.config.update))
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert {k: config[k] for k in resolved} == resolved
    assert (config["mixer_name"], config["task_name"], config["seq_len"], config["lr"]) == (
        "attention", "stand_in", 16, cfg.optim.lr)

    # History: one row per logged step (a train line and an eval line of one step are one row).
    history: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {k: v for k, v in _wandb_items(r.history.item).items() if not k.startswith("_")}
            history.setdefault(r.history.step.num, {}).update(row)
    logged: dict[int, dict[str, Any]] = {}
    for line in _metrics(run_dir):
        logged.setdefault(line["step"], {}).update({k: v for k, v in line.items() if k != "step"})
    assert history == logged and {"eval/acc@32", "train/loss"} <= logged[4].keys()

    summary: dict[str, Any] = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(_wandb_items(r.summary.update))
    written = {k: v for k, v in _summary(run_dir).items() if k != "config"}
    assert {k: summary.get(k) for k in written} == written
    assert written["status"] == "completed" and written["device"] == "cpu"


def test_disabled_wandb_is_never_imported(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules makes any `import wandb` raise ImportError.
    monkeypatch.setitem(sys.modules, "wandb", None)
    summary = train(make_cfg("trainer.max_steps=2"), tmp_path, mixer_name="attention")
    assert summary["status"] == "completed"


def test_command_line_multirun_goes_on_after_a_failing_job(tmp_path: Path) -> None:
    """`python train.py -m ...`: the sweep goes on after a failing job. (A failing single run from the
    command line: tests/test_progress.py, test_a_failing_run_prints_its_traceback_once.)"""
    tiny = CLI_TINY
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sweep = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            *tiny,
            "trainer.max_steps=3,0",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    # The sweep goes on after the failing job, and ends with one line per status and exit 1.
    said = sweep.stdout + sweep.stderr
    assert sweep.returncode == 1 and "1 of 2 jobs did not finish" in said, said[-2000:]
    assert re.search(r"completed +1\n", said)
    assert re.search(r"failed +1: \S*trainer.max_steps=0\S* \(ValueError: trainer.max_steps=0", said), said
    # each job in its directory, named by its overrides; the config error recorded in its own, new one
    runs = {p.parent.name: p.parent for p in (tmp_path / "sweep").rglob("summary.json")}
    assert set(runs) == {"trainer.max_steps=3", "trainer.max_steps=0"}
    assert _summary(runs["trainer.max_steps=3"])["status"] == "completed"
    assert _summary(runs["trainer.max_steps=3"])["mixer"] == "attention"
    assert _summary(runs["trainer.max_steps=0"])["status"] == "failed"
    assert (runs["trainer.max_steps=3"] / "train.log").exists()
    assert (runs["trainer.max_steps=0"] / ".hydra" / "config.yaml").exists()


def test_a_run_on_a_gpu_records_which_of_the_machines_gpus_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.run import gpu_identity

    props = types.SimpleNamespace(name="NVIDIA H200", uuid="GPU-1234")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    # a block placed on GPUs 3 and 5: its second job's cuda:1 is the machine's GPU 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert gpu_identity(torch.device("cuda", 1)) == {
        "machine_index": "5", "name": "NVIDIA H200", "uuid": "GPU-1234"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_identity(torch.device("cuda", 2))["machine_index"] == "2"

    def no_driver(index: int) -> None:
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_driver)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert gpu_identity(torch.device("cuda", 0)) == {"machine_index": "7"}


def test_device_auto_packs_multirun_jobs_round_robin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv(GPU_ENV, raising=False)
    packed = [resolve_device("auto", job_num) for job_num in range(6)]
    assert packed == [torch.device("cuda", i) for i in (0, 1, 2, 3, 0, 1)]
    # the GPU the local launcher gave the job wins over its number
    monkeypatch.setenv(GPU_ENV, "2")
    assert resolve_device("auto", 1) == torch.device("cuda", 2)
    monkeypatch.setenv(GPU_ENV, "6")
    assert resolve_device("auto", 1) == torch.device("cuda", 2)
    monkeypatch.delenv(GPU_ENV)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda:3") == torch.device("cuda", 3)
    # bare `cuda` is the current GPU, with its index: torch.cuda.set_device refuses a device without one
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert resolve_device("cuda") == torch.device("cuda", 2)
    with pytest.raises(ValueError, match="cuda:4"):
        resolve_device("cuda:4")
    with pytest.raises(ValueError, match="trainer.device='gpu'"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", 3) == torch.device("cpu")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")


def test_schedule_and_batch_order() -> None:
    factors = [lr_factor(s, warmup_steps=10, max_steps=100, min_lr_ratio=0.1) for s in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(factors[:9], factors[1:10], strict=True))  # warmup rises
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))  # cosine falls
    assert factors[100] == pytest.approx(0.1)
    # Batches walk a fresh permutation per epoch: every sequence once per epoch, across batch borders.
    sampler = EpochSampler(num_train=10, batch_size=4, seed=0)
    order = torch.cat([sampler.indices(step) for step in range(5)])  # 20 draws = 2 epochs
    assert sorted(order[:10].tolist()) == sorted(order[10:].tolist()) == list(range(10))
    assert not torch.equal(order[:10], order[10:])
    assert torch.equal(EpochSampler(10, 4, seed=0).indices(3), sampler.indices(3))


def test_fast_step_is_on_by_default_on_cuda_only_and_either_switch_forces(make_cfg: MakeCfg,
                                                                            tmp_path: Path) -> None:
    from harness.config import fast_step, validate

    default = make_cfg()
    assert (default.trainer.compile, default.model.lean_backward) == ("auto", "auto")
    assert fast_step(default, "cuda") == (True, False)
    assert fast_step(default, "cpu") == (False, False)
    assert fast_step(make_cfg("trainer.compile=false"), "cuda") == (False, False)
    assert fast_step(make_cfg("trainer.compile=true"), "cpu") == (True, False)
    assert fast_step(make_cfg("model.lean_backward=true"), "cpu") == (False, True)
    assert fast_step(make_cfg("model.lean_backward=true"), "cuda") == (True, True)
    for override, key in (("trainer.compile=yes", "trainer.compile"),
                          ("model.lean_backward=1", "model.lean_backward")):
        with pytest.raises(ValueError, match=rf"^{re.escape(key)}.*choose auto, true or false$"):
            validate(make_cfg(override))
    # a CPU run takes the eager, plain step and says so in its summary
    summary = train(make_cfg("trainer.max_steps=3", "trainer.eval_every=3"), tmp_path,
                          mixer_name="attention")
    assert (summary["compile"], summary["lean_backward"], summary["cuda_graphs"]) == (False, False, False)
    assert summary["first_step_s"] > 0 and summary["compile_memory_budget"] is None
    # the allocator's peaks are CUDA figures
    assert not {"peak_memory_gib", "train_peak_memory_gib", "eval_peak_memory_gib"} & summary.keys()
    assert "| eager | plain backward" in (tmp_path / "train.log").read_text()
    for value in ("0.0", "1.5", "-0.2"):
        with pytest.raises(ValueError, match=rf"^trainer.compile_memory_budget={value}: must be in \(0, 1\]"):
            validate(make_cfg(f"trainer.compile_memory_budget={value}"))
    validate(make_cfg("trainer.compile_memory_budget=0.8"))


def test_each_job_of_an_in_process_sweep_compiles_and_an_eager_fallback_fails(
        make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs of an in-process sweep (hydra's basic launcher) compile one after another into the same code
    object's cache; past torch's recompile limit dynamo would run the body eager under a `compile: true`
    summary. Each run starts from an empty cache, so every job compiles; a run whose first step still
    compiled nothing fails with one line, recorded, instead of training eager under the compiled label."""
    import torch._dynamo

    compile_ = torch.compile
    # dynamo's tracing and its recompile limit without inductor's code generation, which takes minutes here
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: compile_(fn, backend="eager"))
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    common = ("trainer.compile=true", "trainer.max_steps=2", "trainer.eval_every=2")
    for job, (mixer, width) in enumerate((("attention", 32), ("linear_attn", 48), ("attention", 64))):
        summary = train(make_cfg(*common, f"mixer={mixer}", f"model.d_model={width}"), tmp_path / str(job),
                        mixer_name=mixer)
        assert summary["status"] == "completed" and summary["compile"] is True, summary
    monkeypatch.setattr(torch._dynamo.config, "disable", True)  # torch.compile then returns the eager body
    eager = (r"^trainer.compile: the first step compiled nothing, so the body ran eager .*"
             r"set trainer.compile=false to train eager on purpose$")
    with pytest.raises(RuntimeError, match=eager):
        train(make_cfg(*common), tmp_path / "eager", mixer_name="attention")
    summary = json.loads((tmp_path / "eager" / "summary.json").read_text())
    assert summary["status"] == "failed" and "compiled nothing" in summary["error"]
    assert not (tmp_path / "eager" / "checkpoint.pt").exists()


def test_cuda_graphs_are_refused_where_there_is_no_compiled_body_on_a_gpu(make_cfg: MakeCfg,
                                                                          tmp_path: Path) -> None:
    """trainer.cuda_graphs replays the compiled body on a CUDA device: auto by default; with the body not
    compiled or the device the CPU, one line naming the key and the fix, before a run directory exists;
    a run that resolves to the CPU (no GPU here) is refused before its first step, nothing trained."""
    from harness.config import validate

    assert make_cfg().trainer.cuda_graphs == "auto"
    with pytest.raises(ValueError, match=r"^trainer.cuda_graphs=true: it replays the compiled body, and "
                                         r"trainer.compile=false; set trainer.compile=auto"):
        validate(make_cfg("trainer.cuda_graphs=true", "trainer.compile=false", "trainer.device=auto"))
    with pytest.raises(ValueError, match=r"^trainer.cuda_graphs=true: CUDA graphs need a CUDA device, and "
                                         r"trainer.device=cpu"):
        validate(make_cfg("trainer.cuda_graphs=true", "trainer.device=cpu"))
    validate(make_cfg("trainer.cuda_graphs=true", "trainer.device=auto"))
    # auto never refuses: it replays only where the body is compiled on CUDA
    validate(make_cfg("trainer.cuda_graphs=auto", "trainer.device=cpu", "trainer.compile=false"))
    with pytest.raises(ValueError, match=r"^trainer.cuda_graphs='sometimes': choose auto, true or false$"):
        validate(make_cfg("trainer.cuda_graphs=sometimes"))
    if not torch.cuda.is_available():
        summary = train(make_cfg("trainer.cuda_graphs=auto", "trainer.device=auto", "trainer.max_steps=3",
                                 "trainer.eval_every=3"), tmp_path / "auto", mixer_name="attention")
        assert summary["status"] == "completed" and summary["cuda_graphs"] is False, summary
        assert ", CUDA graphs" not in (tmp_path / "auto" / "train.log").read_text()
        refused = r"^trainer.cuda_graphs=true: CUDA graphs replay the compiled body on a CUDA device, and " \
                  r"this run is on cpu; run it on a GPU"
        with pytest.raises(ValueError, match=refused):
            train(make_cfg("trainer.cuda_graphs=true", "trainer.device=auto", "trainer.max_steps=3"),
                  tmp_path, mixer_name="attention")
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["steps"] == 0, summary
        assert not (tmp_path / "checkpoint.pt").exists()


def test_model_recompute_is_checked_and_applied_to_the_compiled_body_only(
        make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """model.recompute names what the compiled body recomputes in its backward: a part it cannot recompute is
    one line naming the value and the choices, before a run directory exists; a compiled run's layers get
    the parts and its summary says them; an eager run keeps everything and says []."""
    import torch._dynamo

    from harness import run as run_module
    from harness.config import validate

    assert make_cfg().model.recompute == []
    refused = r"^model.recompute=\['qk', 'everything'\]: 'everything' is not a part it can recompute; " \
              r"choose from qk_norm, qk, swiglu, mlp"
    with pytest.raises(ValueError, match=refused):
        validate(make_cfg("model.recompute=[qk,everything]"))
    assert not (tmp_path / "eager").exists()
    common = ("mixer=kda", "model.recompute=[qk,mlp]", "trainer.max_steps=2", "trainer.eval_every=2")
    summary = train(make_cfg(*common), tmp_path / "eager", mixer_name="kda")
    assert summary["status"] == "completed" and summary["compile"] is False and summary["recompute"] == []
    compile_ = torch.compile
    # dynamo's tracing without inductor's code generation, which takes minutes here
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: compile_(fn, backend="eager"))
    built = []
    model_of = run_module._model
    monkeypatch.setattr(run_module, "_model", lambda *a, **k: built.append(model_of(*a, **k)) or built[-1])
    summary = train(make_cfg(*common, "trainer.compile=true"), tmp_path / "compiled", mixer_name="kda")
    assert summary["status"] == "completed" and summary["recompute"] == ["mlp", "qk"], summary
    assert all(block.mixer.recompute == block.mlp.recompute == {"qk", "mlp"} for block in built[0].blocks)

def test_a_run_whose_cuda_graphs_inductor_skipped_says_so(make_cfg: MakeCfg, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto` replays the compiled body as CUDA graphs, but inductor may skip them (a CPU tensor, a mutated
    input) and step kernel by kernel: the run goes on, says so in its log, and its summary says
    `cuda_graphs: false`; `true` fails with one line instead. Here the skip is inductor's counter bumped
    at the first call of a body that dynamo traces without inductor (whose code generation takes minutes
    on the CPU); that it is the counter inductor bumps is tests/test_bench_train.py's."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from harness import run as run_module
    from harness.trainer import graphs_after_a_skip

    compile_ = torch.compile

    def skipping(fn, mode=None):  # noqa: ANN001, ANN202 (torch.compile's signature)
        compiled = compile_(fn, backend="eager")

        def call(tokens):  # noqa: ANN001, ANN202
            counters["inductor"]["cudagraph_skips"] += mode == "reduce-overhead"
            return compiled(tokens)
        return call

    monkeypatch.setattr(torch, "compile", skipping)
    monkeypatch.setattr(run_module, "replays_graphs", lambda cfg, compiled, device_type: compiled)
    summary = train(make_cfg("trainer.compile=true", "trainer.max_steps=2", "trainer.eval_every=2"), tmp_path,
                    mixer_name="attention")
    assert summary["status"] == "completed" and summary["compile"] is True, summary
    assert summary["cuda_graphs"] is False, summary
    log = (tmp_path / "train.log").read_text()
    assert ", CUDA graphs" in log and "inductor skipped the CUDA graphs" in log
    assert graphs_after_a_skip("auto") is False
    with pytest.raises(RuntimeError, match=r"^trainer.cuda_graphs=true: inductor skipped the CUDA graphs of "
                                           r"the first step .* set trainer.cuda_graphs=auto"):
        graphs_after_a_skip(True)

def test_graph_steps_marks_a_new_step_before_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's and the step benchmark's wrapper of a reduce-overhead body: every call (a training
    step, an eval batch) begins a new CUDA-graph step first, then runs the body on the same tokens."""
    from harness.step import graph_steps

    events: list[str] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: events.append("mark"))
    body = graph_steps(lambda tokens: events.append("body") or tokens + 1)
    out = body(torch.zeros(2))
    body(torch.zeros(2))
    assert events == ["mark", "body", "mark", "body"]
    assert torch.equal(out, torch.ones(2))


def test_the_peak_memory_splits_into_the_steps_and_the_evals(monkeypatch: pytest.MonkeyPatch) -> None:
    """PhasePeaks against a stand-in for CUDA's allocator statistics: a reset drops the peak to what is
    held, and each phase keeps the highest peak of its stretches."""
    from harness.trainer import PhasePeaks

    held, peak = 1 * 2**30, {"now": 0}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: peak["now"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: peak.update(now=held))
    peaks = PhasePeaks(torch.device("cuda", 0))
    for phase, gib in (("train", 9), ("eval", 12), ("train", 10), ("eval", 11)):
        peak["now"] = max(peak["now"], gib * 2**30)
        peaks.ended(phase)
    peak["now"] = int(9.5 * 2**30)  # the steps after the last eval
    assert peaks.summary() == {"peak_memory_gib": 12.0, "train_peak_memory_gib": 10.0,
                               "eval_peak_memory_gib": 12.0}
    assert PhasePeaks(torch.device("cpu")).summary() == {}
