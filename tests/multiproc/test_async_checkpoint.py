"""Checkpoints written in the background (save_checkpoint(..., blocking=False), hvdkit/runtime/async_save.py) under
real launchers: a preemption while a save is in flight. The single-process cases are in
tests/adapters/test_async_checkpoint.py; the full disk and the kill mid-write run for background saves beside the
blocking ones (tests/multiproc/test_checkpoint_faults.py, test_torch_adapter.py).
"""

import sys

import pytest

from hvdkit.runtime.preemption import REQUEUE_EXIT_CODE
from tests.conftest import (
    WORKERS,
    horovodrun_cmd,
    hvdkit_cmd,
    progress_at_least,
    read_rank_results,
    run_job,
    signal_job,
)
from tests.multiproc.test_preemption import whole_checkpoint_and_marks

pytestmark = pytest.mark.multiproc
# In make test's other lane (tests/conftest.py): its jobs are found by pid files, not by command line.
LANE = "others"
WORKER = str(WORKERS / "torch_preempt.py")


def test_sigterm_while_a_background_save_is_in_flight_checkpoints_that_step_and_exits_75(tmp_path):
    """Issue 53: a save after every step with blocking=False (256 MiB), so rank 0 is always writing in the
    background when SIGTERM reaches rank 1 under `hvdkit launch`'s default controller. The guard's save waits
    for the one in flight and writes the preemption's step in the background too, taking 6 s (a slow file
    system: mpirun SIGKILLs 5 s after a rank's exit); PreemptionGuard.exit waits for it before any rank leaves.
    Without that wait rank 1's exit 75 let mpirun kill rank 0 mid-write: the file held an older step. Then 3
    processes resume from it under Gloo."""
    ckpt, out = tmp_path / "ckpt.pt", tmp_path / "preempted"
    out.mkdir()
    cmd = hvdkit_cmd("launch", "-np", "2", "-H", "localhost:2", "--", sys.executable, WORKER,
                     "--out", str(out), "--ckpt", str(ckpt), "--step-seconds", "0.2", "--ballast-mb", "256",
                     "--background", "--slow-background-s", "6")
    output, ended, code = signal_job(cmd, progress_at_least(out / "progress", (0, 3)),
                                     lambda: int((out / "pid1").read_text()), end_timeout=120)
    assert code == REQUEUE_EXIT_CODE, f"hvdkit launch exited {code}:\n{output[-3000:]}"
    marks = whole_checkpoint_and_marks(tmp_path, ckpt, out, 2**28)
    from hvdkit.torch.checkpoint import _read

    assert _read(str(ckpt))["extra"] == {"epoch": marks[0]["epoch"], "batch": marks[0]["batch"], "preemption": True}
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    proc = run_job(horovodrun_cmd(3, [WORKER, "--out", str(resumed), "--ckpt", str(ckpt), "--resume",
                                      "--ballast-mb", "256"], "gloo"), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    results = read_rank_results(resumed, 3, proc.stdout)
    assert [r["resumed_at"] for r in results] == [[marks[0]["epoch"], marks[0]["batch"]]] * 3
