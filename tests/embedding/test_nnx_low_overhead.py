"""The NNX layer's low-overhead step (``nnx.split`` once, a jitted functional step that
merges; the README's and jaxops.nnx's recipe) trains exactly as ``nnx.jit`` does, compiles
once, and leaves the objects current after ``nnx.update``."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

import jaxops.hashtable as ht  # noqa: E402
import jaxops.nnx  # noqa: E402
from jaxops.embedding import Bags, EmbeddingCollection, TableConfig  # noqa: E402


class _Model(nnx.Module):
    def __init__(self, rngs):
        self.embed = jaxops.nnx.Embedding(EmbeddingCollection(
            [TableConfig("ids", 64, 4, ("user",), ht.optim.adagrad(0.1))]), rngs=rngs)
        self.head = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, features, rows, looked):
        return self.head(self.embed.pool(looked, rows)["user"])[:, 0]


def _train(model, optimizer, features, labels):
    looked = model.embed.lookup_or_insert(features)

    def loss_fn(model, rows):
        return optax.sigmoid_binary_cross_entropy(model(features, rows, looked), labels).mean()

    loss, (grads, row_grads) = nnx.value_and_grad(loss_fn, argnums=(0, 1))(model, looked.rows)
    optimizer.update(model, grads)
    model.embed.apply_gradients(looked, row_grads)
    return loss


def _fresh():
    model = _Model(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def test_split_merge_step_trains_as_nnx_jit_does():
    features = {"user": Bags.from_lengths(np.array([3, 4, 4, 9, 3]), np.array([2, 2, 1]))}
    labels = jnp.array([1.0, 0.0, 1.0])
    model, optimizer = _fresh()
    slow = nnx.jit(_train)
    want = [float(slow(model, optimizer, features, labels)) for _ in range(3)]

    fast_model, fast_opt = _fresh()
    graphdef, state = nnx.split((fast_model, fast_opt))

    @functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
    @chex.assert_max_traces(n=1)
    def step(graphdef, state, features, labels):
        model, optimizer = nnx.merge(graphdef, state)
        loss = _train(model, optimizer, features, labels)
        return nnx.state((model, optimizer)), loss

    got = []
    for _ in range(3):
        state, loss = step(graphdef, state, features, labels)
        got.append(float(loss))
    assert got == want  # bit for bit: the same program
    nnx.update((fast_model, fast_opt), state)
    chex.assert_trees_all_equal(fast_model.embed.state, model.embed.state)
    assert int(fast_model.embed.state["ids"].table.live) == 3
