"""Checkpoint checks in a fresh process, run by
``tests/hashtable/checkpoint/test_fresh_process.py`` (and ``kill`` by the benchmark
``benchmarks/checkpoint_kills.py``).

A restore in the process that saved can be helped by TensorStore's caches (a byte flipped
on disk after the save was once restored there without error), so these checks restore in
a process that never saw the checkpoint:
``python tests/helpers/checkpoint_fresh.py MODE[,MODE...] DIR`` (several modes: in turn, in
one process; run with 4 forced host devices for the ``sharded`` modes).

- ``resume``: restores step :data:`MID` of the run in ``DIR/run``, trains on to
  :data:`STEPS` and compares every leaf with ``DIR/expected.npz`` (the uninterrupted run),
  bit for bit;
- ``corrupt``: restores every damaged copy of a checkpoint under ``DIR/cases`` and prints,
  per case, whether it was refused (``CheckpointError``), restored equal to the intact
  checkpoint, restored different (silently wrong) or failed otherwise;
- ``make_sharded`` / ``restore_sharded``: the sharded corruption fuzz of
  ``benchmarks/checkpoint_adversary.py`` in ``DIR/sharded`` (its child's ``make`` and
  ``restore``: the cases to restore are read from stdin);
- ``kill``: restores the latest step of ``DIR/kill`` (checking it against
  :func:`kill_state`), then saves step after step asynchronously until it is killed.

Each prints JSON lines.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

DIM = 4
MID, STEPS = 2, 4


def fresh_state():
    """A small train state: a table with its Adagrad state, dense arrays, a step count."""
    import jax
    import jax.numpy as jnp

    import jaxops.hashtable as ht

    table = ht.set_load_policy(ht.init_table(64, DIM, initializer_mode="constant",
                                             constant_value=0.25),
                               max_load_factor=0.8, policy="evict")
    return {"emb": {"table": table, "opt": ht.optim.adagrad(0.1).init(table)},
            "dense": {"w": jnp.ones((DIM, 3)), "mu": np.zeros((DIM, 3), np.float32)},
            "step": 0, "key": jax.random.key(0)}


def train_step(state):
    """One deterministic step: insert the step's ids, update their rows and the dense
    weights (a toy model: what matters is that every part of the state changes)."""
    import jax
    import jax.numpy as jnp

    import jaxops.hashtable as ht

    step = state["step"]
    ids = np.random.default_rng(step).integers(0, 48, 16).astype(np.int64)
    key, sub = jax.random.split(state["key"])
    t, rows, info = ht.lookup_or_insert(state["emb"]["table"], ids)
    grads = jnp.tanh(rows @ state["dense"]["w"]) @ state["dense"]["w"].T
    grads = grads + jax.random.normal(sub, grads.shape) * 0.01
    t, opt = ht.optim.adagrad(0.1).update(t, state["emb"]["opt"], info.slots, grads)
    w = state["dense"]["w"] - 0.01 * jnp.sum(rows) * state["dense"]["w"]
    mu = state["dense"]["mu"] * 0.9 + np.float32(step)
    return {"emb": {"table": t, "opt": opt}, "dense": {"w": w, "mu": mu}, "step": step + 1,
            "key": key}


def flat(state) -> dict[str, np.ndarray]:
    """Every leaf of a state as numpy, by path (PRNG keys by their data)."""
    import jax

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype,
                                                                 jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out[jax.tree_util.keystr(path)] = np.asarray(leaf)
    return out


def same(a: dict, b: dict) -> list[str]:
    """The paths where two flattened states differ (shape, dtype or any bit)."""
    return sorted(k for k in set(a) | set(b) if k not in a or k not in b or
                  a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or
                  a[k].tobytes() != b[k].tobytes())


def abstract():
    import jax

    return jax.eval_shape(fresh_state)


def resume(directory: str) -> None:
    import orbax.checkpoint as ocp

    import jaxops.hashtable as ht

    with ocp.CheckpointManager(os.path.join(directory, "run")) as mngr:
        state = mngr.restore(MID, args=ht.checkpoint.Restore(abstract()))
    assert state["step"] == MID and state["emb"]["table"].load_policy == "evict"
    while state["step"] < STEPS:
        state = train_step(state)
    want = dict(np.load(os.path.join(directory, "expected.npz")))
    differ = same(flat(state), {k: want[k] for k in want})
    print(json.dumps({"check": "resume", "differ": differ}), flush=True)


def corrupt(directory: str) -> None:
    import jaxops.hashtable as ht

    intact = flat(ht.load(os.path.join(directory, "intact"), abstract()))
    cases = os.path.join(directory, "cases")
    for name in sorted(os.listdir(cases)):
        try:
            back = flat(ht.load(os.path.join(cases, name), abstract()))
            outcome = "equal" if not same(back, intact) else "wrong"
            why = ""
        except ht.CheckpointError as e:
            outcome, why = "refused", str(e)[:300]
        except Exception as e:  # noqa: BLE001 - reported to the parent test
            outcome, why = "other", f"{type(e).__name__}: {e}"[:600]
        print(json.dumps({"case": name, "outcome": outcome, "why": why}), flush=True)


def kill_state(step: int):
    """The state a ``kill`` run saves at ``step`` (made directly: no training to redo)."""
    import jax.numpy as jnp

    import jaxops.hashtable as ht

    state = fresh_state()
    t = state["emb"]["table"]  # the same batch shape every step: one compile
    t, _, info = ht.lookup_or_insert(t, np.arange(step, step + 40, dtype=np.int64))
    return {**state, "emb": {**state["emb"], "table": t},
            "dense": {"w": jnp.full((512, 1024), float(step)),  # 2 MiB: a save takes a while
                      "mu": np.full((DIM, 3), step, np.float32)}, "step": step}


def kill(directory: str) -> None:
    import jax
    import orbax.checkpoint as ocp

    import jaxops.hashtable as ht

    options = ocp.CheckpointManagerOptions(max_to_keep=2, cleanup_tmp_directories=True)
    with ocp.CheckpointManager(os.path.join(directory, "kill"), options=options) as mngr:
        last = mngr.latest_step()
        if last is not None:
            back = mngr.restore(last, args=ht.checkpoint.Restore(
                jax.eval_shape(lambda: kill_state(last))))
            differ = same(flat(back), flat(kill_state(last)))
            print(json.dumps({"verified": last, "differ": differ}), flush=True)
        else:
            print(json.dumps({"verified": None, "differ": []}), flush=True)
        step = (last or 0) + 1
        while True:  # until killed
            mngr.save(step, args=ht.checkpoint.Save(kill_state(step)))
            print(json.dumps({"saving": step}), flush=True)
            step += 1


def _fuzz(mode: str):
    def run(directory: str) -> None:
        import jax

        from benchmarks import _checkpoint_child

        jax.config.update("jax_enable_x64", False)  # as the benchmark runs its children
        _checkpoint_child.main(mode, "sharded", os.path.join(directory, "sharded"))
    return run


if __name__ == "__main__":
    modes, where = sys.argv[1], sys.argv[2]
    try:
        for mode in modes.split(","):
            {"resume": resume, "corrupt": corrupt, "kill": kill, "make_sharded": _fuzz("make"),
             "restore_sharded": _fuzz("restore")}[mode](where)
    except Exception:  # noqa: BLE001 - reported to the parent test
        print(json.dumps({"crash": traceback.format_exc()}), flush=True)
        sys.exit(1)
