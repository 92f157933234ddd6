"""Stop a job's process group when the ``hvdkit launch`` that started it goes away, however it ends.

Run as ``python -m hvdkit.ops.job_guard PGID`` with a pipe from the launcher as
stdin: it waits for EOF (the launcher ended: exit, crash, SIGKILL), then sends
SIGTERM to the group. A pre-exec ``PR_SET_PDEATHSIG`` reaches only
horovodrun's own process, which under ``--mpi`` is a shell whose mpirun then
trained on (tests/multiproc/test_fail_fast.py).
"""

import os
import signal
import sys

if __name__ == "__main__":
    sys.stdin.buffer.read()
    try:
        os.killpg(int(sys.argv[1]), signal.SIGTERM)
    except ProcessLookupError:
        pass
