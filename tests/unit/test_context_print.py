"""ctx.print: print on rank 0 only (issue 54: a user patched builtins.print to get it)."""

import pytest

from hvdkit.runtime.topology import Topology

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("rank, shown", [(0, "epoch 1: loss 0.5\n"), (1, "")])
def test_print_is_rank_0s_alone(capsys, rank, shown):
    ctx = Topology(rank=rank, size=2, local_rank=rank, local_size=2, cross_rank=0, cross_size=1)
    ctx.print("epoch", 1, end=": ")
    ctx.print("loss", 0.5)
    assert capsys.readouterr().out == shown
