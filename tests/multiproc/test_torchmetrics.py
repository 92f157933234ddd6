"""torchmetrics on N ranks with hk.torchmetrics_sync() equal one process over the whole data (issue 54)."""

import pytest

pytestmark = pytest.mark.multiproc


def close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(b), 1e-12)


@pytest.mark.parametrize("np,controller", [(2, "gloo"), (3, "gloo"), (2, "mpi")])
def test_torchmetrics_with_hvdkits_sync_equal_one_process_on_the_whole_set(launch, np, controller):
    """torchmetrics syncs only over torch.distributed, which a Horovod job never initialises: each rank's metric
    covered its own shard. hk.torchmetrics_sync() gathers the state through Horovod."""
    results = launch(np, "torch_torchmetrics.py", controller=controller)
    assert [r["size"] for r in results] == [np] * np
    assert sum(r["rows"] for r in results) == 101
    reference = results[0]["one_process"]
    for r in results:
        for name, value in r["synced"].items():
            assert close(value, reference[name]), (name, r["synced"], reference)
    assert any(not close(r["own_shard"]["auroc"], reference["auroc"]) for r in results), "without the sync"
