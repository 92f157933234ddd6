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


def test_a_schedulers_state_dict_passed_as_scheduler_is_one_line_naming_the_fix():
    # Issue 54, case 5: a natural reading of the name, which failed on rank 0 alone with "AttributeError: 'dict'
    # object has no attribute 'state_dict'" (the other ranks then waited). In a subprocess: hk.init() here would set
    # Horovod's defaults in pytest's environment, which later jobs inherit.
    import subprocess
    import sys

    code = ("import torch, hvdkit.torch as hk\n"
            "hk.init(); model = torch.nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "sched = torch.optim.lr_scheduler.StepLR(opt, 1)\n"
            "for call in (hk.save_checkpoint, hk.load_checkpoint):\n"
            "    try:\n"
            "        call('/nonexistent/ckpt.pt', model, opt, scheduler=sched.state_dict())\n"
            "    except hk.UserError as exc:\n"
            "        print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [line.split("(")[0] for line in lines] == ["hk.save_checkpoint", "hk.load_checkpoint"], proc.stdout
    for line in lines:
        assert "takes the LR scheduler itself, not dict" in line and "not sched.state_dict()" in line, line
