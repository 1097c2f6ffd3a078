"""Tables written before keys were kept to a window (jaxops placed a key up to 4,096 slots
from its home) and CANN bucket arrays with keys beyond their window: refused in place with
an error that says why and what to do; a checkpoint loads onto another size, every key
placed again in its window. A table written now round-trips as before."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.core.errors import CheckpointError, OpArgumentError
from tests.helpers.hashtable_reference import WINDOW

SIZE, HOME = 2_048, 1_000


@functools.cache  # the tests only read it (4M candidate keys hashed once, not per test)
def _old_table():
    """WINDOW + 1 keys homed at HOME, as the wider bound placed them: the last one in slot
    HOME + WINDOW, one slot beyond its window (written into the arrays directly; the rest
    inserted by lookup_or_insert)."""
    cand = np.arange(1, 4_000_000, dtype=np.int64)
    home = np.asarray(jax.jit(ht.cann.home_slot, static_argnums=2)(
        *ht.words.as_words(cand), SIZE))
    keys = cand[home == HOME][:WINDOW + 1]
    t = ht.init_table(SIZE, 2, initializer_mode="constant", constant_value=0.5)
    t, _, info = ht.lookup_or_insert(t, keys[:WINDOW])
    assert int(info.unplaced) == 0
    last, at = ht.words.as_words(keys[WINDOW:]), HOME + WINDOW
    t = t.replace(key_lo=t.key_lo.at[at].set(last.lo[0]), key_hi=t.key_hi.at[at].set(last.hi[0]),
                  flags=t.flags.at[at].set(jnp.uint8(ht.cann.VALID)),
                  counter_lo=t.counter_lo.at[at].set(3), values=t.values.at[at].set(7.0),
                  live=t.live + 1, not_exported=t.not_exported + 1)
    return t, keys


def test_a_checkpoint_from_before_the_window_is_refused_in_place_and_loads_resized(tmp_path):
    t, keys = _old_table()
    path = os.fspath(tmp_path / "old")
    ht.save(t, path)
    with pytest.raises(CheckpointError, match=rf"slot {HOME + WINDOW} lies {WINDOW} slots past "
                       rf"its home slot, beyond its window \({WINDOW} slots\).*saved before keys "
                       r"were kept to a window.*load\(path, shard_size=\.\.\.\)"):
        ht.load(path)
    back = ht.load(path, shard_size=2 * SIZE)  # another size: every key placed again
    rows, found = ht.find(back, keys)
    assert bool(np.asarray(found).all()) and int(back.live) == WINDOW + 1
    assert np.asarray(rows)[-1].tolist() == [7.0, 7.0]  # its row came with it
    slots = np.asarray(ht.locate(back, keys))
    assert np.asarray(back.counter_lo)[slots[-1]] == 3


def test_cann_bytes_with_a_key_beyond_its_window_are_refused_saying_why():
    t, _ = _old_table()
    buf = ht.cann.to_cann_bytes(t)
    with pytest.raises(OpArgumentError, match=r"beyond its window .*CANN's walks go round the "
                       r"whole table.*ht\.import_"):
        ht.cann.from_cann_bytes(buf, 2)


def test_a_table_within_its_windows_round_trips(tmp_path):
    """The same keys but the one beyond: checkpoint and CANN bytes give the table back."""
    t, keys = _old_table()
    t, _, _ = ht.lookup_or_insert(ht.init_table(SIZE, 2, initializer_mode="constant",
                                                constant_value=0.5), keys)  # one unplaced
    assert int(t.dropped) == 1
    buf = ht.cann.to_cann_bytes(t)
    assert (ht.cann.to_cann_bytes(ht.cann.from_cann_bytes(buf, 2)) == buf).all()
    path = os.fspath(tmp_path / "new")
    ht.save(t, path)
    back = ht.load(path)
    for a, b in zip(jax.tree.leaves(t), jax.tree.leaves(back)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
