"""What scripts/install.sh asks Python: hvdkit's pins, and pip's settings passed on to uv.

    python3 scripts/installer.py pins                 # every pin, e.g. TORCH_VERSION=2.14.1, TORCH_CUDA_MAJOR=13
    python3 scripts/installer.py pins TORCH_VERSION   # one value
    python3 scripts/installer.py uv-env               # `export UV_...=` lines from `pip config list`
    python3 scripts/installer.py nvcc-check DIR MAJOR FRAMEWORK   # can DIR/bin/nvcc build this flavour?
    VENV/bin/python scripts/installer.py gpu-toolchain gpu|gpu-tf  # CUDA_ROOT=, NCCL_ROOT= for the build

The pins are in two files, and this is their one reader (the shell scripts and the tests ask it):

- ``requirements.lock``: every package's exact version, transitive ones included, made by ``make lock``
  (``uv pip compile``) from pyproject.toml's dependencies; pip and uv read it as a constraints file.
  A package is NAME_VERSION here (upper case, '-' and '.' as '_', the '-cpu' flavour suffix dropped:
  tensorflow-cpu==2.21.0 is TENSORFLOW_VERSION).
- pyproject.toml's ``[tool.hvdkit]`` table: what a requirements file cannot say (Horovod, which is built
  from its sdist, the sdist's checksum, CUDA, the container engine). ``horovod-version`` is HOROVOD_VERSION.

uv reads none of pip's settings (pip.conf, PIP_* variables), so a machine whose pip is set up for a
mirror would see uv go to PyPI instead: ``uv-env`` passes on where pip finds packages.

Standard library only: install.sh runs this with the interpreter it is about to use, before any venv.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
# A line as `uv pip compile` writes it: `name==version`, then ` ; marker` for some platforms only.
LOCKED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?P<marker>\s*;.*)?$")


# What scripts/install.sh reads: each must be there.
REQUIRED = ("HOROVOD_VERSION", "HOROVOD_SDIST_SHA256", "TORCH_VERSION", "TORCH_CUDA_MAJOR", "KERAS_VERSION",
            "TENSORFLOW_VERSION", "GPU_CUDA_CC_LIST", "PYTHON_MIN", "PYTHON_MAX")


class PinsError(Exception):
    pass


def key(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).upper().removesuffix("_CPU")


def locked_versions(text: str) -> dict[str, str]:
    """``requirements.lock``'s unconditional pins by key; a package pinned only for some platforms is left out."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = LOCKED.match(line)
        if m and not m["marker"]:
            out[key(m["name"]) + "_VERSION"] = m["version"]
    return out


def pins(root: Path = ROOT) -> dict[str, str]:
    try:
        import tomllib
    except ImportError:                 # Python 3.10 (install.sh refuses it later, naming the versions): pip's copy
        try:
            from pip._vendor import tomli as tomllib
        except ImportError:
            raise PinsError(f"Python {sys.version.split()[0]} is too old for hvdkit (it needs 3.11 or newer): "
                            "install python3.11 and set HVDKIT_PYTHON=python3.11") from None
    for path in (root / "pyproject.toml", root / "requirements.lock"):
        if not path.is_file():
            raise PinsError(f"{path} is missing: restore it from git (git checkout -- {path.name})")
    table = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("hvdkit")
    if not table:
        raise PinsError("pyproject.toml has no [tool.hvdkit] table: restore it (git checkout -- pyproject.toml)")
    found = {**locked_versions((root / "requirements.lock").read_text()), **{key(k): str(v) for k, v in table.items()}}
    missing = [k for k in REQUIRED if k not in found]
    if missing:
        raise PinsError(f"no pin {', '.join(missing)} in requirements.lock or pyproject.toml's [tool.hvdkit]: "
                        "restore both from git, or run make lock after editing pyproject.toml")
    return found


# pip's option -> uv's variables. Lists: pip separates them with spaces or lines, uv's UV_FIND_LINKS with commas.
UV_FROM_PIP = {"index-url": ("UV_DEFAULT_INDEX",), "extra-index-url": ("UV_INDEX",), "find-links": ("UV_FIND_LINKS",),
               "trusted-host": ("UV_INSECURE_HOST",), "timeout": ("UV_HTTP_TIMEOUT",),
               "default-timeout": ("UV_HTTP_TIMEOUT",), "cert": ("SSL_CERT_FILE",),
               "proxy": ("HTTPS_PROXY", "HTTP_PROXY"), "no-cache-dir": ("UV_NO_CACHE",)}


def uv_env(pip_config_list: str) -> list[str]:
    r"""``export`` lines for uv from ``pip config list``'s output; as in pip, PIP_* variables win, then [install].

    >>> uv_env("global.extra-index-url='file:///a file:///b'\n:env:.find-links='/w /v'\nglobal.find-links='/x'")
    ["export UV_INDEX='file:///a file:///b'", 'export UV_FIND_LINKS=/w,/v']
    """
    rank = {":env:": 0, "install": 1, "global": 2}
    conf: dict[str, str] = {}
    for line in sorted(pip_config_list.splitlines(), key=lambda s: rank.get(s.split(".", 1)[0], 3)):
        name, _, value = line.partition("=")
        try:
            value = ast.literal_eval(value)      # pip prints each value as a Python literal ('\n'-joined lists too)
        except (ValueError, SyntaxError):
            pass
        conf.setdefault(name.split(".", 1)[-1], str(value))
    out, named = [], set()
    for option, names in UV_FROM_PIP.items():
        value = " ".join(conf.get(option, "").split())          # one line, spaces between list items
        for var in names:
            if value and var not in named:
                named.add(var)
                out.append(f"export {var}={shlex.quote(','.join(value.split()) if option == 'find-links' else value)}")
    return out


class ToolchainError(Exception):
    pass


def cuda_fix(mode: str, found: dict[str, str]) -> str:
    """How to get an nvcc the flavour can use."""
    if mode == "gpu":
        return (f"point CUDA_HOME at a CUDA {found['TORCH_CUDA_MAJOR']} toolkit, or unset it to use NVIDIA's "
                "cuda-toolkit wheels")
    # TensorFlow's GPU wheels are CUDA 12, and PyPI's nvidia-cuda-nvcc-cu12 carries ptxas but no nvcc.
    major = found["TF_CUDA_MAJOR"]
    return (f"install a CUDA {major} toolkit (NVIDIA's; 12.8 or newer builds every GPU generation of the list) and "
            f"set CUDA_HOME to it (PyPI has no CUDA {major} nvcc), or build the image: docker build -f "
            "Dockerfile.gpu --build-arg FLAVOUR=tensorflow .")


def check_nvcc(cuda: Path, major: str, framework: str, fix: str, cc_list: str) -> str:
    """nvcc's release, when ``cuda``/bin/nvcc can build the flavour's kernels; else :class:`ToolchainError`.

    Its CUDA major must be the framework's (one process loads one CUDA; ``major`` empty: any), and it must
    know every GPU generation of ``cc_list`` (sm_100 and sm_120 need CUDA >= 12.8), or the build would stop
    minutes in. An nvcc without --list-gpu-arch (before CUDA 11.6) is not asked.
    """
    nvcc = cuda / "bin" / "nvcc"
    if not os.access(nvcc, os.X_OK):
        raise ToolchainError(f"{cuda} has no bin/nvcc: {fix}")
    shown = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d[\d.]*)", shown)
    release = m.group(1) if m else "unknown"
    if major and release.split(".")[0] != major:
        raise ToolchainError(f"nvcc in {cuda} is CUDA {release} but {framework} is built for CUDA {major}: {fix}")
    known = set(re.findall(r"^compute_(\d+)$", subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True,
                                                               text=True).stdout, re.M))
    missing = [f"sm_{cc}" for cc in cc_list.split(",") if cc.strip() and cc.strip() not in known]
    if known and missing:
        raise ToolchainError(f"nvcc in {cuda} (CUDA {release}) cannot build for {' '.join(missing)}: set "
                             "HOROVOD_BUILD_CUDA_CC_LIST to the generations you need that it knows (e.g. "
                             "HOROVOD_BUILD_CUDA_CC_LIST=75,80,90), or use a newer toolkit of the same CUDA major")
    return release


def gpu_toolchain(mode: str, environ: dict[str, str]) -> dict[str, str]:
    """Where the GPU flavour's Horovod build finds nvcc and NCCL, run by the venv's own Python.

    One CUDA and one NCCL in the process, the framework's: NCCL is its nvidia-nccl wheel (the library it
    loads). torch: nvcc from CUDA_HOME, else the gpu-build extra's cuda-toolkit wheels (given the links a
    toolkit layout has). TensorFlow: nvcc from CUDA_HOME, else /usr/local/cuda (NVIDIA's devel images).
    """
    import importlib.metadata
    import sysconfig

    found = pins()
    site = Path(sysconfig.get_paths()["purelib"])
    cc_list = environ.get("HOROVOD_BUILD_CUDA_CC_LIST") or found["GPU_CUDA_CC_LIST"]
    fix = cuda_fix(mode, found)
    home = environ.get("CUDA_HOME")
    if mode == "gpu":
        version = environ.get("HVDKIT_TORCH_VERSION") or found["TORCH_VERSION"]
        try:
            import torch
        except ImportError as exc:
            raise ToolchainError(f"torch does not import in {sys.prefix} ({exc}): remove it and rerun") from None
        cuda = torch.version.cuda or ""
        if not cuda:
            raise ToolchainError(f"torch {version} in {sys.prefix} is a CPU build: GPU mode needs PyPI's Linux torch "
                                 f"(a CUDA build); remove {sys.prefix} and rerun")
        major = cuda.split(".")[0]
        if not environ.get("HVDKIT_TORCH_VERSION") and major != found["TORCH_CUDA_MAJOR"]:
            raise ToolchainError(f"torch {version} is built for CUDA {cuda} but pyproject.toml's [tool.hvdkit] says "
                                 f"CUDA {found['TORCH_CUDA_MAJOR']}: set torch-cuda-major (and Dockerfile.gpu's "
                                 f"CUDA_VERSION) to {major}")
        root = Path(home) if home else site / "nvidia" / f"cu{major}"
        check_nvcc(root, major, f"torch {version}", fix, cc_list)
        if not home:     # the wheels lay out a toolkit in lib/; nvcc links from lib64/, FindCUDAToolkit wants .so
            if not (root / "lib64").exists():
                (root / "lib64").symlink_to("lib")
            if not (root / "lib" / "libcudart.so").exists():
                (root / "lib" / "libcudart.so").symlink_to(f"libcudart.so.{major}")
        owner, how = "torch's", f"reinstall torch=={version}"
        note = f"CUDA {cuda} from {root}; NCCL from {site / 'nvidia' / 'nccl'} (torch's wheel)"
    else:
        try:
            cuda = importlib.metadata.version("nvidia-cuda-runtime-cu12")
        except importlib.metadata.PackageNotFoundError:
            raise ToolchainError(f"tensorflow {found['TENSORFLOW_VERSION']} in {sys.prefix} came without its CUDA "
                                 f"wheels (tensorflow[and-cuda]): remove {sys.prefix} and rerun") from None
        root = Path(home or "/usr/local/cuda")
        check_nvcc(root, found["TF_CUDA_MAJOR"], f"tensorflow {found['TENSORFLOW_VERSION']}", fix, cc_list)
        owner, how = "TensorFlow's", "reinstall with scripts/install.sh --gpu-tf"
        note = f"nvcc from {root}; CUDA runtime {cuda} and NCCL from TensorFlow's wheels ({site / 'nvidia'})"
    nccl = site / "nvidia" / "nccl"
    if not ((nccl / "include" / "nccl.h").is_file() and (nccl / "lib" / "libnccl.so.2").is_file()):
        raise ToolchainError(f"{owner} NCCL wheel is missing ({nccl} has no include/nccl.h or lib/libnccl.so.2): "
                             f"{how}")
    # Horovod's FindNCCL links -lnccl: point that at the wheel's libnccl.so.2 (RUNPATH keeps it at run time).
    if not (nccl / "lib" / "libnccl.so").exists():
        (nccl / "lib" / "libnccl.so").symlink_to("libnccl.so.2")
    return {"CUDA_ROOT": str(root), "NCCL_ROOT": str(nccl), "TOOLCHAIN_NOTE": note}


def patch_series(folder: Path) -> list[Path]:
    """The patches ``folder/series`` names, in its order (``#`` comments and blank lines skipped)."""
    restore = "restore it from git (git checkout -- scripts/patches)"
    try:
        lines = (folder / "series").read_text().splitlines()
    except OSError:
        raise PinsError(f"{folder}/series is missing: {restore}") from None
    names = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if not names:
        raise PinsError(f"{folder}/series names no patch: {restore}")
    for name in names:
        if not (folder / name).is_file():
            raise PinsError(f"{folder}/series names {name}, which is not there: {restore}")
    return [folder / name for name in names]


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "series":
        try:
            print("\n".join(str(p) for p in patch_series(Path(args[0]))))
        except PinsError as exc:
            print(f"hvdkit install: error: {exc}", file=sys.stderr)
            return 1
        return 0
    if command == "uv-env":
        listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
        print("\n".join(uv_env(listed.stdout)))
        return 0
    if command in ("nvcc-check", "gpu-toolchain"):
        try:
            if command == "gpu-toolchain":
                values = gpu_toolchain(args[0], dict(os.environ))
                print("\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items()))
            else:
                found, (directory, mode) = pins(), args
                major = found["TORCH_CUDA_MAJOR" if mode == "gpu" else "TF_CUDA_MAJOR"]
                framework = (f"torch {found['TORCH_VERSION']}" if mode == "gpu"
                             else f"tensorflow {found['TENSORFLOW_VERSION']}")
                cc_list = os.environ.get("HOROVOD_BUILD_CUDA_CC_LIST") or found["GPU_CUDA_CC_LIST"]
                check_nvcc(Path(directory), "" if os.environ.get("HVDKIT_TORCH_VERSION") else major, framework,
                           cuda_fix(mode, found), cc_list)
        except (ToolchainError, PinsError) as exc:
            print(f"hvdkit install: error: {exc}", file=sys.stderr)
            return 1
        return 0
    if command != "pins":
        print("usage: installer.py pins [KEY...] | uv-env | nvcc-check DIR MODE | gpu-toolchain MODE | series DIR",
              file=sys.stderr)
        return 2
    try:
        found = pins()
    except PinsError as exc:
        print(f"hvdkit pins: error: {exc}", file=sys.stderr)
        return 1
    missing = [k for k in args if k not in found]
    if missing:
        print(f"hvdkit pins: error: no pin {', '.join(missing)} in requirements.lock or pyproject.toml's "
              "[tool.hvdkit]: restore them from git", file=sys.stderr)
        return 1
    print("\n".join(found[k] for k in args) if args else "\n".join(f"{k}={v}" for k, v in found.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
