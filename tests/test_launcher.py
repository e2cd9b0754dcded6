"""The local launcher's job process (hydra_plugins/kda_harness/launcher.py), in this process."""

from __future__ import annotations

from pathlib import Path

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
