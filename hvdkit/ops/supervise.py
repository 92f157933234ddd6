"""Run horovodrun and watch it: pass its output through whole, pass signals on, name the rank that failed.

``hvdkit launch`` plans the command (:mod:`hvdkit.ops.launch`) and hands it here.

Example::

    plan = plan_launch(cfg, BuildFlags.detect())
    sys.exit(supervise(plan.argv, plan.layout))
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque

import psutil

from hvdkit.common.launcher import REQUEUE_EXIT_CODE, horovodrun_worker_slot, started_by_horovodrun
from hvdkit.ops.hosts import RankPlacement
from hvdkit.ops.job_output import (
    WholeLines,
    ended_by_preemption,
    explain_failure,
    explain_worker_exit,
    is_rank_output,
    removed_worker,
    worker_exit,
)


def supervise(argv: tuple[str, ...], layout: tuple[RankPlacement, ...], elastic: bool = False,
              elastic_risk: str | None = None) -> int:
    """Run horovodrun, pass its output through, and on failure add one line: which rank, where, why.

    horovodrun runs in a process group of its own, and SIGINT, SIGTERM and
    SIGHUP sent to hvdkit (a Ctrl-C, or a supervisor signalling this process
    alone) go to that whole group once: with --mpi, horovodrun has exec'd
    ``sh -c mpirun ...``, and a signal to the shell alone left mpirun running.
    If hvdkit itself dies, even by SIGKILL, a small guard process sends the
    group SIGTERM. The exit code is horovodrun's (128 + N when a signal N ended it).

    The first SIGTERM goes to the ranks alone (:func:`_ask_ranks_to_stop`), so
    a script with hvdkit's preemption guard checkpoints and every rank exits
    75; the launchers' own SIGTERM handling SIGKILLs the ranks 5 s later,
    mid-save. A second SIGTERM stops the job at once. An elastic job's group
    gets it at once, as before.

    A Ctrl-C (SIGINT) is the user stopping the job, not a failure: the ranks'
    own output still passes, horovodrun's report of the ranks its SIGTERM
    stopped is held back, one line says so, and the exit code is 130 as
    shells expect. In an elastic job, a worker that ends is named with its
    host: horovodrun's own line gives only the rank it started as.
    """
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True)
    guard = _guard_group(proc.pid)
    tail: deque[str] = deque(maxlen=500)
    interrupted = threading.Event()
    slots: dict[int, tuple[str, int]] = {}      # elastic: rank a worker started as -> (host, local rank)
    removed: set[int] = set()                   # elastic: those whose slot left the discovered hosts

    def pump(source, sink):
        joiner = WholeLines()          # MPI's tagged pieces back into the ranks' lines

        def emit(line):
            if interrupted.is_set() and not is_rank_output(line):
                return
            with _WRITING:
                sink.write(line)
                sink.flush()
            tail.append(line)
            if elastic:
                _name_worker(line, slots, removed)

        for raw in source:
            for line in joiner.feed(raw):
                emit(line)
        for line in joiner.flush():
            emit(line)

    readers = [threading.Thread(target=pump, args=(proc.stdout, sys.stdout), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, sys.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    if elastic:
        threading.Thread(target=_watch_workers, args=(proc, slots), daemon=True).start()

    asked = threading.Event()        # SIGTERM passed to the ranks as a request to checkpoint (MPI)

    def forward(number, _frame):
        if proc.poll() is not None:
            return
        # Not in an elastic job: its driver would take ranks that end without a checkpoint for lost workers and
        # wait for new hosts (--elastic-timeout) instead of ending.
        if number == signal.SIGTERM and not elastic and not asked.is_set() and _ask_ranks_to_stop(proc.pid):
            asked.set()
            return
        if number == signal.SIGINT:
            interrupted.set()
        try:
            os.killpg(proc.pid, number)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    rc = proc.wait()
    guard.stdin.close()          # the job is over: the guard has nothing left to stop
    for reader in readers:
        reader.join(timeout=5)
    if interrupted.is_set():
        stopped = "the elastic job's workers" if elastic else f"{len(layout)} {'rank' if len(layout) == 1 else 'ranks'}"
        _say(f"hvdkit launch: interrupted (Ctrl-C): stopped {stopped}")
        return 128 + signal.SIGINT
    if ended_by_preemption(rc, "".join(tail)):
        _say(f"hvdkit launch: preempted: the ranks wrote their checkpoint and exited {REQUEUE_EXIT_CODE}; rerun "
              "the same command with the script's resume option to continue")
        return REQUEUE_EXIT_CODE
    if rc != 0:
        why = explain_failure("".join(tail), layout)
        # An elastic job on one host line ends with its first lost worker: the fix the start's warning gave, again.
        fix = f"; {elastic_risk}" if elastic_risk else ""
        _say(f"hvdkit launch: job failed: {why or f'horovodrun exited with status {rc}'}{fix} "
              "(its own output is above)")
    return rc if rc >= 0 else 128 - rc


# Two threads pass the launcher's stdout and stderr through while this module adds lines of its own; print()
# writes a line and its newline apart, so one thread's line could land inside another's.
_WRITING = threading.RLock()


def _say(line: str) -> None:
    """One line of hvdkit launch's own on stderr, written whole."""
    with _WRITING:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _name_worker(line: str, slots: dict[int, tuple[str, int]], removed: set[int]) -> None:
    """In an elastic job, follow horovodrun's "Process N exit ..." with a line naming the worker's host."""
    rank = removed_worker(line)
    if rank is not None:
        removed.add(rank)
    ended = worker_exit(line)
    if ended:
        _say(f"hvdkit launch: {explain_worker_exit(*ended, slots, removed)}")
        removed.discard(ended[0])         # a later worker may start as the same rank


def _watch_workers(proc: subprocess.Popen, slots: dict[int, tuple[str, int]], every_s: float = 0.5) -> None:
    """While an elastic job runs, note each worker's host and local rank by the rank it started as, read from
    the command lines of horovodrun's child processes (there is no other record of it outside the workers)."""
    try:
        parent = psutil.Process(proc.pid)
        while proc.poll() is None:
            for child in parent.children(recursive=True):
                try:
                    slot = horovodrun_worker_slot(" ".join(child.cmdline()))
                except psutil.Error:      # ended since it was listed
                    continue
                if slot is not None:
                    slots[slot[0]] = slot[1:]
            time.sleep(every_s)
    except psutil.Error:                  # horovodrun has ended
        return


MPIRUN_NAMES = ("mpirun", "mpiexec", "orterun", "prterun")
SHELLS = ("sh", "bash", "dash")


def _ask_ranks_to_stop(pid: int) -> bool:
    """Pass a SIGTERM meant for the job to its ranks alone, so a script's preemption guard checkpoints (True).

    Both launchers answer their own SIGTERM with SIGTERM to every rank and SIGKILL 5 s later (mpirun;
    horovodrun's safe_shell_exec), killing a rank mid-save. mpirun passes SIGUSR1 to every rank on every
    host, which the guard takes as it takes SIGTERM. Under Gloo the ranks on this host get SIGTERM; the
    guard's agreement at the next step tells the ranks on other hosts. False where neither is found (a
    Gloo job with no rank here): the caller signals the launcher's group, as before.
    """
    mpirun = _mpirun_under(pid)
    if mpirun is not None:
        targets, sig, how = [mpirun], signal.SIGUSR1, "SIGUSR1 through mpirun"
    else:
        targets, sig, how = _local_ranks(pid), signal.SIGTERM, "SIGTERM to this host's ranks"
    if not targets:
        return False
    _say(f"hvdkit launch: SIGTERM: every rank is asked to checkpoint and stop ({how}); send SIGTERM again to "
          "stop the job now")
    for target in targets:
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            pass
    return True


def _local_ranks(pid: int) -> list[int]:
    """The rank processes under horovodrun ``pid`` on this host: a launcher's rank in their environment, not a shell.

    Not their children (DataLoader workers inherit the variable): a worker killed by the signal would fail
    the rank's step before it saves.
    """
    found: list[int] = []
    try:
        queue = psutil.Process(pid).children()
    except psutil.Error:
        return found
    while queue:
        process = queue.pop(0)
        try:
            if started_by_horovodrun(process.environ()) and process.name() not in SHELLS:
                found.append(process.pid)
                continue
            queue.extend(process.children())
        except psutil.Error:            # ended since it was listed
            continue
    return found


def _mpirun_under(pid: int) -> int | None:
    """The pid of the mpirun that horovodrun ``pid`` started (``--mpi``), or None (Gloo, or none yet)."""
    try:
        for child in psutil.Process(pid).children(recursive=True):
            try:
                if child.name() in MPIRUN_NAMES:
                    return child.pid
            except psutil.Error:          # ended since it was listed
                continue
    except psutil.Error:
        return None
    return None


def _guard_group(pgid: int) -> subprocess.Popen:
    """A process that stops the job's process group ``pgid`` when hvdkit launch goes away (ops/job_guard.py)."""
    return subprocess.Popen([sys.executable, "-m", "hvdkit.ops.job_guard", str(pgid)], stdin=subprocess.PIPE,
                            start_new_session=True)
