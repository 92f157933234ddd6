"""What runs on the launching machine: hosts, Slurm allocations, ssh, the launch plan, doctor, the environment
report, the timeline and the cost model. Imports no framework."""
