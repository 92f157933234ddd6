"""Shared by the ranks and the launching machine: errors, the launcher environment, atomic files, console
output, units, argparse types, Horovod tuning defaults. Imports no framework."""
