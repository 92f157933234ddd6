"""GPU pinning for both adapters on a CPU machine: the device queries are faked in the worker, Horovod is real.

Each rank must pin the GPU of its local rank (torch: set_device(local_rank) and
cuda:<local_rank>; Keras on TF: memory growth and visibility of that GPU only),
and a host with more processes than visible GPUs must stop every extra rank
with the slots message instead of sharing a GPU (where NCCL would fail later).
"""

import pytest

pytestmark = pytest.mark.multiproc
FRAMEWORKS = ["torch", "keras-torch", "keras-tensorflow"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_local_rank_pins_its_own_gpu(launch, framework):
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--gpus", "2")
    for rank, r in enumerate(results):
        assert "error" not in r, r
        assert r["size"] == 2 and r["rank"] == rank and r["gpu"] == rank
        if framework == "keras-tensorflow":
            assert r["device"] == "/GPU:0"   # the only GPU this rank's TensorFlow sees
            gpu = f"/physical_device:GPU:{rank}"
            assert r["calls"] == [["memory_growth", gpu, True], ["visible", gpu, "GPU"]]
        else:
            assert r["device"] == f"cuda:{rank}"
            assert r["calls"] == [["set_device", rank]]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_more_processes_than_gpus_gets_the_slots_error(launch, framework):
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--gpus", "1", expect_ok=False)
    assert "error" not in results[0] and results[0]["size"] == 2
    error = results[1]["error"]
    assert error.startswith("local rank 1 has no GPU: this host runs 2 processes but 1 GPU(s) are visible"), error
    assert "lower the host's slots to 1" in error
    assert results[1]["calls"] == [], "a rank without a GPU must not pin one"
