"""hk.warmup_scheduler: the ramp from rate/size to the rate, and how it composes with the user's own schedule.

The job's size is faked (4 ranks) so that the ramp is visible without launching one.
"""

from types import SimpleNamespace

import pytest
import torch

import hvdkit.torch.optimizer as optim
from hvdkit.runtime.lr import warmup_lr

pytestmark = pytest.mark.adapters


@pytest.fixture
def four_ranks(monkeypatch):
    monkeypatch.setattr(optim, "current", lambda: SimpleNamespace(size=4))


def sgd(lr=0.4):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def lrs(optimizer, scheduler, steps, each=None):
    seen = []
    for i in range(steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        if each:
            each(i)
    return seen


def test_ramps_per_batch_from_rate_over_size_to_the_rate(four_ranks):
    opt = sgd()
    seen = lrs(opt, optim.warmup_scheduler(opt, warmup_epochs=2, steps_per_epoch=3), 9)
    assert seen == pytest.approx([warmup_lr(i, 6, 0.1, 0.4) for i in range(9)])
    assert seen[0] == pytest.approx(0.1) and seen[6:] == pytest.approx([0.4] * 3)


def test_a_manual_rate_change_survives_the_warmup(four_ranks):
    opt = sgd()
    sched = optim.warmup_scheduler(opt, warmup_steps=4)

    def quarter_at_step_1(i):
        if i == 1:
            for group in opt.param_groups:
                group["lr"] /= 4

    seen = lrs(opt, sched, 7, quarter_at_step_1)
    # The ramp goes on from the lowered rate and ends at a quarter of the target (a LambdaLR reset it to 0.4).
    assert seen[-1] == pytest.approx(0.1)
    assert seen[2] == pytest.approx(warmup_lr(2, 4, 0.1, 0.4) / 4)


def test_chains_with_the_users_schedule(four_ranks):
    opt = sgd()
    warmup = optim.warmup_scheduler(opt, warmup_steps=4)
    decay = torch.optim.lr_scheduler.StepLR(opt, step_size=6, gamma=0.5)
    seen = lrs(opt, torch.optim.lr_scheduler.ChainedScheduler([warmup, decay]), 8)
    assert seen == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4, 0.2, 0.2])


def test_no_warmup_leaves_the_rate(four_ranks):
    opt = sgd()
    assert lrs(opt, optim.warmup_scheduler(opt, warmup_steps=0), 3) == pytest.approx([0.4] * 3)
