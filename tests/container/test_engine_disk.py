"""The image tier refuses a disk too small for its layers at once, in one line (stop 59's CI ran out of disk
half an hour in, in the middle of a COPY step of the build)."""

import subprocess

import pytest

from tests.container.engine import Engine, EngineError

pytestmark = pytest.mark.container


def test_an_engine_on_a_disk_too_small_stops_before_starting_naming_the_fix(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    try:
        engine = Engine(small / "docker", tmp_path / "dockerd.log")
        with pytest.raises(EngineError) as raised:
            with engine:
                pass
        message = str(raised.value)
        assert "\n" not in message
        assert "needs about 40 GB" in message and "0.1 GB free" in message and "HVDKIT_CACHE_DIR" in message
        assert engine.proc is None, "dockerd was started on a disk that cannot hold the build"
    finally:
        subprocess.run(["umount", str(small)], check=True)
