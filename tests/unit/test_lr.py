import pytest

from hvdkit.core.lr import scale_lr, warmup_lr

pytestmark = pytest.mark.unit


def test_linear_scaling_rule():
    assert scale_lr(0.01, 8) == pytest.approx(0.08)
    assert scale_lr(0.01, 1) == pytest.approx(0.01)


def test_sum_op_does_not_scale():
    assert scale_lr(0.01, 8, op="sum") == pytest.approx(0.01)


def test_adasum_scales_by_local_size_on_gpu_only():
    assert scale_lr(0.01, 16, op="adasum", local_size=4, on_gpu=True) == pytest.approx(0.04)
    assert scale_lr(0.01, 16, op="adasum", local_size=4, on_gpu=False) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="local_size"):
        scale_lr(0.01, 16, op="adasum", on_gpu=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(base_lr=0.0, size=2), "base_lr must be positive"),
    (dict(base_lr=0.1, size=0), "call init"),
    (dict(base_lr=0.1, size=2, op="max"), "unknown op"),
])
def test_bad_input_names_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        scale_lr(**kwargs)


def test_warmup_ramps_linearly_per_step_then_holds():
    values = [warmup_lr(s, 4, 0.1, 0.5) for s in range(7)]
    assert values == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.5])
    assert warmup_lr(3, 0, 0.1, 0.5) == 0.5
    with pytest.raises(ValueError):
        warmup_lr(0, -1, 0.1, 0.5)
