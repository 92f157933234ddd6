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

# The numbers below are docs/BENCHMARKS.md's Tuning table: the sixth session's runs, and issue 26's
# (raw files in docs/bench/fusion/ and docs/bench/cycle/).
# Cycle time on CPU under MPI: 0.1 ms (Horovod's default, 1 ms, under Gloo
# and on GPU). Horovod's background thread wakes every cycle to agree with
# the other ranks on which tensors are ready, so a tensor waits up to a cycle
# before it is reduced. hvdkit used to set 2 ms on CPU: before the MPI yield
# below, a shorter cycle meant more spinning on the cores backward needs
# (mnist step, 2 processes, MPI: 0.1 ms 38.8 and 50.4 ms, 1 ms 34.4-38.1,
# 2 ms 26.7-32.5). With the yield on, the step does not depend on the cycle
# and the allreduce does. Measured twice, on two machines of the 2-core kind:
# - sixth session (AMD EPYC; medians of 3-8 runs): mnist 21.8 / 24.0 ms and
#   ResNet-50 782 / 823 ms at 0.1 / 1 ms; bus bandwidth at 16 MiB as a share
#   of mpi4py's in the same launch 86% / 67%;
# - issue 26's last session (Intel Xeon, 3 rounds of 5): at 0.1 / 0.2 /
#   0.5 / 1 ms, 16 MiB at 100% / 96% / 88% / 75% of mpi4py-avg, 64 MiB at
#   97% / - / 101% / 96%; ResNet-50's 161 gradients 41.3 / - / 39.7 / 40.0 ms
#   against mpi4py-avg's 36.9 / - / 36.5 / 37.1. Training step (hvdkit bench
#   train -np 2, interleaved runs): mnist 13.7, 13.4 ms at 0.1 against 13.5,
#   15.2, 13.8 at 1 ms; ResNet-50 539.2, 534.4 against 548.2, 543.8, 551.5.
# Under Gloo a short cycle costs: the Gloo background thread's idle CPU went
# from 5% of a core to 30-35% at 0.1 ms, and the digits example
# (horovodrun -np 2 --gloo) from 11.9, 12.0 s to 13.7, 13.7 s (13.7, 13.0 s
# at 0.2 ms). MPI's idle rank spins at 100% either way (the yield makes it
# give way), and the example took 10.8, 10.9 s at 1 ms and 10.6, 11.1 s at
# 0.1. So 0.1 ms with MPI on one host, Horovod's 1 ms with Gloo. Across hosts
# the cycle's negotiation crosses the network every 0.1 ms, which was not
# measured (the scaling study ran at 1 ms), so multi-host jobs keep 1 ms.

# MPI's idle policy. Open MPI spins while it waits for a peer (in the
# negotiation every cycle and inside each allreduce), and yields the core only
# when it believes the node is oversubscribed. On CPU it is, in effect:
# Horovod's background thread shares the cores with the training threads.
# Measured (ResNet-50, 64x64, batch 16, 2 processes on 2 cores, MPI, per-thread
# CPU time from /proc over 24 steps): Horovod's background thread burned
# 6.7-10.8 s of CPU per process with the default and 1.7-3.0 s with
# mpi_yield_when_idle=1, and the step took 965-1160 ms against 716-871 ms
# (DistributedDataParallel: 784 ms in the same session). Open MPI reads the
# variable at MPI_Init, which hvd.init() calls after this is set. It does not
# touch Gloo. On GPU hosts cores are spare, so it is left alone there.
#
# Fusion threshold on CPU: 1 MiB (Horovod's default, 128 MiB, on GPU). With
# 128 MiB, ResNet-50's 161 gradients (97.5 MiB) are copied into one buffer,
# reduced, and copied out: three passes over memory far larger than the
# caches. In 1 MiB pieces each piece is copied, reduced and copied back while
# it is still in cache. Measured (2 processes, MPI, medians of 3 rounds of 5,
# the tuning session of issue 26): the 161 tensors took 106.2 ms against
# 55.8 ms for mpi4py reducing them one by one and scaling (1.90x) at 128 MiB,
# and 45.2 ms against 45.3 ms (1.00x) at 1 MiB; one 16 / 64 MiB tensor was not
# slower (104% / 90% of mpi4py-avg's bandwidth at 1 MiB, 73% / 91% at 128 MiB).
# Under MPI only: Gloo's one-host and multi-host runs used Horovod's 128 MiB,
# and Horovod's Gloo ring pays a cost per operation (docs/BENCHMARKS.md,
# Across hosts) that 1 MiB pieces would multiply.
# On GPUs Horovod's default stays: NCCL is tuned for large buffers (not measured here: no GPU was lent).
# The training step: see docs/BENCHMARKS.md's Tuning table.
#
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
