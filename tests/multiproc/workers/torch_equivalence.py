"""Worker: one step on N ranks x batch B equals one process on batch N*B (rank 0 computes both)."""

import argparse
import copy

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from rank_results import write_result
from torch_common import SmallNet, make_optimizer, tensor_digest

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--optimizer", choices=["sgd", "adam"], required=True)
p.add_argument("--micro-batches", type=int, default=1, help="backward passes per step")
p.add_argument("--steps", type=int, default=2)
p.add_argument("--amp", action="store_true", help="hk.step with a GradScaler and gradient clipping")
p.add_argument("--between", choices=["none", "clip", "read", "manual"], default="none",
               help="what the script does between backward() and step(), as users write it without hk.step: "
                    "clip_grad_norm_, read the gradient norm, or a hand-written SGD update instead of step()")
p.add_argument("--compile", choices=["none", "before", "after"], default="none",
               help="torch.compile the model before or after wrapping the optimizer")
p.add_argument("--autocast", action="store_true", help="forward passes under CPU autocast (bfloat16), both sides")
p.add_argument("--abort-first", action="store_true",
               help="first a backward that raises midway (caught, as after an out-of-memory error), in eval mode")
p.add_argument("--checkpoint", help="save after training, then load into a plain (uncompiled) SmallNet")
p.add_argument("--freeze-after", type=int, default=None,
               help="set requires_grad=False on the conv layer before this step, on both sides")
p.add_argument("--freeze-micro", type=int, default=0,
               help="freeze before this micro-batch of the step (between two backward passes of one window)")
p.add_argument("--unfreeze-at", type=int, default=None,
               help="start with the conv layer frozen (requires_grad=False) and unfreeze it before this step")
p.add_argument("--unfreeze-how", choices=["requires-grad", "add-group"], default="requires-grad",
               help="add-group: the conv layer is also left out of the optimizer and added with add_param_group")
p.add_argument("--unfreeze-micro", type=int, default=0,
               help="unfreeze before this micro-batch of the step (between two backward passes of one window)")
p.add_argument("--activation-checkpoint", choices=["none", "reentrant", "non-reentrant"], default="none",
               help="torch.utils.checkpoint around conv and BatchNorm, on both sides")
p.add_argument("--shared-outside", action="store_true",
               help="conv's weight also used before the checkpoint (as a tied embedding is): two passes accumulate it")
p.add_argument("--unused", action="store_true", help="a layer in the model and the optimizer that forward never uses")
p.add_argument("--op", choices=["average", "sum", "adasum"], default="average")
p.add_argument("--shard", action="store_true", help="DistributedOptimizer(shard_optimizer_state=True)")
p.add_argument("--zero-grad", choices=["default", "none", "zeros"], default="default",
               help="zero_grad(), zero_grad(set_to_none=True), or zero_grad(set_to_none=False), on both sides")
args = p.parse_args()
ZERO_GRAD = {"default": {}, "none": {"set_to_none": True}, "zeros": {"set_to_none": False}}[args.zero_grad]

ctx = hk.init(threads=1)
# float64, so that 1e-5 measures the algorithm rather than float32 summation order
# (Adam's m/sqrt(v) amplifies roundoff in tiny gradients to ~1e-5 in float32).
if not args.autocast:           # autocast lowers float32 only
    torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
B, k = 8, args.micro_batches
x_all = torch.randn(args.steps, ctx.size * B, 1, 8, 8)
y_all = torch.randint(0, 10, (args.steps, ctx.size * B))

model = SmallNet()
if args.unused:
    model.spare = torch.nn.Linear(4, 4)         # in the optimizer, never in forward: no gradient on any rank
if args.unfreeze_at is not None:
    model.conv.requires_grad_(False)
reference = copy.deepcopy(model)
initial = copy.deepcopy(model)
if args.compile == "before":
    model = torch.compile(model)


def trained(module):
    """What the optimizer starts with: every parameter, less the frozen conv layer with --unfreeze-how add-group."""
    if args.unfreeze_at is not None and args.unfreeze_how == "add-group":
        return [q for name, q in module.named_parameters() if not name.startswith("conv.")]
    return module.parameters()


opt = hk.DistributedOptimizer(make_optimizer(args.optimizer, trained(model)), model,
                              backward_passes_per_step=k, shard_optimizer_state=args.shard, op=args.op)
if args.compile == "after":
    model = torch.compile(model)
hk.broadcast_state(model, opt)
user_post_hook_calls = []      # a user's own step post-hook next to hvdkit's first-step weights check
opt.register_step_post_hook(lambda *_: user_post_hook_calls.append(1))
CLIP = 0.05                     # small enough that clipping really happens
LR = 0.05                       # the hand-written SGD's rate
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if args.amp else None
result = {"rank": ctx.rank, "size": ctx.size}


def forward(module, x):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
        if args.activation_checkpoint == "none":
            out = module(x)
        else:                   # conv + BatchNorm recomputed in backward; reentrant runs it as a backward of its own
            x = x + 0.1 * module.conv.weight.mean() if args.shared_outside else x.clone().requires_grad_(True)
            inner = torch.utils.checkpoint.checkpoint(lambda t: torch.relu(module.bn(module.conv(t))), x,
                                                      use_reentrant=args.activation_checkpoint == "reentrant")
            out = module.fc(inner.flatten(1))
    result.setdefault("logit_dtypes", set()).add(str(out.dtype))
    return out.float() if args.autocast else out


def grad_norm(module):
    return torch.cat([p.grad.flatten() for p in module.parameters()]).norm().item()


def between(module, optimizer, result):
    """What a single-process script does after backward(); the same code runs on both sides."""
    if args.between == "clip":
        result.setdefault("clip_norms", []).append(torch.nn.utils.clip_grad_norm_(module.parameters(), CLIP).item())
    elif args.between == "read":
        result.setdefault("grad_norms", []).append(grad_norm(module))
    if args.between == "manual":
        with torch.no_grad():
            for param in module.parameters():
                param -= LR * param.grad
    else:
        optimizer.step()


mine = {}


def abort_a_backward(xs, ys):
    """A backward that raises after the later layers' allreduces started; then the script flushes and goes on."""
    def fail(_grad):
        raise RuntimeError("aborted on purpose")
    handle = model.conv.weight.register_hook(fail)      # conv's gradient comes last
    model.eval()                                        # no BatchNorm statistics from this pass
    try:
        F.cross_entropy(forward(model, xs), ys).backward()
    except RuntimeError as exc:
        assert "aborted on purpose" in str(exc), exc
    else:
        raise AssertionError("the backward should have raised")
    handle.remove()
    model.train()
    opt.synchronize()                                   # the allreduces that pass started
    opt.zero_grad()


def freeze_at(step, module, micro=0):
    """Freeze the conv layer mid-training, as a fine-tuning script does; returns its weights when it does."""
    if (step, micro) != (args.freeze_after, args.freeze_micro):
        return None
    module.conv.requires_grad_(False)
    return module.conv.weight.detach().clone()


def unfreeze_at(step, module, optimizer, micro=0):
    """Unfreeze the conv layer mid-training (gradual unfreezing); returns its weights when it does."""
    if (step, micro) != (args.unfreeze_at, args.unfreeze_micro):
        return None
    module.conv.requires_grad_(True)
    if args.unfreeze_how == "add-group":
        optimizer.add_param_group({"params": list(module.conv.parameters())})
    return module.conv.weight.detach().clone()


for step in range(args.steps):
    unfrozen = unfreeze_at(step, model, opt)
    if unfrozen is not None:
        unfrozen_weights = unfrozen
    frozen = freeze_at(step, model)
    if frozen is not None:
        frozen_weights = frozen
    xs = x_all[step, ctx.rank * B:(ctx.rank + 1) * B]
    ys = y_all[step, ctx.rank * B:(ctx.rank + 1) * B]
    if args.abort_first and step == 0:
        abort_a_backward(xs, ys)
    opt.zero_grad(**ZERO_GRAD)
    if args.amp:                # the one-liner: scale, backward, synchronize, unscale, clip, step
        hk.step(opt, F.cross_entropy(forward(model, xs), ys), scaler=scaler, max_grad_norm=CLIP)
        continue
    for m in range(k):          # k micro-batches of B/k; loss / k so the accumulated sum is a mean
        if m and (unfrozen := unfreeze_at(step, model, opt, m)) is not None:
            unfrozen_weights = unfrozen
        if m and (frozen := freeze_at(step, model, m)) is not None:
            frozen_weights = frozen
        sl = slice(m * B // k, (m + 1) * B // k)
        (F.cross_entropy(forward(model, xs[sl]), ys[sl]) / k).backward()
    between(model, opt, mine)
result.update({f"my_{key}": value for key, value in mine.items()})
if args.checkpoint:
    hk.save_checkpoint(args.checkpoint, model, opt)
    plain = SmallNet()
    hk.load_checkpoint(args.checkpoint, plain, make_optimizer(args.optimizer, plain.parameters()))
    result["checkpoint_keys"] = sorted(torch.load(args.checkpoint, weights_only=True)["model"])
    result["checkpoint_diff"] = max((a - b).abs().max().item() for a, b in zip(model.parameters(),
                                                                               plain.parameters()))
if ctx.rank == 0:
    # BatchNorm normalises per forward pass, so the single process must see the same
    # per-pass batches: ranks' micro-batches, forwarded one after another.
    ref_opt = make_optimizer(args.optimizer, trained(reference))
    for step in range(args.steps):
        unfreeze_at(step, reference, ref_opt)
        freeze_at(step, reference)
        ref_opt.zero_grad(**ZERO_GRAD)
        for m in range(k):      # micro-batch by micro-batch, as the ranks unfreeze (each its own pass)
            if m:
                unfreeze_at(step, reference, ref_opt, m)
                freeze_at(step, reference, m)
            for r in range(ctx.size):
                lo = r * B + m * B // k
                hi = r * B + (m + 1) * B // k
                loss = F.cross_entropy(forward(reference, x_all[step, lo:hi]), y_all[step, lo:hi]) / (k * ctx.size)
                loss.backward()
        if args.amp:            # a power-of-two scale unscales exactly; clipping is what remains
            result.setdefault("clip_norms", []).append(
                torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP).item())
            ref_opt.step()
        else:
            between(reference, ref_opt, result)
    # The options each param group steps with (a group added after wrapping took the class's defaults).
    result["group_options"] = [[{k: v for k, v in g.items() if k != "params"} for g in o.param_groups]
                               for o in (opt, ref_opt)]
    # The used parameters (--unused: Horovod averages zeros for the spare layer, which weight decay then moves).
    diffs = [(a - b).abs().max().item() for (name, a), b in zip(model.named_parameters(), reference.parameters())
             if not name.startswith("spare.")]
    result["max_param_diff"] = max(diffs)
    result["param_change"] = max((a - b).abs().max().item()
                                 for a, b in zip(model.parameters(), initial.parameters()))
if args.freeze_after is not None:
    result["frozen_change"] = (model.conv.weight - frozen_weights).abs().max().item()
if args.unfreeze_at is not None:
    result["unfrozen_change"] = (model.conv.weight - unfrozen_weights).abs().max().item()
result["params_digest"] = tensor_digest(model.parameters())
result["logit_dtypes"] = sorted(result["logit_dtypes"])
result["user_post_hook_calls"] = len(user_post_hook_calls)
write_result(args.out, ctx.rank, result)
