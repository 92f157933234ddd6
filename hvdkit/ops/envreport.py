"""The environment report behind `hvdkit env`: versions and Horovod build flags.

Example::

    from hvdkit.ops.envreport import collect, render_text
    print(render_text(collect()))

Nothing here imports torch or tensorflow: package versions come from their
metadata, Horovod's build flags from a probe subprocess
(:mod:`hvdkit.ops.horovod_probe`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hvdkit
from hvdkit.common.files import WriteError, atomic_write
from hvdkit.common.shared_memory import shm_bytes
from hvdkit.common.tuning import horovod_setting_errors
from hvdkit.ops.procs import NOT_FOUND, TIMED_OUT, run_bounded

# Report name -> distributions that provide it (first installed one wins).
PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly"),
    "keras": ("keras",),
    "tf_keras": ("tf-keras",),
    "horovod": ("horovod",),
    "mpi4py": ("mpi4py",),
    "numpy": ("numpy",),
}

PROBE_TIMEOUT_S = 120


@dataclass
class HorovodBuild:
    """How the installed Horovod was compiled (what `horovodrun --check-build` shows)."""

    version: str
    frameworks: dict[str, bool]
    controllers: dict[str, bool]
    tensor_operations: dict[str, bool]
    nccl_version: str | None = None
    cuda_built: bool = False
    torch_cxx_standard: str | None = None
    cuda_arches: dict[str, list[int]] | None = None   # {"sass": [75, ...], "ptx": [120]} from the library's fatbin
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class EnvReport:
    hvdkit: str
    python: str
    python_executable: str
    platform: str
    packages: dict[str, str | None]
    torch_cuda: str | None
    horovod: HorovodBuild | None
    horovod_error: str | None
    mpi: str | None
    gpus: list[str]
    hostname: str = ""
    cpu_count: int = 0
    interfaces: dict[str, list[str]] = field(default_factory=dict)
    horovod_settings: dict[str, str] = field(default_factory=dict)   # every HOROVOD_* set here
    setting_errors: dict[str, str] = field(default_factory=dict)     # those Horovod would misread: name -> why
    tensorflow_cuda: str | None = None     # the CUDA TensorFlow was built with; None: CPU build or no TensorFlow
    # TensorFlow's CUDA wheels (tensorflow[and-cuda]'s nvidia-cuda-runtime-cu12) installed: PyPI's Linux
    # `tensorflow` is a CUDA build even where only tensorflow-cpu was asked for (tf-keras pulls it in).
    tensorflow_cuda_wheels: bool = False
    shm_bytes: int | None = None           # /dev/shm's size: NCCL and DataLoader workers need ~1 GiB on a GPU host

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "EnvReport":
        """The inverse of :meth:`to_dict` (e.g. another host's ``hvdkit env --json``)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if known.get("horovod") is not None:
            hb = known["horovod"]
            known["horovod"] = HorovodBuild(**{k: v for k, v in hb.items() if k in HorovodBuild.__dataclass_fields__})
        return cls(**known)


def package_version(names: tuple[str, ...]) -> str | None:
    """Version of the first installed distribution among ``names``, else None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def package_file(package: str, *parts: str) -> str | None:
    """The text of a file inside an installed package, found without importing the package (seconds for TF)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], *parts), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def torch_cuda_version() -> str | None:
    """CUDA version torch was built with, read from torch/version.py."""
    match = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*'([^']+)'", package_file("torch", "version.py") or "", re.M)
    return match.group(1) if match else None


def tensorflow_cuda_version() -> str | None:
    """CUDA version TensorFlow was built with (None: a CPU build), read from its build_info.py."""
    text = package_file("tensorflow", "python", "platform", "build_info.py") or ""
    match = re.search(r"'cuda_version',\s*'([^']+)'", text)
    return match.group(1) if match and re.search(r"'is_cuda_build',\s*True", text) else None


def mpi_version() -> str | None:
    """First line of ``mpirun --version`` (e.g. "mpirun (Open MPI) 4.1.4"), None without MPI."""
    if shutil.which("mpirun") is None:
        return None
    rc, out, err = run_bounded(["mpirun", "--version"], timeout=20)
    if rc in (TIMED_OUT, NOT_FOUND):
        return None
    lines = (out or err).strip().splitlines()
    return lines[0] if lines else None


def gpu_names() -> list[str]:
    """One "index: name (driver X)" line per GPU via nvidia-smi; empty on CPU hosts."""
    if shutil.which("nvidia-smi") is None:
        return []
    rc, out, _ = run_bounded(["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                             timeout=20)
    if rc in (TIMED_OUT, NOT_FOUND):
        return []
    rows = [r.split(", ") for r in out.strip().splitlines() if r.strip()]
    return [f"{r[0]}: {r[1]} (driver {r[2]})" for r in rows if len(r) == 3]


def parse_probe(payload: dict) -> tuple[HorovodBuild | None, str | None]:
    """Turn the probe's JSON into a HorovodBuild, or (None, reason)."""
    if not payload.get("installed"):
        return None, payload.get("error", "horovod is not installed")
    if "controllers" not in payload:
        errors = payload.get("errors") or {}
        detail = "; ".join(f"{k}: {v}" for k, v in errors.items()) or "no framework extension was built"
        return None, f"horovod {payload.get('version')} is installed but unusable ({detail})"
    return HorovodBuild(
        version=payload["version"],
        frameworks=payload["frameworks"],
        controllers=payload["controllers"],
        tensor_operations=payload["tensor_operations"],
        nccl_version=payload.get("nccl_version"),
        cuda_built=payload.get("cuda_built", False),
        torch_cxx_standard=payload.get("torch_cxx_standard"),
        cuda_arches=payload.get("cuda_arches"),
        errors=payload.get("errors") or {},
    ), None


def probe_horovod(python: str = sys.executable) -> tuple[HorovodBuild | None, str | None]:
    """Horovod's build flags, from the probe subprocess or from the record of its last answer.

    The probe imports torch (about 3 s of CPU), and every ``hvdkit launch`` asks; its answer only changes when
    Horovod's libraries or a framework are reinstalled, so a clean answer is kept under
    :func:`probe_cache_path`, named by the files it depends on (:func:`install_identity`).
    """
    cache = probe_cache_path() if python == sys.executable else None
    if cache is not None:
        try:
            return parse_probe(json.loads(cache.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass                          # absent or unreadable: ask the probe
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    rc, out, err = run_bounded([python, "-m", "hvdkit.ops.horovod_probe"], timeout=PROBE_TIMEOUT_S, env=env)
    if rc == TIMED_OUT:
        return None, f"probing horovod took over {PROBE_TIMEOUT_S}s"
    try:
        payload = json.loads(out)
    except json.JSONDecodeError:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return None, f"horovod probe failed: {tail}"
    build, error = parse_probe(payload)
    if cache is not None and build is not None and not build.errors:
        try:                              # a record for the next launch; without one it only probes again
            atomic_write(cache, lambda f: f.write(json.dumps(payload).encode()), "horovod probe record")
        except WriteError:
            pass
    return build, error


def install_identity() -> list[tuple[str, int, int]] | None:
    """(path, size, mtime_ns) of what the probe's answer depends on, found without importing any of it:
    Horovod's package and framework libraries, torch's and TensorFlow's packages, and the probe itself."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.origin:
        return None
    root = os.path.dirname(spec.origin)
    paths = [spec.origin, os.path.abspath(__file__), os.path.join(os.path.dirname(__file__), "horovod_probe.py")]
    for sub in ("torch", "tensorflow"):
        folder = os.path.join(root, sub)
        try:
            paths += sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.startswith("mpi_lib"))
        except OSError:                   # not built for this framework (or unreadable): nothing to stat
            pass
    for framework in ("torch", "tensorflow"):
        found = importlib.util.find_spec(framework)
        if found is not None and found.origin:
            paths.append(found.origin)
    identity = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            return None
        identity.append((path, st.st_size, st.st_mtime_ns))
    return identity


def probe_cache_path() -> Path | None:
    """Where the probe's last clean answer for this interpreter and install is kept (None: nothing to key it by).

    ``$XDG_CACHE_HOME/hvdkit`` (``~/.cache/hvdkit``); a reinstall of Horovod or a framework changes the name.
    """
    identity = install_identity()
    if identity is None:
        return None
    key = hashlib.sha256(json.dumps([sys.executable, hvdkit.__version__, identity]).encode()).hexdigest()[:24]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hvdkit" / f"horovod-probe-{key}.json"


def ipv4_interfaces() -> dict[str, list[str]]:
    """Interface name -> its IPv4 addresses (what --network-interface chooses between)."""
    import socket

    import psutil  # a Horovod requirement, so present wherever hvdkit runs jobs

    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in sorted(psutil.net_if_addrs().items())
            if any(a.family == socket.AF_INET for a in addrs)}


def horovod_settings(environ=os.environ) -> tuple[dict[str, str], dict[str, str]]:
    """The HOROVOD_* variables set in ``environ``, and those Horovod would misread (name -> the line
    ``hvdkit launch`` stops with)::

        horovod_settings({"HOROVOD_CYCLE_TIME": "abc", "PATH": "/bin"})
        # ({'HOROVOD_CYCLE_TIME': 'abc'}, {'HOROVOD_CYCLE_TIME': "HOROVOD_CYCLE_TIME='abc' is not a number >= 0 ..."})
    """
    settings = {name: value for name, value in sorted(environ.items()) if name.startswith("HOROVOD_")}
    return settings, horovod_setting_errors(environ)


def collect() -> EnvReport:
    """Gather the report for this interpreter (takes a few seconds: it imports Horovod in a subprocess)."""
    build, error = probe_horovod()
    settings, setting_errors = horovod_settings()
    return EnvReport(
        hvdkit=hvdkit.__version__,
        python=platform.python_version(),
        python_executable=sys.executable,
        platform=platform.platform(),
        packages={name: package_version(dists) for name, dists in PACKAGES.items()},
        torch_cuda=torch_cuda_version(),
        horovod=build,
        horovod_error=error,
        mpi=mpi_version(),
        gpus=gpu_names(),
        hostname=platform.node(),
        cpu_count=os.cpu_count() or 0,
        interfaces=ipv4_interfaces(),
        horovod_settings=settings,
        setting_errors=setting_errors,
        tensorflow_cuda=tensorflow_cuda_version(),
        tensorflow_cuda_wheels=package_version(("nvidia-cuda-runtime-cu12",)) is not None,
        shm_bytes=shm_bytes(),
    )


# What `hvdkit env --require` can ask of Horovod's build: a framework, a controller, NCCL, or CUDA.
BUILD_FEATURES = ("torch", "tensorflow", "mpi", "gloo", "nccl", "cuda")


def missing_features(build: HorovodBuild | None, wanted: tuple[str, ...]) -> list[str]:
    """The features of ``wanted`` (names from :data:`BUILD_FEATURES`) that this Horovod was built without.

    >>> b = HorovodBuild("0.28.1", {"torch": True, "tensorflow": False}, {"mpi": True, "gloo": True}, {"nccl": False})
    >>> missing_features(b, ("torch", "gloo", "nccl", "cuda"))
    ['nccl', 'cuda']
    """
    if build is None:
        return list(wanted)
    have = {**build.frameworks, **build.controllers, "nccl": build.tensor_operations.get("nccl", False),
            "cuda": build.cuda_built}
    return [name for name in wanted if not have.get(name)]


def _marks(flags: dict[str, bool]) -> str:
    return "  ".join(f"[{'X' if on else ' '}] {name}" for name, on in flags.items())


def render_text(report: EnvReport) -> str:
    """Human-readable report, in the spirit of `horovodrun --check-build`."""
    lines = [
        f"hvdkit      {report.hvdkit}",
        f"python      {report.python} ({report.python_executable})",
        f"platform    {report.platform}",
    ]
    for name, version in report.packages.items():
        lines.append(f"{name:<11} {version or 'not installed'}")
    if report.packages.get("torch"):
        lines.append(f"torch CUDA  {report.torch_cuda or 'none (CPU build)'}")
    if report.packages.get("tensorflow"):
        wheels = ("" if not report.tensorflow_cuda or report.tensorflow_cuda_wheels else
                  " build, but no CUDA 12 wheels (tensorflow[and-cuda]): CPU only unless the system has CUDA 12")
        lines.append(f"TF CUDA     {report.tensorflow_cuda or 'none (CPU build)'}{wheels}")
    lines.append(f"MPI         {report.mpi or 'not found'}")
    lines.append(f"GPUs        {', '.join(report.gpus) if report.gpus else 'none visible'}")
    lines.append(f"host        {report.hostname}, {report.cpu_count} CPU cores, interfaces "
                 + ", ".join(f"{n} ({', '.join(a)})" for n, a in report.interfaces.items()))
    for i, (name, value) in enumerate(report.horovod_settings.items() or [("", "none set")]):
        mark = "  INVALID (hvdkit launch refuses it)" if name in report.setting_errors else ""
        lines.append(f"{'HOROVOD_*' if i == 0 else '':<11} {name + '=' if name else ''}{value}{mark}")
    hb = report.horovod
    if hb is None:
        lines.append(f"horovod     NOT USABLE: {report.horovod_error}")
    else:
        lines += [
            f"horovod     {hb.version}",
            f"  frameworks         {_marks(hb.frameworks)}",
            f"  controllers        {_marks(hb.controllers)}",
            f"  tensor operations  {_marks(hb.tensor_operations)}",
            f"  NCCL               {hb.nccl_version or 'not built'}",
            f"  CUDA               {'built' if hb.cuda_built else 'not built'}",
        ]
        if hb.cuda_arches:
            sass = " ".join(f"sm_{cc}" for cc in hb.cuda_arches["sass"])
            ptx = " ".join(f"compute_{cc}" for cc in hb.cuda_arches["ptx"])
            lines.append(f"  CUDA kernels for   {sass}" + (f" (+ PTX {ptx})" if ptx else ""))
        if hb.frameworks.get("torch"):
            lines.append(f"  torch module       {hb.torch_cxx_standard or 'C++ standard unknown (unpatched build)'}")
        for name, err in hb.errors.items():
            lines.append(f"  warning: {name} extension failed to load: {err}")
    return "\n".join(lines)
