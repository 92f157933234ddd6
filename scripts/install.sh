#!/usr/bin/env bash
# hvdkit install: the user's install (frameworks, a patched Horovod built from source, hvdkit),
# at the versions pinned in constraints.txt. The tests' extra tools: scripts/test-setup.sh.
#
#   scripts/install.sh            # CPU: OpenMPI + Gloo, torch (CPU), tensorflow-cpu
#   scripts/install.sh --gpu      # GPU: torch + Keras 3 (torch backend), Horovod with NCCL (no GPU needed to build)
#   scripts/install.sh --check-only   # prerequisites only, changes nothing
#   scripts/install.sh --print-pins   # constraints.txt's pins as KEY=VALUE lines (the tests read them)
#   scripts/install.sh --patch-only DIR   # apply the guarded Horovod patch to an unpacked sdist
#   scripts/install.sh --gpu --no-project # everything but hvdkit itself (Dockerfile.gpu's cached layer)
#   scripts/install.sh --strip-build-tools # remove nvcc's wheels and cmake from a GPU venv after the build
#
# What it does, in order, each step safe to rerun:
#   1. checks prerequisites (Python, a C++17/C++20 compiler as torch needs, OpenMPI; GPU: CUDA, NCCL)
#      and installs Debian's OpenMPI when absent and we may use apt-get;
#   2. creates the virtualenv (recreates it if a previous run left it broken);
#   3. installs the flavour's packages (pyproject.toml's extras) at constraints.txt's versions;
#   4. builds Horovod from its sdist with scripts/patches/horovod-*.patch, or
#      reuses the wheel cached under $HVDKIT_CACHE_DIR for the same inputs;
#   5. installs hvdkit (editable) and checks Horovod's build with `hvdkit env`
#      (frameworks, controllers, NCCL on GPU); only then writes the stamp Make reads.
#
# Environment: HVDKIT_VENV (default .venv; --gpu: .venv-gpu), HVDKIT_PYTHON (default python3),
# HVDKIT_CACHE_DIR (default ~/.cache/hvdkit), HVDKIT_NO_APT=1 (never apt-get),
# HVDKIT_TORCH_VERSION (build against another torch than the pin),
# HVDKIT_INSTALLER (uv, the default, or pip; uv's cache: $HVDKIT_CACHE_DIR/uv unless UV_CACHE_DIR),
# CXX (compiler); GPU mode: CUDA_HOME (a CUDA toolkit whose major matches torch's;
# without it nvcc comes from NVIDIA's cuda-toolkit wheels at torch's pin),
# HOROVOD_BUILD_CUDA_CC_LIST (default $GPU_CUDA_CC_LIST).
set -euo pipefail

# Versions: constraints.txt at the top level holds every pin (pip reads its name==version
# lines, this script also its `#@ KEY=VALUE` lines); pyproject.toml says which packages each
# flavour needs (its extras). No version is written here.
# Debian packages installed when missing: MPI (OpenMPI 4.1.4 on Debian 12) and patch.
OPENMPI_APT_PACKAGES="openmpi-bin libopenmpi-dev"
PATCH_APT_PACKAGES="patch"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONSTRAINTS="$ROOT/constraints.txt"
MODE=cpu
CHECK_ONLY=0
PATCH_ONLY_DIR=
NO_PROJECT=0

die() { echo "hvdkit install: error: $*" >&2; exit 1; }
step() { echo "==> $*"; }

# constraints.txt as KEY=VALUE lines: `name==version` as NAME_VERSION (upper case, '-' and
# '.' to '_', a '-cpu' flavour suffix dropped), `#@ KEY=VALUE` as it stands.
print_pins() {
  [ -f "$CONSTRAINTS" ] || die "$CONSTRAINTS is missing: restore it from git (git checkout -- constraints.txt)"
  awk '
    /^#@ *[A-Z][A-Z0-9_]*=/ { sub(/^#@ */, ""); sub(/[ \t]+#.*$/, ""); print; next }
    /^[A-Za-z0-9][A-Za-z0-9._-]*==/ {
      split($1, a, "=="); n = toupper(a[1]); sub(/-CPU$/, "", n); gsub(/[-.]/, "_", n)
      print n "_VERSION=" a[2]
    }' "$CONSTRAINTS"
}

# Every pin as a shell variable; a pin this script needs and the file lacks stops here.
load_pins() {
  local key value
  [ -f "$CONSTRAINTS" ] || die "$CONSTRAINTS is missing: restore it from git (git checkout -- constraints.txt)"
  while IFS='=' read -r key value; do printf -v "$key" '%s' "$value"; done < <(print_pins)
  for key in HOROVOD_VERSION HOROVOD_SDIST_SHA256 TORCH_VERSION TORCH_CUDA_MAJOR TENSORFLOW_VERSION \
             KERAS_VERSION TF_KERAS_VERSION MPI4PY_VERSION GPU_CUDA_CC_LIST PYTHON_MIN PYTHON_MAX; do
    [ -n "${!key:-}" ] || die "constraints.txt pins no $key: restore it from git (git checkout -- constraints.txt)"
  done
}
load_pins
PATCH_FILE="$ROOT/scripts/patches/horovod-$HOROVOD_VERSION.patch"

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
    --no-project) NO_PROJECT=1 ;;
    --strip-build-tools) STRIP_BUILD_TOOLS=1 ;;
    --patch-only) [ $# -ge 2 ] || die "--patch-only needs a directory: scripts/install.sh --patch-only horovod-$HOROVOD_VERSION"
                  PATCH_ONLY_DIR=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1': use --cpu, --gpu, --check-only, --print-pins, --patch-only DIR, --no-project or --strip-build-tools" ;;
  esac
  shift
done
if [ -n "$PATCH_ONLY_DIR" ]; then
  command -v patch >/dev/null 2>&1 || die "'patch' not found: apt-get install patch"
  apply_patch "$PATCH_ONLY_DIR"
  echo "patched $PATCH_ONLY_DIR with scripts/patches/$(basename "$PATCH_FILE")"
  exit 0
fi

TORCH_VERSION=${HVDKIT_TORCH_VERSION:-$TORCH_VERSION}
# One virtualenv name per flavour, as make install / make install-gpu and the Slurm scripts use them.
if [ "$MODE" = gpu ] || [ "${STRIP_BUILD_TOOLS:-0}" = 1 ]; then DEFAULT_VENV=.venv-gpu; else DEFAULT_VENV=.venv; fi
VENV=${HVDKIT_VENV:-$ROOT/$DEFAULT_VENV}
# What only the Horovod build needs: nvcc and its parts (the cuda-toolkit extras
# nvcc and cccl; torch's own CUDA libraries stay), cmake and the installer uv. The runtime image has none.
if [ "${STRIP_BUILD_TOOLS:-0}" = 1 ]; then
  [ -x "$VENV/bin/python" ] || die "no virtualenv at $VENV to strip: set HVDKIT_VENV"
  build_only=$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null \
    | sed 's/==.*//' | grep -E '^(cmake|uv|nvidia-cuda-nvcc.*|nvidia-cuda-crt.*|nvidia-nvvm.*|nvidia-cuda-cccl.*)$' || true)
  if [ -n "$build_only" ]; then
    step "removing build-only packages from $VENV: $(echo $build_only)"
    "$VENV/bin/python" -m pip uninstall -y -q $build_only
  fi
  # Static archives only a linker reads (triton's CUPTI copies: about 170 MB); shared libraries stay.
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  find "$site" -name '*_static.a' -type f -print -delete | sed 's/^/    removed /'
  exit 0
fi
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

# The C++ standard PyTorch's headers need: C++20 from torch 2.14, else C++17.
torch_cxx_standard() {
  local major minor
  IFS=. read -r major minor _ <<<"$TORCH_VERSION"
  if [ "$major" -gt 2 ] || { [ "$major" = 2 ] && [ "${minor:-0}" -ge 14 ]; }; then echo 20; else echo 17; fi
}

check_compiler() {
  command -v "$CXX_BIN" >/dev/null 2>&1 \
    || die "no C++ compiler '$CXX_BIN' found: apt-get install g++ (Horovod is built from source), or set CXX"
  local std tmp cxx_version
  std=$(torch_cxx_standard)
  tmp=$(mktemp -d)
  # What torch's headers use: std::optional (C++17); <compare>, concepts and
  # string_view::starts_with (C++20, first complete in GCC 10 / Clang 10).
  if [ "$std" = 20 ]; then
    printf '%s\n' '#include <compare>' '#include <string_view>' '#include <optional>' \
      'template <typename T> requires (sizeof(T) > 0) int f(T) { return 0; }' \
      'int main() { std::optional<int> x{0}; auto o = (1 <=> 2); (void)o;' \
      '  return f(*x) + (std::string_view("ab").starts_with("a") ? 0 : 1); }' > "$tmp/t.cc"
  else
    printf '#include <optional>\nint main() { std::optional<int> x{1}; return *x - 1; }\n' > "$tmp/t.cc"
  fi
  if ! "$CXX_BIN" -std=c++"$std" "$tmp/t.cc" -o "$tmp/t" >/dev/null 2>&1; then
    rm -rf "$tmp"
    cxx_version=$("$CXX_BIN" --version 2>/dev/null | head -n 1)
    if [ "$std" = 20 ]; then
      die "torch $TORCH_VERSION headers need C++20 and '$CXX_BIN' ($cxx_version) cannot compile it: install g++ >= 10 (apt-get install g++-12) and rerun with CXX=g++-12, or build against torch 2.13 with HVDKIT_TORCH_VERSION=2.13.0"
    fi
    die "torch $TORCH_VERSION headers need C++17 and '$CXX_BIN' ($cxx_version) cannot compile it: install g++ >= 9 (apt-get install g++) or set CXX"
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

# GPU: a CUDA_HOME given must hold nvcc (without one, nvcc comes from NVIDIA's wheels later).
# Its CUDA major is checked against the pin here, before anything is created, and
# against the installed torch's own CUDA again in step 3b.
check_cuda_home() {
  [ "$MODE" = gpu ] && [ -n "${CUDA_HOME:-}" ] || return 0
  [ -x "$CUDA_HOME/bin/nvcc" ] \
    || die "CUDA_HOME=$CUDA_HOME has no bin/nvcc: point it at a CUDA $TORCH_CUDA_MAJOR toolkit, or unset it to use NVIDIA's cuda-toolkit wheels"
  local release
  release=$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
  [ -n "${HVDKIT_TORCH_VERSION:-}" ] || [ "${release%%.*}" = "$TORCH_CUDA_MAJOR" ] \
    || die "nvcc in $CUDA_HOME is CUDA ${release:-unknown} but torch $TORCH_VERSION is built for CUDA $TORCH_CUDA_MAJOR: point CUDA_HOME at a CUDA $TORCH_CUDA_MAJOR toolkit, or unset it to use NVIDIA's cuda-toolkit wheels"
}

step "checking prerequisites ($MODE mode)"
check_python
check_compiler
check_mpi
need_debian patch "$PATCH_APT_PACKAGES" patch
check_cuda_home
[ -f "$PATCH_FILE" ] || die "patch $PATCH_FILE is missing: restore it from git (git checkout -- scripts/patches)"
if [ "$CHECK_ONLY" = 1 ]; then echo "prerequisites OK ($MODE flavour, virtualenv $VENV)"; exit 0; fi

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

# The pins pip and uv apply: constraints.txt, or a copy with another torch (HVDKIT_TORCH_VERSION).
PINS_FILE=$CONSTRAINTS
if [ -n "${HVDKIT_TORCH_VERSION:-}" ]; then
  PINS_FILE="$VENV/.hvdkit-constraints.txt"
  sed "s/^torch==[^ ]*/torch==$TORCH_VERSION/" "$CONSTRAINTS" > "$PINS_FILE"
fi

# uv installs the frameworks in a half to a third of pip's time (the CPU flavour into an empty venv
# with an empty cache, three runs: pip 153-403 s, uv 81-122 s; docs/TESTING.md). It is a package in the venv
# (pinned), which stays a plain venv; pip does everything else, and takes over when uv fails or
# HVDKIT_INSTALLER=pip. uv reads none of pip's settings: uv_settings passes on where packages come
# from (pip config list: files and PIP_* variables) and resolves across indexes as pip does.
INSTALLER=${HVDKIT_INSTALLER:-uv}
UV_ARGS=() UV_ENV=()
uv_settings() {
  local kind value
  while IFS=' ' read -r kind value; do
    if [ "$kind" = arg ]; then UV_ARGS+=("$value"); else UV_ENV+=("$value"); fi
  done < <("$VENV/bin/python" - <<'PY'
import ast, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
rank = {"global": 0, "install": 1, ":env:": 2}          # later wins, as in pip
settings = {}
for line in sorted(out.splitlines(), key=lambda s: rank.get(s.split(".", 1)[0], -1)):
    section, _, rest = line.partition(".")
    key, _, value = rest.partition("=")
    if section in rank and value:
        settings[key] = ast.literal_eval(value)
flags = {"index-url": "--default-index", "extra-index-url": "--index", "find-links": "--find-links",
         "trusted-host": "--allow-insecure-host"}
for key, flag in flags.items():
    for value in settings.get(key, "").split():
        print("arg", flag); print("arg", value)
if "no-cache-dir" in settings:
    print("arg --no-cache")
for key, var in (("timeout", "UV_HTTP_TIMEOUT"), ("default-timeout", "UV_HTTP_TIMEOUT"), ("cert", "SSL_CERT_FILE"),
                 ("proxy", "HTTPS_PROXY"), ("proxy", "HTTP_PROXY")):
    if key in settings:
        print("env", f"{var}={settings[key]}")
PY
)
}
# install_pinned ARGS...: `pip install` arguments, run by uv when it can, else by pip.
install_pinned() {
  if [ "$INSTALLER" = uv ]; then
    if env "${UV_ENV[@]}" UV_CACHE_DIR="${UV_CACHE_DIR:-$CACHE_DIR/uv}" "$VENV/bin/uv" pip install --quiet \
         --python "$VENV/bin/python" --index-strategy unsafe-best-match --compile-bytecode "${UV_ARGS[@]}" "$@"; then
      return 0
    fi
    echo "    note: uv could not install this; pip takes over (HVDKIT_INSTALLER=pip skips uv)" >&2
  fi
  pip_q install -q "$@"
}
if [ "$INSTALLER" = uv ]; then
  if pip_q install -q -c "$PINS_FILE" uv && "$VENV/bin/uv" --version >/dev/null 2>&1; then
    uv_settings
  else
    echo "    note: could not install uv; installing with pip" >&2
    INSTALLER=pip
  fi
fi

# ---- 3. frameworks and tools ---------------------------------------------------
# The flavour is a set of pyproject.toml's extras. GPU: torch's CUDA wheels and Keras 3 on
# the PyTorch backend: TensorFlow 2.21's GPU build (tensorflow[and-cuda]) needs CUDA 12
# wheels while PyPI's torch is CUDA 13, and one Horovod links one CUDA and one NCCL.
if [ "$MODE" = gpu ]; then EXTRAS=gpu,bench,horovod; else EXTRAS=torch,keras,bench,horovod; fi

# The requirements of hvdkit's dependencies and of the extras named, read from pyproject.toml
# without installing hvdkit (Dockerfile.gpu runs this step before it copies hvdkit's code).
project_requirements() {  # project_requirements EXTRA,EXTRA...
  "$VENV/bin/python" - "$ROOT/pyproject.toml" "$1" <<'PY'
import sys
try:
    import tomllib
except ImportError:                       # Python 3.10: pip's own copy
    from pip._vendor import tomli as tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
extras = project.get("optional-dependencies", {})
reqs, todo, seen = list(project.get("dependencies", [])), sys.argv[2].split(","), set()
while todo:
    extra = todo.pop()
    if extra in seen:
        continue
    seen.add(extra)
    if extra not in extras:
        sys.exit(f"pyproject.toml has no extra {extra!r}")
    for req in extras[extra]:
        name, _, rest = req.replace(" ", "").partition("[")
        if name == project["name"]:       # hvdkit[torch]: another extra of ours
            todo += rest.rstrip("]").split(",")
        else:
            reqs.append(req)
print("\n".join(dict.fromkeys(reqs)))
PY
}
mapfile -t REQUIREMENTS < <(project_requirements "$EXTRAS")
[ "${#REQUIREMENTS[@]}" -gt 0 ] || die "could not read hvdkit's requirements from $ROOT/pyproject.toml"
if [ "$MODE" = gpu ]; then
  step "installing torch $TORCH_VERSION (CUDA build), keras $KERAS_VERSION, mpi4py $MPI4PY_VERSION (.[$EXTRAS], with $INSTALLER)"
else
  step "installing torch $TORCH_VERSION, tensorflow $TENSORFLOW_VERSION, keras $KERAS_VERSION, tf-keras $TF_KERAS_VERSION, mpi4py $MPI4PY_VERSION (.[$EXTRAS], with $INSTALLER)"
fi
install_pinned -c "$PINS_FILE" "${REQUIREMENTS[@]}"

# ---- 3b. GPU: one CUDA and one NCCL, both torch's ------------------------------
# NCCL is torch's own nvidia-nccl wheel (the library torch loads), so the process
# holds a single libnccl.so.2. nvcc comes from CUDA_HOME, else from NVIDIA's
# cuda-toolkit wheels at the version torch pins; its CUDA major must be torch's.
gpu_toolchain() {
  local torch_cuda cuda_major site tk_pin nvcc_release
  torch_cuda=$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)
  [ -n "$torch_cuda" ] || die "torch $TORCH_VERSION in $VENV is a CPU build: GPU mode needs PyPI's Linux torch (a CUDA build); remove $VENV and rerun"
  cuda_major=${torch_cuda%%.*}
  [ "$cuda_major" = "$TORCH_CUDA_MAJOR" ] || [ -n "${HVDKIT_TORCH_VERSION:-}" ] \
    || die "torch $TORCH_VERSION is built for CUDA $torch_cuda but the pins say CUDA $TORCH_CUDA_MAJOR: set TORCH_CUDA_MAJOR in scripts/install.sh (and Dockerfile.gpu's CUDA_VERSION) to $cuda_major"
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [ -n "${CUDA_HOME:-}" ]; then
    CUDA_ROOT=$CUDA_HOME
    [ -x "$CUDA_ROOT/bin/nvcc" ] || die "CUDA_HOME=$CUDA_HOME has no bin/nvcc: point it at a CUDA $cuda_major toolkit, or unset it to use NVIDIA's cuda-toolkit wheels"
  else
    # The cuda-toolkit version torch itself requires, e.g. 13.0.3.
    tk_pin=$("$VENV/bin/python" -c '
import re, importlib.metadata as m
for r in m.requires("torch") or []:
    x = re.match(r"cuda-toolkit\[[^]]*\]==([0-9.]+)", r.replace(" ", ""))
    if x: print(x.group(1)); break')
    [ -n "$tk_pin" ] || die "torch $TORCH_VERSION does not require cuda-toolkit wheels: set CUDA_HOME to a CUDA $cuda_major toolkit"
    step "installing nvcc from NVIDIA's cuda-toolkit[nvcc,cccl]==$tk_pin wheels (torch's CUDA $torch_cuda)"
    pip_q install -q "cuda-toolkit[nvcc,cccl,cudart]==$tk_pin"
    CUDA_ROOT="$site/nvidia/cu$cuda_major"
    [ -x "$CUDA_ROOT/bin/nvcc" ] || die "cuda-toolkit[nvcc]==$tk_pin installed no $CUDA_ROOT/bin/nvcc: set CUDA_HOME to a CUDA $cuda_major toolkit"
    # The wheels lay out a toolkit in lib/, while nvcc links from lib64/ and CMake's
    # FindCUDAToolkit wants the unversioned development name: add both links.
    [ -e "$CUDA_ROOT/lib64" ] || ln -s lib "$CUDA_ROOT/lib64"
    [ -e "$CUDA_ROOT/lib/libcudart.so" ] || ln -s libcudart.so."$cuda_major" "$CUDA_ROOT/lib/libcudart.so"
  fi
  nvcc_release=$("$CUDA_ROOT/bin/nvcc" --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
  [ "${nvcc_release%%.*}" = "$cuda_major" ] \
    || die "nvcc in $CUDA_ROOT is CUDA $nvcc_release but torch $TORCH_VERSION is built for CUDA $torch_cuda: use a CUDA $cuda_major toolkit (CUDA_HOME) or unset CUDA_HOME to use NVIDIA's wheels"
  NCCL_ROOT="$site/nvidia/nccl"
  [ -f "$NCCL_ROOT/include/nccl.h" ] && [ -f "$NCCL_ROOT/lib/libnccl.so.2" ] \
    || die "torch's NCCL wheel is missing ($NCCL_ROOT has no include/nccl.h or lib/libnccl.so.2): reinstall torch==$TORCH_VERSION"
  # Horovod's FindNCCL links -lnccl; point that at torch's libnccl.so.2 (RUNPATH keeps it there at run time).
  [ -e "$NCCL_ROOT/lib/libnccl.so" ] || ln -s libnccl.so.2 "$NCCL_ROOT/lib/libnccl.so"
  echo "    CUDA $nvcc_release from $CUDA_ROOT; NCCL from $NCCL_ROOT (torch's wheel)"
}
if [ "$MODE" = gpu ]; then gpu_toolchain; fi

# ---- 4. Horovod: cached wheel, or patched source build --------------------------
# HOROVOD_WITHOUT_DEBUG_INFO (patch item 10): no -g, a quarter less compile time; set it to 0 to keep line tables.
HOROVOD_FLAGS=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
               "HOROVOD_WITHOUT_DEBUG_INFO=${HOROVOD_WITHOUT_DEBUG_INFO:-1}")
if [ "$MODE" = cpu ]; then
  # HOROVOD_TORCH_WITHOUT_CUDA is the patch's switch: a CUDA torch needs no CUDA toolkit for a CPU build.
  HOROVOD_FLAGS+=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_TORCH_WITHOUT_CUDA=1)
else
  # CUDA_HOME too: torch's cpp_extension (which Horovod's FindPytorch asks for cudart) reads it.
  HOROVOD_FLAGS+=(HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_CUDA_HOME=$CUDA_ROOT" "CUDA_HOME=$CUDA_ROOT"
                  "HOROVOD_NCCL_HOME=$NCCL_ROOT" "HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-$GPU_CUDA_CC_LIST}")
fi
# The cache key covers everything the binary depends on: a change of any pin the build can
# see (Horovod's, the `#@` pins, the version of every package step 3 installed, which are
# constraints.txt's), the patch, the flags, the interpreter or the MPI build gives a new wheel.
# The dev extra's pins (the test tools) are not in it: the venv has none of them at first.
CACHE_KEY=$( {
  echo "$HOROVOD_VERSION $HOROVOD_SDIST_SHA256 $TORCH_VERSION $TENSORFLOW_VERSION $MODE"
  print_pins | grep -v '_VERSION='
  "$VENV/bin/python" - "${REQUIREMENTS[@]}" <<'PY'
import importlib.metadata as m, re, sys
for name in sorted({re.match(r"[A-Za-z0-9._-]+", r).group(0) for r in sys.argv[1:]}):
    print(name, m.version(name))
PY
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
if [ "$NO_PROJECT" = 1 ]; then
  step "done without hvdkit itself (--no-project): rerun without it to install hvdkit and check the build"
  exit 0
fi
step "installing hvdkit (editable, .[$EXTRAS])"
# Everything it requires is in place (step 3); pip only checks that and adds hvdkit.
pip_q install -q --no-build-isolation -c "$PINS_FILE" -e "${ROOT}[$EXTRAS]"

step "checking Horovod's build (hvdkit env)"
# hvdkit env asks the built extension itself in one process; horovodrun
# --check-build gives the same answers but forks one framework import per flag.
"$VENV/bin/hvdkit" env | sed 's/^/    /'
"$VENV/bin/hvdkit" env --json | "$VENV/bin/python" -c '
import json, sys
mode = sys.argv[1]
r = json.load(sys.stdin)
b = r.get("horovod") or sys.exit("Horovod is not usable: %s" % r.get("horovod_error"))
need = {"PyTorch": b["frameworks"]["torch"], "MPI": b["controllers"]["mpi"], "Gloo": b["controllers"]["gloo"]}
if mode == "gpu":
    need.update(NCCL=b["tensor_operations"]["nccl"], CUDA=b["cuda_built"])
else:
    need["TensorFlow"] = b["frameworks"]["tensorflow"]
missing = [k for k, ok in need.items() if not ok]
sys.exit("Horovod was built without " + ", ".join(missing) if missing else 0)
' "$MODE" 2>&1 || die "the Horovod build is incomplete (see above): read $CACHE_DIR/build-$CACHE_KEY.log, remove $WHEEL_DIR and rerun"
date -u +%FT%TZ > "$STAMP"
step "done: activate with 'source $VENV/bin/activate'"
