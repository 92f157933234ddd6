"""hvdkit: Horovod data-parallel training for today's PyTorch and Keras.

Framework adapters live in :mod:`hvdkit.torch` and :mod:`hvdkit.keras`; the
framework-neutral core (environment report, launch planning, ...) lives in
:mod:`hvdkit.core` and imports neither torch nor tensorflow.
"""

__version__ = "0.1.0"
