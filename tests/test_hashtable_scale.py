"""A call costs O(batch): compiled donated steps hold nothing of the table's size but the
table's own (aliased) buffers, and donating a table with its optimizer state works."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht

SIZE, DIM, N = 100_003, 2, 64  # a size no batch-sized array can have


def _table():
    t = ht.init_table(SIZE, DIM, initializer_mode="constant", constant_value=0.5)
    t, _, _ = ht.lookup_or_insert(t, np.arange(N, dtype=np.int64))
    return t


def _keys():
    return ht.as_words(np.arange(N, dtype=np.int64) * 3, "test", "keys")


def _grads():
    return jnp.ones((N, DIM), jnp.float32)


def _state():
    return ht.adam_w_init(_table())


STEPS = {
    "lookup_or_insert": (lambda t, k: ht.lookup_or_insert(t, k)[:2], lambda: (_table(), _keys())),
    "find": (lambda t, k: ht.find(t, k), lambda: (_table(), _keys())),
    "locate": (lambda t, k: ht.locate(t, k), lambda: (_table(), _keys())),
    "evict": (lambda t, k: ht.evict(t, k), lambda: (_table(), _keys())),
    "import_": (lambda t, k: ht.import_(t, k, k, jnp.ones(N, jnp.uint8), _grads()),
                lambda: (_table(), _keys())),
    "apply_adam_w": (lambda t, s, k, g: ht.apply_adam_w(t, s, k, g, lr=0.1, weight_decay=0.01),
                     lambda: (_table(), _state(), _keys(), _grads())),
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_donated_step_has_no_table_sized_temporary(name):
    fn, args = STEPS[name]
    args = args()
    donate = {"apply_adam_w": (0, 1), "find": (), "locate": ()}.get(name, (0,))
    compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
    text = compiled.as_text()
    # Index and mask scratch over the slots would be s32 / pred arrays of SIZE entries.
    assert not re.findall(rf"(?:s32|pred|s8|u16)\[{SIZE}\]", text)
    mem = compiled.memory_analysis()
    # Temporaries: the batch's arrays only, far less than one byte per slot.
    assert mem.temp_size_in_bytes < SIZE, mem
    if name not in ("find", "locate"):
        table_bytes = sum(x.nbytes for x in jax.tree.leaves(args[0]) if x.size >= SIZE)
        assert mem.alias_size_in_bytes >= table_bytes, mem  # updated in place


def test_table_and_optimizer_state_can_be_donated():
    table = _table()
    state = ht.adam_w_init(table, amsgrad=True)
    leaves = jax.tree.leaves((table, state))
    ids = [x.unsafe_buffer_pointer() for x in leaves if x.size]
    assert len(set(ids)) == len(ids)  # no buffer shared between two fields

    @jax.jit
    def step(table, state, keys):
        table, rows, info = ht.lookup_or_insert(table, keys)
        return (*ht.apply_adam_w(table, state, keys, rows, lr=0.1, weight_decay=0.0,
                                 amsgrad=True), info)

    step = jax.jit(step, donate_argnums=(0, 1))
    for _ in range(2):
        table, state, info = step(table, state, _keys())
    assert int(info.unplaced) == 0 and int(table.live) == N + N - N // 3 - 1
