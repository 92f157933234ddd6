"""Host lists for multi-host jobs: parse, validate, convert, and lay out ranks.

Two spellings, as horovodrun takes them:

- ``-H server1:4,server2:4`` (a hosts string);
- a hostfile, one host a line: Horovod's ``server1 slots=4``. hvdkit also
  accepts what Horovod 0.28.1's own parser crashes on: ``#`` comments, blank
  lines, OpenMPI's ``max_slots=`` and ``server1:4`` lines.

Example::

    spec = parse_hosts_string("server1:4,server2:4")
    spec.total_slots                     # 8
    rank_layout(spec, np=6)[5]           # RankPlacement(rank=5, host='server2', local_rank=1)
    to_hostfile(spec)                    # "server1 slots=4\\nserver2 slots=4\\n"
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hvdkit.common.errors import UserError

# RFC 1123 host names, or IPv4 addresses.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$)({_LABEL})(\.{_LABEL})*$")
_IPV4 = re.compile(r"^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$")
LOCAL_NAMES = ("localhost", "127.0.0.1")
# A slot is a process: one per GPU, or per core on CPU. The largest two-socket servers have 384 cores (768
# threads), so more than this per host is a typo, refused before anything is laid out per slot (a table of
# every rank grows with the count).
MAX_SLOTS_PER_HOST = 4096


def is_this_machine(name: str) -> bool:
    """localhost, or this machine's own host name (how Slurm and hostfiles name the launching node)."""
    import socket

    me = socket.gethostname()
    return name in LOCAL_NAMES or name in (me, me.split(".")[0])


class HostSpecError(UserError):
    """A malformed host list; the message names where (file:line or the -H item) and the fix."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


@dataclass(frozen=True)
class HostSpec:
    hosts: tuple[Host, ...]
    source: str = "-H"

    @property
    def total_slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def is_local_only(self) -> bool:
        """Every host is this machine: localhost, 127.0.0.1 or this machine's own name."""
        return all(is_this_machine(h.name) for h in self.hosts)


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    host: str
    local_rank: int


@dataclass
class _Builder:
    source: str
    hosts: list[Host] = field(default_factory=list)
    where: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, slots: int, where: str) -> None:
        if not valid_hostname(name):
            raise HostSpecError(f"{where}: {name!r} {_why_invalid(name)}")
        check_slots(name, slots, where)
        if name in self.where:
            raise HostSpecError(f"{where}: host {name!r} is listed twice (first at {self.where[name]}): "
                                "list each host once with its total slots")
        self.where[name] = where
        self.hosts.append(Host(name, slots))

    def build(self) -> HostSpec:
        if not self.hosts:
            raise HostSpecError(f"{self.source}: no hosts listed: add lines like 'server1 slots=4'")
        return HostSpec(tuple(self.hosts), self.source)


def check_slots(name: str, slots: int, where: str) -> None:
    """Raise unless ``slots`` is between 1 and :data:`MAX_SLOTS_PER_HOST`; ``where`` says where it was read."""
    if slots < 1:
        raise HostSpecError(f"{where}: host {name!r} has {slots} slots: give it at least 1 (its number of GPUs)")
    if slots > MAX_SLOTS_PER_HOST:
        raise HostSpecError(f"{where}: host {name!r} has {slots} slots, more than {MAX_SLOTS_PER_HOST}, which no "
                            "machine runs (a slot is a process): give it its number of GPUs, or of cores on CPU")


def _why_invalid(name: str) -> str:
    """What is wrong with a host name that :func:`valid_hostname` refused, and the fix."""
    odd = next((c for c in name if not c.isascii() or not c.isprintable()), None)
    if odd is not None:
        return (f"contains the invisible or non-ASCII character U+{ord(odd):04X} at position {name.index(odd) + 1}: "
                "retype the name, or save the file as plain ASCII/UTF-8 without a byte-order mark")
    return ("is not a valid host name or IPv4 address: use letters, digits, '-' and '.', e.g. server1 or 10.0.0.5")


def _reject_ipv6(item: str, where: str) -> None:
    if item.startswith("[") or item.count(":") > 1:
        raise HostSpecError(f"{where}: {item!r} looks like an IPv6 address, which horovodrun's host lists cannot "
                            "hold (they split on ':'): use a host name that resolves to it (e.g. in /etc/hosts), "
                            "or an IPv4 address such as 127.0.0.1:2")


def _strip_bom(text: str) -> str:
    # Editors on Windows start files with a byte-order mark; it is not part of the first host's name.
    return text[1:] if text.startswith("\ufeff") else text


def valid_hostname(name: str) -> bool:
    ip = _IPV4.match(name)
    if ip:
        return all(0 <= int(part) <= 255 for part in ip.groups())
    return bool(_HOSTNAME.match(name)) and not name.replace(".", "").isdigit()


def _slots(text: str, where: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise HostSpecError(f"{where}: slots for {name!r} must be a whole number, got {text!r}: "
                            f"write e.g. '{name} slots=4'") from None


def parse_hosts_string(text: str) -> HostSpec:
    """Parse horovodrun's ``-H host1:slots,host2:slots`` (a missing ``:slots`` is an error)."""
    builder = _Builder("-H")
    items = [item.strip() for item in _strip_bom(text).split(",")]
    for i, item in enumerate(items, 1):
        where = f"-H item {i} ({item!r})"
        if not item:
            raise HostSpecError(f"-H item {i} is empty: remove the extra comma in {text!r}")
        _add_host_colon_slots(builder, item, where, f"write {item}:N with N the processes for that host")
    return builder.build()


def _add_host_colon_slots(builder: _Builder, item: str, where: str, fix: str) -> None:
    """One ``host:slots`` item (of -H, or a discovery script's output line); ``fix`` says what to write instead."""
    _reject_ipv6(item, where)
    name, sep, slots = item.partition(":")
    if not sep:
        raise HostSpecError(f"{where}: slots are missing: {fix}")
    builder.add(name, _slots(slots, where, name), where)


def parse_discovery_output(text: str, script: str, default_slots: int | None = None) -> HostSpec:
    """Parse what an elastic job's ``--host-discovery-script`` printed: one ``host:slots`` a line.

    With ``default_slots`` (horovodrun's ``--slots``) a bare ``host`` line has that
    many slots, as the MPI Operator's ``/etc/mpi/discover_hosts.sh`` prints them.
    """
    builder = _Builder(f"discovery script {script}")
    for number, line in enumerate(_strip_bom(text).splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        where = f"discovery script {script}, output line {number} ({line!r})"
        if default_slots is not None and ":" not in line:
            builder.add(line, default_slots, where)
            continue
        _add_host_colon_slots(builder, line, where, "print host:slots, one host a line (or pass --slots N "
                                                    "for bare host names)")
    if not builder.hosts:
        raise HostSpecError(f"discovery script {script} printed no hosts: make it print host:slots lines "
                            "(examples/discover_hosts.sh prints those of $HVDKIT_ELASTIC_HOSTS)")
    return builder.build()


def parse_hostfile_text(text: str, path: str = "<hostfile>") -> HostSpec:
    """Parse a hostfile; errors carry ``path:line``."""
    builder = _Builder(path)
    for lineno, raw in enumerate(_strip_bom(text).splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        fields = line.split()
        name = fields[0]
        _reject_ipv6(name, where)
        slots = None
        if ":" in name and len(fields) == 1:             # server1:4
            name, _, count = name.partition(":")
            slots = _slots(count, where, name)
        for extra in fields[1:]:
            key, sep, value = extra.partition("=")
            if key == "slots" and sep:
                slots = _slots(value, where, name)
            elif key == "max_slots" and sep:             # OpenMPI: an upper bound, not the count
                _slots(value, where, name)
            else:
                raise HostSpecError(f"{where}: unexpected {extra!r}: a line is '<host> slots=<N>'")
        if slots is None:
            raise HostSpecError(f"{where}: slots are missing for {name!r}: write '{name} slots=N' "
                                "with N the processes (GPUs) for that host")
        builder.add(name, slots, where)
    return builder.build()


def parse_hostfile(path: str) -> HostSpec:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise HostSpecError(f"cannot read hostfile {path!r} ({exc.strerror}): check the path") from None
    return parse_hostfile_text(text, path)


def check_np(spec: HostSpec, np: int) -> None:
    """Raise when ``np`` does not fit in the spec's slots (with the per-host numbers)."""
    if np < 1:
        raise HostSpecError(f"np={np}: run at least 1 process")
    if np > spec.total_slots:
        detail = ", ".join(f"{h.name} has {h.slots}" for h in spec.hosts)
        raise HostSpecError(f"np={np} but {spec.source} has {spec.total_slots} slots ({detail}): "
                            f"lower -np to {spec.total_slots} or add slots")


def rank_layout(spec: HostSpec, np: int) -> list[RankPlacement]:
    """The rank -> (host, local_rank) map horovodrun uses: fill each host's slots in order."""
    check_np(spec, np)
    layout = []
    for host in spec.hosts:
        for local_rank in range(host.slots):
            if len(layout) == np:
                return layout
            layout.append(RankPlacement(len(layout), host.name, local_rank))
    return layout


def to_hosts_string(spec: HostSpec) -> str:
    return ",".join(f"{h.name}:{h.slots}" for h in spec.hosts)


def to_hostfile(spec: HostSpec) -> str:
    """Horovod's hostfile format, bare (no comments: horovodrun 0.28.1 cannot read them)."""
    return "".join(f"{h.name} slots={h.slots}\n" for h in spec.hosts)
