"""Run a training script; when Horovod removes this worker's slot from the elastic job, exit only once the
slot has a new worker; on slot 1, end 3 s after the script.

    python tests/linger_when_removed.py examples/pytorch_elastic.py --epochs 12

A removed worker that is slow to exit (a framework's teardown, a loaded
machine) stands in for the race: Horovod's driver knows workers by (host,
slot), and used to take such a late exit for the exit of the new worker on the
same slot (scripts/patches, item 9). Waiting for the successor process makes
the race happen every time instead of by chance.
"""

import os
import runpy
import sys
import time

import psutil


def successor() -> psutil.Process | None:
    """Another process of this script on this worker's host and local rank: the slot's new worker."""
    me = psutil.Process()
    mine = {k: os.environ.get(k) for k in ("HOROVOD_HOSTNAME", "HOROVOD_LOCAL_RANK")}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid != me.pid and __file__ in " ".join(proc.info["cmdline"] or []) and \
                    all(proc.environ().get(k) == v for k, v in mine.items()):
                return proc
        except psutil.Error:
            continue
    return None


script = sys.argv[1]
sys.argv = sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
    if os.environ.get("HOROVOD_LOCAL_RANK") == "1":
        # Slot 1 ends 3 s after training, like a slow framework teardown: the old driver, holding the
        # removed worker's late exit, stopped the job as rank 0 finished and SIGTERMed this one.
        time.sleep(3)
except ValueError as exc:
    # What hvd.init() raises in a reset when the slot is gone (Horovod logs "... has been removed from elastic job").
    if "Horovod initialization failed" not in str(exc):
        raise
    print("removed from the job; waiting for this slot's new worker", flush=True)
    deadline = time.monotonic() + 180
    while successor() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    print("removed worker exits now, after its successor started" if successor() else
          "removed worker exits now, no successor within 180 s", flush=True)
    raise
