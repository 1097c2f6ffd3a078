"""Seeded input generators of golden cases: densities and special values.

A case's inputs come from ``numpy.random.default_rng(seed)``. :class:`Generation` holds what
the developer chose on top of the spec's defaults (``--density``, ``--special``):

- ``density``: the fraction of elements that are non-zero (NonZero's ``x``) or set
  (MaskedSelect's ``mask``); 0 and 1 give the all-zero and all-set cases exactly;
- ``special``: kinds of special values written over about an eighth of the elements (at
  least one of each kind where the tensor has room): ``nan``, ``inf`` (+inf and -inf),
  ``zero`` (+0 and -0), ``subnormal`` (the smallest subnormals and random ones, both
  signs), ``extreme`` (the dtype's largest and lowest values, and for floats its smallest
  normals); ``all`` is every kind the dtype has.

>>> import numpy as np
>>> g = Generation(density=0.0)
>>> bool(values(np.random.default_rng(0), (3, 4), np.float16, g).any())
False
>>> x = values(np.random.default_rng(0), (64,), np.float32, Generation(special=("nan", "zero")))
>>> bool(np.isnan(x).any()), bool((np.signbit(x) & (x == 0)).any())
(True, True)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxops.core.errors import OpArgumentError

__all__ = ["SPECIAL_KINDS", "Generation", "mask", "special_kinds", "sprinkle", "values"]

#: The kinds of special values ``--special`` takes (``all``: every kind the dtype has).
SPECIAL_KINDS = ("nan", "inf", "zero", "subnormal", "extreme")
_FLOAT_ONLY = {"nan", "inf", "subnormal"}
_SPECIAL_SHARE = 8  # specials cover about 1/8 of the elements


@dataclasses.dataclass(frozen=True)
class Generation:
    """The developer's choices for generated inputs (``None``/empty: the spec's defaults).

    Examples:
      >>> Generation(density=0.5).describe()
      {'density': 0.5, 'special': []}
    """

    density: float | None = None
    special: tuple[str, ...] = ()

    def __post_init__(self):
        d = self.density
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float))
                              or not 0.0 <= d <= 1.0):
            raise OpArgumentError("golden", "density", "a fraction in [0, 1]", repr(d))
        unknown = [k for k in self.special if k not in SPECIAL_KINDS + ("all",)]
        if unknown:
            raise OpArgumentError("golden", "special", "kinds among " + ", ".join(
                SPECIAL_KINDS + ("all",)), repr(",".join(unknown)))

    def describe(self) -> dict:
        """What the case records of these choices."""
        return {"density": self.density, "special": list(self.special)}


def special_kinds(dtype, chosen: tuple[str, ...], where: str = "golden") -> tuple[str, ...]:
    """The kinds ``chosen`` asks of ``dtype`` (``all`` expanded); a float-only kind for an
    integer or bool dtype raises.

    Examples:
      >>> special_kinds(np.int8, ("all",))
      ('zero', 'extreme')
      >>> special_kinds(np.int8, ("nan",))
      Traceback (most recent call last):
      ...
      jaxops.core.errors.OpArgumentError: golden: argument 'special': expected kinds an int8 tensor has (zero, extreme), got 'nan'.
    """
    dtype = np.dtype(dtype)
    floating = _is_float(dtype)
    have = SPECIAL_KINDS if floating else tuple(k for k in SPECIAL_KINDS if k not in _FLOAT_ONLY)
    if dtype.kind == "b":
        have = ()
    if "all" in chosen:
        return have
    wrong = [k for k in chosen if k not in have]
    if wrong:
        raise OpArgumentError(where, "special", f"kinds an {dtype.name} tensor has ("
                              + (", ".join(have) or "none") + ")", repr(",".join(wrong)))
    return tuple(dict.fromkeys(chosen))


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name == "bfloat16"


def _finfo(dtype: np.dtype):
    if dtype.name == "bfloat16":  # ml_dtypes loads only when asked for (it is slow to load)
        import ml_dtypes
        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def _specials_of(kind: str, dtype: np.dtype, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` values of one special kind in ``dtype`` (its fixed values first, repeated)."""
    floating = _is_float(dtype)
    if kind == "subnormal":  # random multiples of the smallest subnormal, both signs
        tiny = float(_finfo(dtype).smallest_subnormal)
        steps = int(float(_finfo(dtype).smallest_normal) / tiny)
        v = rng.integers(1, steps, n) * tiny * rng.choice([-1.0, 1.0], n)
        v[:2] = [tiny, -tiny][:n]
        return v.astype(dtype)
    if kind == "extreme":
        info = _finfo(dtype) if floating else np.iinfo(dtype)
        fixed = [info.max, info.min] + ([info.smallest_normal, -info.smallest_normal]
                                        if floating else [])
    else:
        fixed = {"nan": [np.nan], "inf": [np.inf, -np.inf], "zero": [0.0, -0.0]}[kind]
    carrier = np.float64 if floating else dtype  # every fixed value is exact in dtype
    return np.resize(np.array([float(v) if floating else int(v) for v in fixed], carrier)
                     .astype(dtype), n)


def sprinkle(x: np.ndarray, rng: np.random.Generator, kinds: tuple[str, ...]) -> np.ndarray:
    """Writes the special kinds over random positions of ``x`` (in place; returned): about
    an eighth of its elements, at least one of each kind where there is room.

    Examples:
      >>> x = sprinkle(np.ones(8, np.float32), np.random.default_rng(0), ("inf",))
      >>> int(np.isinf(x).sum())
      1
    """
    if not kinds or x.size == 0:
        return x
    flat = x.reshape(-1)
    total = min(flat.size, max(len(kinds), math.ceil(flat.size / _SPECIAL_SHARE)))
    where = rng.choice(flat.size, total, replace=False) if flat.size < 2**20 else \
        np.unique(rng.integers(0, flat.size, total))
    for k, part in enumerate(np.array_split(where, len(kinds))):
        if part.size:
            flat[part] = _specials_of(kinds[k], x.dtype, rng, part.size)
    return x


def values(rng: np.random.Generator, shape, dtype, generation: Generation = Generation(),
           default_density: float = 1.0) -> np.ndarray:
    """Random values of ``dtype``: non-zero at ``generation.density`` (else
    ``default_density``), zeros elsewhere (floats: +0 and -0), then the special values.

    Non-zero values are normal draws for floats, uniform in [-100, -1] and [1, 100] for
    integers ([1, 100] unsigned), True for bool.

    Examples:
      >>> x = values(np.random.default_rng(1), (1000,), np.int8, Generation(density=0.25))
      >>> 0.2 < float((x != 0).mean()) < 0.3
      True
    """
    dtype = np.dtype(dtype)
    density = default_density if generation.density is None else generation.density
    kinds = special_kinds(dtype, generation.special)
    if dtype.kind == "b":
        return mask(rng, shape, density)
    if _is_float(dtype):
        x = rng.standard_normal(shape, np.float32).astype(dtype)
        x[x == 0] = 1  # a draw that rounds to zero would change the density
    elif dtype.kind == "u":
        x = rng.integers(1, min(int(np.iinfo(dtype).max), 100) + 1, shape, dtype=dtype)
    else:  # [-100, -1] and [1, 100] (or the dtype's range), never 0
        top = min(int(np.iinfo(dtype).max), 100)
        x = rng.integers(-top, top, shape, dtype=dtype)
        x[x >= 0] += 1
    if density < 1.0:
        zero = np.zeros((), dtype)
        if _is_float(dtype):  # zeros of both signs: -0.0 is zero too
            zero = np.where(rng.random(shape, np.float32) < 0.5, zero, -zero).astype(dtype)
        x = np.where(mask(rng, shape, density), x, zero)
    return sprinkle(np.ascontiguousarray(x), rng, kinds)


def mask(rng: np.random.Generator, shape, density: float) -> np.ndarray:
    """A bool array set at ``density`` (exactly none at 0 and all at 1).

    Examples:
      >>> bool(mask(np.random.default_rng(0), (5,), 1.0).all())
      True
    """
    if density >= 1.0:
        return np.ones(shape, bool)
    return rng.random(shape, np.float32) < np.float32(density)
