#!/usr/bin/env bash
# Stop the test SLURM started by tests/workflow/slurm/start.sh: slurmd, slurmctld, then munged, each by the
# PID in its pid file under $HYBRIDLAB_SLURM_DIR (nothing else is signalled). State and logs stay
# for inspection; `--purge` also deletes $HYBRIDLAB_SLURM_DIR.
set -euo pipefail

STATE=${HYBRIDLAB_SLURM_DIR:-/var/lib/hybridlab-slurm}

stop_pidfile() {
  local name=$1 pidfile=$2 pid
  [ -s "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "$name (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "stopped $name (pid $pid)"
  fi
  rm -f "$pidfile"
}

stop_pidfile slurmd "$STATE/slurmd.pid"
stop_pidfile slurmctld "$STATE/slurmctld.pid"
stop_pidfile munged "$STATE/munge/munged.pid"

# The /etc/slurm/slurm.conf link that start.sh made (and only that) goes too.
if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$STATE/slurm.conf" ]; then
  rm -f /etc/slurm/slurm.conf
fi

if [ "${1:-}" = "--purge" ]; then
  rm -rf "$STATE"
  echo "removed $STATE"
fi
