"""Keras 3 and tf-keras with today's TensorFlow: synchronized BatchNorm (hvdkit's and Horovod's)
and the parts of Horovod's own TF/Keras API that hvdkit's patch repairs. Real horovodrun, 2 ranks.

Each Horovod case failed on the unpatched 0.28.1 (with the error named in its
worker's docstring); each BatchNorm case has a twin with plain BatchNorm that
must come out far from the single-process reference.
"""

import pytest

pytestmark = pytest.mark.multiproc
# float64 throughout, except that Keras 3.15's BatchNormalization on the torch backend
# computes in float32 (backend.result_type(torch.float64, "float32") is float32; measured:
# a plain layer's moments on float64 input are 1.6e-7 off numpy's), so there the
# reference itself is only float32-exact.
TOL = {"tensorflow": 1e-9, "tf_keras": 1e-9, "torch": 2e-6}


@pytest.mark.parametrize("mode,layer", [("tensorflow", "hvdkit"), ("torch", "hvdkit"), ("tf_keras", "hvdkit"),
                                        ("tensorflow", "horovod")])
def test_sync_batch_norm_two_ranks_equal_one_process_on_the_global_batch(launch, mode, layer):
    r0, r1 = launch(2, "keras_sync_bn.py", "--mode", mode, "--layer", layer)
    assert r0["size"] == r1["size"] == 2 and r0["backend"] == mode
    assert r0["layer"] == "SyncBatchNormalization"
    tol = TOL[mode]
    for r in (r0, r1):
        assert r["output_diff"] < tol, "outputs differ from 1 process on the 2B batch"
        assert r["stats_diff"] < tol, "moving mean/variance differ"
        assert r["grad_diff"] < tol * max(1.0, r["grad_scale"]), "averaged gradients differ"
        assert r["fit_weights_diff"] < tol and r["fit_stats_diff"] < tol, "model.fit diverged"


@pytest.mark.parametrize("mode", ["tensorflow", "torch"])
def test_plain_batch_norm_is_far_from_the_reference(launch, mode):
    """The comparison above can fail: per-rank statistics give visibly different numbers."""
    r0, r1 = launch(2, "keras_sync_bn.py", "--mode", mode, "--layer", "plain")
    for r in (r0, r1):
        assert r["output_diff"] > 1e-3 and r["stats_diff"] > 1e-3 and r["grad_diff"] > 1e-4


def test_partial_distributed_gradient_tape_takes_keras3_variables(launch):
    r0, r1 = launch(2, "horovod_tf_api.py", "--mode", "tensorflow", "--task", "local_source")
    assert r0["size"] == 2 and r0["keras"].startswith("3.")
    assert r0["ranks_differ"] > 1e-3, "ranks must have different local gradients for the test to mean anything"
    for r in (r0, r1):
        assert r["shared_diff"] < 1e-6, "shared layer's gradient must be the mean over ranks"
        assert r["local_diff"] < 1e-6, "local layer's gradient must stay local (divided by size)"


def test_horovod_lr_warmup_callback_runs_on_tf_keras(launch):
    r0, r1 = launch(2, "horovod_tf_api.py", "--mode", "tf_keras", "--task", "warmup_callback")
    assert r0["size"] == 2 and r0["keras"].startswith("2.")
    base, steps, size = r0["base_lr"], r0["steps"], r0["size"]
    # Horovod's warmup: lr/size * (e * (size - 1) / warmup_epochs + 1), e = epoch + (batch + 1) / steps,
    # so the last warmup batch and everything after it run at the full rate.
    expected = [base / size * (((b + 1) / steps) * (size - 1) + 1) for b in range(steps)] + [base] * steps
    for r in (r0, r1):
        assert r["lrs"] == pytest.approx(expected, rel=1e-5)
        assert r["lrs"][0] < base / size * 1.5, "the first batch must run near lr/size"
