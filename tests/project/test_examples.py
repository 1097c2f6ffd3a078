"""Every example runs (small sizes) and produces sane results."""

import functools
import importlib.util
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.embedding import Lookup
from tests.helpers.util import ROOT

EXAMPLES = os.path.join(ROOT, "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_detection_pipeline():
    out = load("detection_pipeline").main(images=3)
    assert out["onnx_counts"] == out["trt_counts"]   # both routes keep the same detections here
    assert all(n >= 1 for n in out["onnx_counts"])


def test_hash_embedding_training():
    out = load("hash_embedding_training").main(chunks=2, bucket_size=8192)
    assert out["losses"][1] < out["losses"][0]
    assert out["grad_error"] == 0.0 and out["checkpoint_identical"]
    assert sum(out["exported"]) == out["live"]      # incremental exports cover every live key


def test_golden_data(tmp_path):
    out = load("golden_data").main(str(tmp_path))
    assert out["nonzero_matches_numpy"] and all(os.path.exists(p) for p in out["paths"])
    assert out["compare_passed"]


def test_capacity_tuning(tmp_path):
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "cap.png")
    out = load("capacity_tuning").main(images=48, plot_path=path)
    assert 0 < out["capacity"] <= 80 and out["saving"] > 0
    assert os.path.getsize(path) > 1000
    assert np.isfinite(out["observed_overflow"])


def test_sharded_embedding():
    out = load("sharded_embedding").main(steps=20, batch=128)  # the suite's one device
    assert out["last_loss"] < out["first_loss"]
    assert out["same_after_reshard"] and out["live"] > 0
    # One device: every key goes to it, each distinct id of a step once (Zipf ids repeat).
    distinct = max(len(np.unique(ids)) for ids, _ in load("sharded_embedding").batches(20, 128))
    assert out["route_capacity"] == 1 << (distinct - 1).bit_length() < 128  # a power of two


RECIPE = dict(batch=128, slots=512, policy="grow")  # fills at once, grows twice in 12 steps


@pytest.fixture(scope="module")
def recipe():
    """The training recipe, its collection and jitted step made once for its runs here (as
    one training script would: each table size is traced once, not once a run), and its
    uninterrupted 12-step grow run."""
    module = load("training_recipe")
    module.build = functools.cache(module.build)
    return module, *module.train(steps=12, **RECIPE)


def test_training_recipe_grows(recipe):
    _, _, out = recipe
    assert out["lost"] == 0 and out["last_loss"] < out["first_loss"]
    assert out["grown"] >= 1 and out["slots"] > 512 and out["compiles"] == 1 + out["grown"]


def test_training_recipe_evicts():
    out = load("training_recipe").main(steps=16, batch=128, slots=1024, policy="evict")
    assert out["lost"] == 0 and out["last_loss"] < out["first_loss"]
    assert out["evicted"] > 0 and out["slots"] == 1024 and out["compiles"] == 1


def test_training_recipe_resumes_from_its_checkpoint_bit_for_bit(recipe, tmp_path):
    """Issues 27/28 together: 8 steps saved every 4 (the table grows before), then a run
    resumes from the checkpoint and ends where an uninterrupted 12-step run does."""
    module, whole, _ = recipe
    _, first = module.train(steps=8, checkpoint_dir=str(tmp_path), save_every=4, **RECIPE)
    assert first["grown"] >= 1 and first["slots"] > 512  # the checkpoint holds a grown table
    resumed, out = module.train(steps=12, checkpoint_dir=str(tmp_path), **RECIPE)
    assert out["resumed_at"] == 8
    chex.assert_trees_all_equal(resumed, whole)


def test_click_model(tmp_path):
    module = load("click_model")
    rng = np.random.default_rng(0)  # the rank AUC against counting every (positive, negative) pair
    y, scores = rng.random(300) < 0.3, rng.integers(0, 20, 300).astype(float)  # many ties
    diff = scores[y][:, None] - scores[~y][None, :]
    assert module.auc(y, scores) == pytest.approx(np.mean((diff > 0) + 0.5 * (diff == 0)))

    path = str(tmp_path / "loss.png")
    out = module.main(quick=True, plot_path=path, verbose=False)
    hashed, dense = out["results"]
    assert hashed["traces"] == dense["traces"] == 1      # one compile each for all the steps
    assert hashed["lost_ids"] == 0 and hashed["live"] == out["distinct_train_ids"]
    row = 2 * 4 * module.QUICK.dim                      # a dense row: values + Adagrad sums
    assert hashed["memory_bytes"] - row < dense["memory_bytes"] <= hashed["memory_bytes"]
    for r in (hashed, dense):                            # both learn something in 40 steps
        assert r["logloss"] < out["constant_logloss"] - 0.01 and r["auc"] > 0.65
    assert out["plot"] is None or os.path.getsize(path) > 1000


def test_click_model_dense_baseline_takes_the_hash_models_adagrad_steps():
    module = load("click_model")
    table = ht.init_table(64, 4, initializer_mode="constant", constant_value=0.5)
    slots = jnp.array([3, 9, 3, 20], jnp.int32)  # the optimizer reads slots only, not keys
    opt = ht.optim.adagrad(0.2, initial_accumulator_value=1e-3)
    dense = module.HashedDenseEmbeddings(64, 4, 0.2, 1e-3)
    hashed = (table, opt.init(table))
    state = (table.values, jax.tree.map(jnp.array, dense.tx.init(table.values)))
    looked = Lookup({}, {"user": slots}, {"user": None}, {})
    update = jax.jit(lambda state, g: dense.apply_gradients(state, looked, g))  # one compile
    for k in range(2):  # twice: the second step reads the accumulators the first wrote
        grads = jnp.arange(16.0).reshape(4, 4) / (10 + k)   # key 3 twice: summed
        hashed = opt.update(*hashed, slots, grads)
        state = update(state, {"user": grads})
    chex.assert_trees_all_close(state[0], hashed[0].values, rtol=1e-6)


def test_click_model_plot_without_matplotlib_says_so(monkeypatch, capsys, tmp_path):
    module = load("click_model")
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import fails
    assert module.plot([], 0.4, str(tmp_path / "x.png")) is None
    assert "no matplotlib" in capsys.readouterr().out and not (tmp_path / "x.png").exists()
