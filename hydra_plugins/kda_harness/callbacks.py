"""`hydra.callbacks.rundir_lock`: a single run is checked and takes its run directory's lock before Hydra
makes the directory; a sweep tells its workers its pid.

Hydra makes the run directory (and, with its default `hydra.output_subdir`, writes `.hydra/` into it) before
it calls train.py. So for a single run this callback first checks the config (harness.check.preflight): a
config that cannot train ends the launch with one line and leaves no directory behind. Then it takes the
lock (harness.rundir.RunDir) and holds it for the process's life, so that a second launch into a directory
a live run is using changes nothing; train.py takes it again (the lock is re-entrant within a process).
Sweeps: the `local` launcher takes each job's lock itself; for every launcher the sweep's pid goes to the
environment of the workers it starts, so that they stop when it dies (harness.signals.die_with_sweep).
"""

from __future__ import annotations

import copy
import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from harness.rundir import RunDir, RunDirError
from harness.signals import SWEEP_PID


class RunDirLock(Callback):
    def __init__(self) -> None:
        self._lock: AbstractContextManager[None] | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        os.environ[SWEEP_PID] = str(os.getpid())

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from harness.check import ConfigError, one_line_error, preflight

        # resolved as run_job will resolve it: ${now:} caches its value, ${hydra:} needs the config set
        HydraConfig.instance().set_config(config)
        task_cfg = copy.deepcopy(config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        try:
            preflight(task_cfg, mixer_name=config.hydra.runtime.choices.get("mixer"))
        except ConfigError as error:
            # Hydra turns a callback's exceptions into warnings and goes on: SystemExit ends the launch
            raise SystemExit(one_line_error(error)) from None
        lock = RunDir(Path(str(OmegaConf.select(config, "hydra.run.dir")))).lock()
        try:
            lock.__enter__()
        except RunDirError as error:
            raise SystemExit(f"{type(error).__name__}: {error}") from None
        self._lock = lock

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None
