"""A sharded table's training step on 8 host devices against the same step on 1 device.

Run ``python -m benchmarks [--quick] --only hashtable_sharded``. The step is
``lookup_or_insert`` + ``apply_adam_w`` by slot (jitted, table and state donated) on a
table of the same total slots and a batch of the same keys: once as a ``HashTable`` on one
device, once as a ``ShardedHashTable`` over 8 host devices (the batch split 8 ways,
routed with ``all_to_all``), with the default routing capacity (the device's batch slice:
nothing can overflow, each owner processes the whole batch's worth of lanes) and with the
capacity this batch needs (measured once: the smallest power of two at which neither the
lookup nor the update leaves a lane unrouted). Before timing, each pair's first step is
checked: both tables hold exactly the batch's ids, with the rows of numpy's Adam step. It
runs in a child process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must precede jax's import).

On a machine with a couple of CPU cores the 8 "devices" share those cores, so the ratio
measures the **overhead** of sharding (routing, the exchange, 8 smaller kernels), not a
speed-up; on real accelerators each shard runs on its own chip.
"""

from __future__ import annotations

import functools
import json
import sys

from benchmarks.common import Result, run_on_host_devices

def run(quick: bool = False) -> list[Result]:
    row = run_on_host_devices("hashtable_sharded", quick)
    name = f"sharded step, {row['batch'] // 1000}K keys, 8 host devices"
    note = "host devices share the CPU cores: overhead, not speed-up"
    return [Result(f"{name}, route_capacity={row['local']} (default)", row["sharded_s"],
                   "1 device", row["single_s"], note=note),
            Result(f"{name}, route_capacity={row['capacity']} (needed)", row["tuned_s"],
                   "1 device", row["tuned_single_s"], note=note)]


def _fitting_capacity(needed: int, unrouted) -> int:
    """The routing capacity this batch needs: the lookup's fullest buffer (``needed``)
    rounded up to a power of two, doubled while a step still leaves lanes unrouted
    (``unrouted(capacity)``). The update by slot routes every lane, duplicates included, so
    it can need more than the lookup, which routes distinct ids."""
    capacity = 1 << (needed - 1).bit_length()
    while unrouted(capacity):
        capacity *= 2
    return capacity


def _child(quick: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxops.hashtable as ht
    from benchmarks.common import adam_first_step, assert_table, compare

    slots, dim, batch = (1 << 16, 16, 4096) if quick else (1 << 21, 16, 65536)
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**62, slots // 4)
    ids = keys[np.minimum(rng.zipf(1.2, batch) - 1, keys.size - 1)].astype(np.int64)
    grads = jnp.asarray(rng.standard_normal((batch, dim)).astype(np.float32))

    @functools.partial(jax.jit, donate_argnums=(0, 1), static_argnums=4)
    def step(table, state, ids, grads, capacity=None):
        table, _, info = ht.lookup_or_insert(table, ids, route_capacity=capacity)
        return ht.apply_adam_w(table, state, None, grads, lr=1e-3, weight_decay=0.0,
                               slots=info.slots, route_capacity=capacity)

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("shard",))

    def fresh(placement):  # empty tables: each compare's check sees both sides' first step
        table = ht.init_table(slots, dim, initializer_mode="constant", placement=placement)
        return table, ht.adam_w_init(table)

    sharded = ht.MeshAxis(mesh, "shard")
    words = ht.words.as_words(ids, "benchmark", "ids")  # 64-bit ids enter jit as word pairs
    tuned = _fitting_capacity(
        int(ht.lookup_or_insert(fresh(sharded)[0], ids)[2].route.needed),
        lambda capacity: int(step(*fresh(sharded), words, grads, capacity)[0].unrouted))
    # numpy's first AdamW step (no decay) on the ids' zero rows, duplicates summed
    distinct, index = np.unique(ids, return_inverse=True)
    want = adam_first_step(np.zeros((distinct.size, dim), np.float32), index,
                           np.asarray(grads), 1e-3)

    def first_step(ours, peer):  # each side holds exactly the ids, rows as numpy's step
        for what, (table, _) in (("sharded", ours), ("single", peer)):
            assert_table(table, ids, what, want, rtol=1e-5, atol=1e-6)

    def looping(placement, capacity=None):
        box = [fresh(placement)]

        def call():
            box[0] = step(*box[0], words, grads, capacity)
            return box[0]
        return call

    repeats = 3 if quick else 7
    full = compare("step", looping(sharded), "single", looping(None), repeats=repeats,
                   warmup=2, check=first_step)
    fit = compare("step", looping(sharded, tuned), "single", looping(None),
                  repeats=repeats, warmup=2, check=first_step)
    return {"batch": batch, "sharded_s": full.ours_s, "single_s": full.peer_s,
            "tuned_s": fit.ours_s, "tuned_single_s": fit.peer_s, "capacity": tuned,
            "local": batch // len(jax.devices())}


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(_child(sys.argv[2] == "quick")))
