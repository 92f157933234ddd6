"""Test hook: TensorFlow's device list, asked with no device type, also shows one GPU; nothing else changes.

That is the one question Keras 3 asks when it resolves ``jit_compile="auto"``
(``Trainer._resolve_auto_jit_compile``): on a GPU machine the answer holds a GPU,
and Keras compiles fit's train step with XLA. With this directory first on
PYTHONPATH, a shipped script runs unmodified as it would there, on this CPU
machine. hvdkit's own questions name the type ("GPU") and still get the truth, so
no rank pins a GPU that is not there.
"""

import importlib.abc
import importlib.machinery
import sys

TARGET = "tensorflow.python.framework.config"


def _patch(module):
    real = module.list_physical_devices

    def list_physical_devices(device_type=None):
        devices = real(device_type)
        if device_type is None:
            devices = [*devices, module.context.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")]
        return devices

    module.list_physical_devices = list_physical_devices


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
