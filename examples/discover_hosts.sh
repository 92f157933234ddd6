#!/bin/sh
# Host discovery for elastic jobs: prints the host:slots lines of a hosts file
# you may edit while the job runs (add a line to grow, delete one to shrink).
#   horovodrun -np 4 --min-np 2 --max-np 8 --host-discovery-script examples/discover_hosts.sh \
#       python examples/pytorch_elastic.py
# The file is $HVDKIT_ELASTIC_HOSTS (default hostfiles/elastic); comments and
# blank lines are fine. A malformed file makes this exit 2 with the line at
# fault: at start-up the job stops; later Horovod keeps the last good host list.
exec "${HVDKIT_PYTHON:-python}" -m hvdkit hosts --hostfile "${HVDKIT_ELASTIC_HOSTS:-hostfiles/elastic}" --to discovery
