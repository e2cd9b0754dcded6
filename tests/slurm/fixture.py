"""pytest fixture: a real single-node SLURM cluster for the session (tests/slurm/cluster.sh).

Use it from a test module with `from slurm.fixture import slurm_cluster  # noqa: F401` (tests/ is on
sys.path under pytest). Tests that take the fixture skip, naming tests/slurm/install.sh, when the
binaries or root are missing; with KDA_REQUIRE_SLURM=1 (CI) they fail instead, so CI cannot pass by
skipping them. The cluster is stopped at the end of the session, and its jobs with it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CLUSTER_SH = HERE / "cluster.sh"
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "munged", "mungekey")


def missing_reason() -> str | None:
    """Why no test cluster can start here, or None when it can."""
    absent = [name for name in BINARIES if shutil.which(name) is None]
    if absent:
        return f"SLURM/munge not installed ({', '.join(absent)} missing): run tests/slurm/install.sh as root"
    if os.geteuid() != 0:
        return (
            "the SLURM test cluster runs its daemons as root (tests/slurm/cluster.sh); run the tests as root"
        )
    return None


@dataclass
class SlurmCluster:
    """A running test cluster: `env` is what a client (sbatch, squeue, Hydra's submitit) needs."""

    folder: Path
    env: dict[str, str]

    def run(self, *args: str) -> str:
        """A SLURM client command's stdout; raises with its stderr when it fails."""
        result = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def jobs(self) -> dict[str, str]:
        """Job id (array tasks as <job>_<task>) -> state, for every job SLURM still remembers."""
        out = self.run("squeue", "-h", "-t", "all", "-o", "%i|%T")
        return dict(line.split("|", 1) for line in out.split())

    def wait_for_state(self, job_id: str, states: set[str], timeout_s: float = 60.0) -> str:
        """Poll squeue until `job_id` is in one of `states`; returns the state."""
        deadline = time.monotonic() + timeout_s
        state = "unknown"
        while time.monotonic() < deadline:
            state = self.jobs().get(job_id, "unknown")
            if state in states:
                return state
            time.sleep(0.5)
        raise TimeoutError(
            f"SLURM job {job_id} still {state} after {timeout_s:.0f} s (wanted {sorted(states)})"
        )


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("KDA_REQUIRE_SLURM") == "1":
            pytest.fail(f"KDA_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    # Not under pytest's tmp dir: munged (user munge) must traverse the path, and pytest's dirs are 0700.
    folder = Path(
        subprocess.run(
            ["mktemp", "-d", "/tmp/kda-slurm.XXXXXX"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    started = subprocess.run(
        ["bash", str(CLUSTER_SH), "start", str(folder)], capture_output=True, text=True, timeout=90
    )
    if started.returncode != 0:
        pytest.fail(f"tests/slurm/cluster.sh start failed:\n{started.stdout}\n{started.stderr}")
    env = dict(os.environ)
    env["SLURM_CONF"] = str(folder / "slurm.conf")
    # The sacct stand-in first on PATH: without slurmdbd the real sacct fails and a killed job hangs submitit.
    env["PATH"] = f"{HERE / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    try:
        yield SlurmCluster(folder=folder, env=env)
    finally:
        subprocess.run(["bash", str(CLUSTER_SH), "stop", str(folder)], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
