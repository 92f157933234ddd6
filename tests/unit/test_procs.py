"""hvdkit.ops.procs.run_bounded: the one way a program is run to its end within a time limit."""

import os
import sys
import time

import pytest

from hvdkit.ops.procs import NOT_FOUND, TIMED_OUT, run_bounded

pytestmark = pytest.mark.unit


def test_output_and_status_come_back_apart():
    rc, out, err = run_bounded([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                                                      "sys.exit(3)"], timeout=30)
    assert (rc, out, err) == (3, "out\n", "err\n")


def test_a_missing_program_is_127():
    rc, _, err = run_bounded(["/nonexistent/program"], timeout=5)
    assert rc == NOT_FOUND and "nonexistent" in err


def test_a_timeout_ends_the_whole_group_when_asked(tmp_path):
    # A job's launcher and the ranks it started: with group=True nothing outlives the limit.
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f" open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    start = time.monotonic()
    rc, out, err = run_bounded([sys.executable, "-c", code], timeout=3, group=True)
    assert rc == TIMED_OUT and out == "started\n" and err.endswith("no answer within 3s")
    assert time.monotonic() - start < 30
    child = int(pidfile.read_text())
    for _ in range(50):                      # SIGKILL is delivered at once; reaping by init can lag a little
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split(") ")[1].startswith("Z"):
                break                        # a zombie: killed, not yet reaped
        time.sleep(0.1)
    else:
        pytest.fail(f"the program's child {child} outlived the timeout")


def test_a_timeout_returns_even_when_a_grandchild_holds_the_pipes():
    # A discovery script whose curl hangs: killing the script leaves the curl holding stdout (review of issue 38).
    start = time.monotonic()
    rc, _, err = run_bounded(["bash", "-c", "sleep 60; :"], timeout=2)
    assert rc == TIMED_OUT and "no answer within 2s" in err
    assert time.monotonic() - start < 20
