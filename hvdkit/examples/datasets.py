"""The example datasets, as numpy arrays shaped (N, 28, 28) float32 in [0, 1] and int64 labels.

- ``digits``: the UCI handwritten digits (1,797 real 8x8 scans, shipped in
  ``digits.npz``), upsampled to 28x28. Works offline; the demo's default.
- ``mnist``: the standard IDX files from ``data_dir`` (gzipped or not),
  downloaded there when absent and the machine is online.
- ``synthetic``: seeded random images for throughput runs.

Example::

    data = load_dataset("digits")
    data.x_train.shape   # (1438, 28, 28)
"""

from __future__ import annotations

import gzip
import os
import struct
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass

import numpy as np

from hvdkit.common.errors import UserError

DATASETS = ("digits", "mnist", "synthetic")

# The files torchvision reads; the first mirror that answers is used.
MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)


class DatasetError(UserError):
    """A dataset cannot be loaded; the message says how to fix it."""


@dataclass
class Dataset:
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_dataset(name: str, data_dir: str = "data", *, synthetic_size: int = 8192,
                 seed: int = 0, download: bool = True) -> Dataset:
    """Load one of :data:`DATASETS`; raises :class:`DatasetError` naming the fix."""
    if name == "digits":
        return load_digits(seed=seed)
    if name == "mnist":
        return load_mnist(data_dir, download=download)
    if name == "synthetic":
        return load_synthetic(synthetic_size, seed=seed)
    raise DatasetError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")


DIGITS_FILE = os.path.join(os.path.dirname(__file__), "digits.npz")


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """The UCI handwritten digits, bilinearly upsampled from 8x8 to 28x28, split by a fixed seed.

    ``digits.npz`` beside this file holds the 1,797 scans as scikit-learn bundles them: the test set of
    E. Alpaydin and C. Kaynak's "Optical Recognition of Handwritten Digits", UCI Machine Learning
    Repository, https://doi.org/10.24432/C50P49, CC BY 4.0; pixels 0..16. Reading it takes numpy alone:
    scikit-learn's loader cost every rank of every example 1.4 s of imports here (and scikit-learn plus
    SciPy in the install), and Keras imports scikit-learn whenever it is installed."""
    try:
        with np.load(DIGITS_FILE) as bundle:
            raw, labels = bundle["images"], bundle["labels"].astype(np.int64)
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"cannot read the bundled digits ({DIGITS_FILE}: {exc}): reinstall hvdkit") from None
    images = upsample_bilinear(raw / 16.0, 28).clip(0.0, 1.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = int(round(len(images) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset("digits", images[train], labels[train], images[test], labels[test])


def upsample_bilinear(images: np.ndarray, size: int) -> np.ndarray:
    """(N, h, w) to (N, size, size) by linear interpolation with the corners aligned (scipy.ndimage.zoom's
    order=1: output pixel i samples the input at i * (h - 1) / (size - 1))."""
    def weights(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        at = np.arange(size, dtype=np.float64) * (n - 1) / (size - 1)
        low = np.minimum(np.floor(at).astype(np.int64), n - 2)
        return low, low + 1, at - low

    r0, r1, rf = weights(images.shape[1])
    c0, c1, cf = weights(images.shape[2])
    rows = images[:, r0, :] * (1 - rf)[None, :, None] + images[:, r1, :] * rf[None, :, None]
    return rows[:, :, c0] * (1 - cf)[None, None, :] + rows[:, :, c1] * cf[None, None, :]


def load_synthetic(size: int, seed: int = 0, test_size: int | None = None) -> Dataset:
    rng = np.random.default_rng(seed)
    test_size = test_size or max(size // 8, 1)
    x = rng.random((size + test_size, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, size + test_size, dtype=np.int64)
    return Dataset("synthetic", x[:size], y[:size], x[size:], y[size:])


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (the MNIST format), plain or gzipped, into a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:   # also gzip's BadGzipFile and a cut-off .gz
        raise DatasetError(f"cannot read {path} ({exc}): re-download it or delete it") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DatasetError(f"{path} is not an IDX file (bad magic number): re-download it or delete it")
    dtype = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}.get(raw[2])
    if dtype is None:
        raise DatasetError(f"{path} has unknown IDX type code {raw[2]:#x}: re-download it")
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise DatasetError(f"{path} is truncated ({data.size} of {int(np.prod(shape))} values): delete it and "
                           "re-download")
    return data.reshape(shape)


def _find_idx(data_dir: str, stem: str) -> str | None:
    raw = os.path.join("MNIST", "raw", stem)
    for candidate in (stem, stem + ".gz", raw, raw + ".gz"):
        path = os.path.join(data_dir, candidate)
        if os.path.exists(path):
            return path
    return None


def download_mnist(data_dir: str, timeout: float = 30.0) -> None:
    """Fetch the four gzipped IDX files into ``data_dir``; raises DatasetError when offline."""
    try:
        os.makedirs(data_dir, exist_ok=True)
    except OSError as exc:
        raise DatasetError(f"cannot create data dir {data_dir!r} ({exc.strerror}): "
                           "choose a writable --data-dir") from None
    for stem in MNIST_FILES.values():
        if _find_idx(data_dir, stem):
            continue
        target = os.path.join(data_dir, stem + ".gz")
        errors = []
        for mirror in MNIST_MIRRORS:
            try:
                with urllib.request.urlopen(mirror + stem + ".gz", timeout=timeout) as resp:
                    payload = resp.read()
                tmp = f"{target}.{os.getpid()}.part"   # ranks on one host may download at once
                with open(tmp, "wb") as f:
                    f.write(payload)
                os.replace(tmp, target)
                break
            except (urllib.error.URLError, OSError) as exc:
                errors.append(f"{mirror}: {exc}")
        else:
            raise DatasetError(
                f"MNIST is not in {data_dir!r} and could not be downloaded ({errors[-1]}): "
                f"copy the four IDX files ({', '.join(MNIST_FILES.values())}, optionally .gz) there, "
                "or use --dataset digits, which works offline"
            )


def load_mnist(data_dir: str, download: bool = True) -> Dataset:
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise DatasetError(f"data dir {data_dir!r} is a file, not a folder: "
                           "point --data-dir at the folder that holds (or will hold) the MNIST IDX files")
    missing = [stem for stem in MNIST_FILES.values() if _find_idx(data_dir, stem) is None]
    if missing:
        if not download:
            raise DatasetError(
                f"MNIST files missing from {data_dir!r}: {', '.join(missing)}; "
                "copy them there (or allow download), or use --dataset digits"
            )
        download_mnist(data_dir)
    arrays = {key: read_idx(_find_idx(data_dir, stem)) for key, stem in MNIST_FILES.items()}
    return Dataset(
        "mnist",
        (arrays["x_train"].astype(np.float32) / 255.0),
        arrays["y_train"].astype(np.int64),
        (arrays["x_test"].astype(np.float32) / 255.0),
        arrays["y_test"].astype(np.int64),
    )
