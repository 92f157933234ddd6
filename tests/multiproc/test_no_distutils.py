"""horovodrun and hvdkit on a Python without distutils, as NVIDIA's base image has (Python 3.12 removed it).

The image is built on a Debian 12 stand-in with Python 3.11, whose standard library
still has distutils, and setuptools' shim provides it to any venv that has setuptools.
Here both are taken away by a finder that refuses the import, so the job runs as on
3.12 without setuptools. Before patch item 15, `import horovod.runner` failed at
horovod/runner/js_run.py's `from distutils.spawn import find_executable`.
"""

import sys

import pytest

from tests.conftest import horovodrun_cmd, hvdkit_launch_cmd, job_env, run_job

pytestmark = pytest.mark.multiproc

NO_DISTUTILS = '''import sys


class _NoDistutils:
    """Python 3.12 without setuptools: no distutils, neither the standard library's nor setuptools' shim."""

    def find_spec(self, name, path=None, target=None):
        if name == "distutils" or name.startswith(("distutils.", "_distutils_hack")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


for loaded in [m for m in sys.modules if m == "distutils" or m.startswith("distutils.")]:
    del sys.modules[loaded]
sys.meta_path.insert(0, _NoDistutils())
'''

WORKER = ("import sys; import hvdkit.torch as hk; ctx = hk.init(); assert 'distutils' not in sys.modules; "
          "print('world', ctx.size, 'rank', ctx.rank, flush=True)")


@pytest.mark.parametrize("how", ["horovodrun", "hvdkit launch"])
def test_a_job_runs_where_python_has_no_distutils(tmp_path, how):
    (tmp_path / "sitecustomize.py").write_text(NO_DISTUTILS)
    env = job_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    probe = run_job([sys.executable, "-c", "import distutils"], 60, env=env)
    assert probe.returncode != 0 and "No module named 'distutils'" in probe.stdout, "the stand-in must hide it"
    argv = ["-c", WORKER]
    cmd = horovodrun_cmd(2, argv, "gloo") if how == "horovodrun" else hvdkit_launch_cmd(2, argv, "gloo")
    proc = run_job(cmd, 180, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert sorted(line.split("world 2 rank ")[1][:1] for line in proc.stdout.splitlines() if "world 2 rank " in line) \
        == ["0", "1"], proc.stdout[-3000:]
