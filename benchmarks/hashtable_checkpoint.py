"""Checkpoints of a training run: does an asynchronous save block the next step, and what
do the checksums cost?

A table of ``2^20 x 64`` (``2^17`` with ``--quick``) with its Adagrad state is trained by a
jitted step that donates both (``lookup_or_insert`` of 4096 ids, then the row update).
Measured in one process:

- ``async save blocks``: the time ``CheckpointManager.save`` takes before it returns
  (Orbax's device-to-host copy, the checksums dispatched) against a whole synchronous save
  (``ht.save``, written and committed);
- ``first step after an async save``: on XLA:CPU Orbax's host copy is the device buffers
  themselves (no copy), which the commit still reads, so the next step cannot update the
  donated state in place and writes a fresh copy (a GPU makes that copy in the blocking
  part instead, to host memory);
- ``steps during the commit``: the median of the following steps while the save commits in
  the background (it competes for the two cores of this machine) against a step alone,
  and how many steps ran before the commit ended;
- ``checksums``: computing the checksums of every saved array (what a save adds to Orbax)
  against the synchronous save.

Run ``python -m benchmarks --only hashtable_checkpoint``.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import jaxops.hashtable as ht
from benchmarks.common import Result
from jaxops.hashtable.checkpoint._checksums import array_sums

__all__ = ["run"]

BATCH = 4096
DIM = 64


def _state(slots: int):
    table = ht.init_table(slots, DIM, key=jax.random.key(0))
    opt = ht.optim.adagrad(0.05)
    return {"table": table, "opt": opt.init(table), "step": jnp.int32(0)}, opt


def _train_step(opt):
    def step(state, ids):
        table, _, info = ht.lookup_or_insert(state["table"], ids)
        grads = jnp.ones((ids.lo.shape[0], DIM), jnp.float32) * 0.01
        table, s = opt.update(table, state["opt"], info.slots, grads)
        return {"table": table, "opt": s, "step": state["step"] + 1}

    return jax.jit(step, donate_argnums=0)


def _ids(rng: np.random.Generator, slots: int):
    return ht.words.as_words(rng.integers(0, slots // 2, BATCH).astype(np.int64), "bench", "ids")


def _check_round_trip(state, path: str) -> None:
    """Before anything is timed: a saved state restores leaf for leaf, bit for bit (a save
    that writes the wrong bytes fast is no result)."""
    ht.save(state, path)
    back = ht.load(path, state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                      err_msg="hashtable_checkpoint: restored state differs")


def run(quick: bool) -> list[Result]:
    slots = 1 << (17 if quick else 20)
    state, opt = _state(slots)
    step = _train_step(opt)
    rng = np.random.default_rng(0)
    for _ in range(3):
        state = jax.block_until_ready(step(state, _ids(rng, slots)))
    alone = []
    for _ in range(9):
        ids = _ids(rng, slots)
        t0 = time.perf_counter()
        state = jax.block_until_ready(step(state, ids))
        alone.append(time.perf_counter() - t0)
    directory = tempfile.mkdtemp(prefix="jaxops-bench-ckpt-")
    try:
        _check_round_trip(state, f"{directory}/check")
        sync = []
        for i in range(3):
            t0 = time.perf_counter()
            ht.save(state, f"{directory}/sync{i}")
            sync.append(time.perf_counter() - t0)
        leaves = [x for x in jax.tree.leaves(state) if np.size(x)]
        jax.block_until_ready(array_sums(leaves))
        sums = []
        for _ in range(5):
            t0 = time.perf_counter()
            jax.block_until_ready(array_sums(leaves))
            sums.append(time.perf_counter() - t0)
        blocking, first, during, counts, commits = [], [], [], [], []
        with ocp.CheckpointManager(f"{directory}/run") as mngr:
            for i in range(3):
                t0 = time.perf_counter()
                mngr.save(i, args=ht.checkpoint.Save(state))
                blocking.append(time.perf_counter() - t0)
                n = 0
                while n == 0 or mngr.is_saving_in_progress():
                    ids = _ids(rng, slots)
                    t1 = time.perf_counter()
                    state = jax.block_until_ready(step(state, ids))
                    (during if n else first).append(time.perf_counter() - t1)
                    n += 1
                mngr.wait_until_finished()
                commits.append(time.perf_counter() - t0)
                counts.append(n)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    nbytes = sum(x.nbytes for x in leaves)
    tag = f"2^{slots.bit_length() - 1}x{DIM} + adagrad ({nbytes / 2**20:.0f} MiB)"
    med = statistics.median
    return [
        Result(f"async save blocks, {tag}", med(blocking), "sync save", med(sync), 0.5,
               f"commit {med(commits):.2f} s in the background"),
        Result(f"first step after an async save, {tag}", med(first), "step alone", med(alone),
               None, "writes a copy of the donated state (the commit reads it)"),
        Result(f"steps during the commit, {tag}", med(during) if during else float("nan"),
               "step alone", med(alone), 3.0,
               f"{sum(counts)} steps ran during {len(counts)} commits ({counts})"),
        Result(f"checksums of the state, {tag}", med(sums), "sync save", med(sync), 0.2,
               f"{nbytes / med(sums) / 2**30:.1f} GiB/s"),
    ]
