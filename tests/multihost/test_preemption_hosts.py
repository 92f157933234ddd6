"""SIGTERM to `hvdkit launch` itself with one rank on each of two hosts (issue 54, case 1).

The launcher passes the signal on as a request to checkpoint: under MPI as SIGUSR1 through mpirun, which
reaches the rank on the other host too; under Gloo (launch's choice across CPU hosts) as SIGTERM to this
host's rank, whose preemption guard tells the other host's rank at the next step. A fix that signalled local
pids alone would leave the other host's rank to be killed mid-step. The checkpoint is 512 MiB and rank 0
spends 6 s more in its save (a slow shared file system): longer than the 5 s launchers give ranks before
SIGKILL, so a save cut short shows.
"""

import json
import shlex
import signal
import sys

import pytest

from hvdkit.runtime.preemption import REQUEUE_EXIT_CODE
from tests.conftest import WORKERS, hvdkit_cmd, process_by_args, progress_at_least, signal_job
from tests.multihost.testhosts import PORT

pytestmark = pytest.mark.multihost


@pytest.mark.parametrize("controller", ["", "--mpi"])        # "": launch's choice across hosts, Gloo
def test_sigterm_to_the_launcher_checkpoints_the_ranks_on_both_hosts_and_exits_75(cluster, tmp_path, controller):
    from hvdkit.torch.checkpoint import _read

    ckpt, out = tmp_path / "ckpt.pt", tmp_path / "preempted"
    out.mkdir()
    argv = hvdkit_cmd("launch", "-np", "2", "-H", "hosta:1,hostb:1", "-p", str(PORT),
                      *([controller] if controller else []), "--network-interface", "eth0", "--",
                      sys.executable, str(WORKERS / "torch_preempt.py"), "--out", str(out), "--ckpt", str(ckpt),
                      "--step-seconds", "0.2", "--ballast-mb", "512", "--save-delay-s", "6")
    cmd = cluster.enter("hosta", " ".join(shlex.quote(a) for a in argv))
    output, ended, code = signal_job(cmd, progress_at_least(out / "progress", (0, 3)),
                                     lambda: process_by_args("hvdkit", str(out), "launch"), end_timeout=120)
    assert code == REQUEUE_EXIT_CODE, f"hvdkit launch exited {code}:\n{output[-3000:]}"
    assert "hvdkit launch: SIGTERM: every rank is asked to checkpoint" in output, output[-3000:]
    assert ckpt.exists() and not list(tmp_path.glob(".ckpt.pt.*.tmp")), sorted(p.name for p in tmp_path.iterdir())
    state = _read(str(ckpt))            # verifies the digest inside the file
    assert state["model"]["ballast"].numel() * 4 == 2**29 and state["world_size"] == 2
    marks = [json.loads((out / f"preempted{r}.json").read_text()) for r in range(2)]
    assert marks[0]["batch"] == marks[1]["batch"], marks
    if controller == "--mpi":           # mpirun passes SIGUSR1 to the ranks on both hosts
        assert [m["signal"] for m in marks] == [signal.SIGUSR1] * 2, marks
    else:                               # hosta's rank got SIGTERM; hostb's learned it from the guard's agreement
        assert [m["signal"] for m in marks] == [signal.SIGTERM, None], marks
    print(f"{controller or '--gloo'}: ended {ended:.1f} s after the launcher's SIGTERM")
