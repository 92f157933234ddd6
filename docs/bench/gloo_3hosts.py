"""Is Horovod's Gloo ring slower than torch's on 3 hosts every time? (issue 37's remaining misses)

Run as root from the repository root: .venv/bin/python docs/bench/gloo_3hosts.py
3 test hosts, links shaped to 500 Mbit/s each way; `hvdkit bench allreduce` from h1 with
hvdkit (launch's controller: Gloo), horovod-gloo and torch (Gloo), 3 interleaved rounds
(the scaling study runs 1). Output: docs/bench/gloo_3hosts.txt.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.multihost.testhosts import PORT, TestHosts  # noqa: E402

PREDICTED_MS = {4: 94.5, 16: 377.9, 64: 1511.6}       # the ring prediction, docs/bench/scaling.txt's fit


def ms_table(csv_path: Path) -> str:
    """ms per allreduce for each implementation and size, its rounds, and its error against the prediction."""
    import csv
    import json

    lines = ["", "ms per allreduce, median over 3 rounds (each round's median of 3 repeats); round medians in "
                 "brackets; error against the prediction:"]
    rows = sorted(csv.DictReader(csv_path.open()), key=lambda r: (r["impl"], int(r["bytes"])))
    for r in rows:
        mib, ms = int(r["bytes"]) >> 20, float(r["median_s"]) * 1e3
        rounds = ", ".join(f"{x * 1e3:.0f}" for x in json.loads(r["round_medians_s"]))
        lines.append(f"{r['impl']:<16}{mib:>2} MiB {ms:8.1f} ms  ({PREDICTED_MS[mib] / ms - 1:+.0%})  [{rounds}]")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    argv = [str(Path(sys.executable).parent / "hvdkit"), "bench", "allreduce", "-H", "h1:1,h2:1,h3:1", "-np", "3",
            "--impls", "hvdkit,horovod-gloo,torch", "--sizes", "4M,16M,64M", "--rounds", "3", "--repeats", "3",
            "--iterations", "2", "--no-resnet", "-p", str(PORT), "--network-interface", "eth0",
            "--out", "/tmp/gloo-3hosts"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    load = os.getloadavg()[0]
    with TestHosts(["h1", "h2", "h3"]) as cluster:
        cluster.shape_links(500)
        proc = cluster.run_on("h1", argv, timeout=1800, env=env)
        cluster.clear_links()
    table = (Path("/tmp/gloo-3hosts") / "allreduce.txt").read_text() if proc.returncode == 0 else proc.stdout[-3000:]
    if proc.returncode == 0:
        table += ms_table(Path("/tmp/gloo-3hosts") / "allreduce.csv")
    text = (f"# .venv/bin/python docs/bench/gloo_3hosts.py; 3 hosts, 500 Mbit/s links; load before {load:.2f}, "
            f"after {os.getloadavg()[0]:.2f}\n# ring prediction (docs/bench/scaling.txt fit): 4 MiB 94.5 ms, "
            f"16 MiB 377.9, 64 MiB 1511.6\n" + table)
    (ROOT / "docs" / "bench" / "gloo_3hosts.txt").write_text(text)
    print(text)
