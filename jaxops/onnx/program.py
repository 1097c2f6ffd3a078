"""Loading an ONNX model into a jittable function, refusing bad models before anything runs.

At load: the graph is checked (``onnx.checker``; every node input defined before use), every
op must have a handler at a supported opset, external data must lie inside the model's
folder, and every initializer's declared shape must fit in memory; each refusal is a
jaxops error naming the node or file. At call: the inputs are checked against the graph's
declared ranks, static dims and dtypes, and the graph runs on
:class:`~jaxops.dynamic.Tensor` values (:mod:`jaxops.onnx.interpret`).
"""

from __future__ import annotations

import copy
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.core.narrowing import check_fits
from jaxops.dynamic.tensor import Tensor
from jaxops.onnx import handlers  # noqa: F401  (registers every handler)
from jaxops.onnx.checks import OPSETS, check_model, plan_initializer
from jaxops.onnx.interpret import run_graph
from jaxops.onnx.plan import CapacityPlan, SizeReport, apply_policy, check_plan_policy
from jaxops.onnx.registry import HANDLERS

__all__ = ["OPSETS", "Program", "load", "supported_ops"]


def supported_ops() -> list[str]:
    """The ONNX op types :func:`load` runs (default domain).

    >>> {"NonZero", "NonMaxSuppression", "RoiAlign", "If", "Loop"} <= set(supported_ops())
    True
    """
    return sorted(HANDLERS)


def _fail(arg: str, expected: str, given: Any, hint: str = "") -> OpArgumentError:
    return OpArgumentError("jaxops.onnx.load", arg, expected, given, hint)


def _read(model: Any) -> tuple[Any, pathlib.Path | None]:
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model, None
    path = pathlib.Path(os.fspath(model))
    if not path.is_file():
        raise _fail("model", "an onnx.ModelProto or the path of an .onnx file", str(path))
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends
        raise _fail("model", "a readable ONNX model", f"{path} ({type(e).__name__}: {e})") from e
    return proto, path.parent


def _declared(value: Any) -> tuple[int | None, list[int | None], int]:
    t = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] \
        if t.HasField("shape") else None
    return t.elem_type, dims, len(dims) if dims is not None else -1


class Program:
    """A loaded ONNX model: call it with the graph inputs (in order, or by name); it returns
    the graph outputs (or the values named at load) as arrays or DynArrays. Jit it."""

    def __init__(self, proto: Any, folder: pathlib.Path | None, opset: int,
                 capacities: Mapping[str, int] | CapacityPlan | None,
                 outputs: Sequence[str] | None, fill_value: Any, overflow: str = "expand"):
        self.proto, self.folder, self.opset = proto, folder, opset
        self.plan = capacities if isinstance(capacities, CapacityPlan) else None
        self.capacities = dict(self.plan.capacities if self.plan else capacities or {})
        self.overflow = check_plan_policy(overflow)
        self.compiles = 0  # programs traced for eager calls under a plan
        self._runs: dict = {}
        init = {t.name for t in proto.graph.initializer}
        self.input_names = [v.name for v in proto.graph.input if v.name not in init]
        self.output_names = list(outputs) if outputs else [o.name for o in proto.graph.output]
        self.fill_value = fill_value
        self._inits: dict[int, tuple[Any, np.ndarray]] = {}

    def initializer(self, t: Any) -> np.ndarray:
        """An initializer (or Constant's tensor) as a host array, its external data read
        from the model's folder."""
        from onnx import numpy_helper
        from onnx.external_data_helper import uses_external_data

        # By the tensor itself, not its name: Constants in different subgraphs (If
        # branches) may name their value tensors alike and hold different values.
        held = self._inits.get(id(t))
        if held is not None and held[0] is t:
            return held[1]
        if uses_external_data(t):
            plan_initializer(t)
            arr = numpy_helper.to_array(t, base_dir=str(self.folder))
        else:
            arr = numpy_helper.to_array(t)
        self._inits[id(t)] = (t, arr)  # t kept: its id is not reused while cached
        return arr

    def __call__(self, *args: Any, **kwargs: Any) -> list[jax.Array | DynArray]:
        if self.plan is not None and not _traced((args, kwargs)):
            self.check_inputs(*args, **kwargs)
            return apply_policy(lambda caps: self._under(caps)(*args, **kwargs),
                                self.capacities, self.overflow)
        return self._outputs(self._run(args, kwargs))

    def sized(self, *args: Any, **kwargs: Any) -> tuple[list, SizeReport]:
        """The outputs, and what each data-dependent tensor needed against its capacity
        (:class:`~jaxops.onnx.plan.SizeReport`: which tensor overflowed and how much it
        lost, inside jit too; memory planned against used). Jittable; no policy applies."""
        sizes: dict = {}
        outs = self._outputs(self._run(args, kwargs, sizes))
        return outs, SizeReport({n: s.size for n, s in sizes.items()},
                                {n: (s.op, s.capacity, s.bound, s.row_bytes)
                                 for n, s in sizes.items()})

    def _outputs(self, env: dict) -> list:
        outs = []
        for name in self.output_names:
            if name not in env:
                raise _fail("outputs", "names of values in the graph", repr(name))
            outs.append(env[name].to_public(self.fill_value))
        return outs

    def _under(self, capacities: dict):
        """A jitted :meth:`sized` of this model at ``capacities`` (one per set, kept)."""
        key = tuple(sorted(capacities.items()))
        if key not in self._runs:
            variant = copy.copy(self)
            variant.plan, variant.capacities = None, dict(capacities)

            def run(*args, **kwargs):
                self.compiles += 1
                return variant.sized(*args, **kwargs)
            self._runs[key] = jax.jit(run)
        return self._runs[key]

    def check_inputs(self, *args: Any, **kwargs: Any) -> None:
        """Refuses, on the host, a 64-bit input that JAX with x64 off would change
        (:class:`~jaxops.errors.OpDTypeError`). ``jax.jit`` narrows numpy inputs before
        the program sees them, so call this before a jitted call with host data; an eager
        call checks by itself."""
        for name, x in [*zip(self.input_names, args), *kwargs.items()]:
            if isinstance(x, (np.ndarray, np.generic)):
                check_fits("jaxops.onnx", name, x)

    def values(self, *args: Any, **kwargs: Any) -> dict[str, jax.Array | DynArray]:
        """Every value of the main graph computed at run time (those known at trace time,
        such as folded shape arithmetic, are left out), by name: for comparing a model's
        intermediate results, or measuring its memory plan. Jittable."""
        env = self._run(args, kwargs)
        return {o: env[o].to_public(self.fill_value) for n in self.proto.graph.node
                for o in n.output if o in env and not env[o].concrete}

    def _run(self, args: tuple, kwargs: dict, sizes: dict | None = None) -> dict:
        values = dict(zip(self.input_names, args))
        if len(args) > len(self.input_names):
            raise _fail("inputs", f"at most {len(self.input_names)} inputs "
                        f"({self.input_names})", len(args))
        for k, v in kwargs.items():
            if k not in self.input_names:
                raise _fail("inputs", f"an input name among {self.input_names}", repr(k))
            values[k] = v
        missing = [n for n in self.input_names if n not in values]
        if missing:
            raise _fail("inputs", f"every graph input {self.input_names}", f"none for {missing}")
        env = {}
        declared = {v.name: v for v in self.proto.graph.input}
        for name, v in values.items():
            env[name] = self._input(name, declared[name], v)
        return run_graph_env(self, env, sizes)

    def _input(self, name: str, value: Any, x: Any) -> Tensor:
        from onnx import helper

        t = Tensor.of(x if isinstance(x, (DynArray, jax.Array, np.ndarray)) else np.asarray(x))
        elem, dims, rank = _declared(value)
        if elem:
            want = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
            if np.dtype(jax.dtypes.canonicalize_dtype(want)) != \
                    np.dtype(jax.dtypes.canonicalize_dtype(t.dtype)):
                raise OpDTypeError("jaxops.onnx", name, f"dtype {want.name}", t.dtype.name)
        if rank >= 0:
            if rank != t.ndim or any(d is not None and d != m for d, m in zip(dims, t.shape)):
                raise _fail(name, f"shape {[d if d is not None else '?' for d in dims]}",
                            list(t.shape))
        if isinstance(t.data, np.ndarray):  # a host value stays known (checked now)
            check_fits("jaxops.onnx", name, t.data)
        return t


def _traced(tree: Any) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def run_graph_env(program: Program, env: dict, sizes: dict | None = None) -> dict:
    run_graph(program.proto.graph, env, program.opset, program, sizes)
    return env


def load(model: Any, *, capacities: Mapping[str, int] | CapacityPlan | None = None,
         outputs: Sequence[str] | None = None, fill_value: Any = 0,
         overflow: str = "expand") -> Program:
    """An ONNX model as a jittable JAX function in which every tensor has a dual shape.

    Args:
      model: an ``onnx.ModelProto`` or the path of an ``.onnx`` file (external data is
        read from the model's folder, and must lie inside it).
      capacities: optional capacities of data-dependent outputs, by output name (or node
        name): ``NonZero``'s, ``Compress``'s, ``Unique``'s or ``NonMaxSuppression``'s
        ``size=``. A capacity below the bound may overflow: the outputs downstream then
        say so in their ``true_shape`` (``overflowed()``), never silently. Or a
        :class:`~jaxops.onnx.CapacityPlan` (:func:`~jaxops.onnx.calibrate`): then
        :meth:`Program.sized` tells, inside jit too, which tensor overflowed and by how
        much, and an eager call applies ``overflow``.
      outputs: the names of the values to return (default: the graph outputs); any value
        of the graph may be named, e.g. to compare intermediate results.
      fill_value: what the padding of returned DynArrays holds.
      overflow: under a plan, what an eager call (outside jit) does when a tensor needs
        more than its planned capacity: ``"expand"`` (default: rerun with it at its bound,
        one more compile; nothing is lost), ``"truncate"`` (warn, keep the cut result) or
        ``"error"`` (raise ``CapacityOverflowError`` naming the tensor). Inside jit the
        overflow travels in the outputs and in :meth:`Program.sized`'s report.

    Returns:
      A :class:`Program`: ``program(*inputs)`` or ``program(name=array)`` returns a list
      with one ``jax.Array`` (static shape) or :class:`~jaxops.DynArray` per output. Under
      ``jax.jit`` every input of the same shapes shares one compile, whatever the data.

    Raises:
      OpArgumentError: a malformed graph, an op (or opset) without a handler (the error
        names the node and lists the supported ops), external data outside the model's
        folder; ``ResourceRequestError`` (a subclass) for a tensor whose declared or
        inferred max shape cannot fit in memory, before anything is allocated.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxops, jaxops.onnx
      >>> from onnx import helper, TensorProto as T
      >>> g = helper.make_graph(
      ...     [helper.make_node("NonZero", ["x"], ["i"]),
      ...      helper.make_node("Transpose", ["i"], ["t"]),
      ...      helper.make_node("GatherND", ["x", "t"], ["y"]),
      ...      helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0)], "g",
      ...     [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
      ...     [helper.make_tensor_value_info("y", T.FLOAT, ["n"]),
      ...      helper.make_tensor_value_info("s", T.FLOAT, [])])
      >>> fn = jaxops.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
      >>> y, s = jax.jit(fn)(jnp.array([[0.0, 2.0, 0.0], [3.0, 0.0, 4.0]]))
      >>> jaxops.refresh(y).tolist(), float(s)
      ([2.0, 3.0, 4.0], 9.0)
    """
    proto, folder = _read(model)
    opset = check_model(proto, folder)
    return Program(proto, folder, opset, capacities, outputs, fill_value, overflow)
