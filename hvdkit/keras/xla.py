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
import logging

from hvdkit.common.errors import UserError
from hvdkit.keras.context import current

log = logging.getLogger("hvdkit.keras")

# The gradients the distributed optimizer was given while fit's compiled half was traced: (grads, variables).
_CAPTURED: contextvars.ContextVar[list | None] = contextvars.ContextVar("hvdkit_xla_captured", default=None)

XLA_FIX = ("Horovod's allreduce has no XLA kernel, so hk.DistributedOptimizer cannot apply gradients inside an "
           "XLA-compiled function: in fit, pass callbacks=hk.callbacks() (it compiles the forward and backward with "
           "XLA and averages outside), or compile(..., jit_compile=False); in a custom loop, compute the gradients "
           "in the tf.function(jit_compile=True) and call optimizer.apply_gradients outside it")


class XlaApplyError(UserError):
    """The distributed optimizer was asked to apply gradients inside an XLA-compiled function."""

    # Raised while TensorFlow traces the function: AutoGraph would rewrite the message to "in user code: File ...,
    # line ...: ..." over several lines; with this it passes the one line as it is.
    ag_pass_through = True


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
    """Raise the one-line :class:`XlaApplyError` where XLA would fail at run time on the allreduce."""
    if in_xla_context():
        raise XlaApplyError(XLA_FIX)


def split_train_step(model, keras) -> bool:
    """Make ``model``'s train function: the train step under XLA up to the gradients, the update outside.

    Does nothing (False) unless the model would compile its train step with
    XLA on TensorFlow (``jit_compile`` True, resolved or asked for, and not
    ``run_eagerly``). Called before ``fit`` makes its train function; an
    existing split function is kept. ``evaluate`` and ``predict`` keep XLA whole.
    A model whose class overrides ``train_step`` may do more after applying
    the gradients (clip the weights, run another pass) than the split could
    keep in its place: its step runs without XLA, and one line says so.
    """
    if getattr(model, "run_eagerly", False) or not model.jit_compile:
        return False
    if getattr(model.train_function, "hvdkit_xla_split", None) is not None:
        return True
    import tensorflow as tf

    own_step = "train_step" not in vars(model) and type(model).train_step is keras.Model.train_step
    if not own_step:
        if current().is_main:
            log.warning("hvdkit: %s overrides train_step, whose work after apply_gradients hvdkit cannot keep in its "
                        "place if the step is compiled up to the gradients only: fit runs this model's step without "
                        "XLA (Horovod's allreduce has no XLA kernel); compile(..., jit_compile=False) turns XLA off "
                        "yourself and silences this line", type(model).__name__)
        _make_train_function(model, None)
        model.train_function.hvdkit_xla_split = False
        return True

    step = model.train_step
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

    _make_train_function(model, train_step)
    model.train_function.hvdkit_xla_split = True
    return True


def _make_train_function(model, train_step) -> None:
    """Keras's own train function with XLA off around ``train_step`` (the model's own where None).

    Keras reads ``jit_compile`` and ``train_step`` when it makes the function;
    both are put back afterwards, so ``evaluate`` and ``predict`` compile with XLA.
    """
    wanted = model.jit_compile
    model.jit_compile = False
    if train_step is not None:
        model.train_step = train_step
    try:
        model.make_train_function(force=True)
    finally:
        if train_step is not None:
            del model.train_step
        model.jit_compile = wanted
