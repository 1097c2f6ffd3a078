"""CANN DataType / Format codes, TensorDesc sizes and compatibility."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxops.core.dtypes import DataType
from jaxops.core.errors import UnsupportedDTypeError
from jaxops.core.formats import Format, make_format, primary_format, sub_format
from jaxops.core.tensor_desc import TensorDesc

CANN_DTYPE_CODES = {
    "FLOAT": 0, "FLOAT16": 1, "INT8": 2, "INT32": 3, "UINT8": 4, "INT16": 6, "UINT16": 7,
    "UINT32": 8, "INT64": 9, "UINT64": 10, "DOUBLE": 11, "BOOL": 12, "STRING": 13,
    "COMPLEX64": 16, "COMPLEX128": 17, "BF16": 27, "UNDEFINED": 28, "INT4": 29,
    "COMPLEX32": 33, "HIFLOAT8": 34, "FLOAT8_E5M2": 35, "FLOAT8_E4M3FN": 36,
}
CANN_FORMAT_CODES = {
    "NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4, "HWCN": 16, "NDHWC": 27,
    "FRACTAL_ZZ": 28, "FRACTAL_NZ": 29, "NCDHW": 30, "DHWCN": 31, "NDC1HWC0": 32,
    "FRACTAL_Z_3D": 33, "NC": 35, "NCL": 47,
}


def test_datatype_codes_are_canns():
    assert {d.name: int(d) for d in DataType} == CANN_DTYPE_CODES


def test_format_codes_are_canns():
    assert {f.name: int(f) for f in Format} == CANN_FORMAT_CODES


@pytest.mark.parametrize("dtype, code", [
    (np.float32, DataType.FLOAT), (np.float16, DataType.FLOAT16), (np.int8, DataType.INT8),
    (np.int32, DataType.INT32), (np.uint8, DataType.UINT8), (np.int16, DataType.INT16),
    (np.uint16, DataType.UINT16), (np.uint32, DataType.UINT32), (np.int64, DataType.INT64),
    (np.uint64, DataType.UINT64), (np.float64, DataType.DOUBLE), (np.bool_, DataType.BOOL),
    (np.complex64, DataType.COMPLEX64), (np.complex128, DataType.COMPLEX128),
    (jnp.bfloat16, DataType.BF16), (ml_dtypes.int4, DataType.INT4),
    (ml_dtypes.float8_e5m2, DataType.FLOAT8_E5M2), (ml_dtypes.float8_e4m3fn, DataType.FLOAT8_E4M3FN),
])
def test_dtype_round_trip(dtype, code):
    assert DataType.from_dtype(dtype) is code
    assert code.to_numpy() == np.dtype(dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int8, jnp.uint32, jnp.bool_])
def test_dtype_of_jax_arrays(dtype):
    x = jnp.zeros(2, dtype)
    assert DataType.from_dtype(x.dtype).to_numpy() == x.dtype


@pytest.mark.parametrize("code", [DataType.STRING, DataType.UNDEFINED, DataType.COMPLEX32,
                                  DataType.HIFLOAT8])
def test_types_without_numpy_equivalent_raise(code):
    with pytest.raises(UnsupportedDTypeError, match=code.name):
        code.to_numpy()


def test_unknown_numpy_dtype_raises():
    with pytest.raises(UnsupportedDTypeError, match="no CANN DataType"):
        DataType.from_dtype(np.dtype("datetime64[s]"))
    with pytest.raises(UnsupportedDTypeError, match="not a dtype"):
        DataType.from_dtype("no-such-type")


@pytest.mark.parametrize("code, size", [
    (DataType.FLOAT, 4), (DataType.FLOAT16, 2), (DataType.BF16, 2), (DataType.INT8, 1),
    (DataType.INT64, 8), (DataType.UINT64, 8), (DataType.DOUBLE, 8), (DataType.BOOL, 1),
    (DataType.COMPLEX64, 8), (DataType.COMPLEX128, 16), (DataType.COMPLEX32, 4),
    (DataType.HIFLOAT8, 1), (DataType.FLOAT8_E5M2, 1),
])
def test_itemsize(code, size):
    assert code.itemsize == size


def test_sub_byte_itemsize_raises_and_bits_answer():
    assert DataType.INT4.bits == 4
    with pytest.raises(UnsupportedDTypeError, match="bits"):
        DataType.INT4.itemsize
    with pytest.raises(UnsupportedDTypeError):
        DataType.STRING.bits


def test_format_packing():
    f = make_format(Format.FRACTAL_Z, 0x1234)
    assert f == (0x1234 << 8) | 4
    assert primary_format(f) == Format.FRACTAL_Z and sub_format(f) == 0x1234
    assert primary_format(Format.NCL) == 47 and sub_format(Format.NCL) == 0
    assert sub_format(0xFF_FFFF_FF) == 0xFFFF  # only 16 bits of sub-format
    with pytest.raises(ValueError):
        make_format(256, 0)
    with pytest.raises(ValueError):
        make_format(2, 1 << 16)


def test_tensor_desc_sizes():
    d = TensorDesc([1, 3, 224, 224], DataType.FLOAT)
    assert d.numel == 150528 and d.nbytes == 602112 and d.format is Format.ND
    assert TensorDesc((), DataType.INT64).numel == 1
    assert TensorDesc((0, 5), DataType.FLOAT).nbytes == 0
    assert TensorDesc((3,), DataType.INT4).nbytes == 2  # 12 bits round up
    assert TensorDesc((-1, 4), DataType.FLOAT).numel == -1
    assert TensorDesc((-2,), DataType.FLOAT).rank == -1


def test_tensor_desc_from_array():
    d = TensorDesc.from_array(jnp.zeros((2, 3), jnp.bfloat16), name="x")
    assert d == TensorDesc((2, 3), DataType.BF16, Format.ND, "x")
    assert TensorDesc.from_array(np.zeros(4, np.uint8)).dtype is DataType.UINT8


@pytest.mark.parametrize("a, b, ok", [
    ((2, 3), (2, 3), True),
    ((2, 3), (2, 4), False),
    ((-1, 3), (2, 3), True),
    ((2, 3), (2, -1), True),
    ((2, 3), (2, 3, 1), False),
    ((-2,), (5, 6, 7), True),
    ((2, 3), (-2,), True),
    ((), (), True),
    ((), (1,), False),
])
def test_compatible_with_shapes(a, b, ok):
    assert TensorDesc(a, DataType.FLOAT).compatible_with(TensorDesc(b, DataType.FLOAT)) is ok
    assert TensorDesc(b, DataType.FLOAT).compatible_with(TensorDesc(a, DataType.FLOAT)) is ok


def test_compatible_with_needs_same_dtype():
    assert not TensorDesc((2,), DataType.FLOAT).compatible_with(TensorDesc((2,), DataType.FLOAT16))
    assert not TensorDesc((-2,), DataType.INT32).compatible_with(TensorDesc((2,), DataType.INT64))
