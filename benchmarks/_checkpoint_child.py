"""The child processes of ``benchmarks/checkpoint_adversary.py`` (restores run in a
process that never saw the checkpoint: TensorStore's cache could hide a flipped byte).

``python benchmarks/_checkpoint_child.py MODE KIND DIR [ARGS]``, KIND ``single`` (one
device) or ``sharded`` (a table over 4 devices: run with 4 forced host devices):

- ``make``: saves the state after 1 and 2 steps as ``DIR/a`` and ``DIR/b``;
- ``restore``: restores ``DIR/a``, then every case directory named on stdin (one a line),
  printing a JSON line per case: ``refused`` (``CheckpointError``), ``equal`` (the intact
  state, bit for bit), ``wrong`` (restored, different) or ``other`` (another error), with
  the restored state's digest;
- ``save N PATH``: makes the state after ``N`` steps and prints its digest; then, for every
  line on stdin, saves it to ``PATH`` three times with ``force=True`` and prints ``saved``
  (the concurrent-saves rounds).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_state(kind: str):
    import jax
    import jax.numpy as jnp

    import jaxops.hashtable as ht

    placement = None
    if kind == "sharded":
        placement = ht.MeshAxis(jax.sharding.Mesh(np.array(jax.devices()[:4]), ("s",)), "s")
    table = ht.set_load_policy(ht.init_table(256, 4, initializer_mode="constant",
                                             constant_value=0.25, key_dtype=np.uint64,
                                             placement=placement),
                               max_load_factor=0.8, policy="evict")
    return {"table": table, "opt": ht.optim.adagrad(0.1).init(table),
            "w": jnp.ones((4, 3)), "step": 0}


def step(state, n: int):
    import jaxops.hashtable as ht

    keys = np.random.default_rng(n).integers(0, 2**64 - 1, 48, dtype=np.uint64)
    keys[:4] = [0, 1, 2**63, 2**64 - 1]
    t, rows, info = ht.lookup_or_insert(state["table"], keys)
    t, opt = ht.optim.adagrad(0.1).update(t, state["opt"], info.slots, rows * 0.5 + n)
    return {"table": t, "opt": opt, "w": state["w"] * 1.5, "step": n + 1}


def flat(state) -> dict[str, tuple]:
    """Every leaf by path (dtype, shape, bytes), and the tree's structure, which holds the
    tables' static fields (load policy and limit, key dtype, initializer)."""
    import jax

    leaves, tree = jax.tree_util.tree_flatten_with_path(state)
    out = {jax.tree_util.keystr(p): (np.asarray(x).dtype.str, np.shape(x),
                                     np.asarray(x).tobytes()) for p, x in leaves}
    out["<structure>"] = repr(tree)
    return out


def digest(state) -> str:
    return hashlib.sha256(repr(sorted(flat(state).items())).encode()).hexdigest()[:16]


def main(mode: str, kind: str, where: str, *args: str) -> None:
    import jax

    import jaxops.hashtable as ht

    if mode == "make":
        state = make_state(kind)
        for n, name in enumerate(("a", "b")):
            state = step(state, n)
            ht.save(state, os.path.join(where, name))
    elif mode == "restore":
        target = jax.eval_shape(lambda: make_state(kind))
        intact = flat(ht.load(os.path.join(where, "a"), target))
        for line in sys.stdin:
            case, found = line.strip(), ""
            try:
                back = ht.load(case, target)
                outcome = "equal" if flat(back) == intact else "wrong"
                why, found = "", digest(back)
            except ht.CheckpointError as e:
                outcome, why = "refused", str(e)[:200]
            except Exception as e:  # noqa: BLE001 - reported to the parent
                outcome, why = "other", f"{type(e).__name__}: {e}"[:400]
            print(json.dumps({"case": case, "outcome": outcome, "why": why,
                              "digest": found}), flush=True)
    elif mode == "save":
        state = make_state(kind)
        for n in range(int(args[0])):
            state = step(state, n)
        print(json.dumps({"digest": digest(state)}), flush=True)
        for _ in sys.stdin:
            for _ in range(3):
                ht.save(state, args[1], force=True)
            print(json.dumps({"saved": int(args[0])}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
