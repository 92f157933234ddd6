"""hvdkit.keras under real horovodrun (Gloo, CPU) for Keras 3 + TensorFlow, Keras 3 + PyTorch and tf-keras."""

import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from hvdkit.runtime.integrity import DIGEST_KEY, check_digest
from tests.conftest import ROOT, WORKERS, horovodrun_cmd, job_env, kill_mid_save, run_job
from tests.multiproc.test_examples_quiet import assert_no_warning

pytestmark = pytest.mark.multiproc
MODES = ["tensorflow", "torch", "tf_keras"]
# tf-keras (Keras 2) runs where its code differs from Keras 3's: fit and its callbacks, the optimizer, saving and
# loading, the example. The checks that follow those paths (warmup, checkpoint directories, misuse errors) run on
# the two Keras 3 backends: each Keras job costs CI's 2 cores 10-20 s, and the suite must fit its 90 minutes.
KERAS3 = ["tensorflow", "torch"]


@pytest.mark.parametrize("mode,optimizer", [(mode, optimizer) for mode in MODES for optimizer in ("sgd", "adam")
                                            if (mode, optimizer) != ("tf_keras", "adam")])
def test_two_ranks_equal_one_process_with_fit(launch, mode, optimizer):
    r0, r1 = launch(2, "keras_equivalence.py", "--mode", mode, "--optimizer", optimizer)
    assert r0["size"] == r1["size"] == 2 and r0["backend"] == mode
    assert r0["initial"] != r1["initial"], "ranks must start from different weights for the test to mean anything"
    assert r0["after_first"] == r1["after_first"], "weights/optimizer variables differ after the first batch"
    assert r0["final"] == r1["final"]
    assert r0["change"] > 1e-3, "training must move the weights"
    assert r0["max_diff"] < 1e-5


def test_custom_training_loop_tensorflow_backend(launch):
    r0, r1 = launch(2, "keras_equivalence.py", "--mode", "tensorflow", "--optimizer", "adam", "--loop", "custom")
    assert r0["after_first"] == r1["after_first"] and r0["final"] == r1["final"]
    assert r0["max_diff"] < 1e-5


def test_unsharded_data_is_warned_about(launch, tmp_path):
    from tests.conftest import WORKERS, horovodrun_cmd, run_job

    cmd = horovodrun_cmd(2, [str(WORKERS / "keras_equivalence.py"), "--out", str(tmp_path), "--mode", "tensorflow",
                             "--optimizer", "sgd", "--unsharded"])
    proc = run_job(cmd, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "hvdkit: every rank was given the same training data" in proc.stdout


@pytest.mark.parametrize("mode", ["tensorflow", "torch"])
def test_mixed_float16_trains_identically_on_all_ranks(launch, mode):
    r0, r1 = launch(2, "keras_extras.py", "--mode", mode, "--task", "mixed_precision")
    assert r0["size"] == 2
    assert r0["compute_dtype"] == "float16"
    assert "LossScaleOptimizer" in r0["optimizer_class"]
    assert r0["weights"] == r1["weights"] and r0["optimizer"] == r1["optimizer"]
    assert r0["losses"] == r1["losses"], "metric averaging must give every rank the same epoch loss"
    assert all(np.isfinite(r0["losses"])) and r0["losses"][-1] < r0["losses"][0]


def test_warmup_on_data_of_unknown_length(launch):
    """fit on an unsized tf.data dataset knows no steps per epoch: warmup_epochs stops with the fix, and
    warmup_steps counts the batches across epochs (both used to count an epoch as one step)."""
    from hvdkit.runtime.lr import warmup_lr

    r0, r1 = launch(2, "keras_extras.py", "--mode", "tensorflow", "--task", "warmup_unsized")
    assert r0["size"] == 2
    for r in (r0, r1):
        assert "give callbacks(warmup_steps=...) instead, or fit(steps_per_epoch=...)" in r["error"]
        target = r["target_lr"]
        assert r["lrs"] == pytest.approx([warmup_lr(i, 12, target / 2, target) for i in range(16)], rel=1e-6)


@pytest.mark.parametrize("mode", KERAS3)
def test_warmup_schedule_and_metric_averaging(launch, mode):
    from hvdkit.runtime.lr import warmup_lr

    r0, r1 = launch(2, "keras_extras.py", "--mode", mode, "--task", "warmup_metrics")
    steps, target = r0["steps"], r0["target_lr"]
    assert steps == 8 and target == pytest.approx(0.01)        # 128 samples per rank / batch 16; 0.005 x 2
    expected = [warmup_lr(i, steps, target / 2, target) for i in range(2 * steps)]
    for r in (r0, r1):
        assert r["lrs"] == pytest.approx(expected, rel=1e-6), "per-batch warmup from lr/size to lr over 1 epoch"
    # hvdkit's callbacks first, in order; file writers (here CSVLogger) on rank 0 only; the barrier at the end.
    ours = ["StopOnNonFiniteLoss", "EpochOrder", "BroadcastInitialState", "MetricAverage", "LearningRateWarmup",
            "StragglerReport"]
    if mode == "tensorflow":         # first: it makes fit's train function split around XLA (test_keras_xla.py)
        ours.insert(0, "XlaOutsideCollectives")
    assert r0["callbacks"] == [*ours, "RecordLR", "CSVLogger", "TrainEndBarrier"]
    assert r1["callbacks"] == [*ours, "RecordLR", "TrainEndBarrier"]
    # fit's reported loss is one process's over both ranks' rows, on every rank: with the same rows on each rank,
    # the mean of the ranks' own values up to float32 rounding (the sum of the states, not of the results:
    # 3e-8 apart measured; test_keras_metrics.py checks unequal shards and counts against one process).
    assert r0["local"][0]["loss"] != r1["local"][0]["loss"]
    for epoch in range(2):
        mean = (r0["local"][epoch]["loss"] + r1["local"][epoch]["loss"]) / 2
        assert r0["history"]["loss"][epoch] == pytest.approx(mean, rel=1e-6)
        assert r1["history"]["loss"][epoch] == r0["history"]["loss"][epoch]


@pytest.mark.parametrize("mode", MODES)
def test_checkpoint_round_trip_across_fresh_processes(launch, tmp_path, mode):
    saved = launch(2, "keras_extras.py", "--mode", mode, "--task", "save")
    assert [r["wrote"] for r in saved] == [True, False], "only rank 0 writes"
    assert saved[0]["files"].count("ckpt.npz") == 1 and not any(f.endswith(".tmp") for f in saved[0]["files"])
    loaded = launch(2, "keras_extras.py", "--mode", mode, "--task", "load", pool=False)  # new processes, new seeds
    for r in loaded:
        assert r["extra"] == {"epoch": 0}
        assert r["weights"] == saved[0]["weights"]
        assert r["optimizer"] == saved[0]["optimizer"]


def test_jax_backend_fails_at_init_naming_the_supported_backends():
    code = "import hvdkit.keras as hk; hk.init()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=job_env(KERAS_BACKEND="jax"))
    assert proc.returncode != 0
    assert "BackendError" in proc.stderr and "KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch" in proc.stderr


# TensorFlow's run of the shipped example (accuracy, no hvdkit: line) is test_bf16.py's float32 run, 2 ranks
# under Gloo: one job less on CI's 2 cores.
@pytest.mark.parametrize("backend", ["torch", "tf_keras"])
def test_keras_example_trains_on_digits(backend, tmp_path):
    # 6 epochs (the default is 12) reach 97% on digits in half the time.
    argv = [str(ROOT / "examples" / "keras_mnist.py"), "--epochs", "6", "--json"]
    env = job_env()
    if backend == "torch":
        # As in the torch GPU venv or image after any earlier Keras run: no TensorFlow, no KERAS_BACKEND, and the
        # ~/.keras/keras.json naming TensorFlow that Keras writes on its first import. The example chose TensorFlow
        # from that file and stopped with "No module named 'tensorflow'".
        (tmp_path / "keras.json").write_text(json.dumps({"backend": "tensorflow", "floatx": "float32"}))
        (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
        env.pop("KERAS_BACKEND", None)
        env.update(KERAS_HOME=str(tmp_path), PYTHONPATH=f"{tmp_path}:{env['PYTHONPATH']}")
    else:
        argv[1:1] = ["--backend", backend]
    start = time.time()
    proc = run_job(horovodrun_cmd(2, argv), timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    result = json.loads(re.search(r'(\{"dataset".*\})', proc.stdout).group(1))
    print(f"keras example ({backend}): {result['test_accuracy']:.2%} in {time.time() - start:.1f}s wall")
    assert result["size"] == 2 and result["backend"] == backend
    assert result["test_accuracy"] >= 0.95
    assert_no_warning(proc.stdout)         # the quiet check of test_examples_quiet.py, on this same run


@pytest.mark.parametrize("mode", ["tensorflow", "torch"])
def test_elastic_shard_pads_and_commits_the_epoch_end_once(launch, mode):
    """A commit never holds an epoch consumed to the end, so a worker that joins never gets an empty shard."""
    r0, r1 = launch(2, "keras_elastic_shard.py", "--mode", mode)
    assert r0["size"] == r1["size"] == 2
    assert len(r0["tiny"]) == len(r1["tiny"]) == 1 and r0["tiny"] == r1["tiny"]
    assert r0["tiny_commits"] == [] and r0["after_tiny_epoch"] == [[1, 1, 0]]
    assert len(r0["full"]) == len(r1["full"]) == 19
    assert set(r0["full"]) | set(r1["full"]) == set(range(37))
    assert len(set(r0["full"]) & set(r1["full"])) == 1, "one sample repeated to even out the ranks"
    assert r0["full_commits"] == [[1, 2, 16], [1, 3, 32]], "steps 2 and 3 commit; the epoch's last waits"
    assert "call state.epoch_done()" in r0["exhausted"] and "37 in all, 38 consumed" in r0["exhausted"]
    assert r0["after_full_epoch"] == [[1, 2, 16], [1, 3, 32], [2, 4, 0]]
    assert r0["after_full_epoch"] == r1["after_full_epoch"]


@pytest.mark.parametrize("mode", KERAS3)
def test_checkpoint_directory_keeps_last_and_falls_back_past_a_damaged_newest(launch, tmp_path, mode):
    saved = launch(2, "keras_checkpoints.py", "--mode", mode, "--task", "save_dir")
    assert saved[0]["size"] == 2
    assert saved[0]["files"] == ["ckpt-00000002.npz", "ckpt-00000003.npz"], "keep_last=2, no temp files"
    newest = tmp_path / "ckpts" / "ckpt-00000003.npz"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF                                   # one flipped byte
    newest.write_bytes(bytes(data))
    loaded = launch(2, "keras_checkpoints.py", "--mode", mode, "--task", "load_dir")
    for r in loaded:
        assert r["extra"] == {"step": 2, "epoch": 2}
        assert r["values"] == [2.0], "every rank holds the weights saved at step 2"
    assert any("ckpt-00000003.npz skipped:" in w and "corrupt" in w for w in loaded[0]["warnings"])
    assert newest.read_bytes() == bytes(data), "resume must not touch the damaged file"


@pytest.mark.parametrize("mode", KERAS3)
def test_checkpoints_load_by_name_and_name_what_does_not_match(launch, mode):
    results = launch(2, "keras_checkpoints.py", "--mode", mode, "--task", "by_name")
    assert [r["size"] for r in results] == [2, 2]
    for r in results:
        assert r["same_architecture"] is None, "Keras's per-process layer numbering must not matter"
        assert r["values"] == [3.0]
        assert r["wider"].startswith("CheckpointError: ") and "'model/dense/kernel' is (4, 4) there but (5, 5) here" \
            in r["wider"], r["wider"]
        assert "missing ['model/dense_2/kernel', 'model/dense_2/bias']" in r["deeper"], r["deeper"]
        assert r["broadcast"].startswith("StateMismatchError: rank 1's model differs from rank 0's "
                                         "('model/dense/kernel' is (5, 5)"), r["broadcast"]


@pytest.mark.parametrize("mode", KERAS3)
def test_kill_during_save_keeps_previous_checkpoint(tmp_path, mode):
    ckpt = tmp_path / "model.npz"
    cmd = horovodrun_cmd(1, [str(WORKERS / "keras_checkpoints.py"), "--out", str(tmp_path), "--mode", mode,
                             "--task", "slow_save", "--ckpt", str(ckpt)])
    kill_mid_save(cmd, tmp_path, "model.npz")                       # the writer dies mid-write
    with np.load(ckpt) as data:
        header = json.loads(bytes(data["header"]).decode())
        assert header["extra"] == {"epoch": 7}
        assert np.all(data["model_0"] == 1.5)
        content = {"model": [data[f"model_{i}"] for i in range(header["n_model"])],
                   "optimizer": [data[f"optimizer_{i}"] for i in range(header["n_optimizer"])]}
    stored = header.pop(DIGEST_KEY)
    assert check_digest({"header": header, **content, DIGEST_KEY: stored}) is None, "the checkpoint is whole"


@pytest.mark.parametrize("mode", KERAS3)
def test_fit_without_hvdkit_callbacks_fails_at_the_first_step_naming_the_fix(launch, mode):
    r0, r1 = launch(2, "keras_misuse.py", "--mode", mode, "--case", "no_callbacks", timeout=180)
    assert r0["size"] == r1["size"] == 2
    for r in (r0, r1):
        assert r["steps"] == 0, "the first step must raise, on every rank"
        assert r["error"] and "RanksDivergedError: rank 1's weights differ from rank 0's at the first step" in \
            r["error"] and "pass callbacks=hk.callbacks(...) to fit" in r["error"], r["error"]


def test_custom_loop_without_broadcast_state_fails_at_the_first_step(launch):
    r0, r1 = launch(2, "keras_misuse.py", "--mode", "tensorflow", "--case", "custom_loop", timeout=180)
    assert r0["size"] == r1["size"] == 2
    for r in (r0, r1):
        assert r["steps"] == 0
        assert r["error"] and "hk.broadcast_state(model, optimizer)" in r["error"], r["error"]


def test_a_string_optimizer_fails_at_train_begin_naming_the_distributed_one(launch):
    r0, r1 = launch(2, "keras_misuse.py", "--mode", "tensorflow", "--case", "string_optimizer", timeout=180)
    assert r0["size"] == r1["size"] == 2
    for r in (r0, r1):
        assert r["steps"] == 0
        assert r["error"] and "is not distributed" in r["error"] and \
            "optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(hk.scale_lr(0.001)))" in r["error"], r["error"]


@pytest.mark.parametrize("mode,case,warned", [(mode, "unsharded_shuffled", True) for mode in KERAS3]
                         + [("tensorflow", "sharded_shuffled", False)])
def test_unsharded_shuffled_data_is_warned_about_with_the_fix(launch, mode, case, warned):
    r0, r1 = launch(2, "keras_misuse.py", "--mode", mode, "--case", case, timeout=180)
    assert r0["size"] == r1["size"] == 2
    assert r0["error"] is None and r1["error"] is None and r0["steps"] == r1["steps"] > 0
    hints = [w for w in r0["warnings"] if w.startswith("hvdkit: ") and "hk.shard_arrays" in w]
    assert len(hints) == (1 if warned else 0), r0["warnings"]
    assert r1["warnings"] == [], "rank 0 alone says it"


@pytest.mark.parametrize("mode", ["tensorflow", "torch"])
def test_a_keras_file_saved_under_hvdkit_loads_on_every_rank_and_in_plain_keras(launch, tmp_path, mode):
    """Issue 34, case 7: the README's ModelCheckpoint("best.keras") wrote a file that plain Keras could not load
    ("Could not locate class 'DistributedAdam'"), and rank 1 read it after fit while rank 0 was still writing."""
    path = tmp_path / "best.keras"
    r0, r1 = launch(2, "keras_saved_model.py", "--mode", mode, "--path", str(path), timeout=240)
    assert r0["size"] == r1["size"] == 2
    assert r0["callbacks"].count("SlowCheckpoint") == 1 and "SlowCheckpoint" not in r1["callbacks"], \
        "a ModelCheckpoint subclass runs on rank 0 only"
    for r in (r0, r1):
        assert r["error"] is None and r["exists_after_fit"] and r["same_weights"], r
    code = ("import keras, sys; m = keras.models.load_model(sys.argv[1]); "
            "print(type(m.optimizer).__name__, type(m.optimizer).__module__, 'hvdkit' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          env=job_env(KERAS_BACKEND=mode))
    assert proc.returncode == 0, proc.stderr[-2000:]
    name, module, hvdkit_imported = proc.stdout.split()[-3:]     # Keras's own Adam (per backend), no hvdkit
    assert name == "Adam" and module.startswith("keras.src.") and hvdkit_imported == "False", proc.stdout
