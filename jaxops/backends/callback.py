"""Kernels whose work happens on the host: a numpy function reached from jit.

:func:`host_kernel` turns ``host_fn(*numpy_inputs, **attrs) -> exact outputs`` into an
operator kernel usable under ``jit``, ``vmap`` and ``grad``:

- **Structure.** The outputs have exactly the pytree structure, max shapes, dtypes and
  fill values of the operator's ``xla`` kernel (read with :func:`jax.eval_shape`), so the
  backends are interchangeable. ``host_fn`` returns each output at its *exact* shape, as
  if capacity were unlimited; a data-dependent output is cut to its max shape as a leading
  block, padded with its fill value, and its true shape kept where the ``xla`` kernel
  keeps one (so overflow stays visible). An output whose true shape is not its exact
  shape (a bound on results the host could not compute) comes as :class:`Exact`.
- **Traced attrs.** A ``traced`` attr given a JAX scalar crosses to the host with the
  inputs (one compile for every value) and reaches ``host_fn`` as a numpy scalar.
- **jit.** One :func:`jax.pure_callback` per call carries the inputs to the host and the
  max-shape buffers back.
- **vmap.** ``vmap_method="expand_dims"``: the whole batch crosses in one callback and
  ``host_fn`` runs once per example on the host.
- **grad.** The host kernels are not differentiable, so the backward pass is the ``xla``
  kernel's: a :func:`jax.custom_vjp` whose forward is the host call and whose backward is
  the VJP of the ``xla`` kernel of the call's impl mode at the same inputs (identical
  forward results make the gradients consistent). Forward-mode (``jax.jvp``) is not supported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxops.core.backend_table import BackendEntry, register_backend
from jaxops.core.dynarray import DynArray
from jaxops.core.errors import DuplicateOpError
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.registry import KernelFn, OpDef, on_op

__all__ = [
    "HOST_KERNELS", "Exact", "HostFn", "host_kernel", "host_kernel_for", "pack",
]

HostFn = Callable[..., Sequence[np.ndarray]]
Traced = Callable[..., Any]

# The ``host`` backend: every operator with a host kernel; never chosen automatically.
register_backend(BackendEntry(
    "host", lambda: (True, "numpy kernels reached through jax.pure_callback (backward pass on xla)")))


class Exact(NamedTuple):
    """A host output at its exact shape with the true shape to report for it (what a
    capacity the host did not have could have added)."""

    data: np.ndarray
    true_shape: Sequence[int]


def pack(op: str, index: int, exact: Any, struct: Any) -> list[np.ndarray]:
    """The callback leaves of one output: ``exact`` laid into the ``struct`` of the xla
    kernel's output (a DynArray of ShapeDtypeStructs or one ShapeDtypeStruct)."""
    true = exact.true_shape if isinstance(exact, Exact) else None
    exact = np.asarray(exact.data if isinstance(exact, Exact) else exact)
    if not isinstance(struct, DynArray):
        if exact.shape != tuple(struct.shape):
            raise RuntimeError(f"{op}: host output {index} has shape {exact.shape}, the xla "
                               f"kernel's has {tuple(struct.shape)}")
        return [exact.astype(struct.dtype, copy=False)]
    max_shape = tuple(struct.data.shape)
    if exact.ndim != len(max_shape):
        raise RuntimeError(f"{op}: host output {index} has rank {exact.ndim}, the xla kernel's "
                           f"max shape is {max_shape}")
    actual = np.minimum(exact.shape, max_shape).astype(np.int32)
    block = tuple(slice(0, a) for a in actual)
    data = np.full(max_shape, struct.fill_value, struct.data.dtype)
    data[block] = exact[block]
    leaves = [data, actual]
    if struct.true_shape is not None:
        leaves.append(np.asarray(exact.shape if true is None else true, np.int32))
    return leaves


def _batched_host_call(op: OpDef, host_fn: HostFn, in_tree, base_shapes, out_structs,
                       attrs) -> Callable[..., list[np.ndarray]]:
    """The function the callback runs: loops over leading (vmap) axes and packs. The
    leaves are the inputs', then the traced attrs' (:func:`_split_attrs`)."""
    def run_one(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        inputs, traced_attrs = jax.tree_util.tree_unflatten(in_tree, list(arrays))
        exact = host_fn(*inputs, **attrs, **{k: v[()] for k, v in traced_attrs.items()})
        if len(exact) != len(out_structs):
            raise RuntimeError(f"{op.name}: host kernel returned {len(exact)} outputs, the "
                               f"operator has {len(out_structs)}")
        return [leaf for k, (e, s) in enumerate(zip(exact, out_structs))
                for leaf in pack(op.name, k, e, s)]

    def on_host(*arrays) -> list[np.ndarray]:
        arrays = [np.asarray(a) for a in arrays]
        leading = [a.shape[:a.ndim - len(base)] for a, base in zip(arrays, base_shapes)]
        batch = np.broadcast_shapes(*leading) if leading else ()
        if not batch:
            return run_one(arrays)
        arrays = [np.broadcast_to(a, batch + base) for a, base in zip(arrays, base_shapes)]
        per_example = [run_one([a[idx] for a in arrays]) for idx in np.ndindex(*batch)]
        return [np.stack(col).reshape(batch + col[0].shape) for col in zip(*per_example)]

    return on_host


def host_kernel(op: OpDef, host_fn: HostFn,
                check: Callable[..., None] | None = None,
                traced: Traced | None = None) -> KernelFn:
    """An operator kernel that runs ``host_fn`` on the host (see the module docstring).

    ``check(*inputs, **attrs)``, when given, runs at trace time (on tracers) and raises for
    inputs the host function cannot take. ``traced(out_structs, *inputs, **attrs)``, when
    given, is tried first at trace time: when it returns the outputs (traced, in the xla
    kernel's structure) they replace the callback; ``None`` keeps the callback (the ascend
    kernels' XLA custom call, :mod:`jaxops.backends.aclnn_call`).

    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jaxops.core.dtypes import FLOATING
    >>> from jaxops.core.registry import Input, OpDef, Output
    >>> double = OpDef("DocDouble", [Input("x", FLOATING)], [Output("y", FLOATING)])
    >>> _ = double.kernel("xla")(lambda x: (2 * x,))
    >>> _ = double.kernel("host")(host_kernel(double, lambda x: (2 * np.asarray(x),)))
    >>> jax.jit(lambda x: double(x, backend="host")[0])(jnp.arange(3.0)).tolist()
    [0.0, 2.0, 4.0]
    >>> jax.grad(lambda x: double(x, backend="host")[0].sum())(jnp.ones(2)).tolist()
    [2.0, 2.0]
    """
    bound: dict[OpImplMode, KernelFn] = {}

    def bind_mode(mode: OpImplMode) -> KernelFn:
        """The kernel whose backward pass runs the ``xla`` kernel of ``mode`` (cached, so
        the registry's jit cache sees one function per mode)."""
        if mode not in bound:
            bound[mode] = _host_kernel(op, host_fn, check, traced, mode)
        return bound[mode]

    kernel = _host_kernel(op, host_fn, check, traced, None)
    kernel.bind_mode = bind_mode
    return kernel


def _split_attrs(attrs: dict) -> tuple[dict, dict]:
    """(static attrs, JAX-scalar attrs): the latter travel as callback operands."""
    dynamic = {k: v for k, v in attrs.items() if isinstance(v, jax.Array)}
    return {k: v for k, v in attrs.items() if k not in dynamic}, dynamic


def _host_kernel(op: OpDef, host_fn: HostFn, check: Callable[..., None] | None,
                 traced: Traced | None, mode: OpImplMode | None) -> KernelFn:
    def kernel(*inputs, **all_attrs):
        if check is not None:
            check(*inputs, **all_attrs)
        attrs, dynamic = _split_attrs(all_attrs)
        leaves, in_tree = jax.tree_util.tree_flatten((list(inputs), dynamic))
        xla = op.get_kernel("xla", op.select_mode(mode))

        def call_xla(args):
            ins, dyn = jax.tree_util.tree_unflatten(in_tree, list(args))
            return tuple(xla(*ins, **attrs, **dyn))

        def xla_leaves(*args):
            return jax.tree_util.tree_leaves(call_xla(args))

        out_structs = tuple(jax.eval_shape(lambda *a: call_xla(a), *leaves))
        flat_structs, out_tree = jax.tree_util.tree_flatten(out_structs)
        result_types = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in flat_structs]
        on_host = _batched_host_call(op, host_fn, in_tree, [tuple(np.shape(x)) for x in leaves],
                                     out_structs, attrs)

        @jax.custom_vjp
        def run(*args):
            ins, dyn = jax.tree_util.tree_unflatten(in_tree, list(args))
            outs = None if traced is None else traced(out_structs, *ins, **attrs, **dyn)
            if outs is not None:
                return jax.tree_util.tree_leaves(tuple(outs))
            return jax.pure_callback(on_host, result_types, *args, vmap_method="expand_dims")

        def forward(*args):
            return run(*args), args

        def backward(args, cotangents):
            _, vjp = jax.vjp(xla_leaves, *args)
            return vjp(list(cotangents))

        run.defvjp(forward, backward)
        return jax.tree_util.tree_unflatten(out_tree, run(*leaves))

    kernel.__name__ = kernel.__qualname__ = f"{op.name}_host_kernel"
    return kernel


#: operator name -> numpy function of every host kernel registered with :func:`host_kernel_for`
HOST_KERNELS: dict[str, HostFn] = {}


def host_kernel_for(name: str) -> Callable[[HostFn], HostFn]:
    """Decorator: registers ``host_fn`` as the ``host`` kernel of operator ``name`` (through
    :func:`host_kernel`); an unknown name raises :class:`~jaxops.errors.UnknownOpError` at
    import, with the close matches.

    >>> @host_kernel_for("NonZro")
    ... def _typo(x, *, size, transpose):
    ...     return (x,)
    Traceback (most recent call last):
    ...
    jaxops.core.errors.UnknownOpError: host kernel registered for unknown operator 'NonZro'. Did you mean: NonZero? ...
    """
    def register(host_fn: HostFn) -> HostFn:
        if name in HOST_KERNELS:
            raise DuplicateOpError(f"{name}: host kernel registered twice")
        on_op(name, lambda op: op.kernel("host")(host_kernel(op, host_fn)), "host kernel")
        HOST_KERNELS[name] = host_fn
        return host_fn
    return register
