"""Run a training script; when Horovod removes this worker's slot from the elastic job, exit only after a delay.

    python tests/linger_when_removed.py SECONDS examples/pytorch_elastic.py --epochs 12

A stand-in for a removed worker that is slow to exit (a framework's teardown,
a loaded machine): Horovod's driver used to take such a late exit for the exit
of the new worker started on the same slot (scripts/patches, item 9).
"""

import runpy
import sys
import time

delay, script = float(sys.argv[1]), sys.argv[2]
sys.argv = sys.argv[2:]
try:
    runpy.run_path(script, run_name="__main__")
except ValueError as exc:
    # What hvd.init() raises in a reset when the slot is gone (Horovod logs "... has been removed from elastic job").
    if "Horovod initialization failed" not in str(exc):
        raise
    print(f"removed from the job; lingering {delay:g}s", flush=True)
    time.sleep(delay)
    print("removed worker exits now", flush=True)
    raise
