"""CANN ``ge::DataType`` codes and their numpy / JAX equivalents.

>>> import numpy as np
>>> DataType.from_dtype(np.float32)
<DataType.FLOAT: 0>
>>> DataType.INT64.to_numpy()
dtype('int64')
>>> DataType.BF16.itemsize
2
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

from jaxops.core.errors import UnsupportedDTypeError

__all__ = [
    "ALL_NUMERIC", "DataType", "FLOATING", "INDEX", "INTEGER", "REAL", "SIGNED_INT",
    "UNSIGNED_INT",
]


class DataType(enum.IntEnum):
    """CANN's numeric data-type codes (``ge::DataType``, graph/types.h)."""

    FLOAT = 0
    FLOAT16 = 1
    INT8 = 2
    INT32 = 3
    UINT8 = 4
    INT16 = 6
    UINT16 = 7
    UINT32 = 8
    INT64 = 9
    UINT64 = 10
    DOUBLE = 11
    BOOL = 12
    STRING = 13
    COMPLEX64 = 16
    COMPLEX128 = 17
    BF16 = 27
    UNDEFINED = 28
    INT4 = 29
    COMPLEX32 = 33
    HIFLOAT8 = 34
    FLOAT8_E5M2 = 35
    FLOAT8_E4M3FN = 36

    @classmethod
    def from_dtype(cls, dtype) -> "DataType":
        """The CANN code of a numpy / JAX / ml_dtypes dtype (or anything ``np.dtype`` takes)."""
        try:
            key = np.dtype(dtype)
        except TypeError as e:
            raise UnsupportedDTypeError(f"DataType.from_dtype: {dtype!r} is not a dtype") from e
        code = _FROM_NUMPY.get(key)
        if code is None:
            raise UnsupportedDTypeError(
                f"DataType.from_dtype: numpy dtype {key} has no CANN DataType code; "
                f"supported: {', '.join(sorted(str(d) for d in _FROM_NUMPY))}")
        return code

    def to_numpy(self) -> np.dtype:
        """The numpy (or ml_dtypes) dtype of this code; raises when there is none."""
        dt = _TO_NUMPY.get(self)
        if dt is None:
            raise UnsupportedDTypeError(
                f"DataType.{self.name} ({int(self)}) has no numpy or ml_dtypes equivalent")
        return dt

    @property
    def bits(self) -> int:
        """Storage width in bits (4 for INT4; COMPLEX32 and HIFLOAT8 included)."""
        if self in _BITS:
            return _BITS[self]
        raise UnsupportedDTypeError(f"DataType.{self.name} has no fixed element size")

    @property
    def itemsize(self) -> int:
        """Bytes per element; sub-byte types (INT4) raise — use :attr:`bits`."""
        if self.bits % 8:
            raise UnsupportedDTypeError(
                f"DataType.{self.name} is {self.bits} bits wide, less than a byte; use .bits")
        return self.bits // 8


_TO_NUMPY: dict[DataType, np.dtype] = {
    DataType.FLOAT: np.dtype(np.float32),
    DataType.FLOAT16: np.dtype(np.float16),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT32: np.dtype(np.int32),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.INT16: np.dtype(np.int16),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.INT64: np.dtype(np.int64),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.DOUBLE: np.dtype(np.float64),
    DataType.BOOL: np.dtype(np.bool_),
    DataType.COMPLEX64: np.dtype(np.complex64),
    DataType.COMPLEX128: np.dtype(np.complex128),
    DataType.BF16: np.dtype(ml_dtypes.bfloat16),
    DataType.INT4: np.dtype(ml_dtypes.int4),
    DataType.FLOAT8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DataType.FLOAT8_E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
}
_FROM_NUMPY: dict[np.dtype, DataType] = {v: k for k, v in _TO_NUMPY.items()}

_BITS: dict[DataType, int] = {
    **{k: v.itemsize * 8 for k, v in _TO_NUMPY.items() if k is not DataType.INT4},
    DataType.INT4: 4,
    DataType.COMPLEX32: 32,
    DataType.HIFLOAT8: 8,
}

#: Convenience groups used by operator definitions.
FLOATING = frozenset({DataType.FLOAT, DataType.FLOAT16, DataType.BF16, DataType.DOUBLE})
SIGNED_INT = frozenset({DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64})
UNSIGNED_INT = frozenset({DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64})
INTEGER = SIGNED_INT | UNSIGNED_INT
INDEX = frozenset({DataType.INT32, DataType.INT64})
REAL = FLOATING | INTEGER
ALL_NUMERIC = REAL | {DataType.BOOL}
