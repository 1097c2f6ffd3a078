"""An FFI call that becomes a smaller kernel when only some of its outputs are used.

XLA keeps a custom call whole when any of its outputs is used. A kernel whose outputs cost
very differently (Unique: the sorted values alone sort keys; the index outputs sort
key-position pairs) therefore names, besides its full target, *variants*: a target that
computes a subset of the outputs. :func:`pruned_ffi_call` binds one primitive; when jit
prunes unused values (JAX's dead-code elimination of the traced program, which runs
before lowering and walks into nested jits and custom VJPs), its rule swaps in the first
variant that covers the outputs still used. So exactly one kernel runs: the full one when
an index output is used, the smaller one otherwise (an eager call uses every output).

>>> import jax, jax.numpy as jnp, jaxops
>>> f = jax.jit(lambda x: jaxops.unique(x, backend="native").data)
>>> "jaxops_unique_values" in f.lower(jnp.ones(4)).as_text()
True
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir, partial_eval

__all__ = ["Variant", "pruned_ffi_call"]

#: (FFI target, indices of the full call's outputs it computes (in its order), its attrs)
Variant = tuple[str, tuple[int, ...], tuple[tuple[str, Any], ...]]

_call_p = Primitive("jaxops_pruned_ffi_call")
_call_p.multiple_results = True


def pruned_ffi_call(target: str, results: Sequence[tuple[tuple[int, ...], Any]], *args,
                    variants: Sequence[Variant] = (), **attrs):
    """``jax.ffi.ffi_call(target, results)(*args, **attrs)`` that may run a variant instead
    (see the module docstring). Batching: like ``vmap_method="broadcast_all"``."""
    results = tuple((tuple(s), jnp.dtype(d)) for s, d in results)
    return _call_p.bind(*args, target=target, results=results, attrs=tuple(attrs.items()),
                        variants=tuple(variants))


def _abstract_eval(*args, target, results, attrs, variants):
    return [jax.core.ShapedArray(s, d) for s, d in results]


def _lowering(ctx, *args, target, results, attrs, variants):
    return jax.ffi.ffi_lowering(target)(ctx, *args, **dict(attrs))


def _impl(*args, **params):
    return jax.jit(functools.partial(_call_p.bind, **params))(*args)


def _batch(args, dims, *, target, results, attrs, variants):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)  # None: unbatched
    args = [jnp.broadcast_to(a, (size, *a.shape)) if d is None else
            jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    results = tuple(((size, *s), d) for s, d in results)
    out = _call_p.bind(*args, target=target, results=results, attrs=attrs, variants=variants)
    return out, [0] * len(out)


def _dce(used: list[bool], eqn):
    """The first variant computing every used output, or the call as it is."""
    if not any(used):
        return [False] * len(eqn.invars), None
    wanted = {i for i, u in enumerate(used) if u}
    for target, keep, attrs in eqn.params["variants"]:
        if wanted <= set(keep):
            results = eqn.params["results"]
            params = dict(eqn.params, target=target, attrs=attrs, variants=(),
                          results=tuple(results[i] for i in keep))
            return [True] * len(eqn.invars), eqn.replace(
                params=params, outvars=[eqn.outvars[i] for i in keep])
    return [True] * len(eqn.invars), eqn


_call_p.def_abstract_eval(_abstract_eval)
_call_p.def_impl(_impl)
mlir.register_lowering(_call_p, _lowering, platform="cpu")
batching.primitive_batchers[_call_p] = _batch
partial_eval.dce_rules[_call_p] = _dce
