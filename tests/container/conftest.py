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
def image(engine) -> str:
    """Build Dockerfile.gpu exactly as shipped (classic builder, host network), on the stand-in base."""
    engine.timings["base_s"] = round(engine.stand_in_base(base_images(DOCKERFILE), engine.work))
    log = CACHE / "image-build.log"
    log.write_text("")
    start = time.monotonic()
    engine.docker("build", "--network", "host", "-f", "Dockerfile.gpu", "-t", IMAGE, ".", cwd=ROOT,
                  output=log, timeout=3000)
    engine.timings["build_s"] = round(time.monotonic() - start)
    return IMAGE


def in_image(engine, image: str, *argv: str, timeout: float = 300, check: bool = True):
    """Run a command in a throwaway container of the image (no GPU flags: this machine has none)."""
    return engine.docker("run", "--rm", "--network", "none", "--entrypoint", "", image, *argv,
                         timeout=timeout, check=check)
