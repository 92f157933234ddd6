"""Worker: bfloat16 tensors through Horovod's collectives (patch item 17), torch or TensorFlow.

Every rank draws its values from its own seed, rounds them to bfloat16, and sends them
through allreduce (sum, average, min, max; one tensor above the fusion threshold and a
grouped batch beside a float32 tensor), reducescatter, broadcast and allgather. Each
result is compared with float64 arithmetic on the same bfloat16 inputs: allowed error is
bfloat16's rounding (2^-8 relative) once per rank, of the sum of magnitudes.
"""

import argparse

import numpy as np
from rank_results import write_result

p = argparse.ArgumentParser()
p.add_argument("--framework", choices=["torch", "tensorflow"], required=True)
p.add_argument("--out", required=True)
args = p.parse_args()

N, BIG = 1001, 3 << 20          # BIG: 6 MiB of bfloat16, above the test suite's fusion threshold


def draw(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(1000 + rank).standard_normal(n).astype(np.float32)


if args.framework == "torch":
    import horovod.torch as hvd
    import torch

    hvd.init()

    def bf16(a):
        return torch.from_numpy(a).to(torch.bfloat16)

    def back(t):
        return (t if isinstance(t, torch.Tensor) else torch.as_tensor(t)).float().numpy().astype(np.float64)

    def dtype_of(t):
        return str(t.dtype).replace("torch.", "")
else:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()

    def bf16(a):
        return tf.cast(tf.constant(a), tf.bfloat16)

    def back(t):
        return tf.cast(t, tf.float64).numpy()

    def dtype_of(t):
        return t.dtype.name

rank, size = hvd.rank(), hvd.size()
inputs = {n: [draw(r, n) for r in range(size)] for n in (N, BIG)}
# What each rank sends, exactly: its values rounded to bfloat16, in float64.
sent = {n: [back(bf16(a)) for a in arrays] for n, arrays in inputs.items()}
mine = {n: bf16(inputs[n][rank]) for n in (N, BIG)}


def error(got, want, scale) -> float:
    """Largest error in units of bfloat16's rounding of each element's scale, times the ranks."""
    return float(np.max(np.abs(back(got) - want) / (scale * 2.0 ** -8 * size + 1e-30)))


checks, dtypes = {}, {}
stack = np.stack(sent[N])
magnitude = np.abs(stack).sum(axis=0)
for name, op, want, scale in (
        ("sum", hvd.Sum, stack.sum(axis=0), magnitude),
        ("average", hvd.Average, stack.mean(axis=0), magnitude / size),
        ("min", hvd.Min, stack.min(axis=0), np.abs(stack).max(axis=0)),
        ("max", hvd.Max, stack.max(axis=0), np.abs(stack).max(axis=0))):
    got = hvd.allreduce(mine[N], op=op, name=f"bf16.{name}")
    checks[name], dtypes[name] = error(got, want, scale), dtype_of(got)
# min and max pick one rank's value: exact.
for name, op, want in (("min_exact", hvd.Min, stack.min(axis=0)), ("max_exact", hvd.Max, stack.max(axis=0))):
    checks[name] = bool(np.array_equal(back(hvd.allreduce(mine[N], op=op, name=f"bf16.{name}")), want))
# Three bfloat16 tensors in one group: copied into one fusion buffer, scaled there before and after.
group = hvd.grouped_allreduce([mine[N], mine[N], mine[N]], op=hvd.Average, prescale_factor=0.5,
                              postscale_factor=3.0, name="bf16.fused")
checks["fused_scaled"] = max(error(t, 1.5 * stack.mean(axis=0), 3.0 * magnitude / size) for t in group)
dtypes["fused_scaled"] = dtype_of(group[0])
big = np.stack(sent[BIG])
got = hvd.allreduce(mine[BIG], op=hvd.Average, name="bf16.big")
checks["big_average"], dtypes["big_average"] = error(got, big.mean(axis=0), np.abs(big).sum(axis=0) / size), \
    dtype_of(got)
# A group of a bfloat16 and a float32 tensor: each keeps its own type. TensorFlow's grouped op takes
# one type per group, so there the float32 tensor goes in its own allreduce, in the same cycle.
if args.framework == "torch":
    grouped = hvd.grouped_allreduce([mine[N], torch.from_numpy(inputs[N][rank])], op=hvd.Sum, name="bf16.grouped")
else:
    grouped = [hvd.grouped_allreduce([mine[N]], op=hvd.Sum, name="bf16.grouped")[0],
               hvd.allreduce(tf.constant(inputs[N][rank]), op=hvd.Sum, name="f32.beside")]
checks["grouped_bf16"], dtypes["grouped_bf16"] = error(grouped[0], stack.sum(axis=0), magnitude), dtype_of(grouped[0])
f32 = np.stack([a.astype(np.float64) for a in inputs[N]]).sum(axis=0)
checks["grouped_f32"] = float(np.max(np.abs(back(grouped[1]) - f32)))
dtypes["grouped_f32"] = dtype_of(grouped[1])
# Reducescatter: this rank's rows of the sum.
rs = hvd.reducescatter(mine[N], op=hvd.Sum, name="bf16.rs")
n_rs = int(back(rs).shape[0])
start = sum(len(x) for x in np.array_split(np.arange(N), size)[:rank])
checks["reducescatter"] = error(rs, stack.sum(axis=0)[start:start + n_rs], magnitude[start:start + n_rs])
dtypes["reducescatter"] = dtype_of(rs)
# Broadcast and allgather move bits: exact.
bc = hvd.broadcast(mine[N], root_rank=0, name="bf16.bcast")
checks["broadcast_exact"] = bool(np.array_equal(back(bc), sent[N][0]))
ag = hvd.allgather(mine[N], name="bf16.gather")
checks["allgather_exact"] = bool(np.array_equal(back(ag), np.concatenate(sent[N])))
dtypes["broadcast"], dtypes["allgather"] = dtype_of(bc), dtype_of(ag)
if args.framework == "torch":
    # hvdkit's compression="bf16": the averaged gradient came over the wire as bfloat16 (every element is a
    # bfloat16 value, upcast), where the float32 average of the same inputs mostly is not.
    import hvdkit.torch as hk

    hk.init()
    layer = torch.nn.Linear(N, 1, bias=False)
    opt = hk.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer, compression="bf16")
    layer(torch.from_numpy(inputs[N][rank]).unsqueeze(0)).sum().backward()    # weight's gradient: the input
    grad = layer.weight.grad[0]
    exact = np.stack([a.astype(np.float64) for a in inputs[N]]).mean(axis=0)
    as_f32 = torch.from_numpy(exact.astype(np.float32))
    checks["hvdkit_grad_dtype"] = str(grad.dtype).replace("torch.", "")
    checks["hvdkit_bf16_on_wire"] = bool(torch.equal(grad, grad.bfloat16().float()))
    checks["f32_average_not_bf16"] = float((as_f32 != as_f32.bfloat16().float()).double().mean())
    checks["hvdkit_bf16_error"] = error(grad, exact, np.abs(np.stack(inputs[N])).sum(axis=0) / size)
write_result(args.out, rank, {"rank": rank, "size": size, "checks": checks, "dtypes": dtypes, "rs_rows": n_rs,
                              "mpi_enabled": bool(hvd.mpi_enabled()), "gloo_enabled": bool(hvd.gloo_enabled())})
