#!/bin/bash
# hvdkit container entrypoint.
#   sshd          run as a worker: host keys made now; the client key authorised from
#                 /keys (docker compose's keygen volume) or, on Kubernetes, the
#                 /root/.ssh/authorized_keys the MPI Operator mounts (sshAuthMountPath)
#   anything else run it (e.g. hvdkit launch ..., hvdkit env, python train.py)
set -euo pipefail

# The ranks this container runs: the first processes under this one (sshd's sessions, Open MPI's
# orted) whose environment holds a rank, set by horovodrun (HOROVOD_RANK) or Open MPI
# (OMPI_COMM_WORLD_RANK). Not their children (DataLoader workers inherit the variable): a worker
# killed by the signal would fail the rank's step before it saves. A shell that holds the variable
# (horovodrun's `sh -c ... python`) is looked through to the process under it.
ranks() {
  local -A children=()
  local stat line pid ppid rest comm queue=("$$") found=()
  for stat in /proc/[0-9]*/stat; do
    { read -r line < "$stat"; } 2>/dev/null || continue
    pid=${line%% *}
    rest=${line##*) }                   # after "pid (comm) ": state ppid ...
    read -r _ ppid _ <<< "$rest"
    children[$ppid]+=" $pid"
  done
  while [ ${#queue[@]} -gt 0 ]; do
    pid=${queue[0]}
    queue=("${queue[@]:1}")
    for child in ${children[$pid]:-}; do
      comm=$(cat "/proc/$child/comm" 2>/dev/null || true)
      if grep -qzE '^(HOROVOD_RANK|OMPI_COMM_WORLD_RANK)=' "/proc/$child/environ" 2>/dev/null \
          && [[ ! "$comm" =~ ^(sh|bash|dash)$ ]]; then
        found+=("$child")
      else
        queue+=("$child")
      fi
    done
  done
  echo "${found[@]:-}"
}

# A pod's eviction or deletion sends SIGTERM to PID 1 alone. sshd as PID 1 exited on it without
# passing it on, and the kernel then SIGKILLed every rank: hvdkit's PreemptionGuard never saw it and
# no checkpoint was written. Here PID 1 passes SIGTERM to the ranks, waits for them to checkpoint
# and exit (HVDKIT_STOP_GRACE_S, default 25 s: inside Kubernetes' default 30 s grace period), then
# stops sshd.
stop() {
  local pids deadline alive pid
  read -r -a pids <<< "$(ranks)"
  echo "hvdkit-entrypoint: $1: passing it to ${#pids[@]} rank(s)${pids[*]:+: ${pids[*]}}" >&2
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
  fi
  deadline=$((SECONDS + grace))
  while [ $SECONDS -lt $deadline ]; do
    alive=0
    for pid in "${pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then alive=1; fi
    done
    [ $alive = 0 ] && break
    sleep 0.2
  done
  if [ -n "$sshd_pid" ]; then
    kill -TERM "$sshd_pid" 2>/dev/null || true
    wait "$sshd_pid" 2>/dev/null || true
  fi
  exit 0
}

if [ "${1:-}" = "sshd" ]; then
  ssh-keygen -A >/dev/null
  if [ -f /keys/id_ed25519.pub ]; then
    install -m 600 /keys/id_ed25519.pub /root/.ssh/authorized_keys
  elif [ ! -f /root/.ssh/authorized_keys ]; then
    echo "hvdkit-entrypoint: error: no client key: mount the keygen volume at /keys (docker compose up keygen), or run under the MPI Operator, which mounts /root/.ssh/authorized_keys" >&2
    exit 1
  fi
  grace=${HVDKIT_STOP_GRACE_S:-25}
  if ! [[ "$grace" =~ ^[0-9]+$ ]]; then
    echo "hvdkit-entrypoint: error: HVDKIT_STOP_GRACE_S=$grace is not a whole number of seconds: set it to e.g. 25, less than the pod's terminationGracePeriodSeconds" >&2
    exit 2
  fi
  sshd_pid=
  trap 'stop SIGTERM' TERM
  trap 'stop SIGINT' INT
  /usr/sbin/sshd -D -e &
  sshd_pid=$!
  set +e
  wait "$sshd_pid"
  exit $?
fi
exec "$@"
