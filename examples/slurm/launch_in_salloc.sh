#!/bin/bash
# hvdkit launch inside an allocation: the hosts and -np come from Slurm
# (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE, SLURM_NTASKS), then horovodrun runs as
# on hand-written hosts. Use it where nodes reach each other over ssh; where they
# do not, use srun directly (train_gpu.sbatch).
#
#   salloc -N 2 --ntasks-per-node=4 --gpus-per-task=1 examples/slurm/launch_in_salloc.sh
#   sbatch -N 2 --ntasks-per-node=2 examples/slurm/launch_in_salloc.sh     # works the same
#
# Tested on a two-node Slurm 22.05 test cluster (tests/multihost/test_slurm.py).
set -euo pipefail
VENV=${HVDKIT_VENV:-$HOME/hvdkit/.venv}
IFACE=${IFACE:-eth0}

"$VENV/bin/hvdkit" hosts --slurm                      # where each rank will run
exec "$VENV/bin/hvdkit" launch --slurm --network-interface "$IFACE" \
    -- "$VENV/bin/python" examples/pytorch_mnist.py --epochs 12
