"""Which Keras hvdkit is serving, decided before Keras is imported.

Three modes: Keras 3 on TensorFlow (``"tensorflow"``), Keras 3 on PyTorch
(``"torch"``), and legacy tf-keras (``"tf_keras"``, when
``TF_USE_LEGACY_KERAS=1``). Horovod has no JAX (or NumPy/OpenVINO) binding.

Example::

    resolve_backend({"KERAS_BACKEND": "torch"})   # "torch"
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from hvdkit.common.errors import UserError


class BackendError(UserError):
    """Keras is configured for a backend Horovod cannot serve."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


def _keras_json_backend(env: Mapping[str, str]) -> str | None:
    home = env.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as f:
            return json.load(f).get("backend")
    except (OSError, ValueError):
        return None


def resolve_backend(env: Mapping[str, str] | None = None) -> str:
    """The hvdkit Keras mode for this environment, or :class:`BackendError` naming the fix.

    Follows Keras's own order: ``KERAS_BACKEND``, then ``~/.keras/keras.json``,
    then TensorFlow, where Keras would fail at import when TensorFlow is not
    installed and hvdkit takes PyTorch (the torch GPU image has no TensorFlow).
    A ``keras.json`` naming a framework that is not installed is passed over
    (Keras writes one naming TensorFlow on its first import, in any environment).
    ``TF_USE_LEGACY_KERAS=1`` selects tf-keras, as in TensorFlow.
    """
    env = os.environ if env is None else env
    if _truthy(env.get("TF_USE_LEGACY_KERAS")):
        return "tf_keras"
    name = env.get("KERAS_BACKEND")
    if not name:
        # Keras writes keras.json naming TensorFlow on its first import, wherever it runs: a file that an earlier
        # run left in a torch-only environment (the torch GPU image) must not make Keras fail there.
        name = _keras_json_backend(env)
        if name in ("tensorflow", "torch") and not _installed(name):
            name = None
        name = name or installed_backend()
    if name in ("tensorflow", "torch"):
        return name
    raise BackendError(
        f"Keras backend {name!r} is not supported: Horovod has collectives for TensorFlow and PyTorch only; "
        "set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch (or TF_USE_LEGACY_KERAS=1 for tf-keras)"
    )


def _installed(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):       # a broken or half-removed install counts as absent
        return False


def installed_backend() -> str:
    """TensorFlow when it is installed, else PyTorch: Keras's default, but the one that imports."""
    return "tensorflow" if _installed("tensorflow") or not _installed("torch") else "torch"


def keras_module(mode: str):
    """The Keras package for ``mode`` (``tf_keras`` for the legacy mode)."""
    if mode == "tf_keras":
        try:
            import tf_keras as keras
        except ImportError as exc:
            raise ImportError(f"TF_USE_LEGACY_KERAS=1 needs tf-keras ({exc}): run scripts/install.sh, "
                              "which pins tf-keras to the TensorFlow version") from exc
        return keras
    import sys

    if "keras" not in sys.modules:
        # Keras would take TensorFlow when KERAS_BACKEND is unset: give it the mode resolved here (torch
        # where TensorFlow is not installed, see installed_backend).
        os.environ.setdefault("KERAS_BACKEND", mode)
    import keras

    if keras.backend.backend() != mode:
        raise BackendError(f"keras was imported with backend {keras.backend.backend()!r} before hvdkit "
                           f"resolved {mode!r}: set KERAS_BACKEND before importing keras")
    return keras


def use_backend(mode: str | None, env: dict | None = None):
    """Choose the Keras mode, then import and return that Keras (``keras``, or ``tf_keras``).

    Keras reads its backend once, at its first import, so a script that takes
    the backend as an option calls this before anything imports Keras::

        keras = hk.use_backend(args.backend)   # "tensorflow", "torch" or "tf_keras"

    ``None`` keeps the environment's choice (:func:`resolve_backend`): the
    image's ``KERAS_BACKEND``, else the framework that is installed.
    """
    env = os.environ if env is None else env
    if mode is None:
        return keras_module(resolve_backend(env))
    if mode == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    else:
        env["KERAS_BACKEND"] = mode
        env.pop("TF_USE_LEGACY_KERAS", None)
    return keras_module(resolve_backend(env))
