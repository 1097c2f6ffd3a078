"""The whole recipe for training on hash embeddings: a jitted, donated train step, what the
tables report, the lifecycle call between steps, and a mesh.

A click model: two id features (``user``, ``item``: 64-bit ids drawn Zipf-like) on one
hash table, pooled, then a logistic head. The table is sized to fill in the middle of the
run; its load policy (``grow`` or ``evict``) acts between steps in
``EmbeddingCollection.maintain``, which reads what the jitted steps reported (ids inserted,
lost, routed). On several devices the table lies along a mesh axis (``MeshAxis``) and the
step is the same code.

With ``checkpoint_dir`` the whole train state (tables, their row optimizer state, the head
and its Adam state) is saved through an Orbax ``CheckpointManager`` every ``save_every``
steps, asynchronously (the next donated step runs while it is written), and a run that
finds a checkpoint there resumes from its latest step: the target is ``jax.eval_shape`` of
the state the script makes at the start, and a table that grew comes back at its saved
size. The resumed run ends bit for bit where an uninterrupted one does (tested).

Run ``python examples/training_recipe.py`` (one device), or with 8 host devices:
``XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/training_recipe.py``.
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jaxops.hashtable as ht  # noqa: E402
from jaxops.embedding import Bags, EmbeddingCollection, TableConfig  # noqa: E402

DIM = 8


def batches(steps: int, batch: int, seed: int = 0):
    """Per step: ``user`` and ``item`` ids (64-bit, Zipf-like over 10^6) and click labels
    that depend on the ids (so the model has something to learn)."""
    rng = np.random.default_rng(seed)
    vocab = rng.integers(1, 2**62, 1_000_000)
    for _ in range(steps):
        user, item = (vocab[np.minimum(rng.zipf(1.2, batch), vocab.size) - 1] for _ in range(2))
        labels = ((user ^ item) % 3 == 0).astype(np.float32)
        yield user.astype(np.int64), item.astype(np.int64), labels


def build(slots: int, policy: str, mesh: jax.sharding.Mesh | None):
    """The collection (one table for both features), the head's optimizer, the step."""
    placement = ht.MeshAxis(mesh, "shard") if mesh is not None else None
    coll = EmbeddingCollection([TableConfig(
        "ids", slots, DIM, ("user", "item"), ht.optim.adagrad(0.05), initializer=0.01,
        placement=placement, load_policy=policy, max_load_factor=0.8)])
    tx = optax.adam(0.01)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, user, item, labels):
        # 64-bit ids enter as word pairs (ht.words.as_words on the host): exact with x64 off.
        features = {"user": Bags.from_dense(jax.tree.map(lambda x: x[:, None], user)),
                    "item": Bags.from_dense(jax.tree.map(lambda x: x[:, None], item))}
        tables, looked = coll.lookup_or_insert(state["tables"], features)

        def loss(head, rows):
            pooled = coll.pool(looked, rows)
            logits = jnp.sum(pooled["user"] * pooled["item"], axis=1) * head["scale"] \
                + head["bias"]
            return optax.sigmoid_binary_cross_entropy(logits, labels).mean()

        value, (g_head, g_rows) = jax.value_and_grad(loss, argnums=(0, 1))(state["head"],
                                                                             looked.rows)
        updates, opt = tx.update(g_head, state["opt"], state["head"])
        tables = coll.apply_gradients(tables, looked, g_rows)
        return {"tables": tables, "head": optax.apply_updates(state["head"], updates),
                "opt": opt}, value

    def init(key):
        head = {"scale": jnp.float32(1.0), "bias": jnp.float32(0.0)}
        return {"tables": coll.init(key), "head": head, "opt": tx.init(head)}

    return coll, init, step


def train(steps: int = 40, batch: int = 256, slots: int = 2048, policy: str = "grow",
          devices: int | None = None, checkpoint_dir: str | None = None,
          save_every: int = 10) -> tuple[dict, dict]:
    """``(state, summary)`` after ``steps`` steps (resumed from ``checkpoint_dir``'s latest
    checkpoint if it has one; see the module docstring)."""
    devices = jax.devices()[:devices] if devices else jax.devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("shard",)) if len(devices) > 1 else None
    coll, init, step = build(slots, policy, mesh)
    state, losses, grown, evicted, lost = init(jax.random.key(0)), [], 0, 0, 0
    mngr = start = None
    if checkpoint_dir is not None:
        options = ocp.CheckpointManagerOptions(max_to_keep=2, cleanup_tmp_directories=True)
        mngr = ocp.CheckpointManager(os.path.abspath(checkpoint_dir), options=options)
        start = mngr.latest_step()
        if start is not None:  # resume: the saved tables' sizes, on this run's placement
            state = mngr.restore(start, args=ht.checkpoint.Restore(
                jax.eval_shape(lambda: init(jax.random.key(0)))))
    for n, (user, item, labels) in enumerate(batches(steps, batch), start=1):
        if start is not None and n <= start:
            continue  # done before the checkpoint
        state, loss = step(state, ht.words.as_words(user), ht.words.as_words(item), labels)
        losses.append(float(loss))
        # Between steps: the table's load policy, from what the step reported.
        state["tables"], reports = coll.maintain(state["tables"])
        done = reports["ids"]
        grown, evicted, lost = grown + done.grown, evicted + done.evicted, lost + done.lost
        if mngr is not None and n % save_every == 0:
            mngr.save(n, args=ht.checkpoint.Save(state))  # asynchronous
    if mngr is not None:
        mngr.wait_until_finished()
        mngr.close()
    table = state["tables"]["ids"].table
    return state, {"devices": len(devices), "first_loss": float(np.mean(losses[:5])),
                   "last_loss": float(np.mean(losses[-5:])), "live": int(table.live),
                   "slots": table.bucket_size, "grown": grown, "evicted": evicted,
                   "lost": lost, "route_capacity": getattr(table, "route_capacity", None),
                   "compiles": step._cache_size(), "resumed_at": start}


def main(**kwargs) -> dict:
    """The summary of :func:`train`."""
    return train(**kwargs)[1]


if __name__ == "__main__":
    for policy in ("grow", "evict"):
        print(policy, main(policy=policy))
