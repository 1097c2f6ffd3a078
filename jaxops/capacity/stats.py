"""Capacity planning for data-dependent outputs: statistics, recommendations, metrics.

The theoretical maximum output (every element non-zero, every box kept) wastes memory and
time; real workloads use far less. Record the sizes a call site actually produces, then size
its capacity from them:

>>> stats = CapacityStats("demo/nms", theoretical_max=1000)
>>> stats.record([40, 52, 47, 61, 38, 55])
>>> cap = recommend(stats, policy="sigma", k=3.0, round_to="pow2")
>>> cap
128
>>> m = metrics(stats, cap)
>>> round(m.memory_saving, 3), m.overflow_rate
(0.872, 0.0)

Recording happens on the host (:meth:`CapacityStats.record`, :func:`record_tree` after a
refresh) or inside jit (:func:`record_in_jit`, an *unordered* ``io_callback`` carrying one
int32 per call: a small device→host copy and a Python call per step, not ordered against
other effects, so it does not serialise the program).

Overflow policies (``error``, ``truncate``, ``expand``, ``host``) live in
:mod:`jaxops.capacity.policy`.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import io_callback

from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError

_ROUNDINGS = ("pow2", 8, 128, None)


class CapacityStats:
    """The recorded output sizes of one call site (thread-safe, host side).

    Args:
      name: the call site's key (a user-given name, or :func:`site_key` of op + shapes).
      theoretical_max: the largest size the output can have; caps recommendations.
    """

    def __init__(self, name: str, theoretical_max: int | None = None):
        self.name = name
        self.theoretical_max = theoretical_max
        self._sizes: list[int] = []
        self._lock = threading.Lock()

    def record(self, sizes: int | Iterable[int]) -> None:
        """Adds one size or many (negative sizes are an error)."""
        arr = np.atleast_1d(np.asarray(sizes, np.int64)).reshape(-1)
        if arr.size and arr.min() < 0:
            raise OpArgumentError("CapacityStats.record", "sizes", "sizes >= 0", arr.min())
        with self._lock:
            self._sizes.extend(int(s) for s in arr)

    @property
    def sizes(self) -> np.ndarray:
        with self._lock:
            return np.asarray(self._sizes, np.int64)

    @property
    def count(self) -> int:
        return len(self._sizes)

    def _need_data(self) -> np.ndarray:
        s = self.sizes
        if s.size == 0:
            raise ValueError(f"CapacityStats {self.name!r}: nothing recorded yet")
        return s

    @property
    def mean(self) -> float:
        return float(self._need_data().mean())

    @property
    def std(self) -> float:
        """Population standard deviation (``ddof=0``)."""
        return float(self._need_data().std())

    @property
    def max(self) -> int:
        return int(self._need_data().max())

    @property
    def min(self) -> int:
        return int(self._need_data().min())

    def quantile(self, q: float | Sequence[float]) -> float | np.ndarray:
        """Quantile(s) of the recorded sizes (numpy's default linear interpolation)."""
        return np.quantile(self._need_data(), q)

    def histogram(self, bins: int | Sequence[int] = 20) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, edges)`` as :func:`numpy.histogram` returns them."""
        return np.histogram(self._need_data(), bins=bins)

    def __repr__(self) -> str:
        return f"CapacityStats({self.name!r}, count={self.count}, theoretical_max={self.theoretical_max})"


_stats_lock = threading.Lock()
_all_stats: dict[str, CapacityStats] = {}


def site_key(op: str, shapes: Sequence[Sequence[int]]) -> str:
    """The default call-site key: operator name plus input shapes, e.g. ``NonZero[(4, 5)]``."""
    return f"{op}[{', '.join(str(tuple(int(d) for d in s)) for s in shapes)}]"


def get_stats(name: str, theoretical_max: int | None = None) -> CapacityStats:
    """The process-wide statistics of call site ``name`` (created on first use)."""
    with _stats_lock:
        stats = _all_stats.get(name)
        if stats is None:
            stats = _all_stats[name] = CapacityStats(name, theoretical_max)
        elif stats.theoretical_max is None:
            stats.theoretical_max = theoretical_max
        return stats


def all_stats() -> list[CapacityStats]:
    with _stats_lock:
        return list(_all_stats.values())


def clear_stats() -> None:
    with _stats_lock:
        _all_stats.clear()


def dyn_size(d: DynArray, axis: int = 0) -> jax.Array:
    """The demanded size of a DynArray along its capacity ``axis``: the true size when the
    operator recorded one (so truncated calls still count what they needed)."""
    shape = d.actual_shape if d.true_shape is None else d.true_shape
    return shape[..., axis]


def record_tree(name: str, tree: Any, *, axis: int = 0, theoretical_max: int | None = None) -> None:
    """Host side: records the size of every DynArray in ``tree`` (batched ones per example)."""
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, DynArray))
    # Whole shape arrays, sliced here: an overflow policy has usually fetched them already,
    # and JAX keeps a fetched array's host copy, so this costs no second device round trip.
    shapes = jax.device_get([d.actual_shape if d.true_shape is None else d.true_shape
                             for d in leaves if isinstance(d, DynArray)])
    stats = get_stats(name, theoretical_max)
    for shape in shapes:
        stats.record(np.asarray(shape)[..., axis].reshape(-1))


def record_in_jit(name: str, d: DynArray, *, axis: int = 0,
                  theoretical_max: int | None = None) -> None:
    """Inside jit: records ``d``'s size through an unordered ``io_callback`` (see module doc)."""
    stats = get_stats(name, theoretical_max)
    io_callback(lambda s: stats.record(np.asarray(s)), None, dyn_size(d, axis), ordered=False)


def _round_up(value: float, round_to) -> int:
    v = max(int(math.ceil(value - 1e-9)), 1)
    if round_to == "pow2":
        return 1 << (v - 1).bit_length()
    if round_to is None:
        return v
    if isinstance(round_to, int) and round_to > 0:
        return -(-v // round_to) * round_to
    raise OpArgumentError("recommend", "round_to", f"one of {_ROUNDINGS} or a positive int",
                          repr(round_to))


def recommend(stats: CapacityStats, policy: str = "sigma", k: float = 3.0, q: float = 0.999,
              round_to: str | int | None = "pow2", theoretical_max: int | None = None) -> int:
    """A capacity for ``stats``' call site.

    ``policy="sigma"``: μ + kσ; ``policy="quantile"``: the ``q`` quantile. Rounded up to a
    power of two (``"pow2"``), a multiple of ``round_to`` (e.g. 8 or 128) or just to an
    integer (``None``); never above the theoretical maximum (and at least 1).
    """
    if policy == "sigma":
        target = stats.mean + k * stats.std
    elif policy == "quantile":
        if not 0.0 <= q <= 1.0:
            raise OpArgumentError("recommend", "q", "a value in [0, 1]", q)
        target = float(stats.quantile(q))
    else:
        raise OpArgumentError("recommend", "policy", "'sigma' or 'quantile'", repr(policy))
    cap = _round_up(target, round_to)
    limit = theoretical_max if theoretical_max is not None else stats.theoretical_max
    return min(cap, limit) if limit is not None else cap


@dataclasses.dataclass(frozen=True)
class CapacityMetrics:
    """How a capacity fits the recorded sizes."""

    capacity: int
    theoretical_max: int | None
    memory_saving: float | None  # 1 - capacity / theoretical max
    density: float               # mean actual size / capacity
    overflow_rate: float         # fraction of recorded calls with size > capacity


def metrics(stats: CapacityStats, capacity: int) -> CapacityMetrics:
    """Memory saving rate, valid-data density and overflow rate of ``capacity``."""
    if capacity <= 0:
        raise OpArgumentError("metrics", "capacity", "a positive int", capacity)
    sizes = stats._need_data()
    tmax = stats.theoretical_max
    return CapacityMetrics(
        capacity=int(capacity),
        theoretical_max=tmax,
        memory_saving=None if not tmax else 1.0 - capacity / tmax,
        density=float(np.minimum(sizes, capacity).mean() / capacity),
        overflow_rate=float(np.mean(sizes > capacity)),
    )


def report(stats: Iterable[CapacityStats] | CapacityStats | None = None, k: float = 3.0,
           round_to: str | int | None = "pow2", file=None) -> str:
    """Prints (and returns) a table of every call site: sizes, recommended capacity, metrics."""
    if stats is None:
        stats = all_stats()
    elif isinstance(stats, CapacityStats):
        stats = [stats]
    head = (f"{'call site':32s} {'n':>6s} {'mean':>8s} {'std':>7s} {'p99':>7s} {'max':>6s} "
            f"{'theo.max':>8s} {'capacity':>8s} {'saving':>7s} {'density':>7s} {'overflow':>8s}")
    lines = [head, "-" * len(head)]
    for s in stats:
        if not s.count:
            lines.append(f"{s.name:32s} {0:6d}  (nothing recorded)")
            continue
        cap = recommend(s, k=k, round_to=round_to)
        m = metrics(s, cap)
        saving = "-" if m.memory_saving is None else f"{m.memory_saving:6.1%}"
        lines.append(f"{s.name:32s} {s.count:6d} {s.mean:8.1f} {s.std:7.1f} "
                     f"{float(s.quantile(0.99)):7.1f} {s.max:6d} {str(s.theoretical_max or '-'):>8s} "
                     f"{cap:8d} {saving:>7s} {m.density:7.1%} {m.overflow_rate:8.2%}")
    text = "\n".join(lines)
    print(text, file=file)
    return text


def plot(stats: CapacityStats, path: str, k: float = 3.0, capacity: int | None = None,
         bins: int | None = None) -> str:
    """Writes a PNG histogram of the sizes with the μ+kσ line and the chosen capacity.

    Needs matplotlib (``pip install 'jaxops[plot]'``); without it, raises ImportError saying so.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("jaxops.capacity.plot needs matplotlib: pip install 'jaxops[plot]' "
                          "(or pip install matplotlib)") from e
    capacity = recommend(stats, k=k) if capacity is None else capacity
    sigma_line = stats.mean + k * stats.std
    if bins is None:  # one bar per size when the range is small, else 30 bins
        lo, hi = stats.min, stats.max
        bins = np.arange(lo, hi + 2) - 0.5 if hi - lo <= 100 else 30
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(stats.sizes, bins=bins, color="#4c72b0", alpha=0.8, label=f"{stats.count} calls")
    ax.axvline(sigma_line, color="#dd8452", linestyle="--", label=f"μ+{k:g}σ = {sigma_line:.1f}")
    ax.axvline(capacity, color="#c44e52", label=f"capacity = {capacity}")
    if stats.theoretical_max:
        ax.set_title(f"{stats.name}: output sizes (theoretical max {stats.theoretical_max})")
    else:
        ax.set_title(f"{stats.name}: output sizes")
    ax.set_xlabel("actual output size")
    ax.set_ylabel("calls")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = [
    "CapacityMetrics", "CapacityStats", "all_stats", "clear_stats", "dyn_size", "get_stats",
    "metrics", "plot", "record_in_jit", "record_tree", "recommend", "report", "site_key",
]
