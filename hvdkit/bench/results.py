"""How a benchmark worker hands its results to the process that launched it.

Rank 0 may run on another host, so results travel on stdout, not in a file.
horovodrun prefixes each rank's output lines (and MPI splits a line at every
separate write, and now and then inside one), so the payload is base64 in
short lines that :func:`collect` finds again once the prefixes are gone.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

from hvdkit.common.launcher import detect

MARK = "HVDKIT-RESULT"
_CHUNK = 160
_LINE = re.compile(MARK + r" (\d+)/(\d+) ([A-Za-z0-9+/=]+)")
# horovodrun's per-rank prefixes: "[1,0]<stdout>:" (MPI) and "[0]<stdout>:" (Gloo).
# OpenMPI sometimes inserts one in the middle of a line it read in two pieces.
_PREFIX = re.compile(r"\[\d+(?:,\d+)?\]<std(?:out|err)>:")


def emit(payload: dict, stream=None) -> None:
    """Write ``payload`` as JSON in marked base64 chunks (call on the reporting rank only: rank 0, or a parameter
    server's first worker)."""
    stream = stream or sys.stdout
    data = base64.b64encode(json.dumps(payload).encode()).decode()
    chunks = [data[i:i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [""]
    for i, chunk in enumerate(chunks):
        stream.write(f"{MARK} {i}/{len(chunks)} {chunk}\n")
        stream.flush()


def collect(output: str) -> dict | None:
    """The payload :func:`emit` wrote somewhere in ``output``; None if it is missing or incomplete."""
    parts: dict[int, str] = {}
    total = None
    for match in _LINE.finditer(_PREFIX.sub("", output)):
        index, count, chunk = int(match.group(1)), int(match.group(2)), match.group(3)
        parts[index], total = chunk, count
    if total is None or len(parts) != total:
        return None
    try:
        return json.loads(base64.b64decode("".join(parts[i] for i in range(total))))
    except ValueError:  # a damaged chunk: report "no result" rather than crash
        return None


def launcher_world() -> tuple[int, int, int]:
    """(rank, size, local_rank) as the launcher set them: horovodrun (Gloo), mpirun or torchrun."""
    place = detect()
    return place.rank, place.size, place.local_rank


def cuda_index(local_rank: int, visible: int) -> int:
    """The GPU a baseline pins among the ``visible`` ones: its local rank's where it sees the host's GPUs,
    else its first, as ``hk.init()`` pins (a launcher that gives each rank its own GPU, as Slurm's
    ``--gpus-per-task`` does, shows each rank one: ``cuda:<local rank>`` would not exist)."""
    return local_rank if local_rank < visible else 0



def pin_cuda(local_rank: int, cuda) -> int | None:
    """Pin a baseline to the GPU :func:`cuda_index` picks (``cuda`` is ``torch.cuda``); its index, or None
    without CUDA (the CPU)."""
    if not cuda.is_available():
        return None
    gpu = cuda_index(local_rank, cuda.device_count())
    cuda.set_device(gpu)
    return gpu

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else (platform.processor() or platform.machine())


def machine() -> dict:
    """What the numbers were measured on: host, CPU, cores, memory, GPUs (nvidia-smi, as in hvdkit env)."""
    import psutil

    from hvdkit.ops.envreport import gpu_names

    return {"host": socket.gethostname(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "gpu": ", ".join(gpu_names()) or None}


def write_table(path, lines: list[str]) -> None:
    """Print a bench's table headed by the machine it ran on (:func:`machine`), and write it to ``path``."""
    text = "\n".join([f"machine: {json.dumps(machine())}", *lines]) + "\n"
    print(text, end="")
    Path(path).write_text(text)


def run_ranks(cmd: list[str], np: int, out, what: str, *, timeout: float = 3600, **env: str) -> list[dict]:
    """Run one bench job (a launcher command whose ranks each write ``out/rank<R>.json``) and return those, by rank.

    One thread a rank (``OMP_NUM_THREADS=1``), the interpreter's bin first on PATH; ``env`` adds variables. A
    failed job ends the bench with its output's tail, headed by ``what``; every rank must report ``np`` ranks.
    """
    bin_dir = Path(sys.executable).parent
    job_env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=job_env)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    ranks = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(np)]
    if {r["size"] for r in ranks} != {np}:
        raise SystemExit(f"{what}: the ranks reported sizes {sorted({r['size'] for r in ranks})}, not {np}")
    return ranks
