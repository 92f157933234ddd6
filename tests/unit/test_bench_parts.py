"""Benchmark plumbing: result transport through horovodrun's prefixes, sizes, launch plans, tuning.

The models (torch) are checked in tests/adapters/test_bench_models.py: this tier runs without torch.
"""

import io

import pytest

from hvdkit.bench.catalog import CATALOG, implementation, implementations
from hvdkit.bench.report import allreduce_rows, allreduce_table, bus_factor
from hvdkit.bench.results import collect, emit
from hvdkit.bench.runner import TrainBench, available, plan_horovodrun, plan_train
from hvdkit.common.errors import UserError
from hvdkit.common.units import format_bytes
from hvdkit.common.units import parse_byte_range as parse_sizes
from hvdkit.ops.hosts import parse_hosts_string
from hvdkit.ops.launch import BuildFlags, LaunchTarget
from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def test_results_survive_rank_prefixes_inserted_mid_line():
    payload = {"impl": "hvdkit", "rows": [{"times_s": [0.001 * i for i in range(300)]}]}
    buf = io.StringIO()
    emit(payload, buf)
    lines = buf.getvalue().splitlines()
    assert len(lines) > 3
    # What OpenMPI did in a real run: a prefix inside a line, and other ranks' output between lines.
    mangled = [f"[1,0]<stdout>:{line[:50]}[1,0]<stdout>:{line[50:]}" if i == 2 else f"[1,0]<stdout>:{line}"
               for i, line in enumerate(lines)]
    mangled.insert(1, "[1,1]<stderr>:some warning")
    assert collect("\n".join(mangled)) == payload
    assert collect("\n".join(mangled[:-1])) is None   # a missing chunk is "no result", not garbage


def test_sizes():
    assert parse_sizes("4K:256M") == [4 << 10 << 2 * i for i in range(9)]
    assert parse_sizes("1M,16M") == [1 << 20, 16 << 20]
    for bad, fix in (("12Q", "16M"), ("1M:4K", "LOW:HIGH"), ("2", "4 bytes")):
        with pytest.raises(UserError, match=fix):
            parse_sizes(bad)


def test_format_bytes_stops_at_tebibytes():
    assert [format_bytes(n) for n in (3, 1023, 1536, 16 << 20, 1 << 40, 5 << 50)] == \
        ["3 B", "1023 B", "1.5 KiB", "16 MiB", "1 TiB", "5.12e+03 TiB"]


def test_launch_plans_share_hosts_and_pick_controllers():
    target = LaunchTarget(np=4, hosts=parse_hosts_string("a:2,b:2"), ssh_port=12345, python="/venv/bin/python")
    build = BuildFlags(mpi=True, gloo=True)
    plans = {impl.name: plan_horovodrun(impl, target, build, ("-m", "w"), port=29555)
             for impl in implementations("allreduce")}
    for plan in plans.values():
        assert plan.argv[1:5] == ("-np", "4", "-H", "a:2,b:2") and "-p" in plan.argv
    # hvdkit as launch runs it: Gloo on several CPU hosts; horovod-mpi keeps MPI for the comparison
    assert "--gloo" in plans["hvdkit"].argv and "--gloo" in plans["horovod-gloo"].argv
    assert "--mpi" in plans["horovod-mpi"].argv
    assert plans["torch"].env == {"MASTER_ADDR": "a", "MASTER_PORT": "29555"}
    keep, skipped = available(implementations("allreduce", ["hvdkit", "horovod-mpi", "mpi4py", "torch"]),
                              BuildFlags(mpi=False, gloo=True))
    assert [i.name for i in keep] == ["hvdkit", "torch"] and set(skipped) == {"horovod-mpi", "mpi4py"}


def test_the_catalog_offers_only_what_the_workers_run():
    # Every name the CLI accepts is one its worker's --impl accepts, and each framework has a worker class.
    for bench in ("allreduce", "train"):
        worker = (ROOT / "hvdkit" / "bench" / f"{bench}.py").read_text()
        assert f'every_implementation("{bench}")' in worker
    assert {i.framework for i in CATALOG} == {"hvdkit", "horovod", "torch.distributed", "mpi4py", "ps"}
    # The parameter server runs only when named: the default launches keep their process count.
    assert "ps" not in [i.name for i in implementations("allreduce")] + [i.name for i in implementations("train")]
    assert {i.bench for i in CATALOG} == {"allreduce", "train"}
    for bench in ("allreduce", "train"):
        names = [i.name for i in implementations(bench)]
        assert len(names) == len(set(names))
    with pytest.raises(UserError, match="unknown implementation 'horovod-auto' for bench allreduce: use some of "
                                        "hvdkit, horovod-mpi"):
        implementation("allreduce", "horovod-auto")


def test_train_plan_runs_ddp_under_torchrun_on_this_host_only():
    build = BuildFlags(mpi=True, gloo=True)
    here = LaunchTarget(np=2, hosts=parse_hosts_string("localhost:2"), python="py")
    there = LaunchTarget(np=2, hosts=parse_hosts_string("a:1,b:1"), python="py")
    launches, skipped = plan_train([here, there], build, TrainBench(models=("mnist",)))
    assert [launch.impl for launch in launches] == ["hvdkit", "horovod", "ddp", "hvdkit", "horovod"]
    assert launches[2].argv[:6] == ("py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    assert launches[2].argv[-2:] == ("--impl", "ddp") and "OMP_NUM_THREADS" in launches[2].env
    assert "--mpi" in launches[0].argv and "-H" in launches[4].argv
    assert set(skipped) == {"ddp"}
    with pytest.raises(UserError, match="model 'vgg' is unknown"):
        TrainBench(models=("vgg",))
    # Threads: the host's cores over its ranks, unless the bench was given a count (OMP_NUM_THREADS).
    launches, _ = plan_train([there], build, TrainBench(models=("mnist",), threads=1))
    assert {launch.env["OMP_NUM_THREADS"] for launch in launches} == {"1"}


def test_the_parameter_server_meets_at_the_first_host():
    target = LaunchTarget(np=3, hosts=parse_hosts_string("server:1,w1:1,w2:1"), ssh_port=12345, python="py")
    plan = plan_horovodrun(implementation("allreduce", "ps"), target, BuildFlags(mpi=True, gloo=True), ("-m", "w"),
                           port=29555)
    assert "--gloo" in plan.argv and plan.env == {"MASTER_ADDR": "server", "MASTER_PORT": "29555"}


def test_bus_bandwidth_follows_nccl_tests():
    assert bus_factor(2) == 1.0 and bus_factor(8) == pytest.approx(1.75)
    payloads = [{"impl": i, "label": i, "controller": "mpi", "np": 2,
                 "rows": [{"case": "sweep", "bytes": 1 << 20, "tensors": 1, "times_s": [t, t, 1.0]}]}
                for i, t in (("hvdkit", 0.001), ("mpi4py", 0.0005), ("mpi4py-avg", 0.0008))]
    rows = allreduce_rows(payloads)
    assert rows[0]["median_s"] == 0.001 and rows[0]["busbw_GBps"] == pytest.approx((1 << 20) / 0.001 / 1e9)
    header, line = allreduce_table(rows).splitlines()[1:3]
    # hvdkit's share of each reference's bandwidth: 0.5 ms / 1 ms of raw MPI's sum, 0.8 / 1 of sum-then-scale
    assert header.split()[-2:] == ["hvdkit/mpi4py", "hvdkit/mpi4py-avg"] and line.split()[-2:] == ["50%", "80%"]
    assert "hvdkit/mpi4py-avg" not in allreduce_table(rows[:2])


def test_a_result_write_that_fails_midway_keeps_the_previous_file_whole(tmp_path):
    """A real failed write (the file-size limit, EFBIG, standing in for a full disk) in a child process: one
    line naming the file and the fix, no temporary file left, the previous results byte for byte."""
    import subprocess
    import sys

    previous = tmp_path / "allreduce.json"
    previous.write_text('{"kind": "allreduce", "rows": []}\n')
    child = f"""
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from hvdkit.bench.report import write_json
from hvdkit.common.errors import UserError
try:
    write_json({str(previous)!r}, {{"rows": ["x" * 100] * 1000}})
except UserError as exc:
    print(exc)
"""
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert message.startswith(f"cannot write bench result {str(previous)!r}: File too large (errno 27)"), message
    assert message.endswith("the previous bench result is untouched") and "\n" not in message
    assert previous.read_text() == '{"kind": "allreduce", "rows": []}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["allreduce.json"]


def test_a_results_directory_that_cannot_be_written_is_refused_before_any_launch(tmp_path):
    from hvdkit.bench.report import check_results_dir

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UserError, match=r"cannot write bench results to .*Not a directory.*choose another --out"):
        check_results_dir(str(blocker / "results"))
    check_results_dir(str(tmp_path / "results"))                # writable, with room: no error


def test_the_baselines_pin_the_gpu_hk_init_would_under_either_launcher_visibility():
    from hvdkit.bench.results import cuda_index, pin_cuda

    # The host's 4 GPUs shown to every rank: the local rank's. One per rank (Slurm --gpus-per-task): the first,
    # where cuda:<local rank> does not exist (the baselines pinned it and failed there).
    assert [cuda_index(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert [cuda_index(r, 1) for r in range(4)] == [0, 0, 0, 0]

    class Cuda:                                   # torch.cuda as the workers pass it in
        def __init__(self, count):
            self.count, self.pinned = count, None

        def is_available(self):
            return self.count > 0

        def device_count(self):
            return self.count

        def set_device(self, index):
            self.pinned = index

    for count, local_rank, pinned in ((4, 2, 2), (1, 3, 0), (0, 1, None)):
        cuda = Cuda(count)
        assert pin_cuda(local_rank, cuda) == pinned and cuda.pinned == pinned
