"""`hvdkit launch --timeline` then `hvdkit timeline` on a real 2-rank Gloo job with rank 1 slowed on purpose."""

import json
import sys

import pytest

from tests.conftest import WORKERS, hvdkit_cmd, read_rank_results, run_hvdkit, run_job

pytestmark = pytest.mark.multiproc


def test_timeline_names_the_slowed_rank_as_late(tmp_path):
    tl = tmp_path / "timeline.json"
    cmd = hvdkit_cmd("launch", "-np", "2", "-H", "localhost:2", "--gloo", "--timeline", str(tl), "--",
                     sys.executable, str(WORKERS / "torch_straggler.py"), "--out", str(tmp_path),
                     "--slow-rank", "1", "--sleep-ms", "40", "--epochs", "1", "--samples", "256")
    job = run_job(cmd, timeout=180)
    assert job.returncode == 0, job.stdout[-3000:]
    assert [r["size"] for r in read_rank_results(tmp_path, 2, job.stdout)] == [2, 2]
    shown = run_hvdkit("timeline", str(tl), timeout=60)
    assert shown.returncode == 0, shown.stderr
    print(shown.stdout)
    assert "rank 1 is the latest" in shown.stdout
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads(run_hvdkit("timeline", str(tl), "--json", "--plot", "none", timeout=60).stdout)
    late = {s["rank"]: s["late_median_ms"] for s in report["ranks"]}     # 8 steps of 6 tensors outnumber start-up
    assert late[1] > 20 > late[0], late                 # each step's tensors wait ~40 ms for rank 1
    assert report["cached_negotiations"] == 0, "--timeline must turn the response cache off"
