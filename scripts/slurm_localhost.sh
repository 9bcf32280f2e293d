#!/usr/bin/env bash
# A one-node SLURM "cluster" on this machine, to rehearse hydra/launcher=slurm for real (sbatch,
# job arrays, time limits, requeues, sacct) without a cluster. See docs/scaling.md.
#
#   sudo scripts/slurm_localhost.sh         # install, configure and start it, then test it
#   sudo scripts/slurm_localhost.sh status  # the daemons' process ids and sinfo
#   sudo scripts/slurm_localhost.sh stop    # stop slurmd, slurmctld, slurmdbd, MariaDB, munged
#
# FOR REHEARSING ON ONE DEBIAN MACHINE ONLY, run as root. It is NOT a way to set up a real cluster:
# it overwrites /etc/slurm/slurm.conf and slurmdbd.conf, runs the daemons by hand (no systemd),
# uses no cgroups (nothing stops a job from using more CPUs or memory than it asked for), and
# controller, accounting database, compute node and "login node" are this one machine.
# Written for Debian 12 (slurm-wlm 22.05, munge 0.5.15, MariaDB 10.11). Running it again is safe:
# it skips what is done and restarts a daemon only when the configuration it writes has changed.
#
# Why an accounting database (slurmdbd + MariaDB) on a rehearsal machine: submitit, which the
# slurm launcher submits through, follows its jobs with `sacct`. Without accounting `sacct`
# fails, submitit logs "Bypassing sacct error" about once a minute, and a job that ends without
# writing its result (cancelled, killed at its time limit, out of memory) leaves the sweep
# waiting for ever; with it, submitit sees the job's state and the sweep fails with it.
set -euo pipefail

CLUSTER=rehearsal                    # SLURM's name of this cluster (also its accounting name)
PARTITION=cpu
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm/slurmctld   # slurmctld's saved state (queue, job ids)
SPOOL_DIR=/var/lib/slurm/slurmd      # slurmd's spool (the batch scripts it runs)
DB=slurm_acct_db                     # MariaDB database of the accounting records

log() { echo "slurm_localhost: $*"; }

if [[ $(id -u) -ne 0 ]]; then
    echo "slurm_localhost: run as root (it installs packages and starts system daemons)" >&2
    exit 1
fi

running() {  # running <pidfile>: the pid in it is a live process
    [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

stop_daemon() {  # stop_daemon <name> <pidfile>: stop it if it runs, wait until it has exited
    local name=$1 pidfile=$2 pid
    if running "$pidfile"; then
        pid=$(cat "$pidfile")
        log "stopping $name (pid $pid)"
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
    rm -f "$pidfile"
}

wait_for() {  # wait_for <what> <command...>: retry the command for up to 30 s
    local what=$1; shift
    for _ in $(seq 30); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
    echo "slurm_localhost: $what did not come up; see $LOG_DIR/" >&2
    return 1
}

# install_if_changed <new file> <target> <mode> <owner>: 0 (true) when the target was rewritten.
install_if_changed() {
    if cmp -s "$1" "$2"; then return 1; fi
    log "writing $2"
    install -m "$3" -o "$4" -g "$4" "$1" "$2"
}

case "${1:-start}" in
    stop)
        stop_daemon slurmd /run/slurmd.pid
        stop_daemon slurmctld /run/slurmctld.pid
        stop_daemon slurmdbd /run/slurmdbd.pid
        if mariadb-admin ping >/dev/null 2>&1; then /etc/init.d/mariadb stop; fi
        stop_daemon munged /run/munge/munged.pid
        exit 0 ;;
    status)
        for d in munge/munged slurmdbd slurmctld slurmd; do
            if running "/run/$d.pid"; then log "${d#*/} running, pid $(cat "/run/$d.pid")"
            else log "${d#*/} not running"; fi
        done
        if running /run/slurmctld.pid; then sinfo; fi
        exit 0 ;;
    start) ;;
    *) echo "usage: $0 [start|status|stop]" >&2; exit 2 ;;
esac

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# 1. Packages: the controller (slurmctld), the node daemon (slurmd), the client commands (sbatch,
#    sinfo, squeue, scontrol, sacct: slurm-wlm pulls them in), the accounting daemon (slurmdbd)
#    and its database (MariaDB), and munge, SLURM's authentication.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v slurmdbd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v mariadbd >/dev/null; then
    log "installing slurm-wlm, slurmdbd, MariaDB and munge"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm slurmdbd mariadb-server munge
fi

# 2. Munge: every SLURM message is signed with a key shared by all hosts of the cluster (here
#    one). The Debian package creates /etc/munge/munge.key; make one if it is missing. munged
#    runs as the munge user, with its socket and pid file in /run/munge.
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
if ! running /run/munge/munged.pid; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
fi
munge -n | unmunge >/dev/null   # stops the script if munge does not work

# 3. MariaDB and its account for slurmdbd. The password is made once and kept in slurmdbd.conf
#    (readable by the slurm user only); a second run reuses it.
if ! mariadb-admin ping >/dev/null 2>&1; then
    log "starting MariaDB"
    /etc/init.d/mariadb start
fi
PASSWORD=$(sed -n 's/^StoragePass=//p' "$DBD_CONF" 2>/dev/null || true)
[[ -n $PASSWORD ]] || PASSWORD=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
mariadb <<EOF
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$PASSWORD';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$PASSWORD';
GRANT ALL ON $DB.* TO 'slurm'@'localhost';
EOF

# 4. slurmdbd: writes the accounting records (what sacct reads) to MariaDB.
install -d -o slurm -g slurm -m 0755 "$LOG_DIR" "$STATE_DIR"
install -d -o root -g root -m 0755 "$SPOOL_DIR"
cat > "$TMP/slurmdbd.conf" <<EOF
# Written by scripts/slurm_localhost.sh: accounting of a one-node SLURM, for rehearsals only.
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
PidFile=/run/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$PASSWORD
StorageLoc=$DB
EOF
if install_if_changed "$TMP/slurmdbd.conf" "$DBD_CONF" 0600 slurm; then
    stop_daemon slurmdbd /run/slurmdbd.pid
fi
if ! running /run/slurmdbd.pid; then
    log "starting slurmdbd"
    /usr/sbin/slurmdbd
fi

# 5. slurm.conf: one node (this machine, with the CPUs and memory `slurmd -C` detects), one
#    partition named "cpu" (the default), no cgroups: processes are tracked through /proc
#    (proctrack/linuxproc), tasks are not bound to CPUs (task/none). select/cons_tres with
#    CR_Core_Memory schedules cores and memory, so two one-core jobs run at once on two cores.
NODE=$(hostname -s)
# slurmd -C prints e.g. "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 ... RealMemory=24105"
HARDWARE=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //')
cat > "$TMP/slurm.conf" <<EOF
# Written by scripts/slurm_localhost.sh: a one-node SLURM on this machine, for rehearsals only.
ClusterName=$CLUSTER
SlurmctldHost=$NODE
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# no mail server here (silences "Configured MailProg is invalid")
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# a job without --mem gets 1 GB (otherwise it would be given the whole node's memory)
DefMemPerCPU=1024
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
# a job past its time limit is killed at once (no grace minutes), KillWait seconds after SIGTERM
OverTimeLimit=0
KillWait=30
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
NodeName=$NODE NodeAddr=127.0.0.1 $HARDWARE State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
if install_if_changed "$TMP/slurm.conf" "$CONF" 0644 root; then
    stop_daemon slurmd /run/slurmd.pid
    stop_daemon slurmctld /run/slurmctld.pid
fi

# 6. The cluster's record in the accounting database (slurmctld reports to it by name).
#    sacctmgr finds slurmdbd through slurm.conf, so this comes after it.
wait_for slurmdbd sacctmgr -n list cluster
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    log "adding cluster '$CLUSTER' to the accounting database"
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

# 7. The controller and the node daemon, started directly (a container has no systemd).
if ! running /run/slurmctld.pid; then
    log "starting slurmctld"
    /usr/sbin/slurmctld
fi
if ! running /run/slurmd.pid; then
    log "starting slurmd"
    /usr/sbin/slurmd
fi

# 8. Checks: the node comes up idle in partition "cpu", a one-line job runs on it, and sacct
#    has its record.
node_up() { [[ $(sinfo -h -n "$NODE" -o %T) =~ ^(idle|mixed|allocated) ]]; }
wait_for "node $NODE" node_up
sinfo
JOB=$(sbatch --parsable --wait --partition="$PARTITION" --output="$TMP/hostname.out" \
    --wrap hostname)
log "sbatch --wrap hostname: job $JOB ran on $(cat "$TMP/hostname.out")"
job_recorded() { [[ -n $(sacct -n -X -j "$JOB" -o State) ]]; }
wait_for "the accounting record of job $JOB" job_recorded
sacct -X -j "$JOB" -o JobID,Partition,State,ExitCode,NodeList
log "ready: partition '$PARTITION' on node $NODE ($HARDWARE)"
