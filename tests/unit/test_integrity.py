"""The digest a checkpoint carries inside itself: it changes with any value, dtype, shape or structure."""

import copy

import numpy as np
import pytest

from hvdkit.common.errors import UserError
from hvdkit.runtime.integrity import DIGEST_KEY, check_digest, content_digest

pytestmark = pytest.mark.unit


def state():
    return {"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)},
            "optimizer": {"state": {0: {"step": 3}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
            "extra": {"epoch": 2, "name": "run", "flag": True, "none": None}}


def sealed(s):
    s = copy.deepcopy(s)
    s[DIGEST_KEY] = content_digest(s)
    return s


def flip_exponent_bit(s):
    raw = s["model"]["w"].reshape(-1).view(np.uint8)
    raw[7] ^= 0x40                    # the high byte of the second float32: 1.0 -> 1.7e38


@pytest.mark.parametrize("damage", [
    flip_exponent_bit,
    lambda s: s["model"].__setitem__("w", s["model"]["w"].astype(np.float64)),     # same values, other dtype
    lambda s: s["model"].__setitem__("w", s["model"]["w"].reshape(3, 2)),          # same bytes, other shape
    lambda s: s["optimizer"]["param_groups"][0].__setitem__("lr", 0.10000001),
    lambda s: s["extra"].__setitem__("epoch", 2.0),                                  # 2 and 2.0 differ
    lambda s: s["extra"].__setitem__("flag", 1),
    lambda s: s["optimizer"]["param_groups"][0].__setitem__("params", (0, 1)),       # list vs tuple
    lambda s: s["extra"].pop("none"),
])
def test_any_change_is_detected(damage):
    s = sealed(state())
    assert check_digest(s) is None
    damage(s)
    assert "does not match the digest stored in it" in check_digest(s)


def test_a_state_without_a_digest_is_refused():
    assert "carries no sha256-content/1 digest" in check_digest(state())


def test_the_digest_is_stable_across_copies():
    assert content_digest(state()) == content_digest(copy.deepcopy(state()))


def test_sets_and_numpy_scalars_verify_after_a_round_trip():
    import pickle

    s = sealed({"tags": {"alpha", "beta", "gamma", "delta"}, "best": np.float32(0.25), "n": np.int64(3)})
    assert check_digest(pickle.loads(pickle.dumps(s))) is None


def test_a_value_whose_repr_holds_an_address_is_refused_at_save():
    with pytest.raises(UserError, match="cannot checksum a object in a checkpoint"):
        content_digest({"x": object()})
