"""hvdkit.torch.sharded's slices in one process (no collective is needed to cut them or load a state into them)."""

import pytest
import torch

from hvdkit.torch.sharded import Slices, slice_range

pytestmark = pytest.mark.adapters


def test_the_slices_of_a_parameter_cover_it_once_in_rank_order():
    for numel, size in ((10, 3), (1, 3), (0, 2), (7, 7), (1024, 4)):
        ranges = [slice_range(numel, rank, size) for rank in range(size)]
        assert [e for s, e in ranges] == sorted(e for s, e in ranges)
        assert sum(e - s for s, e in ranges) == numel and ranges[0][0] == 0 and ranges[-1][1] == numel


def test_loading_a_state_into_the_slices_leaves_the_callers_state_alone():
    """An elastic commit is loaded into the slices after a reset, and loaded again after a second reset: Adam's
    step count went into the inner optimizer as the commit's own tensor, so each step after the first reset
    advanced the commit's count (the second reset then restored moments from step 3 with a count of 5)."""
    p = torch.nn.Parameter(torch.ones(4))
    outer = torch.optim.Adam([p], lr=0.1)
    shards = Slices(outer, torch.optim.Adam, rank=1, size=2)
    commit = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(4.0), "exp_avg_sq": torch.ones(4)}},
              "param_groups": torch.optim.Optimizer.state_dict(outer)["param_groups"]}
    shards.load_state_dict(commit)
    inner = shards.inner.state[shards.views[0]]
    assert inner["exp_avg"].tolist() == [2.0, 3.0] and float(inner["step"]) == 3.0     # rank 1's half
    for _ in range(2):
        shards.views[0].grad = torch.ones(2)
        shards.inner.step()
    assert float(inner["step"]) == 5.0
    assert float(commit["state"][0]["step"]) == 3.0 and commit["state"][0]["exp_avg"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
                                  "ASGD", "Rprop"])
def test_every_optimizer_sharding_accepts_steps_its_slices(name):
    """torch's AdamW keeps decoupled_weight_decay in its defaults but does not take it: cutting the slices of
    an AdamW failed with a TypeError though AdamW is on the list (found by trying it as a user)."""
    p = torch.nn.Parameter(torch.ones(5))
    cls = getattr(torch.optim, name)
    shards = Slices(cls([p], lr=0.1), cls, rank=0, size=2)
    shards.views[0].grad = torch.ones(3)
    shards.inner.step()
    assert p.detach()[:3].ne(1).all() and p.detach()[3:].eq(1).all()


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
                                  "ASGD", "Rprop"])
def test_an_optimizer_stepped_in_parts_ends_where_one_step_does(name):
    """The sharded step updates its slices in parts (each part's allgather runs while the next is updated), one
    inner step() a part with only that part's gradients: torch's optimizers skip a parameter without one, so
    three steps of momentum and state end bit for bit where whole steps do."""
    from hvdkit.torch.sharded import _parts

    cls = getattr(torch.optim, name)
    kwargs = {"lr": 0.1, **({"momentum": 0.9, "weight_decay": 0.01} if name == "SGD" else {})}
    whole = [torch.nn.Parameter(torch.linspace(-1, 1, n)) for n in (5, 300, 7, 120, 1)]
    parted = [torch.nn.Parameter(p.detach().clone()) for p in whole]
    one, parts = cls(whole, **kwargs), cls(parted, **kwargs)
    cut = _parts([(p,) for p in parted], 3)
    assert [len(run) for run in cut] == [2, 3] and [id(q) for run in cut for (q,) in run] == list(map(id, parted))
    index = {id(p): i for i, p in enumerate(parted)}
    for step in range(3):
        grads = [torch.sin(torch.arange(p.numel()) * (step + 1.0)) for p in whole]
        for p, g in zip(whole, grads):
            p.grad = g.clone()
        one.step()
        for run in cut:
            for (p,) in run:
                p.grad = grads[index[id(p)]].clone()
            parts.step()
            for (p,) in run:
                p.grad = None
    for a, b in zip(whole, parted):
        assert torch.equal(a.detach(), b.detach()), name


def test_every_rank_cuts_the_same_parts_though_its_slices_differ_in_size():
    """By the whole parameters' sizes: rank 2 of 3 holds none of a 4-element parameter where rank 0 holds 2."""
    from hvdkit.torch.sharded import _parts

    params = [torch.zeros(n) for n in (4, 4, 4, 4, 12, 7)]
    cuts = []
    for rank in range(3):
        items = [(p, p[slice(*slice_range(p.numel(), rank, 3))]) for p in params]
        cuts.append([[id(p) for p, _ in run] for run in _parts(items, 4)])
    assert cuts[0] == cuts[1] == cuts[2] and sum(map(len, cuts[0])) == len(params)



class OneRank:
    """The backend at world size 1, where a slice is its whole parameter: what Slices.step's collective returns."""

    def start_grouped_allgather(self, tensors, name):
        gathered = [t.clone() for t in tensors]
        return lambda: gathered


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_the_sharded_step_in_parts_ends_where_the_optimizers_own_step_does(monkeypatch, name):
    """Slices.step itself (its parts, the gradients it hands the inner optimizer, the copy back), at world size 1:
    three steps over parameters that include a frozen one and one without a gradient end bit for bit where the
    optimizer's own steps do. A part whose update raised leaves no gradient behind for the next step."""
    monkeypatch.setattr(Slices, "backend", property(lambda self: OneRank()))
    cls = getattr(torch.optim, name)
    kwargs = {"lr": 0.1, **({"momentum": 0.9} if name == "SGD" else {})}
    sizes = (5, 300, 7, 120, 1, 40)

    def model():
        params = [torch.nn.Parameter(torch.linspace(-1, 1, n)) for n in sizes]
        params[2].requires_grad_(False)                   # frozen: no gradient, never stepped
        return params

    plain, sharded = model(), model()
    reference, outer = cls(plain, **kwargs), cls(sharded, **kwargs)
    slices = Slices(outer, cls, rank=0, size=1)
    for step in range(3):
        for params in (plain, sharded):
            for i, p in enumerate(params):
                # parameter 4 has no gradient this step (unused in the forward), the frozen one never
                p.grad = None if i == 2 or (i == 4 and step == 1) else torch.sin(torch.arange(p.numel()) + step)
        reference.step()
        slices.step()
    for a, b in zip(plain, sharded):
        assert torch.equal(a.detach(), b.detach()), name

    calls = []
    real_step = slices.inner.step

    def fails_once():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory (planted)")
        return real_step()

    monkeypatch.setattr(slices.inner, "step", fails_once)
    with pytest.raises(RuntimeError, match="planted"):
        slices.step()
    assert all(view.grad is None for view in slices.views)
