"""Checkpoints under faults, through the example a user copies: a damaged copy is refused on every rank and
left as it was, a kill between two writes never blocks the resume, and an unusable checkpoint directory
stops the job before training with one line."""

import json
import re
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import (
    ROOT,
    WORKERS,
    horovodrun_cmd,
    hvdkit_launch_cmd,
    read_rank_results,
    run_horovodrun,
    run_job,
)

pytestmark = pytest.mark.multiproc
EXAMPLE = str(ROOT / "examples" / "pytorch_mnist.py")


def flip_exponent_bit_of_largest_tensor(path) -> None:
    """Flip bit 6 of the high byte of the first float in the file's largest tensor (0.01 -> ~1e36)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        data_start = info.header_offset + 30 + name_len + extra_len
        f.seek(data_start + 3)
        byte = f.read(1)[0]
        f.seek(data_start + 3)
        f.write(bytes([byte ^ 0x40]))


def test_a_damaged_copy_of_a_checkpoint_is_refused_on_every_rank_and_left_alone(tmp_path):
    """Before: a copy without its .sha256 sidecar loaded a 1e37 weight, trained to NaN, exited 0 and overwrote
    the checkpoint with NaN weights."""
    ckpt = tmp_path / "ckpt.pt"
    # The checkpoint from a whole run, a scenario of the 2-rank torch pool; the resume starts cold.
    proc = run_horovodrun(2, [EXAMPLE, "--epochs", "1", "--checkpoint", str(ckpt)], timeout=240, pool="torch")
    assert proc.returncode == 0, proc.stdout[-3000:]
    copy = tmp_path / "copied" / "ckpt.pt"           # copied by a tool that knows nothing of hvdkit
    copy.parent.mkdir()
    shutil.copyfile(ckpt, copy)
    flip_exponent_bit_of_largest_tensor(copy)
    damaged = copy.read_bytes()
    proc = run_job(horovodrun_cmd(2, [EXAMPLE, "--epochs", "2", "--checkpoint", str(copy), "--resume"]),
                   timeout=240)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert len(re.findall(r"error: checkpoint '.*ckpt.pt' is damaged: its content does not match the digest",
                          proc.stdout)) == 2, proc.stdout[-3000:]         # one line on each rank
    assert "final test accuracy" not in proc.stdout
    assert copy.read_bytes() == damaged, "a refused checkpoint must not be overwritten"


def test_plain_torch_load_reads_a_checkpoint_for_inference(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    # A checkpoint of a whole 2-rank run, a scenario of the torch pool; plain torch.load reads it in a process of
    # its own.
    proc = run_horovodrun(2, [EXAMPLE, "--epochs", "1", "--checkpoint", str(ckpt)], timeout=240, pool="torch")
    assert proc.returncode == 0, proc.stdout[-3000:]
    code = ("import sys, torch; sys.path.insert(0, 'examples'); from pytorch_mnist import Net; "
            f"state = torch.load({str(ckpt)!r}, map_location='cpu', weights_only=True); "
            "m = Net(); m.load_state_dict(state['model']); m.eval(); "
            "print(m(torch.zeros(1, 1, 28, 28)).shape)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "torch.Size([1, 10])" in out.stdout, out.stderr[-2000:]


def test_a_kill_right_after_the_rename_never_blocks_the_resume(tmp_path):
    """Before: the new file sat beside the old .sha256 and resume refused it ("restore an older checkpoint")."""
    ckpt, out = tmp_path / "ckpt.pt", tmp_path / "out"
    out.mkdir()
    proc = run_job(horovodrun_cmd(2, [str(WORKERS / "torch_save_killed.py"), "--out", str(out),
                                      "--ckpt", str(ckpt)]), timeout=120)
    assert proc.returncode != 0, "rank 0 was to be killed"
    proc = run_job(horovodrun_cmd(2, [str(WORKERS / "torch_save_killed.py"), "--out", str(out),
                                      "--ckpt", str(ckpt), "--resume"]), timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    for r in read_rank_results(out, 2, proc.stdout):
        assert r["size"] == 2 and r["extra"] == {"epoch": 1}, "the complete new checkpoint is the one loaded"


@pytest.mark.parametrize("options, words", [
    ("ro,size=1m", "Read-only file system (errno 30): save to a writable file system"),
    ("size=64k", "has 64 KiB free but keep_last=3 checkpoints of this model need (3 kept and the one being written: "
                 "4 x"),
])
def test_an_unusable_checkpoint_directory_stops_the_job_before_training(small_mount, options, words):
    """Before: the job trained an epoch, then every rank printed a raw OSError traceback."""
    mount = small_mount(options)
    ckpts = mount if options.startswith("ro,") else mount / "ckpts"
    proc = run_job(hvdkit_launch_cmd(2, [EXAMPLE, "--epochs", "2", "--checkpoint-dir", str(ckpts)]), timeout=240)
    assert proc.returncode != 0
    assert words in proc.stdout, proc.stdout[-3000:]
    assert "train loss" not in proc.stdout, "no epoch may run"
    assert not re.search(r"\[\d+\]<stderr>:Traceback", proc.stdout), "the ranks print one line, no traceback"


@pytest.mark.parametrize("controller, how", [("gloo", "blocking"), ("mpi", "blocking"), ("gloo", "background")])
def test_a_disk_that_fills_during_a_torch_save_is_one_checkpoint_error(small_mount, tmp_path, launch, controller, how):
    """Issue 34, case 4: torch.save wraps ENOSPC in `RuntimeError: [enforce fail at inline_container.cc:672] .
    unexpected pos ...`, which the example's `except hk.CheckpointError` missed: a traceback on rank 0.
    A background save (blocking=False) gives the same error where the script waits for it."""
    mount = small_mount("size=8m")
    r0, r1 = launch(2, "torch_disk_full.py", "--ckpt", str(mount / "ckpt.pt"),
                    *(["--background"] if how == "background" else []), controller=controller)
    assert r0["size"] == r1["size"] == 2 and r1["error"] is None
    assert r0["error"].startswith(f"CheckpointError: cannot write checkpoint '{mount / 'ckpt.pt'}': the disk filled "
                                  "up after "), r0["error"]
    assert "this checkpoint needs about 4 MiB): free space there or save elsewhere" in r0["error"], r0["error"]
    assert r0["files"] == ["filler"], "no checkpoint and no temporary file is left"


def test_a_directory_remounted_read_only_fails_a_background_save_with_one_checkpoint_error(small_mount, launch):
    """The checkpoint directory passes the pre-flight check, then becomes read-only (a storage fault remounts it):
    the background write's error is the blocking save's line, raised where the script waits for the write."""
    mount = small_mount("size=8m")
    r0, r1 = launch(2, "torch_disk_full.py", "--ckpt", str(mount / "ckpt.pt"), "--fault", "read-only",
                    "--background")
    assert r0["size"] == r1["size"] == 2 and r1["error"] is None
    assert r0["error"] == (f"CheckpointError: cannot write checkpoint '{mount / 'ckpt.pt'}': Read-only file system "
                           "(errno 30): save to a writable file system; the previous checkpoint is untouched"), \
        r0["error"]
    assert r0["files"] == [], "nothing is left"


def test_the_rank_that_failed_first_is_named_not_the_one_reaped_first(tmp_path):
    """Rank 1 raises and takes a moment to exit; rank 0 then fails at once because Horovod shut down.
    horovodrun reaps rank 0 first; hvdkit launch must still name rank 1 and its error."""
    proc = run_job(hvdkit_launch_cmd(2, [str(WORKERS / "fail_first.py"), "--out", str(tmp_path)]), timeout=120)
    assert proc.returncode != 0
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("hvdkit launch: job failed: rank 1 on localhost, local rank 1 failed first: "
                           "ValueError: bad record in shard 1"), line
    assert json.loads((tmp_path / "rank0.json").read_text())["size"] == 2
