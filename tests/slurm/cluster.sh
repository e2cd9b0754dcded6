#!/usr/bin/env bash
# A single-node SLURM cluster for tests: munged + slurmctld + slurmd, all state in one folder.
#
#   tests/slurm/cluster.sh start [DIR]   # prints the folder; clients need SLURM_CONF=DIR/slurm.conf
#   tests/slurm/cluster.sh stop DIR      # stops the daemons started from DIR (by their pid files)
#   tests/slurm/cluster.sh env DIR       # prints the exports a client shell needs
#
# Needs root and the packages of tests/slurm/install.sh. One node, no cgroups, no accounting daemon; the
# sacct stand-in (tests/slurm/bin/sacct) replaces sacct on PATH so that submitit notices jobs SLURM killed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ctld_port="${KDA_SLURMCTLD_PORT:-6817}"
slurmd_port="${KDA_SLURMD_PORT:-6818}"

print_env() {
    local dir="$1"
    echo "export SLURM_CONF=$dir/slurm.conf"
    echo "export PATH=$here/bin:\$PATH"
}

wait_for() {
    # wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.5 s
    local seconds="$1" what="$2"
    shift 2
    local tries=$((seconds * 2))
    for ((i = 0; i < tries; i++)); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.5
    done
    echo "cluster.sh: timed out after ${seconds}s waiting for $what" >&2
    return 1
}

node_idle() {
    local state
    state="$(sinfo -h -o %T 2>/dev/null | head -n1)"
    [[ "$state" == idle* || "$state" == mixed* || "$state" == allocated* ]]
}

start() {
    local dir="${1:-}"
    if [[ $(id -u) -ne 0 ]]; then
        echo "cluster.sh: the test cluster runs its daemons as root; run as root" >&2
        exit 1
    fi
    for binary in slurmctld slurmd sinfo munged mungekey; do
        if ! command -v "$binary" >/dev/null 2>&1; then
            echo "cluster.sh: $binary not found; run tests/slurm/install.sh first" >&2
            exit 1
        fi
    done
    if [[ -z "$dir" ]]; then
        dir="$(mktemp -d /tmp/kda-slurm.XXXXXX)"
    fi
    mkdir -p "$dir"
    # munged runs as user munge and must reach its socket: 711 on the way down (700 is refused).
    chmod 711 "$dir"
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
    chown munge:munge "$dir/munge"
    chmod 711 "$dir/munge"

    if [[ ! -s /etc/munge/munge.key ]]; then
        mkdir -p /etc/munge
        mungekey -c -k /etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 600 /etc/munge/munge.key
    fi
    runuser -u munge -- munged \
        --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" \
        --seed-file="$dir/munge/munged.seed" \
        --key-file=/etc/munge/munge.key
    wait_for 10 "the munge socket" test -S "$dir/munge/munge.socket"

    local host cpus mem_mb
    host="$(hostname -s)"
    cpus="$(nproc)"
    # Below free memory, as slurmd refuses a node that claims more than it has.
    mem_mb="$(awk '/MemAvailable/ {print int($2 / 1024 / 2)}' /proc/meminfo)"
    # cred_expire also delays a requeued job's restart (default 120 s); 10 s keeps the requeue test short.
    # The scheduler looks at pending jobs every second (defaults: 60 s, backfill 30 s), so that a requeued
    # job starts as soon as it may instead of at the next pass.
    cat >"$dir/slurm.conf" <<CONF
ClusterName=kdatest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
MailProg=/bin/true
ReturnToService=2
MinJobAge=3600
KillWait=5
JobRequeue=1
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF"
    if ! wait_for 30 "the node to become idle (sinfo)" node_idle; then
        tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
        stop "$dir"
        exit 1
    fi
    echo "$dir"
}

kill_pidfile() {
    local pidfile="$1"
    [[ -s "$pidfile" ]] || return 0
    local pid
    pid="$(cat "$pidfile")"
    if kill "$pid" 2>/dev/null; then
        for ((i = 0; i < 20; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

stop() {
    local dir="$1"
    if [[ -z "$dir" || ! -d "$dir" ]]; then
        echo "cluster.sh: stop needs the cluster folder that start printed" >&2
        exit 1
    fi
    if [[ -f "$dir/slurm.conf" && -s "$dir/slurmctld.pid" ]]; then
        # Jobs first, so that no job step outlives its slurmd.
        SLURM_CONF="$dir/slurm.conf" scancel --partition=debug >/dev/null 2>&1 || true
        sleep 1
    fi
    kill_pidfile "$dir/slurmd.pid"
    kill_pidfile "$dir/slurmctld.pid"
    kill_pidfile "$dir/munge/munged.pid"
}

case "${1:-}" in
start) start "${2:-}" ;;
stop) stop "${2:-}" ;;
env) print_env "${2:?cluster folder}" ;;
*)
    echo "usage: $0 start [DIR] | stop DIR | env DIR" >&2
    exit 2
    ;;
esac
