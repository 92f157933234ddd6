#!/bin/bash
# hvdkit container entrypoint.
#   sshd          run as a worker: host keys made now; the client key authorised from
#                 /keys (docker compose's keygen volume) or, on Kubernetes, the
#                 /root/.ssh/authorized_keys the MPI Operator mounts (sshAuthMountPath)
#   anything else run it (e.g. hvdkit launch ..., hvdkit env, python train.py)
set -euo pipefail
if [ "${1:-}" = "sshd" ]; then
  ssh-keygen -A >/dev/null
  if [ -f /keys/id_ed25519.pub ]; then
    install -m 600 /keys/id_ed25519.pub /root/.ssh/authorized_keys
  elif [ ! -f /root/.ssh/authorized_keys ]; then
    echo "hvdkit-entrypoint: error: no client key: mount the keygen volume at /keys (docker compose up keygen), or run under the MPI Operator, which mounts /root/.ssh/authorized_keys" >&2
    exit 1
  fi
  exec /usr/sbin/sshd -D -e
fi
exec "$@"
