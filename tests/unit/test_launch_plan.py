import re

import pytest

from hvdkit.common.errors import UserError
from hvdkit.ops.hosts import HostSpecError, parse_hosts_string
from hvdkit.ops.launch import BuildFlags, LaunchConfig, check_command, plan_launch

pytestmark = pytest.mark.unit
BOTH = BuildFlags(mpi=True, gloo=True)


def cfg(**kw):
    base = dict(np=4, hosts=parse_hosts_string("hosta:2,hostb:2"), command=("python", "train.py"))
    base.update(kw)
    return LaunchConfig(**base)


def test_plan_is_the_horovodrun_line():
    plan = plan_launch(cfg(ssh_port=12345, network_interface="eth0", ssh_identity_file="/k"), BOTH)
    assert plan.argv == ("horovodrun", "-np", "4", "-H", "hosta:2,hostb:2", "--gloo", "-p", "12345",
                         "--ssh-identity-file", "/k", "--network-interface", "eth0", "python", "train.py")
    assert plan.shell().startswith("horovodrun -np 4 -H hosta:2,hostb:2 --gloo")


GPU = BuildFlags(mpi=True, gloo=True, nccl=True)


@pytest.mark.parametrize("build, requested, hosts, expected", [
    (BOTH, "auto", "hosta:2,hostb:2", "gloo"),         # several CPU hosts: Gloo's ring beat MPI over TCP
    (BOTH, "auto", "localhost:4", "mpi"),              # one host: MPI's shared memory
    (BOTH, "auto", "127.0.0.1:2,localhost:2", "mpi"),
    (GPU, "auto", "hosta:2,hostb:2", "mpi"),           # NCCL carries the data; MPI negotiates
    (BuildFlags(mpi=False, gloo=True), "auto", "localhost:4", "gloo"),
    (BuildFlags(mpi=True, gloo=False), "auto", "hosta:2,hostb:2", "mpi"),
    (BOTH, "gloo", "localhost:4", "gloo"),
    (BOTH, "mpi", "hosta:2,hostb:2", "mpi"),
])
def test_controller_choice(build, requested, hosts, expected):
    plan = plan_launch(cfg(controller=requested, hosts=parse_hosts_string(hosts)), build)
    assert plan.controller == expected
    if requested == "auto" and build.mpi and build.gloo:     # the plan line says why, and how to override
        assert ("--mpi to override" if expected == "gloo" else "--gloo to override") in plan.reason


@pytest.mark.parametrize("hosts, np, expected", [
    ("node1:8", 8, "mpi"),                 # one remote machine: its ranks share memory
    ("hosta:4,hostb:4", 4, "mpi"),         # -np 4 fills hosta alone
    ("hosta:4,hostb:4", 5, "gloo"),
])
def test_the_choice_counts_the_machines_the_ranks_land_on(hosts, np, expected):
    assert plan_launch(cfg(hosts=parse_hosts_string(hosts), np=np), BOTH).controller == expected


def test_hosts_from_a_slurm_allocation_get_mpi_which_starts_ranks_inside_the_job():
    # horovodrun's Gloo reaches hostb over ssh, outside the job: Slurm gives those ranks no GPUs there.
    from hvdkit.ops.hosts import HostSpec

    allocation = HostSpec(parse_hosts_string("hosta:2,hostb:2").hosts, "slurm")
    plan = plan_launch(cfg(hosts=allocation), BOTH)
    assert plan.controller == "mpi" and "srun" in plan.reason and "--gloo" in plan.reason
    assert plan_launch(cfg(hosts=allocation, controller="gloo"), BOTH).controller == "gloo"
    assert plan_launch(cfg(hosts=allocation), BuildFlags(mpi=False, gloo=True)).controller == "gloo"


def test_this_machine_by_its_own_name_is_one_host_to_the_controller_choice():
    import socket

    plan = plan_launch(cfg(hosts=parse_hosts_string(f"{socket.gethostname()}:4")), BOTH)
    assert plan.controller == "mpi"


@pytest.mark.parametrize("kw, build, message", [
    (dict(np=5), BOTH, "np=5 but -H has 4 slots"),
    (dict(controller="mpi"), BuildFlags(mpi=False, gloo=True), "built without MPI"),
    (dict(controller="nccl"), BOTH, "controller 'nccl' is unknown"),
    (dict(ssh_port=70000), BOTH, "out of range"),
])
def test_bad_configs(kw, build, message):
    with pytest.raises((UserError, HostSpecError), match=message):
        plan_launch(cfg(**kw), build)


def test_command_checks():
    with pytest.raises(UserError, match="no training command"):
        check_command(())
    with pytest.raises(UserError, match="script 'nope.py' does not exist"):
        check_command(("python", "nope.py"), exists=lambda p: False)
    check_command(("python", "-m", "mod"), exists=lambda p: False)
    check_command(("python3", "ok.py"), exists=lambda p: True)


@pytest.mark.parametrize("output, line", [
    ("The first process to do so was:\nProcess name: 3\nExit code: -9\n",
     "rank 3 on b, local rank 1 ended first: killed by SIGKILL"),
    ("  Process name: [[29678,1],1]\n  Exit code:    1\n", "rank 1 on a, local rank 1 ended first: exit status 1"),
    ("mpirun noticed that process rank 2 with PID 0 on node b exited on signal 9 (Killed).",
     "rank 2 on b, local rank 0 ended first: killed by SIGKILL"),
    ("Process name: 0\nExit code: 137\n", "rank 0 on a, local rank 0 ended first: killed by SIGKILL"),
    ("all fine", None),
])
def test_failure_line_names_rank_host_and_cause(output, line):
    from hvdkit.ops.hosts import rank_layout
    from hvdkit.ops.job_output import explain_failure

    assert explain_failure(output, rank_layout(parse_hosts_string("a:2,b:2"), 4)) == line


def elastic(**kw):
    base = dict(np=2, hosts=parse_hosts_string("localhost:2"), discovery_script="discover.sh", min_np=1, max_np=4)
    base.update(kw)
    return cfg(**base)


def test_elastic_plan_names_the_loopback_when_every_host_is_local():
    plan = plan_launch(elastic(), BOTH)
    assert plan.argv == ("horovodrun", "-np", "2", "--min-np", "1", "--max-np", "4", "--host-discovery-script",
                         "discover.sh", "--gloo", "--network-interface", "lo", "python", "train.py")
    assert plan.controller == "gloo" and "every host is this machine" in plan.reason


def test_elastic_plan_leaves_the_interface_to_horovodrun_on_several_hosts_or_when_given():
    plan = plan_launch(elastic(hosts=parse_hosts_string("a:2,b:2")), BOTH)
    assert "--network-interface" not in plan.argv
    plan = plan_launch(elastic(network_interface="eth0"), BOTH)
    assert plan.argv[plan.argv.index("--network-interface") + 1] == "eth0"


def test_elastic_timeout_and_reset_limit_pass_through():
    plan = plan_launch(elastic(elastic_timeout=60, reset_limit=3), BOTH)
    assert plan.shell().startswith("horovodrun -np 2 --min-np 1 --max-np 4 --elastic-timeout 60 --reset-limit 3 ")
    # alone it makes the job elastic: --min-np, which horovodrun keys on
    plan = plan_launch(cfg(elastic_timeout=60), BOTH)
    assert "--min-np" in plan.argv and "--gloo" in plan.argv


def test_elastic_plan_with_a_fixed_host_list_and_default_min_np():
    plan = plan_launch(cfg(max_np=4), BOTH)
    assert plan.argv == ("horovodrun", "-np", "4", "--min-np", "4", "--max-np", "4", "-H", "hosta:2,hostb:2",
                         "--gloo", "python", "train.py")


@pytest.mark.parametrize("kw, build, message", [
    (dict(min_np=3), BOTH, "--min-np 3 must be between 1 and -np 2"),
    (dict(max_np=1), BOTH, "--max-np 1 is below -np 2"),
    (dict(controller="mpi"), BOTH, "drop --mpi"),
    (dict(), BuildFlags(mpi=True, gloo=False), "needs Horovod built with Gloo"),
    (dict(discovery_script=None), BOTH, "fixed -H list needs 2 or more hosts"),
    (dict(discovery_script=None, hosts=None), BOTH, "pass --host-discovery-script"),
    (dict(hosts=parse_hosts_string("gpu1:8")), BOTH, "needs --network-interface"),
    (dict(discovery_script=None, hosts=parse_hosts_string("a:1,b:1"), np=3, max_np=None), BOTH, "np=3 but -H has 2"),
])
def test_bad_elastic_configs(kw, build, message):
    with pytest.raises((UserError, HostSpecError), match=message):
        plan_launch(elastic(**kw), build)


CHAINED = """[1]<stderr>:Traceback (most recent call last):
[0]<stderr>:Traceback (most recent call last):
[0]<stderr>:OSError: [Errno 30] Read-only file system: 'ckpts/.ckpt-00000001.pt.x.tmp'
[0]<stderr>:
[0]<stderr>:The above exception was the direct cause of the following exception:
[0]<stderr>:
[0]<stderr>:Traceback (most recent call last):
[0]<stderr>:hvdkit.runtime.checkpoint_files.CheckpointError: cannot write checkpoint 'ckpts/ckpt-00000001.pt'
[1]<stderr>:horovod.common.exceptions.HorovodInternalError: Horovod has been shut down. This was caused by ...
Process name: 1
Exit code: 1
"""


EXPLAINED = [
    # horovodrun reaped rank 1 first, but rank 1 only failed because rank 0 did
    (CHAINED, "rank 0 on a, local rank 0 failed first: hvdkit.runtime.checkpoint_files.CheckpointError: cannot write "
              "checkpoint 'ckpts/ckpt-00000001.pt'"),
    ("[1,3]<stderr>:Traceback (most recent call last):\n[1,0]<stderr>:Traceback (most recent call last):\n"
     "[1,3]<stderr>:ValueError: bad batch\n[1,0]<stderr>:RuntimeError: Connection reset by peer\n"
     "Process name: [[1,1],0]\nExit code: 1\n", "rank 3 on b, local rank 1 failed first: ValueError: bad batch"),
    ("[1]<stderr>:error: cannot write checkpoint 'c.pt': No space left on device (errno 28): free space\n"
     "[0]<stderr>:RuntimeError: Horovod has been shut down\nProcess name: 0\nExit code: 1\n",
     "rank 1 on a, local rank 1 failed first: error: cannot write checkpoint 'c.pt': No space left on device "
     "(errno 28): free space"),
    # the patch's stall_inspector.cc message, word for word (scripts/patches/horovod-0.28.1/08-*.patch)
    ("[0]<stderr>:[2026-11-23 18:00:00.000: E stall_inspector.cc:90] Deadlock: every rank is waiting in a "
     "collective that another rank never joined, for more than 2 seconds: rank 0 waits in [a]; rank 1 waits in "
     "[b]; the ranks ran different numbers of steps or took different branches (most often: a different number "
     "of batches per rank; give every rank the same, as hvdkit's shard_arrays and distributed_loader do). "
     "Shutting Horovod down (HOROVOD_STALL_MISMATCH_SHUTDOWN=0 keeps waiting).\n"
     "[0]<stderr>:HorovodInternalError: Horovod has been shut down\n",
     "the ranks deadlocked: every rank is waiting in a collective that another rank never joined, for more than 2 "
     "seconds: rank 0 waits in [a]; rank 1 waits in [b]; the ranks ran different numbers of steps or took "
     "different branches (most often: a different number of batches per rank; give every rank the same, as "
     "hvdkit's shard_arrays and distributed_loader do)."),
    # a collective hvdkit call made on one rank alone (a sharded save under `if ctx.is_main:`): named, with the fix
    ("[0]<stderr>:[2026-11-26 22:16:55.944: E stall_inspector.cc:105] Deadlock: every rank is waiting in a "
     "collective that another rank never joined, for more than 60 seconds: rank 0 waits in "
     "[allgather.hk.save_checkpoint.sharded_state.sz]; rank 1 waits in [allreduce.bias, allreduce.weight]; the "
     "ranks ran different numbers of steps or took different branches (most often: a different number of batches "
     "per rank; give every rank the same, as hvdkit's shard_arrays and distributed_loader do). Shutting Horovod "
     "down (HOROVOD_STALL_MISMATCH_SHUTDOWN=0 keeps waiting).\n",
     "the ranks deadlocked: every rank is waiting in a collective that another rank never joined, for more than 60 "
     "seconds: rank 0 waits in [allgather.hk.save_checkpoint.sharded_state.sz]; rank 1 waits in [allreduce.bias, "
     "allreduce.weight]; the ranks ran different numbers of steps or took different branches (most often: a "
     "different number of batches per rank; give every rank the same, as hvdkit's shard_arrays and "
     "distributed_loader do). hk.save_checkpoint is collective: call it on every rank, not under "
     "`if ctx.is_main:`."),
    # TensorFlow's graph-mode error names the cause on later lines of the same traceback
    ("[0]<stderr>:Traceback (most recent call last):\n[0]<stderr>:tensorflow.python.framework.errors_impl."
     "UnknownError: Graph execution error:\n[0]<stderr>:Horovod has been shut down. This was caused by ...\n"
     "[1]<stderr>:Traceback (most recent call last):\n[1]<stderr>:ValueError: bad shard\n"
     "Process name: 0\nExit code: 1\n",
     "rank 1 on a, local rank 1 failed first: ValueError: bad shard"),
    # a log line that merely starts with an exception's name is not an error
    ("[0]<stderr>:ConnectionError retrying in 5 s\n[1]<stderr>:Traceback (most recent call last):\n"
     "[1]<stderr>:KeyError: 'x'\nProcess name: 1\nExit code: 1\n",
     "rank 1 on a, local rank 1 failed first: KeyError: 'x'"),
    # a rank killed by a signal prints no traceback; it is the cause, not the ranks that then raised
    ("[0]<stderr>:Traceback (most recent call last):\n[0]<stderr>:ValueError: late\n"
     "Process name: 3\nExit code: 137\n",
     "rank 3 on b, local rank 1 ended first: killed by SIGKILL"),
    ("[0]<stderr>:SystemExit: 75\nProcess name: 0\nExit code: 75\n", "rank 0 on a, local rank 0 ended first: "
                                                                      "exit status 75"),
    # mpirun tags each write: an exception's type and its message, written apart, carry the tag twice
    ("[1,1]<stderr>:Traceback (most recent call last):\n[1,1]<stderr>:hvdkit.common.errors.UserError: "
     "[1,1]<stderr>:2 parameter(s) need a gradient\n  Process name: [[29678,1],1]\n  Exit code:    1\n",
     "rank 1 on a, local rank 1 failed first: hvdkit.common.errors.UserError: 2 parameter(s) need a gradient"),
]


@pytest.mark.parametrize("output, line", EXPLAINED)
def test_the_rank_whose_own_error_came_first_is_named(output, line):
    from hvdkit.ops.hosts import rank_layout
    from hvdkit.ops.job_output import explain_failure

    assert explain_failure(output, rank_layout(parse_hosts_string("a:2,b:2"), 4)) == line


@pytest.mark.parametrize("elastic", [{}, {"min_np": 2}])
def test_timeline_is_recorded_without_the_response_cache(elastic):
    # With Horovod's response cache on, only a tensor's first negotiation names when each rank was ready.
    plan = plan_launch(cfg(timeline="/runs/tl.json", controller="gloo", **elastic), BOTH)
    assert plan.argv[-4:] == ("--cache-capacity", "0", "python", "train.py")
    assert plan.argv[-6:-4] == ("--timeline-filename", "/runs/tl.json")
    assert "--timeline-filename" not in plan_launch(cfg(), BOTH).argv


def test_an_elastic_workers_host_is_read_from_the_command_horovodrun_starts_it_with():
    """Issue 35: horovodrun says only "Process 1 exit with status code 137." when an elastic worker is lost."""
    from hvdkit.common.launcher import horovodrun_worker_slot as worker_slot
    from hvdkit.ops.job_output import explain_worker_exit, removed_worker, worker_exit

    local = ("/bin/sh -c env HOROVOD_HOSTNAME=127.0.0.1 HOROVOD_RANK=1 HOROVOD_SIZE=2 HOROVOD_LOCAL_RANK=0 "
             "HOROVOD_CROSS_RANK=0 PATH=/bin python train.py")
    remote = ("ssh -o PasswordAuthentication=no hostb 'cd /work > /dev/null 2>&1 ; env HOROVOD_HOSTNAME=hostb "
              "HOROVOD_RANK=3 HOROVOD_SIZE=4 HOROVOD_LOCAL_RANK=1 HOROVOD_CROSS_RANK=1 python train.py'")
    assert worker_slot(local) == (1, "127.0.0.1", 0) and worker_slot(remote) == (3, "hostb", 1)
    assert worker_slot("python -m hvdkit hosts --hostfile h --to discovery") is None
    assert worker_exit("Process 1 exit with status code 137.\n") == (1, 137)
    assert worker_exit("[1]<stderr>:Process 1 exit with status code 1.") is None
    slots = {1: ("127.0.0.1", 0)}
    # issue 54, case 10: every worker seen on the lost one's host: the job stops, and the line says so
    assert explain_worker_exit(1, 137, slots, set()) == (
        "worker lost: rank 1 on 127.0.0.1, local rank 0: killed by SIGKILL; Horovod drops its host, 127.0.0.1, "
        "where every worker of this job runs, so the job stops")
    other = explain_worker_exit(1, 137, {0: ("localhost", 0), **slots}, set())
    assert other.startswith("worker lost: rank 1 on 127.0.0.1, local rank 0: killed by SIGKILL; Horovod drops its "
                            "host and every worker on it; the job goes on while --min-np workers remain on other "
                            "hosts, after a pause of up to HOROVOD_GLOO_TIMEOUT_SECONDS"), other
    assert "rank 2 (its host is unknown" in explain_worker_exit(2, 1, slots, set())
    # a slot the discovery script no longer lists: Horovod ends its worker with status 1, which is no failure
    gone = removed_worker("[1]<stderr>:[...] rendezvous failed: localhost[1] has been removed from elastic job")
    assert gone == 1 and removed_worker("Process 1 exit with status code 1.") is None
    assert explain_worker_exit(1, 1, slots, {gone}) == (
        "worker left: rank 1 on 127.0.0.1, local rank 0: its slot is no longer in the discovered hosts (exit status 1)")
    # preempted (issue 50): every rank checkpoints and exits 75 together; the job does not go on without it
    assert explain_worker_exit(1, 75, slots, set()) == (
        "worker preempted: rank 1 on 127.0.0.1, local rank 0: exit status 75, after the ranks' checkpoint")


def test_the_timeline_directory_is_checked_where_rank_0_runs_here(tmp_path):
    from hvdkit.ops.launch import check_timeline

    here, there = parse_hosts_string("localhost:2"), parse_hosts_string("hostb:2,localhost:2")
    check_timeline(str(tmp_path / "tl.json"), here)
    check_timeline("/no/such/dir/tl.json", there)            # rank 0 on another host: its file system
    (tmp_path / "file").write_text("")
    for path, message in [(tmp_path / "missing" / "tl.json", "missing' does not exist and Horovod does not create "
                                                             f"it: mkdir -p {tmp_path / 'missing'}"),
                          (tmp_path / "file" / "tl.json", "file' is not a directory"),
                          (tmp_path, "is a directory: give a file name")]:
        with pytest.raises(UserError, match=message.replace("(", r"\(")):
            check_timeline(str(path), here)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]     # nothing made, the probe removed


GLOO_PREEMPTED = """[1]<stderr>:saved
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be \
terminated. The first process to do so was:
Process name: 1
Exit code: 75
"""


@pytest.mark.parametrize("rc, output, expected", [
    (1, GLOO_PREEMPTED, True),                                      # horovodrun --gloo exits 1 after the ranks' 75
    (75, "", True),                                                  # mpirun passes 75 up
    (1, GLOO_PREEMPTED.replace("Exit code: 75", "Exit code: 1"), False),
    (0, GLOO_PREEMPTED, False),
    (1, "mpirun noticed that process rank 1 with PID 5 on node a exited on signal 9 (Killed).\n"
        "Process name: [[1,1],1]\nExit code: 75\n", False),          # a kill is not a preemption
    # An elastic job (issue 50): every worker exits 75 and the elastic driver stops, naming the slot as host[N].
    (1, "Process 1 exit with status code 75.\nProcess 0 exit with status code 75.\n"
        "ERROR:root:failure count == 2 -> stop running\n" + GLOO_PREEMPTED.replace("name: 1", "name: localhost[0]"),
     True),
    (1, GLOO_PREEMPTED.replace("name: 1", "name: hostb[1]").replace("Exit code: 75", "Exit code: 137"), False),
])
def test_a_preempted_job_is_told_from_a_failed_one(rc, output, expected):
    from hvdkit.ops.job_output import ended_by_preemption

    assert ended_by_preemption(rc, output) is expected


def test_the_deadlock_fixture_is_the_message_the_patch_prints():
    """The explanation above is read from what the patched stall inspector writes; keep the two in step."""
    from tests.conftest import ROOT

    patch = (ROOT / "scripts" / "patches" / "horovod-0.28.1" / "08-stall-inspector-ends-deadlock.patch").read_text()
    code = patch[patch.index('message << "Deadlock: '):patch.index("LOG(ERROR) << message.str()")]
    printed = "".join(re.findall(r'"([^"]*)"', code))          # the C++ string literals, in order
    assert printed.startswith("Deadlock: every rank is waiting in a collective that another rank never joined")
    fixture = next(o for o, _ in EXPLAINED if "Deadlock:" in o)
    assert printed.split(" for more than")[0] in fixture
    assert printed[printed.index("the ranks ran"):] in fixture


def test_a_local_jobs_program_must_exist_here():
    """A user trial: `hvdkit launch -- nosuchprog x.py` passed the checks and failed in a page of Open MPI text."""
    from hvdkit.ops.hosts import parse_hosts_string
    from hvdkit.ops.launch import check_program

    local, remote = parse_hosts_string("localhost:2"), parse_hosts_string("server1:2,server2:2")
    with pytest.raises(UserError, match=r"program 'nosuchprog' is not found on this machine \(not on PATH\): give "
                                        r"its path, or activate the environment that has it"):
        check_program(("nosuchprog", "x.py"), local, which=lambda p: None)
    with pytest.raises(UserError, match=r"\(no such executable file\)"):
        check_program(("/opt/venv/bin/python", "x.py"), local, which=lambda p: None)
    check_program(("python", "x.py"), local, which=lambda p: "/usr/bin/python")
    check_program(("/opt/venv/bin/python", "x.py"), remote, which=lambda p: None)   # resolved on those hosts
