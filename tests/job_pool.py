"""Long-lived multi-rank jobs that run many test scenarios each (the ranks: tests/multiproc/workers/pool_rank.py).

On CI's 2 cores a 2-rank job spends 5-13 s starting processes and importing
torch or TensorFlow before a check that takes under a second. A pool is one
real ``horovodrun -np N --gloo|--mpi`` job per (ranks, framework family, controller) that runs
the worker scripts one after another, each in a Horovod initialised afresh,
with each scenario's output captured apart and the process put back after it.

What needs processes of its own keeps them (``launch(..., pool=False)`` or a
run_job of its own): kills and signals, resume in new processes,
per-process environment variables (Horovod keeps a tuning value read from the
environment for the rest of a process, whatever a later scenario sets), checks
of a process's own start.

A scenario that exits non-zero, or outlives its timeout, ends its pool; the
next scenario of that family starts a new one, so a crash fails one test only.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

from tests import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
RANK_SCRIPT = ROOT / "tests" / "multiproc" / "workers" / "pool_rank.py"
# Pools alive at once: each TensorFlow rank holds about 0.5 GB; CI has 24 GiB and 2 cores.
MAX_POOLS = 4
# How long the other ranks of a scenario have to end once one rank has failed it.
FAILED_RANK_GRACE = 30.0


class ScenarioTimeout(Exception):
    """The scenario outlived its timeout (its pool was killed)."""


class PoolGone(Exception):
    """The pool's launcher ended before the scenario did."""


class Pool:
    def __init__(self, np: int, cmd: list[str], env: dict[str, str]):
        self.np = np
        self.jobid = "1," if "--mpi" in cmd else ""      # mpirun tags a line [1,R]<stdout>:, horovodrun --gloo [R]
        self.dir = Path(tempfile.mkdtemp(prefix=f"hvdkit-pool-{np}-"))
        self.log = open(self.dir / "launcher.log", "w")  # noqa: SIM115 -- open as long as the pool
        self.proc = subprocess.Popen([*cmd, sys.executable, str(RANK_SCRIPT), "--dir", str(self.dir),
                                      "--owner", str(os.getpid())], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                     start_new_session=True)
        self.next = 0
        self.scenarios = 0
        self.charged = 0.0          # the scenarios' CPU seconds, counted for the tests that ran them

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, worker: str, argv: list[str], timeout: float) -> tuple[int, str]:
        """Run ``worker argv`` on every rank; return (the highest exit code, every rank's output)."""
        n = self.next
        self.next += 1
        job = self.dir / f"job-{n}.json"
        job.with_suffix(".tmp").write_text(json.dumps({"worker": worker, "argv": argv}))
        os.replace(job.with_suffix(".tmp"), job)
        done = [self.dir / f"done-{n}.{r}.json" for r in range(self.np)]
        deadline = time.monotonic() + timeout
        while not all(d.exists() for d in done):
            if not self.alive() and not all(d.exists() for d in done):
                raise PoolGone(self._output(n) + self._launcher_tail())
            failed = [json.loads(d.read_text())["rc"] for d in done if d.exists()]
            failed = [rc for rc in failed if rc != 0]
            if time.monotonic() > deadline:
                output = self._output(n)
                self.close(kill=True)
                if failed:                 # what a fresh job would have said: the failed rank's exit code
                    return max(failed), output
                raise ScenarioTimeout(output)
            if failed and deadline - time.monotonic() > FAILED_RANK_GRACE:
                # A rank failed, perhaps before hvd.init, where its peers wait for it: under MPI with no timeout
                # (a fresh job ends as mpirun sees the exit). Its peers get a while to fail too, then the pool goes.
                deadline = time.monotonic() + FAILED_RANK_GRACE
            time.sleep(0.02)
        self.scenarios += 1
        reports = [json.loads(d.read_text()) for d in done]
        cpu = sum(r.get("cpu", 0.0) for r in reports)
        self.charged += cpu
        cpu_seconds.charge(cpu)
        return max(r["rc"] for r in reports), self._output(n)

    def _output(self, n: int) -> str:
        """Every rank's stdout, then its stderr, each line tagged as its controller tags it ([1]<stderr>:...)."""
        parts = []
        for r in range(self.np):
            for stream, suffix in (("stdout", ""), ("stderr", ".err")):
                path = self.dir / f"out-{n}.{r}{suffix}"
                text = path.read_text(errors="replace") if path.exists() else ""
                parts.append("".join(f"[{self.jobid}{r}]<{stream}>:{line}\n" for line in text.splitlines()))
        return "".join(parts)

    def _launcher_tail(self) -> str:
        self.log.flush()
        return "\npool launcher output:\n" + (self.dir / "launcher.log").read_text(errors="replace")[-3000:]

    def close(self, kill: bool = False) -> None:
        reaped = cpu_seconds.children_cpu()
        self._close(kill)
        # Reaping the ranks counts all their CPU again for the test closing the pool: take back what its
        # scenarios already counted (not more than was reaped: ranks killed with the group go to init).
        cpu_seconds.charge(-min(self.charged, cpu_seconds.children_cpu() - reaped))

    def _close(self, kill: bool) -> None:
        if self.alive():
            if not kill:
                (self.dir / "stop").touch()
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    kill = True
            if kill:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Pools:
    """The pools of one pytest session, by key; the least recently used closes when there are too many."""

    def __init__(self):
        self.pools: OrderedDict[tuple, Pool] = OrderedDict()
        self.started = 0
        self.scenarios = 0
        atexit.register(self.close_all)

    def run(self, key: tuple, np: int, cmd: list[str], env: dict[str, str], worker: str, argv: list[str],
            timeout: float) -> tuple[int, str]:
        # A test that sets a variable gets a pool of its own; pytest's own PYTEST_CURRENT_TEST differs per test.
        key = (*key, hash(frozenset((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST")))
        pool = self.pools.pop(key, None)
        if pool is None or not pool.alive():
            while len(self.pools) >= MAX_POOLS:
                self.pools.popitem(last=False)[1].close()
            pool = Pool(np, cmd, env)
            self.started += 1
        self.pools[key] = pool
        self.scenarios += 1
        try:
            rc, output = pool.run(worker, argv, timeout)
        except (ScenarioTimeout, PoolGone):
            self.pools.pop(key, None)
            raise
        if rc != 0:                      # its ranks have exited: the next scenario gets a new pool
            self.pools.pop(key, None)
            pool.close()
        return rc, output

    def close_all(self) -> None:
        while self.pools:
            self.pools.popitem()[1].close()


POOLS = Pools()


# Workers that call plain hvd.init(), not hk.init: under MPI on one host hk.init fixes Horovod's fusion threshold
# and cycle time (hvdkit/common/tuning.py), which hold for the rest of the process (patch item 20), so in an MPI
# pool these would run with an earlier scenario's values instead of Horovod's defaults.
PLAIN_HOROVOD = {"allreduce.py", "bf16.py"}


def family(worker: str, argv: list[str], controller: str = "gloo") -> str | None:
    """The framework a worker imports, which decides the pool it may join; None where it needs its own processes.

    torch_*.py import torch only; keras_*.py choose their Keras with --mode before importing it (Keras reads
    its backend once per process); --framework tensorflow workers import TensorFlow without Keras, so they
    share Keras-on-TensorFlow's pool; --framework keras-torch and keras-tensorflow (gpu_pinning.py) name theirs.
    """
    if controller == "mpi" and worker in PLAIN_HOROVOD:
        return None
    if worker.startswith("torch_"):
        return "torch"
    if worker.startswith("keras_") and "--mode" in argv:
        return "keras-" + argv[argv.index("--mode") + 1]
    if "--framework" in argv:
        return {"torch": "torch", "tensorflow": "keras-tensorflow", "keras-torch": "keras-torch",
                "keras-tensorflow": "keras-tensorflow"}.get(argv[argv.index("--framework") + 1])
    return None
