"""Bad input, table-driven: a one-line error naming the cause and the fix, a non-zero exit,
no traceback, and nothing damaged (inputs and checkpoints byte-identical afterwards)."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, job_env, run_hvdkit

pytestmark = pytest.mark.cli
EXAMPLE = str(ROOT / "examples" / "pytorch_mnist.py")
KERAS_EXAMPLE = str(ROOT / "examples" / "keras_mnist.py")


def digest_tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def setup_files(tmp: Path) -> None:
    (tmp / "bad-hostfile").write_text("# cluster\nserver1 slots=4\nserver2 slots=zero\n")
    (tmp / "corrupt.pt").write_bytes(b"this is not a checkpoint")
    (tmp / "ckpts").mkdir()
    (tmp / "ckpts" / "ckpt-00000003.pt").write_bytes(b"\x80" * 64)
    (tmp / "ckpts" / "ckpt-00000003.pt.sha256").write_text("0" * 64 + "  ckpt-00000003.pt\n")
    (tmp / "mnist").mkdir()
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (tmp / "mnist" / stem).write_bytes(b"<html>a captive portal page, not MNIST</html>")
    (tmp / "mnist-gz").mkdir()
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (tmp / "mnist-gz" / f"{stem}.gz").write_bytes(b"<html>saved under a .gz name</html>")
    scripts = {"discover-plain.sh": ("#!/bin/sh\necho localhost:2\n", 0o644),
               "discover-fails.sh": ("#!/bin/sh\necho 'cannot reach the scheduler' >&2\nexit 3\n", 0o755),
               "discover-garbage.sh": ("#!/bin/sh\necho 'localhost slots=2'\n", 0o755)}
    for name, (text, mode) in scripts.items():
        (tmp / name).write_text(text)
        (tmp / name).chmod(mode)


CASES = [
    # (id, argv (with {tmp}), substrings of the one error line)
    ("malformed hostfile", ["hvdkit", "hosts", "--hostfile", "{tmp}/bad-hostfile"],
     ["bad-hostfile:3", "slots for 'server2' must be a whole number", "server2 slots=4"]),
    ("malformed -H", ["hvdkit", "hosts", "-H", "server1:4,,server2:4"],
     ["-H item 2 is empty", "remove the extra comma"]),
    ("IPv6 address in -H", ["hvdkit", "hosts", "-H", "[::1]:2"],
     ["looks like an IPv6 address", "use a host name that resolves to it", "127.0.0.1:2"]),
    ("invisible character in a host name", ["hvdkit", "hosts", "-H", "server1\u200b:2"],
     ["U+200B at position 8", "retype the name"]),
    ("Horovod setting Horovod would misread", ["HOROVOD_CYCLE_TIME=abc", "hvdkit", "launch", "-np", "2", "-H",
                                               "localhost:2", "--", "python", EXAMPLE],
     ["HOROVOD_CYCLE_TIME='abc' is not a number", "Horovod would read it as 0", "HOROVOD_CYCLE_TIME=1"]),
    ("Horovod flag that is not 0 or 1", ["HOROVOD_STALL_CHECK_DISABLE=true", "hvdkit", "launch", "-np", "2", "-H",
                                         "localhost:2", "--", "python", EXAMPLE],
     ["HOROVOD_STALL_CHECK_DISABLE='true' is not 0 or 1", "set HOROVOD_STALL_CHECK_DISABLE=1"]),
    ("np above slots", ["hvdkit", "launch", "-np", "8", "-H", "localhost:2", "--", "python", EXAMPLE],
     ["np=8 but -H has 2 slots (localhost has 2)", "lower -np to 2"]),
    ("missing hostfile", ["hvdkit", "doctor", "--hostfile", "{tmp}/nope"], ["cannot read hostfile", "check the path"]),
    ("missing script", ["hvdkit", "launch", "-np", "2", "-H", "localhost:2", "--", "python", "{tmp}/train.py"],
     ["train.py' does not exist", "check the path"]),
    ("no command", ["hvdkit", "launch", "-np", "2", "-H", "localhost:2"], ["no training command", "after '--'"]),
    ("corrupt checkpoint", ["python", EXAMPLE, "--epochs", "1", "--checkpoint", "{tmp}/corrupt.pt", "--resume"],
     ["corrupt.pt' is unreadable or corrupt", "restore an older checkpoint"]),
    ("no usable checkpoint in a directory", ["python", EXAMPLE, "--epochs", "1", "--checkpoint-dir", "{tmp}/ckpts",
                                             "--resume"],
     ["ckpt-00000003.pt: checkpoint", "is unreadable or corrupt (", "): restore one from a backup"]),
    ("missing checkpoint", ["python", EXAMPLE, "--epochs", "1", "--checkpoint", "{tmp}/none.pt", "--resume"],
     ["none.pt' does not exist", "missing_ok=True", "leave out --resume"]),
    ("MNIST files that are not IDX", ["python", EXAMPLE, "--dataset", "mnist", "--data-dir", "{tmp}/mnist"],
     ["is not an IDX file", "re-download it or delete it"]),
    ("MNIST .gz files that are not gzip", ["python", EXAMPLE, "--dataset", "mnist", "--data-dir", "{tmp}/mnist-gz"],
     ["train-images-idx3-ubyte.gz", "Not a gzipped file", "re-download it or delete it"]),
    ("data dir that is a file", ["python", EXAMPLE, "--dataset", "mnist", "--data-dir", "{tmp}/corrupt.pt"],
     ["corrupt.pt' is a file, not a folder", "point --data-dir at the folder"]),
    ("unknown dataset (PyTorch example)", ["python", EXAMPLE, "--dataset", "imagenet"],
     ["invalid choice: 'imagenet'", "choose from 'digits', 'mnist', 'synthetic'"]),
    ("unknown dataset (Keras example)", ["python", KERAS_EXAMPLE, "--dataset", "imagenet"],
     ["invalid choice: 'imagenet'", "choose from 'digits', 'mnist', 'synthetic'"]),
    ("data dir that is a file (Keras example)", ["python", KERAS_EXAMPLE, "--dataset", "mnist",
                                                 "--data-dir", "{tmp}/corrupt.pt"],
     ["corrupt.pt' is a file, not a folder"]),
    ("zero batch size", ["python", EXAMPLE, "--batch-size", "0"], ["--batch-size: 0 is not allowed", "give 1 or more"]),
    ("zero epochs", ["python", EXAMPLE, "--epochs", "0"], ["--epochs: 0 is not allowed", "give 1 or more"]),
    ("negative learning rate (Keras example)", ["python", KERAS_EXAMPLE, "--lr", "-0.1"],
     ["--lr: -0.1 is not allowed", "give a number above 0"]),
    ("missing discovery script", ["hvdkit", "launch", "-np", "2", "--host-discovery-script", "{tmp}/nope.sh",
                                  "--", "python", EXAMPLE], ["nope.sh' does not exist", "check the path"]),
    ("discovery script not executable", ["hvdkit", "launch", "-np", "2", "--host-discovery-script",
                                         "{tmp}/discover-plain.sh", "--", "python", EXAMPLE],
     ["discover-plain.sh' is not executable", "chmod +x"]),
    ("discovery script that fails", ["hvdkit", "launch", "-np", "2", "--host-discovery-script",
                                     "{tmp}/discover-fails.sh", "--", "python", EXAMPLE],
     ["discover-fails.sh failed (cannot reach the scheduler)", "exit 0"]),
    ("discovery script printing a hostfile line", ["hvdkit", "launch", "-np", "2", "--host-discovery-script",
                                                   "{tmp}/discover-garbage.sh", "--", "python", EXAMPLE],
     ["output line 1 ('localhost slots=2')", "print host:slots"]),
    ("elastic --min-np above -np", ["hvdkit", "launch", "-np", "2", "--min-np", "3", "-H", "a:2,b:2",
                                    "--", "python", EXAMPLE], ["--min-np 3 must be between 1 and -np 2"]),
    ("elastic job with --mpi", ["hvdkit", "launch", "-np", "2", "--max-np", "4", "--mpi", "-H", "a:2,b:2",
                                "--", "python", EXAMPLE], ["elastic jobs run on Gloo", "drop --mpi"]),
    # issue 35, case 7: bad input to the commands
    ("slot count no machine runs", ["hvdkit", "hosts", "-H", "localhost:100000000"],
     ["host 'localhost' has 100000000 slots, more than 4096", "give it its number of GPUs"]),
    ("timeline in a missing directory", ["hvdkit", "launch", "-np", "2", "-H", "localhost:2", "--timeline",
                                         "{tmp}/no-such-dir/t.json", "--", "python", EXAMPLE, "--epochs", "1"],
     ["--timeline", "no-such-dir' does not exist", "mkdir -p"]),
    ("timeline under a file", ["hvdkit", "launch", "-np", "2", "-H", "localhost:2", "--timeline",
                               "{tmp}/corrupt.pt/t.json", "--", "python", EXAMPLE, "--epochs", "1"],
     ["--timeline", "corrupt.pt' is not a directory"]),
    ("zero parameters (plan)", ["hvdkit", "plan", "--params", "0", "--compute-ms", "250"],
     ["parameter count '0' is not above 0", "25.6M"]),
    ("zero bandwidth (plan)", ["hvdkit", "plan", "--bandwidth", "0", "--compute-ms", "250"],
     ["--bandwidth: 0.0 is not allowed", "give a number above 0"]),
    ("NaN compute time (plan)", ["hvdkit", "plan", "--compute-ms", "nan"],
     ["--compute-ms: nan is not allowed", "give a finite number above 0"]),
    ("infinite latency (plan)", ["hvdkit", "plan", "--compute-ms", "250", "--latency", "inf"],
     ["--latency: inf is not allowed", "give a finite number, 0 or more"]),
    ("Horovod setting Horovod would misread (env)", ["HOROVOD_FUSION_THRESHOLD=lots", "hvdkit", "env"],
     ["HOROVOD_FUSION_THRESHOLD='lots' is not a whole number >= 0", "HOROVOD_FUSION_THRESHOLD=67108864"]),
    ("commit interval that is not a number (elastic example)",
     ["python", str(ROOT / "examples" / "pytorch_elastic.py"), "--commit-every", "often"],
     ["--commit-every: 'often' is not an integer"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_line_and_damages_nothing(tmp_path, case):
    _, argv, needles = case
    setup_files(tmp_path)
    before = digest_tree(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    env = job_env(**dict(a.split("=", 1) for a in argv if a.startswith("HOROVOD_")))   # leading VAR=value
    argv = [a for a in argv if not a.startswith("HOROVOD_")]
    argv = [sys.executable if a == "python" else a for a in argv]
    if argv[0] == "hvdkit":
        proc = run_hvdkit(*argv[1:], timeout=120, env=env)
    else:   # an example script, run directly
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 2 if argv[0] == "hvdkit" else proc.returncode != 0, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, proc.stderr[-2000:]
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    assert digest_tree(tmp_path) == before, "bad input must not change any file"


def test_a_hostfile_saved_with_a_byte_order_mark_reads_as_written(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_bytes("\ufeffserver1 slots=2\n".encode())
    proc = run_hvdkit("hosts", "--hostfile", str(hostfile), timeout=60)
    assert proc.returncode == 0 and "horovodrun -np 2 -H server1:2" in proc.stdout, proc.stderr


def test_hvdkit_env_shows_a_misread_horovod_setting_with_launchs_words():
    """`hvdkit env` reports (all of it, on stdout) and then says on stderr what launch would refuse, exit 2."""
    env = job_env(HOROVOD_FUSION_THRESHOLD="lots")
    report = run_hvdkit("env", timeout=180, env=env)
    launch = run_hvdkit("launch", "-np", "2", "-H", "localhost:2", "--", sys.executable, EXAMPLE, timeout=120, env=env)
    assert (report.returncode, launch.returncode) == (2, 2), (report.stderr, launch.stderr)
    assert "HOROVOD_FUSION_THRESHOLD=lots  INVALID" in report.stdout and "horovod     0.28.1" in report.stdout
    assert report.stderr.replace("hvdkit env:", "hvdkit launch:") == launch.stderr


def test_launch_without_hosts_runs_on_this_machine_and_says_so():
    env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
    proc = run_hvdkit("launch", "-np", "2", "--dry-run", "--", sys.executable, EXAMPLE, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert " -np 2 -H localhost:2 " in proc.stdout
    assert "(hosts: localhost:2, this machine: no -H, --hostfile or Slurm allocation given)" in proc.stdout


def test_ctrl_c_on_launch_says_interrupted_and_exits_130(tmp_path):
    """A terminal's Ctrl-C reaches hvdkit launch alone (the job runs in its own session): one line saying the
    user stopped it and 130, as shells expect, not "rank 1 ... killed by SIGTERM" as if a rank had failed."""
    from tests.conftest import WORKERS, hvdkit_launch_cmd, process_by_args, signal_job

    cmd = hvdkit_launch_cmd(2, [str(WORKERS / "torch_forever.py"), "--out", str(tmp_path)], "gloo")

    def launcher() -> int:
        return process_by_args("hvdkit", str(tmp_path), "launch")

    out, took, rc = signal_job(cmd, lambda _: all((tmp_path / f"looping{r}").exists() for r in range(2)), launcher,
                               sig=signal.SIGINT, start_timeout=120, end_timeout=60)
    ours = [line for line in out.splitlines() if line.startswith("hvdkit launch:")][1:]   # after the plan line
    assert ours == ["hvdkit launch: interrupted (Ctrl-C): stopped 2 ranks"], out[-2000:]
    assert rc == 130 and "Traceback" not in out, (rc, out[-2000:])
