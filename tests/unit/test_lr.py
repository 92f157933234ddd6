import pytest

from hvdkit.common.errors import UserError
from hvdkit.runtime.lr import reduce_options, scale_lr, warmup_lr, warmup_steps

pytestmark = pytest.mark.unit


def test_linear_scaling_rule():
    assert scale_lr(0.01, 8) == pytest.approx(0.08)
    assert scale_lr(0.01, 1) == pytest.approx(0.01)


def test_sum_op_does_not_scale():
    assert scale_lr(0.01, 8, op="sum") == pytest.approx(0.01)


def test_adasum_scales_by_local_size_on_gpu_only():
    assert scale_lr(0.01, 16, op="adasum", local_size=4, on_gpu=True) == pytest.approx(0.04)
    assert scale_lr(0.01, 16, op="adasum", local_size=4, on_gpu=False) == pytest.approx(0.01)
    with pytest.raises(UserError, match="local_size"):
        scale_lr(0.01, 16, op="adasum", on_gpu=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(base_lr=0.0, size=2), "base_lr must be positive"),
    (dict(base_lr=0.1, size=0), "call init"),
    (dict(base_lr=0.1, size=2, op="max"), "unknown op"),
])
def test_bad_input_names_the_fix(kwargs, match):
    with pytest.raises(UserError, match=match):
        scale_lr(**kwargs)


def test_warmup_ramps_linearly_per_step_then_holds():
    values = [warmup_lr(s, 4, 0.1, 0.5) for s in range(7)]
    assert values == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.5])
    assert warmup_lr(3, 0, 0.1, 0.5) == 0.5
    with pytest.raises(UserError):
        warmup_lr(0, -1, 0.1, 0.5)


def test_both_adapters_options_are_checked_once_in_any_case():
    assert reduce_options("Average", "FP16") == ("average", "fp16")
    with pytest.raises(UserError, match="unknown compression 'zip'"):
        reduce_options("sum", "zip")


def test_warmup_length_in_steps_or_epochs():
    assert warmup_steps(warmup_steps=30) == 30 and warmup_steps() == 0
    assert warmup_steps(warmup_epochs=2.5, steps_per_epoch=10) == 25
    with pytest.raises(UserError, match="steps_per_epoch"):
        warmup_steps(warmup_epochs=1)
    with pytest.raises(UserError, match="not both"):
        warmup_steps(warmup_steps=1, warmup_epochs=1, steps_per_epoch=3)


def test_a_checkpoint_of_another_size_resumes_at_scale_lrs_rate():
    from hvdkit.runtime.checkpoint_files import CheckpointError
    from hvdkit.runtime.lr import resume_lr_factor

    assert resume_lr_factor(2.0, 2, 3.0, 3) == 1.5                 # 0.02 on 2 ranks -> 0.03 on 3
    assert resume_lr_factor(2.0, 2, 1.0, 1) == 0.5
    assert resume_lr_factor(None, 2, 3.0, 3) == 1.0                # no scale recorded (a fixed rate): kept
    assert resume_lr_factor(1.0, 2, 1.0, 3, op="sum") == 1.0       # sum: no scale to undo
    assert resume_lr_factor(2.0, 2, 2.0, 2, on_resize="error") == 1.0
    for saved_scale in (2.0, None):                                 # refused whatever the script does with rates
        with pytest.raises(CheckpointError, match="written by a job of 2 ranks and this one has 3: run on 2 ranks, "
                                                  "or load with on_resize='rescale'"):
            resume_lr_factor(saved_scale, 2, 3.0, 3, on_resize="error")
    with pytest.raises(UserError, match="on_resize='never'"):
        resume_lr_factor(2.0, 2, 3.0, 3, on_resize="never")


def test_bf16_compression_on_a_horovod_built_before_the_patch_says_rebuild():
    """A venv whose Horovod predates patch item 17 has no Compression.bf16: one line naming the rebuild."""
    from types import SimpleNamespace

    from hvdkit.runtime.backend import Backend

    old_build = SimpleNamespace(hvd=SimpleNamespace(Compression=SimpleNamespace(none="none", fp16="fp16")))
    assert Backend.compression(old_build, "fp16") == "fp16"
    with pytest.raises(UserError, match=r"compression='bf16' needs a Horovod built with hvdkit's patch .*"
                                        r"rerun scripts/install.sh"):
        Backend.compression(old_build, "bf16")
    assert reduce_options("average", "BF16") == ("average", "bf16")
    with pytest.raises(UserError, match=r"op='adasum' cannot take compression='bf16'.*use compression='fp16'"):
        reduce_options("adasum", "bf16")


def test_adasum_on_gloo_names_the_controller_it_needs():
    # Horovod has Adasum over MPI only: on Gloo the first backward pass raised "No Adasum operation enabled".
    assert reduce_options("adasum", on_mpi=True) == ("adasum", "none")
    assert reduce_options("average", on_mpi=False) == ("average", "none")
    with pytest.raises(UserError, match=r"op='adasum' needs the MPI controller.*horovodrun --mpi.*op='average'"):
        reduce_options("Adasum", on_mpi=False)
