import gzip
import struct

import numpy as np
import pytest

from hvdkit.examples.datasets import DatasetError, load_dataset, read_idx

pytestmark = pytest.mark.unit


def write_idx(path, array):
    codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}
    header = bytes([0, 0, codes[array.dtype], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def test_digits_is_real_offline_data_at_28x28():
    d = load_dataset("digits")
    assert d.x_train.shape[1:] == (28, 28) and d.x_train.dtype == np.float32
    assert len(d.x_train) + len(d.x_test) == 1797
    assert 0.0 <= d.x_train.min() and d.x_train.max() <= 1.0
    assert set(np.unique(d.y_train)) == set(range(10))
    # The split is fixed by the seed: every rank sees the same split.
    again = load_dataset("digits")
    assert np.array_equal(d.y_test, again.y_test)


SCIPY_DIGITS_SHA256 = "e020c79bf5cabe8082357c80439863d84214f076bce34709bf67be407d067ae3"


def test_digits_need_numpy_alone():
    """The bundled file, read with numpy: no scikit-learn or SciPy import (1.4 s for every rank of every example,
    and Keras imports scikit-learn whenever it is installed), the same pixels scipy.ndimage.zoom(order=1) gave."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['sklearn'] = sys.modules['scipy'] = None\n"
            "import hashlib, numpy as np\n"
            "from hvdkit.examples.datasets import load_dataset\n"
            "d = load_dataset('digits'); print(d.x_train.shape, d.x_test.shape, "
            "hashlib.sha256(np.concatenate([d.x_train, d.x_test]).tobytes()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    # The digest of scikit-learn's digits through scipy.ndimage.zoom(order=1), split with seed 0 (the old loader).
    assert out.stdout.split() == ["(1438,", "28,", "28)", "(359,", "28,", "28)", SCIPY_DIGITS_SHA256], out.stdout


def test_digits_upsampling_interpolates_linearly_between_aligned_corners():
    from hvdkit.examples.datasets import upsample_bilinear

    ramp = np.arange(8, dtype=np.float64)[None, :] * np.ones((8, 1))        # 0..7 across each row
    big = upsample_bilinear(ramp[None], 28)[0]
    assert big.shape == (28, 28)
    assert np.allclose(big[0], np.arange(28) * 7 / 27) and np.allclose(big[:, 5], big[0, 5])
    assert big[0, 0] == 0.0 and big[-1, -1] == 7.0


@pytest.mark.parametrize("name", ["x.idx", "x.idx.gz"])
def test_idx_round_trip(tmp_path, name):
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / name, images)
    assert np.array_equal(read_idx(str(tmp_path / name)), images)


def test_mnist_from_local_idx_files(tmp_path):
    rng = np.random.default_rng(1)
    for stem, arr in {
        "train-images-idx3-ubyte": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, 6, dtype=np.uint8),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, 3, dtype=np.uint8),
    }.items():
        write_idx(tmp_path / stem, arr)
    d = load_dataset("mnist", str(tmp_path), download=False)
    assert d.x_train.shape == (6, 28, 28) and d.x_test.shape == (3, 28, 28)
    assert d.x_train.max() <= 1.0


def test_truncated_idx_is_reported(tmp_path):
    images = np.zeros((4, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "x.idx", images)
    data = (tmp_path / "x.idx").read_bytes()
    (tmp_path / "x.idx").write_bytes(data[:-100])
    with pytest.raises(DatasetError, match="truncated"):
        read_idx(str(tmp_path / "x.idx"))


def test_missing_mnist_without_download_says_what_to_do(tmp_path):
    with pytest.raises(DatasetError, match="--dataset digits"):
        load_dataset("mnist", str(tmp_path), download=False)


def test_unknown_dataset_lists_choices():
    with pytest.raises(DatasetError, match="digits, mnist, synthetic"):
        load_dataset("cifar")


def test_data_dir_that_is_a_file_is_named(tmp_path):
    (tmp_path / "mnist").write_text("not a folder")
    with pytest.raises(DatasetError, match="is a file, not a folder"):
        load_dataset("mnist", str(tmp_path / "mnist"))


def test_gz_that_is_not_gzip_is_reported(tmp_path):
    (tmp_path / "x.gz").write_bytes(b"<html>not gzip</html>")
    with pytest.raises(DatasetError, match="cannot read .*x.gz .*Not a gzipped file.*re-download"):
        read_idx(str(tmp_path / "x.gz"))


def test_cut_off_gz_is_reported(tmp_path):
    write_idx(tmp_path / "x.gz", np.arange(1000, dtype=np.uint8))
    data = (tmp_path / "x.gz").read_bytes()
    (tmp_path / "x.gz").write_bytes(data[:len(data) // 2])
    with pytest.raises(DatasetError, match="cannot read .*x.gz"):
        read_idx(str(tmp_path / "x.gz"))


def test_data_dir_that_cannot_be_created_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetError, match="cannot create data dir .*choose a writable --data-dir"):
        load_dataset("mnist", str(tmp_path / "file" / "mnist"))
