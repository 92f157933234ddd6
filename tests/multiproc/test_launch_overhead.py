"""What a launch costs before any rank starts.

horovodrun asked how Horovod was built (gloo_built, mpi_built) in a forked process that imports torch, and
`hvdkit launch` asked again through its own probe: 2.9 s of CPU for a plain `horovodrun` and 5.9 s for
`hvdkit launch` on every job here (2 AMD EPYC cores), though the answers only change when Horovod or a framework
is reinstalled. Both now keep the answer (patch item 19; hvdkit.ops.envreport.probe_cache_path), so a second
launch imports no framework outside its ranks.
"""

import json

import pytest

from tests.conftest import horovodrun_cmd, hvdkit_launch_cmd, job_env, run_job

pytestmark = pytest.mark.multiproc

# Every process of the job loads this (PYTHONPATH): one that imports a framework writes its pid and argv.
RECORD_FRAMEWORK_IMPORTS = '''import json, os, sys


class _Record:
    def find_spec(self, name, path=None, target=None):
        # A submodule: only a real import asks for it (importlib.util.find_spec("torch") asks for the package).
        if name in ("torch._C", "tensorflow.python"):
            with open(os.environ["IMPORTS_LOG"], "a") as f:
                f.write(json.dumps([name, os.getpid(), sys.argv[:3]]) + "\\n")
        return None


sys.meta_path.insert(0, _Record())
'''


@pytest.mark.parametrize("how", ["horovodrun", "hvdkit launch"])
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_second_launch_imports_no_framework_outside_the_ranks(tmp_path, how, controller):
    (tmp_path / "sitecustomize.py").write_text(RECORD_FRAMEWORK_IMPORTS)
    log = tmp_path / "imports.log"
    env = job_env(IMPORTS_LOG=str(log), XDG_CACHE_HOME=str(tmp_path / "cache"))   # an empty cache to start
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    argv = ["-c", "print('rank ran', flush=True)"]
    cmd = horovodrun_cmd(2, argv, controller) if how == "horovodrun" else hvdkit_launch_cmd(2, argv, controller)
    seen = []
    for _ in range(2):                      # the first launch asks and keeps the answer; the second reads it
        log.unlink(missing_ok=True)
        proc = run_job(cmd, 120, env=env)
        assert proc.returncode == 0 and proc.stdout.count(">:rank ran") == 2, proc.stdout[-3000:]
        seen.append([json.loads(line) for line in log.read_text().splitlines()] if log.exists() else [])
    assert seen[0], "the first launch must ask an extension (the record would be stale otherwise)"
    assert seen[1] == [], f"the second launch imported a framework again: {seen[1]}"


# Loaded by every process of a job (PYTHONPATH): one that imports the launcher writes its pid.
RECORD_LAUNCHER_IMPORTS = '''import json, os, sys


class _Record:
    def find_spec(self, name, path=None, target=None):
        if name == "horovod.runner.launch":
            with open(os.environ["IMPORTS_LOG"], "a") as f:
                f.write(json.dumps([os.getpid(), sys.argv[:3]]) + "\\n")
        return None


sys.meta_path.insert(0, _Record())
'''


def test_no_middleman_of_a_gloo_job_imports_the_launcher(tmp_path):
    """horovodrun --gloo starts each rank through a middleman (a multiprocessing spawn child, which runs the
    horovodrun script again); the script imported the whole launcher, 0.1-0.2 s of CPU per rank and per elastic
    discovery call (patch item 22)."""
    (tmp_path / "sitecustomize.py").write_text(RECORD_LAUNCHER_IMPORTS)
    log = tmp_path / "imports.log"
    env = job_env(IMPORTS_LOG=str(log))
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    proc = run_job(horovodrun_cmd(3, ["-c", "print('rank ran', flush=True)"], "gloo"), 120, env=env)
    assert proc.returncode == 0 and proc.stdout.count(">:rank ran") == 3, proc.stdout[-3000:]
    seen = [json.loads(line)[0] for line in log.read_text().splitlines()]
    assert len(seen) == 1, f"{len(seen)} processes imported horovod.runner.launch, not horovodrun alone: {seen}"
