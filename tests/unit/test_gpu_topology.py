"""make test-gpu's transport and bus-bandwidth check (hvdkit.ops.gpu_topology) on recorded outputs.

The samples under tests/data/gpu_topology/ are in nvidia-smi's and NCCL's formats (each file says how it was
made): an 8-GPU NVLink H100 board, a 4-GPU PCIe server, one GPU; NCCL logs with P2P/CUMEM, SHM, NET/Socket
and NET/IB. A GPU run has one GPU here, so this is where the multi-GPU verdicts are tested.
"""

import pytest

from hvdkit.common.errors import UserError
from hvdkit.ops.gpu_topology import BUSBW_FLOOR_GBPS, bus_bandwidth_gbps, judge, parse_nccl_log, parse_topology
from tests.conftest import ROOT

pytestmark = pytest.mark.unit
DATA = ROOT / "tests" / "data" / "gpu_topology"
MIB64 = 64 << 20


def topo(name):
    return parse_topology((DATA / f"topo_{name}.txt").read_text())


def log(name):
    return parse_nccl_log((DATA / f"nccl_{name}.log").read_text())


def seconds_for(busbw_gbps, ranks, nbytes=MIB64):
    """The allreduce time that gives ``busbw_gbps``."""
    return nbytes * 2 * (ranks - 1) / ranks / (busbw_gbps * 1e9)


def test_every_sample_says_it_is_reconstructed_and_in_whose_format():
    for path in DATA.iterdir():
        comment = " ".join(line[2:] for line in path.read_text().splitlines() if line.startswith("# "))
        assert comment.startswith("Reconstructed sample") and "not a capture" in comment, path.name
        assert "format" in comment, path.name


def test_the_nvlink_board_reads_as_nv18_between_every_pair_with_eight_rdma_nics():
    t = topo("h100_nvlink_8gpu")
    assert t.gpus == tuple(range(8))
    assert {t.links[(a, b)] for a in range(8) for b in range(8) if a != b} == {"NV18"}
    assert t.nics == tuple(f"mlx5_{k}" for k in range(8))      # from the NIC legend, not the NIC0.. columns
    assert t.offered(0, 7) == "nvlink"


def test_the_pcie_server_reads_as_pix_pairs_across_sys():
    t = topo("pcie_4gpu")
    assert t.gpus == (0, 1, 2, 3) and t.nics == ()
    assert (t.links[(0, 1)], t.links[(2, 3)], t.links[(1, 2)], t.links[(3, 0)]) == ("PIX", "PIX", "SYS", "SYS")
    assert (t.offered(0, 1), t.offered(0, 2)) == ("pcie_p2p", "shm")


def test_one_gpu_and_the_terminals_underlined_header():
    t = topo("1gpu")
    assert t.gpus == (0,) and t.links == {}
    underlined = "\x1b[4m\tGPU0\tGPU1\tCPU Affinity\x1b[0m\nGPU0\t X \tPXB\t0-7\nGPU1\tPXB\t X \t0-7\n"
    assert parse_topology(underlined).links == {(0, 1): "PXB", (1, 0): "PXB"}


def test_what_is_not_a_gpu_matrix_or_an_unknown_link_code_is_refused():
    with pytest.raises(UserError, match="no GPU matrix"):
        parse_topology("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    with pytest.raises(UserError, match="links missing"):
        parse_topology("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\n")
    odd = parse_topology("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tQQQ\t0-7\nGPU1\tQQQ\t X \t0-7\n")
    with pytest.raises(UserError, match="'QQQ'.*add it to OFFERED"):
        odd.offered(0, 1)


def test_nccl_lines_are_read_whatever_prefix_the_launcher_adds():
    line = "gpu-node-01:4021:4322 [3] NCCL INFO Channel 02/0 : 3[3] -> 4[4] via P2P/CUMEM/read"
    for tagged in (line, f"[1,3]<stdout>:{line}", f"[3]<stdout>:{line}"):    # mpirun's and Gloo's tags
        (c,) = parse_nccl_log(tagged).channels
        assert (c.src, c.src_dev, c.dst, c.dst_dev, c.via, c.kind) == (3, "3", 4, "4", "P2P/CUMEM/read", "P2P/CUMEM")
    older = parse_nccl_log("h:1:2 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[1c000] via P2P/IPC\n"
                           "h:1:2 [0] NCCL INFO Channel 00/24 :    0   1\n")     # a ring's order, not a transport
    assert [(c.src_dev, c.kind) for c in older.channels] == [("1b000", "P2P/IPC")]


def test_the_logs_say_which_transports_nodes_and_nccl():
    p2p = log("p2p_cumem_8gpu")
    assert (p2p.version, p2p.nranks, p2p.nnodes, p2p.nvls, p2p.nvls_used) == ("2.28.9+cuda13.0", 8, 1, True, True)
    assert {c.kind for c in p2p.channels} == {"P2P/CUMEM"}
    assert {c.kind for c in log("shm_pcie_4gpu").channels} == {"P2P/CUMEM", "SHM/direct"}
    sock = log("net_socket_2containers")
    assert (sock.nranks, sock.nnodes, sock.nvls) == (8, 2, False)
    assert {c.kind for c in sock.channels} == {"P2P/CUMEM", "NET/Socket"}
    assert {c.kind for c in log("net_ib_2hosts").channels} == {"P2P/CUMEM", "NET/IB"}


def test_bus_bandwidth_is_nccl_tests_algbw_times_2_n_minus_1_over_n():
    assert bus_bandwidth_gbps(MIB64, 1e-3, 2) == pytest.approx(67.108864)          # 2 ranks: busbw = algbw
    assert bus_bandwidth_gbps(MIB64, 1e-3, 8) == pytest.approx(67.108864 * 1.75)


def test_p2p_on_the_nvlink_board_at_a_good_rate_passes():
    v = judge(topo("h100_nvlink_8gpu"), log("p2p_cumem_8gpu"), ranks=8, nbytes=MIB64, seconds=1.3e-3)
    assert v.ok, v.problems
    assert (v.offered, v.floor_gbps, v.used) == ("nvlink", BUSBW_FLOOR_GBPS["nvlink"], {"P2P/CUMEM": 64})
    assert v.busbw_gbps == pytest.approx(90.35, abs=0.01)


def test_p2p_on_the_nvlink_board_below_the_floor_fails():
    slow = seconds_for(BUSBW_FLOOR_GBPS["nvlink"] * 0.9, 8)
    v = judge(topo("h100_nvlink_8gpu"), log("p2p_cumem_8gpu"), ranks=8, nbytes=MIB64, seconds=slow)
    assert not v.ok
    assert v.problems[0].startswith(f"bus bandwidth 13.5 GB/s is below the {BUSBW_FLOOR_GBPS['nvlink']} GB/s floor "
                                    "for nvlink (64 MiB allreduce on 8 ranks")
    # The floor is the offered link's: the same rate passes on the PCIe server (where SHM is offered)...
    assert judge(topo("pcie_4gpu"), log("shm_pcie_4gpu"), ranks=4, nbytes=MIB64,
                 seconds=seconds_for(13.5, 4)).ok
    # ...and a floor is easy to change
    assert judge(topo("h100_nvlink_8gpu"), log("p2p_cumem_8gpu"), ranks=8, nbytes=MIB64, seconds=slow,
                 floors={**BUSBW_FLOOR_GBPS, "nvlink": 10.0}).ok


def test_sockets_between_containers_on_the_nvlink_board_fail():
    """docker compose's two workers on one 8-GPU host: NCCL sees two nodes and crosses between them by socket."""
    v = judge(topo("h100_nvlink_8gpu"), log("net_socket_2containers"), ranks=8, nbytes=MIB64, seconds=1.3e-3)
    assert not v.ok
    assert v.problems[0].startswith("NCCL counted 2 nodes where the job ran on 1 host(s)")
    slower = [p for p in v.problems if "NCCL used NET/Socket/0" in p]
    assert slower and all("where nvidia-smi topo -m shows NV18, which offers P2P" in p for p in slower)
    assert v.used == {"P2P/CUMEM": 48, "NET/Socket": 16}


def test_shm_where_nvlink_is_offered_fails_and_where_pcie_crosses_sockets_passes():
    v = judge(topo("h100_nvlink_8gpu"), log("shm_pcie_4gpu"), ranks=4, nbytes=MIB64, seconds=1e-3)
    assert not v.ok
    assert any(p.startswith("GPU1 -> GPU2: NCCL used SHM/direct/direct") and "shows NV18, which offers P2P" in p
               for p in v.problems)
    assert judge(topo("pcie_4gpu"), log("shm_pcie_4gpu"), ranks=4, nbytes=MIB64, seconds=1e-2).ok


def test_shm_within_a_pcie_switch_fails_unless_nccl_found_no_peer_access():
    # Between GPU0 and GPU1 (PIX) NCCL's default is P2P; SHM there means P2P was turned off...
    text = (DATA / "nccl_shm_pcie_4gpu.log").read_text()
    shm = text.replace("0[0] -> 1[1] via P2P/CUMEM", "0[0] -> 1[1] via SHM/direct/direct")
    v = judge(topo("pcie_4gpu"), parse_nccl_log(shm), ranks=4)
    assert not v.ok and "GPU0 -> GPU1: NCCL used SHM/direct/direct" in v.problems[0]
    assert "shows PIX, which offers P2P" in v.problems[0]
    # ...unless the GPUs refuse peer access (GeForce cards), which NCCL says
    said = shm + "pcie-box:1:2 [0] NCCL INFO P2P is disabled between connected GPUs 0 and 1. You can repress ...\n"
    assert judge(topo("pcie_4gpu"), parse_nccl_log(said), ranks=4).ok


def test_infiniband_between_two_hosts_passes_and_sockets_fail_where_rdma_nics_are_listed():
    assert judge(topo("h100_nvlink_8gpu"), log("net_ib_2hosts"), ranks=16, hosts=2).ok
    v = judge(topo("h100_nvlink_8gpu"), log("net_socket_2containers"), ranks=8, hosts=2)
    assert not v.ok
    assert "sockets between hosts: NCCL used NET/Socket/0" in v.problems[0]
    assert "RDMA NICs mlx5_0, mlx5_1" in v.problems[0] and "NCCL_IB_DISABLE=1 or NCCL_NET=Socket set?" in v.problems[0]
    # Without RDMA NICs sockets are what the hosts offer; no floor is applied across hosts
    assert judge(topo("pcie_4gpu"), log("net_socket_2containers"), ranks=8, hosts=2, nbytes=MIB64, seconds=1).ok


def test_one_rank_needs_only_its_communicator_and_silence_fails():
    one = parse_nccl_log("h:1:2 [0] NCCL INFO comm 0x55d0c1b0 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 "
                         "MNNVL 0\n")
    v = judge(topo("1gpu"), one, ranks=1, nbytes=MIB64, seconds=1.07e-3)
    assert v.ok and (v.busbw_gbps, v.floor_gbps, v.offered) == (None, None, None)
    silent = judge(topo("1gpu"), parse_nccl_log("rank 0: ok\n"), ranks=1)
    assert not silent.ok and "NCCL printed no communicator or transport line" in silent.problems[0]
    p2p = log("p2p_cumem_8gpu")
    no_lines = judge(topo("h100_nvlink_8gpu"), type(p2p)(nranks=8, nnodes=1), ranks=8)
    assert not no_lines.ok and "8 ranks but no 'Channel" in no_lines.problems[0]
    assert "NCCL's largest communicator has 8 ranks, the job 4" in judge(topo("h100_nvlink_8gpu"), p2p,
                                                                         ranks=4).problems[0]


def test_bus_ids_of_an_older_nccl_are_judged_against_the_slowest_link_of_the_first_gpus():
    older = parse_nccl_log("h:1:2 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[1c000] via SHM/direct/direct\n"
                           "h:1:2 [1] NCCL INFO Channel 00 : 1[1c000] -> 0[1b000] via SHM/direct/direct\n")
    v = judge(topo("h100_nvlink_8gpu"), older, ranks=2)
    assert not v.ok and "between the job's GPUs: NCCL used SHM/direct/direct" in v.problems[0]
    assert judge(topo("pcie_4gpu"), older, ranks=2).problems[0].startswith("between the job's GPUs")   # 0-1: PIX
