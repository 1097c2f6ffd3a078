"""A DLRM-style training step on hash embeddings: against a dense table, as it fills, on 8 devices.

Run ``python -m benchmarks [--quick] --only dlrm``. The model is the researcher's: 13 dense
features, 26 categorical features with 64-bit ids drawn Zipf(1.1) over 10M ids each, one
row of dim 16 per id, batch 1024; an ``EmbeddingCollection`` (one table for the 26
features, salted keys, row Adagrad) and an MLP trained with Adam. Every step is one jitted
function with its whole state donated.

- **vs a dense table**: the same model with the hashing trick, a ``[slots, 16]`` jnp array
  indexed by ``murmur3(salted id) % slots`` and updated by ``optax.adagrad`` (a dense
  gradient of the whole table), at the same number of slots (2^22).
- **as the table fills**: a table sized to fill mid-run (load policy ``grow``, then
  ``evict``), with ``EmbeddingCollection.maintain`` after every step: the step time of the
  steps after the fill (growth steps, which recompile, left out) against the steps before
  (target: within 1.5x), and the ids lost (target: 0).
- **vs TorchRec** (where ``torchrec`` imports, or ``JAXOPS_TORCHREC_PYTHON`` names an
  interpreter where it does: see ``benchmarks/_torchrec_peer.py``): the functional step and
  the ``jaxops.nnx`` layer's step (its low-overhead pattern: ``nnx.split`` once, a jitted
  functional step that merges), each on the native and the xla walks, against TorchRec's
  ``FusedEmbeddingBagCollection`` step with torch on one thread, 2^22 slots (target: 0.7x).
- **8 devices**: the same step with the table on ``MeshAxis`` over 8 forced host devices
  against one device (target: within 4x), in a child process; the note says the bytes the
  exchange moves per step. The 8 "devices" share this machine's cores: the ratio measures
  the overhead of sharding, not a speed-up.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time

from benchmarks.common import Result, close_result, compare, run_on_host_devices

FEATURES, DENSE, DIM, VOCAB = 26, 13, 16, 10_000_000


def _batches(steps: int, batch: int, seed: int = 0):
    """Per step: dense features [batch, 13], 26 id columns (64-bit ids, Zipf(1.1) ranks
    over VOCAB mapped to random-looking ids), labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ranks = np.minimum(rng.zipf(1.1, (FEATURES, batch)), VOCAB).astype(np.uint64)
        ids = (ranks * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)  # a bijection of ranks
        dense = rng.standard_normal((batch, DENSE)).astype(np.float32)
        labels = (rng.random(batch) < 0.25).astype(np.float32)
        out.append((dense, ids, labels))
    return out


def _model(slots: int, policy: str = "grow", placement=None, max_load_factor: float = 0.9,
           route_capacity: int | None = None, optimizer=None):
    import jax
    import jax.numpy as jnp
    import optax

    import jaxops.hashtable as ht
    from jaxops.embedding import Bags, EmbeddingCollection, TableConfig

    names = tuple(f"c{i}" for i in range(FEATURES))
    coll = EmbeddingCollection([TableConfig(
        "ids", slots, DIM, names, optimizer or ht.optim.adagrad(0.05), 0.01, placement=placement,
        load_policy=policy, max_load_factor=max_load_factor, route_capacity=route_capacity)])
    tx = optax.adam(1e-3)

    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        mlp = {"bottom": jax.random.normal(k1, (DENSE, DIM)) * 0.1,
               "top": jax.random.normal(k2, ((FEATURES + 1) * DIM, 1)) * 0.05}
        return {"tables": coll.init(k3), "mlp": mlp, "opt": tx.init(mlp)}

    def features(ids):
        return {n: Bags.from_dense(ht.words.Words64(ids[0][i][:, None], ids[1][i][:, None]))
                for i, n in enumerate(names)}

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, dense, ids, labels):
        tables, looked = coll.lookup_or_insert(state["tables"], features(ids))

        def loss(mlp, rows):
            pooled = coll.pool(looked, rows)
            x = jnp.concatenate([dense @ mlp["bottom"]] + [pooled[n] for n in names], axis=1)
            return optax.sigmoid_binary_cross_entropy((x @ mlp["top"])[:, 0], labels).mean()

        value, (g_mlp, g_rows) = jax.value_and_grad(loss, argnums=(0, 1))(state["mlp"],
                                                                           looked.rows)
        updates, opt = tx.update(g_mlp, state["opt"], state["mlp"])
        tables = coll.apply_gradients(tables, looked, g_rows)
        return {"tables": tables, "mlp": optax.apply_updates(state["mlp"], updates),
                "opt": opt}, value

    return coll, init, step


def _torchrec_adagrad():
    """Row Adagrad as TorchRec's fused one starts: accumulator 0 (FBGEMM's), small eps."""
    import jaxops.hashtable as ht

    return ht.optim.adagrad(0.05, initial_accumulator_value=0.0, eps=1e-8)


def _nnx_model(slots: int, optimizer=None):
    """The same model as a Flax NNX module (``jaxops.nnx.Embedding`` + two ``nnx.Param``
    matrices, ``nnx.Optimizer`` with Adam) and its step in Flax's low-overhead form: the
    module split once, a jitted functional step that merges it (``nnx.jit`` traverses the
    module graph on every call: 1-5 ms of host time a step here)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import jaxops.hashtable as ht
    import jaxops.nnx
    from jaxops.embedding import Bags, EmbeddingCollection, TableConfig

    names = tuple(f"c{i}" for i in range(FEATURES))

    class Dlrm(nnx.Module):
        def __init__(self, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.embed = jaxops.nnx.Embedding(EmbeddingCollection([TableConfig(
                "ids", slots, DIM, names, optimizer or ht.optim.adagrad(0.05), 0.01)]),
                rngs=nnx.Rngs(k3))
            self.bottom = nnx.Param(jax.random.normal(k1, (DENSE, DIM)) * 0.1)
            self.top = nnx.Param(jax.random.normal(k2, ((FEATURES + 1) * DIM, 1)) * 0.05)

    def init(key):
        model = Dlrm(key)
        return nnx.split((model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)))

    @functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
    def step(graphdef, state, dense, ids, labels):
        model, opt = nnx.merge(graphdef, state)
        features = {n: Bags.from_dense(ht.words.Words64(ids[0][i][:, None], ids[1][i][:, None]))
                    for i, n in enumerate(names)}
        looked = model.embed.lookup_or_insert(features)

        def loss(model, rows):
            pooled = model.embed.pool(looked, rows)
            x = jnp.concatenate([dense @ model.bottom[...]] + [pooled[n] for n in names], 1)
            return optax.sigmoid_binary_cross_entropy((x @ model.top[...])[:, 0], labels).mean()

        value, (grads, row_grads) = nnx.value_and_grad(loss, argnums=(0, 1))(model, looked.rows)
        opt.update(model, grads)
        model.embed.apply_gradients(looked, row_grads)
        return nnx.state((model, opt)), value

    return init, step


def _nnx_looping(init, step, batches):
    """``_looping`` for the NNX step: (graphdef, state) threaded through."""
    import jax

    graphdef, state = init(jax.random.key(0))
    call = _looping(lambda st, *a: step(graphdef, st, *a), state, batches)
    return call


def _words(ids):
    """64-bit ids as the (lo, hi) uint32 columns a jitted step takes with x64 off."""
    import numpy as np

    pairs = np.ascontiguousarray(ids).view(np.uint32).reshape(*ids.shape, 2)
    return pairs[..., 0], pairs[..., 1]


def _dense_model(slots: int):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from jaxops.hashtable.cann import murmur3_x86_32
    from jaxops.embedding import feature_salt

    salts = np.array([feature_salt(f"c{i}") for i in range(FEATURES)], np.uint32)  # [26, 2]
    tx_rows, tx = optax.adagrad(0.05), optax.adam(1e-3)

    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        mlp = {"bottom": jax.random.normal(k1, (DENSE, DIM)) * 0.1,
               "top": jax.random.normal(k2, ((FEATURES + 1) * DIM, 1)) * 0.05}
        table = jnp.full((slots, DIM), 0.01, jnp.float32)
        return {"table": table, "rows_opt": tx_rows.init(table), "mlp": mlp,
                "opt": tx.init(mlp)}

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, dense, ids, labels):
        lo, hi = ids[0] ^ salts[:, :1], ids[1] ^ salts[:, 1:]
        rows = (murmur3_x86_32(lo, hi) % np.uint32(slots)).astype(jnp.int32)  # [26, batch]

        def loss(mlp, table):
            emb = [table[rows[i]] for i in range(FEATURES)]
            x = jnp.concatenate([dense @ mlp["bottom"]] + emb, axis=1)
            return optax.sigmoid_binary_cross_entropy((x @ mlp["top"])[:, 0], labels).mean()

        value, (g_mlp, g_table) = jax.value_and_grad(loss, argnums=(0, 1))(state["mlp"],
                                                                            state["table"])
        up, rows_opt = tx_rows.update(g_table, state["rows_opt"], state["table"])
        updates, opt = tx.update(g_mlp, state["opt"], state["mlp"])
        return {"table": optax.apply_updates(state["table"], up), "rows_opt": rows_opt,
                "mlp": optax.apply_updates(state["mlp"], updates), "opt": opt}, value

    return init, step


def _looping(step, state, batches, maintain=None, sharding=None):
    """A ``compare`` callable running one step per call (state threaded through); with
    ``sharding`` the batch is split over the mesh (data parallel), as a sharded run feeds it."""
    import jax

    put = (lambda x: x) if sharding is None else (lambda x: jax.device_put(x, sharding))
    batches = [(put(d), tuple(put(np_.T.copy()).T for np_ in _words(i)), put(lab))
               for d, i, lab in batches]
    box = {"state": state, "i": 0}

    def call():
        dense, ids, labels = batches[box["i"] % len(batches)]
        box["i"] += 1
        box["state"], loss = step(box["state"], dense, ids, labels)
        if maintain is not None:
            box["state"] = maintain(box["state"])
        return loss

    return call


def _vs_dense(quick: bool) -> Result:
    import jax

    slots, batch = (1 << 16, 256) if quick else (1 << 22, 1024)
    batches = _batches(8, batch)
    coll, init, step = _model(slots)
    dense_init, dense_step = _dense_model(slots)
    ours = _looping(step, init(jax.random.key(0)), batches)
    peer = _looping(dense_step, dense_init(jax.random.key(0)), batches)
    # The check sees each model's first step: every row starts at 0.01 and the MLPs alike,
    # so the hash embeddings' loss must be the dense model's (optax, a jnp table), and finite.
    return compare(f"DLRM step, {slots >> 20 or slots >> 10}{'M' if slots >= 1 << 20 else 'K'}"
                   " slots, batch 1024" if not quick else "DLRM step (quick)", ours,
                   "dense table + optax", peer, repeats=3 if quick else 7, warmup=2,
                   check=_same_loss)


def _same_loss(ours, peer) -> None:
    """Both losses finite and equal within float rounding (sums in another order)."""
    import numpy as np

    if not (np.isfinite(ours) and np.isfinite(peer)):
        raise AssertionError(f"losses {float(ours)} (ours), {float(peer)} (peer)")
    close_result(rtol=1e-5)(ours, peer)


def _filling(quick: bool, policy: str) -> Result:
    """Step times before and after a table fills (maintain after every step); the first
    step's loss is checked against the dense model's (the step the later ones build on)."""
    import jax

    slots, batch, steps = (1 << 15, 128, 30) if quick else (1 << 18, 1024, 60)
    batches = _batches(steps, batch, seed=1)
    coll, init, step = _model(slots, policy)
    dense_init, dense_step = _dense_model(slots)
    state, times, lost, grown, first_fill = init(jax.random.key(0)), [], 0, [], None
    for i, (dense, ids, labels) in enumerate(batches):
        t0 = time.perf_counter()
        state, loss = step(state, dense, _words(ids), labels)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - t0)
        if i == 0:  # checked before any timed step counts: the dense model's first loss
            _same_loss(loss, dense_step(dense_init(jax.random.key(0)), dense, _words(ids),
                                        labels)[1])
        state["tables"], done = coll.maintain(state["tables"])
        lost += done["ids"].lost
        if done["ids"].grown:
            grown.append(i + 1)  # the next step recompiles
        if first_fill is None and done["ids"].action != "none":
            first_fill = i + 1
    first_fill = first_fill or steps // 2
    before = [t for i, t in enumerate(times[1:first_fill], 1)]
    after = [t for i, t in enumerate(times) if i > first_fill and i not in grown]
    table = state["tables"]["ids"].table
    note = (f"{policy}: filled at step {first_fill}, {len(grown)} growths, final "
            f"{table.bucket_size} slots, {int(table.live)} live, {lost} ids lost")
    return Result(f"DLRM step after the table fills ({policy})", statistics.median(after),
                  "before it fills", statistics.median(before), target=1.5, note=note)


def _vs_torchrec(quick: bool) -> list[Result]:
    """The functional and NNX steps, native and xla walks, against TorchRec's fused step."""
    import gc

    import jax

    from benchmarks import _torchrec_peer as peer
    from jaxops.core.backend_table import use_backend

    slots, batch = (1 << 16, 256) if quick else (1 << 22, 1024)
    batches = _batches(8, batch)
    _, init, step = _model(slots, optimizer=_torchrec_adagrad())
    mlp = init(jax.random.key(0))["mlp"]  # both sides start from the same MLP
    nnx_init, nnx_step = _nnx_model(slots, _torchrec_adagrad())
    results = []
    for name, path in (("functional", "native"), ("functional", "xla"), ("NNX", "native"),
                       ("NNX", "xla")):
        with use_backend("xla" if path == "xla" else "auto"):
            ours = _looping(step, init(jax.random.key(0)), batches) if name == "functional" \
                else _nnx_looping(nnx_init, nnx_step, batches)
            jax.block_until_ready(ours())  # traced here, under the path's backend
        theirs_first = _fresh_first_loss(peer, slots, batches, mlp)
        theirs = peer.torchrec_step(slots, batches, jax.device_get(mlp))
        theirs()  # one step each before the check: both sides at the same step
        results.append(compare(
            f"DLRM step vs TorchRec, {name}, {path}", ours, "TorchRec fused EBC, 1 thread",
            theirs, target=0.7, repeats=5 if quick else 15, warmup=2,
            check=_near_loss, note=_first_loss_note(theirs_first)))
        del ours, theirs
        gc.collect()
    return results


def _fresh_first_loss(peer, slots, batches, mlp):
    """The first step's loss of a fresh jaxops model and a fresh TorchRec model, checked
    equal (rows 0.01 on both sides, the same MLP): the comparison is of one model."""
    import jax

    _, init, step = _model(slots, optimizer=_torchrec_adagrad())
    dense, ids, labels = batches[0]
    ours = step(init(jax.random.key(0)), dense, _words(ids), labels)[1]
    theirs = peer.torchrec_step(slots, batches[:1], jax.device_get(mlp))()
    _same_loss(ours, theirs)
    return float(ours), float(theirs)


def _near_loss(ours, peer) -> None:
    """Later steps: both losses finite and within 2% (the row Adagrads differ in their
    constants: TorchRec's accumulator starts at 0 with eps 1e-10, jaxops' at 0.1 with
    eps 1e-7; the first step, where they agree, is checked exactly before)."""
    import numpy as np

    if not (np.isfinite(ours) and np.isfinite(peer)) or abs(float(ours) - float(peer)) > \
            0.02 * abs(float(peer)):
        raise AssertionError(f"losses {float(ours)} (jaxops), {float(peer)} (TorchRec)")


def _first_loss_note(losses) -> str:
    return (f"first-step loss {losses[0]:.6f} (jaxops) = {losses[1]:.6f} (TorchRec), checked; "
            "steps after the first are timed")


def _torchrec_results(quick: bool) -> list[Result]:
    """The TorchRec rows: here when torchrec imports, else in ``JAXOPS_TORCHREC_PYTHON``'s
    interpreter (one process: both sides interleaved), else none (with how to install)."""
    import os
    import subprocess

    from benchmarks import _torchrec_peer as peer

    if peer.available():
        return _vs_torchrec(quick)
    python = os.environ.get("JAXOPS_TORCHREC_PYTHON")
    if not python:
        print("dlrm: torchrec is not installed: no TorchRec rows (see "
              "benchmarks/_torchrec_peer.py to install it beside jaxops and set "
              "JAXOPS_TORCHREC_PYTHON)")
        return []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get(
        "PYTHONPATH")))))
    proc = subprocess.run([python, "-m", "benchmarks.dlrm", "--torchrec",
                           "quick" if quick else "full"], env=env, cwd=root,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the TorchRec child of dlrm failed:\n{proc.stderr[-3000:]}")
    return [Result(**row) for row in json.loads(proc.stdout.strip().splitlines()[-1])]


def run(quick: bool = False) -> list[Result]:
    results = [_vs_dense(quick), *_torchrec_results(quick), _filling(quick, "grow"),
               _filling(quick, "evict")]
    row = run_on_host_devices("dlrm", quick)
    results.append(Result("DLRM step on 8 host devices", row["sharded_s"], "1 device",
                          row["single_s"], target=4.0, note=row["note"],
                          ours_best_s=row["sharded_best"], peer_best_s=row["single_best"]))
    return results


def _child(quick: bool) -> dict:
    import jax
    import numpy as np

    import jaxops.hashtable as ht

    slots, batch = (1 << 16, 256) if quick else (1 << 20, 1024)
    batches = _batches(8, batch)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("shard",))
    _, init1, step1 = _model(slots)
    coll8, init8, step8 = _model(slots, placement=ht.MeshAxis(mesh, "shard"))
    state8 = init8(jax.random.key(0))
    for dense, ids, labels in batches[:2]:  # two steps, then maintain sizes the routes
        state8, _ = step8(state8, dense, _words(ids), labels)
    state8["tables"], done = coll8.maintain(state8["tables"])
    capacity = done["ids"].route_capacity
    state1 = init1(jax.random.key(0))
    for dense, ids, labels in batches[:2]:  # the same two steps: both sides' states alike
        state1, _ = step1(state1, dense, _words(ids), labels)
    # the check sees the third step of each, on batches[0] again: the same loss
    res = compare("step", _looping(step8, state8, batches), "1 device",
                  _looping(step1, state1, batches), repeats=3 if quick else 7, warmup=2,
                  check=_same_loss)
    lanes = 8 * 8 * capacity  # each of 8 devices sends a buffer of `capacity` lanes to each
    sent = lanes * (8 + 4 + 1) + lanes * (4 * DIM + 4 + 4)  # keys, weight, flag; back
    update = lanes * (4 + 4 * DIM + 4 + 1)  # slot, summed gradient, weight, flag
    note = (f"route_capacity {capacity} (maintain: twice the largest buffer the first steps "
            f"needed, distinct ids per destination); bytes exchanged per step: "
            f"lookup_or_insert {sent / 2**20:.1f} MiB, update by slot {update / 2**20:.1f} MiB "
            f"(at the device's batch slice: {batch * FEATURES // 8} lanes a buffer)")
    return {"sharded_s": res.ours_s, "single_s": res.peer_s, "sharded_best": res.ours_best_s,
            "single_best": res.peer_best_s, "note": note}


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(_child(sys.argv[2] == "quick")))
if __name__ == "__main__" and sys.argv[1:2] == ["--torchrec"]:
    import dataclasses

    rows = _vs_torchrec(sys.argv[2] == "quick")
    print(json.dumps([{f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
                      for r in rows]))
