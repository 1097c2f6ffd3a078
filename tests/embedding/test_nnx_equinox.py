"""The Flax NNX and Equinox layers: a jitted, donated training loop of 20 steps that traces and
compiles once, learns, and leaves the tables to the row optimizers; skipped without the
framework. Importing jaxops never needs either framework."""

import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxops.hashtable as ht
from jaxops.embedding import Bags, EmbeddingCollection, TableConfig
from tests.helpers.util import CompileCounter

STEPS, BAGS, IDS = 20, 8, 24


def _collection():
    return EmbeddingCollection([
        TableConfig("ids", 251, 4, ("user", "item"), ht.optim.rowwise_adagrad(0.3)),
        TableConfig("tags", 61, 2, ("tags",), ht.optim.adam(0.05), pooling="mean"),
    ])


def _batches(seed=0):
    """Clicks whose label is decided by the parity of the user ids: learnable by embeddings."""
    rng = np.random.default_rng(seed)
    for _ in range(STEPS):
        lengths = rng.integers(0, 4, BAGS)
        user = rng.integers(0, 10, IDS)
        labels = np.array([float(user[s:s + n].sum() % 2) for s, n in
                           zip(np.cumsum(lengths) - lengths, lengths)], np.float32)
        yield {"user": Bags.from_lengths(user, lengths),
               "item": Bags.from_lengths(rng.integers(0, 2**40, IDS), np.full(BAGS, 3)),
               "tags": Bags.from_dense(rng.integers(0, 5, (BAGS, 2)))}, jnp.asarray(labels)


def _concat(pooled):
    return jnp.concatenate([pooled["user"], pooled["item"], pooled["tags"]], axis=1)


def _run(step, carry):
    """20 steps; returns the losses and the compiles after the first step."""
    losses = []
    with warnings.catch_warnings(), CompileCounter() as compiles:
        warnings.filterwarnings("error", message=".*donated buffers were not usable.*")
        for i, (features, labels) in enumerate(_batches()):
            if i == 1:
                compiles.count = 0
            *carry, loss = step(*carry, features, labels)
            losses.append(float(loss))
    return carry, np.array(losses), compiles.count


def test_nnx_training_loop_traces_once():
    nnx = pytest.importorskip("flax.nnx")
    import jaxops.nnx

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.embed = jaxops.nnx.Embedding(_collection(), rngs=rngs)
            self.head = nnx.Linear(10, 1, rngs=rngs)

        def __call__(self, looked, rows):
            return self.head(_concat(self.embed.pool(looked, rows)))[:, 0]

    model = Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(0.05), wrt=nnx.Param)
    traces = []

    @nnx.jit(donate_argnums=(0, 1))
    def step(model, optimizer, features, labels):
        traces.append(1)
        looked = model.embed.lookup_or_insert(features)

        def loss_fn(model, rows):
            return optax.sigmoid_binary_cross_entropy(model(looked, rows), labels).mean()

        loss, (grads, row_grads) = nnx.value_and_grad(loss_fn, argnums=(0, 1))(model, looked.rows)
        optimizer.update(model, grads)
        model.embed.apply_gradients(looked, row_grads)
        return model, optimizer, loss

    (model, _), losses, compiles = _run(step, (model, optimizer))
    assert len(traces) == 1 and compiles == 0
    assert losses[-5:].mean() < losses[:5].mean()
    assert not jax.tree.leaves(nnx.state(model, nnx.Param).get("embed", {}))  # tables: no Param
    state = model.embed.state
    assert int(state["ids"].opt_state.skipped) > 0  # padding of empty user bags was skipped
    pooled = model.embed(next(_batches(1))[0])  # read-only call
    assert pooled["user"].shape == (BAGS, 4) and pooled["tags"].shape == (BAGS, 2)
    assert int(model.embed.state["ids"].table.live) == int(state["ids"].table.live)


def test_equinox_training_loop_traces_once():
    eqx = pytest.importorskip("equinox")
    import jaxops.equinox

    embed = jaxops.equinox.Embedding(_collection(), key=jax.random.key(0))
    head = eqx.nn.Linear(10, 1, key=jax.random.key(1))
    tx = optax.adam(0.05)
    opt_state = tx.init(eqx.filter(head, eqx.is_array))
    traces = []

    @eqx.filter_jit(donate="all")
    def step(head, embed, opt_state, features, labels):
        traces.append(1)
        embed, looked = embed.lookup_or_insert(features)

        def loss_fn(params):
            head, rows = params
            logits = jax.vmap(head)(_concat(embed.pool(looked, rows)))[:, 0]
            return optax.sigmoid_binary_cross_entropy(logits, labels).mean()

        loss, (grads, row_grads) = eqx.filter_value_and_grad(loss_fn)((head, looked.rows))
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(head, eqx.is_array))
        return (eqx.apply_updates(head, updates), embed.apply_gradients(looked, row_grads),
                opt_state, loss)

    (head, embed, _), losses, compiles = _run(step, (head, embed, opt_state))
    assert len(traces) == 1 and compiles == 0
    assert losses[-5:].mean() < losses[:5].mean()
    assert int(embed.state["tags"].opt_state.count.max()) == STEPS  # some tag in every batch
    pooled = embed(next(_batches(1))[0])
    assert pooled["item"].shape == (BAGS, 4)


def test_importing_jaxops_needs_no_framework():
    code = ("import sys; sys.modules['flax'] = sys.modules['equinox'] = None\n"
            "import jaxops, jaxops.embedding, jaxops.hashtable.optim\n"
            "assert 'flax.nnx' not in sys.modules\n"
            "try:\n    import jaxops.nnx\nexcept ImportError:\n    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
