#!/bin/bash
# hvdkit container entrypoint.
#   sshd          run as a worker: host keys made now, the public key from /keys authorised
#   anything else run it (e.g. hvdkit launch ..., hvdkit env, python train.py)
set -euo pipefail
if [ "${1:-}" = "sshd" ]; then
  ssh-keygen -A >/dev/null
  if [ ! -f /keys/id_ed25519.pub ]; then
    echo "hvdkit-entrypoint: error: /keys/id_ed25519.pub is missing: mount the key volume made by the keygen service (docker compose up keygen)" >&2
    exit 1
  fi
  install -m 600 /keys/id_ed25519.pub /root/.ssh/authorized_keys
  exec /usr/sbin/sshd -D -e
fi
exec "$@"
