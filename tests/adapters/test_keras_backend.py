import json
import os
import subprocess
import sys

import pytest

from hvdkit.keras.backend import BackendError, resolve_backend, use_backend

pytestmark = pytest.mark.adapters


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
