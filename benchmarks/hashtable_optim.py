"""Row optimizers (``jaxops.hashtable.optim``) side by side with their peers in one process.

Run ``python -m benchmarks [--quick] --only hashtable_optim``. Full size: a table of
1M slots x 16 floats, a batch of 64K slots drawn Zipf-like (many duplicates), every step
jitted with the table and state donated.

- ``adam.update`` by slot vs ``optax.adam`` on the whole dense ``[1M, 16]`` array (the
  dense model's step: scatter-add the batch's gradient into a zero table-sized gradient,
  then update every row). The row update is O(batch), the dense one O(table).
- ``adam.update`` by slot vs ``apply_adam_w`` (CANN's operator, which re-probes the keys).
- ``rowwise_adagrad.update`` vs ``adam.update``: what one accumulator per row saves.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxops.hashtable as ht
from benchmarks.common import Result, adam_first_step, against, compare


def _looping(step: Callable[..., tuple], carry: tuple, *args: Any) -> Callable[[], Any]:
    """A no-argument call that runs one donated step and keeps its output for the next."""
    box = [carry]

    def call():
        box[0] = step(*box[0], *args)
        return box[0]
    return call


def run(quick: bool = False) -> list[Result]:
    size, dim, batch = (20_000, 16, 2_000) if quick else (1_000_000, 16, 65_536)
    repeats = 3 if quick else 7
    rng = np.random.default_rng(0)
    keys = rng.choice(2**62, size // 2, replace=False).astype(np.int64)
    table = ht.init_table(size, dim, initializer_mode="constant", constant_value=0.01)
    table, _, info = jax.jit(lambda t, k: ht.lookup_or_insert(t, k))(  # 64-bit ids enter
        table, ht.words.as_words(keys, "benchmark", "keys"))          # jit as word pairs
    slots_of_keys = np.asarray(info.slots)
    pick = np.minimum(rng.zipf(1.2, batch) - 1, keys.size - 1)  # Zipf: heavy duplicates
    slots = jnp.asarray(slots_of_keys[pick])
    batch_keys = keys[pick]
    grads = jnp.asarray(rng.standard_normal((batch, dim)).astype(np.float32))
    n = f"{batch / 1000:g}K"

    # Every compare starts its sides from copies of this table, so its check sees each
    # side's first step, which numpy computes independently (below).
    def copied():
        return jax.tree.map(jnp.array, table)

    adam, rowwise, tx = ht.optim.adam(1e-3), ht.optim.rowwise_adagrad(1e-2), optax.adam(1e-3)
    adam_step = jax.jit(adam.update, donate_argnums=(0, 1))
    rowwise_step = jax.jit(rowwise.update, donate_argnums=(0, 1))

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def dense_step(params, opt_state, slots, grads):
        g = jnp.zeros_like(params).at[slots].add(grads)
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    cann = jax.jit(lambda t, s, k, g: ht.apply_adam_w(t, s, k, g, lr=1e-3, weight_decay=0.0),
                   donate_argnums=(0, 1))
    cann_keys = ht.words.as_words(batch_keys, "benchmark", "keys")

    def ours():
        t = copied()
        return _looping(adam_step, (t, adam.init(t)), slots, grads)

    def ours_rowwise():
        t = copied()
        return _looping(rowwise_step, (t, rowwise.init(t)), slots, grads)

    def peer_dense():
        dense = jnp.array(table.values)
        return _looping(dense_step, (dense, tx.init(dense)), slots, grads)

    def peer_cann():  # adam_w_init gives m and v one buffer, which cannot be donated twice
        t = copied()
        return _looping(cann, (t, jax.tree.map(jnp.array, ht.adam_w_init(t))), cann_keys, grads)

    start, at, g = np.asarray(table.values), np.asarray(slots), np.asarray(grads)
    adam_once = adam_first_step(start, at, g, 1e-3)
    # each side's rows after its first step within float rounding of numpy's
    first = functools.partial(against, view=_rows, peer_view=_rows, rtol=1e-5, atol=1e-6)
    rows = f"{size / 1e6:g}M x {dim}"
    return [
        compare(f"adam.update {n} slots", ours(), f"optax.adam dense {rows}", peer_dense(),
                repeats=repeats, note="O(batch) vs O(table)",
                check=first(adam_once, adam_once)),
        compare(f"adam.update {n} slots", ours(), f"apply_adam_w {n} keys", peer_cann(),
                repeats=repeats, note="by slot vs re-probing keys",
                check=first(adam_once, adam_once)),
        compare(f"rowwise_adagrad.update {n} slots", ours_rowwise(), f"adam.update {n} slots",
                ours(), repeats=repeats, note="1 vs 2*dim state floats a row",
                check=first(_rowwise_adagrad_first_step(start, at, g, 1e-2), adam_once)),
    ]


def _rows(out: tuple) -> Any:
    """The rows a step's output ``(table or dense params, state)`` holds."""
    return getattr(out[0], "values", out[0])


def _rowwise_adagrad_first_step(rows: np.ndarray, slots: np.ndarray, grads: np.ndarray,
                                lr: float, eps: float = 1e-8) -> np.ndarray:
    """numpy: ``rows`` after one row-wise Adagrad step from a zero accumulator, the
    gradients of equal slots summed first (``s = mean(g²)``, ``w -= lr·g/(√s + eps)``)."""
    g = np.zeros(rows.shape, np.float64)
    np.add.at(g, slots, grads)
    acc = np.mean(g * g, axis=-1, keepdims=True)
    return (rows - lr * g / (np.sqrt(acc) + eps)).astype(np.float32)
