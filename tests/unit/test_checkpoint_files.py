"""Checkpoint directories: checksums, keep-last-N and falling back past damaged checkpoints."""

import logging
import os

import pytest

from hvdkit.core.checkpoint_files import (
    CHECKSUM_SUFFIX,
    CheckpointDir,
    CheckpointError,
    read_from,
    save_to,
    verify_checksum,
)

pytestmark = pytest.mark.unit


def writer(text):
    return lambda f: f.write(text.encode())


def read_text(path):
    with open(path) as f:
        text = f.read()
    if not text.startswith("state"):
        raise ValueError("not a state")
    return text


def test_save_prunes_to_keep_last_and_writes_checksums(tmp_path):
    d = CheckpointDir(tmp_path, ".txt", keep_last=2)
    for step in range(4):
        d.save(step, writer(f"state {step}"))
    assert [os.path.basename(p) for p in d.checkpoints()] == ["ckpt-00000003.txt", "ckpt-00000002.txt"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000002.txt", "ckpt-00000002.txt.sha256",
                                            "ckpt-00000003.txt", "ckpt-00000003.txt.sha256"]
    assert all(verify_checksum(p) is None for p in d.checkpoints())


@pytest.mark.parametrize("damage, reason", [
    (lambda p: open(p, "r+b").write(b"X"), "checksum mismatch"),
    (lambda p: os.unlink(p + CHECKSUM_SUFFIX), "no checksum file"),
])
def test_select_falls_back_past_a_damaged_newest(tmp_path, caplog, damage, reason):
    d = CheckpointDir(tmp_path, ".txt")
    for step in (1, 2, 3):
        d.save(step, writer(f"state {step}"))
    damage(d.path_for(3))
    with caplog.at_level(logging.WARNING, logger="hvdkit.checkpoint"):
        chosen = d.select(read_text)
    assert chosen.payload == "state 2" and chosen.path == d.path_for(2)
    assert chosen.skipped == [(d.path_for(3), chosen.skipped[0][1])] and reason in chosen.skipped[0][1]
    assert "ckpt-00000003.txt skipped" in caplog.text and "resuming from" in caplog.text


def test_select_skips_a_checkpoint_that_does_not_load(tmp_path):
    d = CheckpointDir(tmp_path, ".txt")
    d.save(1, writer("state 1"))
    d.save(2, writer("garbage with a valid checksum"))
    chosen = d.select(read_text)
    assert chosen.payload == "state 1" and "does not load" in chosen.skipped[0][1]


def test_no_usable_checkpoint_names_each_and_the_fix(tmp_path):
    d = CheckpointDir(tmp_path, ".txt")
    d.save(1, writer("state 1"))
    open(d.path_for(1), "ab").write(b"!")
    with pytest.raises(CheckpointError, match=r"ckpt-00000001.txt: checksum mismatch.*start without --resume"):
        read_from(str(tmp_path) + "/", read_text, ".txt")
    with pytest.raises(CheckpointError, match="no checkpoints in"):
        read_from(str(tmp_path / "empty") + "/", read_text, ".txt")


def test_single_file_is_verified_when_it_has_a_checksum(tmp_path):
    path = str(tmp_path / "model.txt")
    save_to(path, writer("state 7"), ".txt", step=None, keep_last=None)
    assert read_from(path, read_text, ".txt") == (path, "state 7")
    open(path, "ab").write(b"!")
    with pytest.raises(CheckpointError, match="corrupt \\(checksum mismatch"):
        read_from(path, read_text, ".txt")


def test_directory_needs_a_step_and_keep_last_needs_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match="pass step="):
        save_to(str(tmp_path) + "/", writer("state"), ".txt", step=None, keep_last=None)
    with pytest.raises(CheckpointError, match="keep_last needs a checkpoint directory"):
        save_to(str(tmp_path / "f.txt"), writer("state"), ".txt", step=None, keep_last=2)
