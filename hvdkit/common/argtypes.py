"""Deprecated: the argparse types are public as :mod:`hvdkit.argtypes` (docs/API.md, *Renamed names*)."""

import warnings

from hvdkit.argtypes import non_negative_float, positive_float, positive_int

warnings.warn("hvdkit: hvdkit.common.argtypes is deprecated and will be removed: import hvdkit.argtypes",
              FutureWarning, stacklevel=2)

__all__ = ["non_negative_float", "positive_float", "positive_int"]
