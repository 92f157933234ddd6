"""hvdkit.ops.timeline on a real timeline: 2 ranks on Gloo, rank 1 sleeping 40 ms before each backward.

tests/data/timeline_rank1_slow.json was recorded with
``horovodrun -np 2 -H localhost:2 --gloo --timeline-filename ... --cache-capacity 0
python tests/multiproc/workers/torch_straggler.py --slow-rank 1 --epochs 1 --samples 96``.
"""

import json
import sys

import pytest

from hvdkit.cli.main import main
from hvdkit.common.errors import UserError
from hvdkit.ops.timeline import analyze, format_report, parse_timeline, read_timeline
from tests.conftest import ROOT

pytestmark = pytest.mark.unit
RECORDED = ROOT / "tests" / "data" / "timeline_rank1_slow.json"
TEXT = RECORDED.read_text()


def test_recorded_file_names_the_slowed_rank():
    report = analyze(read_timeline(str(RECORDED)))
    assert [s.rank for s in report.ranks] == [0, 1]
    slow, fast = report.ranks[1], report.ranks[0]
    assert report.latest_rank == 1
    assert 30 < slow.late_median_ms < 80, slow        # the sleep is 40 ms
    assert fast.late_median_ms < 1
    assert fast.waited_ms > 10 * fast.late_total_ms   # rank 0 waits for rank 1, not the other way round
    assert report.cached_negotiations == 0 and report.negotiations == 32
    assert 0 < report.reducing_ms < report.span_ms
    assert "GLOO_ALLREDUCE" in report.activities_ms
    weights = {t.tensor: t for t in report.tensors}
    assert weights["allreduce.fc.weight"].nbytes == 10 * 144 * 4 and weights["allreduce.fc.weight"].count == 3
    text = format_report(report)
    assert "rank 1 is the latest" in text


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_a_killed_jobs_file_is_read_up_to_its_last_whole_event(cut):
    whole = parse_timeline(TEXT)
    part = parse_timeline(TEXT.rstrip().rstrip("]")[: int(len(TEXT) * cut)])   # cut mid-event
    assert not part.complete
    assert 0 < len(part.negotiations) < len(whole.negotiations)
    report = analyze(part)
    assert any("not closed" in n for n in report.notes)


def test_cached_negotiations_carry_no_rank_and_say_how_to_record():
    # What Horovod writes for a step answered from its response cache: the span, no per-rank markers.
    events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.w"}},
              {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 10, "pid": 1}, {"ph": "E", "ts": 50, "pid": 1},
              {"ph": "B", "name": "ALLREDUCE", "ts": 60, "pid": 1}, {"ph": "B", "name": "MPI_ALLREDUCE", "ts": 61,
                                                                    "pid": 1},
              {"ph": "E", "ts": 90, "pid": 1}, {"ph": "E", "ts": 95, "pid": 1, "args": {"dtype": "float64",
                                                                                       "shape": "[2, 3]"}}]
    report = analyze(parse_timeline("[\n" + ",\n".join(json.dumps(e) for e in events)))
    assert report.ranks == () and report.latest_rank is None and report.cached_negotiations == 1
    assert report.tensors[0].nbytes == 48 and report.activities_ms == {"MPI_ALLREDUCE": 0.029}
    assert any("--cache-capacity 0" in n for n in report.notes)


def test_not_a_timeline_names_the_fix(tmp_path):
    with pytest.raises(UserError, match="hvdkit launch --timeline"):
        parse_timeline("hello")
    with pytest.raises(UserError, match="cannot read the timeline"):
        read_timeline(str(tmp_path / "missing.json"))


def test_command_prints_json(capsys):
    # The PNG needs matplotlib (the bench extra): tests/multiproc/test_timeline.py draws one.
    assert main(["timeline", str(RECORDED), "--json", "--plot", "none"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["latest_rank"] == 1 and out["ranks"][1]["late_median_ms"] > 30


def test_without_matplotlib_the_picture_names_the_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib now raises ImportError
    assert main(["timeline", str(RECORDED), "--plot", str(tmp_path / "t.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("pip install 'hvdkit[bench]' (hvdkit timeline also takes --plot none)"), err
    assert len(err.splitlines()) == 1
