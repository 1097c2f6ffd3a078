"""Train states holding hash tables in Orbax checkpoints.

``Save(state)`` / ``Restore(target)`` are Orbax checkpoint args registered with
:class:`TrainStateHandler`, so ``orbax.checkpoint.CheckpointManager`` saves and restores
them as any other item (asynchronously, with retention, on several processes);
:class:`Checkpointer` is ``ocp.StandardCheckpointer`` for them. A state may hold tables on
any placement, their row optimizer states, ordinary arrays and Flax NNX / Equinox module
states. A restore gives the saved static fields (load limit, policy, key dtype) and puts
each table on the target's placement, any shard count, each key's optimizer state moving
with it; every array is checked against its checksum, every table's structure too.
:func:`save` / :func:`load` (also ``jaxops.hashtable.save`` / ``load``) do it in one
synchronous call. A save or a restore adds about :data:`CHUNK_BYTES` to each device's
memory beyond the state itself: Orbax writes, and jaxops reads, tables a chunk at a time.

>>> import tempfile, numpy as np, jax, orbax.checkpoint as ocp, jaxops.hashtable as ht
>>> t = ht.init_table(64, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([5, 6], np.int64))
>>> options = ocp.CheckpointManagerOptions(max_to_keep=2, cleanup_tmp_directories=True)
>>> with ocp.CheckpointManager(tempfile.mkdtemp(), options=options) as mngr:
...     _ = mngr.save(1, args=ht.checkpoint.Save({"table": t}))
...     back = mngr.restore(mngr.latest_step(),
...                         args=ht.checkpoint.Restore(jax.eval_shape(lambda: {"table": t})))
>>> int(back["table"].live)
2
"""

from jaxops.hashtable.checkpoint._handler import Checkpointer, Restore, Save, TrainStateHandler
from jaxops.hashtable.checkpoint._read import CHUNK_BYTES
from jaxops.hashtable.checkpoint._save_load import load, save

__all__ = ["CHUNK_BYTES", "Checkpointer", "Restore", "Save", "TrainStateHandler", "load", "save"]
