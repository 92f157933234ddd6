"""deploy/kubernetes, checked offline: each MPIJob validates against the MPI Operator's own CRD schema
(made strict about unknown fields), agrees with the image, and its launcher command is run through
`hvdkit launch --dry-run` on files shaped like what the operator mounts (hostfile, discover_hosts.sh)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess

import jsonschema
import pytest
import yaml

from tests.conftest import ROOT, run_hvdkit

pytestmark = pytest.mark.cli
CRD = ROOT / "tests" / "data" / "kubeflow.org_mpijobs.v0.8.2.yaml"
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
REGISTRY_PLACEHOLDER = "registry.example.com"     # docs/CLUSTERS.md's push replaces it with the user's registry


def strict(schema: dict) -> dict:
    """The CRD's schema with additionalProperties: false on every object that lists its properties
    (as the API server's strict field validation does), so a misspelt field fails."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@pytest.fixture(scope="module")
def validator() -> jsonschema.Validator:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v2beta1")
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def hvdkit_errors(job: dict) -> list[str]:
    """What the schema cannot know: the replicas hvdkit needs and the numbers that must agree."""
    specs = job["spec"].get("mpiReplicaSpecs", {})
    errors = [f"no {role} replica spec" for role in ("Launcher", "Worker") if role not in specs]
    if errors:
        return errors
    worker = specs["Worker"]["template"]["spec"]["containers"][0]
    gpus = int(worker["resources"]["limits"].get("nvidia.com/gpu", 0))
    if job["spec"].get("slotsPerWorker", 1) != gpus:
        errors.append(f"slotsPerWorker {job['spec'].get('slotsPerWorker', 1)} != the workers' {gpus} GPUs")
    if specs["Worker"].get("replicas", 0) < 1:
        errors.append("no workers")
    return errors


def launcher_args(job: dict) -> list[str]:
    return job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_a_valid_mpijob_for_hvdkits_image(path, validator):
    job = yaml.safe_load(path.read_text())
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(job)]
    assert not errors, errors
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    assert not hvdkit_errors(job)
    spec = job["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady" and spec["runPolicy"]["cleanPodPolicy"] == "Running"
    # The image the compose file builds from Dockerfile.gpu, its sshd port, and where its sshd reads keys.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    image = compose["x-image"]["image"]
    port = re.search(r"^Port (\d+)", (ROOT / "docker" / "sshd_config").read_text(), re.M).group(1)
    assert f"EXPOSE {port}" in (ROOT / "Dockerfile.gpu").read_text()
    assert "AuthorizedKeysFile .ssh/authorized_keys" in (ROOT / "docker" / "sshd_config").read_text()
    assert spec["sshAuthMountPath"] == "/root/.ssh"
    for role in ("Launcher", "Worker"):      # that image in the registry docs/CLUSTERS.md pushes it to
        container = spec["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        assert container["image"] == f"{REGISTRY_PLACEHOLDER}/{image}"
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["args"] == ["sshd"]
    # Readiness asks the kernel whether sshd listens: a tcpSocket probe made sshd log a closed connection every 2 s.
    probe = worker["containers"][0]["readinessProbe"]
    assert "tcpSocket" not in probe and f"sport = :{port}" in " ".join(probe["exec"]["command"])
    # The scheduler needs requests a node can hold: limits alone become requests (512Gi stayed Pending).
    resources = worker["containers"][0]["resources"]
    assert {"cpu", "memory", "nvidia.com/gpu"} <= set(resources["requests"])
    assert resources["requests"] == resources["limits"], "Guaranteed QoS: whole cores beside the GPUs"
    shm = [v for v in worker["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert shm and any(m["mountPath"] == "/dev/shm" for m in worker["containers"][0]["volumeMounts"])
    args = launcher_args(job)
    assert args[:2] == ["hvdkit", "launch"] and args[args.index("-p") + 1] == port
    # No interface named: eth0 exists in a pod network, not under the hostNetwork RDMA setups use.
    assert "--network-interface" not in args


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_the_images_ssh_config_covers_the_operators_worker_names(path):
    """The names the operator's hostfile and discover_hosts.sh give (with and without a cluster domain) get the
    sshd port, the Secret's key and no host-key check from docker/ssh_config alone (`ssh -G` connects to nothing;
    tests/multihost/test_kubernetes_ssh.py runs it on stand-in pods)."""
    job = yaml.safe_load(path.read_text())
    name, port = job["metadata"]["name"], re.search(r"^Port (\d+)", (ROOT / "docker" / "sshd_config").read_text(),
                                                      re.M).group(1)
    for host in (f"{name}-worker-0.{name}.default.svc", f"{name}-worker-1.{name}.team-a.svc.cluster.local"):
        proc = subprocess.run(["ssh", "-G", "-F", str(ROOT / "docker" / "ssh_config"), host], capture_output=True,
                              text=True, timeout=30)
        opts = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
        assert (opts["port"], opts["identityfile"], opts["stricthostkeychecking"], opts["userknownhostsfile"]) == \
            (port, f"{job['spec']['sshAuthMountPath'].replace('/root', '~')}/id_rsa", "false", "/dev/null"), host
    # The Secret's directory is world-writable (a kubelet tmpfs): sshd's StrictModes would refuse every key in it.
    assert re.search(r"^StrictModes no$", (ROOT / "docker" / "sshd_config").read_text(), re.M)


def run_dry(args: list[str], replace: dict[str, str]) -> subprocess.CompletedProcess:
    argv = [replace.get(a, a) for a in args[1:]]
    argv.insert(argv.index("--"), "--dry-run")
    return run_hvdkit(*argv, timeout=120)


def test_static_job_launches_on_the_operators_hostfile(tmp_path):
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "mpijob.yaml").read_text())
    name, workers, slots = job["metadata"]["name"], job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"], \
        job["spec"]["slotsPerWorker"]
    hosts = [f"{name}-worker-{i}.{name}.default.svc" for i in range(workers)]
    hostfile = tmp_path / "hostfile"     # what the operator writes at /etc/mpi/hostfile
    hostfile.write_text("".join(f"{h} slots={slots}\n" for h in hosts))
    args = launcher_args(job)
    assert args[args.index("--hostfile") + 1] == "/etc/mpi/hostfile"
    assert int(args[args.index("-np") + 1]) == workers * slots, "-np must fill every worker's GPUs"
    proc = run_dry(args, {"/etc/mpi/hostfile": str(hostfile)})
    assert proc.returncode == 0, proc.stderr
    assert f"-np {workers * slots} -H {','.join(f'{h}:{slots}' for h in hosts)} --mpi -p 12345" in proc.stdout


def test_elastic_job_reads_the_operators_discovery_script(tmp_path):
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "mpijob-elastic.yaml").read_text())
    name, slots = job["metadata"]["name"], job["spec"]["slotsPerWorker"]
    script = tmp_path / "discover_hosts.sh"   # the operator's prints bare names, one a line
    script.write_text("#!/bin/sh\n" + "".join(f"echo {name}-worker-{i}.{name}.default.svc\n" for i in range(2)))
    script.chmod(0o755)
    args = launcher_args(job)
    assert int(args[args.index("--slots") + 1]) == slots
    proc = run_dry(args, {"/etc/mpi/discover_hosts.sh": str(script)})
    assert proc.returncode == 0, proc.stderr
    assert f"--host-discovery-script {script} --slots {slots}" in proc.stdout and "--gloo" in proc.stdout


@pytest.mark.parametrize("breakage,expect", [
    (lambda j: j["spec"].__setitem__("slotsPerWorkers", 8), "schema"),                   # misspelt field
    (lambda j: j["spec"].__setitem__("slotsPerWorker", "8"), "schema"),                  # string slots
    (lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .__setitem__("imagePullPolicyy", "Always"), "schema"),                              # unknown container field
    (lambda j: j["spec"]["mpiReplicaSpecs"].pop("Worker"), "hvdkit"),                    # no workers
    (lambda j: j["spec"].__setitem__("slotsPerWorker", 4), "hvdkit"),                    # slots != GPUs
])
def test_broken_manifests_are_rejected(validator, breakage, expect):
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "mpijob.yaml").read_text())
    breakage(job)
    schema_errors = list(validator.iter_errors(job))
    if expect == "schema":
        assert schema_errors
    else:
        assert not schema_errors and hvdkit_errors(job)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_job_checkpoints_where_an_evicted_pod_leaves_it_and_resumes(path):
    """Issue 34, case 8: the manifest mounted no checkpoint volume and passed no --resume, so an evicted
    job restarted from scratch; the grace period must leave the entrypoint's wait for the ranks room. Issue 50:
    the elastic job promised the same and had neither (nor did its example checkpoint)."""
    job = yaml.safe_load(path.read_text())
    args = launcher_args(job)
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in worker["containers"][0]["volumeMounts"]}
    claims = [v for v in worker["volumes"] if "persistentVolumeClaim" in v]
    assert [v["name"] for v in claims] == ["checkpoints"]
    ckpt = args[args.index("--checkpoint-dir") + 1]
    assert ckpt.startswith(mounts["checkpoints"] + "/") and ckpt.endswith("/") and "--resume" in args
    grace = {e["name"]: e["value"] for e in worker["containers"][0]["env"]}["HVDKIT_STOP_GRACE_S"]
    assert int(grace) + 5 <= worker["terminationGracePeriodSeconds"]
    if "--host-discovery-script" not in args:     # hvdkit launch asks the ranks to checkpoint on its SIGTERM (MPI)
        launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
        assert launcher.get("terminationGracePeriodSeconds", 30) >= worker["terminationGracePeriodSeconds"]
    # The example the launcher runs takes both flags (and so checkpoints on the SIGTERM the entrypoint passes on).
    example = ROOT / args[args.index("--") + 2]
    assert '"--checkpoint-dir"' in example.read_text() and '"--resume"' in example.read_text(), example.name
    # Another job's directory: two jobs resuming from one directory would take each other's checkpoints.
    assert job["metadata"]["name"] in ckpt


def kubelet_reference(image: str) -> str:
    """The reference a kubelet pulls for ``image`` (Docker's normalisation, distribution/reference's
    ParseNormalizedNamed): a first path component with no '.' or ':' that is not 'localhost' is not a registry
    host, so the name is Docker Hub's (docker.io), and one without a path is under its library/."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image if rest else 'library/' + image}"


def images(job: dict) -> list[str]:
    return [c["image"] for spec in job["spec"]["mpiReplicaSpecs"].values()
            for key in ("initContainers", "containers") for c in spec["template"]["spec"].get(key, [])]


def test_the_kubelet_reading_of_image_names():
    assert kubelet_reference("hvdkit:gpu") == "docker.io/library/hvdkit:gpu"
    assert kubelet_reference("team/hvdkit:gpu") == "docker.io/team/hvdkit:gpu"
    assert kubelet_reference("localhost/hvdkit:gpu") == "localhost/hvdkit:gpu"
    assert kubelet_reference("registry.example.com/hvdkit:gpu") == "registry.example.com/hvdkit:gpu"
    assert kubelet_reference("gpu-registry:5000/ml/hvdkit:gpu") == "gpu-registry:5000/ml/hvdkit:gpu"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_image_is_pulled_from_a_registry_not_docker_hubs_library(path):
    """Issue 50: `image: hvdkit:gpu` is docker.io/library/hvdkit:gpu to a kubelet, which does not exist: every pod
    on a node the image was not loaded into by hand ended in ErrImagePull. The manifests name a registry
    placeholder, and docs/CLUSTERS.md says how to push the image there and put its name in."""
    job = yaml.safe_load(path.read_text())
    found = images(job)
    assert found, f"{path.name} names no image"
    for image in found:
        assert not kubelet_reference(image).startswith("docker.io/"), \
            f"{path.name}: a kubelet pulls {image} as {kubelet_reference(image)}, from Docker Hub"


def push_block() -> str:
    """docs/CLUSTERS.md's bash block that pushes the image and names it in the manifests."""
    text = (ROOT / "docs" / "CLUSTERS.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "docker push" in b]
    assert len(blocks) == 1, "docs/CLUSTERS.md must show one push of the image (docker tag, docker push)"
    return blocks[0]


@pytest.mark.parametrize("registry", [None, "gpu-registry.internal:5000/ml"], ids=["as-written", "own-registry"])
def test_the_documented_push_gives_the_manifests_an_image_the_cluster_pulls(tmp_path, registry):
    """The block as written (its REGISTRY line replaced by another registry in the second case), in a copy of
    deploy/kubernetes, with docker recorded rather than run (no registry here): it tags and pushes the image the
    compose file builds, and its sed leaves every manifest naming exactly what was pushed."""
    block = push_block()
    if registry:
        block, n = re.subn(r"^REGISTRY=\S+", f"REGISTRY={registry}", block, flags=re.M)
        assert n == 1, "the block sets REGISTRY once, for the reader to change"
    (tmp_path / "deploy").mkdir()
    shutil.copytree(ROOT / "deploy" / "kubernetes", tmp_path / "deploy" / "kubernetes")
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c",
                           'docker() { echo "$*" >> docker.log; }\n' + block],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["x-image"]["image"]
    pushed = (registry or REGISTRY_PLACEHOLDER) + "/" + built
    assert (tmp_path / "docker.log").read_text().splitlines() == [f"tag {built} {pushed}", f"push {pushed}"]
    for path in sorted((tmp_path / "deploy" / "kubernetes").glob("*.yaml")):
        assert set(images(yaml.safe_load(path.read_text()))) == {pushed}, path.name
        assert kubelet_reference(pushed) == pushed
