"""hvdkit launch's own lines and the launcher's lines share stderr: neither may split the other."""

import sys

from hvdkit.ops.supervise import supervise

# A stand-in for horovodrun's output when a host is blacklisted: "Process N exit ..." on stdout (hvdkit launch
# answers each with a "worker lost" line on stderr) while Horovod's logger writes to stderr at the same time.
CHILD = r"""
import sys, threading
def out():
    for n in range(10000):
        print(f"Process {n} exit with status code 137.", flush=True)
def err():
    for n in range(10000):
        print("ERROR:root:blacklisted slots count == 2 -> stop running", file=sys.stderr, flush=True)
threads = [threading.Thread(target=out), threading.Thread(target=err)]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_a_worker_lost_line_is_never_split_by_the_launchers_stderr(capfd):
    """Stop 60's CI: "... so the job stopsERROR:root:blacklisted slots count == 2 -> stop running" was one line;
    the stderr reader wrote a line between the two writes of print() from the stdout reader."""
    rc = supervise((sys.executable, "-c", CHILD), (), elastic=True)
    assert rc == 0
    lines = capfd.readouterr().err.splitlines()
    lost = [line for line in lines if line.startswith("hvdkit launch: worker lost: ")]
    logged = [line for line in lines if line.startswith("ERROR:root:")]
    assert len(lost) == 10000 and len(logged) == 10000, (len(lost), len(logged), lines[:5])
    assert all(line.endswith("(30 s by default) while they notice") for line in lost)
    assert all(line == "ERROR:root:blacklisted slots count == 2 -> stop running" for line in logged)
