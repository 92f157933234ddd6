"""hk.global_batches' slots (hvdkit/keras/global_batch.py): at any size, every rank runs the same number of fit
batches a step, each sample of a step is in one slot of weight 1 on one rank, and the other slots weigh 0."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.adapters

# In a process of its own: Keras reads its backend once, and this tier's process may hold another.
SLOTS = r'''
import json, os
os.environ["KERAS_BACKEND"] = "torch"
import numpy as np
from hvdkit.keras.global_batch import _batches_class
cls = _batches_class("torch")
x = np.arange(31, dtype="float32")[:, None]
out = {}
for size in (1, 2, 3, 4, 7):
    ranks = [cls(x, x[:, 0], 12, 5, shuffle=True, seed=3, rank=r, size=size) for r in range(size)]
    slots = [len(b) for b in ranks]
    steps = []
    for step in range(ranks[0].steps_per_epoch):
        real, weights = [], 0.0
        for b in ranks:
            for j in range(b.slots):
                xs, ys, sw = b[step * b.slots + j]
                assert len(xs) == len(sw) and set(sw.tolist()) <= {0.0, 1.0}
                real += xs[sw == 1, 0].astype(int).tolist()
                weights += b.weights[j]
        steps.append([sorted(real), round(weights, 12)])
    out[size] = {"slots": slots, "steps": steps}
b = cls(x, x[:, 0], 12, 5, shuffle=True, seed=3, rank=0, size=2)
out["position"] = [b.position(k) for k in range(5)]
out["at_step_end"] = [b.at_step_end(k) for k in range(5)]
b.resume({"epoch": 0, "samples": 12})
out["resumed"] = [b.epoch, b.start_sample, len(b)]
b.resume({"epoch": 0, "samples": 24})
out["finished"] = [b.epoch, b.start_sample, len(b)]
print(json.dumps(out))
'''


def test_every_rank_runs_the_same_slots_and_each_sample_of_a_step_is_in_one_real_slot():
    proc = subprocess.run([sys.executable, "-c", SLOTS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    one = out["1"]["steps"]
    assert len(one) == 2 and all(len(samples) == 12 for samples, _ in one)     # 31 samples: 2 steps, 7 left out
    for size in ("1", "2", "3", "4", "7"):
        slots = out[size]["slots"]
        assert len(set(slots)) == 1, (size, slots)          # the same number of fit batches on every rank
        assert out[size]["steps"] == one, size              # the same samples in each step, weights adding to 1
    assert [s[1] for s in one] == [1.0, 1.0]
    # micro-batches of 5, 5, 2: 3 slots a step on 1 rank, 2 on 2 (one of weight 0 on rank 1), 1 on 3 and more
    assert {size: out[size]["slots"][0] for size in out if size.isdigit()} == {"1": 6, "2": 4, "3": 2, "4": 2, "7": 2}
    assert out["position"] == [0, 0, 12, 12, 24] and out["at_step_end"] == [True, False, True, False, True]
    assert out["resumed"] == [0, 12, 2] and out["finished"] == [1, 0, 4]
