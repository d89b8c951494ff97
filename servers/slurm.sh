#!/usr/bin/env bash
# A single-node SLURM on this machine, for tests/hpc/test_slurm.py (run as root; Debian/Ubuntu).
#   servers/slurm.sh [start]  install slurm-wlm and munge if missing (apt-get), write a single-node
#                             slurm.conf and a munge key, start munged, slurmctld and slurmd, and
#                             wait until sinfo shows this node idle; a second start finds it running
#   servers/slurm.sh stop     stop slurmctld, slurmd and munged (what start started)
#   servers/slurm.sh status   exit 0 when the node is up (idle, mixed or allocated), else 1
# SLURM_START_TIMEOUT (seconds, default 60) bounds each wait; SLURM_INSTALL=0 starts an installed
# SLURM but installs nothing (what the tests' fixture does outside CI). The daemons' state and logs live under
# /var/lib/shardwise-slurm (the logs are the first place to look when the start fails).
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# written by shardwise servers/slurm.sh"
STATE=/var/lib/shardwise-slurm
TIMEOUT="${SLURM_START_TIMEOUT:-60}"
HOST="$(hostname -s)"

say() { echo "slurm.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# wait_for WHAT COMMAND...: poll COMMAND until it succeeds, at most $TIMEOUT seconds
wait_for() {
    local what="$1" deadline=$((SECONDS + TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2  # a polling interval, not a guess of how long the start takes
    done
    say "$what"
}

install() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch \
        >/dev/null && command -v munged >/dev/null && return
    [ "${SLURM_INSTALL:-1}" != 0 ] ||
        die "slurm-wlm and munge are not installed (SLURM_INSTALL=0: servers/slurm.sh installs them)"
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get"
    say "installing slurm-wlm and munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    # the package lists may be absent on a fresh machine (CI images ship without them)
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
    }
}

# the slurm.conf of this machine
conf_text() {
    local cpus mem
    cpus="$(nproc)"
    # what slurmd finds, less a margin: a node configured with more memory than it has is drained
    mem=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))
    cat <<EOF
$MARK: a single-node cluster for tests/hpc
ClusterName=shardwise
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
# no cgroups: processes are tracked by their parent ids, tasks are not bound
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# a requeued job becomes eligible by time, which only a periodic pass notices (60 s and 30 s by
# default): pass every 2 s / 1 s
SchedulerParameters=sched_interval=2,bf_interval=1
ReturnToService=2
# requeue on: the array tasks are submitted with --requeue and requeue themselves
JobRequeue=1
# a test waits for its jobs' end: finished job records go after 60 s, a killed job's processes
# get SIGKILL 5 s after SIGTERM (what a stuck part meets on a real cluster after KillWait)
MinJobAge=60
KillWait=5
# a requeued job waits for the credential lifetime before it runs again (120 s by default)
AuthInfo=cred_expire=10
InactiveLimit=0
NodeName=$HOST CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
}

configure() {
    if [ -f "$CONF" ] && ! head -1 "$CONF" | grep -qF "$MARK"; then
        die "$CONF exists and was not written by this script: refusing to replace it"
    fi
    mkdir -p "$STATE/ctld" "$STATE/d" /etc/slurm
    if [ -f "$CONF" ] && [ "$(cat "$CONF")" != "$(conf_text)" ]; then
        say "the configuration changed: restarting slurmctld and slurmd"
        stop_slurm
    fi
    conf_text >"$CONF"
    if [ ! -s /etc/munge/munge.key ]; then
        say "creating the munge key"
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
}

munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
ctld_up() { scontrol ping 2>/dev/null | grep -q "is UP"; }
node_state() { sinfo -h -n "$HOST" -o %T 2>/dev/null | head -1; }
node_up() { case "$(node_state)" in idle | mixed | allocated | completing) return 0 ;; esac; return 1; }
node_idle() { [ "$(node_state)" = idle ]; }
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    if command -v scontrol >/dev/null && munge_works && ctld_up && node_up &&
        [ "$(cat "$CONF" 2>/dev/null)" = "$(conf_text)" ]; then
        say "running already: node $HOST $(node_state)"
        return
    fi
    [ "$(id -u)" = 0 ] || die "needs root (it installs packages and starts the daemons as root)"
    install
    configure
    if ! munge_works; then
        runuser -u munge -- munged
        wait_for "munged is up" munge_works || die "munged did not start: see /var/log/munge"
    fi
    running "$STATE/slurmctld.pid" || slurmctld
    wait_for "slurmctld is up" ctld_up || die "slurmctld did not start: see $STATE/slurmctld.log"
    running "$STATE/slurmd.pid" || slurmd
    wait_for "node $HOST is idle" node_idle ||
        die "node $HOST is not idle (state: $(node_state)) after ${TIMEOUT}s: see $STATE/slurmd.log"
}

stop_pid() {
    local name="$1" file="$2" pid
    running "$file" || return 0
    pid="$(cat "$file")"  # read once: the daemon removes its pid file as it exits
    kill "$pid"
    wait_for "$name stopped" bash -c "! kill -0 $pid" || die "$name did not stop"
}

stop_slurm() {
    stop_pid slurmd "$STATE/slurmd.pid"
    stop_pid slurmctld "$STATE/slurmctld.pid"
}

stop() {
    stop_slurm
    stop_pid munged /run/munge/munged.pid
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) node_up ;;
    *) echo "usage: servers/slurm.sh [start|stop|status]" >&2; exit 2 ;;
esac
