"""Did NCCL take the fastest path the machine offers, and at what bus bandwidth? Read from the tools' own text.

``nvidia-smi topo -m`` prints the link between every pair of GPUs (``NV18``: 18
bonded NVLinks; ``PIX``/``PXB``: PCIe switches only; ``PHB``/``NODE``/``SYS``:
through a CPU's host bridge, or across sockets) and the RDMA NICs. With
``NCCL_DEBUG=INFO`` (subsystem ``INIT`` is enough) each rank logs the transport
it chose for each peer of each channel, in the formats of NCCL's
``src/transport/{p2p,shm,net}.cc``::

    host:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
    host:123:456 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct
    host:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA

``rank[dev]``: since NCCL 2.18 ``dev`` is the NVML index, nvidia-smi's GPU
number (older releases printed a PCI bus id, which is matched to no GPU here).
:func:`judge` fails a job whose NCCL used a slower transport than the link
offers (SHM or sockets between NVLinked GPUs; the network between GPUs of one
host, as when the ranks sit in two containers: NCCL tells hosts apart by
hostname and boot id) and a bus bandwidth below the floor for the link
offered. ``make test-gpu`` (scripts/gpu_acceptance.py) runs it; the recorded
samples under tests/data/gpu_topology/ test it here, without a GPU.

Example::

    topo = parse_topology(subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout)
    verdict = judge(topo, parse_nccl_log(job_output), ranks=8, nbytes=64 << 20, seconds=1.3e-3)
    verdict.ok, verdict.problems, verdict.busbw_gbps

Imports no framework: it runs on the launching machine.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from hvdkit.common.errors import UserError

# Bus-bandwidth floors (GB/s) for the link nvidia-smi offers between the job's GPUs, measured on make test-gpu's
# 64 MiB Horovod allreduce, where every call also pays Horovod's cycle (1.07 ms at np=1 on the H100 of
# 2026-11-26). Conservative on purpose: they catch a wrong or broken path, not a slow right one; the worst
# case is 2 ranks (busbw = algbw). Change them here or with scripts/gpu_acceptance.py --busbw-floor CLASS=GBPS.
BUSBW_FLOOR_GBPS: dict[str, float] = {
    # the slowest NVLink, a 2-GPU NV4 bridge (~50 GB/s busbw in nccl-tests), keeps ~28 after 1 ms a call
    "nvlink": 15.0,
    # PCIe 3.0 x16 peer-to-peer (~10 GB/s busbw in nccl-tests) keeps ~8 after 1 ms a call
    "pcie_p2p": 3.0,
    # through host memory across sockets (~5 GB/s on PCIe 3.0 servers) keeps ~4 after 1 ms a call
    "shm": 1.0,
}

# What each nvidia-smi link code offers, and the slowest transport NCCL should pick over it. NCCL's default
# P2P level is PXB (src/graph/paths.cc, ncclTopoCheckP2p): peer-to-peer over NVLink or PCIe switches, shared
# memory through a host bridge or across sockets. SOC is SYS's name in drivers before 384.
OFFERED = {"PIX": "pcie_p2p", "PXB": "pcie_p2p", "PHB": "shm", "NODE": "shm", "SYS": "shm", "SOC": "shm"}
EXPECTED = {"nvlink": "P2P", "pcie_p2p": "P2P", "shm": "SHM"}
SPEED = {"P2P": 3, "SHM": 2, "NET": 1}       # of NCCL's transports within a host, fastest first
ORDER = ["nvlink", "pcie_p2p", "shm"]        # offered classes, fastest first
HINTS_HOST = ("NCCL_P2P_DISABLE, NCCL_SHM_DISABLE or NCCL_P2P_LEVEL set? ranks in separate containers? "
              "/dev/shm too small?")
HINTS_NET = "NCCL_IB_DISABLE=1 or NCCL_NET=Socket set? no RDMA user-space libraries (libibverbs) in the image?"

ANSI = re.compile(r"\x1b\[[0-9;]*m")         # nvidia-smi underlines the header on a terminal
DEVICE = re.compile(r"(GPU|NIC)(\d+)$")
NIC_NAME = re.compile(r"^\s*NIC(\d+):\s*(\S+)")
CHANNEL = re.compile(r"NCCL INFO Channel (\d+)(?:/(\d+))? : (\d+)\[(\w+)\] -> (\d+)\[(\w+)\]"
                     r"(?: \[(send|receive)\])? via (.+?)\s*$")
COLLNET = re.compile(r"NCCL INFO CollNet \d+/\d+ : \d+ \[(?:send|receive)\] via (COLLNET/\S+)")
COMM = re.compile(r"NCCL INFO comm 0x[0-9a-f]+ rank \d+ nRanks (\d+) nNodes (\d+) localRanks (\d+)")
INIT_DONE = re.compile(r"NCCL INFO .*comm 0x[0-9a-f]+ rank \d+ nranks (\d+) .*Init COMPLETE")
VERSION = re.compile(r"NCCL version (\S+)")
NVLS = re.compile(r"NCCL INFO NVLS multicast support is (not )?available")
NVLS_COMM = re.compile(r"NCCL INFO NVLS comm 0x")
P2P_DISABLED = re.compile(r"P2P is disabled between connected GPUs (\d+) and (\d+)")


@dataclass(frozen=True)
class Topology:
    """``nvidia-smi topo -m``: the link code between each pair of GPUs (by nvidia-smi's index) and the NICs."""

    gpus: tuple[int, ...]
    links: dict[tuple[int, int], str] = field(default_factory=dict)    # (i, j) -> "NV18", "PIX", "SYS", ...
    nics: tuple[str, ...] = ()                                          # RDMA devices: "mlx5_0", ...

    def offered(self, a: int, b: int) -> str:
        """The class of link between GPUs ``a`` and ``b``: "nvlink", "pcie_p2p" or "shm"."""
        code = self.links[(a, b)]
        if re.fullmatch(r"NV\d+", code):
            return "nvlink"
        if code not in OFFERED:
            raise UserError(f"nvidia-smi topo -m shows {code!r} between GPU{a} and GPU{b}, a link code this "
                             f"reader does not know (it knows NV#, {', '.join(OFFERED)}): add it to OFFERED")
        return OFFERED[code]


@dataclass(frozen=True)
class Channel:
    """One transport line: rank ``src`` (on GPU ``src_dev``) sends to ``dst`` via ``via`` ("P2P/CUMEM/read")."""

    src: int
    src_dev: str
    dst: int
    dst_dev: str
    via: str

    @property
    def transport(self) -> str:
        """"P2P", "SHM" or "NET" (any network plugin: IB, Socket, ...)."""
        return self.via.split("/", 1)[0]

    @property
    def kind(self) -> str:
        """The transport and its mode or network: "P2P/CUMEM", "SHM/direct", "NET/IB", "NET/Socket"."""
        return "/".join(self.via.split("/")[:2])


@dataclass(frozen=True)
class NcclLog:
    """What NCCL_DEBUG=INFO said about the communicators of one job (every rank's lines together)."""

    channels: tuple[Channel, ...] = ()
    version: str | None = None
    nranks: int | None = None
    nnodes: int | None = None           # NCCL's count of hosts (hostname + boot id); None before NCCL 2.19
    nvls: bool | None = None            # NVLink SHARP multicast available (NVSwitch systems)
    nvls_used: bool = False
    collnet: tuple[str, ...] = ()       # "COLLNET/SHARP/0/GDRDMA", ...
    p2p_disabled: frozenset[tuple[int, int]] = frozenset()    # GPU pairs NCCL found without peer access


@dataclass(frozen=True)
class Verdict:
    ok: bool
    problems: tuple[str, ...]
    used: dict[str, int]                # "P2P/CUMEM" -> how many channel lines
    offered: str | None                 # the slowest link between the job's GPUs ("nvlink", ...)
    busbw_gbps: float | None
    floor_gbps: float | None

    def summary(self) -> dict:
        return {"transports": self.used, "offered": self.offered, "busbw_gbps": self.busbw_gbps,
                "floor_gbps": self.floor_gbps, **({"problems": list(self.problems)} if self.problems else {})}


def parse_topology(text: str) -> Topology:
    """The GPU matrix of ``nvidia-smi topo -m``; raises UserError when ``text`` holds none.

    >>> parse_topology("\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tNV4\\t0-15\\nGPU1\\tNV4\\t X \\t0-15\\n").links
    {(0, 1): 'NV4', (1, 0): 'NV4'}
    """
    lines = [ANSI.sub("", line) for line in text.splitlines()]
    header = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"]
                   and not line.startswith("GPU0")), None)           # the header row starts with a tab
    if header is None:
        raise UserError("no GPU matrix in this nvidia-smi topo -m output (no header row starting with GPU0): "
                         + (text.strip().splitlines() or ["(empty)"])[0][:200])
    columns = []
    for word in lines[header].split():
        if word == "CPU":               # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID" follow the devices
            break
        columns.append(word)
    names = dict((int(m[1]), m[2]) for m in map(NIC_NAME.match, lines) if m)
    links, gpus = {}, []
    for line in lines[header + 1:]:
        words = line.split()
        if not words or not DEVICE.match(words[0]):
            continue
        kind, row = DEVICE.match(words[0]).groups()
        if kind != "GPU":
            continue
        gpus.append(int(row))
        for column, code in zip(columns, words[1:1 + len(columns)]):
            m = DEVICE.match(column)
            if m and m[1] == "GPU" and int(m[2]) != int(row):
                links[(int(row), int(m[2]))] = code
    nics = tuple(names.get(int(m[2]), c) if m else c
                 for c, m in ((c, DEVICE.match(c)) for c in columns) if not (m and m[1] == "GPU"))
    listed = sorted({int(m[2]) for m in map(DEVICE.match, columns) if m and m[1] == "GPU"} | set(gpus))
    missing = [(a, b) for a in listed for b in listed if a != b and (a, b) not in links]
    if not gpus or missing:
        raise UserError(f"nvidia-smi topo -m: {len(gpus)} GPU row(s) for {len(listed)} GPU(s), links missing "
                         f"between {missing[:4]}")
    return Topology(gpus=tuple(gpus), links=links, nics=nics)


def parse_nccl_log(text: str) -> NcclLog:
    """Every rank's NCCL INFO lines in ``text`` (a job's output, MPI's or Gloo's rank tags and all)."""
    channels, collnet, disabled = [], [], set()
    version = nranks = nnodes = nvls = None
    nvls_used = False
    for line in text.splitlines():
        if (m := CHANNEL.search(line)):
            channels.append(Channel(int(m[3]), m[4], int(m[5]), m[6], m[8]))
        elif (m := COLLNET.search(line)):
            collnet.append(m[1])
        elif (m := COMM.search(line)):
            nranks, nnodes = max(nranks or 0, int(m[1])), max(nnodes or 0, int(m[2]))
        elif (m := INIT_DONE.search(line)):
            nranks = max(nranks or 0, int(m[1]))
        elif (m := NVLS.search(line)):
            nvls = bool(nvls) or not m[1]
        elif NVLS_COMM.search(line):
            nvls_used = True
        elif (m := P2P_DISABLED.search(line)):
            disabled |= {(int(m[1]), int(m[2])), (int(m[2]), int(m[1]))}
        elif version is None and (m := VERSION.search(line)):
            version = m[1]
    return NcclLog(tuple(channels), version, nranks, nnodes, nvls, nvls_used, tuple(sorted(set(collnet))),
                   frozenset(disabled))


def bus_bandwidth_gbps(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of one allreduce: algbw x 2(N-1)/N, in GB/s (10^9 bytes).

    >>> round(bus_bandwidth_gbps(64 << 20, 1.0e-3, 8), 1)
    117.4
    """
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def _dev(value: str, topo: Topology) -> int | None:
    """A channel line's device as a GPU of ``topo``; None for an older NCCL's PCI bus id ("1b000")."""
    return int(value) if value.isdigit() and int(value) in topo.gpus else None


def judge(topo: Topology, log: NcclLog, *, ranks: int, nbytes: int | None = None, seconds: float | None = None,
          hosts: int = 1, floors: dict[str, float] | None = None) -> Verdict:
    """Compare what NCCL used with what ``topo`` offers, and the measured bus bandwidth with its floor.

    ``ranks`` processes ran on ``hosts`` hosts (this machine's ``topo`` stands for all of them), each allreduce
    of ``nbytes`` took ``seconds``. With one rank NCCL connects nothing: only its communicator line is expected.
    Across hosts the floors are not applied (they are for one host's links); sockets between hosts fail when
    this host lists RDMA NICs.
    """
    floors = BUSBW_FLOOR_GBPS if floors is None else floors
    problems: list[str] = []
    used = dict(Counter(c.kind for c in log.channels).most_common())
    if log.nranks is None and not log.channels:
        problems.append("NCCL printed no communicator or transport line: NCCL_DEBUG=INFO did not reach the ranks "
                        "(or NCCL words them differently now): run the job with NCCL_DEBUG=INFO "
                        "NCCL_DEBUG_SUBSYS=INIT and read its lines")
    elif ranks > 1 and not log.channels:
        problems.append(f"{ranks} ranks but no 'Channel .. : a[x] -> b[y] via ...' line: NCCL connected no peers, "
                        "or this NCCL words its transport lines differently: read the job's NCCL INFO lines")
    if log.nranks is not None and log.nranks != ranks:
        problems.append(f"NCCL's largest communicator has {log.nranks} ranks, the job {ranks}")
    if log.nnodes is not None and log.nnodes > hosts:
        problems.append(f"NCCL counted {log.nnodes} nodes where the job ran on {hosts} host(s): it tells hosts "
                        "apart by hostname and boot id, so ranks in separate containers or network namespaces talk "
                        "over the network, not NVLink or PCIe: run a host's ranks in one container")
    devices = {d for c in log.channels for d in (_dev(c.src_dev, topo), _dev(c.dst_dev, topo)) if d is not None}
    if len(devices) < min(ranks, len(topo.gpus)):
        devices = set(topo.gpus[:ranks])       # bus ids (NCCL < 2.18), or no lines: the first GPUs, as hvdkit pins
    slower: Counter = Counter()
    for c in log.channels:
        a, b = _dev(c.src_dev, topo), _dev(c.dst_dev, topo)
        if hosts > 1:
            if c.transport == "NET" and c.via.startswith("NET/Socket") and topo.nics:
                slower[("sockets between hosts", c.via, f"RDMA NICs {', '.join(topo.nics)}", "NET/IB")] += 1
            if c.transport == "NET":
                continue                       # between hosts: this host's matrix does not describe the link
        if a is None or b is None or a == b:
            x, y = _slowest_pair(topo, devices) or (None, None)
            offered, code = (topo.offered(x, y), topo.links[(x, y)]) if x is not None else (None, None)
        else:
            offered, code = topo.offered(a, b), topo.links[(a, b)]
            if offered == "pcie_p2p" and (a, b) in log.p2p_disabled:
                offered = "shm"                # the GPUs refuse peer access (NCCL said so): shared memory is best
        if offered and SPEED.get(c.transport, 0) < SPEED[EXPECTED[offered]]:     # one this reader lacks: slower
            where = f"GPU{a} -> GPU{b}" if a is not None and b is not None else "between the job's GPUs"
            slower[(where, c.via, code, EXPECTED[offered])] += 1
    for (where, via, code, expected), count in sorted(slower.items()):
        causes = (HINTS_NET if expected.startswith("NET") else HINTS_HOST)
        problems.append(f"{where}: NCCL used {via} ({count} channel line(s)) where nvidia-smi topo -m shows {code}, "
                        f"which offers {expected}: a slower transport than the machine has ({causes})")
    pair = _slowest_pair(topo, devices)
    offered = topo.offered(*pair) if pair else None
    busbw = floor = None
    if nbytes and seconds and ranks > 1:
        busbw = round(bus_bandwidth_gbps(nbytes, seconds, ranks), 2)
        if hosts == 1 and offered is not None:
            floor = floors[offered]
            if busbw < floor:
                problems.append(f"bus bandwidth {busbw} GB/s is below the {floor} GB/s floor for {offered} "
                                f"({nbytes >> 20} MiB allreduce on {ranks} ranks, {seconds * 1e3:.2f} ms): "
                                "NCCL's path or the GPUs' links are slower than the topology says")
    return Verdict(not problems, tuple(problems), used, offered, busbw, floor)


def _slowest_pair(topo: Topology, devices: set[int]) -> tuple[int, int] | None:
    """The pair of ``devices`` with the slowest link: what a ring through all of them is held to at worst."""
    pairs = [(x, y) for x in sorted(devices) for y in sorted(devices) if x != y]
    return max(pairs, key=lambda p: ORDER.index(topo.offered(*p)), default=None)
