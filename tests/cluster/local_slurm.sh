#!/usr/bin/env bash
# A two-node Slurm cluster on this machine, for the Slurm tests: munged, slurmctld and two slurmd,
# all run as root, with their key, configuration, state, logs and pid files under DIR.
#
#   tests/cluster/local_slurm.sh start DIR   writes DIR/slurm.conf, starts the daemons, waits (at most
#                                          60 s) until sinfo shows both nodes idle; prints the line
#                                          SLURM_CONF=DIR/slurm.conf for the clients (srun, sbatch)
#   tests/cluster/local_slurm.sh stop DIR    stops the daemons it started (by the pids in DIR/*.pid)
#
# The nodes are `localhost` (at 127.0.0.1) and `node2` (at 127.0.0.2, also this machine: Linux
# answers on all of 127/8), one slurmd each (slurmd -N NAME), each with this machine's CPUs and
# memory. node2 is defined first: Slurm resolves any name to a lone node called localhost, which
# would make node2 a duplicate. A job on both has SLURM_JOB_NODELIST=localhost,node2, so its first
# node, where the rendezvous is, resolves everywhere.
# No cgroups: processes are tracked through /proc (proctrack/linuxproc) and tasks are not confined
# (task/none), so that it runs in a container. Each node offers 2 GPUs as a generic resource, two
# stand-in device files (Slurm drops file-less GPUs), so that a batch script's --gres=gpu:2 is
# accepted and jobs see CUDA_VISIBLE_DEVICES as on a GPU node (the tests train on the CPU).
# Needs root (slurmd starts jobs as their users), Debian's slurm-wlm and munge, and python3
# (scripts/setup.sh). A failed start stops what it started and prints the daemons' logs.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")

# Stops the cluster: cancels its jobs, stops the daemons by the pids in DIR/<name>.pid (SIGTERM, then
# SIGKILL after 10 s), then kills what may be left of its jobs: processes marked with this cluster's
# HETSEQ_LOCAL_SLURM (slurmstepd inherits it from slurmd) and job processes (SLURM_JOB_ID set) whose
# SLURM_CONF is this cluster's.
stop() {
  local name pidfile pid i environ
  if [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --full --quiet --user root 2>/dev/null || true
    for i in $(seq 50); do
      [ -z "$(SLURM_CONF="$dir/slurm.conf" timeout 10 squeue --noheader 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  # SIGTERM to every daemon at once (each takes 1-2 s to exit; one after another took 7 s), then wait.
  local daemons=()
  for name in slurmd-localhost slurmd-node2 slurmctld munged; do
    pidfile="$dir/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    rm -f "$pidfile"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || continue
    kill -TERM "$pid" 2>/dev/null || true
    daemons+=("$pid")
  done
  for pid in "${daemons[@]}"; do
    for i in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  done
  # One pass of grep over every process's environment (a tr and greps per process took seconds).
  local environ pids
  pids=$({ grep -lzxF "HETSEQ_LOCAL_SLURM=$dir" /proc/[0-9]*/environ 2>/dev/null
           grep -lzxF "SLURM_CONF=$dir/slurm.conf" /proc/[0-9]*/environ 2>/dev/null |
             xargs -r grep -lz '^SLURM_JOB_ID=' 2>/dev/null; } | sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p' | sort -u) || true  # grep exits 2 on the environments it may not read
  for pid in $pids; do
    [ "$pid" != "$$" ] && [ "$pid" != "$BASHPID" ] || continue
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# A TCP port that is free now (the kernel's pick for port 0).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Starts a daemon in the foreground in its own session (so that it outlives this script and the test
# harness's process group) and records its pid.
start_daemon() {
  local name=$1
  shift
  HETSEQ_LOCAL_SLURM="$dir" setsid "$@" </dev/null >"$dir/$name.out" 2>&1 &
  echo $! >"$dir/$name.pid"
}

fail() {
  echo "local_slurm: $*" >&2
  local log
  for log in "$dir"/*.log "$dir"/*.out; do
    [ -s "$log" ] || continue
    echo "---- $log (last 30 lines)" >&2
    tail -n 30 "$log" >&2
  done
  stop
  exit 1
}

case "$action" in
  stop)
    stop
    exit 0
    ;;
  start) ;;
  *) usage ;;
esac

[ "$(id -u)" -eq 0 ] || { echo "local_slurm: must run as root (slurmd runs jobs as their users)" >&2; exit 1; }
for program in munged mungekey slurmctld slurmd sinfo python3; do
  command -v "$program" >/dev/null || { echo "local_slurm: $program is not installed (run scripts/setup.sh)" >&2; exit 1; }
done
mkdir -p "$dir"
chmod 0700 "$dir"
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
trap 'fail "start failed (line $LINENO)"' ERR
trap 'fail "interrupted"' INT TERM

# munged with its own key and socket; Slurm's daemons and clients find the socket through AuthInfo.
mungekey --create --keyfile "$dir/munge/munge.key" --force
chmod 0600 "$dir/munge/munge.key"
start_daemon munged munged --foreground --force --key-file "$dir/munge/munge.key" \
  --socket "$dir/munge/munge.socket" --pid-file "$dir/munge/munged.pid" --log-file "$dir/munged.log" \
  --seed-file "$dir/munge/munge.seed"

cpus=$(nproc)
memory_mb=$(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo)
ctld_port=$(free_port)
cat >"$dir/slurm.conf" <<CONF
ClusterName=hetseq-local
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.daemon.pid
SlurmdPidFile=$dir/slurmd.%n.daemon.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=node2 NodeHostname=node2 NodeAddr=127.0.0.2 Port=$(free_port) CPUs=$cpus RealMemory=$memory_mb Gres=gpu:2 State=UNKNOWN
NodeName=localhost NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(free_port) CPUs=$cpus RealMemory=$memory_mb Gres=gpu:2 State=UNKNOWN
PartitionName=local Nodes=localhost,node2 Default=YES MaxTime=INFINITE State=UP
CONF
# The stand-in GPUs: character devices like /dev/null where mknod is allowed, else plain files (slurmd
# logs an error for each but counts them).
mkdir -p "$dir/dev"
for i in 0 1; do
  rm -f "$dir/dev/nvidia$i"
  mknod "$dir/dev/nvidia$i" c 1 3 2>/dev/null || touch "$dir/dev/nvidia$i"
done
cat >"$dir/gres.conf" <<CONF
NodeName=localhost,node2 Name=gpu File=$dir/dev/nvidia[0-1]
CONF
export SLURM_CONF="$dir/slurm.conf"

start_daemon slurmctld slurmctld -D -i -f "$dir/slurm.conf"
mkdir -p "$dir/spool/localhost" "$dir/spool/node2"
start_daemon slurmd-localhost slurmd -D -N localhost -f "$dir/slurm.conf"
start_daemon slurmd-node2 slurmd -D -N node2 -f "$dir/slurm.conf"

deadline=$(( $(date +%s) + 60 ))
until [ "$(sinfo --noheader --nodes localhost,node2 --format '%t %D' 2>/dev/null)" = "idle 2" ]; do
  for name in munged slurmctld slurmd-localhost slurmd-node2; do
    kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null || fail "$name exited"
  done
  [ "$(date +%s)" -lt "$deadline" ] || fail "the nodes are not idle after 60 s: $(sinfo --noheader --format '%N %t %E' 2>&1)"
  sleep 0.5
done
trap - ERR INT TERM
echo "SLURM_CONF=$dir/slurm.conf"
