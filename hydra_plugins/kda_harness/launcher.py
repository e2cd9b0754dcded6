"""`hydra/launcher=local`: n_jobs runs at once on this machine (or jobs_per_gpu on each of its GPUs), each
in a process of its own, so that one run killed from outside (the OOM killer, `kill -9`) is recorded and the
others go on.

Each job is a fork of the sweep's process, started when a slot is free; nothing is shared between jobs, so
a job that dies takes nobody with it (joblib's loky pool, by contrast, breaks as a whole when one worker
dies, and the sweep with it). A job that dies by a signal before it could record anything gets a `failed`
summary.json naming the signal, under the run directory's lock; a job that exits on its own has recorded
its status itself (train.py: `incomplete` for SIGTERM or Ctrl-C). Jobs die with the sweep: each asks the
kernel for SIGTERM when the sweep's process ends (Linux), which train.py turns into a checkpoint, so a
killed sweep leaves no orphan training on. The job takes its run directory's lock before Hydra writes into
it, so a job whose directory another process is using is refused before it changes anything.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.check import GPU_ENV, usable_cores
from harness.gpus import runs_at_once, visible_gpus
from harness.rundir import FileUnreadable, ResumeRefused, RunDir, RunDirBusy, RunDirError

log = logging.getLogger("kda_harness.launcher")

# prctl(2): ask for a signal when the parent process ends
_PR_SET_PDEATHSIG = 1


class WorkerDied(RuntimeError):
    """A job's process ended without reporting a result."""


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: a killed sweep leaves its jobs running to their end
        return
    if os.getppid() != parent:  # the parent ended before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _run_dir(sweep_config: DictConfig) -> Path:
    return Path(str(OmegaConf.select(sweep_config, "hydra.sweep.dir"))) / str(
        OmegaConf.select(sweep_config, "hydra.sweep.subdir"))


def inside_sweep(run_dir: Path, sweep_dir: Path) -> bool:
    """True when `run_dir` (`..` resolved) lies inside `sweep_dir`: a subdir pattern that interpolates an
    override's value must not place a job's files elsewhere."""
    run, sweep = Path(os.path.abspath(run_dir)), Path(os.path.abspath(sweep_dir))
    return run != sweep and sweep in run.parents


# What a refused job's message names, back to its class in the sweep's process (the report tells a
# directory in use by another process from one that holds a run of another config).
_REFUSALS = {cls.__name__: cls for cls in (RunDirBusy, ResumeRefused, RunDirError)}


def _job(conn: multiprocessing.connection.Connection, parent: int, hydra_context: HydraContext,
         sweep_config: DictConfig, task_function: TaskFunction, singleton_state: dict[Any, Any],
         threads: int, gpu: int | None = None) -> None:
    """One job, in its own process: its result goes back through `conn`; `gpu`, the GPU the launcher gave
    it, is what trainer.device=auto takes."""
    _die_with_parent(parent)
    if gpu is not None:
        os.environ[GPU_ENV] = str(gpu)
    # the machine's cores shared among the jobs running at once (trainer.cpu_threads, if set, overrides):
    # torch's default of one thread per core in every job oversubscribes the CPU n_jobs-fold, and a GPU
    # run of a small model waits on its Python thread to launch kernels
    torch.set_num_threads(threads)
    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    try:
        run_dir = _run_dir(sweep_config)
        if not inside_sweep(run_dir, Path(str(sweep_config.hydra.sweep.dir))):
            raise ValueError(f"the job's directory {run_dir} is not inside the sweep directory "
                             f"{sweep_config.hydra.sweep.dir}: an override value in hydra.sweep.subdir holds "
                             "`..` or `/`; name the subdir with ${override_path:}")
        with RunDir(run_dir).lock():
            result = run_job(hydra_context=hydra_context, config=sweep_config, task_function=task_function,
                             job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    except RunDirError as error:
        conn.send(("refused", (type(error).__name__, str(error))))
        return
    except (KeyboardInterrupt, SystemExit) as interrupt:
        # train.py recorded the run `incomplete` (or it never started); the exit status says which signal
        conn.send(("interrupted", f"{type(interrupt).__name__}: {interrupt}"))
        raise
    except BaseException as error:
        # outside the task function (Hydra making the directory, its logging): nothing recorded it
        conn.send(("error", f"{type(error).__name__}: {error}"))
        raise
    try:
        conn.send(("done", result))
    except Exception:  # noqa: BLE001 - a return value that does not pickle: its status is in the run dir
        conn.send(("done", JobReturn(overrides=result.overrides, hydra_cfg=result.hydra_cfg,
                                     status=result.status, _return_value=None)))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def record_death(run_dir: Path, cause: str) -> bool:
    """Mark the run `failed` with `cause` (its summary.json, a line in train.log); False when another
    process holds the run directory (then it is that process's to record)."""
    rundir = RunDir(run_dir)
    try:
        with rundir.lock():
            try:
                summary = rundir.read_summary() or {}
            except FileUnreadable:
                summary = {}
            summary.update(status="failed", error=cause)
            rundir.write_summary(summary)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            with open(rundir.log, "a") as handle:
                handle.write(f"[{stamp}][kda_harness.launcher][ERROR] - {cause}\n")
    except RunDirError:
        return False
    return True


def least_loaded(busy: Sequence[int], gpus: int) -> int:
    """The GPU (of `gpus`) running the fewest of `busy` (the GPUs of the jobs running now), the lowest on a
    tie: a job that starts when another ends goes where that one was, not round-robin by its number onto a
    GPU still busy while another idles (runs stopped early end at very different times)."""
    return min(range(gpus), key=lambda gpu: (sum(b == gpu for b in busy), gpu))


class LocalLauncher(Launcher):
    def __init__(self, n_jobs: int | None = None, stop_timeout_s: float = 60.0,
                 jobs_per_gpu: int | None = None) -> None:
        """`n_jobs` runs at once (<= 0: one per CPU core, less -n_jobs); where n_jobs is None, `jobs_per_gpu`
        on each GPU the machine shows (on a machine without one, that many on the CPU); neither: one at a
        time. n_jobs wins where both are set, so `hydra.launcher.n_jobs=K` forces K over a yaml's
        jobs_per_gpu. On Ctrl-C the running jobs get `stop_timeout_s` to checkpoint before they are killed."""
        # (the launcher's yaml is untyped: a misspelt value arrives as it was written)
        if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int)):
            raise ValueError(f"hydra.launcher.n_jobs={n_jobs!r}: give the number of runs at once, an integer "
                             "(<= 0: one per CPU core, less that many), or null for jobs_per_gpu's")
        if jobs_per_gpu is not None and (isinstance(jobs_per_gpu, bool) or not isinstance(jobs_per_gpu, int)
                                         or jobs_per_gpu < 1):
            raise ValueError(f"hydra.launcher.jobs_per_gpu={jobs_per_gpu!r}: give the runs per GPU, an "
                             "integer >= 1, or null for n_jobs runs at once")
        self.n_jobs = n_jobs if n_jobs is None or n_jobs > 0 else max(1, usable_cores() + n_jobs)
        self.given_n_jobs = n_jobs
        self.jobs_per_gpu = jobs_per_gpu
        self.stop_timeout_s = stop_timeout_s
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def at_once(self, gpus: int) -> tuple[int, str]:
        """How many jobs run at once on a machine of `gpus` GPUs (runs_at_once), and why (for the log)."""
        if self.n_jobs is not None:
            why = f"n_jobs={self.given_n_jobs}" + (
                f": one per usable CPU core, less {-self.given_n_jobs}" if self.given_n_jobs <= 0 else "")
            if self.jobs_per_gpu is not None:  # n_jobs=K over joblib_gpu's default: say which one counts
                why += f", over jobs_per_gpu={self.jobs_per_gpu}"
        elif self.jobs_per_gpu is None:
            why = "neither n_jobs nor jobs_per_gpu set: one at a time"
        elif gpus < 1:
            why = f"jobs_per_gpu={self.jobs_per_gpu} on the CPU: no GPU visible"
        else:
            why = f"{self.jobs_per_gpu} per GPU x {gpus} GPU{'s' if gpus > 1 else ''}"
        return runs_at_once(self.n_jobs, self.jobs_per_gpu, gpus), why

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        gpus = visible_gpus()
        at_once, why = self.at_once(gpus)
        log.info("local launcher: %d jobs, %d at once (%s), sweep output dir %s", len(job_overrides), at_once,
                 why, self.config.hydra.sweep.dir)
        configs = []
        for index, overrides in enumerate(job_overrides):
            num = initial_job_idx + index
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{num}"
                sweep_config.hydra.job.num = num
            configs.append(sweep_config)
            log.info("\t#%d : %s", num, " ".join(filter_overrides(overrides)))
        singleton_state = Singleton.get_state()
        context = multiprocessing.get_context("fork")
        results: list[JobReturn | None] = [None] * len(configs)
        waiting = list(range(len(configs)))
        running: dict[int, tuple[Any, multiprocessing.connection.Connection]] = {}
        on_gpu: dict[int, int] = {}
        try:
            while waiting or running:
                while waiting and len(running) < at_once:
                    index = waiting.pop(0)
                    gpu = least_loaded([on_gpu[i] for i in running], gpus) if gpus else None
                    if gpu is not None:
                        on_gpu[index] = gpu
                    receive, send = context.Pipe(duplex=False)
                    process = context.Process(
                        target=_job, name=f"job {initial_job_idx + index}",
                        args=(send, os.getpid(), self.hydra_context, configs[index], self.task_function,
                              singleton_state, max(1, usable_cores() // at_once), gpu))
                    process.start()
                    send.close()
                    running[index] = (process, receive)
                watched = {process.sentinel: i for i, (process, _) in running.items()}
                watched.update({receive: i for i, (_, receive) in running.items()})
                for ready in multiprocessing.connection.wait(list(watched)):
                    index = watched[ready]
                    if index not in running:
                        continue
                    process, receive = running[index]
                    message = None
                    if receive.poll():
                        try:
                            message = receive.recv()
                        except (EOFError, OSError):
                            message = None
                    if message is None and process.is_alive():
                        continue
                    process.join()
                    receive.close()
                    del running[index]
                    results[index] = self._result(configs[index], job_overrides[index], process.exitcode,
                                                  message)
        except BaseException:
            self._stop([process for process, _ in running.values()])
            raise
        return [r for r in results if r is not None]

    def _result(self, sweep_config: DictConfig, overrides: Sequence[str], exitcode: int | None,
                message: tuple[str, Any] | None) -> JobReturn:
        if message is not None and message[0] == "done":
            return message[1]
        run_dir = _run_dir(sweep_config).resolve()
        hydra_cfg = OmegaConf.create({"hydra": OmegaConf.to_container(sweep_config.hydra, resolve=False)})
        with open_dict(hydra_cfg):
            hydra_cfg.hydra.runtime.output_dir = str(run_dir)
        if message is not None and message[0] == "refused":  # the directory is another process's or config's
            kind, why = message[1]
            error: Exception = _REFUSALS.get(kind, RunDirError)(why)
            log.error("job %s refused: %s: %s", sweep_config.hydra.job.num, kind, why)
        elif message is not None and message[0] == "error":
            num = sweep_config.hydra.job.num
            error = WorkerDied(f"job {num} failed before its run started: {message[1]}")
            log.error("%s", error)
        elif message is not None and message[0] == "interrupted":
            # it stopped on an interrupt (train.py recorded `incomplete`): the run directory says so
            return JobReturn(overrides=list(overrides), hydra_cfg=hydra_cfg, status=JobStatus.COMPLETED,
                             _return_value=float("nan"))
        elif exitcode is not None and exitcode < 0:
            cause = (f"the job's process (job {sweep_config.hydra.job.num}) was killed by "
                     f"{_signal_name(-exitcode)}" + (" (the out-of-memory killer sends it)"
                                                     if -exitcode == signal.SIGKILL else "")
                     + "; re-launching the sweep retries the run (from its checkpoint, if it has one)")
            recorded = record_death(run_dir, cause)
            log.error("%s%s", cause, "" if recorded else f" (not recorded: {run_dir} is in use)")
            error = WorkerDied(cause)
        else:
            error = WorkerDied(f"the job's process (job {sweep_config.hydra.job.num}) exited with status "
                               f"{exitcode} without reporting a result")
            log.error("%s", error)
        return JobReturn(overrides=list(overrides), hydra_cfg=hydra_cfg, status=JobStatus.FAILED,
                         _return_value=error)

    def _stop(self, processes: list[Any]) -> None:
        """The sweep stops (Ctrl-C): a few seconds for the jobs to stop on their own (a Ctrl-C in the
        terminal reached them too, and a second signal could cut their checkpoint), then SIGTERM to those
        still running (each checkpoints), and SIGKILL to any alive after `stop_timeout_s`."""
        deadline = time.monotonic() + 10.0
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.error("job %s did not stop within %.0f s: killed", process.name, self.stop_timeout_s)
                process.kill()
                process.join()

