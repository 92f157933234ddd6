"""Keras metrics on N ranks equal one process's over the whole data (issue 54, cases 2 and 8).

Before: hk.callbacks() averaged each rank's result, as Horovod's MetricAverageCallback does, so counts came out
divided by the ranks (val_tp 20.5 against 41), ratios as a mean of per-rank ratios (precision 0.750 against
0.774), and each rank's padding rows were counted. Custom loops had nothing but metric_average.
"""

import pytest

pytestmark = pytest.mark.multiproc
COUNTS = ("tp", "fn")
RATIOS = ("precision", "recall", "auc", "accuracy", "loss")


def close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(b), 1e-12)


@pytest.mark.parametrize("mode,np", [("tensorflow", 3), ("torch", 2)])
def test_fit_evaluate_and_a_custom_loop_log_one_process_numbers(launch, mode, np):
    results = launch(np, "keras_metrics.py", "--mode", mode, timeout=300)
    assert [r["size"] for r in results] == [np] * np
    assert sum(r["rows"] for r in results) == 101, "pad=False keeps every validation row once"
    reference = results[0]["reference"]
    assert reference["tp"] + reference["fn"] > 0 and 0 < reference["precision"] < 1
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


@pytest.mark.parametrize("unsharded", [True, False])
def test_a_custom_loop_over_unsharded_tf_data_is_named_in_one_line(launch, unsharded):
    """Case 9: fit's unsharded-data check did not reach custom loops; hk.check_sharded is the one call they make."""
    results = launch(2, "keras_custom_loop.py", "--mode", "tensorflow", *(["--unsharded"] if unsharded else []))
    assert [r["size"] for r in results] == [2, 2]
    assert [r["unsharded"] for r in results] == [unsharded] * 2
    lines = [w for w in results[0]["warnings"] if w.startswith("hvdkit: ")]
    assert len(lines) == (1 if unsharded else 0), lines
    if unsharded:
        assert "not sharded" in lines[0] and "hk.shard_dataset(ds) before shuffle and batch" in lines[0]
    assert results[1]["warnings"] == [], "rank 0 alone says it"
    assert results[0]["final"] == results[1]["final"], "the ranks' weights must agree"
