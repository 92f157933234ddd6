#!/usr/bin/env bash
# hvdkit install: frameworks at requirements.lock's versions (with uv), Horovod built from its sdist with
# scripts/patches/ (or the wheel cached for the same inputs), hvdkit itself, then `hvdkit env --require`
# proves the build; only then the stamp Make reads. Each step is safe to rerun. Tests' tools: scripts/test-setup.sh.
#
#   scripts/install.sh            # CPU: OpenMPI + Gloo, torch, tensorflow-cpu (apt-get installs OpenMPI as root)
#   scripts/install.sh --gpu      # GPU: torch + Keras 3 (torch backend), Horovod with NCCL (no GPU needed to build)
#   scripts/install.sh --gpu-tf   # GPU: TensorFlow (CUDA 12 wheels) + Keras 3 + tf-keras, Horovod with NCCL; needs
#                                 #   a CUDA 12 nvcc (CUDA_HOME, default /usr/local/cuda): PyPI has none for CUDA 12
#   scripts/install.sh --check-only   # prerequisites only (Python, compiler, OpenMPI, CUDA), changes nothing
#   scripts/install.sh --print-pins   # every pin as KEY=VALUE lines (scripts/installer.py pins)
#   scripts/install.sh --patch-only DIR   # apply the guarded Horovod patch series to an unpacked sdist
#   scripts/install.sh --gpu --no-project # everything but hvdkit itself (Dockerfile.gpu's cached layer)
#   scripts/install.sh --strip-build-tools # remove nvcc's wheels, cmake and uv from a GPU venv after the build
#                                          # (.venv-gpu; with --gpu-tf first: .venv-gpu-tf)
#
# Environment: HVDKIT_VENV (default .venv; --gpu: .venv-gpu; --gpu-tf: .venv-gpu-tf), HVDKIT_PYTHON (default python3), HVDKIT_CACHE_DIR
# (default ~/.cache/hvdkit; uv's cache: its uv/), HVDKIT_NO_APT=1, HVDKIT_TORCH_VERSION (another torch than the
# lock's), CXX; GPU: CUDA_HOME (the framework's CUDA major; --gpu: else nvcc from NVIDIA's wheels;
# --gpu-tf: else /usr/local/cuda), HOROVOD_BUILD_CUDA_CC_LIST.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK="$ROOT/requirements.lock"
MODE=cpu CHECK_ONLY=0 NO_PROJECT=0 STRIP=0 PATCH_ONLY_DIR=
PYTHON=${HVDKIT_PYTHON:-python3}
CXX_BIN=${CXX:-c++}
CACHE_DIR=${HVDKIT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdkit}

die() { echo "hvdkit install: error: $*" >&2; exit 1; }; step() { echo "==> $*"; }
case " $* " in *" -h "*|*" --help "*) sed -n '2,/^set -euo/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[ -z "${HVDKIT_INSTALLER:-}" ] || die "HVDKIT_INSTALLER is no longer read (uv installs everything at requirements.lock's versions): unset it"

# Every pin as a shell variable, read by the interpreter the venv will use.
command -v "$PYTHON" >/dev/null 2>&1 \
  || die "Python interpreter '$PYTHON' not found: install python3.11 (apt-get install python3 python3-venv) or set HVDKIT_PYTHON"
PINS=$("$PYTHON" "$ROOT/scripts/installer.py" pins 2> >(sed 's/^hvdkit pins: error: /hvdkit install: error: /' >&2)) || exit 1
while IFS='=' read -r key value; do printf -v "$key" '%s' "$value"; done <<<"$PINS"
PATCH_DIR="$ROOT/scripts/patches/horovod-$HOROVOD_VERSION"; PATCH_NAME="scripts/patches/horovod-$HOROVOD_VERSION"
# The series, in order, into PATCHES (installer.py reads the folder's `series` file and checks each file is there).
load_series() { mapfile -t PATCHES < <("$PYTHON" "$ROOT/scripts/installer.py" series "$PATCH_DIR"); [ ${#PATCHES[@]} -gt 0 ] || exit 1; }

# Applies the series to an unpacked Horovod source, refusing (and changing nothing) when the source is not the
# one it was made for: the whole series is first applied to a scratch copy. --forward, never --batch (which
# silently reverses an already-applied patch).
apply_patch() {
  local src=$1 scratch p; [ -f "$src/setup.py" ] && [ -d "$src/horovod" ] \
    || die "$src is not an unpacked Horovod source (no setup.py and horovod/): unpack horovod-$HOROVOD_VERSION.tar.gz there"
  grep -q "__version__ = '$HOROVOD_VERSION'" "$src/horovod/__init__.py" 2>/dev/null \
    || die "$src is not Horovod $HOROVOD_VERSION: $PATCH_NAME/ is for exactly that version; use its sdist or refresh the series"
  load_series; scratch=$(mktemp -d)
  cp -a "$src/." "$scratch/" || { rm -rf "$scratch"; die "cannot copy $src to $scratch to try the patches: free space in ${TMPDIR:-/tmp}"; }
  for p in "${PATCHES[@]}"; do
    patch -d "$scratch" -p1 --forward --silent --no-backup-if-mismatch < "$p" >/dev/null 2>&1 \
      || { rm -rf "$scratch"; die "$PATCH_NAME/$(basename "$p") does not apply to $src (already patched, or a modified source): unpack a fresh horovod-$HOROVOD_VERSION.tar.gz"; }
  done
  rm -rf "$scratch"; for p in "${PATCHES[@]}"; do patch -d "$src" -p1 --forward --silent --no-backup-if-mismatch < "$p" >/dev/null; done
}

while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --gpu) MODE=gpu ;;
    --gpu-tf) MODE=gpu-tf ;;
    --check-only) CHECK_ONLY=1 ;;
    --print-pins) echo "$PINS"; exit 0 ;;
    --no-project) NO_PROJECT=1 ;;
    --strip-build-tools) STRIP=1 ;;
    --patch-only) [ $# -ge 2 ] || die "--patch-only needs a directory: scripts/install.sh --patch-only horovod-$HOROVOD_VERSION"
                  PATCH_ONLY_DIR=$2; shift ;;
    *) die "unknown option '$1': use --cpu, --gpu, --gpu-tf, --check-only, --print-pins, --patch-only DIR, --no-project or --strip-build-tools" ;;
  esac
  shift
done
if [ -n "$PATCH_ONLY_DIR" ]; then
  command -v patch >/dev/null 2>&1 || die "'patch' not found: apt-get install patch"
  apply_patch "$PATCH_ONLY_DIR"          # not in an && list: set -e must stop a failed patch
  echo "patched $PATCH_ONLY_DIR with the ${#PATCHES[@]} patches of $PATCH_NAME/"; exit 0
fi

[ "$MODE" != gpu-tf ] || [ -z "${HVDKIT_TORCH_VERSION:-}" ] \
  || die "HVDKIT_TORCH_VERSION chooses the torch of the CPU and --gpu flavours; --gpu-tf has no torch: unset it"
TORCH_VERSION=${HVDKIT_TORCH_VERSION:-$TORCH_VERSION}
case "$MODE" in gpu) VENV=${HVDKIT_VENV:-$ROOT/.venv-gpu} ;; gpu-tf) VENV=${HVDKIT_VENV:-$ROOT/.venv-gpu-tf} ;; *) VENV=${HVDKIT_VENV:-$ROOT/.venv} ;; esac
[ "$STRIP" = 0 ] || [ "$MODE" != cpu ] || VENV=${HVDKIT_VENV:-$ROOT/.venv-gpu}
STAMP="$VENV/.hvdkit-installed"
if [ "$STRIP" = 1 ]; then
  # What only the Horovod build needs (the runtime image has none): nvcc's wheels, cmake and uv; and
  # static archives only a linker reads (triton's CUPTI copies: about 170 MB).
  [ -x "$VENV/bin/python" ] || die "no virtualenv at $VENV to strip: set HVDKIT_VENV"
  build_only=$("$VENV/bin/python" -m pip list --format=freeze | grep -o -E '^(cmake|uv|nvidia-(cuda-nvcc|cuda-crt|nvvm|cuda-cccl)(-cu[0-9]+)?)==' | tr -d = || true)
  # Not TensorFlow's nvidia-cuda-nvcc-cu12 where TensorFlow is installed: its ptxas is how XLA assembles kernels.
  ! "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("tensorflow")' 2>/dev/null \
    || build_only=$(grep -v -x 'nvidia-cuda-nvcc-cu12' <<<"$build_only" || true)
  [ -z "$build_only" ] || { step "removing build-only packages: $(echo $build_only)"; "$VENV/bin/python" -m pip uninstall -y -q $build_only; }
  find "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" -name '*_static.a' -type f -print -delete
  exit 0
fi

# ---- 1. prerequisites: each failure is one line that says what to install ----
check_python() {
  local ver; ver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  printf '%s\n' "$PYTHON_MIN" "$ver" "$PYTHON_MAX" | sort -C -V \
    || die "Python $ver at $(command -v "$PYTHON") is not supported (hvdkit's pins need $PYTHON_MIN-$PYTHON_MAX): install python3.11 and rerun with HVDKIT_PYTHON=python3.11"
  "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
    || die "Python $ver has no venv/ensurepip module: apt-get install python3-venv (or python$ver-venv)"
}

# PyTorch's headers need C++20 from torch 2.14 (<compare>, concepts, string_view::starts_with: GCC 10), else C++17.
CXX20_PROBE='#include <compare>\n#include <string_view>\n#include <optional>\ntemplate <typename T> requires (sizeof(T) > 0) int f(T) { return 0; }\nint main() { std::optional<int> x{0}; auto o = (1 <=> 2); (void)o; return f(*x) + (std::string_view("ab").starts_with("a") ? 0 : 1); }\n'
CXX17_PROBE='#include <optional>\nint main() { std::optional<int> x{1}; return *x - 1; }\n'
check_compiler() {
  command -v "$CXX_BIN" >/dev/null 2>&1 || die "no C++ compiler '$CXX_BIN' found: apt-get install g++ (Horovod is built from source), or set CXX"
  local std=17 probe=$CXX17_PROBE tmp have
  [ "$MODE" = gpu-tf ] || ! printf '%s\n' 2.14 "$TORCH_VERSION" | sort -C -V || std=20 probe=$CXX20_PROBE
  tmp=$(mktemp -d); printf "$probe" > "$tmp/t.cc"
  "$CXX_BIN" -std=c++"$std" "$tmp/t.cc" -o "$tmp/t" >/dev/null 2>&1 && { rm -rf "$tmp"; return 0; }
  rm -rf "$tmp"; have=$("$CXX_BIN" --version 2>/dev/null | head -n 1)
  [ "$std" = 17 ] && die "$([ "$MODE" = gpu-tf ] && echo "tensorflow $TENSORFLOW_VERSION" || echo "torch $TORCH_VERSION") headers need C++17 and '$CXX_BIN' ($have) cannot compile it: install g++ >= 9 (apt-get install g++) or set CXX"
  die "torch $TORCH_VERSION headers need C++20 and '$CXX_BIN' ($have) cannot compile it: install g++ >= 10 (apt-get install g++-12) and rerun with CXX=g++-12, or build against torch 2.13 with HVDKIT_TORCH_VERSION=2.13.0"
}

# need_debian WHAT "PACKAGES" COMMAND...: installs missing Debian packages when allowed (root, apt-get,
# not --check-only, not HVDKIT_NO_APT=1); otherwise stops with the command to run.
need_debian() {
  local what=$1 packages=$2 c; shift 2
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || break; done
  command -v "$c" >/dev/null 2>&1 && return 0
  if [ "$CHECK_ONLY" = 0 ] && [ "${HVDKIT_NO_APT:-0}" != 1 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    step "installing $what from Debian ($packages)"
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null; } \
      || die "apt-get could not install $what: run 'apt-get install $packages' by hand and rerun"
    for c in "$@"; do command -v "$c" >/dev/null 2>&1 || die "$what installed but '$c' is not on PATH: add /usr/bin to PATH and rerun"; done
  else die "$what not found (no $* on PATH): apt-get install $packages (as root), then rerun"; fi
}

step "checking prerequisites ($MODE mode)" && check_python && check_compiler
need_debian OpenMPI "openmpi-bin libopenmpi-dev" mpicxx mpirun
need_debian patch patch patch
# nvcc (CUDA_HOME; the TensorFlow flavour's default /usr/local/cuda) before anything is made: the framework's CUDA
# major (another torch's is known only once it is installed) and every GPU generation of the list.
[ "$MODE" != gpu ] || [ -z "${CUDA_HOME:-}" ] || "$PYTHON" "$ROOT/scripts/installer.py" nvcc-check "$CUDA_HOME" gpu || exit 1
[ "$MODE" != gpu-tf ] || "$PYTHON" "$ROOT/scripts/installer.py" nvcc-check "${CUDA_HOME:-/usr/local/cuda}" gpu-tf || exit 1
load_series
if [ "$CHECK_ONLY" = 1 ]; then echo "prerequisites OK ($MODE flavour, virtualenv $VENV)"; exit 0; fi

# ---- 2. the venv and the flavour's packages, with uv at the lock's versions ----
# A venv without a working pip is what an interrupted run leaves: made again.
"$VENV/bin/python" -m pip --version >/dev/null 2>&1 || { step "creating virtualenv $VENV"; rm -rf "$VENV"; "$PYTHON" -m venv "$VENV"; }
rm -f "$STAMP"; PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)   # the stamp: when all below succeeded
# pip, quiet, less its per-package note on a missing local mirror.
pip_q() { "${PIP[@]}" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
# The lock as uv and pip read it: every version pinned; another torch (HVDKIT_TORCH_VERSION) brings its own CUDA wheels.
PINS_FILE=$LOCK; [ -z "${HVDKIT_TORCH_VERSION:-}" ] || { PINS_FILE="$VENV/.hvdkit-pins.txt"; { grep -v -E '^(torch|triton|cuda-|nvidia-)' "$LOCK"; echo "torch==$TORCH_VERSION"; } > "$PINS_FILE"; }
pip_q install -c "$PINS_FILE" uv || die "pip could not install uv (the installer): check that the package index is reachable"
# uv reads none of pip's settings: take where this machine's pip finds packages, from whichever has the locked version.
export UV_CACHE_DIR=${UV_CACHE_DIR:-$CACHE_DIR/uv} UV_INDEX_STRATEGY=unsafe-best-match UV_COMPILE_BYTECODE=1
eval "$("$VENV/bin/python" "$ROOT/scripts/installer.py" uv-env)"
UV=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" -c "$PINS_FILE")
case "$MODE" in
  gpu) EXTRAS=(gpu bench horovod); [ -n "${CUDA_HOME:-}" ] || EXTRAS+=(gpu-build); FRAMEWORKS="torch $TORCH_VERSION" ;;
  gpu-tf) EXTRAS=(gpu-tf horovod); FRAMEWORKS="tensorflow $TENSORFLOW_VERSION (CUDA $TF_CUDA_MAJOR)" ;;
  *) EXTRAS=(torch keras bench metrics horovod); FRAMEWORKS="torch $TORCH_VERSION, tensorflow $TENSORFLOW_VERSION" ;;
esac
step "installing $FRAMEWORKS, keras $KERAS_VERSION and the rest of .[$(IFS=,; echo "${EXTRAS[*]}")] (uv)"
"${UV[@]}" -r "$ROOT/pyproject.toml" "${EXTRAS[@]/#/--extra=}" \
  || die "uv could not install hvdkit's requirements (its message is above): check that the package index is reachable and rerun"

# GPU: nvcc, and NCCL from the framework's own wheel (scripts/installer.py gpu-toolchain says where and why).
if [ "$MODE" != cpu ]; then
  TOOLCHAIN=$("$VENV/bin/python" "$ROOT/scripts/installer.py" gpu-toolchain "$MODE") || exit 1
  eval "$TOOLCHAIN"; echo "    $TOOLCHAIN_NOTE"
fi

# ---- 3. Horovod: cached wheel, or patched source build ----
# HOROVOD_WITHOUT_DEBUG_INFO (patch item 10): no -g, a quarter less compile time; 0 keeps line tables.
if [ "$MODE" = gpu-tf ]; then TORCH_FLAG=HOROVOD_WITHOUT_PYTORCH=1; else TORCH_FLAG=HOROVOD_WITH_PYTORCH=1; fi
HOROVOD_FLAGS=("$TORCH_FLAG" HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
               "HOROVOD_WITHOUT_DEBUG_INFO=${HOROVOD_WITHOUT_DEBUG_INFO:-1}")
case "$MODE" in
  # HOROVOD_TORCH_WITHOUT_CUDA is the patch's switch: a CUDA torch needs no CUDA toolkit for a CPU build.
  cpu) HOROVOD_FLAGS+=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_TORCH_WITHOUT_CUDA=1) ;;
  # CUDA_HOME too: torch's cpp_extension (which Horovod's FindPytorch asks for cudart) reads it.
  gpu) HOROVOD_FLAGS+=(HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_CUDA_HOME=$CUDA_ROOT" "CUDA_HOME=$CUDA_ROOT") ;;
  gpu-tf) HOROVOD_FLAGS+=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_CUDA_HOME=$CUDA_ROOT") ;;
esac
[ "$MODE" = cpu ] || HOROVOD_FLAGS+=("HOROVOD_NCCL_HOME=$NCCL_ROOT" "HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-$GPU_CUDA_CC_LIST}")
# The wheel's cache key: everything the binary depends on. [tool.hvdkit]'s pins, the installed versions of
# what the build compiles against or runs (not the lock: a test tool's bump must not rebuild Horovod), the
# flags, the patch, the interpreter and the MPI build.
CACHE_KEY=$( {
  echo "$MODE $HOROVOD_VERSION"; grep -v '_VERSION=' <<<"$PINS" || true
  "$VENV/bin/python" -c 'import importlib.metadata as m, sys, sysconfig; print(sys.version, sysconfig.get_platform())
for name in ("torch", "tensorflow", "tensorflow-cpu", "cmake", "setuptools", "wheel", "cuda-toolkit",
             "nvidia-nccl-cu12", "nvidia-cuda-runtime-cu12"):
    try: print(name, m.version(name))
    except m.PackageNotFoundError: pass'
  printf '%s\n' "${HOROVOD_FLAGS[@]}"; cat "$PATCH_DIR/series" "${PATCHES[@]}"; mpirun --version 2>&1 | head -n 1
  [ "$MODE" = cpu ] || "$CUDA_ROOT/bin/nvcc" --version 2>/dev/null | tail -n 1
} | sha256sum | cut -c1-16)
WHEEL_DIR="$CACHE_DIR/wheels/$CACHE_KEY"
if [ "$(cat "$VENV/.hvdkit-horovod-key" 2>/dev/null)" = "$CACHE_KEY" ] && "$VENV/bin/python" -c 'import horovod' 2>/dev/null; then
  step "Horovod $HOROVOD_VERSION already installed for these pins ($CACHE_KEY)"
else
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    BUILD=$(mktemp -d); trap 'rm -rf "$BUILD"' EXIT
    SDIST="$CACHE_DIR/src/horovod-$HOROVOD_VERSION.tar.gz"
    if [ ! -f "$SDIST" ] || [ "$(sha256sum "$SDIST" | cut -d' ' -f1)" != "$HOROVOD_SDIST_SHA256" ]; then
      step "downloading Horovod $HOROVOD_VERSION source"
      pip_q download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$BUILD"
      got=$(sha256sum "$BUILD/horovod-$HOROVOD_VERSION.tar.gz" | cut -d' ' -f1)
      [ "$got" = "$HOROVOD_SDIST_SHA256" ] \
        || die "horovod-$HOROVOD_VERSION.tar.gz has sha256 $got, expected $HOROVOD_SDIST_SHA256: the package index served a different source; do not build it (check your index/mirror)"
      mkdir -p "$CACHE_DIR/src" && mv "$BUILD/horovod-$HOROVOD_VERSION.tar.gz" "$SDIST"
    fi
    tar xzf "$SDIST" -C "$BUILD"
    step "patching Horovod ($PATCH_NAME/, ${#PATCHES[@]} patches)" && apply_patch "$BUILD/horovod-$HOROVOD_VERSION"
    LOG="$CACHE_DIR/build-$CACHE_KEY.log"
    step "building Horovod $HOROVOD_VERSION ($MODE; about 5 min on 2 cores; log: $LOG)"
    start=$(date +%s); ( while sleep 30; do echo "    ... building, $(( $(date +%s) - start ))s"; done ) & ticker=$!
    if ! env "${HOROVOD_FLAGS[@]}" MAKEFLAGS="-j$(nproc)" PATH="$VENV/bin:$PATH" "${PIP[@]}" wheel -v --no-build-isolation \
         --no-deps --no-cache-dir "$BUILD/horovod-$HOROVOD_VERSION" -w "$BUILD/wheel" >"$LOG" 2>&1; then
      kill "$ticker" 2>/dev/null || true
      # pip's own tail says nothing; show the first compiler/CMake errors instead.
      grep -m 8 -A 3 -E 'CMake Error|error:|Error [0-9]|fatal error' "$LOG" >&2 || tail -n 30 "$LOG" >&2
      die "Horovod build failed (full log: $LOG): the lines above name the cause"
    fi
    kill "$ticker" 2>/dev/null || true; echo "    built in $(( $(date +%s) - start ))s"
    mkdir -p "$CACHE_DIR/wheels"    # moved into place only when complete: a killed build never leaves a bad cache
    rm -rf "$WHEEL_DIR.tmp" && mv "$BUILD/wheel" "$WHEEL_DIR.tmp" && rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
  else
    step "using cached Horovod wheel ($WHEEL_DIR)"
  fi
  pip_q install --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
  echo "$CACHE_KEY" > "$VENV/.hvdkit-horovod-key"
fi

# ---- 4. hvdkit itself, then prove the build ----
[ "$NO_PROJECT" = 0 ] || { step "done without hvdkit itself (--no-project): rerun without it to install hvdkit and check the build"; exit 0; }
step "installing hvdkit (editable, .[$(IFS=,; echo "${EXTRAS[*]}")])"
"${UV[@]}" --no-build-isolation -e "$ROOT[$(IFS=,; echo "${EXTRAS[*]}")]" || die "uv could not install hvdkit (its message is above)"
step "checking Horovod's build (hvdkit env asks the built extension itself)"
case "$MODE" in gpu) REQUIRE=torch,mpi,gloo,nccl,cuda ;; gpu-tf) REQUIRE=tensorflow,mpi,gloo,nccl,cuda ;; *) REQUIRE=torch,tensorflow,mpi,gloo ;; esac
"$VENV/bin/hvdkit" env --require "$REQUIRE" | sed 's/^/    /' || { [ "${PIPESTATUS[0]}" != 2 ] \
  || die "a HOROVOD_* setting in this environment is invalid (named above): fix or unset it and rerun; the build is fine"
  die "the Horovod build lacks what the $MODE flavour needs (see above): read $CACHE_DIR/build-$CACHE_KEY.log, remove $WHEEL_DIR and rerun"; }
date -u +%FT%TZ > "$STAMP"
step "done: activate with 'source $VENV/bin/activate'"
