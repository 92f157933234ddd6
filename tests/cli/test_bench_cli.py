"""`hvdkit bench` and `hvdkit plan` end to end: real launches of every implementation, small sizes."""

import json

import pytest

from hvdkit.bench.runner import free_port
from tests.conftest import SEVERAL_JOBS, run_hvdkit

pytestmark = [pytest.mark.cli, SEVERAL_JOBS]


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # sizes 256x apart: on a busy 2-core CI machine 64K and 4M both took about one
    # cycle time (then 2 ms) once, so the calibration below saw no growth with size;
    # 16M takes about 10 ms. Two sizes and two repeats: 72 s instead of 88 s alone.
    proc = run_hvdkit("bench", "allreduce", "-np", "2", "--sizes", "64K,16M", "--repeats", "2", "--rounds", "1",
                      "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    for header in ("hvdkit/mpi4py", "hvdkit/mpi4py-avg", "ResNet-50 gradients"):
        assert header in proc.stdout
    proc = run_hvdkit("bench", "train", "-np", "2", "--models", "mnist", "--steps", "8", "--warmup", "2",
                      "--repeats", "1", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return out


def test_allreduce_bench_runs_every_implementation_on_two_processes(bench_dir):
    data = json.loads((bench_dir / "allreduce.json").read_text())
    assert data["np"] == 2 and not data["failures"]
    impls = {r["impl"] for r in data["rows"]}
    assert impls == {"hvdkit", "horovod-mpi", "horovod-gloo", "torch", "mpi4py", "mpi4py-avg"}
    assert all(r["np"] == 2 for r in data["rows"])
    cases = {(r["impl"], r["case"]) for r in data["rows"]}
    assert ("hvdkit", "resnet50-many") in cases and ("mpi4py", "resnet50-one") in cases
    assert all(r["busbw_GBps"] > 0 for r in data["rows"])
    assert (bench_dir / "allreduce.png").stat().st_size > 10_000
    assert (bench_dir / "allreduce.csv").read_text().startswith("impl,label,controller,np,case,bytes")
    assert "bus bandwidth" in (bench_dir / "allreduce.txt").read_text()


def test_train_bench_splits_the_step_for_three_implementations(bench_dir):
    data = json.loads((bench_dir / "train.json").read_text())
    rows = {r["impl"]: r for r in data["rows"]}
    assert set(rows) == {"hvdkit", "horovod", "ddp"} and all(r["np"] == 2 for r in rows.values())
    for r in rows.values():
        parts = sum(r[f"{p}_ms"] for p in ("input", "compute", "allreduce", "update"))
        assert parts == pytest.approx(r["step_ms"], rel=0.35)   # medians of parts vs median of sums
        assert r["samples_per_s"] > 0
    assert (bench_dir / "train.png").stat().st_size > 10_000


def test_plan_calibrates_on_bench_output(bench_dir, tmp_path):
    proc = run_hvdkit("plan", "--calibrate", str(bench_dir), "--model", "mnist", "--gpus", "2,16,512", "--json",
                      "--plot", str(tmp_path / "plan.png"), timeout=600)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["assumptions"]["bandwidth_GBps"] > 0 and plan["check"]["np"] == 2
    effs = [p["ring_efficiency"] for p in plan["predictions"]]
    assert all(0 < e <= 1 for e in effs) and effs == sorted(effs, reverse=True)
    # (which scheme wins at 512 depends on the fitted latency: a small model on a
    # high-latency fit can favour one server, so the test does not assume it)
    assert plan["check"]["measured_step_ms"] > 0 and plan["check"]["predicted_step_ms"] > 0
    assert (tmp_path / "plan.png").stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["bench", "allreduce", "--sizes", "12Q"], "size '12Q' is not understood"),
    (["bench", "allreduce", "--impls", "nccl2"], "unknown implementation 'nccl2'"),
    (["bench", "train", "--models", "vgg"], "model 'vgg' is unknown"),
    (["bench", "train", "-np", "1,2", "--impls", "ps"], "the first process is the server, so use -np 2 or more"),
    (["bench", "allreduce", "-np", "1", "--impls", "hvdkit,ps"], "use -np 2 or more"),
    (["plan", "--calibrate", "/nonexistent"], "run hvdkit bench first"),
    (["plan", "--gpus", "0"], "worker counts of 1 or more"),
])
def test_bad_bench_and_plan_input_is_one_line(args, message):
    proc = run_hvdkit(*args, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


NO_TORCH = """import sys


class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
"""


@pytest.mark.parametrize("bench", ["allreduce", "train"])
def test_bench_without_torch_is_one_line_not_a_traceback_per_implementation(tmp_path, bench):
    """The TensorFlow GPU flavour has no torch: every implementation's workers failed with a traceback each,
    then the bench wrote empty results and exited 0."""
    from tests.conftest import job_env

    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    env = job_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env.get('PYTHONPATH', '')}"
    proc = run_hvdkit("bench", bench, "-np", "2", "--out", str(tmp_path / "out"), timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "needs PyTorch" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


PS_CHECK = """
import torch
from hvdkit.bench.ps import ParameterServer
ps = ParameterServer.from_launcher()
shapes = [(3, 2), (5,)]
for step in range(3):
    if ps.is_server:
        ps.serve_once([torch.empty(s) for s in shapes])
    else:
        mine = [torch.full(s, float(ps.rank * 10 + step)) + torch.arange(torch.Size(s).numel()).view(s) for s in shapes]
        ps.average(mine)
        # workers 1 and 2: the mean of 10 + step and 20 + step, plus the shared arange
        want = [torch.full(s, 15.0 + step) + torch.arange(torch.Size(s).numel()).view(s) for s in shapes]
        assert all(torch.equal(a, b) for a, b in zip(mine, want)), (mine, want)
        print(f"worker {ps.rank} of {ps.workers}: step {step} averaged", flush=True)
ps.close()
"""


def test_parameter_server_averages_the_workers_tensors(tmp_path):
    # The ps bench's exchange, checked for values: one server and two workers under horovodrun --gloo.
    from tests.conftest import BIN, job_env, run_job

    script = tmp_path / "ps_check.py"
    script.write_text(PS_CHECK)
    port = free_port()                          # torch.distributed's rendezvous, as the bench runner picks it
    proc = run_job([str(BIN / "horovodrun"), "-np", "3", "-H", "localhost:3", "--gloo", str(BIN / "python"),
                    str(script)], timeout=180, env=job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    assert proc.returncode == 0, proc.stdout[-3000:]
    for rank in (1, 2):
        assert f"worker {rank} of 2: step 2 averaged" in proc.stdout


def test_train_bench_runs_the_parameter_server(tmp_path):
    proc = run_hvdkit("bench", "train", "-np", "3", "--impls", "ps", "--models", "mnist", "--steps", "3",
                      "--warmup", "1", "--repeats", "1", "--out", str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    (row,) = json.loads((tmp_path / "train.json").read_text())["rows"]
    assert row["impl"] == "ps" and row["np"] == 2            # 3 processes: the server and 2 workers
    assert row["allreduce_ms"] > 0 and row["samples_per_s"] > 0


def test_a_full_disk_stops_the_bench_before_it_measures_and_keeps_the_last_results(tmp_path):
    """A real tmpfs of 256 KiB, filled up: the bench stops in a second with one line, launches nothing, and the
    results already there stay as they were."""
    import subprocess
    import time

    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                             capture_output=True, text=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs ({mounted.stderr.strip()}): the cli tier runs as root"
    try:
        (where / "allreduce.json").write_text('{"kept": true}\n')
        with open(where / "filler", "wb", buffering=0) as filler:   # then fill it up
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass
        started = time.monotonic()
        proc = run_hvdkit("bench", "allreduce", "-np", "2", "--sizes", "4K", "--out", str(where), timeout=120)
        took = time.monotonic() - started
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"hvdkit bench: error: --out {str(where)!r} has 0 B free, and a bench's results need about 1 MiB: "
            "free space there or choose another --out directory"], proc.stderr
        assert "allreduce" not in proc.stdout and took < 60          # nothing was launched
        assert (where / "allreduce.json").read_text() == '{"kept": true}\n'
        assert sorted(p.name for p in where.iterdir()) == ["allreduce.json", "filler"]
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
