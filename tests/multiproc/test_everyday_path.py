"""The everyday path says nothing when all is well and one line when it is not (issue 35's cases 1-4 and 6).

Each case ran as a user script would, under real horovodrun, on 2 ranks; each test failed before its fix.
"""

import re

import pytest

from tests.conftest import WORKERS, horovodrun_cmd, job_env, read_rank_results, run_horovodrun, run_job

pytestmark = pytest.mark.multiproc

WARNING = re.compile(r"^\S*hvdkit: .*", re.MULTILINE)      # [1]<stderr>:hvdkit: ... as horovodrun prefixes it


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_correct_torch_step_prints_no_warning(tmp_path, controller):
    # Case 1: every multi-rank torch run warned "0 parameter(s) got no gradient ... ()" on every rank, though the
    # gradients were averaged when backward() returned; the one-time warning then hid the real case below.
    cmd = horovodrun_cmd(2, [str(WORKERS / "torch_equivalence.py"), "--out", str(tmp_path), "--optimizer", "sgd",
                             "--between", "clip"], controller)
    proc = run_job(cmd, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "size" in (tmp_path / "rank1.json").read_text()
    assert WARNING.findall(proc.stdout) == [], proc.stdout[-3000:]


def test_a_parameter_without_gradient_is_still_warned_about_by_name(launch):
    r0, r1 = launch(2, "torch_everyday.py", "--case", "unused")
    assert r0["size"] == r1["size"] == 2
    for r in (r0, r1):
        expected = "hvdkit: 2 parameter(s) got no gradient in the last backward pass (spare.bias, spare.weight)"
        assert len(r["warnings"]) == 1 and r["warnings"][0].startswith(expected), r["warnings"]


def equivalent_run(tmp_path, controller, *args):
    """torch_equivalence.py on 2 ranks, checked as every case here is: the ranks equal, and equal to one process."""
    argv = [str(WORKERS / "torch_equivalence.py"), "--out", str(tmp_path), *args]
    proc = run_horovodrun(2, argv, controller, timeout=180, pool="torch")
    assert proc.returncode == 0, proc.stdout[-3000:]
    r0, r1 = read_rank_results(tmp_path, 2, proc.stdout)
    assert r0["size"] == r1["size"] == 2
    assert r0["params_digest"] == r1["params_digest"]
    assert r0["max_param_diff"] < 1e-7, r0["max_param_diff"]
    return r0, proc.stdout


@pytest.mark.parametrize("controller,activation_checkpoint", [("mpi", "none"), ("gloo", "none"),
                                                              ("mpi", "reentrant"), ("gloo", "non-reentrant")])
def test_an_unused_parameter_does_not_leave_the_clip_racing_with_the_allreduces(tmp_path, controller,
                                                                                activation_checkpoint):
    # With a parameter that got no gradient, the averaging waited for step(): clip_grad_norm_ between backward and
    # step scaled the gradients in place while the other parameters' allreduces were still writing into them.
    # Reentrant checkpointing runs conv's backward as a backward pass of its own, inside the outer one: the
    # averaging must wait for the outer pass, or conv's gradient would be taken as missing (averaged as zeros).
    r0, output = equivalent_run(tmp_path, controller, "--optimizer", "sgd", "--steps", "4", "--unused",
                                "--between", "clip", "--activation-checkpoint", activation_checkpoint)
    assert r0["my_clip_norms"] == pytest.approx(r0["clip_norms"], rel=1e-9)
    warned = WARNING.findall(output)          # once per rank, naming the unused layer
    assert len(warned) == 2 and all("got no gradient in the last backward pass (spare.bias, spare.weight)" in w
                                    for w in warned), output[-3000:]


@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_a_weight_used_inside_a_reentrant_checkpoint_and_before_it_is_averaged_without_a_warning(tmp_path,
                                                                                               controller):
    # As a tied embedding is: conv's weight gets a gradient in the checkpoint's inner pass and again in the outer
    # one. The inner pass's end averaged every parameter; the outer one's took the others as given no gradient:
    # a false "3 parameter(s) got no gradient" warning on every rank and a second allreduce of them.
    r0, output = equivalent_run(tmp_path, controller, "--optimizer", "sgd", "--steps", "3", "--between", "clip",
                                "--activation-checkpoint", "reentrant", "--shared-outside")
    assert r0["my_clip_norms"] == pytest.approx(r0["clip_norms"], rel=1e-9)
    assert WARNING.findall(output) == [], output[-3000:]


def test_op_sum_with_a_weight_shared_across_a_reentrant_checkpoint_stops_naming_the_fix(tmp_path):
    # The inner pass's end sums the weight's first gradient; the outer pass adds this rank's second part to that
    # sum and Horovod sums it all again: size times the first part, silently (average is linear: exact).
    argv = [str(WORKERS / "torch_equivalence.py"), "--out", str(tmp_path), "--optimizer", "sgd", "--steps", "2",
            "--activation-checkpoint", "reentrant", "--shared-outside", "--op", "sum"]
    proc = run_job(horovodrun_cmd(2, argv, "mpi"), timeout=180)
    assert proc.returncode != 0, proc.stdout[-3000:]
    output = re.sub(r"\[[\d,]+\]<std(?:out|err)>:", "", proc.stdout)
    assert "UserError: 'conv.weight' got gradients in a reentrant activation checkpoint's backward and outside " \
           "it, which op='sum' would add up size times: use op='average'" in output, output[-3000:]


def test_parameters_frozen_mid_training_stay_put_as_in_one_process(launch):
    # Case 2: requires_grad=False after two steps; Horovod reduced a zero gradient for the frozen layer, and
    # momentum and weight decay moved it (max |dW| 0.29 on 2 ranks, 0 in one process and under DDP).
    r0, r1 = launch(2, "torch_equivalence.py", "--optimizer", "sgd", "--steps", "4", "--freeze-after", "2")
    assert r0["size"] == r1["size"] == 2
    assert r0["frozen_change"] == r1["frozen_change"] == 0.0
    assert r0["param_change"] > 1e-3, "the other layers must still train"
    assert r0["max_param_diff"] < 1e-7


@pytest.mark.parametrize("controller,shard,zero_grad", [("gloo", True, "zeros"), ("mpi", True, "zeros"),
                                                       ("mpi", False, "none")])
def test_a_layer_frozen_mid_training_moves_as_in_one_process_whatever_zero_grad_left(tmp_path, controller, shard,
                                                                                      zero_grad):
    # zero_grad(set_to_none=True) raised a TypeError (Horovod's zero_grad takes no argument). With
    # set_to_none=False a frozen layer keeps a zero gradient, and one process's SGD still moves it (momentum,
    # weight decay); sharded, each rank moved only its own slice and nothing gathered it: the ranks held
    # different weights, silently (found by a helper trying fine-tuning scripts).
    r0, output = equivalent_run(tmp_path, controller, "--optimizer", "sgd", "--steps", "4", "--freeze-after", "2",
                                "--zero-grad", zero_grad, *(["--shard"] if shard else []))
    assert (r0["frozen_change"] > 1e-4) if zero_grad == "zeros" else (r0["frozen_change"] == 0.0), r0
    assert WARNING.findall(output) == [], output[-3000:]


@pytest.mark.parametrize("controller,shard", [("gloo", False), ("mpi", True)])
def test_a_layer_frozen_between_two_passes_of_one_window_is_averaged_as_in_one_process(tmp_path, controller, shard):
    # requires_grad_(False) before the 2nd of 2 backward passes of a step: one process still applies the 1st
    # pass's gradient at that step. The frozen rule left that gradient out of the averaging, so each rank applied
    # its own: the ranks ended 1.8e-3 apart (sharded: equal, as the step gathers, but 1.8e-3 off one process).
    r0, output = equivalent_run(tmp_path, controller, "--optimizer", "sgd", "--steps", "4", "--micro-batches", "2",
                                "--freeze-after", "1", "--freeze-micro", "1", "--between", "clip",
                                *(["--shard"] if shard else []))
    assert r0["my_clip_norms"] == pytest.approx(r0["clip_norms"], rel=1e-9)
    assert r0["frozen_change"] > 1e-4, r0      # the first pass's gradient moved it at that step, as in one process
    assert WARNING.findall(output) == [], output[-3000:]


@pytest.mark.parametrize("controller,how,shard,optimizer,micro", [
    ("gloo", "requires-grad", False, "sgd", 1),
    ("mpi", "add-group", False, "adam", 2),         # with accumulation: unfrozen between two steps
    ("mpi", "requires-grad", True, "adam", 1),
    ("gloo", "requires-grad", False, "sgd", -2),    # unfrozen between the two passes of one step, then clipped
])
def test_parameters_unfrozen_mid_training_are_averaged_as_in_one_process(tmp_path, controller, how, shard,
                                                                         optimizer, micro):
    # Gradual unfreezing: the conv layer starts frozen and needs a gradient from step 2 on. Horovod hooks only
    # what required a gradient at wrapping, so the layer kept each rank's own gradient: rank 0 ended 0.032 (SGD,
    # Gloo), 0.015 (Adam, added group, MPI) and 0.020 (Adam, sharded, MPI) off the one-process run.
    args = ["--optimizer", optimizer, "--steps", "5", "--unfreeze-at", "2", "--unfreeze-how", how,
            "--micro-batches", str(abs(micro))] + (["--shard"] if shard else [])
    if micro < 0:     # its gradient started one pass late: it was averaged in step(), after the clip saw it
        args += ["--unfreeze-micro", "1", "--between", "clip"]
    r0, output = equivalent_run(tmp_path, controller, *args)
    assert r0["unfrozen_change"] > 1e-4, "the unfrozen layer must train"
    # Horovod's optimizer kept Adam's class defaults (lr 1e-3, no weight decay), not the script's, for add_param_group.
    wrapped, plain = r0["group_options"]
    assert len(wrapped) == (2 if how == "add-group" else 1) and wrapped == plain
    assert WARNING.findall(output) == [], output[-3000:]


def test_nan_on_one_rank_stops_every_rank_naming_it(launch):
    # Case 6: rank 1's NaN loss made every rank's weights NaN and the job exited 0 without a word.
    r0, r1 = launch(2, "torch_everyday.py", "--case", "nan")
    assert r0["size"] == r1["size"] == 2
    for r in (r0, r1):
        assert r["error"] and r["error"].startswith(
            "NonFiniteGradientError: rank 1 (first in 'fc2.bias') produced a non-finite (NaN or inf) gradient at "
            "step 3"), r["error"]
        assert "check_finite=False" in r["error"]
        assert r["steps"] == 2 and r["finite"], "the step must not be applied: the weights stay finite"


@pytest.mark.parametrize("mode", ["tensorflow", "torch"])
def test_keras_nan_loss_on_one_rank_stops_every_rank_naming_it(launch, mode):
    # Case 6 (Keras): rank 1's NaN batch made every rank's weights NaN; fit went on and the job exited 0.
    r0, r1 = launch(2, "keras_misuse.py", "--mode", mode, "--case", "nan_loss", timeout=180)
    assert r0["size"] == r1["size"] == 2
    for r in (r0, r1):
        assert r["error"] and r["error"].startswith(
            "NonFiniteGradientError: rank 1 computed a non-finite (NaN or inf) loss at epoch 1, batch 3"), r["error"]
        # Every rank stops at the same batch end, before the script's own callback counts the third.
        assert r["steps"] == 2


@pytest.mark.parametrize("case,warned", [("plain_loader", True), ("sharded", False)])
def test_an_unsharded_torch_loader_is_warned_about_once(launch, case, warned):
    # Case 4 (torch): a plain DataLoader trained every rank on all the data (no speed-up) without a word.
    r0, r1 = launch(2, "torch_everyday.py", "--case", case)
    assert r0["size"] == r1["size"] == 2
    hints = [w for w in r0["warnings"] if "hk.distributed_loader(dataset, batch_size)" in w]
    assert len(hints) == (1 if warned else 0), r0["warnings"]
    assert r1["warnings"] == [], "rank 0 alone says it"
    assert r0["steps"] == (40 if warned else 20)


def test_random_split_after_init_gives_every_rank_the_same_split(launch):
    # Case 3 (torch): init(seed) seeded seed + rank, so random_split before sharding split differently per rank.
    r0, r1 = launch(2, "torch_everyday.py", "--case", "random_split")
    assert r0["size"] == r1["size"] == 2
    assert r0["train_indices"] == r1["train_indices"]


def test_shuffle_then_shard_gives_disjoint_shards_covering_the_data(launch):
    # Case 3 (Keras): np.random.permutation before hk.shard_arrays differed per rank: 189 of 800 rows on both
    # ranks, 189 on neither.
    r0, r1 = launch(2, "keras_misuse.py", "--mode", "tensorflow", "--case", "shuffle_then_shard", timeout=180)
    assert r0["size"] == r1["size"] == 2
    assert r0["error"] is None and r1["error"] is None
    assert set(r0["ids"]).isdisjoint(r1["ids"])
    assert sorted(r0["ids"] + r1["ids"]) == list(range(64))


def test_unsharded_data_the_script_shuffled_is_warned_about(launch):
    # Case 4 (Keras): the check hashed rows in order, so arrays each rank had shuffled its own way passed.
    r0, r1 = launch(2, "keras_misuse.py", "--mode", "tensorflow", "--case", "unsharded_preshuffled", timeout=180)
    assert r0["size"] == r1["size"] == 2
    assert sorted(r0["ids"]) == sorted(r1["ids"]) and r0["ids"] == list(range(64))
    hints = [w for w in r0["warnings"] if w.startswith("hvdkit: every rank was given the same training data")]
    assert len(hints) == 1, r0["warnings"]
    assert r1["warnings"] == []


@pytest.mark.parametrize("legacy", [False, True])
def test_horovods_own_keras_recipe_names_the_way_out_on_keras_3(tmp_path, legacy):
    # Case 5: on Keras 3 the recipe failed at compile (experimental_run_tf_function), then in the warmup
    # callback (keras.backend.get_value), naming neither hvdkit.keras nor tf-keras.
    env = job_env(TF_USE_LEGACY_KERAS="1" if legacy else "0")
    proc = run_job(horovodrun_cmd(2, [str(WORKERS / "horovod_keras_recipe.py")]), timeout=180, env=env)
    if legacy:
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert "trained on 2 ranks" in proc.stdout
        return
    assert proc.returncode != 0
    errors = [line for line in proc.stdout.splitlines() if "RuntimeError: DistributedOptimizer:" in line]
    assert errors and all(line.endswith("pip install tf-keras and set TF_USE_LEGACY_KERAS=1") for line in errors), \
        proc.stdout[-3000:]
    assert "use hvdkit.keras" in errors[0]
    assert "experimental_run_tf_function" not in proc.stdout, "it must stop before compile"
