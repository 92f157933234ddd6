"""Slurm's compressed node lists and task counts, table-driven (hvdkit.ops.slurm)."""

import pytest

from hvdkit.ops.slurm import SlurmError, allocation, expand_nodelist, expand_tasks_per_node

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text,expected", [
    ("node1", ["node1"]),
    ("gpu[01-04,07],cpu9", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu9"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("a[1-2],b[003-004]", ["a1", "a2", "b003", "b004"]),
    ("rack[1-2]-node[1-2]", ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]),
    ("hosta,hostb", ["hosta", "hostb"]),
    ("node[5]", ["node5"]),
])
def test_expand_nodelist(text, expected):
    assert expand_nodelist(text) == expected


@pytest.mark.parametrize("text,needle", [
    ("", "empty"), ("gpu[01-04", "unbalanced '['"), ("gpu01]", "unbalanced ']'"),
    ("gpu[4-1]", "low-high range"), ("gpu[a-b]", "low-high range"), ("bad_name", "not a host name"),
])
def test_expand_nodelist_errors_name_the_variable(text, needle):
    with pytest.raises(SlurmError) as err:
        expand_nodelist(text)
    assert needle in str(err.value) and ("SLURM_JOB_NODELIST" in str(err.value))


@pytest.mark.parametrize("text,expected", [
    ("4", [4]), ("4(x2),2", [4, 4, 2]), ("1(x3)", [1, 1, 1]), ("2,8(x2),1", [2, 8, 8, 1]),
])
def test_expand_tasks_per_node(text, expected):
    assert expand_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "0", "4(x0)", "4x2", "a", "4(x2"])
def test_expand_tasks_per_node_errors(text):
    with pytest.raises(SlurmError, match="SLURM_TASKS_PER_NODE"):
        expand_tasks_per_node(text)


def test_allocation_pairs_nodes_with_their_tasks_and_defaults_np_to_ntasks():
    a = allocation({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-02],cpu9",
                    "SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_NTASKS": "10"})
    assert a.job_id == "42" and a.ntasks == 10 and a.hosts.source == "slurm"
    assert [(h.name, h.slots) for h in a.hosts.hosts] == [("gpu01", 4), ("gpu02", 4), ("cpu9", 2)]


@pytest.mark.parametrize("env,needle", [
    ({}, "SLURM_JOB_ID is not set"),
    ({"SLURM_JOB_ID": "1", "SLURM_TASKS_PER_NODE": "2"}, "SLURM_JOB_NODELIST is not set"),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a"}, "SLURM_TASKS_PER_NODE is not set"),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"}, "names 3 node(s)"),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a,a", "SLURM_TASKS_PER_NODE": "2(x2)"}, "names a node twice"),
])
def test_allocation_errors_say_the_fix(env, needle):
    with pytest.raises(SlurmError) as err:
        allocation(env)
    assert needle in str(err.value)


