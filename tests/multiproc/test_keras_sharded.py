"""hk.DistributedOptimizer(..., shard_optimizer_state=True) for Keras 3: ZeRO stage 1 against the same job unsharded.

Real horovodrun jobs (tests/multiproc/workers/keras_sharded.py) in model.fit (TensorFlow's compiled step, and
Keras on torch): from one start, 20 optimizer steps in float64, sharded and not, with clipping by norm and
gradient accumulation; a checkpoint saved sharded on 2 ranks, resumed on 1 and on 3 (issue 39).
"""

import pytest

from tests.conftest import WORKERS, read_rank_results, run_horovodrun

pytestmark = pytest.mark.multiproc
WORKER = str(WORKERS / "keras_sharded.py")


def run(tmp_path, np, controller, *args, name="job"):
    out = tmp_path / name
    out.mkdir()
    # A resume starts in processes of its own; the rest run in the pool of their Keras (tests/job_pool.py).
    pool = None if "resume" in args else "keras-" + args[args.index("--mode") + 1]
    proc = run_horovodrun(np, [WORKER, "--out", str(out), *args], controller, timeout=300, pool=pool)
    assert proc.returncode == 0, proc.stdout[-3000:]
    results = read_rank_results(out, np, proc.stdout)
    assert {r["size"] for r in results} == {np}
    return proc, results


def check_equal_and_a_1_over_n_share(results, np, tolerance):
    r0 = results[0]
    assert r0["moved"] > 0.01, "the job did not train"
    assert r0["constraint_bound"], "the MaxNorm constraint never bound, so this run does not test it"
    assert r0["same_entries"], "the sharded checkpoint's entries are not the unsharded ones"
    assert max(r0["diff"].values()) <= tolerance, r0["diff"]
    for r in results:
        # Each rank's optimizer: 1/N of the unsharded one, within 10% (step counts and rates stay whole).
        assert abs(r["sharded_bytes"] - r["plain_bytes"] / np) <= 0.1 * r["plain_bytes"] / np, r
    assert sum(r["sharded_bytes"] for r in results) <= 1.02 * r0["plain_bytes"]


def test_sharded_fit_equals_unsharded_and_holds_a_1_over_n_share(tmp_path):
    """TensorFlow, 3 ranks under Gloo: SGD with momentum and clipnorm, a MaxNorm constraint that binds, and a
    bias that takes its gradient as its value (float8's overwrite_with_gradient: the slices were trained)."""
    proc, results = run(tmp_path, 3, "gloo", "--mode", "tensorflow", "--optimizer", "sgd", "--clip", "each",
                        "--overwrite-bias")
    check_equal_and_a_1_over_n_share(results, 3, 1e-12)
    assert all(r["iterations"] == 20 for r in results)
    assert "hvdkit:" not in proc.stdout, "a correct script was warned"


def test_sharded_fit_with_decay_accumulation_and_keras_own_files(tmp_path):
    """Keras on torch, 3 ranks under MPI (hvdkit launch's choice on one host): AdamW with weight decay (biases
    excluded by name before the build, the first kernel by variable after it), global_clipnorm and
    gradient_accumulation_steps=2; equal to unsharded. Keras's save_weights on the writing rank alone (as
    ModelCheckpoint does) keeps the weights and says, once, that the sharded state is not in the file; an
    unsharded job's file loads into a sharded optimizer on every rank, each keeping its slices."""
    proc, results = run(tmp_path, 3, "mpi", "--mode", "torch", "--optimizer", "adamw", "--clip", "global",
                        "--accumulate", "2", "--keras-files")
    check_equal_and_a_1_over_n_share(results, 3, 1e-12)
    assert all(r["iterations"] == 20 for r in results)
    assert results[0]["keras_file_diff"] == 0.0
    warned = [line for line in proc.stdout.splitlines() if "hvdkit:" in line]
    assert len(warned) == 1 and "keep the weights but not the sharded optimizer's state" in warned[0], warned


def test_a_sharded_checkpoint_resumes_on_other_world_sizes_sharded_or_not(tmp_path):
    """Saved sharded on 2 ranks under MPI (an Embedding, Adam, global_clipnorm, accumulation): the file is an
    unsharded optimizer's, entry for entry. The Embedding's gradient is sparse on TensorFlow (a row per lookup),
    and Keras's Adam squares each lookup's row before adding repeats up: cut to dense, the slices were 2.4e-3
    apart from the unsharded job. Resumed on 1 rank sharded and on 3 unsharded under Gloo: saving the loaded state
    again gives the same file, and the 5 steps after it end where the 2-rank job's own 5 steps did. The rank
    that resumes alone is sharded too: its Keras file holds every slice, and an unsharded optimizer loads it."""
    ckpt = str(tmp_path / "ckpt.npz")
    common = ["--mode", "tensorflow", "--clip", "global", "--accumulate", "2", "--ckpt", ckpt, "--embedding"]
    _, saved = run(tmp_path, 2, "mpi", *common, name="save")
    check_equal_and_a_1_over_n_share(saved, 2, 1e-12)
    reference = saved[0]["after"]
    for name, np, extra in (("one", 1, ["--shard"]), ("three", 3, [])):
        _, resumed = run(tmp_path, np, "gloo", *common, "--phase", "resume", *extra, name=name)
        assert resumed[0]["resave_diff"] == 0.0, name
        if np == 1:
            assert resumed[0]["keras_file_diff"] == 0.0
        for r in resumed:
            assert r["sharded"] is bool(extra), (name, r)
            assert max(abs(a - b) for a, b in zip(reference, r["after"])) <= 1e-12, (name, r["rank"])


def test_mixed_precision_and_keras_own_files(tmp_path):
    """mixed_float16 on TensorFlow (a LossScaleOptimizer around the sharded one, its step in fit's graph), with
    global_clipnorm: the norm is summed in float32 in another order (each rank's slices, then across ranks),
    which moves a weight by its last bit now and then, and the float16 copy of that weight by a whole float16
    step: 5.5e-6 apart after 20 steps here (0.0 without clipping; a skipped step or a missed unscale would be
    1e-2). Keras's files go through the LossScaleOptimizer's own save and load."""
    proc, results = run(tmp_path, 2, "gloo", "--mode", "tensorflow", "--mixed", "--keras-files", "--clip", "global")
    check_equal_and_a_1_over_n_share(results, 2, 1e-4)
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
        # Rank 0 loaded a file's optimizer state alone: its slice would have mixed with the others' old ones.
        assert "load on every rank" in errors["rank0_load"], "the broadcast kept the other ranks' slices silently"
        # The check read the zeroed weight copies (the slices), so ranks that start apart passed it.
        assert "hk.broadcast_state" in errors["apart"] or "callbacks" in errors["apart"], errors.get("apart")
        assert "pass the bare optimizer to hk.DistributedOptimizer" in errors["outside_loss_scale"]
        assert "the script's own" in errors["own_loss_scale"] and "bare optimizer" in errors["own_loss_scale"]
        # Saving under `if ctx.is_main:` paired with the other rank's next collective and blamed a load.
        assert "not under `if ctx.is_main:`" in errors["save_alone"] and "collective" in errors["save_alone"]
        assert "put the warmup in the schedule" in errors["warmup_schedule"], "Keras's TypeError before"
