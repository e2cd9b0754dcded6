"""How a run's process meets signals: SIGTERM stops a run as Ctrl-C does (it checkpoints), and a sweep's
worker stops when its sweep's process dies. Standard library only: the hydra.callbacks entry imports it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Terminated(SystemExit):
    """SIGTERM arrived (schedulers, `kill`, a sweep whose launcher died): stop like Ctrl-C, exit 143."""

    def __str__(self) -> str:
        return "SIGTERM"


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Turn SIGTERM into `Terminated` for the block, so that it checkpoints like Ctrl-C. Left alone where
    someone else handles SIGTERM already (submitit does, to requeue), or off the main thread."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    seen = []

    def handler(signum: int, frame: Any) -> None:
        # once: a second SIGTERM while the first one's checkpoint is written must not cut it
        if not seen:
            seen.append(signum)
            raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def signals_held(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM for the block and raise them again when it ends: what the block writes
    and what the process then records about it stay one (a checkpoint on disk and the step the summary
    says it holds). Off the main thread, where no handler can be set, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, _frame: caught.append(signum))
                for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: a handler set outside Python, which cannot be put back
                signal.signal(signum, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


# The pid of the sweep's own process, set by the hydra.callbacks entry (RunDirLock.on_multirun_start) for
# the workers it starts.
SWEEP_PID = "KDA_HARNESS_SWEEP_PID"


def die_with_sweep() -> None:
    """In a worker process of a sweep (joblib's loky pool, the local launcher), ask the kernel for SIGTERM
    when the sweep's process ends: a killed sweep's workers then checkpoint and stop, instead of training on
    (and idling for the pool's timeout) with nobody to report to. Linux only; elsewhere nothing."""
    parent = os.environ.get(SWEEP_PID)
    if parent is None or os.getpid() == int(parent) or os.getppid() != int(parent):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the sweep ended before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def sweep_gone() -> bool:
    """True in a sweep's worker whose sweep process is gone (the worker was re-parented)."""
    parent = os.environ.get(SWEEP_PID)
    return parent is not None and os.getppid() != int(parent)

