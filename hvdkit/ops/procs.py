"""One way to run a program to its end within a time limit: ``run_bounded``.

Short probes (``mpirun --version``, ``nvidia-smi``, ssh checks, the Horovod
probe) and whole benchmark launches use it. With ``group=True`` the program
starts a session of its own and a timeout ends the whole group, so nothing
it started (horovodrun's local ranks) outlives it. ``hvdkit launch`` streams
its job's output instead, and stops the job's group through
:mod:`hvdkit.ops.job_guard`.

Example::

    rc, out, err = run_bounded(["mpirun", "--version"], timeout=20)   # 124 on timeout, 127 when missing
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

TIMED_OUT = 124          # as timeout(1) exits
NOT_FOUND = 127          # as a shell exits for a missing program


def run_bounded(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
                group: bool = False) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); :data:`TIMED_OUT` after ``timeout`` seconds, :data:`NOT_FOUND` when
    the program is missing. stdout and stderr stay apart (merged, a stderr line can land inside a result line)."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, env=None if env is None else dict(env), start_new_session=group)
    except OSError as exc:             # missing, not executable, a broken interpreter line
        return NOT_FOUND, "", str(exc)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        _end(proc, group)
        out, err = _drain(proc)
        return TIMED_OUT, out, (err + "\n" if err else "") + f"no answer within {timeout:.0f}s"
    except BaseException:              # Ctrl-C, SIGTERM: a new session does not get the terminal's signal
        _end(proc, group)
        _drain(proc)
        raise


def _end(proc: subprocess.Popen, group: bool) -> None:
    try:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass


def _drain(proc: subprocess.Popen) -> tuple[str, str]:
    """What the killed program wrote. Bounded: a process it started outside its group (a discovery script's
    hung curl) can hold the pipes open long after it is gone."""
    try:
        return proc.communicate(timeout=5)
    except subprocess.TimeoutExpired as exc:
        proc.wait()
        def text(data):
            return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
        return text(exc.stdout), text(exc.stderr)
