"""Checkpoint files: atomic saves, keep-last-N, falling back past damaged checkpoints, leftovers of killed
saves, and saves to unwritable or full places stopping with one line."""

import errno
import logging
import os

import pytest

from hvdkit.runtime.checkpoint_files import (
    CheckpointDir,
    CheckpointError,
    check_writable,
    damaged,
    read_from,
    save_to,
    write_checkpoint_file,
)

pytestmark = pytest.mark.unit


def writer(text):
    return lambda f: f.write(text.encode())


def read_text(path):
    """A loader that verifies, as the adapters' do: 'state N' is good, anything else is damaged."""
    with open(path) as f:
        text = f.read()
    if not text.startswith("state"):
        raise damaged(path, "not a state")
    return text


def test_save_prunes_to_keep_last_and_leaves_only_the_checkpoints(tmp_path):
    d = CheckpointDir(tmp_path, ".txt", keep_last=2)
    for step in range(4):
        d.save(step, writer(f"state {step}"))
    assert [os.path.basename(p) for p in d.checkpoints()] == ["ckpt-00000003.txt", "ckpt-00000002.txt"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000002.txt", "ckpt-00000003.txt"]


@pytest.mark.parametrize("damage, reason", [
    (lambda p: open(p, "r+b").write(b"X"), "is damaged: not a state"),
    (lambda p: open(p, "wb").close(), "is damaged: not a state"),
    (lambda p: os.chmod(p, 0) if os.geteuid() else os.unlink(p), None),
])
def test_select_falls_back_past_a_damaged_newest(tmp_path, caplog, damage, reason):
    d = CheckpointDir(tmp_path, ".txt")
    for step in (1, 2, 3):
        d.save(step, writer(f"state {step}"))
    damage(d.path_for(3))
    with caplog.at_level(logging.WARNING, logger="hvdkit.checkpoint"):
        chosen = d.select(read_text)
    assert chosen.payload == "state 2" and chosen.path == d.path_for(2)
    if reason:
        assert chosen.skipped == [(d.path_for(3), chosen.skipped[0][1])] and reason in chosen.skipped[0][1]
        assert "ckpt-00000003.txt skipped" in caplog.text and "resuming from" in caplog.text


def test_select_skips_a_checkpoint_that_does_not_load(tmp_path):
    d = CheckpointDir(tmp_path, ".txt")
    d.save(1, writer("state 1"))
    d.save(2, writer("state two"))
    chosen = d.select(lambda p: int(open(p).read().split()[1]))
    assert chosen.payload == 1 and "does not load (ValueError" in chosen.skipped[0][1]


def test_no_usable_checkpoint_names_each_and_the_fix(tmp_path):
    d = CheckpointDir(tmp_path, ".txt")
    d.save(1, writer("garbage 1"))
    with pytest.raises(CheckpointError, match=r"ckpt-00000001.txt: .* is damaged.*restore one from a backup") as info:
        read_from(str(tmp_path) + "/", read_text, ".txt")
    assert str(info.value).count("restore") == 1, "each file's cause, then the fix once"
    with pytest.raises(CheckpointError, match=r"does not exist: check the path, or pass missing_ok=True"):
        read_from(str(tmp_path / "none.txt"), read_text, ".txt")
    with pytest.raises(CheckpointError, match="no checkpoints in"):
        read_from(str(tmp_path / "empty") + "/", read_text, ".txt")


def test_the_next_save_removes_the_temporary_files_of_a_killed_one(tmp_path):
    (tmp_path / ".model.txt.abc12_yz.tmp").write_text("half a checkpoint")
    (tmp_path / ".ckpt-00000005.txt.x1b2c3d4.tmp").write_text("half")
    (tmp_path / ".unrelated.tmp").write_text("not ours")
    (tmp_path / ".model.txt.best.k2j4h6g8.tmp").write_text("another file's save, maybe still running")
    save_to(str(tmp_path / "model.txt"), writer("state 1"), ".txt", step=None, keep_last=None)
    CheckpointDir(tmp_path, ".txt").save(6, writer("state 6"))
    assert sorted(os.listdir(tmp_path)) == [".model.txt.best.k2j4h6g8.tmp", ".unrelated.tmp", "ckpt-00000006.txt",
                                            "model.txt"]


def test_a_failing_write_is_one_line_with_the_fix_and_keeps_the_previous_file(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text("state 1")

    def disk_full(f):
        f.write(b"state 2 ...")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*No space left on device \(errno 28\): "
                                              r"free space there or save elsewhere; the previous checkpoint"):
        write_checkpoint_file(path, disk_full)
    assert path.read_text() == "state 1" and os.listdir(tmp_path) == ["model.txt"]


def test_check_writable_names_missing_space_with_the_numbers(tmp_path):
    assert check_writable(str(tmp_path / "ckpts") + "/") is None and (tmp_path / "ckpts").is_dir()
    assert os.listdir(tmp_path / "ckpts") == []                       # the probe is gone
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    problem = check_writable(str(tmp_path / "m.pt"), need_bytes=free * 2)
    assert "free but a checkpoint of this model needs about" in problem


def test_check_writable_on_a_file_where_the_directory_should_be(tmp_path):
    (tmp_path / "blocker").write_text("a file")
    problem = check_writable(str(tmp_path / "blocker" / "ckpts") + "/")
    assert problem.startswith("cannot write checkpoint") and "errno" in problem


def test_directory_needs_a_step_and_keep_last_needs_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match="pass step="):
        save_to(str(tmp_path) + "/", writer("state"), ".txt", step=None, keep_last=None)
    with pytest.raises(CheckpointError, match="keep_last needs a checkpoint directory"):
        save_to(str(tmp_path / "f.txt"), writer("state"), ".txt", step=None, keep_last=2)


def test_keep_last_never_counts_a_damaged_checkpoint(tmp_path, caplog):
    # Issue 34, case 5: step 12 saved beside a good 5 and a damaged 9 with keep_last=2 kept the damaged 9 and
    # deleted 5, the only good checkpoint before 12.
    (tmp_path / "ckpt-00000005.txt").write_text("state 5")
    (tmp_path / "ckpt-00000009.txt").write_text("garbage")
    d = CheckpointDir(tmp_path, ".txt", keep_last=2, verify=read_text)
    with caplog.at_level(logging.WARNING, logger="hvdkit.checkpoint"):
        d.save(12, writer("state 12"))
    # 9 does not count, and is not deleted while newer than the last one kept (a read may fail for other reasons)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000005.txt", "ckpt-00000009.txt", "ckpt-00000012.txt"]
    assert "ckpt-00000009.txt does not verify" in caplog.text
    d.save(13, writer("state 13"))                              # two good ones newer: the older ones go
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000012.txt", "ckpt-00000013.txt"]


def test_the_checkpoint_just_written_is_kept_whatever_its_step(tmp_path):
    d = CheckpointDir(tmp_path, ".txt", keep_last=2, verify=read_text)
    for step in (10, 11):
        d.save(step, writer(f"state {step}"))
    d.save(3, writer("state 3"))                                # a new run into an old directory
    assert "ckpt-00000003.txt" in os.listdir(tmp_path)


def test_keep_last_reads_an_older_checkpoint_once_a_process(tmp_path):
    reads = []

    def counting(path):
        reads.append(os.path.basename(path))
        return read_text(path)

    (tmp_path / "ckpt-00000001.txt").write_text("state 1")       # written by an earlier process
    d = CheckpointDir(tmp_path, ".txt", keep_last=3, verify=counting)
    for step in (2, 3, 4, 5):
        d.save(step, writer(f"state {step}"))
    assert reads == ["ckpt-00000001.txt"], "files this process wrote, or verified once, are not read again"


def test_torchs_disk_full_error_becomes_a_checkpoint_error_naming_the_space(tmp_path, monkeypatch):
    # Issue 34, case 4: torch.save reports ENOSPC as a RuntimeError ("[enforce fail at inline_container.cc:672]
    # . unexpected pos"), which got past the example's `except CheckpointError`.
    import shutil

    path = tmp_path / "model.txt"
    path.write_text("state 1")

    def full_disk(f):
        f.write(b"x" * 4096)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4096 vs 4032")

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage._replace(free=4096))   # as full as a real one
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*model.txt': the disk filled up after 4 "
                                              r"KiB \(4 KiB free now; this checkpoint needs about 1 MiB\): free "
                                              r"space there or save elsewhere; the previous checkpoint is untouched"):
        write_checkpoint_file(path, full_disk, 2**20)
    assert path.read_text() == "state 1" and os.listdir(tmp_path) == ["model.txt"]
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="enforce fail"):     # with room to spare it is not a full disk
        write_checkpoint_file(path, full_disk)


def test_check_writable_budgets_keep_last_checkpoints_and_the_one_being_written(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    ckpts = str(tmp_path / "ckpts") + "/"
    assert check_writable(ckpts, need_bytes=free // 3) is None                  # one checkpoint fits
    problem = check_writable(ckpts, need_bytes=free // 3, keep_last=3, suffix=".pt")
    assert "keep_last=3 checkpoints of this model need (3 kept and the one being written: 4 x" in problem


def test_a_second_writer_into_the_same_place_is_named(tmp_path):
    # Issue 34, case 6: two writers deleted each other's temporary files; half the saves failed with
    # "No such file or directory: check the path". A save holds an flock on its temporary file while writing.
    import subprocess
    import sys

    live = tmp_path / ".model.txt.ab12cd34.tmp"                  # another process's save of model.txt, in flight
    live.write_text("half")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "time.sleep(30)", str(live)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=r"another process is writing checkpoint .*model.txt' right now "
                                                  r"\(.model.txt.ab12cd34.tmp\): two jobs"):
            write_checkpoint_file(tmp_path / "model.txt", writer("state 1"))
        assert live.exists(), "a live writer's temporary file is left alone"
        write_checkpoint_file(tmp_path / "other.txt", writer("state 1"))   # another file in the same directory is fine
    finally:
        holder.kill()
        holder.wait()
    write_checkpoint_file(tmp_path / "model.txt", writer("state 2"))   # the lock went with its process: a leftover
    assert (tmp_path / "model.txt").read_text() == "state 2" and not live.exists()


def test_a_failed_results_write_is_a_write_error_not_a_checkpoint_error(tmp_path):
    """Issue 38: bench results were written by the checkpoint module, so a failed write said "checkpoint"."""
    from hvdkit.common.files import WriteError, atomic_write

    (tmp_path / "results.json").write_text("old")

    def fails(f):
        raise OSError(errno.EROFS, "Read-only file system")

    with pytest.raises(WriteError) as err:
        atomic_write(tmp_path / "results.json", fails, what="bench result")
    assert not isinstance(err.value, CheckpointError)
    assert str(err.value).startswith("cannot write bench result ") and "the previous bench result is untouched" \
        in str(err.value)
    assert (tmp_path / "results.json").read_text() == "old" and os.listdir(tmp_path) == ["results.json"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_follow_the_umask_as_torch_save_does(tmp_path, umask, mode):
    # Issue 54, case 3: every file hvdkit wrote was mkstemp's 0600, so teammates on a shared cluster could not
    # read a checkpoint (torch.save gives 0644 under the usual umask).
    from hvdkit.common.files import atomic_write, current_umask

    old = os.umask(umask)
    try:
        assert current_umask() == umask
        atomic_write(tmp_path / "ckpt.pt", lambda f: f.write(b"x"))
    finally:
        os.umask(old)
    assert (tmp_path / "ckpt.pt").stat().st_mode & 0o777 == mode


def test_a_checkpoint_of_a_format_no_longer_read_is_named_with_the_way_out():
    from hvdkit.runtime.checkpoint_files import verify_loaded

    with pytest.raises(CheckpointError, match="an hvdkit.keras/2 checkpoint, a format this hvdkit does not read"):
        verify_loaded("old.npz", "hvdkit.keras/2", "hvdkit.keras/3", {})
    with pytest.raises(CheckpointError, match="is not an hvdkit.torch checkpoint"):
        verify_loaded("x.pt", None, "hvdkit.torch/2", {})
