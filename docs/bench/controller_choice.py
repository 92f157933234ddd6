"""Which controller `hvdkit launch` should pick across hosts (issue 37): Horovod's allreduce on MPI and on Gloo.

Run as root from the repository root: .venv/bin/python docs/bench/controller_choice.py
It makes 4 test hosts (tests/multihost/testhosts.py), shapes each link to 500 Mbit/s
each way, and runs `hvdkit bench allreduce` from h1 on 2, 3 and 4 hosts (one process
each) for Horovod under `horovodrun --mpi` (Open MPI's own algorithm choice, then
the ring forced with coll_tuned_allreduce_algorithm=4) and under `horovodrun --gloo`;
then the same MPI pair on one host (2 processes over shared memory), where the kit
uses MPI today. Output: docs/bench/controller_choice.txt (ms per allreduce, the
median of the bench's repeats).
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.multihost.testhosts import PORT, TestHosts  # noqa: E402

HVDKIT = str(Path(sys.executable).parent / "hvdkit")
SIZES = "1M,4M,16M,64M"
RING = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}


def bench(run, hosts: str, np_: int, impls: str, extra_env: dict, remote: bool) -> dict[int, float]:
    argv = [HVDKIT, "bench", "allreduce", "-H", hosts, "-np", str(np_), "--impls", impls, "--sizes", SIZES,
            "--repeats", "3", "--rounds", "1", "--iterations", "2", "--no-resnet", "--json", "--out",
            f"/tmp/controller-choice-{np_}-{len(extra_env)}"]
    if remote:
        argv += ["-p", str(PORT), "--network-interface", "eth0"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra_env)
    out = run(argv, env)
    data = next(json.loads(line) for line in reversed(out.splitlines()) if line.strip().startswith("{"))
    return {r["bytes"]: r["median_s"] * 1e3 for r in data["rows"] if r["case"] == "sweep"}


def table(title: str, rows: dict[str, dict]) -> list[str]:
    sizes = sorted({b for res in rows.values() for b in res})
    lines = [title, f"{'':38}" + "".join(f"{b >> 20:>8} MiB" for b in sizes)]
    for name, res in rows.items():
        lines.append(f"{name:38}" + "".join(f"{res[b]:>12.1f}" if b in res else f"{'failed':>12}" for b in sizes))
    return lines


if __name__ == "__main__":
    lines = [f"# .venv/bin/python docs/bench/controller_choice.py; links shaped to 500 Mbit/s each way; "
             f"load before: {os.getloadavg()[0]:.2f}"]
    with TestHosts(["h1", "h2", "h3", "h4"]) as cluster:
        cluster.shape_links(500)

        def on_h1(argv, env):
            proc = cluster.run_on("h1", argv, timeout=1800, env=env)
            if proc.returncode:
                raise SystemExit(proc.stdout[-3000:])
            return proc.stdout

        for n in (2, 3, 4):
            hosts = ",".join(f"h{i}:1" for i in range(1, n + 1))
            rows = {"horovodrun --mpi (Open MPI's choice)": bench(on_h1, hosts, n, "horovod-mpi", {}, True),
                    "horovodrun --mpi, ring forced": bench(on_h1, hosts, n, "horovod-mpi", RING, True),
                    "horovodrun --gloo": bench(on_h1, hosts, n, "horovod-gloo", {}, True)}
            lines += table(f"{n} hosts, ms per allreduce:", rows) + [""]
            print("\n".join(lines), flush=True)
        cluster.clear_links()

    import subprocess

    def here(argv, env):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
        return proc.stdout

    rows = {"horovodrun --mpi (Open MPI's choice)": bench(here, "localhost:2", 2, "horovod-mpi", {}, False),
            "horovodrun --mpi, ring forced": bench(here, "localhost:2", 2, "horovod-mpi", RING, False),
            "horovodrun --gloo": bench(here, "localhost:2", 2, "horovod-gloo", {}, False)}
    lines += table("one host, 2 processes (shared memory), ms per allreduce:", rows)
    lines.append(f"# load after: {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines) + "\n"
    (ROOT / "docs" / "bench" / "controller_choice.txt").write_text(text)
    print(text)
