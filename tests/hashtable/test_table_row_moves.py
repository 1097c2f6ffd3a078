"""The row moves of a training step (issue 39): native ``take_each`` / ``put_each`` / the
huge-page ``filled`` equal the xla ones bit for bit (any dtype, several arrays in one pass,
slots out of range), update in place, and a donated embedding step copies nothing of a
table's size on either path."""

import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops import native
from jaxops.embedding import Bags, EmbeddingCollection, TableConfig
from jaxops.hashtable._table.buffers import copied, filled
from jaxops.hashtable._walks.row_gather import put_each, take_each
from tests.helpers.walk_paths import on_path

needs_native = pytest.mark.skipif(not native.available(),
                                  reason=f"native kernels unavailable: {native.why_unavailable()}")
ROWS = 1 << 11


def _arrays():
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal((ROWS, 3)).astype(np.float32)),
            jnp.asarray(rng.integers(0, 2**32, ROWS, dtype=np.uint32)),
            jnp.asarray(rng.integers(0, 256, ROWS, dtype=np.uint8)),
            jnp.asarray(rng.standard_normal((ROWS, 5)).astype(jnp.bfloat16))]


def _moves(arrays, at, write):
    """Reads every array at ``at`` (in range), then writes rows back at ``write`` (an index
    past the end: no write), one jitted call on the path traced."""
    @jax.jit
    def go(arrays, at, write):
        got = take_each(arrays, at)
        return got, put_each(arrays, write, [g[::-1] for g in got])
    return go(arrays, at, write)


@needs_native
def test_native_row_moves_equal_xla():
    rng = np.random.default_rng(1)
    at = jnp.asarray(rng.integers(0, ROWS, 300, dtype=np.int32))
    write = jnp.asarray(np.where(rng.random(300) < 0.3, ROWS, rng.permutation(ROWS)[:300]),
                        jnp.int32)  # distinct slots, some not written
    native_out = on_path("native", lambda: _moves(_arrays(), at, write))
    xla_out = on_path("xla", lambda: _moves(_arrays(), at, write))
    chex.assert_trees_all_equal(native_out, xla_out)


@needs_native
def test_native_take_fills_zeros_out_of_range_and_put_is_in_place():
    a = jnp.arange(12, dtype=jnp.float32).reshape(6, 2)
    (got,) = take_each([a], jnp.array([5, -1, 6], jnp.int32))
    assert got.tolist() == [[10.0, 11.0], [0.0, 0.0], [0.0, 0.0]]
    put = jax.jit(lambda a: put_each([a], jnp.array([1, 9], jnp.int32), [jnp.ones((2, 2))])[0],
                  donate_argnums=0)
    hlo = put.lower(a).compile().as_text()
    assert not re.search(r"f32\[6,2\][^=]*copy\(", hlo)  # aliased: no copy of the table
    assert put(a).tolist()[:3] == [[0.0, 1.0], [1.0, 1.0], [4.0, 5.0]]


def test_filled_and_copied_hold_their_values():
    big = filled((1 << 20,), jnp.uint32, 7)  # 4 MB: huge pages on the native path
    assert big.dtype == jnp.uint32 and int(big[12345]) == 7 and int(big.sum()) == 7 << 20
    rows = filled((1 << 17, 8), jnp.float32, 0.25)
    chex.assert_trees_all_equal(copied(rows), rows)
    assert float(filled((3,), jnp.bfloat16, 1.5)[2]) == 1.5


@pytest.mark.parametrize("path", ["native", "xla"])
def test_a_donated_embedding_step_copies_nothing_of_the_tables_size(path):
    if path == "native" and not native.available():
        pytest.skip("native kernels unavailable")
    slots = 1 << 12
    coll = EmbeddingCollection([TableConfig("ids", slots, 4, ("a", "b"),
                                            ht.optim.adagrad(0.1), 0.01, key_dtype=np.int32)])

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, ids):
        feats = {f: Bags.from_dense(ids[i][:, None]) for i, f in enumerate("ab")}
        state, looked = coll.lookup_or_insert(state, feats)
        grads = {f: jnp.ones_like(r) for f, r in looked.rows.items()}
        return coll.apply_gradients(state, looked, grads)

    hlo = on_path(path, lambda: step.lower(jax.eval_shape(coll.init, jax.random.key(0)),
                                           jnp.zeros((2, 64), jnp.int32)).compile().as_text())
    copies = [line for line in hlo.splitlines()
              if " copy(" in line and re.search(rf"\[{slots}[,\]]", line.split("=")[1])]
    assert copies == []
