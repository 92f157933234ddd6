"""Keras's XLA train step on TensorFlow, with Horovod's collectives kept outside the compiled part.

On a machine with a GPU, Keras 3 resolves ``compile(jit_compile="auto")`` to
True (``Trainer._resolve_auto_jit_compile``), and ``fit`` compiles the whole
train step, optimizer included, with XLA. Horovod's allreduce and the
straggler timer's ``tf.timestamp`` have no XLA kernel (horovod/horovod#2590;
Horovod's XLA ops are compiled out, patch item 2), so that step fails at its
first call. :func:`split_train_step` makes ``fit``'s step two functions
instead: the model's forward, loss, metrics and backward compiled with XLA,
then the distributed optimizer's allreduce and update, in the same graph,
outside XLA. ``hk.callbacks()`` installs it; the weights and metrics are those
of the one-function step.

Example::

    model.compile(optimizer=hk.DistributedOptimizer(opt), loss=..., jit_compile=True)
    model.fit(x, y, callbacks=hk.callbacks())     # the forward and backward run as XLA clusters
"""

from __future__ import annotations

import contextvars

from hvdkit.common.errors import UserError

# The gradients the distributed optimizer was given while fit's compiled half was traced: (grads, variables).
_CAPTURED: contextvars.ContextVar[list | None] = contextvars.ContextVar("hvdkit_xla_captured", default=None)

XLA_FIX = ("Horovod's allreduce has no XLA kernel, so hk.DistributedOptimizer cannot apply gradients inside an "
           "XLA-compiled function: in fit, pass callbacks=hk.callbacks() (it compiles the forward and backward with "
           "XLA and averages outside), or compile(..., jit_compile=False); in a custom loop, compute the gradients "
           "in the tf.function(jit_compile=True) and call optimizer.apply_gradients outside it")


def captured(grads, trainable_variables) -> bool:
    """In fit's compiled half: keep the gradients for the half outside XLA, and say so (True)."""
    out = _CAPTURED.get()
    if out is None:
        return False
    out.append((list(grads), trainable_variables))
    return True


def in_xla_context() -> bool:
    """Whether TensorFlow is tracing a function that XLA must compile (``tf.function(jit_compile=True)``)."""
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def refuse_inside_xla() -> None:
    """Raise the one-line :class:`UserError` where XLA would fail at run time on the allreduce."""
    if in_xla_context():
        raise UserError(XLA_FIX)


def split_train_step(model) -> bool:
    """Make ``model``'s train function: the train step under XLA up to the gradients, the update outside.

    Does nothing (False) unless the model would compile its train step with
    XLA on TensorFlow (``jit_compile`` True, resolved or asked for, and not
    ``run_eagerly``). Called before ``fit`` makes its train function; an
    existing split function is kept. ``evaluate`` and ``predict`` keep XLA whole.
    """
    if getattr(model, "run_eagerly", False) or not model.jit_compile:
        return False
    if getattr(model.train_function, "hvdkit_xla_split", False):
        return True
    import tensorflow as tf

    step = type(model).train_step.__get__(model)      # the model's own step (a subclass's override included)
    applied: dict = {}

    def forward_backward(data):
        token = _CAPTURED.set([])
        try:
            logs = step(data)
            gradients = _CAPTURED.get()
        finally:
            _CAPTURED.reset(token)
        if len(gradients) > 1:
            raise UserError(f"the train step applied gradients {len(gradients)} times; hvdkit's XLA step averages "
                            "one apply a step: compile(..., jit_compile=False) for a step that applies several")
        applied["variables"] = gradients[0][1] if gradients else None
        return logs, (gradients[0][0] if gradients else [])

    compiled = tf.function(forward_backward, jit_compile=True, reduce_retracing=True)

    def train_step(data):
        logs, grads = compiled(data)
        if applied["variables"] is not None:
            model.optimizer.apply(grads, applied["variables"])
        return logs

    # Keras reads jit_compile and train_step when it makes the function: the outer function is not XLA's.
    wanted = model.jit_compile
    model.jit_compile = False
    model.train_step = train_step
    try:
        model.make_train_function(force=True)
    finally:
        del model.train_step
        model.jit_compile = wanted
    model.train_function.hvdkit_xla_split = True
    return True
