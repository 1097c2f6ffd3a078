"""A sharded table's training step on 8 host devices against the same step on 1 device.

Run ``python -m benchmarks [--quick] --only hashtable_sharded``. The step is
``lookup_or_insert`` + ``apply_adam_w`` by slot (jitted, table and state donated) on a
table of the same total slots and a batch of the same keys: once as a ``HashTable`` on one
device, once as a ``ShardedHashTable`` over 8 host devices (the batch split 8 ways,
routed with ``all_to_all``), with the default routing capacity (the device's batch slice:
nothing can overflow, each owner processes the whole batch's worth of lanes) and with the
capacity this batch needs (measured once). It runs in a child process started with
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


def _child(quick: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxops.hashtable as ht
    from benchmarks.common import compare

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
    single = ht.init_table(slots, dim, initializer_mode="constant")
    sharded = ht.init_sharded_table(slots, dim, mesh, "shard", initializer_mode="constant")
    # The capacity this batch needs (its fullest buffer, rounded up to a power of two).
    needed = int(ht.lookup_or_insert(sharded, ids)[2].route.needed)
    tuned = 1 << (needed - 1).bit_length()
    boxes = {"single": (single, ht.adam_w_init(single)),
             "sharded": (sharded, ht.adam_w_init(sharded))}

    words = ht.words.as_words(ids, "benchmark", "ids")  # 64-bit ids enter jit as word pairs

    def looping(name, capacity=None):
        def call():
            boxes[name] = step(*boxes[name], words, grads, capacity)
            return boxes[name]
        return call

    repeats = 3 if quick else 7
    full = compare("step", looping("sharded"), "single", looping("single"), repeats=repeats,
                   warmup=2)
    fit = compare("step", looping("sharded", tuned), "single", looping("single"),
                  repeats=repeats, warmup=2)
    return {"batch": batch, "sharded_s": full.ours_s, "single_s": full.peer_s,
            "tuned_s": fit.ours_s, "tuned_single_s": fit.peer_s, "capacity": tuned,
            "local": batch // len(jax.devices())}


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(_child(sys.argv[2] == "quick")))
