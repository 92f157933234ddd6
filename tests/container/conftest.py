"""The image tier's session: one engine, the stand-in base, one build of the unmodified Dockerfile.gpu.

The engine's data root lives in the hvdkit cache (HVDKIT_CACHE_DIR, as CI sets it
empty), so a rerun on a developer's machine reuses the layers while CI builds from
nothing. Everything else the tier makes is removed at the end, and the last test
checks that nothing is left: no container, compose network, mount, link, firewall
rule or forwarding change.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.container.engine import Engine, base_images, host_state

IMAGE = "hvdkit:gpu"
TF_IMAGE = "hvdkit:gpu-tf"
TF_CI_CC = "90"
DOCKERFILE = ROOT / "Dockerfile.gpu"
CACHE = Path(os.environ.get("HVDKIT_CACHE_DIR") or Path.home() / ".cache" / "hvdkit")
TIMINGS = CACHE / "image-tier-timings.json"


@pytest.fixture(scope="session")
def host_before() -> dict[str, str]:
    return host_state()


@pytest.fixture(scope="session")
def engine(host_before, tmp_path_factory):
    work = tmp_path_factory.mktemp("engine")
    with Engine(CACHE / "docker", work / "dockerd.log") as eng:
        eng.work = work
        eng.timings = {}
        yield eng
        eng.docker("compose", "--profile", "cpu", "--profile", "gpu", "down", "-v", "--remove-orphans",
                   cwd=ROOT, check=False, timeout=300)
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps(eng.timings, indent=1))
    # Stopped engine: nothing of it may remain on the host (an error here fails the tier).
    assert eng.mounts_left() == [], f"mounts left by the engine: {eng.mounts_left()}"
    after = host_state()
    changed = {k: (host_before[k], after[k]) for k in after if after[k] != host_before[k]}
    assert not changed, f"the image tier changed the host: {changed}"


@pytest.fixture(scope="session")
def stand_ins(engine) -> None:
    """Every base the Dockerfile names: the classic builder pulls those of both flavours for either build."""
    engine.timings["base_s"] = round(engine.stand_in_bases(base_images(DOCKERFILE), engine.work))


def build(engine, tag: str, *build_args: str, name: str) -> str:
    """Build Dockerfile.gpu exactly as shipped (classic builder, host network), on the stand-in bases."""
    log = CACHE / f"{name}-build.log"
    log.write_text("")
    start = time.monotonic()
    args = [a for arg in build_args for a in ("--build-arg", arg)]
    engine.docker("build", "--network", "host", "-f", "Dockerfile.gpu", *args, "-t", tag, ".", cwd=ROOT,
                  output=log, timeout=3000)
    engine.timings[f"{name}_build_s"] = round(time.monotonic() - start)
    if os.environ.get("HVDKIT_IMAGE_TIER_PRUNE") == "1":
        # CI (an empty cache every run): the builder stage's layers (8.6 GB for TensorFlow's) are only a cache
        # for the next build; dropping them keeps the two flavours' builds within a CI machine's disk.
        engine.docker("image", "prune", "-f", timeout=600)
    return tag


@pytest.fixture(scope="session")
def image(engine, stand_ins) -> str:
    """The default flavour (torch), built with no build argument."""
    return build(engine, IMAGE, name="image")


@pytest.fixture(scope="session")
def tf_image(engine, stand_ins) -> str:
    """The TensorFlow flavour. Its kernels for sm_90 only: Debian's nvcc 12.4 in the stand-in predates
    sm_100/sm_120 (the default list needs nvcc >= 12.8, which NVIDIA's devel image has), and one
    architecture keeps the tier's time down."""
    return build(engine, TF_IMAGE, "FLAVOUR=tensorflow", f"HOROVOD_BUILD_CUDA_CC_LIST={TF_CI_CC}", name="tf-image")


def in_image(engine, image: str, *argv: str, timeout: float = 300, check: bool = True):
    """Run a command in a throwaway container of the image (no GPU flags: this machine has none)."""
    return engine.docker("run", "--rm", "--network", "none", "--entrypoint", "", image, *argv,
                         timeout=timeout, check=check)


def build_tools_left(engine, image: str, keep: str) -> list[str]:
    """Compilers and CUDA build tools in the image, less the run-time ptxas under ``keep`` (a find -path)."""
    return in_image(engine, image, "sh", "-c",
                    "for t in gcc g++ cc c++ nvcc ptxas cmake make; do command -v $t; done; "
                    "find / -xdev \\( -name nvcc -o -name ptxas -o -name cicc -o -name cmake \\) "
                    f"-type f -not -path '{keep}' -print 2>/dev/null; true").stdout.split()


def static_archives(engine, image: str) -> int:
    return int(in_image(engine, image, "sh", "-c", "find / -xdev -name '*_static.a' | wc -l").stdout.strip())


def image_bytes(engine, image: str, key: str, base: str) -> int:
    size = int(engine.docker("image", "inspect", "--format", "{{.Size}}", image).stdout)
    engine.timings[key] = size
    print(f"image {image}: {size / 1e9:.2f} GB on the {base} stand-in base")
    return size
