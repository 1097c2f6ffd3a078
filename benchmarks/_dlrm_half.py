"""The DLRM model of :mod:`benchmarks.dlrm` with bfloat16 rows against float32 rows.

Part of ``python -m benchmarks [--quick] --only dlrm``. Both models train side by side on
the same learnable batches (labels drawn from a hidden logit of the ids and the dense
features, :func:`benchmarks.dlrm._hidden_logit`), from the same initial state, then predict
held-out batches (a lookup that inserts nothing). Targets (issue 39 part 3): the rows'
memory at 0.5x of float32, and the held-out AUC within 0.002 of float32's.

Rows:

- **memory**: the bytes of the table's rows (its ``values``); the note also gives the
  whole table (rows plus keys, counters, flags and scores: 25 bytes a slot either way) and
  the row optimizer's state (float32 in both), and both AUCs after the same steps. The
  row's "ms" columns read MB (bytes / 1e6).
- **step time**: the bfloat16 step against the float32 step, interleaved (``compare``).
"""

from __future__ import annotations

import numpy as np

from benchmarks.common import Result, compare
from benchmarks.dlrm import _batches, _looping, _model, _words

AUC_TOLERANCE = 0.002


def _auc(p: np.ndarray, y: np.ndarray) -> float:
    """The ROC AUC of scores ``p`` for labels ``y`` (Mann-Whitney: average ranks of ties).

    >>> _auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
    0.75
    """
    order = np.argsort(p, kind="stable")
    ranks = np.empty(len(p))
    ranks[order] = np.arange(1, len(p) + 1)
    _, inverse, counts = np.unique(p, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, ranks)
    ranks = (sums / counts)[inverse]  # ties share their average rank
    pos = y > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _train(dtype, slots: int, batches, held_out):
    """A trained model's held-out AUC and predictions, its state and its step."""
    import jax

    _, init, step = _model(slots, policy="error", dtype=dtype)
    state = init(jax.random.key(0))
    for dense, ids, labels in batches:
        state, _ = step(state, dense, _words(ids), labels)
    lost = int(state["tables"]["ids"].report.unplaced)
    if lost:
        raise AssertionError(f"{lost} ids found no slot: size the table for the run")
    p = np.concatenate([np.asarray(step.predict(state, d, _words(i))) for d, i, _ in held_out])
    y = np.concatenate([lab for _, _, lab in held_out])
    return _auc(p, y), p, state, step


def _bytes(tree) -> int:
    import jax

    return sum(int(x.nbytes) for x in jax.tree.leaves(tree) if hasattr(x, "nbytes"))


def half_rows(quick: bool) -> list[Result]:
    import jax.numpy as jnp

    slots, batch, steps = (1 << 21, 1024, 200) if quick else (1 << 22, 1024, 400)
    batches = _batches(steps, batch, seed=2, learnable=True)
    held_out = _batches(10 if quick else 40, batch, seed=3, learnable=True)
    auc32, p32, state32, step32 = _train(jnp.float32, slots, batches, held_out)
    auc16, p16, state16, step16 = _train(jnp.bfloat16, slots, batches, held_out)
    t32, t16 = state32["tables"]["ids"], state16["tables"]["ids"]
    rows32, rows16 = t32.table.values.nbytes, t16.table.values.nbytes
    met = "met" if abs(auc16 - auc32) <= AUC_TOLERANCE else "MISSED"
    note = (f"{steps} steps of batch {batch}, {slots} slots, {int(t32.table.live)} ids; "
            f"held-out AUC ({p32.size} predictions) bf16 {auc16:.5f} vs f32 {auc32:.5f} (diff "
            f"{auc16 - auc32:+.5f}, target |diff| <= {AUC_TOLERANCE}: {met}; the predictions "
            f"differ by {np.abs(p16 - p32).mean():.2e} on average); whole table "
            f"{_bytes(t16.table) / 1e6:.0f} vs {_bytes(t32.table) / 1e6:.0f} MB "
            f"({_bytes(t16.table) / _bytes(t32.table):.2f}x)"
            f", optimizer state {_bytes(t16.opt_state) / 1e6:.0f} vs "
            f"{_bytes(t32.opt_state) / 1e6:.0f} MB (float32 in both)")
    memory = Result("DLRM bf16 rows: table rows MB", rows16 / 1e9, "float32 rows", rows32 / 1e9,
                    target=0.5, note=note)
    few = batches[:8]
    timed = compare("DLRM step, bf16 rows", _looping(step16, state16, few), "float32 rows",
                    _looping(step32, state32, few), repeats=3 if quick else 7, warmup=2,
                    check=_finite)
    return [memory, timed]


def _finite(ours, peer) -> None:
    if not (np.isfinite(ours) and np.isfinite(peer)):
        raise AssertionError(f"losses {float(ours)} (bf16 rows), {float(peer)} (float32 rows)")
