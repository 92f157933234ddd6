"""hk.DistributedOptimizer(..., shard_optimizer_state=True) for Keras 3: ZeRO stage 1 against the same job unsharded.

Real horovodrun jobs (tests/multiproc/workers/keras_sharded.py) in model.fit (TensorFlow's compiled step, and
Keras on torch): from one start, 20 optimizer steps in float64, sharded and not, with clipping by norm and
gradient accumulation; a checkpoint saved sharded on 2 ranks, resumed on 1 and on 3 (issue 39).
"""

import pytest

from tests.conftest import WORKERS, horovodrun_cmd, read_rank_results, run_job

pytestmark = pytest.mark.multiproc
WORKER = str(WORKERS / "keras_sharded.py")


def run(tmp_path, np, controller, *args, name="job"):
    out = tmp_path / name
    out.mkdir()
    proc = run_job(horovodrun_cmd(np, [WORKER, "--out", str(out), *args], controller), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    results = read_rank_results(out, np, proc.stdout)
    assert {r["size"] for r in results} == {np}
    return proc, results


def check_equal_and_a_1_over_n_share(results, np, tolerance):
    r0 = results[0]
    assert r0["moved"] > 0.01, "the job did not train"
    assert r0["same_entries"], "the sharded checkpoint's entries are not the unsharded ones"
    assert max(r0["diff"].values()) <= tolerance, r0["diff"]
    for r in results:
        # Each rank's optimizer: 1/N of the unsharded one, within 10% (step counts and rates stay whole).
        assert abs(r["sharded_bytes"] - r["plain_bytes"] / np) <= 0.1 * r["plain_bytes"] / np, r
    assert sum(r["sharded_bytes"] for r in results) <= 1.02 * r0["plain_bytes"]


@pytest.mark.parametrize("mode,np,optimizer,clip,accumulate,controller", [
    ("tensorflow", 3, "sgd", "each", 1, "gloo"),
    ("torch", 3, "adamw", "global", 2, "mpi")])
def test_sharded_fit_equals_unsharded_and_holds_a_1_over_n_share(tmp_path, mode, np, optimizer, clip, accumulate,
                                                                 controller):
    """SGD with momentum and clipnorm; AdamW with weight decay (bias excluded by name), global_clipnorm and
    gradient_accumulation_steps; a MaxNorm constraint on the first layer. MPI is what hvdkit launch picks on
    one host; Gloo the other controller."""
    proc, results = run(tmp_path, np, controller, "--mode", mode, "--optimizer", optimizer, "--clip", clip,
                        "--accumulate", str(accumulate))
    check_equal_and_a_1_over_n_share(results, np, 1e-12)
    assert all(r["iterations"] == 20 for r in results)
    assert "hvdkit:" not in proc.stdout, "a correct script was warned"


def test_a_sharded_checkpoint_resumes_on_other_world_sizes_sharded_or_not(tmp_path):
    """Saved sharded on 2 ranks under MPI (Adam, global_clipnorm, accumulation): the file is an unsharded
    optimizer's, entry for entry. Resumed on 1 rank unsharded and on 3 sharded under Gloo: saving the loaded state
    again gives the same file, and the 5 steps after it end where the 2-rank job's own 5 steps did."""
    ckpt = str(tmp_path / "ckpt.npz")
    common = ["--mode", "tensorflow", "--clip", "global", "--accumulate", "2", "--ckpt", ckpt]
    _, saved = run(tmp_path, 2, "mpi", *common, name="save")
    check_equal_and_a_1_over_n_share(saved, 2, 1e-12)
    reference = saved[0]["after"]
    for name, np, extra in (("one", 1, []), ("three", 3, ["--shard"])):
        _, resumed = run(tmp_path, np, "gloo", *common, "--phase", "resume", *extra, name=name)
        assert resumed[0]["resave_diff"] == 0.0, name
        for r in resumed:
            assert r["sharded"] is bool(extra), (name, r)
            assert max(abs(a - b) for a, b in zip(reference, r["after"])) <= 1e-12, (name, r["rank"])


def test_mixed_precision_and_keras_own_files(tmp_path):
    """mixed_float16 (a LossScaleOptimizer around the sharded one) on Keras on torch: equal to unsharded within
    float32 rounding. Keras's save_weights on the writing rank alone (as ModelCheckpoint does) keeps the weights
    and says, once, that the sharded state is not in the file; an unsharded job's file loads into a sharded
    optimizer on every rank, each keeping its slices."""
    proc, results = run(tmp_path, 2, "gloo", "--mode", "torch", "--mixed", "--keras-files", "--clip", "global")
    check_equal_and_a_1_over_n_share(results, 2, 1e-6)
    assert results[0]["keras_file_diff"] == 0.0
    assert proc.stdout.count("hvdkit: model.save/save_weights (and ModelCheckpoint) keep the weights") == 1


def test_what_keras_sharding_cannot_do_is_one_user_error_each(tmp_path):
    _, results = run(tmp_path, 2, "gloo", "--mode", "tensorflow", "--phase", "refusals")
    for r in results:
        errors = r["errors"]
        assert "got Lamb" in errors["lamb"] and "AdamW" in errors["lamb"]
        assert "use_ema" in errors["ema"]
        assert "wrap it before compile" in errors["built"]
        assert "leave shard_optimizer_state off in elastic Keras jobs" in errors["elastic"]
