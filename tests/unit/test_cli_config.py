"""Each command's arguments become one typed config, validated in from_args; nothing is launched."""

import pytest

from hvdkit.cli.bench import AllreduceConfig, TrainConfig
from hvdkit.cli.hosts import HostsConfig
from hvdkit.cli.launch import LaunchCommandConfig
from hvdkit.cli.main import SUBCOMMANDS, build_parser
from hvdkit.common.errors import UserError
from hvdkit.ops.hosts import parse_hosts_string
from hvdkit.ops.launch import BuildFlags, plan_launch
from tests.conftest import ROOT

pytestmark = pytest.mark.unit
EXAMPLE = str(ROOT / "examples" / "pytorch_mnist.py")


def config(*argv):
    args = build_parser().parse_args(list(argv))
    return args.config(args)


def test_every_command_parser_defaults_to_a_frozen_config_and_its_modules_run():
    """The rule docs/ARCHITECTURE.md states for hvdkit/cli: config=<frozen dataclass>.from_args, run=<module>.run."""
    import argparse
    import dataclasses
    import sys

    def leaves(parser):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [parser]
        return [leaf for sub in subs for child in sub.choices.values() for leaf in leaves(child)]

    commands = leaves(build_parser())
    assert len(commands) == len(SUBCOMMANDS) + 1          # bench has two subcommands
    # every command module's run is some parser's: none is registered without its config
    assert ({sys.modules[p.get_default("config").__self__.__module__] for p in commands}
            == {sys.modules[m] for m in SUBCOMMANDS.values()})
    for parser in commands:
        config, run = parser.get_default("config"), parser.get_default("run")
        cls = config.__self__
        assert config.__func__.__name__ == "from_args" and dataclasses.is_dataclass(cls), parser.prog
        assert cls.__dataclass_params__.frozen, f"{parser.prog}: {cls.__name__} is not frozen"
        assert run is sys.modules[cls.__module__].run, parser.prog


def test_a_command_imports_its_own_module_only():
    """A discovery script runs `hvdkit hosts` every second of an elastic job: it loads neither bench's nor launch's
    modules (0.42 s a run with them, 0.13 s without, measured), and each name builds the parser of that name."""
    import argparse
    import subprocess
    import sys

    for name in SUBCOMMANDS:
        sub = next(a for a in build_parser(only=name)._actions if isinstance(a, argparse._SubParsersAction))
        assert list(sub.choices) == [name]
    code = ("import sys; from hvdkit.cli.main import main; rc = main(['hosts', '-H', 'a:2,b:1', '--to', 'discovery']);"
            "print(rc, sorted(m for m in sys.modules if m.startswith(('hvdkit.cli.', 'hvdkit.ops.', 'hvdkit.bench'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.stdout.startswith("a:2\nb:1\n0 "), proc.stdout + proc.stderr
    loaded = proc.stdout.splitlines()[-1]
    for heavy in ("hvdkit.cli.bench", "hvdkit.cli.launch", "hvdkit.cli.doctor", "hvdkit.ops.launch", "hvdkit.bench"):
        assert f"'{heavy}" not in loaded, loaded


def test_launch_arguments_become_one_launch_config():
    cfg = config("launch", "-np", "3", "-H", "a:2,b:2", "-p", "12345", "-i", "/k", "--network-interface", "eth0",
                 "--max-np", "4", "--elastic-timeout", "60", "--dry-run", "--", "python", EXAMPLE)
    assert isinstance(cfg, LaunchCommandConfig) and cfg.dry_run and cfg.check_hosts
    launch = cfg.launch
    assert (launch.np, launch.hosts, launch.command) == (3, parse_hosts_string("a:2,b:2"), ("python", EXAMPLE))
    assert (launch.ssh_port, launch.ssh_identity_file, launch.network_interface) == (12345, "/k", "eth0")
    assert (launch.max_np, launch.elastic_timeout, launch.min_np, launch.elastic) == (4, 60, None, True)


def test_the_launch_plan_carries_the_layout_it_checked_np_with():
    plan = plan_launch(config("launch", "-np", "3", "-H", "a:2,b:2", "--", "python", EXAMPLE).launch,
                       BuildFlags(mpi=True, gloo=True))
    assert [(p.rank, p.host, p.local_rank) for p in plan.layout] == [(0, "a", 0), (1, "a", 1), (2, "b", 0)]


@pytest.mark.parametrize("argv, message", [
    (["launch", "--", "python", EXAMPLE], "-np is required"),
    (["doctor"], "-np is required"),
    (["launch", "-np", "2", "-H", "a:2", "--slots", "2", "--", "python", EXAMPLE], "--slots is for hosts"),
    (["launch", "-np", "2", "-H", "a:2"], "no training command"),
    (["bench", "allreduce", "--impls", "hvdkit,horovod-auto"], "unknown implementation 'horovod-auto'"),
    (["bench", "allreduce", "--rounds", "0"], "--rounds 0: use 1 or more"),
    (["bench", "train", "--impls", "mpi4py"], "unknown implementation 'mpi4py' for bench train"),
    (["bench", "train", "--models", "vgg"], "model 'vgg' is unknown"),
    (["plan", "--gpus", "0"], "worker counts of 1 or more"),
])
def test_bad_arguments_stop_in_from_args(argv, message):
    with pytest.raises(UserError, match=message):
        config(*argv)


def test_launch_without_hosts_runs_here_unless_slurm_allocated_some(monkeypatch):
    """Issue 35: `hvdkit launch -np 2 -- python train.py` refused without -H where horovodrun -np 2 runs here."""
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    cfg = config("launch", "-np", "2", "--", "python", EXAMPLE)
    assert cfg.launch.hosts == parse_hosts_string("localhost:2") and cfg.launch.np == 2
    assert cfg.hosts_chosen == "localhost:2, this machine: no -H, --hostfile or Slurm allocation given"
    assert config("launch", "-np", "2", "-H", "a:2", "--", "python", EXAMPLE).hosts_chosen is None
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2)")
    slurm = config("launch", "-np", "3", "--", "python", EXAMPLE)
    assert slurm.launch.hosts.names == ["n1", "n2"] and slurm.launch.hosts.source == "slurm"


def test_hosts_and_bench_configs():
    hosts = config("hosts", "-H", "a:2,b:2")
    assert hosts == HostsConfig(hosts=parse_hosts_string("a:2,b:2"), np=4)
    ar = config("bench", "allreduce", "-np", "4", "--sizes", "1M,4M", "--impls", "torch,hvdkit", "-p", "2222")
    assert isinstance(ar, AllreduceConfig) and ar.bench.sizes == (1 << 20, 4 << 20)
    assert [i.name for i in ar.bench.impls] == ["torch", "hvdkit"]
    assert ar.target.hosts == parse_hosts_string("localhost:4") and ar.target.ssh_port == 2222
    tr = config("bench", "train", "-np", "1,2", "-H", "a:1,b:1")
    assert isinstance(tr, TrainConfig) and [t.np for t in tr.targets] == [1, 2]
    assert all(t.hosts == parse_hosts_string("a:1,b:1") for t in tr.targets)


def _where(argv: list[str]):
    """(hosts string, np) each command resolves for the same host arguments."""
    import socket  # noqa: F401

    from hvdkit.ops.hosts import to_hosts_string

    launch = config("launch", *argv, "--", "python", EXAMPLE).launch
    doctor = config("doctor", *argv).doctor.target
    bench = config("bench", "allreduce", *argv).target
    hosts = config("hosts", *argv)
    return {"launch": (to_hosts_string(launch.hosts), launch.np), "doctor": (to_hosts_string(doctor.hosts), doctor.np),
            "bench": (to_hosts_string(bench.hosts), bench.np), "hosts": (to_hosts_string(hosts.hosts), hosts.np)}


@pytest.mark.parametrize("argv", [["-np", "2"], ["-H", "HOST:2"], ["-np", "2", "-H", "HOST:3"],
                                  ["-np", "2", "-H", "HOST:2"]])
def test_every_command_resolves_hosts_and_processes_alike(argv, monkeypatch):
    """Issue 37: launch required -np, doctor ignored it, bench used localhost:np and ignored a Slurm
    allocation, hosts used every slot. Now one rule (hvdkit.cli.args.resolve_hosts) for all four."""
    import socket

    for name in [k for k in __import__("os").environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    me = socket.gethostname()
    argv = [a.replace("HOST", me) for a in argv]
    where = _where(argv)
    assert len(set(where.values())) == 1, where
    if "-H" not in argv:
        assert where["launch"] == ("localhost:2", 2)


def test_every_command_takes_a_slurm_allocation_when_no_hosts_are_given(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2)")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    where = _where([])
    assert set(where.values()) == {("node1:2,node2:2", 4)}, where


def test_this_machine_by_its_own_name_is_local_to_every_command(monkeypatch):
    """-H $(hostname):2: launch skipped ssh, doctor ssh'd to itself, bench left DDP out (it runs on one host)."""
    import socket

    from hvdkit.bench.runner import _loopback_only, _master_address

    target = config("bench", "train", "-np", "2", "-H", f"{socket.gethostname()}:2").targets[0]
    assert _loopback_only(target) and _master_address(target) == "127.0.0.1"
    assert config("doctor", "-H", f"{socket.gethostname()}:2").doctor.target.hosts.is_local_only()
