#!/usr/bin/env bash
# Installs what the single-node SLURM test cluster needs (Debian/Ubuntu, root).
# Idempotent: does nothing when the binaries are already there. Called by .ci/run.
set -euo pipefail

need=(slurmctld slurmd sbatch squeue scancel sinfo munged mungekey)
missing=0
for binary in "${need[@]}"; do
    command -v "$binary" >/dev/null 2>&1 || missing=1
done
if [[ $missing -eq 0 ]]; then
    echo "tests/slurm/install.sh: slurm and munge already installed"
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    echo "tests/slurm/install.sh: needs root to apt-get install slurmctld slurmd slurm-client munge" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/slurm/install.sh: no apt-get here; install slurmctld, slurmd, slurm-client and munge by hand" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge
echo "tests/slurm/install.sh: installed $(dpkg-query -W -f='${Package} ${Version}\n' slurmctld munge | tr '\n' ' ')"
