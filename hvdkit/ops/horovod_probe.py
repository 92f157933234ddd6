"""Ask the installed Horovod how it was built; prints one JSON object.

Run as ``python -m hvdkit.ops.horovod_probe``. It lives in its own process so
that the report never imports a framework into the caller, and a broken
extension (the classic "undefined symbol" after a framework upgrade) shows up
as an error string instead of a crash.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
import sys

from hvdkit.ops.cuda_arches import fatbin_arches

# The frameworks hvdkit builds Horovod for, with the extension library each loads (torch first: it imports
# faster than TensorFlow, and any one answers for the controllers and operations).
EXTENSIONS = {
    "torch": ("horovod.torch", "mpi_lib_v2"),
    "tensorflow": ("horovod.tensorflow", "mpi_lib"),
}


def probe() -> dict:
    try:
        import horovod
        from horovod.common.util import get_extension_full_path
    except ImportError as exc:
        return {"installed": False, "error": str(exc)}

    root = os.path.dirname(horovod.__file__)
    frameworks = {}
    for name, (module, lib) in EXTENSIONS.items():
        pkg_dir = os.path.join(root, module.split(".")[1])
        frameworks[name] = os.path.exists(get_extension_full_path(os.path.join(pkg_dir, "x.py"), lib))

    result = {"installed": True, "version": horovod.__version__, "frameworks": frameworks}
    # Controllers and tensor operations are compiled into every extension
    # alike; ask the lightest one that exists (torch imports faster than TF).
    for name in EXTENSIONS:
        if not frameworks[name]:
            continue
        try:
            ext = importlib.import_module(EXTENSIONS[name][0])
            nccl = int(ext.nccl_built())
            result.update(
                controllers={"mpi": bool(ext.mpi_built()), "gloo": bool(ext.gloo_built())},
                tensor_operations={
                    "nccl": bool(nccl),
                    "ddl": bool(ext.ddl_built()),
                    "ccl": bool(ext.ccl_built()),
                    "mpi": bool(ext.mpi_built()),
                    "gloo": bool(ext.gloo_built()),
                },
                nccl_version=_nccl_version_string(nccl) if nccl else None,
                cuda_built=bool(ext.cuda_built()),
            )
            break
        except Exception as exc:  # report, don't crash: this is a diagnostic tool
            result.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
    if result.get("cuda_built"):
        # Any framework's library carries the same kernels; the first one built answers.
        built = [get_extension_full_path(os.path.join(root, EXTENSIONS[n][0].split(".")[1], "x.py"), EXTENSIONS[n][1])
                 for n in EXTENSIONS if frameworks[n]]
        try:
            arches = fatbin_arches(built[0])
            if arches is not None:
                result["cuda_arches"] = {"sass": list(arches.sass), "ptx": list(arches.ptx)}
        except (OSError, ValueError, IndexError, struct.error) as exc:  # report, don't crash: this is a diagnostic tool
            result.setdefault("errors", {})["cuda_arches"] = f"{type(exc).__name__}: {exc}"
    if frameworks["torch"]:
        try:
            result["torch_cxx_standard"] = _torch_cxx_standard()
        except Exception as exc:  # report, don't crash: this is a diagnostic tool
            result.setdefault("errors", {})["torch"] = f"{type(exc).__name__}: {exc}"
    return result


# __cplusplus values -> the standard's name.
CXX_STANDARDS = {201402: "C++14", 201703: "C++17", 202002: "C++20", 202302: "C++23"}


def _torch_cxx_standard() -> str | None:
    """The C++ standard Horovod's torch module was compiled with, as the module itself reports it.

    hvdkit's patch exports ``horovod_torch_cplusplus()`` (the compiler's
    ``__cplusplus``); a Horovod built without the patch has no such function.
    """
    from horovod.torch import mpi_lib_v2

    fn = getattr(mpi_lib_v2, "horovod_torch_cplusplus", None)
    if fn is None:
        return None
    value = int(fn())
    return CXX_STANDARDS.get(value, f"__cplusplus={value}")


def _nccl_version_string(code: int) -> str:
    """NCCL_VERSION_CODE is major*10000 + minor*100 + patch since NCCL 2.9."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


if __name__ == "__main__":
    json.dump(probe(), sys.stdout)
