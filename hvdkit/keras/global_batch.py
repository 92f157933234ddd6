"""A fixed global batch for Keras: the same samples in each optimizer step, grouped the same way, at any world size.

The plan is the core's (:mod:`hvdkit.runtime.global_batch`): each epoch's
order is cut into steps of the global batch G, each step into micro-batches,
and rank r of N takes micro-batches r, r+N, ... of each step. Keras's ``fit``
runs the same number of batches on every rank, so here a batch of ``fit`` is
one *slot*: every rank runs k = ceil(M/N) slots a step (M micro-batches a
step). A slot with no micro-batch of its own (N does not divide M) repeats the
step's first micro-batch with sample weight 0: its loss and gradient are zero.

The distributed optimizer (``DistributedOptimizer(opt, global_batch=batches)``)
adds each slot's gradient, weighted by its micro-batch's share of the step, to a
sum of its own, and at the step's last slot sums the ranks' sums once and
applies that: the step's mean gradient, with one reduction a step. The
optimizer's ``iterations`` count steps, so a learning-rate schedule sees steps.
Dropout's seed generators are set before each slot from the micro-batch's place
in the run (``hk.callbacks()`` does it), so a micro-batch draws the same mask on
any rank. Preemption checkpoints are taken at a step's end only.

Example::

    batches = hk.global_batches(x_train, y_train, global_batch=64, micro_batch=16, seed=0)
    opt = hk.DistributedOptimizer(keras.optimizers.Adam(1e-3), global_batch=batches)   # no hk.scale_lr
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    batches.resume(hk.load_checkpoint("ckpts/", model, opt, missing_ok=True))
    hk.fit(model, batches, epochs=5, callbacks=hk.callbacks(preemption_checkpoint="ckpts/"))
"""

from __future__ import annotations

import math

import numpy as np

from hvdkit.common.errors import UserError
from hvdkit.keras.context import current
from hvdkit.runtime.global_batch import GlobalBatch


def global_batches(x, y=None, *, global_batch: int, micro_batch: int | None = None, shuffle: bool = True,
                   seed: int = 0, **dataset_kwargs):
    """This rank's slots of ``x`` (and ``y``) for ``fit``: a fixed global batch in micro-batches, at any world size.

    What :func:`hvdkit.torch.global_batch_loader` is for torch, in the shape
    ``fit`` takes (a Keras ``PyDataset`` of ``(x, y, sample_weight)``): pass it to
    :func:`hvdkit.keras.fit` with :func:`hvdkit.keras.callbacks`, and to
    ``hk.DistributedOptimizer(opt, global_batch=...)``. ``micro_batch`` None
    cuts one micro-batch a rank at this size (the grouping then follows the
    size: give it for the same model at any size). Each epoch's last
    ``len(x) % global_batch`` samples of the shuffled order are left out, so
    that every step holds G samples. ``dataset_kwargs`` go to Keras's PyDataset.
    """
    ctx = current()
    if ctx.mode == "tf_keras":
        raise UserError("hk.global_batches needs Keras 3 (KERAS_BACKEND=tensorflow or torch): unset "
                        "TF_USE_LEGACY_KERAS, or train with a per-rank batch")
    return _batches_class(ctx.mode)(x, y, global_batch, micro_batch, shuffle=shuffle, seed=seed, rank=ctx.rank,
                                    size=ctx.size, **dataset_kwargs)


_CLASSES: dict[str, type] = {}


def _batches_class(mode: str) -> type:
    """A subclass of the active Keras's PyDataset, made once Keras is known."""
    if mode in _CLASSES:
        return _CLASSES[mode]
    from hvdkit.keras.data import _length, _take, checkpoint_place
    from hvdkit.keras.mode import keras_module

    keras = keras_module(mode)

    class GlobalBatches(keras.utils.PyDataset):
        """See :func:`global_batches`. ``epoch`` and ``start_step`` say where the next pass starts."""

        def __init__(self, x, y, global_batch, micro_batch, *, shuffle: bool, seed: int, rank: int, size: int,
                     **dataset_kwargs):
            super().__init__(**dataset_kwargs)
            lengths = {_length(a) for a in ([x] if y is None else [x, y])}
            if len(lengths) != 1:
                raise UserError(f"x and y have different lengths {sorted(lengths)}: pass the same samples")
            self.x, self.y = x, y
            self.epoch_size = lengths.pop()
            self.plan = GlobalBatch.for_size(global_batch, micro_batch, self.epoch_size, size, drop_last=True)
            self.shuffle, self.seed, self.rank, self.size = shuffle, seed, rank, size
            self.micros = len(self.plan.micro_batches(0))       # every step is whole: the same cut in each
            self.slots = math.ceil(self.micros / size)
            # This rank's micro-batch in each slot of a step (None: a slot of weight 0), and its share of the step.
            self.mine = [m if m < self.micros else None for m in range(rank, self.slots * size, size)]
            self.weights = [0.0 if m is None else self.plan.weight(0, m) for m in self.mine]
            self._resumed: dict | None = None
            self.set_epoch(0)

        @property
        def batch_size(self) -> int:
            return self.plan.micro_batch

        @property
        def steps_per_epoch(self) -> int:
            return self.plan.steps_per_epoch()

        @property
        def start_sample(self) -> int:
            """Samples of the epoch trained before this pass (what :func:`hvdkit.keras.fit` and the callbacks read)."""
            return self.start_step * self.plan.global_batch

        def set_epoch(self, epoch: int, start_sample: int = 0) -> None:
            """The next pass is ``epoch``'s steps from the one holding sample ``start_sample`` on (a step's start)."""
            if start_sample < 0 or start_sample % self.plan.global_batch:
                raise UserError(f"start_sample {start_sample} is not at a step's start (a multiple of the global batch "
                                f"{self.plan.global_batch}): resume from batches.position(...) or the checkpoint")
            self.epoch, self.start_step = epoch, start_sample // self.plan.global_batch
            self.trained = 0                     # slots of this pass that fit has run (hk.callbacks() counts)
            self._fetched: set[int] = set()
            order = (np.random.default_rng(self.seed + epoch).permutation(self.epoch_size) if self.shuffle
                     else np.arange(self.epoch_size))
            self._order = order

        def resume(self, extra: dict | None) -> None:
            """Continue where a checkpoint's ``extra`` says (``epoch`` and ``samples``, as the preemption checkpoint
            of :func:`hvdkit.keras.callbacks` writes them); None: from the start."""
            place = checkpoint_place(extra)
            if place is None:
                return
            epoch, samples = place
            saved = self._resumed or {"global_batch": self.plan.global_batch}
            whole = self.epoch_size // saved["global_batch"] * saved["global_batch"]     # the epoch, as it was cut
            if samples >= whole:
                self.set_epoch(epoch + 1)
            else:
                self.set_epoch(epoch, samples)

        def resumed(self, saved: dict | None) -> None:
            """Called by ``hk.load_checkpoint`` with the checkpoint's plan: a checkpoint taken mid-epoch with another
            global or micro-batch is refused (its steps were others)."""
            if saved is None or "steps_done" not in saved:
                return
            self._resumed = saved
            theirs = GlobalBatch(saved["global_batch"], saved["micro_batch"], self.epoch_size, True)
            if 0 < saved["steps_done"] < theirs.steps_per_epoch() and (
                    (theirs.global_batch, theirs.micro_batch) != (self.plan.global_batch, self.plan.micro_batch)):
                raise UserError(f"the checkpoint stopped after step {saved['steps_done']} of epoch {saved['epoch']} "
                                f"with global batch {theirs.global_batch} (micro-batch {theirs.micro_batch}), and "
                                f"these batches' is {self.plan.global_batch} ({self.plan.micro_batch}): finish the "
                                "epoch with the checkpoint's, and change it at an epoch's end")

        def state_dict(self) -> dict:
            """Where the run stands (a checkpoint's header holds it): the same on every rank."""
            return {"epoch": self.epoch, "steps_done": self.start_step + self.trained // self.slots,
                    "global_batch": self.plan.global_batch, "micro_batch": self.plan.micro_batch}

        def position(self, batches: int) -> int:
            """Samples of the epoch trained after ``batches`` slots of this pass (whole steps only)."""
            return (self.start_step + batches // self.slots) * self.plan.global_batch

        def at_step_end(self, batches: int) -> bool:
            """Whether ``batches`` slots of this pass end a step: where a checkpoint may be taken."""
            return batches % self.slots == 0

        def on_epoch_end(self) -> None:
            """Keras calls this after each pass (and Keras 3 after peeking at batch 0): a pass that fetched every
            slot moves on to the next epoch's order."""
            if len(self._fetched) >= len(self):
                self.set_epoch(self.epoch + 1)

        def __len__(self) -> int:
            return (self.steps_per_epoch - self.start_step) * self.slots

        def __getitem__(self, index: int):
            if not 0 <= index < len(self):
                raise IndexError(f"batch {index} of {len(self)}")
            self._fetched.add(index)
            step, slot = self.start_step + index // self.slots, index % self.slots
            micro = self.mine[slot]
            start, stop = self.plan.micro_batches(step)[0 if micro is None else micro]
            rows = self._order[start:stop]
            weight = np.full((len(rows),), 0.0 if micro is None else 1.0, dtype=keras.config.floatx())
            xs = _take(self.x, rows)
            return (xs, _take(self.y, rows), weight) if self.y is not None else (xs, None, weight)

        def seed_slot(self, model, batch: int) -> None:
            """Seed what ``model`` draws in slot ``batch`` of this pass from the micro-batch's place in the run, not
            from the rank: every seed generator of the model (Dropout's), by its place in the model; on the torch
            backend also torch's own generator, which Keras's Dropout uses when the layer was given no seed (put
            back by :meth:`unseed_slot`). A slot of weight 0 draws as the micro-batch it repeats."""
            step, slot = self.start_step + batch // self.slots, batch % self.slots
            micro = self.mine[slot]
            base = self.plan.seed(self.seed, self.epoch, step, 0 if micro is None else micro)
            for g, generator in enumerate(seed_generators(model)):
                value = np.random.SeedSequence([base, g]).generate_state(1, dtype=np.uint32)[0] >> 1
                generator.state.assign(np.asarray([value, 0], dtype=generator.state.dtype))
            if mode == "torch":
                import torch

                self._torch_rng = (torch.random.get_rng_state(),
                                   torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
                torch.manual_seed(base)

        def unseed_slot(self) -> None:
            """Put torch's generator back as it was before :meth:`seed_slot` (the torch backend)."""
            saved, self._torch_rng = getattr(self, "_torch_rng", None), None
            if saved is not None:
                import torch

                torch.random.set_rng_state(saved[0])
                if saved[1] is not None:
                    torch.cuda.set_rng_state_all(saved[1])

    _CLASSES[mode] = GlobalBatches
    return GlobalBatches


def is_global_batches(data) -> bool:
    return any(isinstance(data, cls) for cls in _CLASSES.values())


def seed_generators(model) -> list:
    """The model's seed generators (Dropout's and the like), in the order of its layers: the same in every process."""
    out, seen = [], set()
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for generator in getattr(layer, "_seed_generators", []):
            if id(generator) not in seen:
                seen.add(id(generator))
                out.append(generator)
    return out


class StepSum:
    """The distributed optimizer's sum over a step's slots (see the module): one reduction at the last slot.

    The slot counter and the sums are Keras variables that the optimizer does
    not track, so its checkpoints hold what a plain optimizer's hold; a
    checkpoint is only taken at a step's end, where the sums are zero.
    """

    def __init__(self, batches, keras):
        self.keras, self.batches = keras, batches
        self.slots = batches.slots
        self.weights = batches.weights
        self.counter = keras.Variable(0, dtype="int32", trainable=False, name="hvdkit_global_batch_slot")
        self.sums: dict[int, object] = {}
        self.built_on: list = []
        batches.step_sum = self          # hk.callbacks() starts each fit at a step's first slot (reset)

    def reset(self) -> None:
        """Back to a step's first slot with nothing summed: a fit that ended mid-step (a callback's stop_training,
        an exception caught in a notebook) must not carry its partial sums into the next fit's first step."""
        self.counter.assign(0)
        for total in self.sums.values():
            total.assign(self.keras.ops.zeros(total.shape, dtype=total.dtype))

    def build(self, variables) -> None:
        """One zero sum per variable, made outside any traced function (Keras builds the optimizer eagerly)."""
        self.built_on = list(variables)
        for v in variables:
            if id(v) not in self.sums:
                self.sums[id(v)] = self.keras.Variable(self.keras.ops.zeros(v.shape, dtype=v.dtype), trainable=False,
                                                       name="hvdkit_global_batch_sum")

    def _table(self, grad):
        """The slots' weights in the gradient's own dtype: a float32 1/6 would round a float64 job's weights."""
        dtype = self.keras.backend.standardize_dtype(grad.dtype)
        return self.keras.ops.convert_to_tensor(np.asarray(self.weights, dtype=np.float64), dtype=dtype)

    def apply(self, grads, variables, reduce, update) -> None:
        """Add this slot's weighted ``grads``; at the step's last slot, ``update(reduce(sums))`` and start over."""
        ops = self.keras.ops
        present = [i for i, g in enumerate(grads) if g is not None]
        if self.slots == 1:
            weighted = list(grads)
            for i in present:
                weighted[i] = grads[i] * ops.take(self._table(grads[i]), 0)
            update(reduce(weighted), variables)
            return
        missing = [v for v in variables if id(v) not in self.sums]
        if missing:
            raise UserError("the global batch's optimizer was not built on these variables: let fit (or "
                            "optimizer.build(model.trainable_variables)) build it before the first step")
        slot = self.counter.value
        added = list(grads)
        for i in present:
            added[i] = self.sums[id(variables[i])] + ops.take(self._table(grads[i]), slot) * grads[i]

        def finish():
            update(reduce(added), variables)
            for i in present:
                total = self.sums[id(variables[i])]
                total.assign(ops.zeros(total.shape, dtype=total.dtype))
            self.counter.assign(0)

        def hold():
            for i in present:
                self.sums[id(variables[i])].assign(added[i])
            self.counter.assign(slot + 1)

        ops.cond(ops.equal(slot, self.slots - 1), finish, hold)
