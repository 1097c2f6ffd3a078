"""One of two processes of a sharded-table run (``jax.distributed`` on 127.0.0.1, gloo).

``tests/hashtable/test_sharded.py`` starts two of these:
``python tests/helpers/sharded_multiprocess.py PROCESS_ID PORT OUT_DIR`` with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``. Together they hold 8 devices; they
train a table sharded over all 8 and its AdamW state with the same batches
(:func:`batches`) through the jitted, donated train step a user writes (:func:`train`),
check a few global counts, and save the whole state with an Orbax ``CheckpointManager``
(asynchronously) into ``OUT_DIR/run`` at step :data:`MID` and at the end. Then, still
together, they restore step :data:`MID` onto the same 8 shards and onto 4 (two devices of
each process: keys re-owned across processes), train on to the end, and check that both
equal the uninterrupted run. The 8-device child of the same test
(``tests/helpers/sharded_checks.py``) then restores these checkpoints in a fresh process: the last
against one unsharded table, and step :data:`MID` onto 2 shards, resumed.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

DIM = 4
SLOTS = 1024  # 128 a shard: far from the load limit (the policy runs in _lifecycle)
STEPS = 4
MID = 2  # the step whose checkpoint is resumed


def batches():
    rng = np.random.default_rng(7)
    for _ in range(STEPS):
        keys = rng.integers(0, 300, 64).astype(np.int64)
        yield keys, rng.standard_normal((64, DIM)).astype(np.float32)


@functools.cache
def _step(ht):
    """The jitted, donated train step (one function for every call of :func:`train`: each
    shape and placement is traced once, not once a call)."""
    import jax

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(table, state, words, grads):
        table, _, info = ht.lookup_or_insert(table, words, filter_mode="counter",
                                             filter_freq=2)
        table, state = ht.apply_adam_w(table, state, None, grads, lr=0.1, weight_decay=0.01,
                                       slots=info.slots)
        return table, state, info

    return step


def train(table, state, ht, steps=range(STEPS)):
    """The steps both runs take, jitted with table and state donated: insert (counter
    admission), then AdamW by slot; 64-bit ids enter as word pairs."""
    info = None
    for i, (keys, grads) in enumerate(batches()):
        if i in steps:
            table, state, info = _step(ht)(table, state, ht.words.as_words(keys), grads)
    return table, state, info


def fresh(ht, mesh):
    """The state every run starts from, on ``mesh`` (constant rows: free slots agree)."""
    table = ht.init_sharded_table(SLOTS, DIM, mesh, "shard", initializer_mode="constant",
                                  constant_value=0.5)
    return {"table": table, "opt": ht.adam_w_init(table)}


@functools.cache
def _gather(mesh):
    """A jitted copy replicated on every device of ``mesh`` (one function a mesh)."""
    import jax

    return jax.jit(lambda a: a, out_shardings=jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))


def keyed(state, ht) -> dict:
    """``{key: (counter, flags, row, m, v)}`` (bytes) of the live keys, gathered."""
    import jax

    t, opt = state["table"], state["opt"]
    get = lambda x: np.asarray(jax.device_get(_gather(t.mesh)(x)))  # noqa: E731
    flags = get(t.shards.flags).reshape(-1)
    keys = ht.words.to_host_int64(ht.words.Words64(get(t.shards.key_lo).reshape(-1),
                                                   get(t.shards.key_hi).reshape(-1)))
    counters = ht.words.to_host_int64(ht.words.Words64(get(t.shards.counter_lo).reshape(-1),
                                                       get(t.shards.counter_hi).reshape(-1)),
                                      signed=False)
    rows = [get(x).reshape(flags.size, -1) for x in (t.shards.values, opt.m, opt.v)]
    live = (flags & ht.cann.VALID) != 0
    live &= (flags & ht.cann.EVICTED) == 0
    return {int(k): (int(c), int(f), *(r[s].tobytes() for r in rows))
            for s, k, c, f in zip(np.flatnonzero(live), keys[live], counters[live], flags[live])}


def _lifecycle(ht, mesh) -> str:
    """The load policy across the processes: an eager insert past the limit grows the
    table (its check reads every shard's counts), and ``maintain`` between jitted steps
    grows it with its optimizer state, each key keeping its counter, flags, row and
    optimizer rows."""
    import jax

    table = ht.set_load_policy(ht.init_sharded_table(64, DIM, mesh, "shard",
                                                     initializer_mode="constant"),
                               policy="grow")
    keys = np.arange(200, dtype=np.int64)
    table, rows, info = ht.lookup_or_insert(table, keys)
    assert int(table.live) == 200 and table.bucket_size >= 256, (int(table.live), table.bucket_size)
    assert int(info.unplaced) == 0
    step = jax.jit(lambda t, s, w: (lambda t2, r, i: (t2, s, i))(*ht.lookup_or_insert(t, w)),
                   donate_argnums=(0, 1))
    opt = ht.adam_w_init(table)
    before = keyed({"table": table, "opt": opt}, ht)  # (gathered: no find program a size)
    table, opt, report = ht.maintain(table, [(opt, ht.adam_w_init)], headroom=table.bucket_size)
    assert report.grown == 1 and report.live == 200, report
    table, opt, info = step(table, opt[0], ht.words.as_words(np.arange(200, 264)))
    after = keyed({"table": table, "opt": opt}, ht)
    assert len(before) == 200 and len(after) == int(table.live) == 264, (len(after), len(before))
    assert {k: after[k] for k in before} == before, "a key lost its row, counter or state"
    return f"{64} -> {table.bucket_size} slots"


def main(process_id: int, port: int, out: str) -> None:
    import jax

    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
    import orbax.checkpoint as ocp

    import jaxops.hashtable as ht

    assert jax.process_count() == 2 and len(jax.devices()) == 8, jax.devices()
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("shard",))
    half = jax.sharding.Mesh(np.array(jax.devices()[::2]), ("shard",))  # 2 of each process
    start = fresh(ht, mesh)
    with ocp.CheckpointManager(os.path.join(out, "run")) as mngr:
        table, opt, info = train(start["table"], start["opt"], ht, range(MID))
        mngr.save(MID, args=ht.checkpoint.Save({"table": table, "opt": opt}))
        table, opt, info = train(table, opt, ht, range(MID, STEPS))  # while it commits
        assert int(info.route.lost) == 0 and int(info.unplaced) == 0
        mngr.save(STEPS, args=ht.checkpoint.Save({"table": table, "opt": opt}))
        mngr.wait_until_finished()
        want = keyed({"table": table, "opt": opt}, ht)
        for where, target in (("8 shards", jax.eval_shape(lambda: fresh(ht, mesh))),
                              ("4 shards", fresh(ht, half))):
            back = mngr.restore(MID, args=ht.checkpoint.Restore(target))
            t, o, _ = train(back["table"], back["opt"], ht, range(MID, STEPS))
            got = keyed({"table": t, "opt": o}, ht)
            assert got == want, f"resumed on {where}: {len(got)} vs {len(want)} keys differ"
        grown = _lifecycle(ht, mesh)
    # A forced save over a checkpoint, from both processes: staged beside it and exchanged
    # by the primary process once committed; the path then holds the new state only.
    forced = os.path.join(out, "forced")
    ht.save(fresh(ht, mesh), forced)  # (start was donated to the training steps)
    ht.save({"table": table, "opt": opt}, forced, force=True)
    back = ht.load(forced, jax.eval_shape(lambda: fresh(ht, mesh)))
    assert keyed(back, ht) == want, "the forced save did not replace the checkpoint whole"
    left = [n for n in os.listdir(out) if "tmp" in n or "jaxops-" in n]
    assert not left, f"temporaries left beside the checkpoint: {left}"
    print(f"process {process_id}: live {int(table.live)}, resumed on 8 and 4 shards, "
          f"grown {grown}", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
