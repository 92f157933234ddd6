"""Host lists: every example in hostfiles/ round-trips; malformed input gets file:line and the fix."""

from pathlib import Path

import pytest

from hvdkit.ops.hosts import (
    HostSpecError,
    check_np,
    parse_discovery_output,
    parse_hostfile,
    parse_hostfile_text,
    parse_hosts_string,
    rank_layout,
    to_hostfile,
    to_hosts_string,
)

pytestmark = pytest.mark.unit
HOSTFILES = sorted(p for p in (Path(__file__).parents[2] / "hostfiles").iterdir() if p.suffix != ".md")


def test_there_are_examples():
    assert {p.name for p in HOSTFILES} >= {"single-node", "cluster-4x4"}


@pytest.mark.parametrize("path", HOSTFILES, ids=lambda p: p.name)
def test_every_example_round_trips(path):
    spec = parse_hostfile(str(path))
    assert parse_hosts_string(to_hosts_string(spec)).hosts == spec.hosts
    assert parse_hostfile_text(to_hostfile(spec)).hosts == spec.hosts
    # The examples are read by plain horovodrun too, whose parser takes only bare lines.
    assert path.read_text() == to_hostfile(spec)


def test_rank_layout_fills_hosts_in_order():
    spec = parse_hosts_string("server1:4,server2:4")
    layout = rank_layout(spec, 6)
    assert [(p.rank, p.host, p.local_rank) for p in layout] == [
        (0, "server1", 0), (1, "server1", 1), (2, "server1", 2), (3, "server1", 3),
        (4, "server2", 0), (5, "server2", 1)]


def test_hostfile_accepts_what_horovod_crashes_on():
    text = "# two test hosts\n\nhosta slots=2   # first\nhostb slots=2 max_slots=4\nhostc:1\n"
    spec = parse_hostfile_text(text, "h.txt")
    assert to_hosts_string(spec) == "hosta:2,hostb:2,hostc:1"


@pytest.mark.parametrize("text, message", [
    ("a slots=2\na slots=2\n", "h:2: host 'a' is listed twice (first at h:1)"),
    ("a slots=0\n", "h:1: host 'a' has 0 slots"),
    ("\n# x\na\n", "h:3: slots are missing for 'a'"),
    ("a slots=two\n", "h:1: slots for 'a' must be a whole number"),
    ("a gpus=2\n", "h:1: unexpected 'gpus=2'"),
    ("bad_name slots=1\n", "h:1: 'bad_name' is not a valid host name"),
    ("-lead slots=1\n", "h:1: '-lead' is not a valid host name"),
    ("300.1.1.1 slots=1\n", "h:1: '300.1.1.1' is not a valid host name"),
    ("# only comments\n\n", "h: no hosts listed"),
])
def test_malformed_hostfiles(text, message):
    with pytest.raises(HostSpecError) as info:
        parse_hostfile_text(text, "h")
    assert message in str(info.value)


def discovery(text):
    return parse_discovery_output(text, "d.sh")


@pytest.mark.parametrize("parse, text, message", [
    (parse_hosts_string, "a:2,,b:2", "-H item 2 is empty"),
    (parse_hosts_string, "a", "slots are missing: write a:N"),
    (parse_hosts_string, "a:2,a:1", "listed twice"),
    (parse_hosts_string, "a:-1", "has -1 slots"),
    (parse_hosts_string, "a:x", "must be a whole number"),
    # a typo'd slot count is refused before anything is laid out per slot (issue 35: 1e8 slots took > 1 GB)
    (parse_hosts_string, "localhost:100000000", "host 'localhost' has 100000000 slots, more than 4096"),
    # an elastic job's discovery script prints the same host:slots items, one a line
    (discovery, "", "d.sh printed no hosts"),
    (discovery, "server1 slots=4\n", "output line 1 .* slots are missing: print host:slots"),
    (discovery, "server1:4\nserver1:2\n", "listed twice"),
    (discovery, "server1:x\n", "must be a whole number"),
    (discovery, "server1:5000\n", "has 5000 slots, more than 4096"),
])
def test_malformed_host_colon_slots_lists(parse, text, message):
    with pytest.raises(HostSpecError, match=message):
        parse(text)


def test_np_larger_than_slots_names_each_host():
    with pytest.raises(HostSpecError, match=r"np=8 but -H has 6 slots \(server1 has 4, server2 has 2\)"):
        check_np(parse_hosts_string("server1:4,server2:2"), 8)


def test_unreadable_hostfile(tmp_path):
    with pytest.raises(HostSpecError, match="cannot read hostfile"):
        parse_hostfile(str(tmp_path / "missing"))


def test_discovery_output_is_host_colon_slots_lines():
    spec = discovery("server1:4\n\nserver2:2\n")
    assert [(h.name, h.slots) for h in spec.hosts] == [("server1", 4), ("server2", 2)]


def test_discovery_output_with_bare_names_takes_the_default_slots():
    from hvdkit.ops.hosts import parse_discovery_output

    spec = parse_discovery_output("job-worker-0.job.ns.svc\njob-worker-1.job.ns.svc:2\n", "d.sh", default_slots=8)
    assert [(h.name, h.slots) for h in spec.hosts] == [("job-worker-0.job.ns.svc", 8), ("job-worker-1.job.ns.svc", 2)]
    with pytest.raises(HostSpecError, match="--slots N"):
        parse_discovery_output("job-worker-0.job.ns.svc\n", "d.sh")


@pytest.mark.parametrize("parse", [parse_hosts_string, lambda t: parse_discovery_output(t, "d.sh"),
                                   lambda t: parse_hostfile_text(t.replace(":", " slots="), "hosts")])
def test_a_byte_order_mark_is_not_part_of_the_first_host(parse):
    assert parse("\ufeffserver1:2").names == ["server1"]


@pytest.mark.parametrize("text", ["[::1]:2", "::1:2", "fe80::1:4"])
def test_ipv6_is_refused_with_what_to_use_instead(text):
    with pytest.raises(HostSpecError, match="looks like an IPv6 address.*use a host name that resolves to it"):
        parse_hosts_string(text)


def test_an_invisible_character_is_named_with_its_position():
    with pytest.raises(HostSpecError, match=r"contains the invisible or non-ASCII character U\+200B at position 4"):
        parse_hosts_string("ser\u200bver1:2")


def test_doctors_allreduce_reads_every_ranks_line_even_when_mpirun_joins_two():
    # Seen in a full run: "exit 0" with both ranks fine, but mpirun's tags had put their lines on one line.
    from hvdkit.ops.doctor import selfcheck_results

    out = ("[1,0]<stdout>:hvdkit-selfcheck rank=0 size=2 host=vm framework=torch ok=True"
           "[1,1]<stdout>:hvdkit-selfcheck rank=1 size=2 host=vm framework=torch ok=True\n[1,0]<stdout>:\n")
    assert selfcheck_results(out) == {0: ("vm", True), 1: ("vm", True)}
    assert selfcheck_results("hvdkit-selfcheck rank=1 size=2 host=b framework=tensorflow ok=False\n") == \
        {1: ("b", False)}
