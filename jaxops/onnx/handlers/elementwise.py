"""Elementwise ops: each a jnp function under the rule :func:`jaxops.dynamic.rules.elementwise`
(numpy broadcasting of max shapes and actual dims; the padding needs no masking)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxops.dynamic import rules
from jaxops.onnx.handlers.common import jax_dtype
from jaxops.onnx.registry import handler


def _ew(ctx, fn, *ts):
    return rules.elementwise(fn, *[t for t in ts if t is not None], op=ctx.where)


def _unary(op, fn, bounds=None):
    handler(op, bounds=bounds)(lambda ctx, x: _ew(ctx, fn, x))


def _int_div(a, b):
    if jnp.issubdtype(a.dtype, jnp.integer):  # ONNX (C) integer division truncates
        q = jnp.abs(a) // jnp.maximum(jnp.abs(b), 1)
        return jnp.where((a < 0) != (b < 0), -q, q).astype(a.dtype)
    return a / b


for _op, _fn, _b in [
        ("Abs", jnp.abs, None), ("Neg", jnp.negative, "antitone"), ("Floor", jnp.floor, "monotone"),
        ("Ceil", jnp.ceil, "monotone"), ("Sqrt", jnp.sqrt, "monotone"), ("Exp", jnp.exp, "monotone"),
        ("Log", jnp.log, "monotone"), ("Reciprocal", lambda x: 1 / x, None),
        ("Sigmoid", jax.nn.sigmoid, "monotone"), ("Tanh", jnp.tanh, "monotone"),
        ("Relu", jax.nn.relu, "monotone"), ("Sin", jnp.sin, None), ("Cos", jnp.cos, None),
        ("Tan", jnp.tan, None), ("Asin", jnp.arcsin, None), ("Acos", jnp.arccos, None),
        ("Atan", jnp.arctan, None), ("Sinh", jnp.sinh, None), ("Cosh", jnp.cosh, None),
        ("Asinh", jnp.arcsinh, None), ("Acosh", jnp.arccosh, None), ("Atanh", jnp.arctanh, None),
        ("Erf", jax.lax.erf, None), ("Sign", jnp.sign, "monotone"),
        ("Round", jnp.round, "monotone"), ("IsNaN", jnp.isnan, "bool"),
        ("Not", jnp.logical_not, "antitone"), ("BitwiseNot", jnp.bitwise_not, None),
        ("Softsign", lambda x: x / (1 + jnp.abs(x)), None),
        ("Softplus", lambda x: jnp.logaddexp(x, jnp.zeros((), x.dtype)), None),
        ("Mish", lambda x: x * jnp.tanh(jnp.logaddexp(x, jnp.zeros((), x.dtype))), None),
        ("HardSwish", lambda x: x * jnp.clip(x / 6 + 0.5, 0, 1), None)]:
    _unary(_op, _fn, _b)

for _op, _fn, _b in [
        ("Add", jnp.add, "monotone"), ("Sub", jnp.subtract, "sub"), ("Mul", jnp.multiply, "corners"),
        ("Div", _int_div, "corners"), ("Pow", None, None), ("And", jnp.logical_and, "monotone"),
        ("Or", jnp.logical_or, "monotone"), ("Xor", jnp.logical_xor, "bool"),
        ("Equal", jnp.equal, "equal"), ("Less", jnp.less, "corners"),
        ("Greater", jnp.greater, "corners"), ("LessOrEqual", jnp.less_equal, "corners"),
        ("GreaterOrEqual", jnp.greater_equal, "corners"),
        ("BitwiseAnd", jnp.bitwise_and, None), ("BitwiseOr", jnp.bitwise_or, None),
        ("BitwiseXor", jnp.bitwise_xor, None)]:
    if _fn is not None:
        handler(_op, bounds=_b)(lambda ctx, a, b, _fn=_fn: _ew(ctx, _fn, a, b))


@handler("Pow")
def _pow(ctx, x, y):
    return _ew(ctx, lambda a, b: jnp.power(a, b.astype(a.dtype)) if
               jnp.issubdtype(a.dtype, jnp.floating) else jnp.power(a, b).astype(a.dtype), x, y)


@handler("Mod", bounds="corners")
def _mod(ctx, a, b):
    fmod = ctx.attr("fmod", 0)
    return _ew(ctx, (lambda x, y: jnp.fmod(x, y)) if fmod else (lambda x, y: jnp.mod(x, y)), a, b)


@handler("BitShift")
def _shift(ctx, a, b):
    left = ctx.attr("direction") == "LEFT"
    return _ew(ctx, jnp.left_shift if left else jnp.right_shift, a, b)


for _op, _fn in [("Max", jnp.maximum), ("Min", jnp.minimum), ("Sum", jnp.add)]:
    def _variadic(ctx, *ts, _fn=_fn):
        return _ew(ctx, lambda *xs: _reduce_args(_fn, xs), *ts)
    handler(_op, bounds="monotone")(_variadic)


def _reduce_args(fn, xs):
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out


@handler("Mean")
def _mean(ctx, *ts):
    return _ew(ctx, lambda *xs: _reduce_args(jnp.add, xs) / len(xs), *ts)


@handler("Where", bounds="copy", data=(1, 2))
def _where(ctx, c, a, b):
    return _ew(ctx, jnp.where, c, a, b)


@handler("Clip", bounds="monotone")
def _clip(ctx, x, lo=None, hi=None):
    lo = ctx.attr("min") if lo is None and "min" in ctx.attrs else lo
    hi = ctx.attr("max") if hi is None and "max" in ctx.attrs else hi
    from jaxops.dynamic.tensor import Tensor

    lo = Tensor(np.asarray(lo, np.float32)) if isinstance(lo, float) else lo
    hi = Tensor(np.asarray(hi, np.float32)) if isinstance(hi, float) else hi

    def clip(v, *bs):
        it = iter(bs)
        if lo is not None:
            v = jnp.maximum(v, next(it).astype(v.dtype))
        if hi is not None:
            v = jnp.minimum(v, next(it).astype(v.dtype))
        return v
    return _ew(ctx, clip, x, lo, hi)


_FLOAT8 = {np.dtype(getattr(ml_dtypes, n)) for n in
           ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")}


_NARROW_INTS = {np.dtype(getattr(ml_dtypes, n)) for n in ("int4", "uint4", "int2", "uint2")}


def _converter(ctx, source, to):
    """ONNX's conversion of ``source`` values to ``to`` (onnx.reference's ``cast_to``, on
    ml_dtypes): a float to an integer toward zero (C), to a 4- or 2-bit integer 0 where it
    is out of range, to float8 saturated at its largest finite value unless
    ``saturate=0``."""
    to = np.dtype(to)
    if to in _FLOAT8 and ctx.attr("saturate", 1):
        big = float(ml_dtypes.finfo(to).max)
        return lambda v: jnp.clip(v, -big, big).astype(to) if jnp.issubdtype(
            v.dtype, jnp.floating) else v.astype(to)
    if source.kind in "fV" and to in _NARROW_INTS:  # toward zero; out of range: 0
        lo, hi = (int(b) for b in (ml_dtypes.iinfo(to).min, ml_dtypes.iinfo(to).max))
        return lambda v: jnp.where((v > lo - 1) & (v < hi + 1), jnp.trunc(v), 0).astype(to)
    if source.kind == "f" and to.kind in "iu":  # C conversion: toward zero
        return lambda v: jnp.trunc(v).astype(to)
    return lambda v: v.astype(to)


@handler("Cast", bounds="monotone")
def _cast(ctx, x):
    return _ew(ctx, _converter(ctx, x.dtype, jax_dtype(ctx.attr("to"))), x)


@handler("CastLike", bounds="monotone")
def _cast_like(ctx, x, like):
    return _ew(ctx, _converter(ctx, x.dtype, like.dtype), x)


def _check_dropout(node) -> None:
    """Dropout runs as inference (or with ratio 0, where training changes nothing): a
    random mask is refused at load, as it cannot equal any other runtime's."""
    if node.opset < 12:
        if node.opset < 7 and not node.attr("is_test", 0):
            raise node.error("is_test", "1 (inference; random masks are not supported)", 0)
        return
    if not node.given(2):
        return
    training = node.constant(2)
    if training is None:
        raise node.error("training_mode", "a constant (inference, or ratio 0)",
                         "a value computed at run time")
    ratio = node.constant(1) if node.given(1) else np.float32(0.5)
    ratio = None if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
    if bool(np.asarray(training).reshape(-1)[0]) and ratio != 0.0:
        raise node.error("training_mode", "false, or true with ratio 0 (random masks are not "
                         "supported)", "true with ratio "
                         + ("computed at run time" if ratio is None else str(ratio)))


@handler("Identity", bounds="copy")
def _identity(ctx, x):
    return x


@handler("Dropout", bounds="copy", check=_check_dropout)
def _dropout(ctx, x, *rest):
    if len(ctx.node.output) > 1 and ctx.node.output[1]:  # the mask: every element kept
        return x, _ew(ctx, lambda v: jnp.ones(v.shape, bool), x)
    return x


@handler("IsInf", bounds="bool")
def _isinf(ctx, x):
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    return _ew(ctx, lambda v: (jnp.isposinf(v) & bool(pos)) | (jnp.isneginf(v) & bool(neg)), x)


@handler("LeakyRelu")
def _leaky(ctx, x):
    a = ctx.attr("alpha", 0.01)
    return _ew(ctx, lambda v: jnp.where(v >= 0, v, v * a), x)


@handler("Elu")
def _elu(ctx, x):
    a = ctx.attr("alpha", 1.0)
    return _ew(ctx, lambda v: jnp.where(v >= 0, v, a * jnp.expm1(v)), x)


@handler("Celu")
def _celu(ctx, x):
    a = ctx.attr("alpha", 1.0)
    return _ew(ctx, lambda v: jnp.maximum(v, 0) + jnp.minimum(0, a * jnp.expm1(v / a)), x)


@handler("Selu")
def _selu(ctx, x):
    a, g = ctx.attr("alpha", 1.67326319217681884765625), ctx.attr("gamma", 1.05070102214813232421875)
    return _ew(ctx, lambda v: g * jnp.where(v > 0, v, a * jnp.expm1(v)), x)


@handler("ThresholdedRelu")
def _trelu(ctx, x):
    a = ctx.attr("alpha", 1.0)
    return _ew(ctx, lambda v: jnp.where(v > a, v, 0).astype(v.dtype), x)


@handler("HardSigmoid")
def _hsig(ctx, x):
    a, b = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return _ew(ctx, lambda v: jnp.clip(a * v + b, 0, 1).astype(v.dtype), x)


@handler("Shrink")
def _shrink(ctx, x):
    lam, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    return _ew(ctx, lambda v: jnp.where(v < -lam, v + bias, jnp.where(v > lam, v - bias, 0))
               .astype(v.dtype), x)


@handler("PRelu")
def _prelu(ctx, x, slope):
    return _ew(ctx, lambda v, s: jnp.where(v < 0, v * s, v), x, slope)


@handler("Gelu")
def _gelu(ctx, x):
    approx = ctx.attr("approximate", "none") == "tanh"
    return _ew(ctx, lambda v: jax.nn.gelu(v, approximate=approx), x)
