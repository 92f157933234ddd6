"""A user's mistakes in the adapters' arguments stop with one UserError naming the fix, before any job state is
touched (a user trial of issue 38's error family found these raising torch's ValueError, a ZeroDivisionError, a
RuntimeError or TensorFlow's abort, or passing silently)."""

import pytest

pytestmark = pytest.mark.adapters


def test_torch_arguments():
    import torch

    import hvdkit.torch as hk

    data = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    for bad in (0, -1, 2.5):
        with pytest.raises(hk.UserError, match=r"batch_size must be an integer of at least 1, got"):
            hk.distributed_loader(data, bad)
    import numpy as np

    from hvdkit.runtime.sharding import check_batch_size

    check_batch_size(np.int64(32))                    # a computed batch size is still one
    model = torch.nn.Linear(2, 1)
    with pytest.raises(hk.UserError, match=r"on_resize='nope': give one of rescale, error"):
        hk.load_checkpoint("/nonexistent/ckpt.pt", model, on_resize="nope")      # no optimizer: still checked


def test_keras_arguments():
    import hvdkit.keras as hk

    with pytest.raises(hk.UserError, match=r"batch_size must be an integer of at least 1, got 0"):
        hk.steps_per_epoch(100, 0)                                               # was ZeroDivisionError
    with pytest.raises(hk.UserError, match=r"on_resize='nope'"):
        hk.load_checkpoint("/nonexistent/ckpt.npz", object(), on_resize="nope")


@pytest.mark.parametrize("threads", [0, -2, 1.5, True])
def test_init_refuses_a_thread_count_below_one_before_starting_anything(threads):
    # torch raised "set_num_threads expects a positive integer", TensorFlow took 0 silently and aborted the
    # process (SIGABRT) on -2. The check runs first: no backend call, nothing set in the environment.
    from hvdkit.common.errors import UserError
    from hvdkit.runtime.context import init

    with pytest.raises(UserError, match=rf"threads={threads!r}: give the intra-op thread count, 1 or more"):
        init(object(), "torch", adapter="hvdkit.torch", threads=threads)


def test_a_schedulers_state_dict_passed_as_scheduler_is_one_line_naming_the_fix():
    # Issue 54, case 5: a natural reading of the name, which failed on rank 0 alone with "AttributeError: 'dict'
    # object has no attribute 'state_dict'" (the other ranks then waited). In a subprocess: hk.init() here would set
    # Horovod's defaults in pytest's environment, which later jobs inherit.
    import subprocess
    import sys

    code = ("import torch, hvdkit.torch as hk\n"
            "hk.init(); model = torch.nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "sched = torch.optim.lr_scheduler.StepLR(opt, 1)\n"
            "for call in (hk.save_checkpoint, hk.load_checkpoint):\n"
            "    try:\n"
            "        call('/nonexistent/ckpt.pt', model, opt, scheduler=sched.state_dict())\n"
            "    except hk.UserError as exc:\n"
            "        print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [line.split("(")[0] for line in lines] == ["hk.save_checkpoint", "hk.load_checkpoint"], proc.stdout
    for line in lines:
        assert "takes the LR scheduler itself, not dict" in line and "not sched.state_dict()" in line, line


GLOBAL_BATCH_MISTAKES = r'''
import torch, torch.nn.functional as F, hvdkit.torch as hk
from torch.utils.data import TensorDataset
hk.init()
data = TensorDataset(torch.randn(20, 3), torch.randint(0, 2, (20,)))

def fresh(**kwargs):
    loader = hk.global_batch_loader(data, 8, 4, num_workers=0)
    model = torch.nn.Linear(3, 2)
    return loader, model, torch.optim.SGD(model.parameters(), lr=0.1)

def says(what, call):
    try:
        call()
    except hk.UserError as exc:
        print(what, "|", exc)
    else:
        print(what, "| no error")

says("batch_size", lambda: hk.global_batch_loader(data, 8, batch_size=4))
loader, model, opt = fresh()
says("op", lambda: hk.DistributedOptimizer(opt, model, global_batch=loader, op="adasum"))
says("passes", lambda: hk.DistributedOptimizer(opt, model, global_batch=loader, backward_passes_per_step=2))
says("not a loader", lambda: hk.DistributedOptimizer(opt, model, global_batch=8))
says("unbound", lambda: next(iter(loader)))
opt = hk.DistributedOptimizer(opt, model, global_batch=loader)
says("warmup", lambda: hk.warmup_scheduler(opt, warmup_steps=5))

def skip_micro_batches():
    for step in loader:
        opt.zero_grad()
says("skipped", skip_micro_batches)

def step_inside():
    loader.set_epoch(1)
    for step in loader:
        for x, y in step:
            F.cross_entropy(model(x), y).backward()
            opt.step()
says("step inside", step_inside)

def backward_after():
    loader.set_epoch(1)
    for step in loader:
        opt.zero_grad()
        losses = [F.cross_entropy(model(x), y) for x, y in step]
        sum(losses).backward()
says("backward after", backward_after)

def unfrozen_later():
    loader, model, opt = fresh()
    model.bias.requires_grad_(False)
    opt = hk.DistributedOptimizer(opt, model, global_batch=loader)
    model.bias.requires_grad_(True)
    next(iter(next(iter(loader))))
says("unfrozen", unfrozen_later)
loader, model, opt = fresh()
says("other plan", lambda: loader.load_state_dict({**loader.state_dict(), "micro_batch": 2}))
loader, _, _ = fresh()
synced = torch.nn.Sequential(torch.nn.Linear(3, 2), hk.SyncBatchNorm(2))
says("syncbn", lambda: hk.DistributedOptimizer(torch.optim.SGD(synced.parameters(), lr=0.1), synced,
                                               global_batch=loader))
def no_set_epoch():
    loader, model, opt = fresh()
    opt = hk.DistributedOptimizer(opt, model, global_batch=loader)
    for _ in range(2):
        for step in loader:
            opt.zero_grad()
            for x, y in step:
                F.cross_entropy(model(x), y).backward()
            opt.step()
says("no set_epoch", no_set_epoch)

import os, tempfile
ckpt = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
loader, model, opt = fresh()
opt = hk.DistributedOptimizer(opt, model, global_batch=loader)
loader.set_epoch(0)
for step in loader:
    opt.zero_grad()
    for x, y in step:
        F.cross_entropy(model(x), y).backward()
    opt.step()
    break
hk.save_checkpoint(ckpt, model, opt, epoch=0)
hk.load_checkpoint(ckpt, model, opt)
says("wrong start", lambda: loader.set_epoch(0))
other = hk.global_batch_loader(data, 4, 2, num_workers=0)
model2 = torch.nn.Linear(3, 2)
opt2 = hk.DistributedOptimizer(torch.optim.SGD(model2.parameters(), lr=0.1), model2, global_batch=other)
says("other batch mid-epoch", lambda: hk.load_checkpoint(ckpt, model2, opt2))
loader, _, _ = fresh()
torch_synced = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.SyncBatchNorm(2))
says("torch syncbn", lambda: hk.DistributedOptimizer(torch.optim.SGD(torch_synced.parameters(), lr=0.1),
                                                     torch_synced, global_batch=loader))
hk.init()
loader, model, opt = fresh()
hk.scale_lr(0.1)
says("scale_lr", lambda: hk.DistributedOptimizer(opt, model, global_batch=loader))
'''


def test_a_global_batch_used_wrongly_is_one_line_naming_the_fix():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", GLOBAL_BATCH_MISTAKES], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = dict(line.split(" | ", 1) for line in proc.stdout.splitlines())
    assert said == {
        "batch_size": "global_batch_loader cuts the batches itself: leave out batch_size= (the DataLoader keyword), "
                      "and give global_batch, micro_batch, shuffle or drop_last",
        "op": "global_batch sums each micro-batch's weighted gradient into the step's mean, so op='adasum' has no "
              "place: leave op at its default",
        "passes": "global_batch decides how many backward passes a rank takes each step: leave "
                  "backward_passes_per_step at 1 and give micro_batch to hk.global_batch_loader instead",
        "not a loader": "global_batch takes the loader made by hk.global_batch_loader(), got int: build it with "
                        "hk.global_batch_loader(dataset, global_batch=...)",
        "unbound": "the global-batch loader has no optimizer: pass it to hk.DistributedOptimizer(optimizer, model, "
                   "global_batch=loader) before iterating it",
        "warmup": "warmup_scheduler ramps up from rate / size, which changes with the number of ranks, and a fixed "
                  "global batch keeps one rate at any size: for a warmup of your own use "
                  "torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=steps)",
        "skipped": "step 0's micro-batches were not all taken (for x, y in step: ...) before the next step: iterate "
                   "each step to its end, or the ranks' gradients would not pair",
        "step inside": "optimizer.step() was called before step 0's micro-batches were all taken: call it once, "
                       "after `for x, y in step:` ends (ranks take different numbers of micro-batches, so a step "
                       "inside that loop would not pair)",
        "backward after": "micro-batch 0 of step 0 got no backward() before the loop went on: call loss.backward() "
                          "inside `for x, y in step:`, once per micro-batch (each is weighed and seeded as it is "
                          "taken)",
        "unfrozen": "1 parameter(s) need a gradient since DistributedOptimizer(global_batch=...) wrapped the "
                    "optimizer, and a fixed global batch weighs only those that needed one then: unfreeze them "
                    "before wrapping",
        "other plan": "this loader cuts steps of 8 into micro-batches of 4 and the state it should go on from was "
                      "cut 8 into 2: give the same global_batch and micro_batch to hk.global_batch_loader everywhere",
        "syncbn": "'1' is a SyncBatchNorm, which gathers statistics from every rank at each forward, and with a "
                  "fixed global batch ranks take different numbers of micro-batches, so those gathers would not "
                  "pair: use torch.nn.BatchNorm (docs/GLOBAL_BATCH.md)",
        "no set_epoch": "epoch 0's steps were all taken: call loader.set_epoch(epoch) at the start of each epoch (a "
                        "new order, and its steps from the first)",
        "wrong start": "the checkpoint loaded stopped after step 1 of epoch 0, and set_epoch(0, start_step=0) would "
                       "train the steps in between again: call loader.set_epoch(0, start_step=1) (save "
                       "loader.steps_done with the epoch)",
        "other batch mid-epoch": "the checkpoint stopped after step 1 of epoch 0 with global batch 8 (micro-batch 4), "
                                 "and this loader's is 4 (2): finish the epoch with the checkpoint's, and change it at "
                                 "an epoch's end",
        "torch syncbn": "'1' is a SyncBatchNorm, which gathers statistics from every rank at each forward, and with a "
                        "fixed global batch ranks take different numbers of micro-batches, so those gathers would not "
                        "pair: use torch.nn.BatchNorm (docs/GLOBAL_BATCH.md)",
        "scale_lr": "hk.scale_lr multiplies the rate by the number of ranks, but with a fixed global batch the rate "
                    "does not depend on them: pass the rate for the global batch itself (lr=0.1, not "
                    "hk.scale_lr(0.1))",
    }, proc.stdout


@pytest.mark.parametrize("example", ["pytorch_mnist.py", "keras_mnist.py"])
def test_the_example_refuses_a_warmup_with_a_fixed_global_batch(example):
    """A user trial: --warmup-epochs was ignored with --global-batch, silently."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.run([sys.executable, str(ROOT / "examples" / example), "--global-batch", "64",
                           "--warmup-epochs", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "error: --warmup-epochs ramps from lr/processes, and --global-batch keeps one rate at any number of "
        "processes: leave --warmup-epochs out")


KERAS_GLOBAL_BATCH_MISTAKES = r'''
import os, sys
os.environ["KERAS_BACKEND"] = sys.argv[1]
import numpy as np, hvdkit.keras as hk
keras = hk.use_backend(sys.argv[1])
hk.init()
x, y = np.random.default_rng(0).standard_normal((20, 3)), np.zeros(20, dtype="int64")

def model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])

def says(what, call):
    try:
        call()
    except hk.UserError as exc:
        print(f"{what} | {exc}")
    else:
        print(f"{what} | no error")

batches = hk.global_batches(x, y, global_batch=8, micro_batch=4)
says("op", lambda: hk.DistributedOptimizer(keras.optimizers.SGD(0.1), op="sum", global_batch=batches))
says("accumulation", lambda: hk.DistributedOptimizer(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                                                     global_batch=batches))
says("not batches", lambda: hk.DistributedOptimizer(keras.optimizers.SGD(0.1), global_batch=(x, y)))
says("start", lambda: batches.set_epoch(0, start_sample=4))
says("larger micro", lambda: hk.global_batches(x, y, global_batch=8, micro_batch=16))
says("too few samples", lambda: hk.global_batches(x, y, global_batch=32))
m = model()
m.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1), global_batch=batches),
          loss="sparse_categorical_crossentropy")
says("warmup", lambda: hk.fit(m, batches, epochs=1, verbose=0, callbacks=hk.callbacks(warmup_epochs=1)))
synced = keras.Sequential([keras.Input((3,)), hk.SyncBatchNormalization(), keras.layers.Dense(2)])
synced.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1), global_batch=batches),
               loss="sparse_categorical_crossentropy")
says("syncbn", lambda: hk.fit(synced, batches, epochs=1, verbose=0, callbacks=hk.callbacks()))
other = hk.global_batches(x, y, global_batch=8, micro_batch=2)
says("other plan mid-epoch", lambda: other.resumed({"epoch": 0, "steps_done": 1, "global_batch": 8, "micro_batch": 4}))
per_execution = model()
per_execution.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1), global_batch=batches),
                      loss="sparse_categorical_crossentropy", steps_per_execution=2)
if sys.argv[1] == "tensorflow":   # Keras on torch refuses steps_per_execution > 1 itself
    says("steps_per_execution", lambda: hk.fit(per_execution, batches, epochs=1, verbose=0, callbacks=hk.callbacks()))
says("elastic", lambda: hk.elastic.ElasticState(m, m.optimizer))


class Stop(keras.callbacks.Callback):          # a fit that ends mid-step, as TerminateOnNaN or a time limit does
    def on_train_begin(self, logs=None):
        print("slot at fit start |", int(np.asarray(batches.step_sum.counter.value)))

    def on_train_batch_end(self, batch, logs=None):
        self.model.stop_training = True


stopped = model()
stopped.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1), global_batch=batches),
                loss="sparse_categorical_crossentropy")
batches.set_epoch(0)
stopped.fit(batches, epochs=1, verbose=0, shuffle=False, callbacks=hk.callbacks(Stop()))
batches.set_epoch(0)
stopped.fit(batches, epochs=1, verbose=0, shuffle=False, callbacks=hk.callbacks(Stop()))
hk.scale_lr(0.1)
says("scale_lr", lambda: hk.DistributedOptimizer(keras.optimizers.SGD(0.1), global_batch=batches))
'''


@pytest.mark.parametrize("mode", ["tensorflow", "torch"])
def test_a_keras_global_batch_used_wrongly_is_one_line_naming_the_fix(mode):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", KERAS_GLOBAL_BATCH_MISTAKES, mode], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = dict(line.split(" | ", 1) for line in proc.stdout.splitlines() if " | " in line)
    assert said.pop("slot at fit start") == "0"       # the second fit too: the first ended after slot 1 of 2
    if mode == "tensorflow":
        assert said.pop("steps_per_execution") == (
            "compile(steps_per_execution=2) runs several batches between callbacks, and a fixed global batch seeds "
            "each micro-batch's dropout before it runs: compile with steps_per_execution=1")
    assert said == {
        "elastic": "hk.elastic.ElasticState cannot take a Keras optimizer with a fixed global batch yet (each rank's "
                   "slots a step are cut for one world size, and fit's compiled step holds them): train elastic "
                   "Keras jobs with a per-rank batch (hvdkit.torch's elastic jobs take a global_batch_loader)",
        "op": "global_batch sums each micro-batch's weighted gradient into the step's mean, so op='sum' has no place: "
              "leave op at its default",
        "accumulation": "global_batch decides how many micro-batches a rank accumulates each step: leave "
                        "gradient_accumulation_steps unset and give micro_batch to hk.global_batches instead",
        "not batches": "global_batch takes the batches made by hk.global_batches(), got tuple: build them with "
                       "hk.global_batches(x, y, global_batch=...)",
        "start": "start_sample 4 is not at a step's start (a multiple of the global batch 8): resume from "
                 "batches.position(...) or the checkpoint",
        "larger micro": "micro_batch 16 is larger than global_batch 8: a micro-batch is a part of one step's batch; "
                        "give micro_batch <= global_batch",
        "too few samples": "20 samples make no step of global_batch 32 with drop_last=True: give a smaller "
                           "global_batch",
        "warmup": "callbacks(warmup_epochs/warmup_steps) ramps up from rate / size, which changes with the number of "
                  "ranks, and a fixed global batch keeps one rate at any size: for a warmup of your own give the "
                  "optimizer a schedule (keras.optimizers.schedules.CosineDecay(..., warmup_target=lr, "
                  "warmup_steps=n)), which counts steps",
        "syncbn": "layer 'sync_batch_normalization' is a SyncBatchNormalization, which gathers statistics from every "
                  "rank at each batch, and with a fixed global batch ranks take different micro-batches, so their "
                  "statistics would mix the ranks' shares: use keras.layers.BatchNormalization "
                  "(docs/GLOBAL_BATCH.md)",
        "other plan mid-epoch": "the checkpoint stopped after step 1 of epoch 0 with global batch 8 (micro-batch 4), "
                                "and these batches' is 8 (2): finish the epoch with the checkpoint's, and change it "
                                "at an epoch's end",
        "scale_lr": "hk.scale_lr multiplies the rate by the number of ranks, but with a fixed global batch the rate "
                    "does not depend on them: pass the rate for the global batch itself (SGD(0.1), not "
                    "SGD(hk.scale_lr(0.1)))",
    }, proc.stdout
