"""One :class:`hvdkit.runtime.backend.Backend` per framework whose tensors Horovod reduces.

``torch`` serves :mod:`hvdkit.torch` and Keras 3 on PyTorch; ``tensorflow``
serves Keras 3 on TensorFlow and tf-keras. Importing this package imports
neither framework nor Horovod; each module does, when it is imported.
"""


def import_horovod(module: str, adapter: str):
    """``module`` of Horovod, or an ImportError that says how to build it."""
    try:
        return __import__(module, fromlist=["init"])
    except ImportError as exc:
        raise ImportError(f"{adapter} needs {module} ({exc}): run scripts/install.sh (or `make install`), "
                          "which builds Horovod 0.28.1 against this framework") from exc
