"""Sharded optimizer state (ZeRO stage 1): each rank keeps 1/N of the optimizer state and updates 1/N of the model.

Example::

    optimizer = torch.optim.AdamW(model.parameters(), lr=hk.scale_lr(1e-3))
    optimizer = hk.DistributedOptimizer(optimizer, model, shard_optimizer_state=True)
    hk.broadcast_state(model, optimizer)

Gradients are averaged exactly as without sharding: all of them, by the time
``backward()`` returns, so clipping, AMP's unscale and the non-finite check see
the average. ``step()`` then updates, on each rank, one slice of every
parameter (flattened, rank r holds elements ``[r*c, (r+1)*c)`` with
``c = ceil(numel / size)``) with the optimizer's own update rule, so the state
(Adam's two moments, SGD's momentum) exists only for that slice; the updated
slices are then all-gathered: in four parts, each part's allgather running
while the next part is updated. This is the design
of torch's ``ZeroRedundancyOptimizer`` beside DDP (average, step a part, share
the parameters), with slices instead of whole parameters, so that every rank
holds the same 1/N whatever the parameters' sizes. Slicing gives the same
numbers only for an update that works element by element, so
:data:`ELEMENTWISE` lists the optimizers it accepts.

``state_dict()`` gathers the slices into the state an unsharded optimizer
holds (the same format, consolidated), and ``load_state_dict()`` takes such a
state and keeps this rank's slices: a checkpoint moves between sharded and
unsharded jobs and between world sizes. Both are collective: every rank calls
them (``hk.save_checkpoint`` and ``hk.broadcast_state`` do).
"""

from __future__ import annotations

import inspect

import torch

from hvdkit.common.errors import UserError
from hvdkit.runtime import context
from hvdkit.runtime.optimizer_record import attach, record_of
from hvdkit.runtime.sharding import check_same_loads, slice_range
from hvdkit.torch.context import ADAPTER

# torch's optimizers whose update of an element reads only that element's gradient and state.
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD", "Rprop")


def check_supported(optimizer_class: type) -> None:
    """Refuse, on any number of ranks, an optimizer whose update of an element reads other elements."""
    if optimizer_class.__name__ not in ELEMENTWISE or optimizer_class.__module__.split(".")[0] != "torch":
        raise UserError(f"shard_optimizer_state needs an optimizer that updates each element on its own "
                        f"(torch's {', '.join(ELEMENTWISE)}), got {optimizer_class.__name__}: shard one of those, "
                        "or leave shard_optimizer_state off")


# State entries that are one number per parameter, not one per element (Adam's step count, ASGD's eta, NAdam's
# mu_product): kept whole on every rank. Every other tensor entry is laid out like its parameter.
SCALAR_KEYS = frozenset({"step", "eta", "mu", "mu_product"})


def _is_full(key: str, value, param: torch.Tensor) -> bool:
    """A state entry laid out like its parameter (a moment), to be cut into slices."""
    return torch.is_tensor(value) and key not in SCALAR_KEYS and value.numel() == param.numel()


# Parts of the sharded step (:meth:`Slices.step`). On the 2-core machine (ResNet-50, 2 ranks, MPI) the whole step
# went from 1.12 times the unsharded one in one part to 1.03 times in four (docs/BENCHMARKS.md).
PARTS = 4


def _parts(items: list, parts: int) -> list[list]:
    """``items`` (parameter, ...) in order, cut into at most ``parts`` runs of about equal parameter size.

    By the whole parameters' sizes, which every rank shares (a rank's slices differ in size at the end), so
    every rank cuts the same parts and joins the same allgathers. A run ends where the running size passes
    a multiple of ``total / parts`` (a large parameter may pass several: the next run ends at the one after)."""
    total = max(1, sum(item[0].numel() for item in items))
    out, run, size, passed = [], [], 0, 0
    for item in items:
        run.append(item)
        size += item[0].numel()
        reached = size * parts // total
        if passed < reached < parts:
            out.append(run)
            run, passed = [], reached
    if run:
        out.append(run)
    return out


class Slices:
    """This rank's slice of every parameter, as views into the parameters, and the optimizer that steps them."""

    def __init__(self, optimizer: torch.optim.Optimizer, original: type, rank: int, size: int):
        check_supported(original)
        self.optimizer, self.original, self.rank, self.size = optimizer, original, rank, size
        self.user_loads = 0         # optimizer.load_state_dict calls by the script: the same count on every rank
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.ranges, self.views = [], []
        for p in self.params:
            if not p.is_contiguous():
                raise UserError(f"a parameter of shape {tuple(p.shape)} is not contiguous, which sharding needs: "
                                "make it contiguous (p.data = p.data.contiguous()) before creating the optimizer")
            start, end = slice_range(p.numel(), rank, size)
            self.ranges.append((start, end))
            self.views.append(p.detach().view(-1)[start:end])     # shares the parameter's storage
        index = {id(p): i for i, p in enumerate(self.params)}
        groups = [{**self._options(g), "params": [self.views[index[id(p)]] for p in g["params"]]}
                  for g in optimizer.param_groups]
        # The defaults the constructor takes: torch's AdamW keeps one it does not (decoupled_weight_decay).
        accepted = inspect.signature(original.__init__).parameters
        self.inner = original(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})

    @staticmethod
    def _options(group: dict) -> dict:
        return {k: v for k, v in group.items() if k != "params"}

    def step(self) -> None:
        """Update this rank's slices from the averaged gradients, then gather every rank's into the parameters.

        In :data:`PARTS` parts, in parameter order: each part's allgather starts as soon as its slices are
        updated and runs (on Horovod's thread) while the next part is updated."""
        for inner, group in zip(self.inner.param_groups, self.optimizer.param_groups):
            inner.update(self._options(group))            # a scheduler or a hand edit changed the rate
        shared = []
        for p, view, (start, end) in zip(self.params, self.views, self.ranges):
            if p.numel() and p.untyped_storage().data_ptr() != view.untyped_storage().data_ptr():
                raise UserError(f"a parameter of shape {tuple(p.shape)} was given new memory after "
                                "DistributedOptimizer(shard_optimizer_state=True) (model.half(), .to(dtype), "
                                "load_state_dict(assign=True)): do that before creating the optimizer")
            if p.grad is not None and p.grad.is_sparse:
                raise UserError("shard_optimizer_state needs dense gradients, but a parameter got a sparse one "
                                "(nn.Embedding(sparse=True)): use a dense embedding, or leave sharding off")
            # The same on every rank (hvdkit's rule for freezing), so every rank joins the same allgather even
            # where a gradient is missing. A frozen parameter still holding a gradient (zeros, after
            # zero_grad(set_to_none=False)) is stepped too, as in one process (momentum, weight decay).
            if p.requires_grad or p.grad is not None:
                shared.append((p, view, start, end))
        for view in self.views:          # a part whose update raised in an earlier step left its gradients
            view.grad = None
        gathering = []
        try:
            for n, part in enumerate(_parts(shared, PARTS)):
                # torch's optimizers step only the parameters that hold a gradient: this part's.
                for p, view, start, end in part:
                    view.grad = None if p.grad is None else p.grad.reshape(-1)[start:end]
                try:
                    self.inner.step()
                finally:
                    for _, view, _, _ in part:
                        view.grad = None
                gathering.append((part, self.backend.start_grouped_allgather([view for _, view, _, _ in part],
                                                                             name=f"hvdkit.shards.{n}")))
        except BaseException:
            for _, wait in gathering:        # the parts already started, on every rank: none is left behind
                wait()
            raise
        for part, wait in gathering:
            for (p, _, _, _), full in zip(part, wait()):
                p.detach().view(-1).copy_(full)

    @property
    def backend(self):
        return context.backend(ADAPTER)        # looked up when a collective runs: the slices are cut before too

    def state_bytes(self) -> int:
        """The bytes this rank's optimizer state holds (what sharding divides by the world size)."""
        return sum(v.numel() * v.element_size() for s in self.inner.state.values() for v in s.values()
                   if torch.is_tensor(v))

    def state_dict(self, root: int | None = None, caller: str = "hvdkit.shards") -> dict | None:
        """The unsharded optimizer's state_dict, every rank's slices gathered (collective).

        On every rank (an allgather), or with ``root`` on that rank alone, the others returning None: a
        checkpoint's save needs it on the rank that writes, and each other rank then holds only its own
        slices, not one more copy of the whole state (the backend's ``gather_to``). ``caller`` names the first
        collective, so that a deadlock (a save on rank 0 alone) names the call in Horovod's message."""
        packed = torch.optim.Optimizer.state_dict(self.optimizer)      # param_groups; its own state is empty
        entries, slices = [], []
        for i, view in enumerate(self.views):
            for key, value in sorted(self.inner.state.get(view, {}).items()):
                if torch.is_tensor(value) and key not in SCALAR_KEYS and value.numel() == view.numel():
                    entries.append((i, key))
                    slices.append(value.detach().cpu().contiguous())    # gathered in host memory, not the GPU's
        # Every rank must hold the same entries, or the gathering below would wait forever; and every rank must
        # have loaded the same states, or rank 0's new slice would be mixed with the others' old ones.
        check_same_loads(self.backend, caller, (len(entries), self.user_loads),
                         "hk.load_checkpoint and hk.broadcast_state do; optimizer.load_state_dict on rank 0 alone "
                         "does not")
        if root is not None:
            gathered = self.backend.gather_to(root, slices, name="hvdkit.shards.gather")
            if self.rank != root:
                return None
        else:
            gathered = self.backend.grouped_allgather(slices, name="hvdkit.shards.state")
        state = {}
        for i, view in enumerate(self.views):
            inner = self.inner.state.get(view)
            if inner:
                state[i] = {k: v for k, v in inner.items()}
        for (i, key), full in zip(entries, gathered):
            state[i][key] = full.view_as(self.params[i])
        packed["state"] = state
        return packed

    def load_state_dict(self, state_dict: dict) -> None:
        """Take an unsharded optimizer's state_dict (from any world size, sharded or not): keep this rank's slices.

        The slices go through torch's own ``load_state_dict`` of the inner optimizer, which casts them to the
        parameters' dtype and device and keeps a step count where the optimizer wants it (CPU float32, or the
        parameter's device for ``capturable``/``fused``)."""
        groups = state_dict.get("param_groups", [])
        sizes = [len(g["params"]) for g in self.optimizer.param_groups]
        if [len(g["params"]) for g in groups] != sizes:
            raise UserError(f"the optimizer state has param groups of {[len(g['params']) for g in groups]} "
                            f"parameters, this optimizer {sizes}: build the optimizer as the saving script did")
        for group, saved in zip(self.optimizer.param_groups, groups):
            group.update(self._options(saved))
        state = {}
        for key, entry in state_dict.get("state", {}).items():
            i = int(key)
            p, (start, end) = self.params[i], self.ranges[i]
            # Cloned, the step counts too: the inner optimizer updates them in place, and the caller's state
            # (an elastic commit) must stay as it was.
            state[i] = {k: v.reshape(-1)[start:end].clone() if _is_full(k, v, p) else
                        v.clone() if torch.is_tensor(v) else v for k, v in entry.items()}
        inner_groups = self.inner.state_dict()["param_groups"]
        for inner, group in zip(inner_groups, self.optimizer.param_groups):
            inner.update(self._options(group))
        self.inner.load_state_dict({"state": state, "param_groups": inner_groups})


def _step(self, closure=None):
    """Horovod's step (wait for the averages unless skip_synchronize), then the sharded update."""
    if closure is not None:
        raise UserError("step(closure) is not supported with shard_optimizer_state: call loss.backward() and "
                        "optimizer.step() without a closure")
    if self._should_synchronize:
        self.synchronize()
    self._synchronized = False
    slices_of(self).step()


def _state_dict(self):
    return slices_of(self).state_dict()


def gathered_state(optimizer, root: int, caller: str = "hvdkit.shards") -> dict | None:
    """A sharded ``optimizer``'s consolidated state_dict on rank ``root``, None on the others (collective).

    ``caller`` (``"hk.save_checkpoint"``) is in the name of the first collective, which is what a deadlock
    message shows when one rank calls it alone (under ``if ctx.is_main:``)."""
    return slices_of(optimizer).state_dict(root, caller)


def _load_state_dict(self, state_dict):
    slices = slices_of(self)
    slices.load_state_dict(state_dict)
    slices.user_loads += 1


def _add_param_group(self, param_group):
    raise UserError("add_param_group after DistributedOptimizer(shard_optimizer_state=True) is not supported: "
                    "give the optimizer every parameter group before wrapping it")


def shard(optimizer: torch.optim.Optimizer, rank: int, size: int) -> torch.optim.Optimizer:
    """Turn Horovod's wrapped ``optimizer`` into a sharded one, in place (see the module's docstring)."""
    horovod_class = type(optimizer)
    original = horovod_class.__bases__[0]           # Horovod's class derives from the user's optimizer class
    existing = torch.optim.Optimizer.state_dict(optimizer) if optimizer.state else None   # loaded before wrapping
    slices = attach(optimizer, sharded=True, slices=Slices(optimizer, original, rank, size)).slices
    if existing is not None:
        slices.load_state_dict(existing)
        optimizer.state.clear()                     # the full copy: this rank keeps its slices only
    # Horovod made this class for this optimizer alone, and its methods call super(self.__class__, ...), which a
    # subclass would turn into a loop: replace its methods in place.
    for name, method in (("step", _step), ("state_dict", _state_dict), ("load_state_dict", _load_state_dict),
                         ("add_param_group", _add_param_group)):
        setattr(horovod_class, name, method)
    horovod_class._step_supports_amp_scaling = False   # GradScaler unscales the full gradients before step()
    optimizer._patch_step_function()            # torch's step hooks (the non-finite check, user hooks) on it
    return optimizer


def slices_of(optimizer) -> Slices | None:
    """The slices a sharded ``optimizer`` keeps; None for one that is not sharded."""
    record = record_of(optimizer)
    return None if record is None else record.slices


def is_sharded(optimizer) -> bool:
    return slices_of(optimizer) is not None


def layout(optimizer) -> tuple[int, int]:
    """(rank, size) the slices of a sharded ``optimizer`` were cut for."""
    slices = slices_of(optimizer)
    return slices.rank, slices.size


def reshard(optimizer, rank: int, size: int, state_dict: dict) -> None:
    """Cut the slices for another world (an elastic reset) and keep this rank's part of ``state_dict``.

    ``state_dict`` is a consolidated state (what ``state_dict()`` returned at the last commit): the old
    slices cannot be gathered any more, since the ranks that held some of them may be gone. Local, no
    collective."""
    old = slices_of(optimizer)
    new = attach(optimizer, slices=Slices(optimizer, old.original, rank, size)).slices
    new.load_state_dict(state_dict)
    new.user_loads = old.user_loads
