"""Quantities typed on a command line: byte sizes (``64K``, ``16M``, ``4K:256M``) and counts (``25.6M``).

Example::

    parse_bytes("16M")        # 16777216
    parse_byte_range("4K:1M") # [4096, 16384, 65536, 262144, 1048576]
    parse_count("25.6M")      # 25600000.0
    format_bytes(16 << 20)    # '16 MiB'
"""

from __future__ import annotations

import math
import re

from hvdkit.common.errors import UserError

_BYTE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30,
               "GIB": 1 << 30}
_COUNT_UNITS = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}


def parse_bytes(text: str) -> int:
    """A message size in bytes, binary units; at least one float32."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _BYTE_UNITS:
        raise UserError(f"size {text!r} is not understood: write e.g. 4096, 64K, 16M or 1G")
    value = int(m.group(1)) * _BYTE_UNITS[m.group(2).upper()]
    if value < 4:
        raise UserError(f"size {text!r} is under one float32: use at least 4 bytes")
    return value


def parse_byte_range(text: str) -> list[int]:
    """``4K:256M`` (every power of 4 from 4 KiB to 256 MiB) or a list ``1M,16M,64M``."""
    if ":" in text:
        lo, hi = (parse_bytes(t) for t in text.split(":", 1))
        if lo > hi:
            raise UserError(f"size range {text!r} runs backwards: write LOW:HIGH, e.g. 4K:256M")
        sizes = [lo]
        while sizes[-1] * 4 <= hi:
            sizes.append(sizes[-1] * 4)
        return sizes
    return [parse_bytes(t) for t in text.split(",") if t.strip()]


def parse_count(text: str) -> float:
    """A parameter count with a decimal unit: ``25.6M``, ``1.5B`` (= ``1.5G``), ``350K``."""
    t = text.strip().upper()
    unit = t[-1] if t and t[-1] in "KMBG" else ""
    try:
        value = float(t[:-1] if unit else t) * _COUNT_UNITS[unit]
    except ValueError:
        raise UserError(f"parameter count {text!r} is not understood: write e.g. 25.6M or 1.5B") from None
    if not 0 < value < math.inf:     # nan fails too
        raise UserError(f"parameter count {text!r} is not above 0 and finite: write the model's count, "
                        "e.g. 25.6M (ResNet-50) or 1.5B")
    return value


def format_bytes(n: float) -> str:
    """A byte count in binary units, three significant digits: ``16 MiB``, ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"
