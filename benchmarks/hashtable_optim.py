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
from benchmarks.common import Result, compare


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

    adam = ht.optim.adam(1e-3)
    ours = _looping(jax.jit(adam.update, donate_argnums=(0, 1)),
                    (table, adam.init(table)), slots, grads)

    tx = optax.adam(1e-3)
    dense = jnp.array(table.values)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def dense_step(params, opt_state, slots, grads):
        g = jnp.zeros_like(params).at[slots].add(grads)
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    peer_dense = _looping(dense_step, (dense, tx.init(dense)), slots, grads)

    cann = jax.jit(lambda t, s, k, g: ht.apply_adam_w(t, s, k, g, lr=1e-3, weight_decay=0.0),
                   donate_argnums=(0, 1))
    table2 = jax.tree.map(jnp.array, table)
    # adam_w_init gives m and v one buffer, which cannot be donated twice: copy each leaf.
    cann_state = jax.tree.map(jnp.array, ht.adam_w_init(table2))
    peer_cann = _looping(cann, (table2, cann_state), ht.words.as_words(
        batch_keys, "benchmark", "keys"), grads)

    rowwise = ht.optim.rowwise_adagrad(1e-2)
    table3 = jax.tree.map(jnp.array, table)
    ours_rowwise = _looping(jax.jit(rowwise.update, donate_argnums=(0, 1)),
                            (table3, rowwise.init(table3)), slots, grads)

    rows = f"{size / 1e6:g}M x {dim}"
    return [
        compare(f"adam.update {n} slots", ours, f"optax.adam dense {rows}", peer_dense,
                repeats=repeats, note="O(batch) vs O(table)"),
        compare(f"adam.update {n} slots", ours, f"apply_adam_w {n} keys", peer_cann,
                repeats=repeats, note="by slot vs re-probing keys"),
        compare(f"rowwise_adagrad.update {n} slots", ours_rowwise, f"adam.update {n} slots",
                ours, repeats=repeats, note="1 vs 2*dim state floats a row"),
    ]
