"""The local launcher's job process (hydra_plugins/kda_harness/launcher.py), in this process."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from hydra_plugins.kda_harness import launcher


class _Conn:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send(self, message: tuple) -> None:
        self.sent.append(message)


@pytest.mark.parametrize("threads", [1, 2])
def test_job_runs_with_its_share_of_the_cpu_threads(threads: int, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # the job sets torch's threads before the run starts (trainer.cpu_threads, applied by train.py inside
    # the run, still overrides): what the run sees is what it was given
    seen = []
    monkeypatch.setattr(launcher, "_die_with_parent", lambda parent: None)
    monkeypatch.setattr(launcher, "setup_globals", lambda: None)
    monkeypatch.setattr(launcher.Singleton, "set_state", lambda state: None)
    hydra_config = type("HydraConfigStub", (), {"set_config": lambda self, config: None})()
    monkeypatch.setattr(launcher.HydraConfig, "instance", lambda: hydra_config)
    monkeypatch.setattr(launcher, "run_job",
                        lambda **kwargs: seen.append(torch.get_num_threads()) or "result")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path), "subdir": "run0"}}})
    before = torch.get_num_threads()
    conn = _Conn()
    try:
        launcher._job(conn, 0, None, config, None, {}, threads)
    finally:
        torch.set_num_threads(before)
    assert seen == [threads] and conn.sent == [("done", "result")]


def test_visible_gpus_counts_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert launcher.visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert launcher.visible_gpus() == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "")  # no nvidia-smi: no GPU to give
    assert launcher.visible_gpus() == 0


def test_least_loaded_takes_the_gpu_with_fewest_running_jobs() -> None:
    assert launcher.least_loaded([], 4) == 0
    assert launcher.least_loaded([0, 1, 0], 3) == 2
    assert launcher.least_loaded([0, 1, 2, 0, 2], 3) == 1


def test_a_job_that_starts_when_another_ends_takes_the_gpu_that_freed(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # two GPUs, two jobs at a time: job 0 runs long and job 1 ends first, so job 2 goes to job 1's GPU,
    # where round-robin by number would put it beside job 0 and leave the other GPU idle
    monkeypatch.setattr(launcher, "visible_gpus", lambda: 2)
    monkeypatch.setattr(launcher, "setup_globals", lambda: None)
    monkeypatch.setattr(launcher, "configure_log", lambda *args: None)

    def job(conn, parent, context, config, task, state, threads, gpu=None) -> None:  # noqa: ANN001
        num = config.hydra.job.num
        time.sleep(2.0 if num == 0 else 0.2)
        (tmp_path / f"job{num}").write_text(str(gpu))
        conn.send(("done", num))

    monkeypatch.setattr(launcher, "_job", job)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "hydra_logging": {},
                                         "verbose": False}})
    loader = SimpleNamespace(load_sweep_config=lambda base, overrides: OmegaConf.create(
        {"hydra": {"job": {"name": "train"}, "sweep": {"dir": str(tmp_path)}}}))
    local = launcher.LocalLauncher(n_jobs=2)
    local.setup(hydra_context=SimpleNamespace(config_loader=loader), task_function=lambda cfg: None,
                config=config)
    assert local.launch([["a=1"], ["a=2"], ["a=3"]], initial_job_idx=0) == [0, 1, 2]
    assert [(tmp_path / f"job{num}").read_text() for num in range(3)] == ["0", "1", "1"]


@pytest.mark.parametrize(("n_jobs", "gpus"), [
    (4, ["0", "1", "0", "1"]),  # two runs a GPU, all at once
    (2, ["0", "1", "1", "1"]),  # one a GPU: jobs 2 and 3 follow job 1, which ends first, onto GPU 1
])
def test_a_sweep_spreads_over_the_gpus_through_the_job_processes(n_jobs: int, gpus: list[str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The path a job of hydra/launcher=joblib_gpu takes, in forked job processes as a sweep runs them, on a
    # CPU that claims two GPUs and 8 usable cores of 64 (an allocation's affinity): the GPU the launcher
    # picks reaches the run's environment, trainer.device=auto takes it, the summary's `gpu` names it, and
    # each job has its share of the usable cores.
    from harness.check import GPU_ENV, resolve_device
    from harness.run import gpu_identity

    monkeypatch.setattr(launcher, "visible_gpus", lambda: 2)
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(name="H200", uuid=f"GPU-{index}"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(GPU_ENV, raising=False)
    for name in ("setup_globals", "configure_log"):
        monkeypatch.setattr(launcher, name, lambda *args: None)
    monkeypatch.setattr(launcher.Singleton, "set_state", lambda state: None)
    hydra_config = type("HydraConfigStub", (), {"set_config": lambda self, config: None})()
    monkeypatch.setattr(launcher.HydraConfig, "instance", lambda: hydra_config)

    def run_job(config: Any, **kwargs: object) -> int:  # the run, as far as where it computes
        num = config.hydra.job.num
        time.sleep(1.5 if num == 0 else 0.0)  # job 0 holds its GPU while the others come and go
        device = resolve_device("auto", num)
        record = {"env": os.environ.get(GPU_ENV), "device": str(device), "gpu": gpu_identity(device),
                  "threads": torch.get_num_threads()}
        (tmp_path / "sweep" / f"job{num}" / "summary.json").write_text(json.dumps(record))
        return num

    monkeypatch.setattr(launcher, "run_job", run_job)
    sweep = str(tmp_path / "sweep")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": sweep}, "hydra_logging": {}, "verbose": False}})
    loader = SimpleNamespace(load_sweep_config=lambda base, overrides: OmegaConf.create(
        {"hydra": {"job": {"name": "train"}, "sweep": {"dir": sweep, "subdir": f"job{overrides[0]}"}}}))
    local = launcher.LocalLauncher(n_jobs=n_jobs)
    local.setup(hydra_context=SimpleNamespace(config_loader=loader), task_function=lambda cfg: None,
                config=config)
    before = torch.get_num_threads()
    try:
        assert local.launch([[str(num)] for num in range(4)], initial_job_idx=0) == [0, 1, 2, 3]
    finally:
        torch.set_num_threads(before)
    records = [json.loads((tmp_path / "sweep" / f"job{num}" / "summary.json").read_text())
               for num in range(4)]
    assert [r["env"] for r in records] == gpus
    assert [r["device"] for r in records] == [f"cuda:{gpu}" for gpu in gpus]
    assert [r["gpu"] for r in records] == [{"machine_index": gpu, "name": "H200", "uuid": f"GPU-{gpu}"}
                                           for gpu in gpus]
    assert {r["threads"] for r in records} == {8 // n_jobs}


def test_n_jobs_that_is_not_a_number_is_named() -> None:
    """A misspelt n_jobs reached the launcher as a string and failed as a TypeError comparing it with 0."""
    from hydra_plugins.kda_harness.launcher import LocalLauncher

    for bad in ("abc", 2.5, True):
        with pytest.raises(ValueError, match=rf"hydra.launcher.n_jobs={bad!r}: give the number of runs"):
            LocalLauncher(n_jobs=bad)  # type: ignore[arg-type]
    assert LocalLauncher(n_jobs=3).n_jobs == 3


def _stub_hydra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("setup_globals", "configure_log"):
        monkeypatch.setattr(launcher, name, lambda *args: None)
    monkeypatch.setattr(launcher.Singleton, "set_state", lambda state: None)
    hydra_config = type("HydraConfigStub", (), {"set_config": lambda self, config: None})()
    monkeypatch.setattr(launcher.HydraConfig, "instance", lambda: hydra_config)


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = running = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


@pytest.mark.parametrize(("visible", "n_jobs", "jobs_per_gpu", "at_once", "why"), [
    ("0,1", None, 2, 4, "2 per GPU x 2 GPUs"),
    ("3,5,6", None, 1, 3, "1 per GPU x 3 GPUs"),
    ("", None, 2, 2, "jobs_per_gpu=2 on the CPU: no GPU visible"),
    ("0,1", 3, 2, 3, "n_jobs=3, over jobs_per_gpu=2"),  # n_jobs, where set, wins
])
def test_jobs_per_gpu_runs_that_many_on_each_visible_gpu_at_once(
        visible: str, n_jobs: int | None, jobs_per_gpu: int, at_once: int, why: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Forked jobs of a sweep on a CPU whose CUDA_VISIBLE_DEVICES claims the GPUs (visible_gpus counts it;
    # the runs only record the GPU they were given) and 12 usable cores: each job records when it ran, its
    # GPU and its threads, so the jobs running at once, and on each GPU, are counted from what ran.
    from harness.check import GPU_ENV

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv(GPU_ENV, raising=False)
    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: set(range(12)))
    _stub_hydra(monkeypatch)

    def run_job(config: Any, **kwargs: object) -> int:
        num, start = config.hydra.job.num, time.monotonic()
        time.sleep(1.0)
        record = {"start": start, "end": time.monotonic(), "gpu": os.environ.get(GPU_ENV),
                  "threads": torch.get_num_threads()}
        (tmp_path / "sweep" / f"job{num}" / "summary.json").write_text(json.dumps(record))
        return num

    monkeypatch.setattr(launcher, "run_job", run_job)
    sweep, jobs = str(tmp_path / "sweep"), 2 * at_once
    config = OmegaConf.create({"hydra": {"sweep": {"dir": sweep}, "hydra_logging": {}, "verbose": False}})
    loader = SimpleNamespace(load_sweep_config=lambda base, overrides: OmegaConf.create(
        {"hydra": {"job": {"name": "train"}, "sweep": {"dir": sweep, "subdir": f"job{overrides[0]}"}}}))
    local = launcher.LocalLauncher(n_jobs=n_jobs, jobs_per_gpu=jobs_per_gpu)
    local.setup(hydra_context=SimpleNamespace(config_loader=loader), task_function=lambda cfg: None,
                config=config)
    before = torch.get_num_threads()
    try:
        with caplog.at_level("INFO", logger="kda_harness.launcher"):
            assert local.launch([[str(num)] for num in range(jobs)], initial_job_idx=0) == list(range(jobs))
    finally:
        torch.set_num_threads(before)
    records = [json.loads((tmp_path / "sweep" / f"job{num}" / "summary.json").read_text())
               for num in range(jobs)]
    assert _most_at_once([(r["start"], r["end"]) for r in records]) == at_once
    assert f"{jobs} jobs, {at_once} at once ({why})" in caplog.text
    assert {r["threads"] for r in records} == {12 // at_once}
    gpus = len([entry for entry in visible.split(",") if entry])
    if not gpus:
        assert {r["gpu"] for r in records} == {None}
        return
    # spread: the first wave takes every GPU, as evenly as its number allows, and no GPU ever holds more
    # than its share
    first = Counter(r["gpu"] for r in sorted(records, key=lambda r: r["start"])[:at_once])
    assert set(first) == {str(gpu) for gpu in range(gpus)} and max(first.values()) - min(first.values()) <= 1
    share = -(-at_once // gpus)
    for gpu in range(gpus):
        spans = [(r["start"], r["end"]) for r in records if r["gpu"] == str(gpu)]
        assert _most_at_once(spans) <= share


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3", "abc"])
def test_jobs_per_gpu_that_is_not_a_count_of_runs_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"^hydra.launcher.jobs_per_gpu={bad!r}: give the runs per GPU, an "
                                         r"integer >= 1, or null for n_jobs runs at once$"):
        launcher.LocalLauncher(n_jobs=None, jobs_per_gpu=bad)  # type: ignore[arg-type]


def test_neither_n_jobs_nor_jobs_per_gpu_runs_one_at_a_time() -> None:
    assert launcher.LocalLauncher(n_jobs=None, jobs_per_gpu=None).at_once(8) == (
        1, "neither n_jobs nor jobs_per_gpu set: one at a time")


@pytest.mark.parametrize(("overrides", "gpus", "at_once"), [
    (["hydra/launcher=joblib_gpu"], 8, 24),  # the default, 3 a GPU, on whatever the machine shows
    (["hydra/launcher=joblib_gpu"], 1, 3),
    (["hydra/launcher=joblib_gpu"], 0, 3),
    (["hydra/launcher=joblib_gpu", "hydra.launcher.jobs_per_gpu=1"], 8, 8),
    (["hydra/launcher=joblib_gpu", "hydra.launcher.n_jobs=5"], 8, 5),  # n_jobs=K still forces K
    (["hydra/launcher=local"], 8, 2),  # local keeps its n_jobs: 2, GPUs or not
    (["hydra/launcher=local", "hydra.launcher.n_jobs=null", "hydra.launcher.jobs_per_gpu=2"], 4, 8),
])
def test_the_launcher_yamls_compose_to_runs_at_once(overrides: list[str], gpus: int, at_once: int) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    import harness.config  # noqa: F401  (train.py's schema)

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    assert instantiate(cfg.hydra.launcher).at_once(gpus)[0] == at_once
