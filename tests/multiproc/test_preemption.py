"""Preemption under real horovodrun: SIGTERM to one of 2 ranks mid-epoch; both checkpoint at the next
step boundary and exit with REQUEUE_EXIT_CODE within 30 s, and a rerun resumes at that exact step with
parameters identical to an uninterrupted run (float64)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdkit.core.preemption import REQUEUE_EXIT_CODE
from tests.conftest import ROOT, WORKERS, horovodrun_cmd, job_env, read_rank_results, run_job

pytestmark = pytest.mark.multiproc
WORKER = str(WORKERS / "torch_preempt.py")


def run(out: Path, *extra: str) -> list[dict]:
    out.mkdir()
    proc = run_job(horovodrun_cmd(2, [WORKER, "--out", str(out), *extra]), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return read_rank_results(out, 2, proc.stdout)


def test_sigterm_on_one_rank_checkpoints_every_rank_and_resumes_exactly(tmp_path):
    reference = run(tmp_path / "uninterrupted", "--ckpt", str(tmp_path / "unused.pt"))
    assert reference[0]["size"] == 2 and reference[0]["params"] == reference[1]["params"]

    ckpt, out = tmp_path / "ckpt.pt", tmp_path / "preempted"
    out.mkdir()
    job = subprocess.Popen(horovodrun_cmd(2, [WORKER, "--out", str(out), "--ckpt", str(ckpt),
                                              "--step-seconds", "0.2"]),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env(),
                           start_new_session=True, cwd=ROOT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:          # mid-way through the second epoch (15 batches an epoch)
            progress = (out / "progress").read_text().split() if (out / "progress").exists() else []
            if len(progress) == 2 and (int(progress[0]), int(progress[1])) >= (1, 4):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the job made no progress")
        signalled = time.time()
        os.kill(int((out / "pid1").read_text()), signal.SIGTERM)
        output, _ = job.communicate(timeout=60)
        ended = time.time() - signalled
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert ended < 30, f"the job took {ended:.1f}s to end after SIGTERM"
    assert job.returncode != 0 and f"Exit code: {REQUEUE_EXIT_CODE}" in output, output[-3000:]
    marks = [json.loads((out / f"preempted{r}.json").read_text()) for r in range(2)]
    assert marks[0] == {**marks[1], "signal": marks[0]["signal"]}, "ranks stopped at different steps"
    assert marks[1]["signal"] == signal.SIGTERM and marks[0]["signal"] is None, "only rank 1 was signalled"
    assert (marks[0]["epoch"], marks[0]["batch"]) > (1, 3) and marks[0]["batch"] < 15, marks[0]

    resumed = run(tmp_path / "resumed", "--ckpt", str(ckpt), "--resume")
    assert resumed[0]["resumed_at"] == [marks[0]["epoch"], marks[0]["batch"]]
    assert resumed[0]["steps"] == 3 * 15 - (15 * marks[0]["epoch"] + marks[0]["batch"])
    for r in range(2):
        assert resumed[r]["params"] == reference[r]["params"], "resumed training diverged from the uninterrupted run"


@pytest.mark.parametrize("mode", ["tensorflow", "torch"])
def test_keras_preemption_checkpoint_stops_every_rank_at_the_same_batch(tmp_path, mode):
    ckpt, out = tmp_path / "ckpt.npz", tmp_path / "preempted"
    out.mkdir()
    worker = str(WORKERS / "keras_preempt.py")
    job = subprocess.Popen(horovodrun_cmd(2, [worker, "--out", str(out), "--mode", mode, "--ckpt", str(ckpt)]),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env(),
                           start_new_session=True, cwd=ROOT)
    try:
        deadline = time.time() + 180
        while not ((out / "progress").exists() and int((out / "progress").read_text() or 0) >= 3):
            if time.time() > deadline or job.poll() is not None:
                pytest.fail("the job made no progress")
            time.sleep(0.05)
        signalled = time.time()
        os.kill(int((out / "pid1").read_text()), signal.SIGTERM)
        output, _ = job.communicate(timeout=60)
        ended = time.time() - signalled
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert ended < 30 and f"Exit code: {REQUEUE_EXIT_CODE}" in output, (ended, output[-3000:])
    marks = [json.loads((out / f"preempted{r}.json").read_text()) for r in range(2)]
    assert marks[0]["stopped_at"] == marks[1]["stopped_at"] and marks[0]["stopped_at"][1] < 30
    assert marks[1]["signal"] == signal.SIGTERM and marks[0]["signal"] is None
    out2 = tmp_path / "resume"         # every rank loads the checkpoint at the batch it stopped
    out2.mkdir()
    proc = run_job(horovodrun_cmd(2, [worker, "--out", str(out2), "--mode", mode, "--ckpt", str(ckpt),
                                      "--check-resume"]), timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    for r in read_rank_results(out2, 2, proc.stdout):
        assert [r["epoch"], r["batch"]] == marks[0]["stopped_at"] and r["size"] == 2


def test_the_example_checkpoints_on_sigterm_and_resumes_mid_epoch(tmp_path):
    """examples/pytorch_mnist.py --checkpoint DIR/: SIGTERM to rank 1 during training -> exit 75 with a
    mid-run checkpoint; --resume continues from it and finishes."""
    ckpts = tmp_path / "ckpts"
    example = [str(ROOT / "examples" / "pytorch_mnist.py"), "--epochs", "6", "--checkpoint", f"{ckpts}/", "--json"]
    job = subprocess.Popen(horovodrun_cmd(2, example), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=job_env(), start_new_session=True, cwd=ROOT)
    lines = []
    try:
        for line in job.stdout:                # wait for the first epoch's summary, then signal rank 1
            lines.append(line)
            if "epoch 1: train loss" in line:
                break
        # The ranks' own processes: the interpreter running the example (not horovodrun, not a shell).
        pattern = f"^{sys.executable} {example[0]} --epochs 6"
        pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
        workers = sorted(int(p) for p in pids.split())
        assert len(workers) == 2, pids
        signalled = time.time()
        os.kill(workers[-1], signal.SIGTERM)
        rest, _ = job.communicate(timeout=60)
        ended = time.time() - signalled
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    output = "".join(lines) + rest
    assert ended < 30 and f"Exit code: {REQUEUE_EXIT_CODE}" in output, (ended, output[-3000:])
    assert "final test accuracy" not in output
    saved = sorted(p.name for p in ckpts.glob("ckpt-*.pt"))
    assert saved, "no checkpoint was written"
    proc = run_job(horovodrun_cmd(2, [*example, "--resume"]), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index('{"dataset"'):].splitlines()[0])
    assert result["size"] == 2 and result["test_accuracy"] > 0.9
