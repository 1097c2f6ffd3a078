"""``TensorDesc``: what CANN knows of a tensor before it exists (shape, dtype, format).

A dim of ``-1`` is unknown; the shape ``(-2,)`` means the rank itself is unknown.

>>> d = TensorDesc((1, 3, 224, 224), DataType.FLOAT)
>>> d.numel, d.nbytes
(150528, 602112)
>>> d.compatible_with(TensorDesc((-1, 3, 224, 224), DataType.FLOAT))
True
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxops.core.dtypes import DataType
from jaxops.core.formats import Format

__all__ = [
    "TensorDesc", "UNKNOWN_DIM", "UNKNOWN_RANK",
]

UNKNOWN_DIM = -1
UNKNOWN_RANK = (-2,)


@dataclasses.dataclass(frozen=True)
class TensorDesc:
    """Shape, CANN data type, format and name of a tensor."""

    shape: tuple[int, ...]
    dtype: DataType
    format: Format = Format.ND
    name: str = ""

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", DataType(self.dtype))
        object.__setattr__(self, "format", Format(self.format))

    @property
    def unknown_rank(self) -> bool:
        return self.shape == UNKNOWN_RANK

    @property
    def rank(self) -> int:
        """Number of axes; -1 when the rank is unknown."""
        return -1 if self.unknown_rank else len(self.shape)

    @property
    def is_static(self) -> bool:
        return not self.unknown_rank and all(d >= 0 for d in self.shape)

    @property
    def numel(self) -> int:
        """Number of elements; -1 when any dim (or the rank) is unknown."""
        return math.prod(self.shape) if self.is_static else -1

    @property
    def nbytes(self) -> int:
        """Bytes of the dense buffer (sub-byte types round up); -1 when not static."""
        if not self.is_static:
            return -1
        return (self.numel * self.dtype.bits + 7) // 8

    @classmethod
    def from_array(cls, x, name: str = "", format: Format = Format.ND) -> "TensorDesc":
        """Describes an array, a ``jax.ShapeDtypeStruct`` or a tracer."""
        return cls(tuple(np.shape(x)) if not hasattr(x, "shape") else tuple(x.shape),
                   DataType.from_dtype(x.dtype), format, name)

    def compatible_with(self, other: "TensorDesc") -> bool:
        """Whether an edge from ``self`` to ``other`` type-checks (unknowns match anything)."""
        if self.dtype != other.dtype:
            return False
        if self.unknown_rank or other.unknown_rank:
            return True
        if len(self.shape) != len(other.shape):
            return False
        return all(a == b or UNKNOWN_DIM in (a, b) for a, b in zip(self.shape, other.shape))
