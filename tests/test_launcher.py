"""The local launcher's job process (hydra_plugins/kda_harness/launcher.py), in this process."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

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
