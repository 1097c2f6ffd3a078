"""NonZero, Unique and MaskedSelect beside numpy and jax.numpy, jitted, after warm-up.

Each row times a jitted jaxops call against its peer on the same input, interleaved, after
checking that both give numpy's answer (padded to the capacity where a row has one). The
capacity matters on CPU: ``size=None`` means a 16M-entry output (64 MB of int32) that XLA's
CPU client allocates afresh on every call; buffers of 32 MB and more come from ``mmap``
without transparent huge pages, and page-faulting them alone costs about 0.3 ms/MB here
(numpy's own large arrays get huge pages). Rows with a realistic capacity show the
algorithm; rows with ``size=None`` show the full price. Run
``python -m benchmarks --only dynamic``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxops
from benchmarks.common import Result, agree, compare, same_result

DENSITY = 0.1


def _size_tag(n: int) -> str:
    """``16M`` / ``64K``: how the case names spell an input size."""
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def _capacity(n: int) -> int:
    """A capacity with headroom over the expected count: 1.25 x density, rounded up."""
    return 1 << int(np.ceil(np.log2(n * DENSITY * 1.25)))


def _padded(size: int, fill: int):
    """A view of numpy's exact answer as a fixed-size one: padded with ``fill`` to
    ``size`` entries (how ``jnp.nonzero`` / ``jnp.unique`` with ``size=`` answer)."""
    return lambda a: np.pad(a, (0, size - a.size), constant_values=fill)


def _nonzero_rows(n: int, repeats: int) -> list[Result]:
    mask = np.random.default_rng(0).random(n) < DENSITY
    dev = jnp.asarray(mask)
    cap = _capacity(n)
    peer = ("np.flatnonzero", lambda: np.flatnonzero(mask))
    ours = jax.jit(lambda m: jaxops.nonzero(m, size=cap))
    ours_full = jax.jit(lambda m: jaxops.nonzero(m))
    jnp_cap = jax.jit(lambda m: jnp.nonzero(m, size=cap, fill_value=-1))
    jnp_full = jax.jit(lambda m: jnp.nonzero(m, size=n, fill_value=-1))
    tag = _size_tag(n)
    rows = agree(peer_view=lambda a: a[None])  # nonzero of 1-D: [rank = 1, count]
    return [
        compare(f"NonZero {tag} bool 10% size={cap}", lambda: ours(dev), *peer, target=3.0,
                repeats=repeats, check=rows),
        compare(f"NonZero {tag} bool 10% size=None", lambda: ours_full(dev), *peer, target=3.0,
                repeats=repeats, note="64 MB output: allocation-bound on CPU", check=rows),
        compare(f"jnp.nonzero {tag} size={cap}", lambda: jnp_cap(dev), *peer, repeats=repeats,
                check=agree(peer_view=_padded(cap, -1))),
        compare(f"jnp.nonzero {tag} size={n}", lambda: jnp_full(dev), *peer, repeats=repeats,
                check=agree(peer_view=_padded(n, -1))),
    ]


def _masked_select_rows(n: int, repeats: int) -> list[Result]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(n).astype(np.float32)
    mask = rng.random(n) < DENSITY
    dx, dm = jnp.asarray(x), jnp.asarray(mask)
    cap = _capacity(n)
    peer = ("numpy x[mask]", lambda: x[mask])
    ours = jax.jit(lambda x, m: jaxops.masked_select(x, m, size=cap))
    ours_full = jax.jit(lambda x, m: jaxops.masked_select(x, m))
    fast = jax.jit(lambda x, m: jaxops.masked_select(x, m, size=cap, impl_mode="high_performance"))
    tag = _size_tag(n)
    return [
        compare(f"MaskedSelect {tag} f32 10% size={cap}", lambda: ours(dx, dm), *peer, target=3.0,
                repeats=repeats, check=same_result),
        compare(f"MaskedSelect {tag} high_performance", lambda: fast(dx, dm), *peer,
                repeats=repeats, check=same_result),
        compare(f"MaskedSelect {tag} f32 10% size=None", lambda: ours_full(dx, dm), *peer,
                target=3.0, repeats=repeats, note="64 MB output: allocation-bound on CPU",
                check=same_result),
    ]


def _unique_rows(n: int, repeats: int) -> list[Result]:
    rng = np.random.default_rng(2)
    inputs = {
        "all-distinct": rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, n,
                                     dtype=np.int32),
        "1000 values": rng.integers(0, 1000, n).astype(np.int32),
    }
    rows = []
    tag = _size_tag(n)
    ours = jax.jit(lambda x: jaxops.unique(x))
    ours_all = jax.jit(lambda x: jaxops.unique(x, return_index=True, return_inverse=True,
                                               return_counts=True))
    jnp_unique = jax.jit(lambda x: jnp.unique(x, size=n, fill_value=0))
    for label, x in inputs.items():
        dev = jnp.asarray(x)
        rows.append(compare(f"Unique {tag} int32 {label}", lambda: ours(dev), "np.unique",
                            lambda: np.unique(x), target=3.0, repeats=repeats,
                            check=same_result))
        rows.append(compare(f"Unique {tag} int32 {label}", lambda: ours(dev), "numpy sort+mask",
                            lambda: _sorted_unique(x), repeats=repeats,
                            note="numpy's AVX-512 sort vs XLA's CPU sort", check=same_result))
        rows.append(compare(f"Unique {tag} {label} +index/inverse/counts", lambda: ours_all(dev),
                            "np.unique(all outputs)",
                            lambda: np.unique(x, return_index=True, return_inverse=True,
                                              return_counts=True), repeats=repeats,
                            check=same_result))  # first-occurrence indices, as numpy's
        rows.append(compare(f"jnp.unique {tag} {label} size={n}", lambda: jnp_unique(dev),
                            "np.unique", lambda: np.unique(x), repeats=repeats,
                            check=agree(peer_view=_padded(n, 0))))
    return rows


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """numpy's sort-based unique of the values alone (np.unique uses a hash table)."""
    s = np.sort(x)
    return s[np.concatenate([[True], s[1:] != s[:-1]])]


def run(quick: bool = False) -> list[Result]:
    repeats = 3 if quick else 9
    big = 1 << 16 if quick else 1 << 24
    return (_nonzero_rows(big, repeats) + _masked_select_rows(big, repeats)
            + _unique_rows(1 << 14 if quick else 1 << 20, repeats))
