"""Every `docker run` command the docs give, read out of them as a user copies it.

Where: the fenced bash blocks and inline code spans of README.md and docs/*.md, and the
comment lines of Dockerfile.gpu and docker-compose.yml. A backslash continues a block's
line; a trailing `# comment` is not part of the command. A span that elides part of the
command (`...`) is a fragment: checked for its flags, never run.

    runs = documented_runs()
    [r for r in runs if r.gpu and r.of_the_kit and not r.nccl_ready()]   # what tests/unit/... refuses
    r.argv_here()                                            # tests/container: what this machine can start

The image tier runs the whole ones (tests/container/test_docker_run_docs.py); the unit
tier checks the flags (tests/unit/test_docker_run_docs.py). Neither needs Docker to parse.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
HEADERS = ["Dockerfile.gpu", "docker-compose.yml"]
FENCE = re.compile(r"^[ \t]*```(\S*)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
SPAN = re.compile(r"`(docker run\b[^`]*)`")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# docker run's options that take no value (the rest take the next word, or `=value`).
FLAGS = {"--rm", "-d", "--detach", "-i", "--interactive", "-t", "--tty", "-it", "-ti", "--privileged", "--init",
         "--read-only", "-P", "--publish-all", "--no-healthcheck", "--oom-kill-disable", "--sig-proxy", "-q", "--quiet"}

# What this machine cannot give a container, and why: the image tier runs each documented line without these only.
NO_GPU = "no GPU on these machines"
NO_MEMLOCK = "root here lacks CAP_SYS_RESOURCE (memlock hard limit 8 MiB): a container asking -1 cannot start"
# The tier's engine runs with --bridge=none (it leaves the host's firewall and forwarding alone), so a line that
# names no network gets the host's, which also reaches no more than the default bridge would here.
NO_BRIDGE = "the image tier's engine makes no default bridge (--bridge=none)"


@dataclass(frozen=True)
class DockerRun:
    source: str                      # "docs/DOCKER.md:7"
    argv: tuple[str, ...]            # from "docker" on
    whole: bool                      # a command as written in a block or header, not an elided span

    def __str__(self) -> str:
        return f"{self.source}: {shlex.join(self.argv)}"

    def split(self) -> tuple[list[tuple[str, str | None]], str | None, list[str]]:
        """(options as (name, value), the image, the command after it)."""
        words, options, i = list(self.argv[2:]), [], 0
        while i < len(words) and words[i].startswith("-"):
            word = words[i]
            if "=" in word:
                name, value = word.split("=", 1)
                options.append((name, value))
            elif word in FLAGS:
                options.append((word, None))
            else:
                options.append((word, words[i + 1] if i + 1 < len(words) else None))
                i += 1
            i += 1
        image = words[i] if i < len(words) else None
        return options, image, words[i + 1:]

    @property
    def options(self) -> list[tuple[str, str | None]]:
        return self.split()[0]

    @property
    def image(self) -> str | None:
        return self.split()[1]

    @property
    def command(self) -> list[str]:
        return self.split()[2]

    @property
    def gpu(self) -> bool:
        """Hands the container GPUs (or the InfiniBand devices NCCL uses beside them)."""
        return any(name == "--gpus" or (name == "--device" and value and value.startswith(("/dev/nvidia",
                                                                                          "/dev/infiniband")))
                   for name, value in self.options)

    @property
    def of_the_kit(self) -> bool:
        """Runs hvdkit's image (or elides it: `...`), not another (`ubuntu nvidia-smi` checks the toolkit)."""
        return self.image in (None, "...") or self.image.startswith("hvdkit:")

    def shared_memory(self) -> bool:
        """--ipc=host (the host's /dev/shm) or a stated --shm-size: Docker's default is 64 MiB."""
        return any((name == "--ipc" and value == "host") or name == "--shm-size" for name, value in self.options)

    def unlimited_memlock(self) -> bool:
        return any(name == "--ulimit" and value in ("memlock=-1", "memlock=-1:-1") for name, value in self.options)

    def nccl_ready(self) -> bool:
        return self.shared_memory() and self.unlimited_memlock()

    def argv_here(self) -> tuple[list[str], list[str]]:
        """This command as this machine can start it, and each change made, with its reason.

        Only ``--gpus`` and an unlimited ``--ulimit memlock`` are removed; a line that names no network
        gets ``--network host`` (see :data:`NO_BRIDGE`).
        """
        options, image, command = self.split()
        kept, changes = [], []
        for name, value in options:
            if name == "--gpus":
                changes.append(f"removed --gpus {value}: {NO_GPU}")
            elif name == "--ulimit" and value and value.startswith("memlock="):
                changes.append(f"removed --ulimit {value}: {NO_MEMLOCK}")
            else:
                kept += [name] if value is None else [name, value]
        if not any(name in ("--network", "--net") for name, _ in options):
            kept += ["--network", "host"]
            changes.append(f"added --network host: {NO_BRIDGE}")
        return ["run", *kept, image, *command], changes


def _commands(text: str) -> list[tuple[int, list[str]]]:
    """(line offset, words) of each `docker run` in shell text, continuation lines joined, comments dropped."""
    found, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for k in range(len(words) - 1):   # a command's first words: `docker run`, after VAR=value or sudo
            if words[k:k + 2] == ["docker", "run"]:
                found.append((start, words[k:]))
            if words[k] != "sudo" and not ASSIGNMENT.match(words[k]):
                break
    return found


def page_runs(name: str, text: str) -> list[DockerRun]:
    """The `docker run` commands of one Markdown page: its bash blocks' lines, then its inline spans."""
    runs = []
    for block in FENCE.finditer(text):
        if block.group(1) != "bash":
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        runs += [DockerRun(f"{name}:{first + offset}", tuple(words), True)
                 for offset, words in _commands(block.group(2))]
    for span in SPAN.finditer(text):
        words = span.group(1).split()
        if len(words) > 2:           # `docker run` alone names the command in prose
            runs.append(DockerRun(f"{name}:{text.count(chr(10), 0, span.start()) + 1}", tuple(words),
                                  "..." not in words))
    return runs


def header_runs(name: str, text: str) -> list[DockerRun]:
    """The `docker run` commands in a file's comment lines (Dockerfile.gpu's and docker-compose.yml's headers)."""
    comments = "\n".join(line.lstrip()[1:] if line.lstrip().startswith("#") else "" for line in text.split("\n"))
    return [DockerRun(f"{name}:{offset + 1}", tuple(words), True) for offset, words in _commands(comments)]


def documented_runs(root: Path = ROOT) -> list[DockerRun]:
    runs = []
    for page in PAGES:
        runs += page_runs(page, (root / page).read_text())
    for name in HEADERS:
        runs += header_runs(name, (root / name).read_text())
    return runs
