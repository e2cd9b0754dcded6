"""How many GPUs a machine gives its jobs, found with the standard library alone (the campaign tool runs
without torch or Hydra)."""

from __future__ import annotations

import os
import subprocess


def visible_gpus() -> int:
    """How many GPUs the jobs will see, found without starting the CUDA driver in this process (forked jobs
    cannot use a driver their parent started): CUDA_VISIBLE_DEVICES's entries where set, else nvidia-smi's
    list, else 0. A wrong count only unbalances the jobs: each takes its GPU modulo the GPUs it sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([entry for entry in visible.split(",") if entry.strip() and entry.strip() != "-1"])
    return sum(line.startswith("GPU ") for line in _nvidia_smi("-L"))


def gpu_name() -> str | None:
    """The name of the machine's first GPU as nvidia-smi gives it (the one torch names too), None without
    one: the campaign prices a run from runs of the same GPU where it has them."""
    listed = _nvidia_smi("--query-gpu=name", "--format=csv,noheader")
    names = [line.strip() for line in listed if line.strip()]
    return names[0] if names else None


def _nvidia_smi(*args: str) -> list[str]:
    """nvidia-smi's output lines for `args`; none where it is missing or fails (no GPU to give)."""
    try:
        listed = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return listed.stdout.splitlines() if listed.returncode == 0 else []


def visible_subset(indices: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a job given the machine's GPUs `indices` (0 .. visible_gpus() - 1): the
    entries of the inherited CUDA_VISIBLE_DEVICES where one is set, else the indices themselves."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",") if e.strip() and e.strip() != "-1"] if visible else []
    return ",".join(entries[i] if i < len(entries) else str(i) for i in indices)


def runs_at_once(n_jobs: int | None, jobs_per_gpu: int | None, gpus: int) -> int:
    """The local launcher's rule for its jobs at once on a machine of `gpus` GPUs: n_jobs where set (>= 1,
    already resolved), else jobs_per_gpu on each GPU (on a machine without one, that many on the CPU), else
    one at a time. The launcher runs it, and the campaign prices its stages with it."""
    if n_jobs is not None:
        return n_jobs
    if jobs_per_gpu is None:
        return 1
    return jobs_per_gpu * max(1, gpus)
