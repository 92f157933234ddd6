"""Why Open MPI's allreduce missed the ring model across hosts (docs/BENCHMARKS.md, Across hosts).

Run as root from the repository root: .venv/bin/python docs/bench/openmpi_ring.py
It makes 4 test hosts (tests/multihost/testhosts.py), shapes each link to 500 Mbit/s
each way, and times mpi4py's in-place MPI_Allreduce of 8 MiB on 3 and 4 hosts (one
process each, the upper median of 4 timings, i.e. the third fastest, after 2 warm-ups) with Open MPI's own algorithm choice, with
the ring forced (coll_tuned_allreduce_algorithm=4), and with the ring and two TCP
connections per peer (btl_tcp_links=2). Output: docs/bench/openmpi_ring.txt.
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.multihost.testhosts import PORT, TestHosts  # noqa: E402

WORKER = """
import sys, time
import numpy as np
from mpi4py import MPI
comm, a = MPI.COMM_WORLD, np.ones((8 << 20) // 4, dtype=np.float32)
for _ in range(2):
    comm.Allreduce(MPI.IN_PLACE, a)
times = []
for _ in range(4):
    comm.Barrier(); t = time.perf_counter(); comm.Allreduce(MPI.IN_PLACE, a); times.append(time.perf_counter() - t)
if comm.rank == 0:
    print(f"RESULT {sys.argv[1]}: {sorted(times)[2] * 1e3:.1f} ms", flush=True)
"""
RING = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4"]
VARIANTS = {"Open MPI's choice": [], "ring forced": RING, "ring forced, btl_tcp_links=2": [*RING, "--mca",
                                                                                          "btl_tcp_links", "2"]}

if __name__ == "__main__":
    script = Path(tempfile.mkdtemp()) / "allreduce.py"
    script.write_text(WORKER)
    with TestHosts(["h1", "h2", "h3", "h4"]) as cluster:
        cluster.shape_links(500)
        for n in (3, 4):
            hosts = ",".join(f"h{i}:1" for i in range(1, n + 1))
            for name, mca in VARIANTS.items():
                argv = ["mpirun", "--allow-run-as-root", "-np", str(n), "-H", hosts, "--mca", "plm_rsh_args",
                        f"-p {PORT}", "--mca", "btl_tcp_if_include", "eth0", *mca, sys.executable, str(script),
                        f"{n} hosts, {name}"]
                out = cluster.run_on("h1", argv, timeout=120).stdout
                print(next((line.split("RESULT ", 1)[1] for line in out.splitlines() if "RESULT" in line),
                           out[-500:]), flush=True)
