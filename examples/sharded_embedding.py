"""A hash-embedding model trained on a mesh: the table sharded by key over every device.

- ``init_sharded_table`` builds one local table per device (rows sharded, nothing gathered);
- each jitted step routes the batch's ids to their owner shards (``all_to_all``), inserts
  new ids there, and returns the rows; the loss gradient w.r.t. those rows goes back to the
  owners with ``apply_adam_w(..., slots=info.slots)`` (global slots);
- the step donates the table and the optimizer state, so XLA updates them in place;
- each step's routing need (``info.route.needed``) goes into ``jaxops.capacity`` statistics,
  from which a ``route_capacity`` for later runs is recommended;
- at the end the whole state (table, AdamW state, weights) is saved as one Orbax checkpoint
  and restored onto half the devices (or the same one): keys re-owned, each with its AdamW
  moments; the two tables answer alike.

    python examples/sharded_embedding.py            # 8 host devices on a CPU
    python examples/sharded_embedding.py --devices 1
"""

import functools
import os
import sys
import tempfile

if __name__ == "__main__" and "--devices" not in sys.argv[1:2]:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxops.hashtable as ht  # noqa: E402
from jaxops.capacity import CapacityStats, recommend  # noqa: E402

DIM = 8


def batches(steps: int, batch: int, seed: int = 0):
    """Ids drawn from a Zipf law over 64-bit ids; the label is a fixed function of the id."""
    rng = np.random.default_rng(seed)
    vocab = rng.integers(0, 2**62, 4096)
    for _ in range(steps):
        ids = vocab[np.minimum(rng.zipf(1.3, batch) - 1, vocab.size - 1)]
        yield ids.astype(np.int64), (ids % 3 == 0).astype(np.float32)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def train_step(table, state, w, ids, labels):
    table, rows, info = ht.lookup_or_insert(table, ids)

    def loss_of(rows, w):
        return jnp.mean(jnp.logaddexp(0.0, rows @ w) - labels * (rows @ w))  # logistic loss

    loss, (g_rows, g_w) = jax.value_and_grad(loss_of, argnums=(0, 1))(rows, w)
    table, state = ht.apply_adam_w(table, state, None, g_rows, lr=0.05, weight_decay=0.0,
                                   slots=info.slots)
    return table, state, w - 0.1 * g_w, loss, info.route.needed


def main(steps: int = 30, batch: int = 256, devices: int | None = None) -> dict:
    devices = jax.devices()[:devices] if devices else jax.devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("shard",))
    table = ht.init_sharded_table(16384, DIM, mesh, "shard", key=jax.random.key(0))
    state = ht.adam_w_init(table)
    # float32, on the mesh: as train_step returns it, so the first call's program serves
    # every step (a weak-typed or unplaced w would compile the step twice).
    w = jax.device_put(jnp.full((DIM,), 0.1, jnp.float32),
                       jax.sharding.NamedSharding(mesh, jax.P()))
    losses = []
    # The routing buffers' sizes, recorded per step: a route_capacity from these statistics
    # moves less data than the default (the whole batch slice per destination).
    route = CapacityStats("sharded_embedding.route", theoretical_max=batch // len(devices))
    for ids, labels in batches(steps, batch):
        words = ht.words.as_words(ids, "train_step", "ids")  # 64-bit ids stay exact with x64 off
        table, state, w, loss, needed = train_step(table, state, w, words, labels)
        losses.append(float(loss))
        route.record(int(needed))
    probe = next(batches(1, batch, seed=1))[0]
    with tempfile.TemporaryDirectory() as d:
        # The whole state in one checkpoint, restored onto half the devices: each key moves
        # to its new owner shard with its AdamW moments; the target gives the placement
        # (and the rows of free slots).
        ht.save({"table": table, "opt": state, "w": w}, os.path.join(d, "state"))
        half = jax.sharding.Mesh(np.array(devices[:max(1, len(devices) // 2)]), ("shard",))
        target = ht.init_sharded_table(16384, DIM, half, "shard", key=jax.random.key(0))
        back = ht.load(os.path.join(d, "state"),
                       {"table": target, "opt": ht.adam_w_init(target), "w": w})["table"]
    rows, found = ht.find(table, probe)
    rows_back, found_back = ht.find(back, probe)
    return {"shards": table.num_shards, "loaded_shards": back.num_shards,
            "first_loss": float(np.mean(losses[:5])), "last_loss": float(np.mean(losses[-5:])),
            "live": int(table.live), "route_capacity": recommend(route, policy="quantile",
                                                                 q=1.0),
            "same_after_reshard": bool(
                np.array_equal(np.asarray(rows), np.asarray(rows_back))
                and np.array_equal(np.asarray(found), np.asarray(found_back)))}


if __name__ == "__main__":
    count = int(sys.argv[2]) if sys.argv[1:2] == ["--devices"] else None
    print(main(devices=count))
