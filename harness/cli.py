"""The Hydra application behind `python train.py` (and the `kda-train` command): one run, or one job of a
sweep. It composes conf/config.yaml, trains through harness.trainer.train, and turns what that raises into
what a single run prints and a sweep records (a config error, a refused directory, a failed run).
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, read_write

import harness.config  # noqa: F401  (stores the typed schema, `base_config`, that conf/config.yaml names)
from harness.check import ConfigError, one_line_error
from harness.run import Progress, make_summary, run_meta
from harness.rundir import RunDir, RunDirError
from harness.signals import Terminated, die_with_sweep, sweep_gone
from harness.trainer import train

log = logging.getLogger("train")

CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"


# An absolute config path: Hydra reads a relative one as a Python package when the app is a module's.
# The job's name (train.log, the `train` logger) is conf/config.yaml's hydra.job.name, not this module's.
@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the final eval accuracy (NaN if the run failed) for sweepers."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    run_dir, mixer_name = Path(hydra_cfg.runtime.output_dir), hydra_cfg.runtime.choices.get("mixer")
    if multirun:
        die_with_sweep()
    try:
        summary = train(cfg, run_dir, mixer_name=mixer_name, job_num=hydra_cfg.job.num if multirun else None,
                        sweep_dir=hydra_cfg.sweep.dir if multirun else None, hydra_files=hydra_files(cfg))
    except ConfigError as error:
        # found before training: one line, nothing written (the hydra.callbacks check catches it for a
        # single run before its directory is even made)
        if not multirun:
            raise SystemExit(one_line_error(error)) from None
        print(one_line_error(error), file=sys.stderr, flush=True)
        if record_config_error(cfg, run_dir, mixer_name, error):
            return float("nan")
        raise
    except RunDirError as error:
        # Nothing was written in the run directory (it belongs to another process, or to another config):
        # a single run ends with the reason; a sweep lists the job as refused.
        if not multirun:
            raise SystemExit(f"{type(error).__name__}: {error}") from None
        print(f"{run_dir}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        raise
    except Terminated:
        if multirun and sweep_gone():
            # the sweep that launched this worker is gone (its SIGTERM came through PDEATHSIG): the run
            # checkpointed; nobody waits for this process, so it ends rather than wait for the next job
            os._exit(128 + signal.SIGTERM)
        raise
    except Exception:
        # Recorded in summary.json and train.log already; a sweep goes on to its next job.
        if multirun:
            return float("nan")
        raise
    accuracy = summary.get("final_eval_acc")
    return float(accuracy) if accuracy is not None else 0.0


def hydra_files(cfg: DictConfig) -> dict[str, str]:
    """Hydra's record of this job's config (`.hydra/`: config.yaml, hydra.yaml, overrides.yaml), as Hydra
    writes it; train() writes it once the launch is accepted (conf/config.yaml turns Hydra's own writing,
    which comes before any check, off)."""
    hydra_node = copy.deepcopy(HydraConfig.instance().cfg)
    with read_write(hydra_node.hydra):
        hydra_node.hydra.output_subdir = ".hydra"
    return {"config.yaml": OmegaConf.to_yaml(cfg), "hydra.yaml": OmegaConf.to_yaml(hydra_node),
            "overrides.yaml": OmegaConf.to_yaml(hydra_node.hydra.overrides.task)}


def record_config_error(cfg: DictConfig, run_dir: Path, mixer_name: str | None, error: ConfigError) -> bool:
    """A sweep's job whose config cannot train is recorded `failed` (summary, .hydra/, train.log), so that
    the grid's tables and figures show the cell, but only in a directory that holds no run yet: an earlier
    run's files are never overwritten by a launch that was not accepted. False when nothing was recorded."""
    rundir = RunDir(run_dir)
    if any((run_dir / name).exists() for name in ("summary.json", "checkpoint.pt", "metrics.jsonl")):
        return False
    cause = error.__cause__ or error
    try:
        meta = run_meta(cfg, run_dir, mixer_name or "mixer")
        with rundir.lock():
            rundir.write_hydra(hydra_files(cfg))
            message = f"{type(cause).__name__}: {error}"
            log_file = logging.FileHandler(rundir.log, delay=True)
            log_file.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
            log_file.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, "config error, found before "
                                           "training:\n" + "".join(traceback.format_exception(cause)),
                                           None, None))
            log_file.close()
            rundir.write_summary(make_summary("failed", Progress(), meta, {"error": message}))
    except Exception:  # noqa: BLE001 - a config too broken to record (or a busy dir) is reported only
        return False
    return True
