#!/bin/bash
# hvdkit launch inside an allocation: the hosts and -np come from Slurm
# (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE, SLURM_NTASKS), then horovodrun runs as
# on hand-written hosts. Use it where nodes reach each other over ssh; where they
# do not, use srun directly (train_gpu.sbatch).
#
#   salloc -N 2 --ntasks-per-node=4 --gpus-per-node=4 examples/slurm/launch_in_salloc.sh
#   sbatch -N 2 --ntasks-per-node=2 examples/slurm/launch_in_salloc.sh     # works the same
#
# GPUs per node, not per task: horovodrun starts the ranks, not srun, so Slurm binds
# no GPU to a rank; each sees its node's GPUs and hvdkit pins its local rank. Launch
# picks MPI here: mpirun starts the other nodes' ranks with srun, inside the job and
# its GPUs (--gloo would start them over ssh, outside it).
# IFACE=ib0 names the interface between the nodes (--network-interface); unset, Horovod
# and MPI choose. HVDKIT_VENV (default ~/hvdkit/.venv-gpu in a GPU allocation, else
# ~/hvdkit/.venv) and EPOCHS override the defaults below.
#
# Tested on a two-node Slurm 22.05 test cluster (tests/multihost/test_slurm.py): this script
# as it is with 2 stand-in GPUs per node (sbatch -N 2 --ntasks-per-node=2 --gpus-per-node=2),
# and the same `hvdkit launch --slurm` training on CPUs.
set -euo pipefail
# The GPU flavour's venv (make install-gpu) in a GPU allocation, the CPU one otherwise.
if [ -n "${SLURM_JOB_GPUS:-}${SLURM_GPUS_ON_NODE:-}${SLURM_GPUS_PER_NODE:-}${SLURM_GPUS:-}" ]; then
  VENV=$HOME/hvdkit/.venv-gpu
else
  VENV=$HOME/hvdkit/.venv
fi
VENV=${HVDKIT_VENV:-$VENV}
EPOCHS=${EPOCHS:-12}

"$VENV/bin/hvdkit" hosts --slurm                      # where each rank will run
exec "$VENV/bin/hvdkit" launch --slurm ${IFACE:+--network-interface "$IFACE"} \
    -- "$VENV/bin/python" examples/pytorch_mnist.py --epochs "$EPOCHS"
