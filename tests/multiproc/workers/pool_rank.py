"""One rank of a test job pool (tests/job_pool.py): runs worker scripts one after another in this process.

A test worker costs seconds of process start and framework import for
checks that take well under a second. A pool is one ``horovodrun --gloo``
(or ``--mpi``) job whose ranks wait for scenarios in ``--dir`` and run each as Python runs
a script (``runpy``, ``__name__ == "__main__"``), then put the process back
as they found it, so the next scenario starts as a fresh one would:

- Horovod is shut down after each scenario and the next one's ``hk.init``
  initialises it again (a new Gloo rendezvous, or new MPI communicators), so
  no idle Horovod thread spins between scenarios. Under MPI the rank
  initialises MPI itself (mpi4py) before the first scenario: Horovod then
  leaves MPI initialised at its shutdown, where it would finalise an MPI it
  had initialised, and Open MPI cannot initialise twice in one process;
- the environment, working directory, ``sys.argv``, signal handlers, warning
  filters and registries, and logging are restored; the workers' helper
  modules are imported afresh;
- torch's default dtype, thread counts and compiled graphs, and Keras's
  session, float type and precision policy, are reset.

Protocol: ``job-<n>.json`` (``{"worker": path, "argv": [...]}``) appears in
``--dir``; each rank writes its output to ``out-<n>.<rank>`` (stderr:
``.err``) and then ``done-<n>.<rank>.json`` (``{"rc": exit code}``). A rank
whose scenario ends non-zero exits after reporting it (the test side starts
a new pool), since a failed collective can leave Horovod in a state no reset
undoes. ``stop`` in ``--dir`` ends every rank; so does the launcher going
away, or the pytest process that owns the pool (``--owner``).
"""

import argparse
import json
import logging
import os
import resource
import runpy
import shutil
import signal
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
CATCHABLE = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(path: str, stop: str, parent: int, owner: int) -> bool:
    """True once ``path`` exists; False when the pool is told to stop, or its launcher or its pytest is gone
    (a pytest killed by a timeout runs no atexit handler, and horovodrun outlives its parent)."""
    pause = 0.005
    while not os.path.exists(path):
        if os.path.exists(stop) or os.getppid() != parent or not alive(owner):
            return False
        time.sleep(pause)
        pause = min(pause * 1.5, 0.2)     # a scenario right after another starts at once; an idle pool costs little
    return True


class Snapshot:
    """What a scenario may change in this process, taken before it and put back after it."""

    def __init__(self):
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.argv = list(sys.argv)
        self.path = list(sys.path)
        self.meta_path = list(sys.meta_path)     # hvdkit.keras adds a finder that seeds TensorFlow when imported
        self.modules = set(sys.modules)
        self.handlers = {s: signal.getsignal(s) for s in CATCHABLE}
        self.filters = list(warnings.filters)
        self.root_handlers = list(logging.root.handlers)
        self.root_level = logging.root.level
        self.loggers = {name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
                        for name, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)}

    def restore(self) -> None:
        shutdown_horovod()
        reset_frameworks()
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        sys.argv[:] = self.argv
        sys.path[:] = self.path
        sys.meta_path[:] = self.meta_path
        for name in set(sys.modules) - self.modules:
            module = sys.modules[name]
            if os.path.dirname(os.path.abspath(getattr(module, "__file__", None) or "/")) == HERE:
                del sys.modules[name]      # the workers' helpers (torch_common, keras_common): imported afresh
        for sig, handler in self.handlers.items():
            # Only what the scenario changed: Python reports SIG_DFL for handlers installed in C (Open MPI's for
            # SIGSEGV and SIGBUS, which print a crashed rank's backtrace), and setting it again would remove them.
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        warnings.filters[:] = self.filters
        warnings._filters_mutated()  # noqa: SLF001 -- forgets every "once"/"default" warning already shown
        for module in list(sys.modules.values()):
            registry = getattr(module, "__warningregistry__", None)
            if isinstance(registry, dict):
                registry.clear()
        logging.root.handlers[:] = self.root_handlers
        logging.root.setLevel(self.root_level)
        for name, lg in logging.root.manager.loggerDict.items():
            if not isinstance(lg, logging.Logger):
                continue
            level, handlers, propagate, disabled = self.loggers.get(name, (logging.NOTSET, [], True, False))
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate, lg.disabled = propagate, disabled


def cpu_seconds() -> float:
    """This rank's CPU seconds, all its threads: what a scenario cost, for the test that ran it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def shutdown_horovod() -> None:
    for name in ("horovod.torch", "horovod.tensorflow"):
        hvd = sys.modules.get(name)
        if hvd is not None and hvd.is_initialized():
            hvd.shutdown()


def reset_frameworks() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)
        torch.use_deterministic_algorithms(False)
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
    for name in ("keras", "tf_keras"):
        keras = sys.modules.get(name)
        if keras is None or not hasattr(keras, "utils"):
            continue
        if name == "keras":
            keras.config.set_floatx("float32")
        else:
            keras.backend.set_floatx("float32")
            keras.mixed_precision.set_global_policy(None)     # unset: the policy follows floatx again
        keras.backend.clear_session()                         # Keras 3: also unsets the global dtype policy
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "config"):
        tf.config.run_functions_eagerly(False)


def run(job: dict, out_path: str) -> int:
    """Run one scenario with this process's stdout and stderr (the file descriptors) sent to ``out_path`` and
    ``out_path + ".err"``, kept apart as horovodrun keeps them (its tags say which)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(out_path, "wb") as out, open(out_path + ".err", "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
    sys.argv[:] = [job["worker"], *job["argv"]]
    rc = 0
    try:
        runpy.run_path(job["worker"], run_name="__main__")
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 -- what Python prints for an uncaught exception, and exit status 1
        traceback.print_exc()
        rc = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    return rc


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--owner", type=int, required=True, help="the pytest process; the pool ends with it")
    args = p.parse_args()
    directory, owner = args.dir, args.owner
    from hvdkit.common.launcher import OPEN_MPI, detect, launcher

    rank = str(detect().rank)                          # horovodrun --gloo or --mpi
    if launcher() is OPEN_MPI:
        # MPI initialised as Horovod initialises it: every thread may call it, and an error aborts as in a job of
        # its own (mpi4py's default makes errors return, which Horovod's communicators would inherit).
        import mpi4py

        mpi4py.rc.thread_level, mpi4py.rc.errors = "multiple", "default"
        from mpi4py import MPI

        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            sys.exit("pool_rank: this MPI gives no MPI_THREAD_MULTIPLE, which Horovod asks for")
    stop, parent = os.path.join(directory, "stop"), os.getppid()
    n = 0
    while wait_for(os.path.join(directory, f"job-{n}.json"), stop, parent, owner):
        with open(os.path.join(directory, f"job-{n}.json")) as f:
            job = json.load(f)
        snapshot = Snapshot()
        started, cpu = time.monotonic(), cpu_seconds()
        rc = run(job, os.path.join(directory, f"out-{n}.{rank}"))
        try:
            snapshot.restore()
        except BaseException:  # noqa: BLE001 -- a process that cannot be put back serves no more scenarios
            with open(os.path.join(directory, f"out-{n}.{rank}.err"), "a") as out:
                out.write("pool_rank: could not reset the process after this scenario:\n" + traceback.format_exc())
            rc = rc or 1
        done = os.path.join(directory, f"done-{n}.{rank}.json")
        with open(done + ".tmp", "w") as f:
            json.dump({"rc": rc, "seconds": time.monotonic() - started, "cpu": cpu_seconds() - cpu}, f)
        os.replace(done + ".tmp", done)
        if rc != 0:
            return
        n += 1
    if not alive(owner) and rank == "0":
        shutil.rmtree(directory, ignore_errors=True)      # nobody else will


if __name__ == "__main__":
    main()
