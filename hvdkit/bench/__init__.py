"""Benchmarks that put hvdkit next to its peers in one invocation.

``hvdkit bench allreduce`` and ``hvdkit bench train`` (see :mod:`hvdkit.cli.bench`)
launch the workers in this package once per implementation, on the same hosts
and process count, and collect what rank 0 measured:

- :mod:`hvdkit.bench.catalog`: the implementations each benchmark compares, in one table;
- :mod:`hvdkit.bench.allreduce`: message-size sweep and ResNet-50's many small tensors;
- :mod:`hvdkit.bench.train`: training-step throughput and its time split;
- :mod:`hvdkit.bench.runner`: builds each launch, runs it under a timeout, gathers results;
- :mod:`hvdkit.bench.report`: table, CSV, JSON and PNG.
"""
