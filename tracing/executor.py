"""``tracing.launch``: run an operator CANN-style, with OP_* arguments and OP_OUTSHAPE.

The steps follow opbase's executor: validate against the OpDef, infer max shapes
(INFER_SHAPE), select the impl mode from OP_OPTION, look the compiled kernel up in a cache
keyed by (op, input avals, attrs, impl-mode index char, exec mode, backend, x64 and matmul
precision settings), run it, and —
when the launch carries OP_OUTSHAPE pairs — let the kernel write the shape tensor, sync it to
the host and refresh the outputs to their exact shapes. Such launches are counted as
*cache-abandoned*: the compiled kernel is reused, output shapes never are.

>>> import numpy as np, jax.numpy as jnp
>>> import jaxops
>>> from tracing import launch, OP_INPUT, OP_OUTSHAPE
>>> t = np.zeros(9, np.int64)
>>> r = launch("NonZero", OP_INPUT(jnp.array([0, 3, 0, 5])), OP_OUTSHAPE(t, 0))
>>> r.outputs[0].tolist(), t[:3].tolist()
([[1, 3]], [2, 1, 2])
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxops.backends import select_backend
from jaxops.core.dynarray import DynArray, lost_elements
from jaxops.core.errors import CapacityOverflowError, OpArgumentError, OutshapeError
from jaxops.core.impl_mode import OpExecMode, OpImplMode, to_index_char
from jaxops.core.registry import OpDef, get_op
from jaxops.core.tensor_desc import TensorDesc
from tracing.args import OpArg, OpArgContext
from tracing.outshape import SLOT_WORDS, encode, refresh_outputs, to_host_words
from jaxops.capacity import warn_once

__all__ = [
    "CacheInfo", "LaunchResult", "cache_clear", "cache_info", "launch",
]


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """Compile-cache statistics of :func:`launch`."""

    hits: int
    misses: int
    compiles: int
    abandoned: int
    size: int


@dataclasses.dataclass
class LaunchResult:
    """What a launch produced.

    ``outputs``: one entry per output; refreshed outputs are exact-shape numpy arrays, other
    data-dependent outputs stay DynArrays, the rest are arrays. ``outshape``: the shape
    tensor the kernel wrote (numpy, the dtype of the OP_OUTSHAPE tensor), or ``None``.
    ``wire``: with OP_OUTSHAPE, every output's buffer at max shape in wire layout (valid
    data as a contiguous row-major prefix, then fill) — what an Ascend kernel leaves in
    device memory; ``None`` otherwise. ``actual_shapes`` / ``true_shapes``: with
    OP_OUTSHAPE, per output the shape it has and the one it would have had with unlimited
    capacity (``None`` for outputs that cannot overflow); :attr:`overflowed` says whether
    any output was cut. Without OP_OUTSHAPE the
    DynArrays report it themselves (``overflowed()``, ``lost()``).
    """

    outputs: list
    outshape: np.ndarray | None
    impl_mode: OpImplMode
    backend: str
    cache_hit: bool
    wire: list | None = None
    actual_shapes: list | None = None
    true_shapes: list | None = None

    @property
    def overflowed(self) -> bool:
        """Whether an output's capacity cut results off (OP_OUTSHAPE launches)."""
        return bool(self._cut())

    def _cut(self) -> list[tuple[int, tuple, tuple]]:
        """``(output index, actual shape, true shape)`` of every cut output."""
        return [(k, a, t) for k, (a, t) in
                enumerate(zip(self.actual_shapes or [], self.true_shapes or []))
                if t is not None and t != a]

    def __iter__(self):
        return iter(self.outputs)

    def __getitem__(self, i):
        return self.outputs[i]


_lock = threading.Lock()
_cache: dict[tuple, Any] = {}
_stats = {"hits": 0, "misses": 0, "compiles": 0, "abandoned": 0}


def cache_info() -> CacheInfo:
    """Hits, misses, compiles and abandoned (OP_OUTSHAPE) launches so far."""
    with _lock:
        return CacheInfo(**_stats, size=len(_cache))


def cache_clear() -> None:
    """Empties the launch cache and zeroes its statistics."""
    with _lock:
        _cache.clear()
        _stats.update(hits=0, misses=0, compiles=0, abandoned=0)


def _freeze(value: Any):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return ("ndarray", value.shape, str(value.dtype), value.tobytes())
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _avals(inputs: Sequence[Any]) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(list(inputs))
    return (treedef, tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x).__name__)))
                           for x in leaves))


def _check_outputs(op: OpDef, given: Sequence[Any], inferred: Sequence[TensorDesc]) -> None:
    if len(given) > len(inferred):
        raise OpArgumentError(op.name, "OP_OUTPUT", f"at most {len(inferred)} outputs",
                              f"{len(given)}")
    for k, (buf, want) in enumerate(zip(given, inferred)):
        if buf is None:
            continue
        have = TensorDesc.from_array(buf)
        if not have.compatible_with(want):
            raise OpArgumentError(op.name, f"OP_OUTPUT[{k}]", f"{want.dtype.name}{list(want.shape)} "
                                  "(the inferred max shape)", f"{have.dtype.name}{list(have.shape)}")


def _as_tuple(outs) -> tuple:
    return tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)


def _compile(op: OpDef, kernel, attrs, inputs, pairs, word_dtype, uint64_flag, exec_mode):
    """Jit-compiles the kernel; with OP_OUTSHAPE it also writes wire buffers + shape words."""
    def body(*args):
        outs = _as_tuple(kernel(*args, **attrs))
        if not pairs:
            return outs
        shapes = []
        for _, index in pairs:
            if not 0 <= index < len(outs):
                raise OutshapeError(f"{op.name}: OP_OUTSHAPE names output {index}, the op has "
                                    f"{len(outs)} outputs")
            out = outs[index]
            shapes.append(out.actual_shape if isinstance(out, DynArray) else list(out.shape))
        wire = tuple(o.to_wire() if isinstance(o, DynArray) else o.reshape(-1) for o in outs)
        return outs, wire, encode(shapes, word_dtype, uint64_flag=uint64_flag)

    precision = "tensorfloat32" if exec_mode == OpExecMode.HF32 else None
    with jax.default_matmul_precision(precision):
        return jax.jit(body).lower(*inputs).compile()


def _kernel_word_dtype(op: str, dtype: np.dtype) -> np.dtype:
    """The dtype the kernel writes its shape words in: the tensor's (float32, int32,
    int64), int64 for a uint64 tensor (opbase reads uint64 words as int64)."""
    if dtype == np.uint64:
        return np.dtype(np.int64)
    if dtype not in (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64)):
        raise OutshapeError(f"{op}: Unsupported outshape dtype {dtype}: expected float32, int32, "
                            "int64 or uint64")
    return dtype


def _check_words(op: str, size: int, ranks: list[int]) -> None:
    """An OP_OUTSHAPE tensor holds 9 words for every output but the last, which needs only
    its rank word and dims (opbase's RefreshOutputShape reads slot k at 9k, 1 + rank words:
    A2's NonZero writes 3 int32 words, MaskedSelectV3 2 int64 words)."""
    need = SLOT_WORDS * (len(ranks) - 1) + 1 + ranks[-1]
    if size < need:
        raise OutshapeError(f"{op}: the OP_OUTSHAPE tensor has {size} words; {len(ranks)} "
                            f"outputs need {need} (9 per output, the last {1 + ranks[-1]}: its "
                            "rank word and dims)")


def launch(op_name: str, *op_args: OpArg, backend: str | None = None,
           uint64_flag: bool = False, overflow: str = "truncate") -> LaunchResult:
    """Launches ``op_name`` with CANN-style ``OP_*`` arguments (see the module docstring).

    ``uint64_flag`` makes the kernel set bit 31 of each rank word of an int64 shape tensor,
    as Ascend kernels that produce 64-bit shape data do.

    The OP_OUTSHAPE tensor takes the variants CANN's kernels use: float32, int32, int64 or
    uint64 words (uint64 written as the int64 words reinterpreted, as opbase reads them), 9
    per output, the last output's slot possibly cut after its dims (``1 + rank`` words:
    the 3 int32 words of A2's NonZero, the 2 int64 words of MaskedSelectV3).

    ``overflow``: what an OP_OUTSHAPE launch does when a ``size`` attr left an output short
    of its true size — ``"truncate"`` (the kernel's behaviour: keep what fits, warn once per
    operator, report it in :attr:`LaunchResult.true_shapes`) or ``"error"`` (raise
    :class:`~jaxops.errors.CapacityOverflowError`). The buffers are the caller's, so there
    is no ``"expand"`` here; the functional API has it.
    """
    if overflow not in ("truncate", "error"):
        raise OpArgumentError("launch", "overflow", "'truncate' or 'error'", repr(overflow))
    ctx = OpArgContext(*op_args)
    op = get_op(op_name)
    inputs, attrs = op.check(ctx.inputs, ctx.attrs)
    if op.infer_shape is not None:
        _check_outputs(op, ctx.outputs, op.infer(inputs, attrs))
    mode = op.select_mode(ctx.impl_mode)
    chosen = select_backend(op, backend, inputs=inputs, attrs=attrs)  # as a direct call
    kernel = op.get_kernel(chosen, mode)
    pairs = list(ctx.outshape)
    tensor = pairs[0][0] if pairs else None
    word_dtype = np.dtype(tensor.dtype) if tensor is not None else None
    if tensor is not None and not (isinstance(tensor, np.ndarray) and tensor.flags.writeable):
        # The kernel writes the caller's tensor in place: an immutable one would stay stale.
        raise OpArgumentError(op.name, "OP_OUTSHAPE", "a writeable numpy array (the launch "
                              "writes the shapes into it)", "a read-only numpy array"
                              if isinstance(tensor, np.ndarray) else type(tensor).__name__,
                              "Pass np.zeros(9 * n_outputs, np.int64) or similar.")
    kernel_dtype = None if tensor is None else _kernel_word_dtype(op.name, word_dtype)
    if tensor is not None and op.infer_shape is not None:  # refused before compiling
        ranks = [len(d.shape) for d in op.infer(inputs, attrs)]
        _check_words(op.name, np.size(tensor), [ranks[i] if 0 <= i < len(ranks) else 0
                                                 for _, i in pairs])
    key = (op.name, _avals(inputs), _freeze(attrs), to_index_char(mode), int(ctx.exec_mode),
           chosen, tuple(i for _, i in pairs), str(word_dtype), uint64_flag,
           bool(jax.config.jax_enable_x64), str(jax.config.jax_default_matmul_precision))
    with _lock:
        compiled = _cache.get(key)
        hit = compiled is not None
        _stats["hits" if hit else "misses"] += 1
    if not hit:
        compiled = _compile(op, kernel, attrs, inputs, [(None, i) for _, i in pairs],
                            kernel_dtype, uint64_flag, ctx.exec_mode)
        with _lock:
            _cache[key] = compiled
            _stats["compiles"] += 1
    result = compiled(*inputs)
    if not pairs:
        return LaunchResult(list(_as_tuple(result)), None, mode, chosen, hit)

    outs, wire, words = result
    shapes = [(o.actual_shape, o.true_shape) if isinstance(o, DynArray) else None for o in outs]
    host_wire, host_words, shapes = jax.device_get((wire, words, shapes))  # the one sync
    host_wire = [np.asarray(w).reshape(np.shape(o.data) if isinstance(o, DynArray) else np.shape(o))
                 for w, o in zip(host_wire, outs)]
    written = to_host_words(host_words, kernel_dtype)
    _check_words(op.name, tensor.size, [len(np.shape(o.data if isinstance(o, DynArray) else o))
                                        for o in (outs[i] for _, i in pairs)])
    # The kernel writes the caller's tensor: every slot's words that fit (a short tensor
    # ends after the last slot's dims), uint64 words as the int64 ones reinterpreted.
    size = min(tensor.size, written.size)
    tensor.reshape(-1)[:size] = written[:size].view(word_dtype)
    refreshed = refresh_outputs(host_wire, [(written, i) for _, i in pairs])
    touched = {i for _, i in pairs}
    final = [refreshed[i] if i in touched else o for i, o in enumerate(outs)]
    with _lock:
        _stats["abandoned"] += 1
    def dims(s):
        return None if s is None else tuple(int(d) for d in s)

    actual = [dims(s[0]) if s is not None else np.shape(o) for s, o in zip(shapes, outs)]
    true = [dims(s[1]) if s is not None else None for s in shapes]
    launched = LaunchResult(final, tensor.reshape(-1)[:size].copy(), mode, chosen, hit,
                            host_wire, actual, true)
    cut = launched._cut()
    if cut:
        _report_overflow(op.name, *cut[0], overflow)
    return launched


def _report_overflow(op: str, k: int, got: tuple, true: tuple, policy: str) -> None:
    axis = next(a for a, (g, t) in enumerate(zip(got, true)) if g != t)
    lost = lost_elements(got, true)
    if policy == "error":
        raise CapacityOverflowError(op, got[axis], true[axis],
                                    f"(output {k}; launch with a larger size attr)", lost=lost)
    warn_once(f"{op}: launch output {k} truncated to {got}; true shape {true}; {lost} elements "
              f"lost (DynArray.lost(); LaunchResult.true_shapes reports it)")
