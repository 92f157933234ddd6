"""Reading a running job's output: whole rank lines, a worker's exit, the first exception, why the job ended.

``hvdkit launch`` feeds horovodrun's output through :class:`WholeLines` as it
comes and, when the job fails, asks :func:`explain_failure` for the one line
that names the rank, its host and the cause.

Example::

    explain_failure("Process name: 0\nExit code: 137\n", rank_layout(parse_hosts_string("a:2,b:2"), 4))
    # "rank 0 on a, local rank 0 ended first: killed by SIGKILL"
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

from hvdkit.common.launcher import REQUEUE_EXIT_CODE
from hvdkit.ops.hosts import RankPlacement

# horovodrun's own words when a rank fails: Gloo says "Process name: 1", MPI
# "Process name: [[29678,1],1]"; both follow with "Exit code: N". mpirun may
# instead say "process rank 1 with PID 42 on node hostb exited on signal 9".
_PROCESS = re.compile(r"Process name:\s*(?:\[\[\d+,\d+\],)?(\d+)\]?\s*\n\s*(?:\S+\s*)?Exit code:\s*(-?\d+)")
# The elastic driver names the first worker that failed by its host's slot, not its rank: "Process name: hostb[1]".
_ELASTIC_PROCESS = re.compile(r"Process name:\s*[^\s\[]+\[\d+\]\s*\n\s*Exit code:\s*(-?\d+)")
_MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")


def _cause(code: int) -> str:
    number = -code if code < 0 else code - 128 if code > 128 else 0
    if number:
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exit status {code}"


# horovodrun tags each line of a rank's output: Gloo "[1]<stderr>:", MPI (--tag-output) "[1,1]<stderr>:".
_TAGGED = re.compile(r"^(?:\w{3} \w{3} +\d+ [\d:]+ \d{4})?\[(?:\d+,)?(\d+)\]<std(?:out|err)>:(.*)$", re.M)


_MPI_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")


class WholeLines:
    """The ranks' lines whole again, from mpirun's tagged output, where a line can arrive in pieces.

    mpirun (``--tag-output``, as ``horovodrun --mpi`` runs it) tags each piece
    it reads from a rank, so one line a rank printed can come as
    ``[1,1]<stdout>:rank 1 li[1,0]<stdout>:...`` with its rest, tagged again,
    later (measured: 73 of 6000 lines, two ranks printing under
    ``PYTHONUNBUFFERED=1``). Gloo's output (``[0]<stdout>:``) is whole already.

        joiner = WholeLines()
        joiner.feed("[1,1]<stdout>:ab[1,0]<stdout>:x\n")   # ["[1,0]<stdout>:x\n"]
        joiner.feed("[1,1]<stdout>:c\n")                  # ["[1,1]<stdout>:abc\n"]
    """

    def __init__(self):
        self.pending: dict[str, str] = {}      # tag -> the start of that rank's line, still open

    def feed(self, line: str) -> list[str]:
        """The whole lines that ``line`` (one line of mpirun's output) completes; untagged lines pass as they are."""
        tags = list(_MPI_TAG.finditer(line))
        if not tags:
            return [line]
        out = []
        lead = line[:tags[0].start()]
        if lead:                                 # an untagged piece (mpirun's own words) before the first tag
            out.append(lead + "\n")
        for i, tag in enumerate(tags):
            end = tags[i + 1].start() if i + 1 < len(tags) else len(line)
            piece = self.pending.pop(tag.group(0), "") + line[tag.end():end]
            if piece.endswith("\n"):
                out.append(tag.group(0) + piece)
            else:
                self.pending[tag.group(0)] = piece
        return out

    def flush(self) -> list[str]:
        """Lines still open when the output ended, each ended with a newline."""
        out = [tag + piece + "\n" for tag, piece in self.pending.items()]
        self.pending.clear()
        return out


def is_rank_output(line: str) -> bool:
    """Whether ``line`` is a rank's own output as horovodrun tags it, not horovodrun's or mpirun's."""
    return _TAGGED.match(line) is not None


# All horovodrun says when an elastic worker ends: the rank it started with, and its exit status.
_WORKER_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.$")


def removed_worker(line: str) -> int | None:
    """The rank (as it started) of a worker whose output says the discovery script's new host list left its
    slot out; Horovod ends it with exit status 1 and "Process N exit with status code 1." like a failure."""
    match = _TAGGED.match(line)
    return int(match.group(1)) if match and "has been removed from elastic job" in match.group(2) else None


def worker_exit(line: str) -> tuple[int, int] | None:
    """(rank it started as, exit status) from horovodrun's "Process 1 exit with status code 137." line."""
    match = _WORKER_EXIT.match(line.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def explain_worker_exit(rank: int, code: int, slots: dict[int, tuple[str, int]], removed: set[int]) -> str:
    """The line naming an elastic worker that ended (horovodrun names only the rank it started as).

    ``slots`` maps the rank a worker started as to (host, local rank), from
    :func:`hvdkit.common.launcher.horovodrun_worker_slot`; ``removed`` holds the ranks :func:`removed_worker` saw
    leave because their slot left the host list::

        explain_worker_exit(1, 137, {0: ("hosta", 0), 1: ("hostb", 0)}, set())
        # 'worker lost: rank 1 on hostb, local rank 0: killed by SIGKILL; Horovod drops its host and ...'

    Whether the job goes on is said from the hosts of the workers seen so
    far: when they all share the lost worker's host, Horovod drops them all.
    """
    if rank in slots:
        host, local_rank = slots[rank]
        where = f"rank {rank} on {host}, local rank {local_rank}"
    else:
        where = f"rank {rank} (its host is unknown: it ended before hvdkit launch saw it start)"
    if rank in removed:
        return f"worker left: {where}: its slot is no longer in the discovered hosts ({_cause(code)})"
    if code == REQUEUE_EXIT_CODE:       # every rank exits so together, once rank 0's checkpoint is on disk
        return f"worker preempted: {where}: {_cause(code)}, after the ranks' checkpoint"
    host = slots.get(rank, (None,))[0]
    if host is not None and {h for h, _ in slots.values()} == {host}:
        return (f"worker lost: {where}: {_cause(code)}; Horovod drops its host, {host}, where every worker of this "
                "job runs, so the job stops")
    return (f"worker lost: {where}: {_cause(code)}; Horovod drops its host and every worker on it; the job goes on "
            "while --min-np workers remain on other hosts, after a pause of up to HOROVOD_GLOO_TIMEOUT_SECONDS "
            "(30 s by default) while they notice")


# An exception line of a Python traceback: "hvdkit.runtime.checkpoint_files.CheckpointError: cannot write ...", or the
# bare name at the end of the line. A script's own "error: ..." line (SystemExit with a message, as hvdkit's
# examples end) counts the same.
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?::\s.*|:?\s*)$")
# What ranks raise *because* another rank failed first: they are not the cause. Matched anywhere in the rank's
# traceback, since TensorFlow puts "Graph execution error:" first and the cause lines below it.
_CONSEQUENCE = re.compile(r"HorovodInternalError|Horovod has been shut down|HostsUpdatedInterrupt|"
                          r"Connection reset by peer|Connection closed by peer|Broken pipe|"
                          r"gloo::(?:IoException|EnforceNotMet)|Read error|Timed out waiting")


# The patched Horovod's stall inspector (scripts/patches) ends a job whose ranks all wait in mismatched collectives.
# hvdkit's own calls that every rank must make name their first collective after themselves (hvdkit.torch.sharded).
COLLECTIVE_CALLS = ("hk.save_checkpoint", "hk.broadcast_state")
_DEADLOCK = re.compile(r"Deadlock: (every rank is waiting .*?)(?: Shutting Horovod down.*)?$", re.M)


def first_exception(output: str) -> tuple[int, str] | None:
    """(rank, its exception line) of the rank whose own error came first in horovodrun's tagged output.

    Each rank's output is cut into blocks at "Traceback (most recent call
    last)"; a block whose text shows the rank only failed because another
    died (Horovod shut down, a peer closed the connection) is passed over:
    horovodrun lists ranks in the order it reaps them, which is often not the
    order they failed in.
    """
    blocks: list[tuple[int, list[str]]] = []           # (rank, lines) in order of each block's first line
    open_block: dict[int, list[str]] = {}
    for match in _TAGGED.finditer(output):
        rank = int(match.group(1))
        # mpirun tags each write, so a line written in pieces (an exception's type, then its message) carries
        # the rank's tag again inside it.
        text = re.sub(rf"\[(?:\d+,)?{rank}\]<std(?:out|err)>:", "", match.group(2)).strip()
        if not text:
            continue
        chained = any(line.startswith(("The above exception", "During handling of the above"))
                      for line in open_block.get(rank, [])[-1:])
        if (text.startswith("Traceback (most recent call last)") and not chained) or text.startswith("error: "):
            open_block[rank] = []
            blocks.append((rank, open_block[rank]))
        if rank in open_block:
            open_block[rank].append(text)
    for rank, lines in blocks:
        if any(_CONSEQUENCE.search(line) for line in lines):
            continue
        raised = [line for line in lines if line.startswith("error: ") or (
            _EXCEPTION.match(line) and _EXCEPTION.match(line).group(1) not in ("SystemExit", "KeyboardInterrupt"))]
        if raised:
            return rank, raised[-1]      # a chained traceback ends with the exception that was raised last
    return None


def ended_by_preemption(rc: int, output: str) -> bool:
    """The job ended because its ranks checkpointed and exited :data:`REQUEUE_EXIT_CODE` (a preemption).

    mpirun passes the ranks' 75 up, and so does horovodrun under Gloo since
    Horovod patch item 14 (it exited 1 whatever the ranks' codes, "Horovod
    detected that one or more processes exited with non-zero status ... Exit
    code: 75", so a requeue wrapper that waits for 75 never fired). The first
    rank horovodrun reports still decides, for a Horovod without that item
    and for an elastic job, whose driver still exits 1 and names the first
    worker by its slot (``Process name: hostb[1]``): under hvdkit's preemption
    protocol every rank exits 75 together, once the checkpoint is on disk.
    """
    if rc == REQUEUE_EXIT_CODE:
        return True
    if rc == 0:
        return False
    first = _PROCESS.search(output)
    elastic = _ELASTIC_PROCESS.search(output)
    code = int(first.group(2)) if first else int(elastic.group(1)) if elastic else None
    return code == REQUEUE_EXIT_CODE and _MPI_SIGNAL.search(output) is None


def explain_failure(output: str, layout: Sequence[RankPlacement]) -> str | None:
    """One line naming the rank that failed first, its host and the cause, from horovodrun's output."""
    hosts = {p.rank: p for p in layout}
    deadlock = _DEADLOCK.search(output)
    if deadlock:
        called = next((c for c in COLLECTIVE_CALLS if f".{c}." in deadlock.group(1)), None)
        hint = f" {called} is collective: call it on every rank, not under `if ctx.is_main:`." if called else ""
        return f"the ranks deadlocked: {deadlock.group(1)}{hint}"
    # A rank killed by a signal (SIGKILL, the OOM killer) prints no traceback; horovodrun's first report names it.
    reaped = _PROCESS.search(output)
    signalled = _MPI_SIGNAL.search(output) or (reaped and not 0 <= int(reaped.group(2)) <= 128)
    raised = None if signalled else first_exception(output)
    if raised is not None:
        rank, text = raised
        place = hosts.get(rank)
        where = f" on {place.host}, local rank {place.local_rank}" if place else ""
        return f"rank {rank}{where} failed first: {text[:300]}"
    match = _MPI_SIGNAL.search(output)
    if match:
        rank, node, number = int(match.group(1)), match.group(2), int(match.group(3))
        place = hosts.get(rank)
        local = f", local rank {place.local_rank}" if place else ""
        return f"rank {rank} on {node}{local} ended first: {_cause(-number)}"
    match = _PROCESS.search(output)
    if not match:
        return None
    rank, code = int(match.group(1)), int(match.group(2))
    place = hosts.get(rank)
    where = f" on {place.host}, local rank {place.local_rank}" if place else ""
    return f"rank {rank}{where} ended first: {_cause(code)}"
