"""make test-gpu on a machine without a GPU: it refuses in one line, exit 2, and never passes.

What it runs on a GPU (scripts/gpu_acceptance.py) needs a GPU; docs/GPU.md records its numbers. Here: which
checks it runs with how many ranks (a removed or single-rank check fails), that every job's code compiles,
and the bus-bandwidth check's wiring on recorded outputs (its logic: tests/unit/test_gpu_topology.py).
"""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.cli


def test_make_test_gpu_refuses_in_one_line_on_a_cpu_machine(tmp_path):
    # An nvidia-smi that lists no GPU first on PATH: this test must not start the real run on a GPU host.
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    proc = subprocess.run(["make", "-s", "test-gpu"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.returncode != 0 and proc.stdout == "", proc.stdout
    # make's own lines ("make: ***", or "make[1]: ***" under an outer make such as `make test`) aside
    ours = [line for line in proc.stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", line)]
    assert ours == ["make test-gpu: no NVIDIA GPU here (nvidia-smi lists none): it is the acceptance run for a GPU "
                    "machine, see docs/GPU.md"], proc.stderr


def test_with_a_gpu_but_no_gpu_flavour_it_names_the_install(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a1f0000-1111-2222-3333-444455556666)'\n")
    smi.chmod(0o755)
    bare = tmp_path / "bare"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    proc = subprocess.run([str(bare / "bin" / "python"), "scripts/gpu_acceptance.py"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("make test-gpu: no hvdkit beside ") and "make install-gpu" in proc.stderr
    assert proc.stderr.count("\n") == 1


# What the run launches, read without a GPU: the script loaded as a module, its launcher swapped for a recorder.

def load_script():
    spec = importlib.util.spec_from_file_location("gpu_acceptance", ROOT / "scripts" / "gpu_acceptance.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


ga = load_script()
TOPO = ROOT / "tests" / "data" / "gpu_topology"
# Issue 50's list for several GPUs, with the flavour each belongs to: the multi-rank paths (averaging, fp16
# and bf16 compression, AMP, DistributedOptimizer against one rank, Keras mixed precision on both backends)
# and the bus-bandwidth floor, one rank per GPU.
MULTI_RANK = {
    "nccl_collectives": ("torch", "NCCL_OPS"), "allreduce_average": ("torch", "AVERAGE"),
    "compression_fp16_bf16": ("torch", "COMPRESSION"), "optimizer_vs_one_rank": ("torch", "REFERENCE"),
    "torch_amp": ("torch", "TORCH_AMP"), "keras_torch_mixed_float16": ("torch", "KERAS_AMP"),
    "torch_compile": ("torch", "TORCH_COMPILE"), "nccl_busbw_64mib": ("torch", "BUSBW_TORCH"),
    "tf_nccl_collectives": ("tensorflow", "TF_NCCL_OPS"), "tf_allreduce_average": ("tensorflow", "TF_AVERAGE"),
    "keras_tensorflow_mixed_float16": ("tensorflow", "KERAS_AMP"),
    "tf_nccl_busbw_64mib": ("tensorflow", "BUSBW_TF"),
}


def snippet_name(code: str) -> str:
    for name, snippet in ga.SNIPPETS.items():
        if code in (snippet, snippet.replace("{backend}", "torch"), snippet.replace("{backend}", "tensorflow")):
            return name
    return "?"


def launched(monkeypatch, np):
    """{check: [(ranks, snippet or argv, env), ...]} for every check of plan(np), nothing started."""
    calls = {}
    topo = (TOPO / "topo_h100_nvlink_8gpu.txt").read_text()
    for check in ga.plan(np):
        mine = calls.setdefault(check.name, [])

        def fake_launch(n, code, timeout, env=None, mine=mine):
            mine.append((n, snippet_name(code), env or {}))
            return 1, "", 0.0

        def fake_run(argv, timeout, env=None, mine=mine):
            if argv[1:] == ["topo", "-m"]:
                return 0, topo, 0.0
            mine.append((None, argv, env or {}))
            return 1, "", 0.0

        monkeypatch.setattr(ga, "launch", fake_launch)
        monkeypatch.setattr(ga, "run", fake_run)
        check.run()
    return {name: mine for name, mine in calls.items()}


@pytest.mark.parametrize("np", [1, 4, 8])
def test_every_multi_rank_path_runs_one_rank_per_gpu_in_its_flavour(monkeypatch, np):
    checks = {c.name: c for c in ga.plan(np)}
    assert set(MULTI_RANK) <= set(checks), f"checks missing: {set(MULTI_RANK) - set(checks)}"
    calls = launched(monkeypatch, np)
    for name, (flavour, snippet) in MULTI_RANK.items():
        assert (checks[name].flavour, checks[name].ranks) == (flavour, np), name
        assert [(n, s) for n, s, _ in calls[name]] == [(np, snippet)], name
    # The floor's job reports NCCL's transports; the Keras example on 2 ranks where there are 2 GPUs.
    for name in ("nccl_busbw_64mib", "tf_nccl_busbw_64mib"):
        env = calls[name][0][2]
        assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"], env["NCCL_DEBUG_FILE"]) == ("INFO", "INIT", None)
    (_, argv, _), = calls["keras_example"]
    assert argv[argv.index("-np") + 1] == str(min(np, 2)) and "examples/keras_mnist.py" in argv
    assert checks["keras_example"].flavour is None          # in the TensorFlow flavour: XLA left on "auto"
    assert [(n, s, e["CUDA_VISIBLE_DEVICES"]) for n, s, e in calls["two_ranks_one_gpu"]] == [(2, "SHARED", "0")]


def test_the_snippets_cover_what_each_check_claims():
    average, tf_average = ga.SNIPPETS["AVERAGE"], ga.SNIPPETS["TF_AVERAGE"]
    for dtype in ("float32", "float16", "bfloat16"):
        assert f"torch.{dtype}" in average and f"tf.{dtype}" in tf_average
    for code in (average, tf_average):       # NCCL's average, Horovod's scaling kernel, the fused path
        assert "op=hvd.Average" in code and "prescale_factor=0.5" in code and "hvd.grouped_allreduce(" in code
    assert '("fp16", torch.float16), ("bf16", torch.bfloat16)' in ga.SNIPPETS["COMPRESSION"]
    reference = ga.SNIPPETS["REFERENCE"]
    assert "hk.DistributedOptimizer(" in reference and '("none", ' in reference and '("bf16", ' in reference
    assert "torch.autocast" in ga.SNIPPETS["TORCH_AMP"] and "GradScaler" in ga.SNIPPETS["TORCH_AMP"]
    assert 'set_global_policy("mixed_float16")' in ga.SNIPPETS["KERAS_AMP"]
    for code in (ga.SNIPPETS["BUSBW_TORCH"], ga.SNIPPETS["BUSBW_TF"]):
        assert "16 << 20" in code and "nbytes" in code and "seconds" in code       # 64 MiB of float32


@pytest.mark.parametrize("name", sorted(ga.SNIPPETS))
def test_every_snippet_compiles_as_the_ranks_run_it(name):
    code = ga.SNIPPETS[name]
    for backend in (("torch", "tensorflow") if "{backend}" in code else ("",)):
        compile(ga.REPORT + code.replace("{backend}", backend), f"gpu_acceptance.{name}", "exec")


@pytest.mark.parametrize("log, ok", [("nccl_p2p_cumem_8gpu.log", True), ("nccl_net_socket_2containers.log", False)])
def test_the_busbw_check_judges_nccls_lines_against_the_topology(monkeypatch, log, ok):
    """check_busbw as it runs on an 8-GPU NVLink host: a socket fallback fails, P2P at 1.3 ms passes."""
    def fake_launch(n, code, timeout, env=None):
        Path(env["HVDKIT_GPU_CHECK_OUT"]).write_text(json.dumps({"size": n, "nbytes": 64 << 20, "seconds": 1.3e-3}))
        return 0, (TOPO / log).read_text(), 12.0

    monkeypatch.setattr(ga, "launch", fake_launch)
    monkeypatch.setattr(ga, "run", lambda argv, timeout, env=None: (0, (TOPO / "topo_h100_nvlink_8gpu.txt").read_text(),
                                                                    0.1))
    result = ga.check_busbw(ga.BUSBW_TORCH, 8, None)
    assert result["ok"] is ok, result.get("problems")
    assert (result["offered"], result["allreduce_64mib_ms"], result["ranks"]) == ("nvlink", 1.3, 8)
    assert result["busbw_gbps"] == pytest.approx(90.35, abs=0.02) and result["nccl"].startswith("2.")
    if not ok:
        assert any("NET/Socket/0" in p and "NV18" in p for p in result["problems"]) and "output" in result


def test_a_bus_bandwidth_floor_is_given_as_class_and_gbps():
    assert ga.floor_option("nvlink=30") == ("nvlink", 30.0)
    with pytest.raises(argparse.ArgumentTypeError, match="CLASS=GBPS"):
        ga.floor_option("nvlink")


def test_the_documented_image_command_finds_the_script_in_the_image():
    """docs/GPU.md's `docker run ... hvdkit:gpu python scripts/gpu_acceptance.py`: NCCL's shared memory and pinned
    memory allowed, and the script at that path under the image's working directory (Dockerfile.gpu)."""
    lines = [line for line in (ROOT / "docs" / "GPU.md").read_text().splitlines()
             if line.startswith("docker run ") and "scripts/gpu_acceptance.py" in line]
    assert lines, "docs/GPU.md shows no docker run of the acceptance script"
    dockerfile = (ROOT / "Dockerfile.gpu").read_text()
    runtime = dockerfile[dockerfile.index("AS runtime"):]
    workdir = re.findall(r"(?m)^WORKDIR (\S+)", runtime)[-1]
    assert workdir == "/opt/hvdkit/src"
    # The builder copies scripts/ into that directory, and the runtime stage takes /opt/hvdkit whole.
    assert re.search(r"(?m)^WORKDIR /opt/hvdkit/src\n(?:.*\n)*?COPY scripts \./scripts$", dockerfile)
    assert "COPY --from=builder /opt/hvdkit /opt/hvdkit" in runtime
    assert not re.search(r"(?m)^/?scripts", (ROOT / ".dockerignore").read_text())
    for line in lines:
        words = line.split("#", 1)[0].split()
        assert "--ipc=host" in words and words[words.index("--ulimit") + 1] == "memlock=-1", line
        assert "--gpus" in words, line
        script = words[words.index("python") + 1]
        assert (ROOT / script).is_file() and not script.startswith("/"), line       # relative to WORKDIR
