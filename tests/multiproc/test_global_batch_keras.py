"""A fixed global batch for Keras (hk.global_batches) under real horovodrun: the same model at any world size.

The reference trains 15 steps on 4 ranks. The other run starts on 2 ranks, is preempted (SIGTERM to a
rank, exit 75), resumes on 3, is preempted again, and finishes in one process. Both end within 1e-10 in
float64: the weights and Adam's state (sharded over the ranks), with BatchNorm and Dropout in the model.
BatchNorm's running statistics stay per rank (docs/GLOBAL_BATCH.md) and are left out, as is Dropout's
seed generator state, which is set afresh before each micro-batch.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hvdkit.runtime.preemption import REQUEUE_EXIT_CODE
from tests.conftest import (
    ROOT,
    SEVERAL_JOBS,
    WORKERS,
    horovodrun_cmd,
    job_env,
    read_rank_results,
    run_horovodrun,
    run_job,
    signal_job,
)
from tests.multiproc.test_preemption import example_result

pytestmark = [pytest.mark.multiproc, SEVERAL_JOBS]
LANE = "others"          # as tests/multiproc/test_global_batch.py
WORKER = str(WORKERS / "keras_global_batch.py")
STEPS = 15
PER_RANK = ("moving_mean", "moving_variance", "seed_generator_state")


def job(np: int, out: Path, ckpt: Path, *extra: str, mode: str, controller: str, expect: int = 0) -> str:
    out.mkdir()
    argv = [WORKER, "--out", str(out), "--ckpt", str(ckpt), "--steps", str(STEPS), "--mode", mode, *extra]
    # A whole run: a scenario of the 4-rank Keras pool.
    if np > 1 and controller == "gloo" and expect == 0 and "--resume" not in extra:
        proc = run_horovodrun(np, argv, controller, timeout=240, pool=f"keras-{mode}")
    else:                                                   # a preemption, a resume: processes of its own
        proc = run_job(horovodrun_cmd(np, argv, controller) if np > 1 else [sys.executable, *argv], timeout=240)
    assert proc.returncode == expect, f"{np} ranks exited {proc.returncode}, not {expect}:\n{proc.stdout[-3000:]}"
    assert "hvdkit:" not in proc.stdout, proc.stdout[-3000:]      # no warning from a correct script
    return proc.stdout


def checkpoint_arrays(path: Path) -> dict[str, np.ndarray]:
    """A Keras checkpoint's arrays by name: the model's by structural name, the optimizer's as optimizer/<i>."""
    with np.load(path) as f:
        head = json.loads(bytes(f["header"]))
        arrays = {name: f[f"model_{i}"] for i, name in enumerate(head["model_names"])}
        arrays.update({f"optimizer/{i}": f[f"optimizer_{i}"] for i in range(head["n_optimizer"])})
    return arrays


@pytest.mark.parametrize("mode,controller", [("tensorflow", "gloo"), ("torch", "mpi")])
def test_keras_preempted_on_2_resumed_on_3_finished_on_1_ends_where_4_ranks_end(tmp_path, mode, controller):
    job(4, tmp_path / "reference", tmp_path / "unused", "--shard", mode=mode, controller=controller)
    assert [r["iterations"] for r in read_rank_results(tmp_path / "reference", 4, "")] == [STEPS] * 4

    ckpt = tmp_path / "ckpt"
    job(2, tmp_path / "on2", ckpt, "--shard", "--preempt-at", "4", "--victim", "1", mode=mode,
        controller=controller, expect=REQUEUE_EXIT_CODE)
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-00000060.npz"]      # at step 5's end: 60 samples
    output = job(3, tmp_path / "on3", ckpt, "--shard", "--resume", "--preempt-at", "9", "--victim", "2", mode=mode,
                 controller=controller, expect=REQUEUE_EXIT_CODE)
    assert "hvdkit resume: a checkpoint of 2 ranks on 3: the global batch 12 in 6 micro-batch(es) of 2, 2 a rank " \
           "on 3, the same steps, so the learning rate is kept" in output, output[-3000:]
    job(1, tmp_path / "on1", ckpt, "--shard", "--resume", mode=mode, controller=controller)
    resumed = read_rank_results(tmp_path / "on1", 1, "")[0]
    assert (resumed["size"], resumed["resumed_at"], resumed["iterations"]) == (1, 10, STEPS)

    ref = checkpoint_arrays(tmp_path / "reference" / "final.npz")
    end = checkpoint_arrays(tmp_path / "on1" / "final.npz")
    assert ref.keys() == end.keys() and sum(k.startswith("optimizer/") for k in ref) == 12    # Adam: 2 x 5 + 2
    compared = [k for k in ref if not k.endswith(PER_RANK)]
    assert len(compared) == len(ref) - 3
    for name in compared:
        assert np.max(np.abs(ref[name] - end[name]), initial=0) < 1e-10, name
    # Not by chance: BatchNorm's running statistics, which do follow the ranks' shares, end apart.
    assert np.max(np.abs(ref["model/batch_normalization/moving_mean"] -
                         end["model/batch_normalization/moving_mean"])) > 1e-6


@pytest.mark.parametrize("xla", [False, True], ids=["no-xla", "xla"])
def test_keras_each_step_is_the_mean_over_its_global_batch_however_the_micro_batches_fall(tmp_path, xla):
    """Micro-batches of 5, 5 and 2 on 4 ranks, the last of which has none (a slot of weight 0), clipped by norm
    in the optimizer, sharded: the same weights as plain Keras's train_on_batch over batches of 12 in the same
    order. On TensorFlow: Keras on torch rounds a float64 loss to float32 (its divide_no_nan's result_type), so
    two ways of summing the same gradient differ there by 1e-8. With XLA too (jit_compile=True, as Keras turns
    it on wherever it sees a GPU): the step's sum runs in the update, outside the compiled half."""
    job(1, tmp_path / "plain", tmp_path / "unused", "--plain", "--mlp", "--clipnorm", "0.05", mode="tensorflow",
        controller="gloo")
    job(4, tmp_path / "mode", tmp_path / "unused2", "--mlp", "--micro-batch", "5", "--clipnorm", "0.05", "--shard",
        *(["--jit"] if xla else []), mode="tensorflow", controller="gloo")
    plain = [np.asarray(w) for w in read_rank_results(tmp_path / "plain", 1, "")[0]["weights"]]
    mode = checkpoint_arrays(tmp_path / "mode" / "final.npz")
    names = ["model/dense/kernel", "model/dense/bias", "model/dense_1/kernel", "model/dense_1/bias"]
    for name, weights in zip(names, plain):
        assert np.max(np.abs(weights - mode[name])) < 1e-10, name


def test_the_keras_example_in_float32_interrupted_twice_ends_as_close_as_another_reduction_order(tmp_path):
    """examples/keras_mnist.py --global-batch 64 --batch-size 16: 2 epochs of 22 steps, as the torch example's
    test (tests/multiproc/test_global_batch.py) measures it: against the uninterrupted 4-rank run with tensor
    fusion off, and within 0.5 points of its accuracy."""
    example = [str(ROOT / "examples" / "keras_mnist.py"), "--epochs", "2", "--global-batch", "64",
               "--batch-size", "16", "--json"]

    def run(ranks: int, name: str, *extra: str, env: dict | None = None, pool: bool = False) -> dict:
        argv = [*example, "--checkpoint", str(tmp_path / f"{name}.npz"), *extra]
        proc = (run_horovodrun(ranks, argv, "gloo", timeout=300, pool="keras-tensorflow") if pool else
                run_job(horovodrun_cmd(ranks, argv, "gloo"), timeout=300, env=env))
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert "hvdkit:" not in proc.stdout, proc.stdout[-3000:]
        return example_result(proc.stdout)

    def newest_rank() -> int:
        pids = subprocess.run(["pgrep", "-f", f"^{sys.executable} {example[0]} --epochs 2"], capture_output=True,
                              text=True).stdout.split()
        return max(int(p) for p in pids)

    reference = run(4, "reference", pool=True)
    unfused_result = run(4, "unfused", env=job_env(HOROVOD_FUSION_THRESHOLD="0"))
    ckpts = tmp_path / "interrupted"
    # An epoch takes 1-3 s: on 2 ranks SIGTERM once the second epoch has begun; on 3, resumed, once fit
    # has begun the rest of that epoch.
    for ranks, resume, line in ((2, [], "Epoch 2/2"), (3, ["--resume"], "Epoch ")):
        output, _, code = signal_job(horovodrun_cmd(ranks, [*example, "--checkpoint-dir", str(ckpts), *resume], "gloo"),
                                     lambda out, line=line: line in out, newest_rank)
        assert code == REQUEUE_EXIT_CODE, output[-3000:]
    finished = run(1, "finished", "--checkpoint-dir", str(ckpts), "--resume")
    assert finished["size"] == 1 and len(list(ckpts.glob("ckpt-*.npz"))) == 2

    ref, unfused, resumed = (checkpoint_arrays(tmp_path / f"{n}.npz") for n in ("reference", "unfused", "finished"))
    weights = [k for k in ref if k.startswith("model/") and not k.endswith(PER_RANK)]
    order = max(float(np.max(np.abs(ref[k] - unfused[k]))) for k in weights)
    apart = max(float(np.max(np.abs(ref[k] - resumed[k]))) for k in weights)
    accuracy = [r["test_accuracy"] for r in (reference, unfused_result, finished)]
    print(f"after 44 steps in float32: fusion off {order:.3g} from the reference, the interrupted run {apart:.3g}; "
          f"accuracy {accuracy[0]:.4f}, fusion off {accuracy[1]:.4f}, interrupted {accuracy[2]:.4f}")
    assert order > 0, "fusion off ended bit for bit where fusion on did: was HOROVOD_FUSION_THRESHOLD=0 read?"
    assert apart <= max(10 * order, 1e-3), (apart, order)
    assert abs(accuracy[2] - accuracy[0]) <= max(0.005, abs(accuracy[1] - accuracy[0])), accuracy
