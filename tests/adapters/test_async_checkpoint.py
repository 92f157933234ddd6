"""save_checkpoint(..., blocking=False) at world size 1 (hvdkit/runtime/async_save.py): what the file holds, where
a failed background write is raised, keep_last, and the end of the process. Each case runs in a process of its
own (Horovod and Keras once per process); the multi-process cases are in tests/multiproc/test_async_checkpoint.py.
"""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.adapters

TORCH = r'''
import json, os, sys, torch, hvdkit.torch as hk
from hvdkit.runtime import async_save
ctx = hk.init(seed=0, threads=1)
tmp = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 4))
optimizer = hk.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1), model)
hk.broadcast_state(model, optimizer)
out = {}

def step():
    optimizer.zero_grad()
    model(torch.ones(2, 256)).sum().backward()
    optimizer.step()

step()
before = {k: v.clone() for k, v in model.state_dict().items()}
# The file holds the state at the call, though training changes it before the write ends.
hk.save_checkpoint(os.path.join(tmp, "background.pt"), model, optimizer, blocking=False, epoch=1)
with torch.no_grad():
    for p in model.parameters():
        p.fill_(7.0)
hk.wait_for_checkpoint()
saved = torch.load(os.path.join(tmp, "background.pt"), weights_only=True)
out["snapshot"] = all(torch.equal(saved["model"][k], before[k]) for k in before)
model.load_state_dict(before)
hk.save_checkpoint(os.path.join(tmp, "blocking.pt"), model, optimizer, epoch=1)
blocking = torch.load(os.path.join(tmp, "blocking.pt"), weights_only=True)
out["same_file"] = saved["integrity"] == blocking["integrity"]
out["loads"] = hk.load_checkpoint(os.path.join(tmp, "background.pt"), model, optimizer) == {"epoch": 1}

# A failed background write: raised at the step after, then nothing is left in flight.
open(os.path.join(tmp, "a-file"), "w").close()
bad = os.path.join(tmp, "a-file", "ckpt.pt")
out["returned"] = hk.save_checkpoint(bad, model, optimizer, blocking=False)
async_save._pending.thread.join()
try:
    step()
    out["at_step"] = None
except hk.CheckpointError as exc:
    out["at_step"] = str(exc)
out["in_flight_after"] = async_save.in_flight()
# ... or at the next save, once that one is written (a failed periodic save must not cost a preemption's).
hk.save_checkpoint(bad, model, optimizer, blocking=False)
try:
    hk.save_checkpoint(os.path.join(tmp, "next.pt"), model, optimizer)
    out["at_next_save"] = None
except hk.CheckpointError as exc:
    out["at_next_save"] = str(exc)
out["next_written"] = os.path.exists(os.path.join(tmp, "next.pt"))

# A load waits for the save in flight, and the header (extra=) is copied with the state.
losses = [0.5]
hk.save_checkpoint(os.path.join(tmp, "fresh.pt"), model, optimizer, blocking=False, losses=losses)
losses.append(0.25)
out["loaded_at_once"] = hk.load_checkpoint(os.path.join(tmp, "fresh.pt"), model, optimizer)

# keep_last in a directory, every save in the background: the newest 2, each verified on load.
ckpts = os.path.join(tmp, "ckpts", "")
for s in range(1, 6):
    step()
    hk.save_checkpoint(ckpts, model, optimizer, step=s, keep_last=2, blocking=False, done=s)
hk.wait_for_checkpoint()
out["kept"] = sorted(os.listdir(ckpts))
out["newest"] = hk.load_checkpoint(ckpts, model, optimizer)

# Tied weights (one tensor under two names) are written once in the background, as a blocking save writes them.
tied = torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 1000, bias=False))
tied[1].weight = tied[0].weight
sizes = {}
for blocking in (True, False):
    path = os.path.join(tmp, f"tied-{blocking}.pt")
    hk.save_checkpoint(path, tied, blocking=blocking)
    hk.wait_for_checkpoint()
    sizes[blocking] = os.path.getsize(path)
loaded = torch.load(path, weights_only=True)["model"]
out["tied"] = {"sizes": [sizes[True], sizes[False]], "equal": torch.equal(loaded["1.weight"], tied[0].weight),
               "shared": loaded["0.weight"].data_ptr() == loaded["1.weight"].data_ptr()}
print(json.dumps(out))
'''

EXIT = r'''
import os, sys, torch, hvdkit.torch as hk
hk.init(threads=1)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(16)])     # 64 MiB
hk.save_checkpoint(sys.argv[1], model, blocking=False, epoch=3)
print("returned", flush=True)
'''


def run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=180)


def test_a_background_save_writes_the_state_at_the_call_and_its_failure_is_raised_at_the_next_step_or_save(tmp_path):
    proc = run(TORCH, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["snapshot"], "the weights changed after the call reached the file"
    assert out["same_file"] and out["loads"]         # the same content and digest as a blocking save's
    blocking_size, background_size = out["tied"]["sizes"]    # (the copy stored the tied 256 KB twice)
    assert out["tied"]["shared"] and out["tied"]["equal"] and abs(background_size - blocking_size) <= 1024, out
    assert out["returned"] is True
    cannot = f"cannot write checkpoint '{tmp_path / 'a-file' / 'ckpt.pt'}'"
    assert out["at_step"] and out["at_step"].startswith(cannot), out["at_step"]
    assert out["in_flight_after"] is False
    assert out["at_next_save"] and out["at_next_save"].startswith(cannot), out["at_next_save"]
    assert out["next_written"] is True
    assert out["loaded_at_once"] == {"losses": [0.5]}
    assert out["kept"] == ["ckpt-00000004.pt", "ckpt-00000005.pt"] and out["newest"] == {"step": 5, "done": 5}


def test_a_script_that_ends_mid_write_still_writes_and_a_failure_then_is_exit_1(tmp_path):
    import torch

    proc = run(EXIT, str(tmp_path / "ckpt.pt"))
    assert proc.returncode == 0 and proc.stdout.strip() == "returned", proc.stderr[-3000:]
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["extra"] == {"epoch": 3}
    (tmp_path / "a-file").write_text("")
    proc = run(EXIT, str(tmp_path / "a-file" / "ckpt.pt"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hvdkit.runtime.checkpoint_files.CheckpointError: cannot write checkpoint "), last


KERAS = r'''
import json, os, sys
import numpy as np, hvdkit.keras as hk
keras = hk.use_backend(sys.argv[2])
hk.init(threads=1)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64)])
optimizer = hk.DistributedOptimizer(keras.optimizers.Adam(0.1))
model.compile(optimizer=optimizer, loss="mse")
hk.broadcast_state(model, optimizer)
before = model.layers[0].kernel.numpy().copy()
path = os.path.join(sys.argv[1], "ckpt.npz")
hk.save_checkpoint(path, model, optimizer, blocking=False, epoch=2)
model.layers[0].kernel.assign(np.full(before.shape, 7.0, dtype=before.dtype))
hk.wait_for_checkpoint()
model.layers[0].kernel.assign(np.zeros(before.shape, dtype=before.dtype))
extra = hk.load_checkpoint(path, model, optimizer)
print(json.dumps({"extra": extra, "snapshot": bool(np.array_equal(model.layers[0].kernel.numpy(), before))}))
'''


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_a_keras_background_save_writes_the_weights_at_the_call(tmp_path, backend):
    """On the torch backend Keras reads a CPU variable without a copy: without the host copy the file held 7s."""
    proc = run(KERAS, str(tmp_path), backend)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"extra": {"epoch": 2}, "snapshot": True}


def test_a_gpu_state_is_copied_into_pinned_memory_without_blocking_then_waited_for_once_a_device(monkeypatch):
    """hvdkit.torch.tensors.host_copy on a faked CUDA: tensors that say they live on cuda:0 and cuda:1 (CPU data
    underneath), torch.empty and torch.cuda.synchronize recorded. Each GPU tensor gets a page-locked buffer and an
    asynchronous copy, every copy is issued before the first wait, and each device is waited for once: what lets
    a background save return after the copy and not after the write. On a GPU, make test-gpu checks the same."""
    import torch

    from hvdkit.torch.tensors import host_copy, to_cpu

    events = []

    class OnGpu(torch.Tensor):
        """A CPU tensor that reports a CUDA device (what detach() returns too); copies out of it are recorded."""

        index = 0

        @property
        def device(self):
            return torch.device("cuda", self.index)

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.copy_:
                events.append(("copy", (kwargs or {}).get("non_blocking", False),
                               getattr(args[0], "is_pinned_by_test", False)))
            return super().__torch_function__(func, types, args, kwargs)

    def on(device: int, t: torch.Tensor) -> torch.Tensor:
        return t.as_subclass(type(f"OnGpu{device}", (OnGpu,), {"index": device}))

    real_empty = torch.empty

    def empty(*shape, pin_memory=False, **kwargs):
        out = real_empty(*shape, **kwargs)
        out.is_pinned_by_test = pin_memory
        return out

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("synchronize", device)))
    weights, moment = torch.arange(6.0).view(2, 3), torch.full((4,), 0.5)
    w = on(0, weights)
    state = {"model": {"w": w, "tied": w},                                  # one weight under two names: one copy
             "optimizer": {"state": {0: {"exp_avg": on(1, moment), "step": 3}}},
             "extra": {"losses": [0.5]}, "cpu": torch.ones(2)}
    moved = to_cpu(state)                 # a blocking save's (and a broadcast's) move: once a tensor too
    assert moved["model"]["tied"] is moved["model"]["w"] and torch.equal(moved["model"]["w"], weights)
    copy = host_copy(state)
    assert copy["model"]["tied"] is copy["model"]["w"]

    copies = [e for e in events if e[0] == "copy"]
    assert copies == [("copy", True, True)] * 2, events                       # pinned, not blocking
    assert sorted(e[1].index for e in events if e[0] == "synchronize") == [0, 1], events
    assert events.index(next(e for e in events if e[0] == "synchronize")) == 2, events   # after both copies
    assert type(copy["model"]["w"]) is torch.Tensor and torch.equal(copy["model"]["w"], weights)
    assert torch.equal(copy["optimizer"]["state"][0]["exp_avg"], moment)
    weights.add_(1.0), state["extra"]["losses"].append(0.25), state["cpu"].add_(1.0)
    assert copy["model"]["w"][0, 0] == 0.0 and copy["extra"]["losses"] == [0.5] and copy["cpu"][0] == 1.0


def test_a_background_copy_is_shared_only_by_the_same_view():
    """Tied weights get one copy (above); a conjugate view (the same memory, shape and strides), a slice and its
    whole each get their own, with their own values."""
    import torch

    from hvdkit.torch.tensors import host_copy

    c, whole = torch.tensor([1 + 2j, 3 - 1j]), torch.arange(6.0)
    copy = host_copy({"c": c, "conj": c.conj(), "whole": whole, "slice": whole[2:4], "again": whole})
    assert torch.equal(copy["c"], c) and torch.equal(copy["conj"], c.conj()) and copy["conj"] is not copy["c"]
    assert copy["again"] is copy["whole"] and torch.equal(copy["slice"], whole[2:4])


TWO_WRITERS = r'''
import json, os, sys, time, torch, hvdkit.torch as hk
hk.init(threads=1)
path, role = sys.argv[1], sys.argv[2]
model = torch.nn.Linear(64, 64)
if role == "first":                     # its write holds the file (and its lock) until the test releases it
    real_save = torch.save

    def slow_save(obj, f, *args, **kwargs):
        print("writing", flush=True)
        while not os.path.exists(path + ".release"):
            time.sleep(0.05)
        return real_save(obj, f, *args, **kwargs)

    torch.save = slow_save
hk.save_checkpoint(path, model, blocking=False, writer=role)
try:
    hk.wait_for_checkpoint()
    print(json.dumps({"error": None}))
except hk.CheckpointError as exc:
    print(json.dumps({"error": str(exc)}))
'''


def test_two_processes_saving_one_path_in_the_background_name_each_other_and_the_first_file_stays(tmp_path):
    """Issue 53: the concurrent-writer case for background saves. The second process's background write meets the
    first's live temporary file: its wait raises the blocking save's line naming the other writer, and the first
    save, untouched, ends as the file."""
    import torch

    path = tmp_path / "ckpt.pt"
    first = subprocess.Popen([sys.executable, "-c", TWO_WRITERS, str(path), "first"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "writing", first.stderr.read()[-3000:]
        second = run(TWO_WRITERS, str(path), "second")
        (tmp_path / "ckpt.pt.release").touch()
        first_out, first_err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert second.returncode == 0, second.stderr[-3000:]
    error = json.loads(second.stdout.strip().splitlines()[-1])["error"]
    assert error and error.startswith(f"another process is writing checkpoint '{path}' right now (.ckpt.pt."), error
    assert json.loads(first_out.strip().splitlines()[-1]) == {"error": None}, first_err[-3000:]
    assert torch.load(path, weights_only=True)["extra"] == {"writer": "first"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "ckpt.pt.release"]
