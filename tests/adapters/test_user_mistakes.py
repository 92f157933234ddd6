"""A user's mistakes in the adapters' arguments stop with one UserError naming the fix, before any job state is
touched (a user trial of issue 38's error family found these raising torch's ValueError, a ZeroDivisionError, a
RuntimeError or TensorFlow's abort, or passing silently)."""

import pytest

pytestmark = pytest.mark.adapters


def test_torch_arguments():
    import torch

    import hvdkit.torch as hk

    data = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    for bad in (0, -1, 2.5):
        with pytest.raises(hk.UserError, match=r"batch_size must be an integer of at least 1, got"):
            hk.distributed_loader(data, bad)
    import numpy as np

    from hvdkit.runtime.sharding import check_batch_size

    check_batch_size(np.int64(32))                    # a computed batch size is still one
    model = torch.nn.Linear(2, 1)
    with pytest.raises(hk.UserError, match=r"on_resize='nope': give one of rescale, error"):
        hk.load_checkpoint("/nonexistent/ckpt.pt", model, on_resize="nope")      # no optimizer: still checked


def test_keras_arguments():
    import hvdkit.keras as hk

    with pytest.raises(hk.UserError, match=r"batch_size must be an integer of at least 1, got 0"):
        hk.steps_per_epoch(100, 0)                                               # was ZeroDivisionError
    with pytest.raises(hk.UserError, match=r"on_resize='nope'"):
        hk.load_checkpoint("/nonexistent/ckpt.npz", object(), on_resize="nope")


@pytest.mark.parametrize("threads", [0, -2, 1.5, True])
def test_init_refuses_a_thread_count_below_one_before_starting_anything(threads):
    # torch raised "set_num_threads expects a positive integer", TensorFlow took 0 silently and aborted the
    # process (SIGABRT) on -2. The check runs first: no backend call, nothing set in the environment.
    from hvdkit.common.errors import UserError
    from hvdkit.runtime.context import init

    with pytest.raises(UserError, match=rf"threads={threads!r}: give the intra-op thread count, 1 or more"):
        init(object(), "torch", adapter="hvdkit.torch", threads=threads)
