"""argparse ``type=`` callables for the numbers a training script takes.

A zero batch size or a negative learning rate is a typo, not a request: it
should stop at the command line with argparse's one-line usage error, not as
a traceback from deep inside the DataLoader or the optimizer.

Example::

    p.add_argument("--epochs", type=positive_int, default=12)
    p.add_argument("--warmup-epochs", type=non_negative_float, default=2)
"""

from __future__ import annotations

import argparse
import math


def _number(kind, text: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None


def positive_int(text: str) -> int:
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give 1 or more")
    return value


def _finite(text: str, rule: str) -> float:
    # float() takes "nan" and "inf"; neither is a time, a rate or a size.
    value = _number(float, text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give a finite number{rule}")
    return value


def positive_float(text: str) -> float:
    value = _finite(text, " above 0")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give a number above 0")
    return value


def non_negative_float(text: str) -> float:
    value = _finite(text, ", 0 or more")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give 0 or more")
    return value
