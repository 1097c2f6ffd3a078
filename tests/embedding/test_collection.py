"""EmbeddingCollection: salting, padding, pooled lookups and a training step vs a dense model."""

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.core.errors import OpArgumentError
from jaxops.embedding import Bags, EmbeddingCollection, TableConfig, feature_salt
from tests.helpers.util import CompileCounter

DIM, LR = 3, 0.25


def _normal(key, shape, dtype):
    return jax.random.normal(key, shape, dtype)


def _collection(share_ids=False, optimizer=None):
    return EmbeddingCollection([
        TableConfig("shared", 97, DIM, ("user", "item"), optimizer or ht.optim.sgd(LR),
                    initializer=_normal, pooling="mean", share_ids=share_ids),
        TableConfig("tags", 31, 2, ("tags",), ht.optim.adagrad(0.1), initializer=0.5,
                    pooling="sqrtn"),
    ])


def _batch(rng):
    user = rng.integers(0, 6, 9)
    item = np.concatenate([user[:3], rng.integers(2**40, 2**40 + 4, 4)])  # ids shared with user
    return {
        "user": Bags.from_lengths(user, np.array([3, 0, 4, 2])),
        "item": Bags.from_offsets(item, np.array([0, 2, 2, 5, 7]), rng.uniform(0.5, 2, 7)),
        "tags": Bags.from_dense(rng.integers(0, 3, (4, 3)),
                                mask=np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1], [1, 0, 0]])),
    }


def _salted(feature, ids, salt):
    if not salt:
        return np.asarray(ids, np.int64)
    return np.asarray(ids, np.int64) ^ np.array(feature_salt(feature), np.uint32).view(np.int64)[0]


def _valid_ids(bags):
    return ht.words.to_host_int64(bags.ids)[np.asarray(bags.valid)]


@pytest.mark.parametrize("share_ids", [False, True])
def test_shared_table_keys_are_salted_per_feature(share_ids):
    rng = np.random.default_rng(0)
    coll, batch = _collection(share_ids), _batch(rng)
    state, looked = coll.lookup_or_insert(coll.init(jax.random.key(0)), batch)
    user, item = (_valid_ids(batch[f]) for f in ("user", "item"))
    keys = np.concatenate([_salted("user", user, not share_ids),
                           _salted("item", item, not share_ids)])
    table = state["shared"].table
    assert int(table.live) == len(np.unique(keys))
    slots = np.asarray(ht.locate(table, keys))
    got = np.concatenate([np.asarray(looked.slots[f])[np.asarray(batch[f].valid)]
                          for f in ("user", "item")])
    chex.assert_trees_all_equal(got, slots)
    same_id = np.asarray(looked.slots["user"])[:3] == np.asarray(looked.slots["item"])[:3]
    assert same_id.all() == share_ids and (same_id.any() == share_ids)
    # Padding (masked tag ids) is never inserted, and is counted as filtered.
    tags = batch["tags"]
    assert int(state["tags"].table.live) == len(np.unique(_valid_ids(tags)))
    assert int(looked.info["tags"].filtered) == int((~np.asarray(tags.valid)).sum()) == 6
    assert (np.asarray(looked.slots["tags"])[~np.asarray(tags.valid)] == -1).all()


def _dense_reference(coll, state, batch, share_ids):
    """Rows of every (feature, id) read by key from the table; pooled and differentiated
    densely in float64 numpy (the gradient of sum(sin(pooled)) written out by hand),
    independent of the collection's code path."""
    table = state["shared"].table
    keys = {f: _salted(f, ht.words.to_host_int64(batch[f].ids), not share_ids) for f in ("user", "item")}
    vocab = np.unique(np.concatenate([k[np.asarray(batch[f].valid)] for f, k in keys.items()]))
    emb = np.asarray(ht.find(table, vocab)[0], np.float64)
    total, grad = 0.0, np.zeros_like(emb)
    for f in ("user", "item"):
        bags = batch[f]
        valid = np.asarray(bags.valid)
        idx = np.where(valid, np.searchsorted(vocab, keys[f]), 0)
        w = np.where(valid, 1.0 if bags.weights is None else np.asarray(bags.weights), 0.0)
        seg = np.asarray(bags.segment)
        onehot = (seg[None, :] == np.arange(bags.num_bags)[:, None]) * w[None, :]  # [bags, ids]
        denom = onehot.sum(1, keepdims=True)
        safe = np.where(denom > 0, denom, 1)
        pooled = np.where(denom > 0, (onehot @ emb[idx]) / safe, 0)
        total += np.sum(np.sin(pooled))
        # d sum(sin(pooled)) / d emb[idx_i] = w_i cos(pooled of i's bag) / denom of that bag
        np.add.at(grad, idx, onehot.T @ np.where(denom > 0, np.cos(pooled) / safe, 0))
    return vocab, emb, float(total), grad


def _train_step(coll):
    def step(state, batch):
        state, looked = coll.lookup_or_insert(state, batch)

        def loss(rows):
            pooled = coll.pool(looked, rows)
            return jnp.sum(jnp.sin(pooled["user"])) + jnp.sum(jnp.sin(pooled["item"])), pooled

        (value, pooled), grads = jax.value_and_grad(loss, has_aux=True)(looked.rows)
        return coll.apply_gradients(state, looked, grads), value
    return step


@pytest.mark.parametrize("share_ids", [False, True])
def test_training_step_equals_a_dense_model(share_ids):
    """Pooled loss and the SGD step on rows equal the dense embedding model's."""
    rng = np.random.default_rng(1)
    coll, batch = _collection(share_ids), _batch(rng)
    state = coll.init(jax.random.key(1))
    state, _ = coll.lookup_or_insert(state, batch)  # insert first, to read the rows by key
    vocab, emb, want_loss, want_grad = _dense_reference(coll, state, batch, share_ids)
    new_state, loss = _train_step(coll)(state, batch)  # eager: jit is the next test's
    assert np.isclose(float(loss), want_loss, rtol=1e-5)
    after = np.asarray(ht.find(new_state["shared"].table, vocab)[0])
    chex.assert_trees_all_close(after, emb - LR * want_grad, rtol=1e-5, atol=1e-6)
    assert int(new_state["shared"].table.live) == len(vocab)  # nothing inserted twice


def test_jitted_donated_training_loop_compiles_once():
    rng = np.random.default_rng(2)
    coll = _collection(optimizer=ht.optim.adam(0.01))
    state = coll.init(jax.random.key(2))
    step = jax.jit(_train_step(coll), donate_argnums=0)
    losses = []
    with CompileCounter() as compiles, warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*donated buffers were not usable.*")
        for _ in range(5):
            old = jax.tree.leaves(state)
            state, loss = step(state, _batch(rng))
            assert all(x.is_deleted() for x in old)
            losses.append(float(loss))
    assert compiles.count <= 1 and np.isfinite(losses).all()
    assert int(state["shared"].opt_state.count.max()) >= 2


def test_read_only_lookup_gives_zeros_for_absent_ids():
    coll = _collection()
    state = coll.init(jax.random.key(3))
    known = {"user": Bags.from_lengths(np.array([1, 2, 2]), np.array([3]))}
    state, _ = coll.lookup_or_insert(state, known)
    probe = {"user": Bags.from_lengths(np.array([1, 77, 0]), np.array([2]))}
    looked = coll.lookup(state, probe)  # reads only: the table keeps its two keys
    assert int(state["shared"].table.live) == 2 and looked.info["shared"] is None
    slots = np.asarray(looked.slots["user"])
    assert slots[0] >= 0 and slots[1] == -1 and slots[2] == -1
    chex.assert_trees_all_equal(np.asarray(looked.rows["user"])[1:], np.zeros((2, DIM), np.float32))
    pooled = coll.pool(looked)["user"]
    chex.assert_trees_all_close(np.asarray(pooled[0]), np.asarray(looked.rows["user"][0]) / 2)


def test_int64_ids_with_x64_on():
    with jax.enable_x64(True):
        coll = _collection()
        ids = jnp.array([2**50, 2**50, -7], jnp.int64)
        state, looked = coll.lookup_or_insert(coll.init(jax.random.key(4)),
                                    {"item": Bags.from_lengths(ids, jnp.array([3]))})
        assert int(state["shared"].table.live) == 2
        assert looked.slots["item"][0] == looked.slots["item"][1]


def test_bad_configurations_and_features_are_named():
    opt = ht.optim.sgd(0.1)
    with pytest.raises(OpArgumentError) as e:
        EmbeddingCollection([TableConfig("a", 8, 2, ("x",), opt),
                             TableConfig("b", 8, 2, ("x",), opt)])
    assert "'x'" in e.value.given
    with pytest.raises(OpArgumentError) as e:
        EmbeddingCollection([TableConfig("a", 8, 2, ("x",), opt, pooling="max")])
    assert e.value.arg == "pooling"
    with pytest.raises(OpArgumentError) as e:
        EmbeddingCollection([TableConfig("a", 8, 2, "x", opt)])
    assert e.value.arg == "a.features"
    coll = EmbeddingCollection([TableConfig("a", 8, 2, ("x",), opt)])
    state = coll.init(jax.random.key(0))
    with pytest.raises(OpArgumentError) as e:
        coll.lookup_or_insert(state, {"y": Bags.from_lengths(np.arange(2), np.array([2]))})
    assert e.value.arg == "features" and "'x'" in e.value.expected
    with pytest.raises(OpArgumentError) as e:
        coll.lookup_or_insert(state, {"x": np.arange(2)})
    assert e.value.arg == "features['x']"
