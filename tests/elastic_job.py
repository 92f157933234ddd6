"""Run an elastic job in the background and act on its output as it trains.

    job = ElasticJob(argv, env).start()
    job.wait_for(lambda c: c and c[-1].size == 4 and c[-1].step >= 20, timeout=120)
    ...change hosts, kill a worker...
    rc = job.finish(timeout=180)
    check_continuous(job.commits)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

import pytest

from tests.conftest import ROOT

COMMIT = re.compile(r"committed step (\d+) epoch (\d+) size (\d+)")


@dataclass(frozen=True)
class Commit:
    step: int
    epoch: int
    size: int


class ElasticJob:
    def __init__(self, argv: list[str], env: dict[str, str], popen=None):
        self.argv, self.env = argv, env
        self.popen = popen or (lambda argv, env: subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True, cwd=ROOT))
        self.lines: list[str] = []
        self.commits: list[Commit] = []
        self._changed = threading.Condition()

    def start(self) -> "ElasticJob":
        self.proc = self.popen(self.argv, self.env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                match = COMMIT.search(line)
                if match:
                    self.commits.append(Commit(*map(int, match.groups())))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, condition, timeout: float, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not condition(self.commits):
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    self.kill()
                    pytest.fail(f"elastic job never reached: {what} (exit {self.proc.poll()}); "
                                f"last commits {self.commits[-3:]}\n{self.output[-4000:]}")
                self._changed.wait(min(left, 1.0))

    def finish(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"elastic job did not end within {timeout}s\n{self.output[-4000:]}")
        self._reader.join(timeout=10)
        return self.proc.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def size_changes(commits: list[Commit]) -> list[int]:
    """The world sizes over the run, each change once: [4, 3] for a job that lost a worker."""
    sizes = [c.size for c in commits]
    return [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]


def check_continuous(commits: list[Commit], total_steps: int) -> None:
    """Committed steps never go back and never skip: +1 per commit, or +0 when only the epoch moved on."""
    assert commits, "no commits logged"
    for before, after in zip(commits, commits[1:]):
        moved = after.step - before.step
        assert moved in (0, 1), f"committed step jumped from {before} to {after}"
        if moved == 0:
            assert after.epoch == before.epoch + 1, f"step {after.step} committed twice: {before} then {after}"
    assert commits[-1].step == total_steps, f"ended at step {commits[-1].step}, expected {total_steps}"
