"""A run directory: the one place that reads and writes its files, and the lock every writer takes.

    .lock           held (flock) by the one process that writes here; names it (pid, host, start time)
    .hydra/         the config of the launch that last trained here (written once the launch is accepted)
    summary.json    the run's outcome, written whole (temporary file + rename)
    checkpoint.pt   model + optimizer + scheduler + progress, written whole (temporary file + rename)
    metrics.jsonl   one JSON object per logged step, appended; cut back to the checkpoint's step on resume

Two processes in one directory would interleave their metrics and race on the checkpoint, so a second
writer is refused (`RunDirBusy`) while the first lives. The lock is the kernel's `flock`: it goes away
with its process however the process ends (SIGKILL, the OOM killer, a node reboot), so there is no stale
lock to clean up. It is re-entrant within one process (a launcher may take it before train.py does).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("train.rundir")

# What a run directory's summary says of its run. The first two are final: a re-launch never trains a
# completed or diverged run again; a failed or incomplete one it retries or resumes.
STATUSES = ("completed", "diverged", "failed", "incomplete")
FINISHED = STATUSES[:2]


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> one level with dotted keys (`{"task": {"seq_len": 8}}` -> `{"task.seq_len": 8}`)."""
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}{key}."))
    return flat


# The keys a checkpoint must hold to resume a run exactly.
CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "progress", "config")

# Locks this process holds: resolved lock path -> [file descriptor, depth]. flock locks belong to an open
# file, so a second open + flock of the same file in this process would conflict with the first.
_held: dict[str, list[int]] = {}


class RunDirError(RuntimeError):
    """This launch is refused; the run directory was left as it was (no summary written)."""


class RunDirBusy(RunDirError):
    """Another live process writes into the run directory."""


class ResumeRefused(RunDirError):
    """The run directory holds a run (its checkpoint, or a finished run's summary) of a config that this
    launch would change."""


class FileUnreadable(RuntimeError):
    """A run-directory file exists but cannot be read; the message names the file and what to do."""

    def __init__(self, path: Path, reason: str, fix: str) -> None:
        super().__init__(f"{path}: {reason}; {fix}")
        self.path, self.reason = path, reason


def _atomic_write(path: Path, write: Any) -> None:
    """Write via path.tmp (flushed to disk) and a rename, so that a kill or a full disk mid-write leaves the
    old file whole."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        # a partial file of a full disk holds the space the run's `failed` summary then needs
        tmp.unlink(missing_ok=True)
        raise


def read_metrics(path: Path | str) -> tuple[list[dict[str, Any]], list[str]]:
    """(records, problems) of a metrics.jsonl: every line that is a JSON object with an integer `step`,
    and one message per line that is not (with its line number), or whose step goes back."""
    path = Path(path)
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    lines = path.read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            where = "the last line" if number == len(lines) else f"line {number}"
            problems.append(f"{path.name} {where} is not JSON ({error.msg}; cut mid-write?)")
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            problems.append(f"{path.name} line {number} has no integer 'step': {line[:80]}")
            continue
        if records and step < records[-1]["step"]:
            problems.append(f"{path.name} line {number}: step {step} after step {records[-1]['step']}")
            continue
        records.append(record)
    return records, problems


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1-3, 7, 9-10' (for sorted steps)."""
    parts, start = [], None
    for index, step in enumerate(steps):
        if start is None:
            start = step
        if index + 1 == len(steps) or steps[index + 1] != step + 1:
            parts.append(str(start) if start == step else f"{start}-{step}")
            start = None
    return ", ".join(parts)


class RunDir:
    """A run directory's files; every write goes through here, under `lock()`."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.summary = self.path / "summary.json"
        self.checkpoint = self.path / "checkpoint.pt"
        self.metrics = self.path / "metrics.jsonl"
        self.log = self.path / "train.log"
        self.lock_file = self.path / ".lock"

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the directory's lock for the block; `RunDirBusy` (naming the holder) if another process has
        it. Creates the directory."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a file in its place or on its path, no permission, a read-only disk
            raise RunDirError(f"run directory {self.path} cannot be made: {error.strerror} "
                              f"({error.filename}); give hydra.run.dir (a sweep: hydra.sweep.dir) a "
                              "directory you can write") from None
        key = str(self.lock_file.resolve())
        if key in _held:
            _held[key][1] += 1
        else:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "a process"
                os.close(fd)
                if error.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise
                raise RunDirBusy(
                    f"run directory {self.path} is in use by {holder} (lock {self.lock_file}). Two processes "
                    "in one directory overwrite each other's metrics and checkpoint, so this one does not "
                    "start: wait for that run to end, or stop it and launch again (it resumes from its "
                    "checkpoint). A killed process holds no lock."
                ) from None
            os.ftruncate(fd, 0)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode(), 0)
            _held[key] = [fd, 1]
        try:
            yield
        finally:
            _held[key][1] -= 1
            if _held[key][1] == 0:
                fd = _held.pop(key)[0]
                # the holder line goes with the lock: a reader of the file never sees a dead holder named
                os.ftruncate(fd, 0)
                os.close(fd)

    def read_summary(self) -> dict[str, Any] | None:
        """The summary, None if there is none; `FileUnreadable` if it is not a JSON object."""
        if not self.summary.exists():
            return None
        try:
            summary = json.loads(self.summary.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            reason = f"not valid JSON ({error})"
        else:
            if isinstance(summary, dict):
                return summary
            reason = f"holds a {type(summary).__name__}, not a JSON object"
        raise FileUnreadable(self.summary, reason,
                             "re-launch the run: train.py rebuilds it from checkpoint.pt")

    def set_aside_summary(self) -> Path:
        """Rename an unreadable summary.json to summary.json.corrupt (kept for inspection); returns the new
        path."""
        target = self.summary.with_name(self.summary.name + ".corrupt")
        os.replace(self.summary, target)
        return target

    def write_summary(self, summary: dict[str, Any]) -> None:
        text = json.dumps(summary, indent=2) + "\n"
        _atomic_write(self.summary, lambda handle: handle.write(text.encode()))

    def load_checkpoint(self, map_location: Any) -> dict[str, Any] | None:
        """The checkpoint, None if there is none; `FileUnreadable` (naming the file and the fix) if it
        cannot be read or lacks what a resume needs."""
        import torch

        if not self.checkpoint.exists():
            return None
        fix = ("delete it to train the run again from step 0, or put back a good copy (checkpoints are "
               "written whole and renamed, so a kill does not do this: a full disk, a failing disk or a "
               "partial copy does)")
        try:
            state = torch.load(self.checkpoint, map_location=map_location, weights_only=True)
        except Exception as error:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError, ...
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise FileUnreadable(self.checkpoint, f"cannot be read ({type(error).__name__}: {first})",
                                 fix) from None
        missing = [key for key in CHECKPOINT_KEYS if not isinstance(state, dict) or key not in state]
        if missing:
            raise FileUnreadable(self.checkpoint, f"lacks {missing}; not a checkpoint of this harness", fix)
        return state

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        import torch

        _atomic_write(self.checkpoint, lambda handle: torch.save(state, handle))

    def cut_metrics(self, last_step: int, expected_steps: Iterable[int] = ()) -> None:
        """Keep the metrics records up to `last_step` (the checkpoint's), so that a resumed run neither
        repeats nor skips a line. Warns about lines that are not records and about `expected_steps` (the
        logged steps up to `last_step`) that have no record: those are lost, and the log says so."""
        if not self.metrics.exists():
            return
        records, problems = read_metrics(self.metrics)
        for problem in problems:
            log.warning("%s: dropped", problem)
        kept = [r for r in records if r["step"] <= last_step]
        missing = sorted(set(expected_steps) - {r["step"] for r in kept})
        if missing:
            log.warning("%s has no record of step(s) %s, before the checkpoint's step %d: those records are "
                        "lost (written by another process, or the file was edited); the run goes on from "
                        "step %d", self.metrics, _ranges(missing), last_step, last_step)
        text = "".join(json.dumps(record) + "\n" for record in kept)
        # a last line without its newline (cut just before it) would fuse with the next appended record
        unterminated = not self.metrics.read_bytes().endswith(b"\n") and self.metrics.stat().st_size > 0
        if problems or len(kept) < len(records) or unterminated:
            _atomic_write(self.metrics, lambda handle: handle.write(text.encode()))

    def write_hydra(self, files: dict[str, str]) -> None:
        """Write `.hydra/<name>` for each (name, text), each file whole: the record of the config this
        launch runs, written once the launch is accepted (Hydra's own writing is off, `hydra.output_subdir:
        null`, so that a refused launch leaves the old record as it was)."""
        folder = self.path / ".hydra"
        folder.mkdir(exist_ok=True)
        for name, text in files.items():
            _atomic_write(folder / name, lambda handle, text=text: handle.write(text.encode()))

    def existing(self, names: Iterable[str] = ("metrics.jsonl", "summary.json", "checkpoint.pt",
                                                "train.log")) -> list[str]:
        """Which of the run's files exist (for the last log line)."""
        return [name for name in names if (self.path / name).exists()]
