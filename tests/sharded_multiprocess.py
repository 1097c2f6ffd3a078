"""One of two processes of a sharded-table run (``jax.distributed`` on 127.0.0.1, gloo).

``tests/test_hashtable_sharded.py`` starts two of these:
``python tests/sharded_multiprocess.py PROCESS_ID PORT OUT_DIR`` with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``. Together they hold 8 devices; they
train a table sharded over all 8 with the same batches (:func:`batches`) through the
jitted, donated train step a user writes (:func:`train`), check a few global counts, and
save it to ``OUT_DIR/table``. The 8-device child of the same test
(``tests/sharded_checks.py``, ``two_processes_match_one_table``) then loads that
checkpoint and compares it with one unsharded table fed the same batches.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DIM = 4
SLOTS = 512
STEPS = 3


def batches():
    rng = np.random.default_rng(7)
    for _ in range(STEPS):
        keys = rng.integers(0, 300, 64).astype(np.int64)
        yield keys, rng.standard_normal((64, DIM)).astype(np.float32)


def train(table, state, ht):
    """The steps both runs take, jitted with table and state donated: insert (counter
    admission), then AdamW by slot; 64-bit ids enter as word pairs."""
    import jax

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(table, state, words, grads):
        table, _, info = ht.lookup_or_insert(table, words, filter_mode="counter",
                                             filter_freq=2)
        table, state = ht.apply_adam_w(table, state, None, grads, lr=0.1, weight_decay=0.01,
                                       slots=info.slots)
        return table, state, info

    for keys, grads in batches():
        table, state, info = step(table, state, ht.words.as_words(keys), grads)
    return table, state, info


def main(process_id: int, port: int, out: str) -> None:
    import jax

    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
    import jaxops.hashtable as ht

    assert jax.process_count() == 2 and len(jax.devices()) == 8, jax.devices()
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("shard",))
    table = ht.init_sharded_table(SLOTS, DIM, mesh, "shard", initializer_mode="constant",
                                  constant_value=0.5)
    table, state, info = train(table, ht.adam_w_init(table), ht)
    assert int(info.route.lost) == 0 and int(info.unplaced) == 0
    ht.save(table, os.path.join(out, "table"))
    print(f"process {process_id}: live {int(table.live)}", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
