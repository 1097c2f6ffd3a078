"""CANN ``ge::Format`` codes, with the primary/sub-format packing CANN uses.

A format word packs a primary format in its low byte and a sub-format (e.g. the group count
of FRACTAL_Z) in the next 16 bits.

>>> f = make_format(Format.FRACTAL_Z, 16)
>>> primary_format(f) == Format.FRACTAL_Z, sub_format(f)
(True, 16)
"""

from __future__ import annotations

import enum

__all__ = [
    "Format", "make_format", "primary_format", "sub_format",
]


class Format(enum.IntEnum):
    """CANN's numeric format codes (graph/types.h)."""

    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    HWCN = 16
    NDHWC = 27
    FRACTAL_ZZ = 28
    FRACTAL_NZ = 29
    NCDHW = 30
    DHWCN = 31
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47


def primary_format(fmt: int) -> int:
    """The primary format of a packed format word (``fmt & 0xff``)."""
    return int(fmt) & 0xFF


def sub_format(fmt: int) -> int:
    """The sub-format of a packed format word (``(fmt >> 8) & 0xffff``)."""
    return (int(fmt) >> 8) & 0xFFFF


def make_format(primary: int, sub: int = 0) -> int:
    """Packs a primary format and a sub-format into one word."""
    if not 0 <= int(primary) <= 0xFF:
        raise ValueError(f"make_format: primary format must be in [0, 255], got {primary}")
    if not 0 <= int(sub) <= 0xFFFF:
        raise ValueError(f"make_format: sub-format must be in [0, 65535], got {sub}")
    return (int(sub) << 8) | int(primary)
