import argparse

import pytest

from hvdkit.argtypes import non_negative_float, positive_float, positive_int

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("parse, text, value", [
    (positive_int, "3", 3), (positive_float, "0.01", 0.01), (non_negative_float, "0", 0.0),
])
def test_accepts(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize("parse, text, message", [
    (positive_int, "0", "give 1 or more"), (positive_int, "-2", "give 1 or more"),
    (positive_int, "1.5", "not an integer"), (positive_float, "0", "above 0"),
    (positive_float, "nan", "above 0"), (positive_float, "x", "not a number"),
    (non_negative_float, "-1", "0 or more"),
    # an infinite time or bandwidth is a typo too (issue 35: hvdkit plan took --compute-ms nan and inf)
    (positive_float, "inf", "inf is not allowed: give a finite number above 0"),
    (non_negative_float, "nan", "nan is not allowed: give a finite number, 0 or more"),
    (non_negative_float, "-inf", "give a finite number, 0 or more"),
])
def test_rejects_with_the_fix(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)
