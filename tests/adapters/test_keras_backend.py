import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvdkit.keras.mode import BackendError, resolve_backend, use_backend

pytestmark = pytest.mark.adapters
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("env, expected", [
    ({}, "tensorflow"),
    ({"KERAS_BACKEND": "torch"}, "torch"),
    ({"KERAS_BACKEND": "tensorflow"}, "tensorflow"),
    ({"TF_USE_LEGACY_KERAS": "1", "KERAS_BACKEND": "torch"}, "tf_keras"),
    ({"TF_USE_LEGACY_KERAS": "0"}, "tensorflow"),
])
def test_resolve_backend(env, expected, tmp_path):
    env = {"KERAS_HOME": str(tmp_path), **env}
    assert resolve_backend(env) == expected


def test_keras_json_is_read_like_keras_does(tmp_path):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch"}))
    assert resolve_backend({"KERAS_HOME": str(tmp_path)}) == "torch"


def test_without_tensorflow_the_default_is_torch(tmp_path, monkeypatch):
    # The torch GPU image: no TensorFlow, no KERAS_BACKEND: Keras's own default would fail at import.
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a))
    assert resolve_backend({"KERAS_HOME": str(tmp_path)}) == "torch"
    assert resolve_backend({"KERAS_HOME": str(tmp_path), "KERAS_BACKEND": "tensorflow"}) == "tensorflow"


def test_a_keras_json_naming_a_framework_that_is_not_installed_is_passed_over(tmp_path, monkeypatch):
    # Keras writes keras.json naming TensorFlow on its first import; in the torch GPU venv that file made
    # hvdkit choose TensorFlow, and the Keras example stopped with "No module named 'tensorflow'".
    import importlib.util

    (tmp_path / "keras.json").write_text(json.dumps({"backend": "tensorflow"}))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a))
    assert resolve_backend({"KERAS_HOME": str(tmp_path)}) == "torch"
    # KERAS_BACKEND is the user's word: it is kept, and Keras's import names what is missing.
    assert resolve_backend({"KERAS_HOME": str(tmp_path), "KERAS_BACKEND": "tensorflow"}) == "tensorflow"


def test_the_keras_examples_keep_the_environments_backend(tmp_path):
    # The GPU image sets KERAS_BACKEND=torch; --backend used to default to tensorflow over it.
    for example in ("keras_mnist.py", "keras_elastic.py"):
        code = ("import sys, runpy; sys.argv = ['x']; "
                f"ns = runpy.run_path('examples/{example}', run_name='not_main'); "
                "import hvdkit.keras as hk; args = ns['parse_args'](); "
                "keras = hk.use_backend(args.backend); print(args.backend, keras.backend.backend())")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "KERAS_BACKEND": "torch", "KERAS_HOME": str(tmp_path),
                                   "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split()[-2:] == ["None", "torch"], (example, proc.stdout)


@pytest.mark.parametrize("name", ["jax", "numpy", "openvino"])
def test_unsupported_backends_name_the_fix(name, tmp_path):
    with pytest.raises(BackendError, match="KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch"):
        resolve_backend({"KERAS_BACKEND": name, "KERAS_HOME": str(tmp_path)})


def test_use_backend_sets_the_mode_keras_will_read(tmp_path):
    env = {"KERAS_HOME": str(tmp_path), "TF_USE_LEGACY_KERAS": "1"}
    with pytest.raises(BackendError, match="KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch"):
        use_backend("jax", env)     # refused before any Keras is imported
    assert env["KERAS_BACKEND"] == "jax" and "TF_USE_LEGACY_KERAS" not in env


def test_adapter_names_resolve_to_the_same_object_every_time():
    # hk.callbacks is a function, however often it is looked up and whatever was imported before.
    code = ("import hvdkit.keras as hk, hvdkit.keras.fit_callbacks\n"
            "a, b = hk.callbacks, hk.callbacks\n"
            "assert callable(a) and a is b, (a, b)\n"
            "assert {'callbacks', 'elastic', 'hvd', 'init'} <= set(dir(hk))\n"
            "assert hk.elastic.run is hk.elastic.run\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_without_tensorflow_or_keras_backend_keras_imports_on_torch(tmp_path):
    # .venv-gpu: no TensorFlow, no KERAS_BACKEND. hvdkit resolved torch but Keras, left to itself, took TensorFlow.
    # None in sys.modules: `import tensorflow` fails and importlib.util.find_spec says None, as when absent.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "TF_USE_LEGACY_KERAS")}
    env.update(KERAS_HOME=str(tmp_path), PYTHONPATH=f"{tmp_path}:{ROOT}")
    code = "import hvdkit.keras as hk; keras = hk.use_backend(None); print(keras.backend.backend())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "torch"


@pytest.mark.parametrize("threads, error", [("2", True), ("None", False)])
def test_threads_that_tensorflow_can_no_longer_take_are_an_error_not_ignored(tmp_path, threads, error):
    # Issue 38: once TensorFlow's runtime has started its thread count is fixed, and init(threads=2) was
    # silently ignored. The CPU default stays a best effort.
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS",)}
    env.update(KERAS_BACKEND="tensorflow", KERAS_HOME=str(tmp_path), PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    code = ("import tensorflow as tf; tf.constant(1.0) + 1\n"          # the runtime starts here
            "import hvdkit.keras as hk\n"
            f"try:\n    hk.init(threads={threads}); print('ok')\n"
            "except hk.UserError as exc:\n    print('error:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    if error:
        assert last.startswith("error: threads=2 cannot be applied: TensorFlow's runtime had already started"), last
        assert "call init() before any TensorFlow operation, or leave threads unset" in last
    else:
        assert last == "ok"


def test_tf_keras_refuses_sharded_optimizer_state_instead_of_ignoring_it(tmp_path):
    # tf-keras's optimizer is Horovod's own: shard_optimizer_state=True returned it unsharded, silently.
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", KERAS_HOME=str(tmp_path), PYTHONPATH=str(ROOT),
               TF_CPP_MIN_LOG_LEVEL="3")
    code = ("import hvdkit.keras as hk\n"
            "keras = hk.use_backend(None)\n"
            "hk.init()\n"
            "try:\n    hk.DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer_state=True); print('ok')\n"
            "except hk.UserError as exc:\n    print('error:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("error: shard_optimizer_state needs Keras 3") and "unset TF_USE_LEGACY_KERAS" in last, last


def test_keras_on_torch_seeds_tensorflow_when_imported_not_at_init(tmp_path):
    """keras.utils.set_random_seed imports TensorFlow wherever it is installed, to seed tf.data's shuffles; hk.init
    called it, so every Keras-on-torch rank imported TensorFlow (2.0 of 4.7 s of CPU to start and fit a small
    model). TensorFlow is now seeded when the script imports it, after a lookup that does not import it (torch's
    compiler looks it up)."""
    env = dict(os.environ, KERAS_BACKEND="torch", KERAS_HOME=str(tmp_path), PYTHONPATH=str(ROOT),
               TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_USE_LEGACY_KERAS", None)
    code = ("import sys\n"
            "import hvdkit.keras as hk\n"
            "keras = hk.use_backend('torch')\n"
            "hk.init(seed=7)\n"
            "print('after init', 'tensorflow' in sys.modules)\n"
            "from keras.src.utils.rng_utils import get_random_seed\n"
            "print('keras seed', get_random_seed())\n"       # what Keras's own set_random_seed records
            "hk.seed_everything(8)\n"
            "finders = [f for f in sys.meta_path if type(f).__name__ == '_SeedTensorFlowWhenImported']\n"
            "print('finders', len(finders), finders[0].seed)\n")
    # A fresh process for the import: draws from TensorFlow seeded by hk.init against tf.random.set_seed(7)'s.
    code_tf = ("import importlib.util, sys\n"
               "import hvdkit.keras as hk\n"
               "keras = hk.use_backend('torch')\n"
               "hk.init(seed=7)\n"
               "importlib.util.find_spec('tensorflow')\n"
               "print('after a lookup', 'tensorflow' in sys.modules)\n"
               "import tensorflow as tf\n"
               "seeded = tf.random.uniform([3]).numpy().tolist()\n"
               "tf.random.set_seed(7)\n"
               "print('seeded at import', seeded == tf.random.uniform([3]).numpy().tolist())\n"
               "print('finder left', any(type(f).__name__ == '_SeedTensorFlowWhenImported' for f in sys.meta_path))\n")
    lines = []
    for source in (code, code_tf):
        proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=300, env=env,
                              cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines += [line for line in proc.stdout.splitlines() if line]
    assert lines == ["after init False", "keras seed 7", "finders 1 8", "after a lookup False", "seeded at import True",
                     "finder left False"], lines
