"""The cycle time across hosts (issue 37), on the controller `hvdkit launch` now picks there (Gloo).

Run as root from the repository root: .venv/bin/python docs/bench/cycle_multihost.py
It makes 4 test hosts (tests/multihost/testhosts.py), shapes each link to 500 Mbit/s
each way, and runs `hvdkit bench allreduce --impls hvdkit` from h1 on 2 and 4 hosts
(one process each, as `hvdkit launch` runs them: Gloo) at HOROVOD_CYCLE_TIME 0.2, 1
(Horovod's default, which hvdkit keeps under Gloo) and 5 ms: one 1 MiB and one 4 MiB
tensor, and ResNet-50's 161 gradients (97.5 MiB, many tensors, where a cycle's wait
recurs). Output: docs/bench/cycle_multihost.txt (ms per allreduce, the median of 3).
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.multihost.testhosts import PORT, TestHosts  # noqa: E402

HVDKIT = str(Path(sys.executable).parent / "hvdkit")
CYCLES = ("0.2", "1", "5")

if __name__ == "__main__":
    lines = [f"# .venv/bin/python docs/bench/cycle_multihost.py; links shaped to 500 Mbit/s each way; "
             f"load before: {os.getloadavg()[0]:.2f}"]
    with TestHosts(["h1", "h2", "h3", "h4"]) as cluster:
        cluster.shape_links(500)
        for n in (2, 4):
            hosts = ",".join(f"h{i}:1" for i in range(1, n + 1))
            lines += [f"{n} hosts, hvdkit (launch's controller), ms per allreduce:",
                      f"{'cycle':>8}{'1 MiB':>12}{'4 MiB':>12}{'ResNet-50 (161)':>18}{'controller':>12}"]
            for cycle in CYCLES:
                argv = [HVDKIT, "bench", "allreduce", "-H", hosts, "-np", str(n), "--impls", "hvdkit",
                        "--sizes", "1M,4M", "--repeats", "3", "--rounds", "1", "--iterations", "2", "--json",
                        "--out", f"/tmp/cycle-multihost-{n}-{cycle}", "-p", str(PORT), "--network-interface", "eth0"]
                env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HOROVOD_CYCLE_TIME=cycle,
                           PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
                proc = cluster.run_on("h1", argv, timeout=1800, env=env)
                if proc.returncode:
                    raise SystemExit(proc.stdout[-3000:])
                data = next(json.loads(line) for line in reversed(proc.stdout.splitlines())
                            if line.strip().startswith("{"))
                ms = {(r["case"], r["bytes"]): r["median_s"] * 1e3 for r in data["rows"]}
                resnet = next(v for (case, _), v in ms.items() if case != "sweep")
                lines.append(f"{cycle:>8}{ms[('sweep', 1 << 20)]:>12.1f}{ms[('sweep', 4 << 20)]:>12.1f}"
                             f"{resnet:>18.1f}{data['rows'][0]['controller']:>12}")
                print(lines[-1], flush=True)
            lines.append("")
        cluster.clear_links()
    lines.append(f"# load after: {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines) + "\n"
    (ROOT / "docs" / "bench" / "cycle_multihost.txt").write_text(text)
    print(text)
