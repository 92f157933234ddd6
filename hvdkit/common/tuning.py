"""The Horovod (and Open MPI) settings hvdkit's ``init()`` sets when the user has not, and why.

Each choice comes from ``hvdkit bench`` runs recorded in docs/BENCHMARKS.md.
Anything already in the environment (``OMPI_MCA_mpi_yield_when_idle=0``,
say) wins, as do horovodrun's flags (``--cycle-time-ms`` sets
``HOROVOD_CYCLE_TIME``; ``--autotune`` leaves the fusion threshold and cycle
time to Horovod's autotuner). Each default is set only where it was
measured: on CPU, and the fusion threshold and cycle time only under MPI
(the cycle time only when every rank is on one host); across CPU hosts a
waiting rank sleeps instead of spinning (``HOROVOD_BLOCKING_WAIT=1``). On GPU
hosts Horovod's own defaults stay.

Example::

    apply_horovod_defaults(on_gpu=False, controller="mpi", one_host=True)   # before hvd.init()
    check_horovod_environment()               # UserError for HOROVOD_CYCLE_TIME=abc and the like
"""

from __future__ import annotations

import os
import re

from hvdkit.common.errors import UserError

# Why each default, in short (the measurements, with machines, runs and raw files, are docs/BENCHMARKS.md's
# Tuning table and docs/bench/cycle/, docs/bench/fusion/):
# - HOROVOD_CYCLE_TIME 0.1 ms under MPI on one host: the allreduce gains (16 MiB 75% -> 100% of mpi4py-avg's
#   bandwidth) and, with the yield below, the step does not lose. Under Gloo a short cycle costs the background
#   thread CPU, and across hosts 0.2 ms did not clearly beat 1 ms, so both keep Horovod's 1 ms. Idle, an MPI rank
#   costs 0.09-0.15 of a core at 0.1 ms (a 2-rank job used 1.1 cores between its ranks before patch item 23).
# - OMPI_MCA_mpi_yield_when_idle=1 on CPU: Open MPI spins while it waits and Horovod's background thread shares the
#   cores with the training threads (ResNet-50 step 965-1160 ms spinning, 716-871 ms yielding). Not on GPU hosts.
# - HOROVOD_FUSION_THRESHOLD 1 MiB on CPU under MPI: pieces that stay in cache (ResNet-50's 161 gradients 1.90x
#   mpi4py's time at Horovod's 128 MiB, 1.00x at 1 MiB). Gloo's ring pays a cost per operation that small pieces
#   would multiply, and NCCL is tuned for large buffers, so both keep Horovod's.
# - HOROVOD_BLOCKING_WAIT=1 on CPU across hosts (patch item 11): a rank waiting on the network sleeps instead of
#   spinning on sched_yield, which took a core from the threads moving its data (3 hosts, 64 MiB: 1802 -> 1510 ms).
# Controller: see hvdkit.ops.launch.choose_controller (MPI on one host or with NCCL, Gloo across CPU hosts).
# Threads: see hvdkit.runtime.topology.cpu_threads_per_rank (cores / local ranks).


# Horovod parses its numeric knobs with strtol/strtod and no check, so a typo
# becomes 0: HOROVOD_CYCLE_TIME=abc is a 0 ms cycle (a spinning background
# thread), HOROVOD_STALL_CHECK_DISABLE=true is "0" (not disabled).
# name -> (what it is, an example value)
NUMBER_SETTINGS = {
    "HOROVOD_CYCLE_TIME": ("milliseconds between negotiation cycles", "1"),
    "HOROVOD_FUSION_THRESHOLD": ("bytes in the fusion buffer", "67108864"),
    "HOROVOD_CACHE_CAPACITY": ("entries in the response cache", "1024"),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("seconds before a stall is reported", "60"),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("seconds before a stalled job is shut down", "0"),
    "HOROVOD_GLOO_TIMEOUT_SECONDS": ("seconds Gloo waits to connect", "30"),
    "HOROVOD_NUM_NCCL_STREAMS": ("NCCL streams per device", "1"),
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": ("samples discarded before autotuning", "3"),
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": ("steps per autotune sample", "10"),
}
FLAG_SETTINGS = ("HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_STALL_MISMATCH_SHUTDOWN", "HOROVOD_HIERARCHICAL_ALLREDUCE",
                 "HOROVOD_HIERARCHICAL_ALLGATHER",
                 "HOROVOD_AUTOTUNE", "HOROVOD_TIMELINE_MARK_CYCLES", "HOROVOD_DISABLE_GROUP_FUSION",
                 "HOROVOD_ENABLE_XLA_OPS", "HOROVOD_BLOCKING_WAIT")
# Horovod throws in hvd.init() for any other value, an empty one included.
CHOICE_SETTINGS = {"HOROVOD_CONTROLLER": ("mpi", "gloo"), "HOROVOD_CPU_OPERATIONS": ("mpi", "gloo", "ccl")}
_INTEGER = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CACHE_CAPACITY", "HOROVOD_NUM_NCCL_STREAMS",
            "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE")


def check_horovod_environment(environ=os.environ) -> None:
    """Raise :class:`UserError` for a Horovod setting Horovod would silently misread (see above).

    An empty value counts as unset; numbers are accepted as Horovod reads them
    (``1e-3`` ms for the cycle time, ``16777216.0`` bytes from a YAML config).
    """
    errors = horovod_setting_errors(environ)
    if errors:
        raise UserError(next(iter(errors.values())))


def horovod_setting_errors(environ=os.environ) -> dict[str, str]:
    """Every Horovod setting Horovod would misread, name -> the line :func:`check_horovod_environment` raises.

    ``hvdkit env`` shows them all; ``hvdkit launch`` and ``init()`` stop at the first::

        horovod_setting_errors({"HOROVOD_FUSION_THRESHOLD": "lots"})
        # {'HOROVOD_FUSION_THRESHOLD': "HOROVOD_FUSION_THRESHOLD='lots' is not a whole number >= 0 (...)..."}
    """
    errors = {}
    for name, (meaning, example) in NUMBER_SETTINGS.items():
        value = (environ.get(name) or "").strip()
        if not value:
            continue
        if name in _INTEGER or name.endswith("_SECONDS"):
            ok, kind = re.fullmatch(r"\d+(\.0*)?", value) is not None, "a whole number"
        else:
            try:
                ok, kind = 0 <= float(value) < float("inf"), "a number"
            except ValueError:
                ok, kind = False, "a number"
        if not ok:
            errors[name] = (f"{name}={value!r} is not {kind} >= 0 ({meaning}); Horovod would read it as 0: "
                            f"set e.g. {name}={example}, or unset it")
    for name in FLAG_SETTINGS:
        value = (environ.get(name) or "").strip()
        if value and not value.isdigit():
            errors[name] = (f"{name}={value!r} is not 0 or 1 (Horovod reads only the leading digits, so "
                            f"'true' means off): set {name}=1 or {name}=0")
    for name, allowed in CHOICE_SETTINGS.items():
        value = environ.get(name)
        if value is not None and value.lower() not in allowed:   # Horovod compares exactly (strcasecmp)
            errors[name] = (f"{name}={value!r} is not one of {', '.join(allowed)} (Horovod would stop in "
                            f"hvd.init() with 'Unsupported ... type'): set {name}={allowed[1]}, or unset it")
    return errors


CPU_FUSION_THRESHOLD = 1 << 20
CPU_MPI_CYCLE_TIME_MS = "0.1"


def horovod_controller(environ=os.environ, mpi_built: bool = True) -> str:
    """The controller ``hvd.init()`` will pick: Gloo when asked for (horovodrun --gloo, elastic) or without MPI."""
    asked = environ.get("HOROVOD_CONTROLLER", "").lower()
    if asked in ("mpi", "gloo"):
        return asked
    return "mpi" if mpi_built else "gloo"


def horovod_defaults(on_gpu: bool, controller: str, one_host: bool, autotune: bool = False) -> dict[str, str]:
    """The variables hvdkit would set, before looking at the environment (see the measurements above)."""
    if on_gpu:
        return {}
    defaults = {"OMPI_MCA_mpi_yield_when_idle": "1"}
    if controller == "mpi" and not autotune:          # autotune tunes these two itself, unless they are set
        defaults["HOROVOD_FUSION_THRESHOLD"] = str(CPU_FUSION_THRESHOLD)
        if one_host:
            defaults["HOROVOD_CYCLE_TIME"] = CPU_MPI_CYCLE_TIME_MS
    if not one_host:
        # Across CPU hosts a collective waits milliseconds to seconds on the network; a rank spinning on
        # sched_yield meanwhile takes a core from the threads that move and reduce its data (patch item 11).
        defaults["HOROVOD_BLOCKING_WAIT"] = "1"
    return defaults


def apply_horovod_defaults(on_gpu: bool, controller: str, one_host: bool, environ=os.environ) -> dict[str, str]:
    """Check the environment's Horovod settings, set each default it does not already have; return what was set.

    An empty setting is removed first: it counts as unset here, while Horovod
    would read ``HOROVOD_CYCLE_TIME=`` as a 0 ms cycle (a spinning thread).
    """
    check_horovod_environment(environ)
    for name in (*NUMBER_SETTINGS, *FLAG_SETTINGS):
        if name in environ and not environ[name].strip():
            del environ[name]
    autotune = int(re.match(r"\d*", environ.get("HOROVOD_AUTOTUNE", "").strip()).group() or 0) > 0
    applied = {}
    for key, value in horovod_defaults(on_gpu, controller, one_host, autotune).items():
        if key not in environ:
            environ[key] = applied[key] = value
    return applied
