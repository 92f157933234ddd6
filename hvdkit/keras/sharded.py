"""Sharded optimizer state for Keras 3 (ZeRO stage 1): each rank keeps 1/N of the optimizer state.

Example::

    opt = hk.DistributedOptimizer(keras.optimizers.AdamW(hk.scale_lr(1e-3)), shard_optimizer_state=True)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    model.fit(x, y, callbacks=hk.callbacks())

The same design as :mod:`hvdkit.torch.sharded`, on Keras's optimizer API so
that it serves both backends (TensorFlow, in ``fit``'s graph too, and
PyTorch): gradients are averaged whole (one grouped allreduce, as without
sharding); the optimizer is built on one slice of every variable (flattened,
rank r holds elements ``[r*c, (r+1)*c)``, ``c = ceil(size / N)``), so its
slots (Adam's moments, SGD's momentum, the accumulators of
``gradient_accumulation_steps``) exist for that slice only; Keras's own update
steps the slices; the slices are then all-gathered into the variables, one
grouped allgather per ``apply`` (per batch under accumulation, where only
every k-th changes them: a cost not yet cut), and the variables' constraints
applied. Weight decay asks Keras's rule of the whole variable, so exclusions
by variable or by name hold as unsharded. Clipping by
norm (``clipnorm``, ``global_clipnorm``) needs the norms of whole gradients:
each rank sums the squares of its slices and one allreduce adds them up.

The slices are copies (Keras variables cannot share memory with another
variable on TensorFlow), refreshed from the variables before every step, so a
load, a broadcast or a hand-made change of the weights is always seen. Each
rank holds its slots plus that 1/N copy of the weights.

The optimizer's own variables (``optimizer.variables``) are those of the
unsharded optimizer, in the same order, each slot cut to the rank's slice.
hvdkit's checkpoints gather them into the unsharded layout (a collective: every
rank calls ``hk.save_checkpoint``, as every hvdkit script does) and cut any such
file for this rank on load, so a checkpoint moves between sharded and
unsharded jobs and world sizes. Keras's own ``model.save`` cannot see the other
ranks' slices, and says so.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from hvdkit.common.errors import UserError
from hvdkit.keras.collectives import variable_numpy, variable_value
from hvdkit.runtime import sharding
from hvdkit.runtime.optimizer_record import OptimizerRecord, attach, record_of
from hvdkit.runtime.sharding import slice_range

# Keras's optimizers whose update of an element reads only that element's gradient and slots (plus scalars
# such as Nadam's u_product). Adafactor (factored moments), Lamb (a trust ratio per variable) and Muon
# (orthogonalised matrices) read whole variables.
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Lion", "Ftrl")

log = logging.getLogger("hvdkit.keras")


def check_supported(optimizer) -> None:
    """Refuse what the slices cannot compute as one process would, naming the fix."""
    name = type(optimizer).__name__
    if name not in ELEMENTWISE or not type(optimizer).__module__.startswith("keras."):
        raise UserError(f"shard_optimizer_state needs an optimizer that updates each element on its own "
                        f"(Keras's {', '.join(ELEMENTWISE)}), got {name}: shard one of those, or leave "
                        "shard_optimizer_state off")
    if optimizer.use_ema:
        raise UserError("shard_optimizer_state cannot take use_ema=True (the moving averages replace whole "
                        "weights at the end of fit): leave use_ema off, or shard_optimizer_state off")
    if optimizer.built:
        raise UserError("the optimizer was built before DistributedOptimizer(shard_optimizer_state=True), so it "
                        "holds every slot whole: wrap it before compile, fit or optimizer.build (to resume a Keras "
                        "file's state, as load_model's optimizer holds it: wrap a new optimizer, build it on "
                        "model.trainable_variables, then call model.load_weights(file) on every rank)")


class Slices:
    """The variables an optimizer was built for, this rank's slice of each, and which slot belongs to which."""

    def __init__(self, variables: list, rank: int, size: int, keras, backend):
        self.keras, self.backend, self.rank, self.size = keras, backend, rank, size
        self.variables = list(variables)
        self.index = {id(v): k for k, v in enumerate(self.variables)}
        self.ranges = [slice_range(math.prod(v.shape), rank, size) for v in self.variables]
        # Named as the variable, so that exclude_from_weight_decay(var_names=...) matches the slice as it would
        # the variable; not a layer's weight, and kept out of the optimizer's tracked variables (a plain object).
        self.slices = [keras.Variable(keras.ops.zeros((end - start,), dtype=v.dtype), trainable=False,
                                      name=v.name) for v, (start, end) in zip(self.variables, self.ranges)]
        for v, s in zip(self.variables, self.slices):
            # float8's scales and histories take their gradient as their new value (elementwise: a slice may).
            s.overwrite_with_gradient = getattr(v, "overwrite_with_gradient", False)
        self.of_slice = {id(s): k for k, s in enumerate(self.slices)}
        self.slot_of: dict[int, int] = {}      # id(slot variable) -> index of the variable it was made for
        self.loads = 0           # slot entries loaded from a file: the same count on every rank that loaded it
        self.save_warned = False

    def refresh(self, k: int) -> None:
        """Copy variable ``k``'s current elements into its slice."""
        start, end = self.ranges[k]
        self.slices[k].assign(self.keras.ops.reshape(self.variables[k], (-1,))[start:end])

    def cut(self, k: int, value):
        """This rank's part of a whole (flattened) value laid out like variable ``k``.

        A TensorFlow ``IndexedSlices`` (an Embedding's gradient: a row per lookup, repeats kept) stays sparse:
        one entry per element of those rows that falls in the slice. Keras's updates treat sparse gradients
        their own way (Adam squares each lookup's row before adding repeats up), and the unsharded optimizer
        sees them sparse, so the slice must too."""
        start, end = self.ranges[k]
        if type(value).__name__ == "IndexedSlices":
            import tensorflow as tf

            width = math.prod(self.variables[k].shape) // int(self.variables[k].shape[0])
            flat = tf.reshape(tf.cast(value.indices, tf.int64)[:, None] * width + tf.range(width, dtype=tf.int64),
                              [-1])
            keep = (flat >= start) & (flat < end)
            return tf.IndexedSlices(tf.boolean_mask(tf.reshape(value.values, [-1]), keep),
                                    tf.boolean_mask(flat, keep) - start, dense_shape=[end - start])
        return self.keras.ops.reshape(value, (-1,))[start:end]

    def gather(self, ks: list[int], values: list) -> list:
        """Every rank's slice of variables ``ks`` (``values``: this rank's), whole and shaped like the variables."""
        if not ks:
            return []
        gathered = self.backend.grouped_allgather([variable_value(v) for v in values], name="hvdkit.shards")
        return [self.keras.ops.reshape(full, self.variables[k].shape) for k, full in zip(ks, gathered)]

    def gather_to(self, root: int, ks: list[int], values: list) -> list:
        """As :meth:`gather`, on rank ``root`` alone (numpy); [] elsewhere, with no copy of the whole state."""
        pieces = [variable_value(v) for v in values]
        received = self.backend.gather_to(root, pieces, name="hvdkit.shards.gather")
        return [self.keras.ops.convert_to_numpy(full).reshape(tuple(self.variables[k].shape))
                for k, full in zip(ks, received)]


def shard(optimizer, keras, backend, rank: int, size: int):
    """Make ``optimizer`` (a plain Keras 3 optimizer, not built yet) keep this rank's slices only, in place.

    Its class is swapped for a subclass of the same name and module (as
    :func:`hvdkit.keras.optimizer.DistributedOptimizer` does), so the config
    and serialization stay the plain optimizer's.
    """
    check_supported(optimizer)
    base = type(optimizer)

    def build(self, variables):
        if self.built:
            return
        variables = list(variables)
        slices = attach(self, slices=Slices(variables, rank, size, keras, backend)).slices
        base.build(self, slices.slices)

    def _use_weight_decay(self, variable):
        # Asked of a slice: answered for its variable, so that exclude_from_weight_decay(var_list=..., var_names=...)
        # matches as it does unsharded, whether called before the build or after.
        slices = _slices(self)
        k = None if slices is None else slices.of_slice.get(id(variable))
        return base._use_weight_decay(self, variable if k is None else slices.variables[k])

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        slot = base.add_variable_from_reference(self, reference_variable, name=name, initializer=initializer)
        slices = _slices(self)
        k = None if slices is None else slices.of_slice.get(id(reference_variable))
        if k is not None:
            slices.slot_of[id(slot)] = k
        return slot

    def apply(self, grads, trainable_variables=None):
        if len(grads) == 0:
            return None
        if trainable_variables is None:
            if not self.built:
                raise UserError("apply(grads) without the variables needs a built optimizer: call "
                                "optimizer.build(model.trainable_variables) first, or pass the variables")
            trainable_variables = _slices(self).variables
        trainable_variables = list(trainable_variables)
        if len(grads) != len(trainable_variables):
            raise UserError(f"apply got {len(grads)} gradients for {len(trainable_variables)} variables: give one "
                            "gradient (or None) per variable, in the variables' order")
        if not self.built:
            with keras.name_scope(self.name):
                self.build(trainable_variables)
            self.built = True
        slices = _slices(self)
        ks = []
        for v in trainable_variables:
            k = slices.index.get(id(v))
            if k is None:
                raise UserError(f"variable {v.path} is not one this sharded optimizer was built for: apply it to the "
                                "variables it was built on, or make a new optimizer for a new set of variables")
            ks.append(k)
        for k in ks:
            slices.refresh(k)
        base.apply(self, [None if g is None else slices.cut(k, g) for g, k in zip(grads, ks)],
                   [slices.slices[k] for k in ks])
        # The same set on every rank (the gradients come from one allreduce), so every rank joins the allgather.
        stepped = [k for g, k in zip(grads, ks) if g is not None]
        for k, whole in zip(stepped, slices.gather(stepped, [slices.slices[k] for k in stepped])):
            variable = slices.variables[k]
            variable.assign(whole)
            if variable.constraint is not None:
                variable.assign(variable.constraint(variable))
        return None

    def _clip_gradients(self, grads):
        # The slices' norms are parts of the whole gradients' norms: add up every rank's sums of squares.
        if not ((self.clipnorm and self.clipnorm > 0) or (self.global_clipnorm and self.global_clipnorm > 0)):
            return base._clip_gradients(self, grads)
        ops = keras.ops
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return grads
        # The widest of the gradients' dtypes, as Keras's stack promotes: keras.backend.result_type gives float32
        # for two float64s on torch, which would round a float64 job's norms.
        dtype = max((keras.backend.standardize_dtype(grads[i].dtype) for i in present),
                    key=lambda d: 2 if d == "bfloat16" else np.dtype(d).itemsize)
        sums = ops.stack([ops.cast(ops.sum(ops.square(grads[i])), dtype) for i in present])
        sums = backend.allreduce(variable_value(sums), "sum", name="hvdkit.shards.norms")
        out = list(grads)
        if self.clipnorm and self.clipnorm > 0:
            # Keras's _clip_by_norm, written as it is (on torch its clipnorm is a float32 tensor, so another
            # order of operations rounds differently), with the whole variable's norm.
            for j, i in enumerate(present):
                out[i] = ops.convert_to_tensor(ops.multiply(grads[i], self.clipnorm)) / ops.maximum(
                    ops.sqrt(sums[j]), self.clipnorm)
            return out
        # keras.optimizers.base_optimizer.clip_by_global_norm, with the norm of every rank's slices.
        norm = ops.sqrt(ops.sum(sums))
        scale = self.global_clipnorm * ops.minimum(1.0 / norm, 1.0 / self.global_clipnorm) + (norm - norm)
        for i in present:
            out[i] = grads[i] * ops.cast(scale, grads[i].dtype)
        return out

    optimizer.__class__ = type(base.__name__, (base,), {
        "build": build, "_use_weight_decay": _use_weight_decay,
        "add_variable_from_reference": add_variable_from_reference, "apply": apply, "_clip_gradients": _clip_gradients,
        **keras_file_methods(base, keras, size), "__module__": base.__module__, "__qualname__": base.__qualname__})
    attach(optimizer, sharded=True)
    return optimizer


def keras_file_methods(base: type, keras, size: int) -> dict:
    """``save_own_variables``/``load_own_variables`` for a sharded optimizer, or a LossScaleOptimizer around one
    (whose own methods store its inner optimizer's variables): Keras's model.save, save_weights and ModelCheckpoint.

    They run on the rank that writes, alone, which holds 1/N of the state and cannot gather the rest: on
    several ranks the file keeps the weights and an hvdkit: warning says so (loading it starts the optimizer
    afresh, as Keras does for a file saved before the optimizer was built). A file of the unsharded layout (an
    unsharded job's, or one rank's) loads on every rank, each keeping its slices.
    """
    def save_own_variables(self, store):
        slices = _slices(sharded_part(self))
        if slices is None:                 # not built: no state to keep
            return base.save_own_variables(self, store)
        entries = whole_view(self, self.variables)
        if size == 1:     # one rank holds every slice: the unsharded layout, slots shaped as their variables
            for i, entry in enumerate(entries):
                store[str(i)] = entry.whole() if isinstance(entry, SlotSlice) else keras.ops.convert_to_numpy(entry)
            return None
        if not slices.save_warned:     # once: Keras saves a LossScaleOptimizer and its inner optimizer both
            slices.save_warned = True
            log.warning("hvdkit: model.save/save_weights (and ModelCheckpoint) keep the weights but not the sharded "
                        "optimizer's state, which is spread over the %d ranks: save with hk.save_checkpoint(path, "
                        "model, optimizer) on every rank to keep both (it writes the whole state on rank 0)", size)
        return None

    def load_own_variables(self, store):
        variables = self.variables
        if len(store.keys()) != len(variables):
            return base.load_own_variables(self, store)      # Keras's own warning: the state is not loaded
        for i, entry in enumerate(whole_view(self, variables)):
            entry.assign(store[str(i)])
        return None

    return {"save_own_variables": save_own_variables, "load_own_variables": load_own_variables}


def sharded_part(optimizer):
    """The sharded optimizer inside ``optimizer`` (itself, or a LossScaleOptimizer's inner one), or None."""
    for candidate in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if candidate is not None and (record_of(candidate) or OptimizerRecord()).sharded:
            return candidate
    return None


def _slices(optimizer) -> Slices | None:
    """The slices a sharded optimizer keeps once built; None before its build."""
    record = None if optimizer is None else record_of(optimizer)
    return None if record is None else record.slices


class SlotSlice:
    """An optimizer slot seen whole: the shape of its variable; ``assign`` keeps this rank's slice of a whole value."""

    def __init__(self, slot, slices: Slices, k: int):
        self.slot, self.slices, self.k = slot, slices, k
        self.shape = tuple(slices.variables[k].shape)
        self.dtype = slot.dtype

    def whole(self) -> np.ndarray:
        """The slot shaped as its variable: only where this rank holds every element (one rank)."""
        return self.slices.keras.ops.convert_to_numpy(self.slot).reshape(self.shape)

    def assign(self, value) -> None:
        value = np.asarray(value)          # h5py's datasets too
        if tuple(value.shape) != self.shape:
            raise UserError(f"optimizer slot {self.slot.path} holds {self.shape} but the file gives {value.shape}: "
                            "load a file saved from the same model and optimizer")
        self.slot.assign(self.slices.cut(self.k, self.slices.keras.ops.convert_to_tensor(value, dtype=self.dtype)))
        self.slices.loads += 1


def whole_view(optimizer, variables: list) -> list:
    """``variables`` (the optimizer's, in order) with each slot of a sharded optimizer as a :class:`SlotSlice`."""
    slices = _slices(sharded_part(optimizer))
    if slices is None:
        return variables
    return [SlotSlice(v, slices, slices.slot_of[id(v)]) if id(v) in slices.slot_of else v for v in variables]


def check_same_loads(optimizer, backend, caller: str) -> None:
    """Refuse, on every rank, slots that some ranks loaded and others did not (collective, named after ``caller``).

    A file loaded on rank 0 alone (``if ctx.is_main: model.load_weights(f)``, then the broadcast that copies an
    unsharded state) would leave the other ranks' slices as they were, silently; and a rank that saves alone
    waits here, in a collective named after the call, which hvdkit launch's deadlock line names."""
    slices = _slices(sharded_part(optimizer))
    sharding.check_same_loads(backend, caller, None if slices is None else slices.loads,
                              "hk.load_checkpoint does; model.load_weights too, called on every rank, not under "
                              "`if ctx.is_main:`")


def gather_whole(entries: list, root: int) -> list | None:
    """Every entry's whole value as numpy on rank ``root``, None elsewhere (collective: every rank sends its
    slices of each :class:`SlotSlice`)."""
    cut = [e for e in entries if isinstance(e, SlotSlice)]
    gathered = cut[0].slices.gather_to(root, [e.k for e in cut], [e.slot for e in cut]) if cut else []
    if cut and cut[0].slices.rank != root:
        return None
    whole = {id(e): value for e, value in zip(cut, gathered)}
    return [whole[id(e)] if isinstance(e, SlotSlice) else variable_numpy(e) for e in entries]
