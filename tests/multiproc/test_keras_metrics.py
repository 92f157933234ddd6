"""Keras metrics on N ranks equal one process's over the whole data (issue 54, cases 2, 8 and 9).

Before: hk.callbacks() averaged each rank's result, as Horovod's MetricAverageCallback does, so counts came out
divided by the ranks (val_tp 20.5 against 41), ratios as a mean of per-rank ratios (precision 0.750 against
0.774), and each rank's padding rows were counted. Custom loops had nothing but metric_average. The reference
is one process with no Horovod that loads the weights the job saved and evaluates the whole validation set.
"""

import json
import subprocess
import sys

import pytest

from tests.conftest import WORKERS, job_env

pytestmark = pytest.mark.multiproc
# In make test's other lane (tests/conftest.py), as test_gpu_pinning.py: its jobs are found by their own
# directories, never by command line.
LANE = "others"
COUNTS = ("tp", "fn")
RATIOS = ("precision", "recall", "auc", "accuracy", "loss")
SIZES = [("tensorflow", 2), ("tensorflow", 3), ("torch", 2), ("torch", 3)]


def close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(b), 1e-12)


def one_process(mode: str, weights) -> dict[str, float]:
    """The whole validation set evaluated by keras_metrics_reference.py in a process of its own."""
    assert weights.exists(), f"rank 0 saved no weights at {weights}"
    proc = subprocess.run([sys.executable, str(WORKERS / "keras_metrics_reference.py"), "--mode", mode,
                           "--weights", str(weights)], capture_output=True, text=True, env=job_env(), timeout=300,
                          cwd=WORKERS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = json.loads(proc.stdout.strip().splitlines()[-1])
    assert reference["tp"] + reference["fn"] > 0 and 0 < reference["precision"] < 1, reference
    return reference


@pytest.mark.parametrize("mode,np", SIZES)
def test_fit_evaluate_and_a_custom_loop_log_one_process_numbers(launch, tmp_path, mode, np):
    weights = tmp_path / "final.weights.h5"
    results = launch(np, "keras_metrics.py", "--mode", mode, "--weights", str(weights), timeout=300)
    assert [r["size"] for r in results] == [np] * np
    assert sum(r["rows"] for r in results) == 101, "pad=False keeps every validation row once"
    reference = one_process(mode, weights)
    for r in results:
        for name in COUNTS + RATIOS:
            assert close(r["logged"][f"val_{name}"], reference[name]), (r["rank"], name, r["logged"], reference)
            assert close(r["evaluated"][name], reference[name]), (r["rank"], name, r["evaluated"], reference)
            if name != "loss":
                assert close(r["custom"][name], reference[name]), (r["rank"], name, r["custom"], reference)
        assert float(r["logged"]["val_tp"]).is_integer(), "a count divided by the ranks"
    expected = results[0]["train_expected"]
    for name in COUNTS + RATIOS:
        assert close(results[0]["logged"][name], expected[name]), (name, results[0]["logged"], expected)


@pytest.mark.parametrize("mode,np", SIZES)
def test_a_custom_training_loop_validates_as_one_process_does(launch, tmp_path, mode, np):
    """The recipe's loop (tf.data sharded before shuffle, the wrapped optimizer's apply) with hk.sync_metrics."""
    weights = tmp_path / "final.weights.h5"
    results = launch(np, "keras_custom_loop.py", "--mode", mode, "--weights", str(weights), timeout=300)
    assert [r["size"] for r in results] == [np] * np
    assert len({r["final"] for r in results}) == 1, "the ranks' weights must agree"
    assert [r["unsharded"] for r in results] == [False] * np and results[0]["warnings"] == []
    reference = one_process(mode, weights)
    for r in results:
        for name in COUNTS + RATIOS[:-1]:
            assert close(r["validation"][name], reference[name]), (name, r["validation"], reference)


@pytest.mark.parametrize("mode", ["tensorflow", "torch"])
def test_a_custom_loop_over_unsharded_tf_data_is_named_in_one_line(launch, tmp_path, mode):
    """Case 9: fit's unsharded-data check did not reach custom loops; hk.check_sharded is the one call they make."""
    results = launch(2, "keras_custom_loop.py", "--mode", mode, "--unsharded",
                     "--weights", str(tmp_path / "final.weights.h5"))
    assert [r["size"] for r in results] == [2, 2]
    assert [r["unsharded"] for r in results] == [True, True]
    lines = [w for w in results[0]["warnings"] if w.startswith("hvdkit: ")]
    assert len(lines) == 1, lines
    assert "not sharded" in lines[0] and "hk.shard_dataset(ds) before shuffle and batch" in lines[0]
    assert results[1]["warnings"] == [], "rank 0 alone says it"
    assert results[0]["final"] == results[1]["final"], "the ranks' weights must agree"

