"""Steps 3-5 for Keras: the distributed optimizer, the initial broadcast, the scaled rate.

Example::

    opt = hk.DistributedOptimizer(keras.optimizers.Adam(hk.scale_lr(1e-3)))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    model.fit(x, y, callbacks=hk.callbacks(warmup_epochs=2))   # broadcasts rank 0's state first
"""

from __future__ import annotations

import re

from hvdkit.common.errors import UserError
from hvdkit.keras import xla
from hvdkit.keras.collectives import allreduce_gradients, broadcast_variables
from hvdkit.keras.context import backend, current
from hvdkit.keras.global_batch import StepSum, is_global_batches
from hvdkit.keras.mode import keras_module
from hvdkit.keras.sharded import SlotSlice, check_same_loads, keras_file_methods, shard, sharded_part, whole_view
from hvdkit.keras.stragglers import AllreduceTimer
from hvdkit.runtime.lr import job_reduce_options, scale_lr_for
from hvdkit.runtime.optimizer_record import OptimizerRecord, attach, record_of
from hvdkit.runtime.state import check_weights_agree, weights_check_applies, weights_digest


class NotDistributedError(UserError):
    """fit runs on several ranks with an optimizer that averages nothing."""


def is_distributed(optimizer) -> bool:
    """Averages gradients: hvdkit's or Horovod's optimizer, or a LossScaleOptimizer around one.

    ``compile`` wraps the optimizer in a ``LossScaleOptimizer`` when the model's
    dtype policy is mixed but was not when :func:`DistributedOptimizer` ran.
    """
    if (record_of(optimizer) or OptimizerRecord()).distributed or type(optimizer).__module__.startswith("horovod."):
        return True
    inner = getattr(optimizer, "inner_optimizer", None)
    return inner is not None and inner is not optimizer and is_distributed(inner)


def check_distributed(optimizer) -> None:
    """Raise :class:`NotDistributedError` if several ranks would train with a plain optimizer.

    ``compile(optimizer="adam")`` (or a Keras optimizer not passed through
    :func:`DistributedOptimizer`) averages no gradients: each rank trains its
    own model. The message names the wrapped optimizer at the same rate.
    """
    if current().size == 1 or optimizer is None:
        return
    check_loss_scale_inside(optimizer)
    if is_distributed(optimizer):
        return
    plain = getattr(optimizer, "inner_optimizer", None) or optimizer     # compile's LossScaleOptimizer
    name = type(plain).__name__
    raise NotDistributedError(
        f"the model's optimizer ({name}) is not distributed, so no gradients are averaged and each of the "
        f"{current().size} ranks trains its own model: compile with optimizer=hk.DistributedOptimizer("
        f"keras.optimizers.{name}(hk.scale_lr({get_learning_rate(plain):g}))) instead of a string such as "
        "optimizer=\"adam\" or a plain optimizer")


def check_loss_scale_inside(optimizer) -> None:
    """Raise if a ``LossScaleOptimizer`` wraps hvdkit's distributed optimizer instead of sitting inside it."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None and not (record_of(optimizer) or OptimizerRecord()).distributed and is_distributed(inner):
        # compile's LossScaleOptimizer, outside the averaging: each rank would check its own gradients, and a rank
        # that skips an overflowing step leaves the others waiting in its allreduce.
        raise UserError("a LossScaleOptimizer wraps hk.DistributedOptimizer (the script's own, or compile's when the "
                        "model's dtype policy is mixed_float16 and the global one was not when the optimizer was "
                        "wrapped), so each rank would skip overflowing steps on its own gradients and the others would "
                        "wait for it: pass the bare optimizer to hk.DistributedOptimizer after keras.mixed_precision."
                        "set_global_policy('mixed_float16') (it puts the loss scale inside, on averaged gradients), "
                        "or wrap keras.optimizers.LossScaleOptimizer(opt) before hk.DistributedOptimizer")


def DistributedOptimizer(optimizer, *, op: str = "average", compression: str = "none",
                         backward_passes_per_step: int = 1, shard_optimizer_state: bool = False, global_batch=None):
    """Step 3: average gradients across ranks before the optimizer applies them.

    Keras 3 (TensorFlow or PyTorch backend): the optimizer's ``apply`` is
    preceded by one grouped Horovod allreduce, so it works in ``model.fit``
    (graph or eager) and in custom loops that call ``apply_gradients``.
    Under a ``mixed_float16`` policy the optimizer is first wrapped in a
    ``LossScaleOptimizer`` and the allreduce runs on the scaled gradients,
    so every rank agrees on skipping a non-finite step.
    For gradient accumulation in Keras 3 use the optimizer's own
    ``gradient_accumulation_steps``. tf-keras: Horovod's own
    ``horovod.tensorflow.keras.DistributedOptimizer`` (which takes
    ``backward_passes_per_step``).

    At its first step the optimizer checks once that every rank holds the
    same weights (:func:`check_weights_at_first_step`): a ``fit`` without
    :func:`hvdkit.keras.callbacks`, or a custom loop without
    :func:`broadcast_state`, raises instead of training the ranks apart.

    ``shard_optimizer_state=True`` (Keras 3) keeps 1/N of the optimizer's
    state on each rank (ZeRO stage 1, :mod:`hvdkit.keras.sharded`); its
    checkpoints are whole and load on any world size, sharded or not.

    ``global_batch=batches`` (an :func:`hvdkit.keras.global_batches`) makes
    each optimizer step one fixed global batch, whatever the number of ranks
    (:mod:`hvdkit.keras.global_batch`): the rate is then the global batch's,
    with no ``hk.scale_lr``.
    """
    ctx = current()
    b = backend()
    if global_batch is not None:
        op = _check_global_batch(global_batch, optimizer, op, backward_passes_per_step, ctx.mode)
    op, compression = job_reduce_options(b, ctx.size, op, compression)
    if is_distributed(optimizer):
        raise UserError("optimizer is already distributed: wrap the plain Keras optimizer once")
    b.compression(compression)     # a Horovod built before bf16 says so here, not inside fit's first step
    if ctx.mode == "tf_keras" and shard_optimizer_state:
        raise UserError("shard_optimizer_state needs Keras 3 (KERAS_BACKEND=tensorflow or torch); tf-keras's "
                        "optimizers are Horovod's own: unset TF_USE_LEGACY_KERAS, or leave shard_optimizer_state off")
    if ctx.mode == "tf_keras":
        import horovod.tensorflow.keras as hvd_keras

        wrapped = hvd_keras.DistributedOptimizer(optimizer, op=b.reduce_op(op), compression=b.compression(compression),
                                                 backward_passes_per_step=backward_passes_per_step)
        horovods_apply, checked = wrapped.apply_gradients, []

        def apply_gradients(grads_and_vars, *args, **kwargs):
            # On the instance: Horovod's class calls super(self.__class__, self), which a subclass would loop.
            grads_and_vars = list(grads_and_vars)
            if not checked:
                checked.append(True)
                check_weights_at_first_step([v for _, v in grads_and_vars])
            return horovods_apply(grads_and_vars, *args, **kwargs)

        wrapped.apply_gradients = apply_gradients
        attach(wrapped, op=op)        # the learning rate's scaling rule, for a checkpoint resumed on another size
        return wrapped
    if backward_passes_per_step != 1:
        raise UserError("backward_passes_per_step is for tf-keras; in Keras 3 create the optimizer with "
                         f"gradient_accumulation_steps={backward_passes_per_step} instead")
    keras = keras_module(ctx.mode)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise UserError(f"expected a keras.optimizers.Optimizer, got {type(optimizer).__name__}: "
                        "pass e.g. keras.optimizers.SGD(...)")
    if keras.mixed_precision.global_policy().name == "mixed_float16" and not isinstance(
            optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    base = type(optimizer)
    keras_files = {}
    if shard_optimizer_state:
        # The loss scale's optimizer unscales the averaged gradients and skips a non-finite step whole, on
        # every rank alike; the optimizer inside it is the one that keeps slices.
        plain = getattr(optimizer, "inner_optimizer", None) or optimizer
        shard(plain, keras, b, ctx.rank, ctx.size)
        base = type(optimizer)
        if plain is not optimizer:      # a LossScaleOptimizer stores its inner optimizer's variables in Keras's files
            keras_files = keras_file_methods(base, keras, ctx.size)
    checked = []
    timer = AllreduceTimer(ctx.mode)       # the wait that hk.callbacks()'s straggler report subtracts
    on_tensorflow = ctx.mode == "tensorflow"
    step_sum = None if global_batch is None else StepSum(global_batch, keras)

    def build(self, variables):
        base.build(self, variables)
        if step_sum is not None:
            step_sum.build(list(variables))

    def apply(self, grads, trainable_variables=None):
        if on_tensorflow:
            if xla.captured(grads, trainable_variables):    # fit's XLA half: the update runs after it, outside
                return None
            xla.refuse_inside_xla()
        if not checked:
            checked.append(True)
            sharded = sharded_part(self)    # built on slices of the variables: check the variables
            check_weights_at_first_step(trainable_variables if trainable_variables is not None else
                                        record_of(sharded).slices.variables if sharded is not None and sharded.built
                                        else self._trainable_variables)
        if step_sum is not None:
            if not self.built:
                self.build(trainable_variables)
            step_sum.apply(list(grads), list(trainable_variables if trainable_variables is not None
                                              else step_sum.built_on),
                           lambda gs: timer.around(lambda g: allreduce_gradients(b, g, op, compression), gs),
                           lambda gs, vs: base.apply(self, gs, vs))
            return None
        reduced = timer.around(lambda gs: allreduce_gradients(b, gs, op, compression), list(grads))
        return base.apply(self, reduced, trainable_variables)

    # Swap the class in place: the optimizer keeps its config, variables and
    # (for LossScaleOptimizer) its inner optimizer. The subclass takes the base's
    # name and module, so Keras serializes it as the plain optimizer: a .keras file
    # saved under hvdkit (model.save, ModelCheckpoint) loads with keras.models.load_model
    # in a process without hvdkit. As "DistributedAdam" of hvdkit.keras.optimizer it
    # failed there: "Could not locate class 'DistributedAdam'".
    optimizer.__class__ = type(base.__name__, (base,),
                               {"apply": apply, "build": build, "__module__": base.__module__,
                                "__qualname__": base.__qualname__, **keras_files})
    attach(optimizer, distributed=True, op=op, allreduce_timer=timer)
    if global_batch is not None:
        attach(optimizer, global_batch=global_batch)
    return optimizer


def _check_global_batch(batches, optimizer, op: str, backward_passes_per_step: int, mode: str) -> str:
    """The op a global-batch optimizer reduces with: a sum of the slots' weighted gradients."""
    from hvdkit.runtime import context

    if mode == "tf_keras":
        raise UserError("global_batch needs Keras 3 (KERAS_BACKEND=tensorflow or torch): unset TF_USE_LEGACY_KERAS")
    if not is_global_batches(batches):
        raise UserError(f"global_batch takes the batches made by hk.global_batches(), got {type(batches).__name__}: "
                        "build them with hk.global_batches(x, y, global_batch=...)")
    if op != "average":
        raise UserError(f"global_batch sums each micro-batch's weighted gradient into the step's mean, so op={op!r} "
                        "has no place: leave op at its default")
    plain = getattr(optimizer, "inner_optimizer", None) or optimizer
    if backward_passes_per_step != 1 or getattr(plain, "gradient_accumulation_steps", None):
        raise UserError("global_batch decides how many micro-batches a rank accumulates each step: leave "
                        "gradient_accumulation_steps unset and give micro_batch to hk.global_batches instead")
    if context.scales_lr():
        raise UserError("hk.scale_lr multiplies the rate by the number of ranks, but with a fixed global batch the "
                        "rate does not depend on them: pass the rate for the global batch itself "
                        "(SGD(0.1), not SGD(hk.scale_lr(0.1)))")
    return "sum"


BROADCAST_FIX = ("pass callbacks=hk.callbacks(...) to fit, which copies rank 0's weights first (in a custom loop, "
                 "call hk.broadcast_state(model, optimizer) before it)")


def check_weights_at_first_step(variables) -> None:
    """Raise on every rank if the ranks' ``variables`` differ before the first update (see the core's check).

    Called once from the distributed optimizer's first apply, before the
    gradients are applied: in ``fit`` on TensorFlow that is while the train
    step is traced, so the values are read (and gathered) eagerly, outside
    the graph. An error rather than a warning: ranks that start apart stay
    apart for the whole run, which no job wants.
    """
    ctx = current()
    if not weights_check_applies(ctx.size):
        return
    if ctx.mode == "torch":
        check_weights_agree(backend(), weights_digest(v.numpy() for v in variables), BROADCAST_FIX,
                            when="at the first step")
        return
    import tensorflow as tf

    with tf.init_scope():
        check_weights_agree(backend(), weights_digest(v.numpy() for v in variables), BROADCAST_FIX,
                            when="at the first step")


def optimizer_variables(optimizer) -> list:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def saves_learning_rate(optimizer) -> bool:
    """Whether the rate is one of the optimizer's variables (Keras 3), so a checkpoint holds it (tf-keras: no)."""
    return any(_short_name(v) == "learning_rate" for v in optimizer_variables(optimizer))


def ensure_built(model, optimizer) -> None:
    """Create the optimizer's variables (zero slots; no step) if it has none yet.

    Keras 3 says ``built`` (and a LossScaleOptimizer builds its inner one);
    tf-keras keeps ``_built``.
    """
    if optimizer is None:
        return
    inner = getattr(optimizer, "inner_optimizer", None)
    built = getattr(optimizer, "built", None)
    if built is None:
        built = getattr(optimizer, "_built", False)
    if not built or (inner is not None and not inner.built):
        optimizer.build(model.trainable_variables)


def named_variables(model, optimizer=None) -> list[tuple[str, object]]:
    """The model's variables by structural name, then the optimizer's by position; what checkpoints match on.

    A model variable's name is the path of layers to it, each layer named by
    its class (snake case, as Keras names layers by default) and its place
    among its parent's layers of that class, then the variable's own name:
    ``model/dense/kernel``, ``model/dense_1/bias``, ``model/conv2d/kernel``,
    ``model/batch_normalization/moving_mean``. The layer names Keras gives
    (``dense_7``, numbered per process) and the model's name play no part, so a model built twice in one process
    matches. Optimizer variables are ``optimizer/<index>`` (shapes checked): their order
    follows the model's trainable variables, as a torch optimizer's state
    follows its parameters' indices.
    """
    names: dict[int, str] = {}
    _name_layers("model/", model, names)
    out = [(names.get(id(v)) or f"model/{_short_name(v)}", v) for v in model.variables]
    if optimizer is not None:
        ensure_built(model, optimizer)
        # A sharded optimizer's slots are seen whole (SlotSlice): a checkpoint holds the unsharded layout.
        out += [(f"optimizer/{i}", v) for i, v in enumerate(whole_view(optimizer, optimizer_variables(optimizer)))]
    return _numbered_duplicates(out)


def _short_name(variable) -> str:
    """``kernel`` for Keras 3's ``sequential/dense/kernel`` and tf-keras's ``dense/kernel:0``."""
    return (getattr(variable, "path", None) or variable.name).split("/")[-1].split(":")[0]


def _name_layers(prefix: str, layer, names: dict[int, str]) -> None:
    counts: dict[str, int] = {}
    for child in getattr(layer, "layers", None) or []:
        kind = _snake_case(type(child).__name__)
        counts[kind] = counts.get(kind, 0) + 1
        _name_layers(f"{prefix}{kind if counts[kind] == 1 else f'{kind}_{counts[kind] - 1}'}/", child, names)
    own = [v for v in layer.variables if id(v) not in names]     # a leaf's, or what a container holds itself
    for name, v in _numbered_duplicates([(f"{prefix}{_short_name(v)}", v) for v in own]):
        names[id(v)] = name


def _snake_case(name: str) -> str:
    """A class name as Keras names a layer by default: Conv2D -> conv2d, BatchNormalization -> batch_normalization."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def _numbered_duplicates(named: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """A layer with inner layers can hold two ``kernel``s: the second becomes ``kernel#1``."""
    seen: dict[str, int] = {}
    out = []
    for name, v in named:
        seen[name] = seen.get(name, 0) + 1
        out.append((name if seen[name] == 1 else f"{name}#{seen[name] - 1}", v))
    return out


def broadcast_state(model, optimizer=None, root_rank: int = 0) -> None:
    """Step 4: copy rank 0's model variables (weights and non-trainable state) and optimizer variables.

    The optimizer is built first if needed (its slots start at zero; no step
    is taken), so its variables exist on every rank before the broadcast.
    Every variable goes by name (:func:`named_variables`) through
    :func:`hvdkit.runtime.state.broadcast_state`, which first checks that all
    ranks hold the same names and shapes. A sharded optimizer's slots stay:
    each rank holds a different slice of them, and loads cut them alike.
    """
    current()
    if not model.built or not model.variables:
        raise UserError("the model has no weights yet: build it first (an Input layer, model.build(shape), "
                         "or call it on one batch) before broadcast_state/fit")
    if optimizer is not None and sharded_part(optimizer) is not None:
        check_same_loads(optimizer, backend(), "hk.broadcast_state")
    named = [(n, v) for n, v in named_variables(model, optimizer) if not isinstance(v, SlotSlice)]
    broadcast_variables(backend(), named, root_rank)


def scale_lr(base_lr: float, op: str = "average") -> float:
    """Step 5: the single-worker ``base_lr`` scaled for this job (times size; :func:`hvdkit.runtime.lr.scale_lr`)."""
    return scale_lr_for(base_lr, current(), op)


def set_learning_rate(optimizer, value: float) -> None:
    """Set the rate on Keras 3, tf-keras and LossScaleOptimizer alike."""
    optimizer.learning_rate = value


def get_learning_rate(optimizer) -> float:
    return float(optimizer.learning_rate.numpy() if hasattr(optimizer.learning_rate, "numpy")
                 else optimizer.learning_rate)
