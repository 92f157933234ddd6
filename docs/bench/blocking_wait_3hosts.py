"""Issue 37: which Horovod-side cost makes the hvdkit row miss the ring on 3 hosts? Variants beside torch's ring.

Run as root from the repository root: .venv/bin/python docs/bench/blocking_wait_3hosts.py [variant,...]
3 test hosts (2 cores in all), links shaped to 500 Mbit/s. Written before init() set HOROVOD_BLOCKING_WAIT
across hosts, so "base" was the spin then. Output: /tmp/blocking-wait-3hosts/<variant>/allreduce.csv, whose
ms are tabled in docs/bench/blocking_wait_3hosts.txt.
"""

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.multihost.testhosts import PORT, TestHosts  # noqa: E402

VARIANTS = {"base": {}, "blocking_wait": {"HOROVOD_BLOCKING_WAIT": "1"},
            "no_fusion_copy": {"HOROVOD_FUSION_THRESHOLD": "0"}}

if __name__ == "__main__":
    py = Path(sys.executable)
    chosen = sys.argv[1].split(",") if len(sys.argv) > 1 else list(VARIANTS)
    with TestHosts(["h1", "h2", "h3"]) as cluster:
        cluster.shape_links(500)
        for name in chosen:
            out = Path("/tmp/blocking-wait-3hosts") / name
            argv = [str(py.parent / "hvdkit"), "bench", "allreduce", "-H", "h1:1,h2:1,h3:1", "-np", "3",
                    "--impls", "hvdkit,torch", "--sizes", "4M,64M", "--rounds", "2", "--repeats", "3",
                    "--iterations", "2", "--no-resnet", "-p", str(PORT), "--network-interface", "eth0",
                    "--out", str(out), "--json"]
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
                       PATH=f"{py.parent}:{os.environ['PATH']}", **VARIANTS[name])
            start, load = time.time(), os.getloadavg()[0]
            proc = cluster.run_on("h1", argv, timeout=1500, env=env)
            text = (out / "allreduce.txt").read_text() if proc.returncode == 0 else proc.stdout[-2000:]
            print(f"== {name} {VARIANTS[name]} load {load:.2f} {time.time() - start:.0f}s\n{text}", flush=True)
        cluster.clear_links()
