"""hvdkit: Horovod data-parallel training for today's PyTorch and Keras.

Framework adapters live in :mod:`hvdkit.torch` and :mod:`hvdkit.keras`. Below
them, importing no framework: :mod:`hvdkit.runtime` (what runs in every rank),
:mod:`hvdkit.ops` (what runs on the launching machine) and :mod:`hvdkit.common`
(what both use). docs/ARCHITECTURE.md draws the layers.
"""

__version__ = "0.1.0"
