"""Shared test helpers: launching real horovodrun/mpirun jobs with a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# The jobs here run 2 to 4 ranks on 2 cores, beside the image build in CI: ranks outnumber cores, so a rank
# waiting in a PyTorch collective sleeps instead of spinning (patch item 11; 4 ranks trained the digits
# example in 16.5 s instead of 49.9 s). Users keep Horovod's spin unless they set it; `make demo` runs that
# way, and test_allreduce.py checks both.
os.environ.setdefault("HOROVOD_BLOCKING_WAIT", "1")
# Likewise Open MPI's own wait: `hvdkit launch` sets this on CPU hosts (hvdkit/common/tuning.py), plain
# `horovodrun --mpi` does not, and its ranks spun in MPI while the other lane's jobs waited for a core (the MPI
# preemption test: 20.6 s of CPU alone, 17.2 s with it).
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# For a module whose tests each run several jobs, each bounded by a timeout of its own: pytest-timeout's 300 s
# for the whole test (pyproject.toml) cut such a test off on a machine 2.6x slower than usual (docs/TESTING.md).
SEVERAL_JOBS = pytest.mark.timeout(900)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m unit`` alone reads tests/unit only, where every unit test lives (tests/unit/test_packaging.py checks).

    The other tiers' modules import torch, TensorFlow or Horovod at the top; left uncollected,
    the unit tier runs where only ``pip install -c requirements.lock -e '.[dev]'`` was done.
    """
    if (config.getoption("markexpr") == "unit" and collection_path.parent == ROOT / "tests"
            and collection_path.is_dir() and collection_path.name != "unit"):
        return True
    return None
WORKERS = ROOT / "tests" / "multiproc" / "workers"


@pytest.hookimpl(tryfirst=True)      # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``make test``'s two lanes (pytest-xdist, ``-n 2 --dist loadgroup``), each in file order: the multi-process
    tier in one worker, every other tier (multi-host, unit, adapters, CLI, docs) in the other. Two
    multi-process tests never overlap (they run the same examples and workers); the tests that find a process
    by its command line look for their own temporary directory or arguments. Without ``-n`` the marks do
    nothing. A multi-process module that may overlap the multi-process lane says so with ``LANE = "others"``: it
    runs in the other lane, which otherwise idles for the last half of the run."""
    for item in items:
        lane = getattr(getattr(item, "module", None), "LANE", None)
        if lane is None:
            lane = "multiproc" if item.get_closest_marker("multiproc") else "others"
        item.add_marker(pytest.mark.xdist_group(lane))


_POOL_COUNTS = {"scenarios": 0, "started": 0}


def _pool_counts() -> dict[str, int]:
    pools = sys.modules.get("tests.job_pool")
    if pools is None:
        return {"scenarios": 0, "started": 0}
    return {"scenarios": pools.POOLS.scenarios, "started": pools.POOLS.started}


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:                  # an xdist worker: its counts go to the controller
        workeroutput["job_pools"] = _pool_counts()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    for key, value in getattr(node, "workeroutput", {}).get("job_pools", {}).items():
        _POOL_COUNTS[key] += value


def pytest_terminal_summary(terminalreporter) -> None:
    """How many scenarios the job pools ran and how many pools they took: far fewer pools than scenarios, or
    the pools are not reused (a per-test variable in a pool's key once started one per test: 2173 s, not ~1700)."""
    here = _pool_counts()
    scenarios, started = here["scenarios"] + _POOL_COUNTS["scenarios"], here["started"] + _POOL_COUNTS["started"]
    if scenarios:
        terminalreporter.write_line(f"job pools: {scenarios} scenarios in {started} pools (tests/job_pool.py)")


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        # Fail, never skip: a missing launcher is a broken install, not an optional feature.
        pytest.fail(f"{name} not found next to {sys.executable}: run scripts/install.sh (make install)")
    return str(path)


def job_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}")
    env.update(extra)
    return env


def run_job(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
            cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a launcher in its own process group; on timeout kill the whole group and fail."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env or job_env(), start_new_session=True, cwd=cwd)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"job timed out after {timeout}s: {' '.join(cmd)}\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def signal_job(cmd: list[str], ready, victim, sig: int = signal.SIGTERM, start_timeout: float = 180,
               end_timeout: float = 60) -> tuple[str, float, int]:
    """Start ``cmd`` in its own process group, wait until ``ready(output so far)`` is true, send ``sig``
    to the pid ``victim()`` returns; return (all output, seconds from the signal to the job's end, exit code).

    Fails when the job ends or stalls before it is ready; kills the group if it outlives ``end_timeout``.
    """
    import threading
    import time

    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env(),
                           start_new_session=True, cwd=ROOT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(job.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.time() + start_timeout
        while not ready("".join(lines)):
            if time.time() > deadline or job.poll() is not None:
                pytest.fail("the job never got ready:\n" + "".join(lines)[-3000:])
            time.sleep(0.05)
        signalled = time.time()
        os.kill(victim(), sig)
        job.wait(timeout=end_timeout)
        ended = time.time() - signalled
        reader.join(timeout=10)
        return "".join(lines), ended, job.returncode
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def process_by_args(program: str, marker: str, subcommand: str | None = None) -> int:
    """The pid of the one process running ``program`` (hvdkit, horovodrun: argv[1], as a console script's
    interpreter sees it), optionally ``subcommand``, with ``marker`` (a test's own path) in its arguments."""
    import psutil

    (proc,) = [p for p in psutil.process_iter(["cmdline"])
               if p.info["cmdline"] and len(p.info["cmdline"]) > 1 and p.info["cmdline"][1].endswith(program)
               and (subcommand is None or subcommand in p.info["cmdline"][2:3])
               and marker in " ".join(p.info["cmdline"])]
    return proc.pid


def progress_at_least(path: Path, target: tuple[int, ...]):
    """A ``signal_job`` readiness check: the numbers a worker writes to ``path`` reached ``target``."""
    def ready(_output: str) -> bool:
        text = path.read_text().split() if path.exists() else []
        return bool(text) and tuple(int(v) for v in text) >= target
    return ready


def kill_mid_save(cmd: list[str], out_dir: Path, target: str, start_timeout: float = 180) -> None:
    """Run a slow-save worker and SIGKILL it while it writes ``target``'s temporary file.

    The worker writes its pid to ``saved-first`` once a first, good checkpoint is
    on disk; the kill comes when that marker and ``.<target>.*.tmp`` both exist.
    """
    import glob

    marker = out_dir / "saved-first"

    def writing(_output: str) -> bool:
        return marker.exists() and bool(marker.read_text()) and bool(glob.glob(str(out_dir / f".{target}.*.tmp")))

    signal_job(cmd, writing, lambda: int(marker.read_text()), sig=signal.SIGKILL, start_timeout=start_timeout)


def horovodrun_cmd(np: int, argv: list[str], controller: str = "gloo") -> list[str]:
    """`horovodrun -np N -H localhost:N --gloo|--mpi python ...` on this interpreter."""
    if controller not in ("gloo", "mpi"):
        raise ValueError(f"controller must be gloo or mpi, got {controller!r}")
    return [_tool("horovodrun"), "-np", str(np), "-H", f"localhost:{np}", f"--{controller}", sys.executable, *argv]


def hvdkit_cmd(*args: str) -> list[str]:
    """`hvdkit ARGS` as an argv: the console command installed next to this interpreter, as users run it.

    For a runner of its own (run_job, signal_job, a test host's run_on); run_hvdkit runs it here.
    """
    return [_tool("hvdkit"), *args]


def run_hvdkit(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `hvdkit ARGS` from the repository root with job_env() (or ``env``); stdout and stderr captured apart.

    run_hvdkit("hosts", "-H", "a:2", timeout=60).stdout
    """
    return subprocess.run(hvdkit_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=env or job_env(), cwd=ROOT)


def hvdkit_launch_cmd(np: int, argv: list[str], controller: str = "gloo") -> list[str]:
    """`hvdkit launch -np N -H localhost:N --gloo|--mpi -- python ...` on this interpreter."""
    return hvdkit_cmd("launch", "-np", str(np), "-H", f"localhost:{np}", f"--{controller}", "--",
                      sys.executable, *argv)


def mpirun_cmd(np: int, argv: list[str]) -> list[str]:
    """Plain `mpirun -np N python ...` (as root it needs --allow-run-as-root)."""
    flags = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *flags, "--oversubscribe", "-np", str(np), "-x", "PYTHONPATH", "-x", "PATH",
            "-x", "TF_CPP_MIN_LOG_LEVEL", sys.executable, *argv]


def run_horovodrun(np: int, argv: list[str], controller: str = "gloo", timeout: float = 240,
                   pool: str | None = None) -> subprocess.CompletedProcess:
    """``horovodrun -np N --gloo|--mpi python ARGV`` with job_env(); stdout and stderr together, as run_job.

    ``pool`` names the framework family ("torch", "keras-tensorflow", "keras-torch", tests/job_pool.py): the
    script then runs as a scenario of that family's long-lived job of N ranks under this controller, its
    output each rank's lines tagged as horovodrun tags them (``[R]<stdout>:`` under Gloo, ``[1,R]<stderr>:``
    under MPI). A job that needs processes of its own (a resume, a signal) leaves it None.
    """
    cmd = horovodrun_cmd(np, argv, controller)
    if pool is None:
        return run_job(cmd, timeout)
    from tests.job_pool import POOLS, PoolGone, ScenarioTimeout

    try:
        rc, output = POOLS.run((np, pool, controller), np, cmd[:cmd.index(sys.executable)], job_env(), argv[0],
                               argv[1:], timeout)
    except ScenarioTimeout as exc:
        pytest.fail(f"job timed out after {timeout}s in its pool: {' '.join(cmd)}\n{str(exc)[-4000:]}")
    except PoolGone as exc:
        pytest.fail(f"the pool running {' '.join(cmd)} ended before it:\n{str(exc)[-4000:]}")
    return subprocess.CompletedProcess(cmd, rc, output, "")


def read_rank_results(out_dir: Path, np: int, output: str) -> list[dict]:
    """Each worker writes rank<R>.json (workers/rank_results.py); return them by rank, failing if one is missing."""
    results = []
    for rank in range(np):
        path = out_dir / f"rank{rank}.json"
        if not path.exists():
            pytest.fail(f"rank {rank} wrote no result ({path}); job output:\n{output[-4000:]}")
        results.append(json.loads(path.read_text()))
    return results


@pytest.fixture
def launch(tmp_path):
    """launch(np, worker, *args, controller=..., timeout=..., pool=...) -> per-rank result dicts.

    ``controller`` is "gloo" or "mpi" (horovodrun) or "mpirun" (plain mpirun). Under horovodrun a torch_* or
    keras_* worker runs in a pool (tests/job_pool.py): a long-lived job of N ranks that runs one scenario
    after another. ``pool=False`` gives the worker processes of its own (a resume that must start cold).
    """
    from tests.job_pool import family

    def _launch(np: int, worker: str, *args: str, controller: str = "gloo", timeout: float = 240,
                expect_ok: bool = True, pool: bool = True) -> list[dict]:
        argv = [str(WORKERS / worker), "--out", str(tmp_path), *args]
        if controller == "mpirun":
            cmd = mpirun_cmd(np, argv)
            proc = run_job(cmd, timeout)
        else:
            proc = run_horovodrun(np, argv, controller, timeout,
                                  pool=family(worker, list(args), controller) if pool else None)
            cmd = proc.args
        rc, output = proc.returncode, proc.stdout
        if expect_ok and rc != 0:
            pytest.fail(f"{' '.join(cmd)} exited {rc}:\n{output[-4000:]}")
        return read_rank_results(tmp_path, np, output)

    return _launch


@pytest.fixture
def small_mount(tmp_path):
    """mount(options) -> a fresh tmpfs mounted with those options (a read-only or a nearly full disk)."""
    mounts = []

    def _mount(options: str):
        where = tmp_path / f"mnt{len(mounts)}"
        where.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True,
                             text=True)
        if res.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs ({res.stderr.strip()}): these tests run as root, as CI does")
        mounts.append(where)
        return where

    yield _mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)
