"""The multi-host scaling study: Horovod's ring against a parameter server, on test hosts with shaped links.

    .venv/bin/python -m tests.multihost.scaling_study --hosts 4 --link-mbit 500 --out docs/bench    # as root
    make bench-scaling                                                                                # the same

It builds 1 + HOSTS test hosts (network namespaces on a bridge, each with its
own sshd: testhosts.py): ``server`` for the parameter server and
``worker1``..``workerN``, and shapes every host's link to --link-mbit each way
(so the network, not the 2 shared cores, is the bottleneck). Then, for n = 2..HOSTS
workers, one process per host, it runs from the server host:

    hvdkit bench allreduce -H worker1:1,..,workern:1 -np n --impls hvdkit,horovod-gloo,mpi4py-avg,torch (--ring)
    hvdkit bench allreduce -H server:1,worker1:1,..,workern:1 -np n+1 --impls ps
    hvdkit bench train     (the same two launches, hvdkit and ps, for each --models)

Every bench result goes into OUT/scaling.json; hvdkit.bench.scaling then fits
``hvdkit plan``'s network on the 2-host ring sweep alone, predicts every other
point, and writes OUT/scaling.txt and OUT/scaling.png. The links are cleared
and the hosts removed on exit, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from hvdkit.bench.report import write_file, write_json
from hvdkit.bench.results import machine
from hvdkit.bench.scaling import analyse, scaling_table
from hvdkit.common.console import progress
from hvdkit.common.errors import UserError
from hvdkit.ops.plots import plot_scaling
from tests.multihost.testhosts import PORT, TestHosts

ROOT = Path(__file__).resolve().parents[2]
HVDKIT = str(Path(sys.executable).parent / "hvdkit")


def bench_argv(kind: str, hosts: list[str], impls: str, args: argparse.Namespace, out: str) -> list[str]:
    """One ``hvdkit bench`` launch on ``hosts`` (one slot each), as run from the server host."""
    argv = [HVDKIT, "bench", kind, "-H", ",".join(f"{h}:1" for h in hosts), "-p", str(PORT),
            "--network-interface", "eth0", "--impls", impls, "--out", out, "--json", "--timeout", str(args.timeout)]
    if kind == "allreduce":
        argv += ["-np", str(len(hosts)), "--sizes", args.sizes, "--repeats", str(args.repeats), "--rounds", "1",
                 "--iterations", str(args.iterations)] + ([] if args.resnet else ["--no-resnet"])
    else:
        argv += ["-np", str(len(hosts)), "--models", args.models, "--steps", str(args.steps),
                 "--warmup", str(args.warmup), "--repeats", "1"]
    return argv


def plan_study(args: argparse.Namespace, tmp: Path) -> list[tuple[int, str, list[str]]]:
    """Every (workers, kind, argv) the study runs, in order."""
    workers = [f"worker{i}" for i in range(1, args.hosts + 1)]
    runs = []
    for n in range(2, args.hosts + 1):
        kinds = ["allreduce"] + (["train"] if args.models else [])
        for kind in kinds:
            runs.append((n, kind, bench_argv(kind, workers[:n], args.ring if kind == "allreduce" else "hvdkit",
                                             args, str(tmp / f"ring-{kind}-{n}"))))
            runs.append((n, kind, bench_argv(kind, ["server", *workers[:n]], "ps", args,
                                             str(tmp / f"ps-{kind}-{n}"))))
    return runs


def run_study(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="hvdkit-scaling-"))      # each launch's own files; the study keeps its JSON
    names = ["server"] + [f"worker{i}" for i in range(1, args.hosts + 1)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    study = {"link_mbit": args.link_mbit, "hosts": args.hosts, "machine": machine(), "started": time.time(),
             "argv": sys.argv, "runs": [], "failures": []}
    with TestHosts(names) as cluster:
        cluster.shape_links(args.link_mbit)
        try:
            study["qdisc"] = cluster.link_qdisc("server")
            for n, kind, argv in progress(plan_study(args, tmp), rank=0, desc="scaling study"):
                started, load_before = time.monotonic(), os.getloadavg()[0]
                try:
                    proc = cluster.run_on("server", argv, timeout=args.timeout * 4, env=env)
                except TimeoutError as exc:      # keep what the other launches measured
                    study["failures"].append({"argv": argv, "rc": None, "output": str(exc)[-3000:]})
                    print(f"scaling study: {exc}", file=sys.stderr)
                    continue
                seconds = time.monotonic() - started
                # hvdkit bench prints its JSON also when one implementation failed: keep the others' rows.
                data = _json_of(proc.stdout)
                if proc.returncode != 0 or data is None:
                    study["failures"].append({"argv": argv, "rc": proc.returncode, "output": proc.stdout[-3000:]})
                    print(f"scaling study: {' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}",
                          file=sys.stderr)
                if data is None:
                    continue
                # The machine's 1-minute load average around each launch: the study's own processes are
                # about 1-2 of it (one worker per host on 2 cores); more means something else ran.
                study["runs"].append({"hosts": n, "kind": kind, "argv": argv, "seconds": round(seconds, 1),
                                      "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                                      "data": data})
        finally:
            cluster.clear_links()
            shutil.rmtree(tmp, ignore_errors=True)
    study["seconds"] = round(time.time() - study["started"], 1)
    return study


def _json_of(output: str) -> dict | None:
    """The --json line hvdkit bench printed (the last line that parses)."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def write(study: dict, out: Path, calibrate_on: str) -> dict:
    write_json(str(out / "scaling.json"), study)           # atomic: a full disk keeps the last study whole
    result = analyse(study, calibrate_on)
    write_json(str(out / "scaling-predicted.json"), result)
    table = scaling_table(result)
    write_file(str(out / "scaling.txt"), table + "\n")
    plot_scaling(str(out / "scaling.png"), result)
    print(table)
    print(f"wrote {out}/scaling.json, scaling-predicted.json, scaling.txt, scaling.png")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=4, help="most workers (hosts); the study runs 2..HOSTS")
    # 500 Mbit/s: at 1000, 4 hosts' ring moves 4 Gbit/s through the bridge, and the 2 cores, not the links,
    # would set the pace (one unshaped stream reached 3.4 Gbit/s here).
    p.add_argument("--link-mbit", type=float, default=500, help="each host's link, Mbit/s each way")
    p.add_argument("--sizes", default="1M,4M,16M,64M", help="allreduce sizes")
    p.add_argument("--resnet", action="store_true", help="also ResNet-50's 161 gradients and one tensor as large")
    p.add_argument("--ring", default="hvdkit,horovod-gloo,mpi4py-avg,torch",
                   help="allreduce implementations to run on the workers")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=2, help="exchanges per timed repeat")
    p.add_argument("--models", default="mnist,resnet50", help="training-step models ('' for none)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900, help="seconds per bench launch")
    p.add_argument("--out", default="docs/bench")
    p.add_argument("--calibrate-on", default="horovod-gloo", help="the ring whose 2-host sweep fits the model")
    p.add_argument("--reanalyse", action="store_true", help="only redo the table and plot from OUT/scaling.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.reanalyse:
        write(json.loads((out / "scaling.json").read_text()), out, args.calibrate_on)
        return 0
    if os.geteuid() != 0:
        print("scaling study: test hosts need root (ip netns, tc, sshd): run it as root", file=sys.stderr)
        return 2
    if args.hosts < 2:
        print(f"scaling study: --hosts {args.hosts}: use 2 or more", file=sys.stderr)
        return 2
    if args.calibrate_on not in args.ring.split(","):
        print(f"scaling study: --calibrate-on {args.calibrate_on} is not in --ring {args.ring}: add it to --ring, "
              "or calibrate on one of those", file=sys.stderr)
        return 2
    # SIGTERM (a CI timeout, kill) ends the study like Ctrl-C: through the with-block that removes the hosts.
    # The caller's handler comes back afterwards (the smoke test runs main() inside pytest).
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        study = run_study(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        write(study, out, args.calibrate_on)
    except UserError as exc:             # scaling.json is written first, so --reanalyse can retry
        print(f"scaling study: {exc}", file=sys.stderr)
        return 1
    return 1 if study["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
