"""A click model on hash embeddings against a memory-matched dense table, on synthetic data.

The world: three id features, ``user``, ``item`` and ``context`` (a bag of 0-4 ids), each
over ``vocab`` distinct random 64-bit ids (1e6 at full size) drawn Zipf-like, so a few ids
are everywhere and most are rare. A hidden ground truth decides clicks: every id has an
effect and a latent vector; the click probability is the logistic of the effects' sum plus
user·item and item·context interactions. The eval set is drawn from the same world (it
holds ids never seen in training, as real traffic does).

Two models with the same dense head (an MLP on the pooled embeddings and their products,
optax Adam), the same row optimizer (Adagrad, ``optax.adagrad``'s math on the touched rows)
and the same steps on the same batches:

- **hash**: an :class:`~jaxops.embedding.EmbeddingCollection`, one hash table shared by the
  three features (feature-salted 64-bit keys); every id seen gets its own row;
- **dense**: the hashing trick, a ``[rows, dim]`` array sized to the same bytes as the hash
  table plus its optimizer state (full runs add 1/8 and 1/64 of that); an id's row is
  ``murmur3(salted id) % rows``, so distinct ids collide.

Each training step is compiled once (ahead of time and called as compiled: a recompile
cannot happen unnoticed) and donates its state: XLA then updates table and optimizer state
in place, where without donation it copies every table-sized buffer on each step. Reported:
eval logloss and AUC (rank-based, numpy), steps/s, compile time, bytes of tables +
optimizer state, and the loss curves (with matplotlib, the ``plot`` extra). docs/embeddings.md
quotes a full run.

    python examples/click_model.py [--quick] [--plot PATH]
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxops.hashtable as ht
from jaxops.embedding import Bags, EmbeddingCollection, Lookup, TableConfig, pool, salt_ids
from jaxops.hashtable.optim import sum_by_slot

FEATURES = ("user", "item", "context")
CONTEXT_LEN = 4   # ids per context bag at most (0 to 4, uniformly)
LATENT = 4        # size of the hidden per-id vectors
EFFECT_STD, VECTOR_STD = 1.0, 0.5  # spread of the hidden per-id effects and vector entries
POOLING = "mean"


class Sizes(NamedTuple):
    """One run's sizes (``FULL``: about 3 minutes on 2 CPU cores; ``QUICK``: about 20 s of
    CPU, most of it compiling)."""

    vocab: int            # distinct ids per feature
    steps: int
    batch: int
    eval_size: int
    bucket_size: int      # slots of the shared hash table
    dim: int = 16
    hidden: int = 32
    zipf: float = 1.2
    evals: int = 8        # eval points on the loss curve
    eval_chunk: int = 8192


FULL = Sizes(vocab=1_000_000, steps=1500, batch=1024, eval_size=98_304, bucket_size=2**19)
QUICK = Sizes(vocab=20_000, steps=40, batch=256, eval_size=4096, bucket_size=2**14, evals=2,
              eval_chunk=1024)


# ---- the hidden world ---------------------------------------------------------------------

class World:
    """Ids, their hidden effects and vectors, and a sampler of labelled impressions."""

    def __init__(self, sizes: Sizes, seed: int = 0):
        rng = np.random.default_rng(seed)
        v = sizes.vocab
        self.ids, self.effect, self.vector = {}, {}, {}
        for f in FEATURES:
            ids = np.unique(rng.integers(-2**63, 2**63 - 1, int(v * 1.01) + 16, np.int64))
            ids = rng.permutation(ids[ids != -1])[:v]  # -1 is the padding key
            self.ids[f] = ids
            self.effect[f] = rng.normal(0.0, EFFECT_STD, v)
            self.vector[f] = rng.normal(0.0, VECTOR_STD, (v, LATENT))
        cdf = np.cumsum(np.arange(1, v + 1, dtype=np.float64) ** -sizes.zipf)
        self._cdf = cdf / cdf[-1]  # index r is the rank-r id (ids are random, so is the order)

    def _ranks(self, rng: np.random.Generator, shape: Any) -> np.ndarray:
        return np.minimum(np.searchsorted(self._cdf, rng.random(shape)), self._cdf.size - 1)

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``n`` impressions: int64 ids per feature, the context mask, clicks, true logits."""
        u, i = self._ranks(rng, n), self._ranks(rng, n)
        c = self._ranks(rng, (n, CONTEXT_LEN))
        mask = np.arange(CONTEXT_LEN) < rng.integers(0, CONTEXT_LEN + 1, n)[:, None]
        count = np.maximum(mask.sum(1), 1)
        ctx_effect = (self.effect["context"][c] * mask).sum(1) / count
        ctx_vector = (self.vector["context"][c] * mask[..., None]).sum(1) / count[:, None]
        vu, vi = self.vector["user"][u], self.vector["item"][i]
        logit = (-1.6 + self.effect["user"][u] + self.effect["item"][i] + ctx_effect
                 + np.sum(vu * vi, 1) + np.sum(vi * ctx_vector, 1))
        click = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
        return {"user": self.ids["user"][u], "item": self.ids["item"][i],
                "context": self.ids["context"][c], "context_mask": mask,
                "click": click.astype(np.float32), "true_logit": logit}


def device_batch(sample: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, Any]:
    """Rows ``lo:hi`` for a jitted step. 64-bit ids travel as ``Words64``: with x64 off,
    int64 numpy ids passed into ``jax.jit`` would be narrowed to int32; ``as_words`` splits
    them on the host into exact uint32 word pairs."""
    out = {f: ht.words.as_words(sample[f][lo:hi], "click_model", f) for f in FEATURES}
    out["context_mask"] = jnp.asarray(sample["context_mask"][lo:hi])
    out["click"] = jnp.asarray(sample["click"][lo:hi])
    return out


def bags_of(batch: dict[str, Any]) -> dict[str, Bags]:
    """The batch's features as bags (built inside the jitted step, from the words)."""
    single = {f: Bags.from_dense(ht.words.Words64(batch[f].lo[:, None], batch[f].hi[:, None]))
              for f in ("user", "item")}
    return {**single, "context": Bags.from_dense(batch["context"], mask=batch["context_mask"])}


# ---- metrics ------------------------------------------------------------------------------

def logloss(labels: Any, logits: Any) -> float:
    """Mean binary cross-entropy of ``logits`` (float64 on the host).

    >>> round(logloss([1.0, 0.0], [0.0, 0.0]), 4)
    0.6931
    """
    y, z = np.asarray(labels, np.float64), np.asarray(logits, np.float64)
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def auc(labels: Any, scores: Any) -> float:
    """Area under the ROC curve by ranks (Mann-Whitney U; tied scores share their mean rank).

    >>> auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]), auc([0, 1, 1], [0.5, 0.5, 0.9])
    (0.75, 0.75)
    """
    y, s = np.asarray(labels, bool), np.asarray(scores, np.float64)
    order = np.argsort(s, kind="stable")
    _, first, counts = np.unique(s[order], return_index=True, return_counts=True)
    ranks = np.empty(s.size)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based mean ranks
    pos, neg = int(y.sum()), int((~y).sum())
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


# ---- the two embedding stores (one interface: init, lookup_or_insert, lookup, pool, ...) ---

def hash_embeddings(sizes: Sizes, learning_rate: float, initial_accumulator: float
                    ) -> EmbeddingCollection:
    """One hash table for the three features (salted keys), Adagrad on the touched rows."""
    adagrad = ht.optim.adagrad(learning_rate, initial_accumulator_value=initial_accumulator)
    return EmbeddingCollection([TableConfig("ids", sizes.bucket_size, sizes.dim, FEATURES,
                                            adagrad, pooling=POOLING)])


class HashedDenseEmbeddings:
    """The hashing trick: a feature's id is salted like the collection's keys and hashed
    (the hash table's murmur3 home slot) into one dense ``[rows, dim]`` array; colliding
    ids share a row. ``optax.adagrad`` updates only the touched rows (duplicates summed),
    so it takes the same steps as the hash model's row Adagrad and costs O(batch)."""

    def __init__(self, rows: int, dim: int, learning_rate: float, initial_accumulator: float):
        self.rows, self.dim = rows, dim
        self.tx = optax.adagrad(learning_rate, initial_accumulator_value=initial_accumulator)

    def init(self, key: jax.Array) -> tuple[jax.Array, Any]:
        values = jax.random.uniform(key, (self.rows, self.dim), jnp.float32, -0.05, 0.05)
        return values, jax.tree.map(jnp.array, self.tx.init(values))  # own buffers: donatable

    def lookup_or_insert(self, state: Any, features: dict[str, Bags]) -> tuple[Any, Lookup]:
        return state, self.lookup(state, features)  # every id has a row: nothing to insert

    def lookup(self, state: Any, features: dict[str, Bags]) -> Lookup:
        values, _ = state
        rows, slots = {}, {}
        for f, bags in features.items():
            keys = salt_ids(f, bags.ids)  # the collection's keys of these ids
            slot = ht.cann.home_slot(keys.lo, keys.hi, self.rows)
            slots[f] = jnp.where(bags.valid, slot, -1)
            rows[f] = values[jnp.maximum(slots[f], 0)]
        return Lookup(rows, slots, dict(features), {})

    def pool(self, looked: Lookup, rows: dict[str, jax.Array] | None = None
             ) -> dict[str, jax.Array]:
        rows = looked.rows if rows is None else rows
        return {f: pool(rows[f], looked.bags[f], POOLING) for f in looked.bags}

    def apply_gradients(self, state: Any, looked: Lookup, grads: dict[str, jax.Array]) -> Any:
        values, opt = state
        slot, g, _ = sum_by_slot(jnp.concatenate([looked.slots[f] for f in looked.bags]),
                                 jnp.concatenate([grads[f] for f in looked.bags]))
        read, at = jnp.maximum(slot, 0), jnp.where(slot >= 0, slot, self.rows)
        per_row = lambda x: jnp.ndim(x) >= 1 and x.shape[0] == self.rows  # noqa: E731
        opt_rows = jax.tree.map(lambda x: x[read] if per_row(x) else x, opt)
        updates, opt_rows = self.tx.update(g, opt_rows, values[read])
        put = lambda x, r: x.at[at].set(r, mode="drop", unique_indices=True)  # noqa: E731
        opt = jax.tree.map(lambda x, r: put(x, r) if per_row(x) else r, opt, opt_rows)
        return put(values, values[read] + updates), opt


# ---- the shared dense head and the training step --------------------------------------------

def init_head(key: jax.Array, dim: int, hidden: int) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (6 * dim, hidden)) / np.sqrt(6 * dim),
            "b1": jnp.zeros(hidden), "w2": jax.random.normal(k2, (hidden,)) / np.sqrt(hidden),
            "b2": jnp.zeros(())}


def head(params: dict[str, jax.Array], pooled: dict[str, jax.Array]) -> jax.Array:
    """Logits from the pooled embeddings, their pairwise products and a one-layer MLP."""
    u, i, c = (pooled[f] for f in FEATURES)
    x = jnp.concatenate([u, i, c, u * i, i * c, u * c], axis=-1)
    return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def _bce(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))


class Model:
    """An embedding store (the collection, or the dense baseline) plus the shared head."""

    def __init__(self, name: str, store: Any, sizes: Sizes, head_lr: float = 2e-3):
        self.name, self.store, self.sizes = name, store, sizes
        self.tx = optax.adam(head_lr)
        self.traces = 0

    def init(self, key: jax.Array) -> tuple[Any, Any, Any]:
        k1, k2 = jax.random.split(key)
        params = init_head(k2, self.sizes.dim, self.sizes.hidden)
        return self.store.init(k1), params, self.tx.init(params)

    def step(self, state: tuple, batch: dict[str, Any]) -> tuple[tuple, dict[str, jax.Array]]:
        """lookup_or_insert → pool → head → grads w.r.t. the looked-up rows and
        the head → row optimizer by slot, optax for the head."""
        self.traces += 1  # runs only when JAX traces: counts compilations
        emb, params, opt = state
        emb, looked = self.store.lookup_or_insert(emb, bags_of(batch))

        def loss_fn(params, rows):
            return _bce(head(params, self.store.pool(looked, rows)), batch["click"])

        loss, (g_params, g_rows) = jax.value_and_grad(loss_fn, (0, 1))(params, looked.rows)
        emb = self.store.apply_gradients(emb, looked, g_rows)
        updates, opt = self.tx.update(g_params, opt, params)
        lost = sum((i.unplaced for i in looked.info.values() if i is not None), jnp.int32(0))
        return (emb, optax.apply_updates(params, updates), opt), {"loss": loss, "lost": lost}

    def predict(self, state: tuple, batch: dict[str, Any]) -> jax.Array:
        """Logits, reading the tables only (ids never seen: zero rows in the hash model)."""
        looked = self.store.lookup(state[0], bags_of(batch))
        return head(state[1], self.store.pool(looked))


def _nbytes(tree: Any) -> int:  # arrays or ShapeDtypeStructs
    return sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def _compiled(fn: Callable, *args: Any, donate: bool) -> tuple[Any, float]:
    t0 = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=0 if donate else ()).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def train(model: Model, train_data: dict, eval_data: dict, seed: int = 0) -> dict[str, Any]:
    """Trains ``model`` over ``train_data`` in order; evaluates at ``sizes.evals`` points."""
    sizes = model.sizes
    state = jax.jit(model.init)(jax.random.key(seed))  # one compile, not one per eager op
    memory = _nbytes(state[0])  # the embedding store: tables + row-optimizer state
    first = device_batch(train_data, 0, sizes.batch)
    # The step donates its whole state (tables, row-optimizer state, head, Adam state):
    # XLA then writes the touched rows in place instead of copying every table-sized buffer.
    step, compile_s = _compiled(model.step, state, first, donate=True)
    predict, predict_compile_s = _compiled(model.predict, state,
                                           device_batch(eval_data, 0, sizes.eval_chunk),
                                           donate=False)
    eval_every = max(sizes.steps // sizes.evals, 1)
    metrics, curve, train_s = [], [], 0.0
    for s in range(sizes.steps):
        t0 = time.perf_counter()
        state, m = step(state, device_batch(train_data, s * sizes.batch, (s + 1) * sizes.batch))
        metrics.append(m)
        if (s + 1) % eval_every == 0 or s + 1 == sizes.steps:
            jax.block_until_ready(state)
            train_s += time.perf_counter() - t0
            logits = np.concatenate([np.asarray(predict(state, device_batch(
                eval_data, lo, lo + sizes.eval_chunk)))
                for lo in range(0, sizes.eval_size, sizes.eval_chunk)])
            curve.append((s + 1, logloss(eval_data["click"], logits)))
        else:
            train_s += time.perf_counter() - t0
    host = jax.device_get(metrics)
    lost = int(sum(m["lost"] for m in host))
    out = {"name": model.name, "losses": np.array([m["loss"] for m in host]),
           "eval_curve": curve, "logloss": curve[-1][1], "auc": auc(eval_data["click"], logits),
           "steps_per_s": sizes.steps / train_s, "compile_s": compile_s,
           "predict_compile_s": predict_compile_s, "memory_bytes": memory,
           "traces": model.traces, "lost_ids": lost}
    if isinstance(model.store, EmbeddingCollection):
        return {**out, "live": int(state[0]["ids"].table.live), "rows": sizes.bucket_size}
    return {**out, "rows": model.store.rows}


def plot(results: list[dict], oracle: float, path: str) -> str | None:
    """Loss curves (train: moving average; eval: points) to ``path``; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: skipping the loss plot; pip install 'jaxops[plot]')")
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    colours = ("#4c72b0", "#dd8452", "#55a868", "#c44e52")
    for k, (r, colour) in enumerate(zip(results, colours)):
        window = max(len(r["losses"]) // 40, 1)
        if k < 2:  # train curves of the hash model and the memory-matched dense one
            smooth = np.convolve(r["losses"], np.ones(window) / window, mode="valid")
            ax.plot(np.arange(window, len(r["losses"]) + 1), smooth, color=colour, alpha=0.5,
                    label=f"{r['name']}: train (moving mean of {window} steps)")
        steps, ev = zip(*r["eval_curve"])
        ax.plot(steps, ev, "o-", color=colour, label=f"{r['name']}: eval")
    ax.axhline(oracle, color="grey", linestyle=":", label="the hidden true model on eval")
    ax.set_xlabel("training step")
    ax.set_ylabel("logloss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(quick: bool = False, plot_path: str | None = None, sizes: Sizes | None = None,
         row_lr: float = 0.2, row_acc: float = 1e-3, head_lr: float = 5e-3,
         dense_fractions: tuple[float, ...] | None = None, verbose: bool = True
         ) -> dict[str, Any]:
    """Trains the hash model and the dense baseline at ``dense_fractions`` of its memory
    (default: 1, 1/8 and 1/64; only 1 with ``quick``) and reports them.

    ``row_acc`` is Adagrad's initial accumulator: 1e-3, not optax's 0.1, because the loss
    is a batch mean, so a row's gradient is ~1e-3 and a 0.1 start would shrink its steps
    ~100x (measured at 300 steps, 2e5 ids: eval AUC 0.600 with 0.1, 0.642 with 1e-4).
    """
    sizes = sizes or (QUICK if quick else FULL)
    fractions = dense_fractions or ((1.0,) if quick else (1.0, 1 / 8, 1 / 64))
    world = World(sizes, seed=0)
    rng = np.random.default_rng(1)
    train_data = world.sample(sizes.steps * sizes.batch, rng)
    eval_data = world.sample(sizes.eval_size, rng)
    seen = sum(np.unique(train_data[f][train_data["context_mask"]] if f == "context"
                         else train_data[f]).size for f in FEATURES)
    models = [Model("hash", hash_embeddings(sizes, row_lr, row_acc), sizes, head_lr)]
    budget = _nbytes(jax.eval_shape(models[0].store.init, jax.random.key(0)))
    for f in fractions:
        rows = max(int(budget * f) // (8 * sizes.dim), 1)  # values + Adagrad sums, float32
        name = "dense" if f == 1 else f"dense 1/{round(1 / f)}"
        models.append(Model(name, HashedDenseEmbeddings(rows, sizes.dim, row_lr, row_acc),
                            sizes, head_lr))
    results = [train(m, train_data, eval_data) for m in models]
    oracle = {"logloss": logloss(eval_data["click"], eval_data["true_logit"]),
              "auc": auc(eval_data["click"], eval_data["true_logit"])}
    rate = float(train_data["click"].mean())
    constant = logloss(eval_data["click"], np.full(sizes.eval_size, np.log(rate / (1 - rate))))
    out = {"sizes": sizes, "results": results, "oracle": oracle, "constant_logloss": constant,
           "distinct_train_ids": seen}
    if verbose:
        _report(out)
    if plot_path:
        out["plot"] = plot(results, oracle["logloss"], plot_path)
    return out


def _report(out: dict[str, Any]) -> None:
    s, results = out["sizes"], out["results"]
    live = results[0]["live"]
    print(f"{s.steps} steps of {s.batch} impressions; vocab {s.vocab:,} ids per feature "
          f"(Zipf {s.zipf}); {out['distinct_train_ids']:,} distinct ids in training; "
          f"eval on {s.eval_size:,}")
    print(f"hash table: {live:,} live keys in {s.bucket_size:,} slots ({live / s.bucket_size:.0%})"
          f", {results[0]['lost_ids']} ids lost to a full table, none evicted")
    print(f"{'model':12s} {'rows':>9s} {'MiB':>6s} {'logloss':>8s} {'AUC':>7s} {'steps/s':>8s} "
          f"{'compile s':>10s} {'traces':>7s}")
    for r in results:
        print(f"{r['name']:12s} {r['rows']:9,d} {r['memory_bytes'] / 2**20:6.1f} "
              f"{r['logloss']:8.4f} {r['auc']:7.4f} {r['steps_per_s']:8.1f} "
              f"{r['compile_s']:10.2f} {r['traces']:7d}")
    o = out["oracle"]
    print(f"{'truth':12s} {'':9s} {'':6s} {o['logloss']:8.4f} {o['auc']:7.4f}   "
          "(the hidden model's own logits)")
    print(f"{'constant':12s} {'':9s} {'':6s} {out['constant_logloss']:8.4f} {0.5:7.4f}   "
          "(the training click rate for every impression)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (~20 s of CPU)")
    parser.add_argument("--plot", metavar="PATH", help="write the loss curves (PNG) here")
    args = parser.parse_args()
    main(quick=args.quick, plot_path=args.plot)
