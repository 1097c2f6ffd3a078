"""The native (C++ XLA FFI) kernels beside the xla kernels and the peer, in one run.

Each case times the jitted operator on ``backend="native"`` and on ``backend="xla"``, each
interleaved with its peer (onnxruntime, numpy) on the same inputs after checking its answer
(against the peer's, or numpy's where the peer is a speed baseline), and reports the median
and best-repeat ratio of each. Targets (issue 18) are judged on the native median ratio.
Run ``python -m benchmarks [--quick] --only native`` (default allocator settings, as users
have them; ``--hugepages`` opts into the glibc huge-page tunable). Without the native library the cases
run on xla only (a ``native kernels unavailable`` line says so).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import jaxops
from benchmarks.cases_nms import uniform_boxes
from benchmarks.common import (Check, Result, against, all_of, assert_table, compare,
                               holds_keys, same_result, table_rows)
from tests.helpers.cases.nms import ort_feeds, ort_session

DENSITY = 0.1


def _pair(name: str, ours: Callable[[str], Callable[[], Any]], peer_name: str,
          peer: Callable[[], Any], target: float | None, repeats: int,
          check: Check = same_result) -> list[Result]:
    """The case on each backend against the same peer, each checked first by ``check``
    (by default: the same arrays as the peer, an independent implementation)."""
    from jaxops import native as lib

    results = [compare(f"{name} [xla]", ours("xla"), peer_name, peer, None, repeats,
                       check=check)]
    if lib.available():
        results.insert(0, compare(f"{name} [native]", ours("native"), peer_name, peer, target,
                                  repeats, check=check))
    return results


def _nms(name, boxes, scores, max_out, iou, score_threshold, repeats, target):
    """NMS on each backend against onnxruntime's kernel, checked equal to its selection."""
    session = ort_session(0, score_threshold is not None)
    feeds = ort_feeds(boxes, scores, max_out, iou, score_threshold)
    dev = jax.device_put(boxes), jax.device_put(scores)

    def ours(backend):
        fn = jax.jit(functools.partial(jaxops.non_max_suppression, max_output_boxes_per_class=max_out,
                                       iou_threshold=iou, score_threshold=score_threshold,
                                       backend=backend))
        return lambda: fn(*dev)
    return _pair(name, ours, "onnxruntime NMS", lambda: session.run(None, feeds), target, repeats)


def nms_cases(rng, quick: bool, repeats: int) -> list[Result]:
    n_boxes = 1000 if quick else 5000
    results = _nms(f"ONNX NMS 1x1x{n_boxes} max100 IoU.5", uniform_boxes(rng, n_boxes),
                   rng.random((1, 1, n_boxes), dtype=np.float32), 100, 0.5, None, repeats, 1.0)
    b, c, n = (2, 5, 200) if quick else (8, 20, 1000)
    boxes = np.concatenate([uniform_boxes(rng, n) for _ in range(b)])
    return results + _nms(f"ONNX NMS {b}x{c}x{n} max50 score.05", boxes,
                          rng.random((b, c, n), dtype=np.float32), 50, 0.5, 0.05, repeats, 1.0)


def _compacted(want: np.ndarray, size: int) -> Check:
    """ours is numpy's ``want`` (values and actual shape, through ``jaxops.refresh``) in a
    buffer of ``size`` entries whose padding holds the fill value."""
    def check(ours, peer):
        if ours.max_shape != (size,):
            raise AssertionError(f"max shape {ours.max_shape}, expected ({size},)")
        against(want)(ours, peer)
    return check


def compaction_cases(rng, quick: bool, repeats: int) -> list[Result]:
    """flatnonzero and masked_select, each checked against numpy (``np.flatnonzero(mask)``,
    ``x[mask]``) before it is timed."""
    big = 1 << 16 if quick else 1 << 24
    mask = rng.random(big) < DENSITY
    dev_mask = jax.device_put(mask)
    tag = f"{big >> 20}M" if big >= 1 << 20 else f"{big >> 10}K"
    x = rng.standard_normal(big).astype(np.float32)
    dev_x = jax.device_put(x)
    cap = 1 << int(np.ceil(np.log2(big * DENSITY * 1.25)))  # a capacity with headroom
    results = []
    for size in (None, cap):  # None: the max-shape output (64 MB for 16M) is part of the bill
        results += _pair(f"flatnonzero {tag} bool 10% size={size}",
                         lambda b, size=size: (lambda f: lambda: f(dev_mask))(jax.jit(
                             lambda m: jaxops.flatnonzero(m, size=size, backend=b))),
                         "np.flatnonzero", lambda: np.flatnonzero(mask), 1.2, repeats,
                         _compacted(np.flatnonzero(mask), size or big))
        results += _pair(f"masked_select {tag} f32 10% size={size}",
                         lambda b, size=size: (lambda f: lambda: f(dev_x, dev_mask))(jax.jit(
                             lambda x, m: jaxops.masked_select(x, m, size=size, backend=b))),
                         "numpy x[mask]", lambda: x[mask], 1.0, repeats,
                         _compacted(x[mask], size or big))
    return results


def unique_cases(rng, quick: bool, repeats: int) -> list[Result]:
    u = rng.standard_normal(1 << (14 if quick else 20)).astype(np.float32)
    dev_u = jax.device_put(u)
    return _pair(f"unique {len(u) >> 10}K float32",
                 lambda b: (lambda f: lambda: f(dev_u))(jax.jit(lambda v: jaxops.unique(v, backend=b))),
                 "np.unique", lambda: np.unique(u), 1.0, repeats)


def hash_cases(rng, quick: bool, repeats: int) -> list[Result]:
    """Hash-table walks (issue 18): ``find`` of 1M present keys in a 2M-slot table (dim 8)
    on native and on xla walks, each against ``jnp.take`` of as many rows of a dense array
    of the table's size (target <= 1.5); ``lookup_or_insert`` of 1M new keys into the empty
    table, jitted, native walks against xla walks (target: >= 3x the rate, a time ratio
    <= 1/3). The walk path is fixed when a function is traced (``use_backend("xla")``), so
    each path's functions are compiled ahead, after clearing jit's caches."""
    import jax.numpy as jnp

    import jaxops.hashtable as ht
    from jaxops import native as lib

    size, batch, dim = (20_000, 10_000, 8) if quick else (2_000_000, 1_000_000, 8)
    keys = rng.choice(2**62, batch, replace=False).astype(np.int64) - 2**61
    init = rng.standard_normal((size, dim)).astype(np.float32)
    empty = ht.init_table(size, dim, sampled_values=init)
    new_keys = ht.words.as_words(keys, "benchmark", "keys")
    order = rng.permutation(keys)
    present = ht.words.as_words(order, "benchmark", "keys")
    dense, rows = jnp.asarray(init), jnp.asarray(rng.integers(0, size, batch).astype(np.int32))
    take = jax.jit(lambda d, i: jnp.take(d, i, axis=0))

    def traced(path):  # compiled ahead: jit caches (inner jits too) ignore use_backend
        jax.clear_caches()
        with jaxops.use_backend(path):
            insert = jax.jit(lambda t, k: ht.lookup_or_insert(t, k)[0]).lower(empty, new_keys)
            find = jax.jit(lambda t, k: ht.find(t, k)).lower(empty, present)
        return insert.compile(), find.compile()

    paths = ["native", "xla"] if lib.available() else ["xla"]
    fns = {p: traced(p) for p in paths}
    table = jax.block_until_ready(fns[paths[0]][0](empty, new_keys))
    assert_table(table, keys, f"the table find reads, inserted on the {paths[0]} walks")
    # find's reference: each key's row read from the slot arrays on the host, no probing
    want = against(table_rows(table, order))
    n = f"{batch / 1e6:g}M"
    results = [compare(f"hash find {n} keys, {size / 1e6:g}M slots [{p}]",
                       lambda f=fns[p][1]: f(table, present), "jnp.take rows",
                       lambda: take(dense, rows), 1.5 if p == "native" else None, repeats,
                       check=want)
               for p in paths]
    if len(paths) == 2:  # each side holds exactly the keys (numpy); both place them alike
        ins = compare(f"lookup_or_insert {n} new keys [native]",
                      lambda: fns["native"][0](empty, new_keys), "same on xla walks",
                      lambda: fns["xla"][0](empty, new_keys), 1 / 3, repeats,
                      check=all_of(holds_keys(keys, keys), same_result))
        ins.note = f"{ins.peer_s / ins.ours_s:.2f}x the xla walks' rate (target >= 3x)"
        results.append(ins)
    return results


def run(quick: bool = False, cases=(nms_cases, compaction_cases, unique_cases, hash_cases)
        ) -> list[Result]:
    """Every case of the issue's table (smaller inputs with ``quick``); ``cases`` picks some
    (``python -c "from benchmarks import native, common; common.report(native.run(cases=[
    native.unique_cases]), None)"``)."""
    from jaxops import native as lib

    if not lib.available():
        print(f"native kernels unavailable ({lib.why_unavailable()}): xla rows only")
    rng = np.random.default_rng(0)
    repeats = 5 if quick else 21
    return [r for case in cases for r in case(rng, quick, repeats)]
