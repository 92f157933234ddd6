"""Dockerfile.gpu and docker-compose.yml, checked without a Docker engine.

hadolint and the Compose Specification schema (vendored by check-jsonschema, both
pinned in requirements.lock), plus what those tools cannot know: the image's
pins equal the install script's, the Horovod layer is built from the pins alone, no key
is baked in, sshd is key-only, and the compose services, hostfiles and launcher
commands agree.
"""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
import yaml

from tests.cli.test_install_script import pins
from tests.conftest import BIN, ROOT

pytestmark = pytest.mark.cli
DOCKERFILE = ROOT / "Dockerfile.gpu"
COMPOSE = ROOT / "docker-compose.yml"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                                            if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> dict[str, list[tuple[str, str]]]:
    result, current = {}, None
    for word, rest in instructions():
        if word == "FROM":
            current = rest.split(" AS ")[-1].strip() if " AS " in rest else rest
            result[current] = []
        elif current:
            result[current].append((word, rest))
    return result


def test_hadolint_passes_and_every_ignore_has_a_reason():
    proc = subprocess.run([str(BIN / "hadolint"), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            assert "Reason" in lines[i - 1] or "Reason" in lines[i - 2], f"line {i + 1}: an ignore without a reason"


def test_compose_file_matches_the_compose_specification():
    proc = subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_image_versions_are_the_install_scripts():
    p = pins()
    labels = dict(re.findall(r'io\.hvdkit\.(\w+)="([^"]+)"', DOCKERFILE.read_text()))
    assert labels == {"flavour": "${FLAVOUR}", "horovod": p["HOROVOD_VERSION"], "keras": p["KERAS_VERSION"]}
    runs = " ".join(rest for word, rest in stages()["builder"] if word == "RUN")
    assert 'bash scripts/install.sh "$mode"' in runs, "the image must build Horovod with the install script"
    # The flavour picks the install script's mode: torch --gpu, tensorflow --gpu-tf.
    assert 'mode=--gpu; [ "$FLAVOUR" != tensorflow ] || mode=--gpu-tf;' in runs
    # No framework is installed beside the script (a second source of versions).
    assert not re.search(r"pip3? install", runs)
    for name in ("torch", "tensorflow", "horovod", "keras"):
        assert not re.search(rf"{name}==", DOCKERFILE.read_text())
    assert re.search(r"ARG CUDA_VERSION=\d+\.\d+\.\d+", DOCKERFILE.read_text()), "the base image tag is pinned"


def test_horovod_layer_is_built_from_the_pins_before_hvdkits_code():
    """install.sh --no-project reads requirements.lock and pyproject.toml: both copied before it runs, hvdkit after."""
    builder = stages()["builder"]
    first = next(i for i, (word, rest) in enumerate(builder) if word == "RUN" and "--no-project" in rest)
    before = " ".join(rest for word, rest in builder[:first] if word == "COPY")
    after = " ".join(rest for word, rest in builder[first:] if word == "COPY")
    for needed in ("requirements.lock", "pyproject.toml", "scripts"):
        assert needed in before, f"{needed} is copied after install.sh --no-project needs it"
    for code in ("hvdkit", "README.md", "examples"):
        assert code in after and code not in before.split(), f"{code} before the Horovod layer: every edit rebuilds it"


def test_build_fails_without_nccl_cuda_or_torch():
    runs = " ".join(rest for word, rest in stages()["builder"] if word == "RUN")
    assert "horovodrun --check-build" in runs
    required = re.search(r"hvdkit env --json --require (\S+)", runs)
    assert required and {'"$FLAVOUR', "nccl", 'cuda"'} <= set(required.group(1).split(",")), runs
    assert re.search(r"^ARG FLAVOUR=torch$", DOCKERFILE.read_text(), re.M), "torch is the default flavour"


def test_one_cuda_and_one_nccl_the_frameworks():
    """Each flavour's CUDA major is its framework's (pins), and NCCL comes only from the framework's wheel."""
    p = pins()
    text = DOCKERFILE.read_text()
    cuda = re.search(r"ARG CUDA_VERSION=(\d+)\.", text).group(1)
    assert cuda == p["TORCH_CUDA_MAJOR"], (f"Dockerfile.gpu's CUDA base is {cuda}.x but torch {p['TORCH_VERSION']} "
                                           f"is CUDA {p['TORCH_CUDA_MAJOR']}: one process would load two CUDAs")
    tf_cuda = re.search(r"ARG TF_CUDA_VERSION=(\d+)\.", text).group(1)
    assert tf_cuda == p["TF_CUDA_MAJOR"], (tf_cuda, p["TF_CUDA_MAJOR"])
    froms = dict(reversed(rest.split(" AS ")) for word, rest in instructions() if word == "FROM")
    assert froms == {"base-torch": "nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}",
                     "toolchain-torch": "base-torch",
                     "base-tensorflow": "nvidia/cuda:${TF_CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}",
                     "toolchain-tensorflow": "nvidia/cuda:${TF_CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION}",
                     "builder": "toolchain-${FLAVOUR}", "runtime": "base-${FLAVOUR}"}, froms
    apt = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert not re.search(r"libnccl|cuda-toolkit|nvidia-cuda", apt), "a second NCCL/CUDA from apt"
    assert "NCCL_HOME" not in text and "CUDA_HOME" not in text, "the build must use torch's NCCL and CUDA wheels"
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert "HOROVOD_NCCL_HOME=$NCCL_ROOT" in script and "installer.py\" gpu-toolchain" in script
    installer = (ROOT / "scripts" / "installer.py").read_text()
    assert 'nccl = site / "nvidia" / "nccl"' in installer, "NCCL is the framework's wheel, in the venv"


def test_no_secret_or_private_key_in_the_image():
    for word, rest in instructions():
        if word in ("COPY", "ADD"):
            assert not re.search(r"id_(rsa|ed25519|ecdsa)(?!\.pub)|\.pem|\.key\b|authorized_keys", rest), rest
        if word == "RUN":
            assert "ssh-keygen" not in rest, "keys are made at run time (entrypoint, keygen service), not in a layer"
        if word in ("ENV", "ARG"):
            assert not re.search(r"(PASSWORD|TOKEN|SECRET)=", rest, re.I), rest
    runtime = " ".join(rest for word, rest in stages()["runtime"] if word == "RUN")
    assert "rm -f /etc/ssh/ssh_host_*" in runtime, "the host keys apt generated must not ship in the image"


def test_sshd_is_key_only_on_port_12345():
    cfg = dict(line.split(None, 1) for line in (ROOT / "docker" / "sshd_config").read_text().splitlines()
               if line.strip() and not line.startswith("#"))
    assert cfg["Port"] == "12345"
    assert cfg["PasswordAuthentication"] == "no" and cfg["KbdInteractiveAuthentication"] == "no"
    assert cfg["PermitEmptyPasswords"] == "no" and cfg["PubkeyAuthentication"] == "yes"
    assert cfg["PermitRootLogin"] == "prohibit-password"
    assert ("COPY", "docker/sshd_config /etc/ssh/sshd_config.d/hvdkit.conf") in stages()["runtime"]


def test_final_stage_is_the_slim_runtime_with_an_entrypoint():
    names = list(stages())
    assert names[-2:] == ["builder", "runtime"], names
    runtime = stages()["runtime"]
    words = [w for w, _ in runtime]
    assert ("COPY", "--from=builder /opt/hvdkit /opt/hvdkit") in runtime
    assert "g++" not in " ".join(r for w, r in runtime if w == "RUN"), "no compilers in the runtime stage"
    # The frameworks' wheels carry the CUDA runtime, cuDNN and NCCL: a cudnn/runtime base would add a second
    # copy of each. Only TensorFlow's builder starts from `devel` (PyPI has no CUDA 12 nvcc).
    froms = [rest for word, rest in instructions() if word == "FROM" and "nvidia/cuda" in rest]
    assert [f for f in froms if "-base-" not in f] == [
        "nvidia/cuda:${TF_CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS toolchain-tensorflow"], froms
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert "NCCL_SOCKET_IFNAME" not in env, "NCCL chooses the interface unless the user names one"
    assert re.search(r"libibverbs1 .*ibverbs-providers .*librdmacm1", " ".join(r for w, r in runtime if w == "RUN"))
    assert words[-2:] == ["ENTRYPOINT", "CMD"] and "EXPOSE" in words
    assert 'ENTRYPOINT ["/usr/local/bin/hvdkit-entrypoint"]' in DOCKERFILE.read_text()


def _launch_args(command: list[str]) -> dict:
    args = {}
    for flag in ("-np", "--hostfile", "-p"):
        args[flag] = command[command.index(flag) + 1]
    args["controller"] = "--mpi" if "--mpi" in command else "--gloo"
    return args


@pytest.mark.parametrize("profile, launcher, workers, hostfile, controller", [
    ("gpu", "launcher", ["worker1", "worker2"], "hostfiles/compose", "--mpi"),
    ("cpu", "cpu-launcher", ["cpu-worker1", "cpu-worker2"], "hostfiles/compose-cpu", "--gloo"),
])
def test_compose_services_hostfile_and_launcher_agree(profile, launcher, workers, hostfile, controller):
    from hvdkit.ops.hosts import parse_hostfile

    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    spec = parse_hostfile(str(ROOT / hostfile))
    args = _launch_args(services[launcher]["command"])
    assert args["--hostfile"] == hostfile and args["controller"] == controller
    assert int(args["-np"]) == spec.total_slots
    assert args["-p"] == "12345"
    names, reserved = [], []
    for name in workers:
        svc = services[name]
        assert profile in svc["profiles"] and svc["command"] == ["sshd"]
        aliases = (svc.get("networks") or {}).get("default", {}).get("aliases", [])
        names.append(svc["hostname"])
        assert svc["hostname"] in [name, *aliases], "the hostfile's name must resolve to this service"
        assert "ssh-keys:/keys:ro" in svc["volumes"]
        gpus = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        slots = {h.name: h.slots for h in spec.hosts}[svc["hostname"]]
        if profile == "gpu":
            assert gpus and "count" not in gpus[0], "count: N gives every worker the same GPUs 0..N-1"
            assert len(gpus[0]["device_ids"]) == slots, "one process per reserved GPU"
            reserved.append(set(gpus[0]["device_ids"]))
        else:
            assert not gpus
        if profile == "gpu":
            assert svc["ulimits"]["memlock"] == -1, "NCCL and RDMA pin memory"
        else:   # raising a limit needs CAP_SYS_RESOURCE, which rootless Docker, Podman and this machine lack
            assert "ulimits" not in svc and "cap_add" not in svc and not svc.get("privileged"), svc
        health = " ".join(svc["healthcheck"]["test"])
        assert "ss " in health and "/dev/tcp" not in health and "ssh " not in health, \
            "a healthcheck that connects to sshd every 2 s floods its log"
    if profile == "gpu":
        assert not set.intersection(*reserved), f"workers share GPUs: {reserved}"
    else:
        assert "ulimits" not in services[launcher] and "ulimits" not in services["keygen"]
    assert names == spec.names
    assert "12345" in (ROOT / "docker" / "ssh_config").read_text()
    keygen = services["keygen"]
    assert profile in keygen["profiles"] and "ssh-keygen" in " ".join(keygen["command"])
    assert all(services[w]["depends_on"]["keygen"]["condition"] == "service_completed_successfully" for w in workers)
    assert "hostfiles/" + hostfile.split("/")[-1] in (ROOT / "hostfiles" / "README.md").read_text()


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    """The variables a stage's ENV lines set (KEY=value pairs, quotes removed)."""
    return dict(word.split("=", 1) for w, rest in stage if w == "ENV" for word in shlex.split(rest))


def test_the_tensorflow_image_asks_the_container_toolkit_for_the_driver_its_wheels_need():
    """NVIDIA's 12.9.1 base sets NVIDIA_REQUIRE_CUDA to CUDA 12.9 (a driver >= 575, or a forward-compatible
    datacenter branch), so the NVIDIA container toolkit refused drivers 525-574 on which TensorFlow's CUDA 12 wheels
    run by CUDA's minor-version compatibility, and which hk.init's own driver check accepts. Every forward-compatible
    branch the 12.9 base lists (535 and newer) already supports CUDA >= 12.0, so no brand= clause is needed."""
    from hvdkit.runtime.cuda_driver import MIN_DRIVER

    st = stages()
    assert env_of(st["base-tensorflow"]).get("NVIDIA_REQUIRE_CUDA") == f"cuda>={pins()['TF_CUDA_MAJOR']}.0"
    assert MIN_DRIVER[int(pins()["TF_CUDA_MAJOR"])] == 525, "the driver CUDA 12.0 needs (525.60.13), as hk.init checks"
    # torch's CUDA 13 base keeps its own requirement (torch's wheels need 580, CUDA 13.0's driver).
    assert "NVIDIA_REQUIRE_CUDA" not in env_of(st["runtime"]) and "NVIDIA_REQUIRE_CUDA" not in env_of(st["base-torch"])


def test_the_image_keeps_tensorflows_warnings_and_hides_its_info_lines():
    """TF_CPP_MIN_LOG_LEVEL=1: "Cannot dlopen some GPU libraries" (a warning) is the one line that explains a
    TensorFlow GPU failure, and 2 or 3 hide it; unset, every rank printed TensorFlow's INFO lines."""
    assert env_of(stages()["runtime"]).get("TF_CPP_MIN_LOG_LEVEL") == "1"


def test_one_gpu_host_trains_in_one_container_and_two_containers_are_a_multi_host_rehearsal():
    """NCCL tells hosts apart by hostname and boot id (getHostHash): two containers on one machine are two hosts to
    it and talk over sockets, not NVLink. So one machine's GPUs go to one container (single-host), and the
    two-worker layout is labelled what it is: a rehearsal of several machines."""
    compose = yaml.safe_load(COMPOSE.read_text())
    svc = compose["services"]["single-host"]
    assert svc["profiles"] == ["gpu"] and "depends_on" not in svc, "one container: no workers, no ssh keys"
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}], devices
    command = svc["command"]
    assert command[:2] == ["hvdkit", "launch"] and not {"-H", "--hostfile"} & set(command), command
    assert command[command.index("--") + 1:][:2] == ["/opt/hvdkit/venv/bin/python", "examples/pytorch_mnist.py"]
    assert int(command[command.index("-np") + 1]) == sum(
        len(compose["services"][w]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"])
        for w in ("worker1", "worker2")), "the same 8-GPU host as the two-worker layout"
    # NCCL's shared and pinned memory, as its guide runs containers (--shm-size=1g --ulimit memlock=-1)
    assert svc.get("ipc") == "host" or int(svc["shm_size"].rstrip("gb")) >= 1, svc
    assert svc["ulimits"]["memlock"] == -1
    header = COMPOSE.read_text().split("\nname:")[0]
    assert re.search(r"run --rm single-host +# .*one container", header), header
    assert re.search(r"run --rm launcher +# .*multi-host rehearsal", header), header
    docker_md = " ".join((ROOT / "docs" / "DOCKER.md").read_text().split())
    assert "single-host" in docker_md and "multi-host rehearsal" in docker_md and "not NVLink" in docker_md
