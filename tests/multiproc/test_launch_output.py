"""hvdkit launch's output under MPI is the ranks' lines, whole, as under Gloo (issue 54, case 6).

Before: mpirun tags each piece it reads from a rank, and 73 of 6000 lines came through in pieces
("[1,1]<stdout>:rank 1 line 73 xx[1,1]<stdout>:xxxx..."), with two ranks printing under PYTHONUNBUFFERED=1,
as in most containers.
"""

import re

import pytest

from tests.conftest import WORKERS, hvdkit_launch_cmd, job_env, run_job

pytestmark = pytest.mark.multiproc


def test_every_line_of_two_ranks_printing_at_once_comes_out_whole_under_mpi():
    proc = run_job(hvdkit_launch_cmd(2, [str(WORKERS / "many_lines.py"), "--lines", "3000"], "mpi"), timeout=180,
                   env=job_env(PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "<stdout>:" in line]
    broken = [line for line in lines if not re.fullmatch(r"\[1,([01])\]<stdout>:rank \1 line \d+ x{40}", line)]
    assert broken == [], f"{len(broken)} of {len(lines)} lines in pieces, e.g. {broken[:3]}"
    assert len(lines) == 6000, "both ranks, every line"
