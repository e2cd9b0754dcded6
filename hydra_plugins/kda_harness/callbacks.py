"""`hydra.callbacks.rundir_lock`: a single run takes its run directory's lock before Hydra writes into it.

Hydra saves `.hydra/config.yaml`, `hydra.yaml` and `overrides.yaml` into the run directory before it calls
train.py, so a second launch into a directory that a live run is using would overwrite the running run's
record of its config before train.py could refuse it. This callback takes the lock (rundir.RunDir) at the
start of the run, where nothing has been written yet, and holds it for the process's life; train.py takes
it again (the lock is re-entrant within a process). Sweeps: the `local` launcher does the same per job.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rundir import RunDir, RunDirError


class RunDirLock(Callback):
    def __init__(self) -> None:
        self._lock: AbstractContextManager[None] | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # resolved as run_job will resolve it: ${now:} caches its value, ${hydra:} needs the config set
        HydraConfig.instance().set_config(config)
        lock = RunDir(Path(str(OmegaConf.select(config, "hydra.run.dir")))).lock()
        try:
            lock.__enter__()
        except RunDirError as error:
            # Hydra turns a callback's exceptions into warnings and goes on, into the directory in use
            raise SystemExit(f"{type(error).__name__}: {error}") from None
        self._lock = lock

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None
