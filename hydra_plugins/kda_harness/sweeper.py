"""Hydra's basic sweeper, plus an end-of-sweep report: one line per status, and a non-zero exit code when a
job failed or did not finish.

A job's status is its run directory's summary.json (train.py writes it, or the local launcher for a job
killed from outside); `refused` when its run directory refused the launch (it records nothing: another
process is writing there, or the directory holds a run of another config); `failed` when the job raised.
The report goes to the console after the last job; `SweepFailed` makes Hydra exit 1 when a job failed, is
incomplete, or was refused because its directory holds another config (the requested run did not happen).
A job refused only because another live process is training it (the same sweep launched twice) is not a
failure: that process records its outcome, and the sweep exits 0 if nothing else went wrong.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.utils import JobReturn, JobStatus, configure_log
from hydra.errors import CompactHydraException

from harness.rundir import FINISHED, STATUSES, FileUnreadable, RunDir, RunDirBusy, RunDirError

log = logging.getLogger("kda_harness.sweep")

# The report lists the statuses in rundir's order, then the refused jobs; any but the FINISHED ones (and a
# refusal because another process runs the job: `busy`) makes the sweep exit non-zero.
REFUSED = "refused"
ORDER = (*STATUSES, REFUSED)


class SweepFailed(CompactHydraException):
    """Some job of the sweep failed or did not finish (Hydra prints the message and exits 1)."""


def job_status(job: JobReturn) -> tuple[str, str, str | None]:
    """(run name, status, reason) of one job."""
    hydra_cfg = job.hydra_cfg.hydra if job.hydra_cfg is not None else None
    run_dir = Path(str(hydra_cfg.runtime.output_dir)) if hydra_cfg is not None else None
    name = str(hydra_cfg.job.override_dirname or hydra_cfg.job.num) if hydra_cfg is not None else "?"
    if job.status == JobStatus.FAILED:
        error = job._return_value
        status = REFUSED if isinstance(error, RunDirError) else "failed"
        return name, status, f"{type(error).__name__}: {error}"
    if run_dir is None:
        return name, "failed", "no run directory"
    try:
        summary = RunDir(run_dir).read_summary()
    except (FileUnreadable, OSError) as error:  # OSError: a name the file system cannot hold, ...
        return name, "failed", str(error)
    if summary is None:
        return name, "failed", f"no summary.json in {run_dir}"
    status = summary.get("status")
    status = status if status in ORDER else "failed"
    return name, status, None if status == "completed" else str(summary.get("error") or status)


def _busy(job: JobReturn) -> bool:
    """The job was refused because another live process trains in its run directory."""
    return job.status == JobStatus.FAILED and isinstance(job._return_value, RunDirBusy)


def report(jobs: Sequence[JobReturn], sweep_dir: str) -> tuple[list[str], int]:
    """The report's lines (a header, then one per status) and how many jobs did not finish (a job refused
    because another process trains it is not counted: that process records it)."""
    by_status: dict[str, list[tuple[str, str | None]]] = {}
    busy = 0
    for job in jobs:
        name, status, reason = job_status(job)
        by_status.setdefault(status, []).append((name, reason))
        busy += _busy(job)
    lines = [f"sweep {sweep_dir}: {len(jobs)} jobs"]
    for status in sorted(by_status, key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER)):
        runs = by_status[status]
        line = f"  {status:<10} {len(runs)}"
        if status != "completed":
            shown = [f"{name} ({(reason or '')[:160]})" for name, reason in runs[:5]]
            line += ": " + "; ".join(shown) + (f"; and {len(runs) - 5} more" if len(runs) > 5 else "")
        lines.append(line)
    unfinished = sum(len(runs) for status, runs in by_status.items() if status not in FINISHED) - busy
    if busy:
        lines.append(f"  ({busy} refused: another process is training them; it records their outcome)")
    return lines, unfinished


class _Recording:
    """Stands in for the sweeper's launcher: keeps every job's return, and hands the basic sweeper failed
    jobs as NaN results (it would raise on them and stop the sweep after the batch)."""

    def __init__(self, launcher: Any, jobs: list[JobReturn]) -> None:
        self.launcher, self.jobs = launcher, jobs

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        results = self.launcher.launch(job_overrides, initial_job_idx=initial_job_idx)
        self.jobs.extend(results)
        return [dataclasses.replace(r, status=JobStatus.COMPLETED, _return_value=math.nan)
                if r.status == JobStatus.FAILED else r for r in results]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.launcher, name)


class ReportingSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        jobs: list[JobReturn] = []
        launcher, self.launcher = self.launcher, _Recording(self.launcher, jobs)
        try:
            returns = super().sweep(arguments)
        finally:
            self.launcher = launcher
        assert self.config is not None
        # the last in-process job's logging may still write to its train.log: back to Hydra's own
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        lines, unfinished = report(jobs, str(self.config.hydra.sweep.dir))
        for line in lines:
            log.info(line)
        if unfinished:
            raise SweepFailed(
                f"{unfinished} of {len(jobs)} jobs did not finish (see above): summary.json and train.log in "
                "each run directory say why, a refused job's line the keys its directory's run differs in; "
                "launching the same command again retries the failed and incomplete ones and skips the "
                "finished ones")
        return returns
