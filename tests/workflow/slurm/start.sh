#!/usr/bin/env bash
# Start a real single-node SLURM on this host for the test suite: munged, slurmctld and slurmd on
# loopback, configured from tests/workflow/slurm/slurm.conf.in, all state under $HYBRIDLAB_SLURM_DIR.
#
#   sudo tests/workflow/slurm/start.sh        # installs Debian's slurm-wlm + munge on first use (apt-get)
#   export SLURM_CONF=/var/lib/hybridlab-slurm/slurm.conf   # printed on stdout; clients need it
#   tests/workflow/slurm/stop.sh
#
# Idempotent: a cluster that is already up is left as it is. /etc/munge is never touched, and
# /etc/slurm/slurm.conf only becomes a link to our config where the host has none (see step 4), so
# this cannot clobber a real cluster's configuration.
# stdout: KEY=VALUE lines: SLURM_CONF, SLURM_PARTITION (a non-default partition; the default one is
# `debug`), SLURM_STARTED=1 if this call started the daemons.
# Exit codes: 0 up; 77 this machine cannot run it (not root, no apt-get, install failed) - the
# reason is the last line on stderr; anything else is a real failure (daemon logs on stderr).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${HYBRIDLAB_SLURM_DIR:-/var/lib/hybridlab-slurm}
PARTITION=${HYBRIDLAB_SLURM_PARTITION:-hybridlab}
CTLD_PORT=${HYBRIDLAB_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${HYBRIDLAB_SLURM_SLURMD_PORT:-6818}
CONF=$STATE/slurm.conf
export SLURM_CONF=$CONF
# Daemons live in sbin, which a non-login shell may not have on PATH.
export PATH=$PATH:/usr/sbin:/sbin

skip() { echo "skip: $*" >&2; exit 77; }
die() { echo "error: $*" >&2; exit 1; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
node_state() { sinfo -h -N -p "$PARTITION" -o %T 2>/dev/null | head -n 1; }
report() { printf 'SLURM_CONF=%s\nSLURM_PARTITION=%s\nSLURM_STARTED=%s\n' "$CONF" "$PARTITION" "$1"; }

[ "$(uname -s)" = Linux ] || skip "single-node SLURM needs Linux"
[ "$PARTITION" != debug ] || die "HYBRIDLAB_SLURM_PARTITION must not be debug (the default partition)"
[ "$(id -u)" = 0 ] || skip "needs root (apt-get install slurm-wlm munge, daemons run as root)"

# --- 1. packages -----------------------------------------------------------------------------
missing=0
for cmd in slurmctld slurmd munged sinfo sbatch squeue scontrol srun; do
  command -v "$cmd" >/dev/null || missing=1
done
if [ "$missing" = 1 ]; then
  command -v apt-get >/dev/null || skip "slurm-wlm is not installed and there is no apt-get to install it"
  mkdir -p "$STATE"
  # The packages' postinst would start the *system* services (with /etc/slurm, which we never
  # write); a temporary policy-rc.d forbids that, unless the machine already has one.
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
  fi
  install_pkgs() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge
  }
  ok=0
  if install_pkgs > "$STATE/apt.log" 2>&1; then
    ok=1
  elif apt-get update -q >> "$STATE/apt.log" 2>&1 && install_pkgs >> "$STATE/apt.log" 2>&1; then
    ok=1
  fi
  [ "$made_policy" = 1 ] && rm -f "$policy"
  [ "$ok" = 1 ] || skip "apt-get install slurm-wlm munge failed (no package registry?), see $STATE/apt.log"
fi
command -v mungekey >/dev/null || die "munge is installed but has no mungekey (need munge >= 0.5.14)"

# --- 2. already up? --------------------------------------------------------------------------
if alive "$STATE/munge/munged.pid" && alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid" \
   && [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$CONF" ]; then
  case "$(node_state)" in
    idle|mixed|allocated|completing) report 0; exit 0 ;;
  esac
fi
# Anything half-up from an earlier run is stopped before a clean start.
"$HERE/stop.sh" > /dev/null

# --- 3. munge: own key and socket under $STATE -------------------------------------------------
mkdir -p "$STATE/log" "$STATE/ctld" "$STATE/slurmd"
chmod 0755 "$STATE"
install -d -o munge -g munge -m 0755 "$STATE/munge"
if [ ! -s "$STATE/munge/munge.key" ]; then
  runuser -u munge -- mungekey --create --keyfile="$STATE/munge/munge.key"
fi
runuser -u munge -- munged \
  --socket="$STATE/munge/munge.socket" --key-file="$STATE/munge/munge.key" \
  --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" \
  --seed-file="$STATE/munge/munged.seed"
for _ in $(seq 50); do [ -S "$STATE/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$STATE/munge/munge.socket" ] || { tail -n 20 "$STATE/munge/munged.log" >&2; die "munged did not start"; }

# --- 4. slurm.conf for this host ---------------------------------------------------------------
HOST=$(hostname -s)
# `slurmd -C` prints the node line SLURM itself detects (CPUs, sockets, cores, RealMemory).
NODE_HW=$(slurmd -C | head -n 1)
case "$NODE_HW" in NodeName=*) ;; *) die "slurmd -C printed no node line: $NODE_HW" ;; esac
sed -e "s|@STATE@|$STATE|g" -e "s|@HOST@|$HOST|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
    -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@NODE_HW@|$NODE_HW|g" -e "s|@PARTITION@|$PARTITION|g" \
    "$HERE/slurm.conf.in" > "$CONF"

# Clients find the cluster through SLURM_CONF, but snakemake's jobstep executor strips SLURM_* from
# the environment of the `srun` it runs inside each job, so srun falls back to the compiled-in
# /etc/slurm/slurm.conf. Link it to ours - only where the host has none (a real SLURM keeps its own).
SYS_CONF=/etc/slurm/slurm.conf
if [ -L "$SYS_CONF" ] && [ "$(readlink "$SYS_CONF")" = "$CONF" ]; then
  :
elif [ -e "$SYS_CONF" ] || [ -L "$SYS_CONF" ]; then
  skip "$SYS_CONF exists (a real SLURM on this host?); the test cluster does not replace it"
else
  mkdir -p /etc/slurm
  ln -s "$CONF" "$SYS_CONF"
fi

# --- 5. daemons ----------------------------------------------------------------------------------
# -c: start from an empty job queue (test cluster; finished jobs stay in log/jobcomp.txt).
slurmctld -c -f "$CONF" || { tail -n 20 "$STATE/log/slurmctld.log" >&2; die "slurmctld did not start"; }
slurmd -f "$CONF" || { tail -n 20 "$STATE/log/slurmd.log" >&2; die "slurmd did not start"; }

state=""
for i in $(seq 120); do
  state=$(node_state)
  case "$state" in
    idle) report 1; exit 0 ;;
    down*|drain*|unknown*|fail*)
      # A node seen down by an earlier controller stays down until resumed.
      [ $((i % 10)) = 5 ] && scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
  esac
  sleep 0.5
done
tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
die "node $HOST did not become idle within 60 s (state: '${state:-none}')"
