"""Train states with hash tables in Orbax: a ``CheckpointHandler`` and its ``Save`` /
``Restore`` args, registered with Orbax, so that ``CheckpointManager`` (async saves,
retention, several processes) and :class:`Checkpointer` save and restore them.

Orbax stores every array (OCDBT, uncompressed, in 16 MiB chunks and data files, so that a
save adds at most a chunk to the process's memory). jaxops adds what Orbax lacks:

- **static fields and placements**: a table's load limit, policy and key dtype come back
  as saved (a plain Orbax restore takes them from the target); its placement is the
  target's, any shard count: keys are re-owned and each key's optimizer state moves with
  it (:mod:`~jaxops.hashtable.checkpoint._tables`);
- **integrity**: every array's checksum, computed on its devices when saving
  (:mod:`~jaxops.hashtable.checkpoint._checksums`), and ``jaxops.json``
  (:mod:`~jaxops.hashtable.checkpoint._meta`) with its own SHA-256, written in the same atomic
  commit; a restore checks them all, and each table's structure, and refuses a directory with links
  or too few bytes (:mod:`~jaxops.hashtable.checkpoint._read`);
- **bounded memory**: tables and their optimizer states are restored a chunk at a time.

>>> import os, tempfile, numpy as np, jax, orbax.checkpoint as ocp, jaxops.hashtable as ht
>>> t = ht.set_load_policy(ht.init_table(64, 2, initializer_mode="constant"), policy="grow")
>>> opt = ht.optim.adagrad(0.1)
>>> t, _, info = ht.lookup_or_insert(t, np.array([5, 6], np.int64))
>>> state = {"table": t, "opt": opt.init(t), "step": 3}
>>> with ocp.CheckpointManager(tempfile.mkdtemp()) as mngr:
...     _ = mngr.save(3, args=ht.checkpoint.Save(state))
...     mngr.wait_until_finished()
...     back = mngr.restore(3, args=ht.checkpoint.Restore(jax.eval_shape(lambda: state)))
>>> back["table"].load_policy, int(back["table"].live), back["step"]
('grow', 2, 3)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from jaxops.core.errors import CheckpointError, OpArgumentError
from jaxops.hashtable.checkpoint._checksums import array_sums, hex_sums, host_sums, shard_sums
from jaxops.hashtable.checkpoint._guard import (STAGING_SUFFIX, DirectoryTurn, check_destination,
                                                naming_path, remove_temporary, swap_into_place)
from jaxops.hashtable.checkpoint._meta import (PY_SCALARS, dtype_name, make_body, read_meta,
                                               write_meta)
from jaxops.hashtable.checkpoint._read import CHUNK_BYTES, StoredArrays, check_directory, reading
from jaxops.hashtable.checkpoint._tables import restore_table
from jaxops.hashtable.checkpoint._tree import Parts, parts

__all__ = ["Checkpointer", "Restore", "Save", "TrainStateHandler"]

_SCALARS = (int, float, bool, complex, np.number, np.bool_)


class TrainStateHandler(ocp.handlers.AsyncCheckpointHandler):
    """Saves and restores a train state holding tables (see the module docstring); use it
    through :class:`Save` / :class:`Restore` with any Orbax checkpointer or manager."""

    def __init__(self, *, multiprocessing_options: ocp.options.MultiprocessingOptions | None
                 = None):
        options = multiprocessing_options or ocp.options.MultiprocessingOptions()
        self._primary = options.primary_host
        self._pytree = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_compression=False,
                                                   multiprocessing_options=options)

    async def async_save(self, directory: epath.Path, args: "Save") -> list:
        found = parts(args.item, "save")
        flat = found.flat()
        for name, x in flat.items():
            if not isinstance(x, (jax.Array, np.ndarray) + _SCALARS):
                where = found.where.get(name, name)
                raise OpArgumentError("save", f"state{where}", "arrays and scalars (filter "
                                      "modules first: eqx.filter(m, eqx.is_array), "
                                      "nnx.state(m))", type(x).__name__)
        sums = _dispatch_sums(found, flat)
        skeleton = make_body(found, {n: [] for n in flat})
        stored = {n: x for n, x in flat.items() if np.size(x)}  # Orbax refuses empty arrays
        save_args = {n: ocp.SaveArgs(chunk_byte_size=CHUNK_BYTES) if np.ndim(x) else
                     ocp.SaveArgs() for n, x in stored.items()}
        futures = await self._pytree.async_save(directory, args=ocp.args.PyTreeSave(
            stored, save_args=save_args)) or []
        commit = ocp.future.CommitFutureAwaitingContractedSignals(
            self._commit(directory, skeleton, sums), name="jaxops_train_state")
        return [*futures, commit]

    async def _commit(self, directory: epath.Path, body: dict, sums: dict) -> None:
        for name, s in sums.items():
            body["leaves"][name]["sums"] = [hex_sums(x) for x in np.asarray(s).reshape(-1, 2)]
        if ocp.multihost.is_primary_host(self._primary):
            write_meta(os.fspath(directory), body)

    def save(self, directory: epath.Path, args: "Save") -> None:
        async def run():
            for f in await self.async_save(directory, args=args):
                f.result()

        _run_sync(run())

    def restore(self, directory: epath.Path, args: "Restore | None" = None) -> Any:
        where = os.fspath(directory)
        if args is None or args.item is None:
            raise OpArgumentError("restore", "item", "the target state (arrays or "
                                  "jax.ShapeDtypeStruct; tables on the placement to restore "
                                  "onto)", "None", "Pass Restore(target), e.g. "
                                  "jax.eval_shape(make_state).")
        body = read_meta(where)
        check_directory(where)
        found = parts(args.item, "restore")
        _match(body, found, where)
        stored = StoredArrays(where, body["leaves"])
        leaves = self._restore_plain(directory, found, body, stored)
        tables, states = {}, {}
        for name, table in found.tables.items():
            mine = [s for s in found.states.values() if s.table == name]
            tables[name], moved = restore_table(stored, body, table, mine)
            states.update(moved)
        return found.unflatten(leaves, tables, states)

    def _restore_plain(self, directory, found: Parts, body: dict, stored: StoredArrays
                       ) -> dict:
        """The plain leaves, restored by Orbax onto the target's shardings, then checked."""
        if not found.leaves:
            return {}
        where = stored.directory
        types = {n: PY_SCALARS.get(body["leaves"][n]["dtype"]) for n in found.leaves}
        item = {n: types[n]() if types[n] else _with_sharding(x) for n, x in found.leaves.items()}
        empty = {n: _empty(x) for n, x in item.items() if not types[n] and not np.size(x)}
        item = {n: x for n, x in item.items() if n not in empty}
        for n in item:  # stored shape, dtype and chunks as listed, before Orbax reads
            if not types[n] and not body["leaves"][n]["dtype"].startswith("key<"):
                stored.open(n)  # (PRNG keys are stored as their key data)
        out = {}
        if item:
            restore_args = ocp.checkpoint_utils.construct_restore_args(item)
            with reading(where):
                out = self._pytree.restore(directory, args=ocp.args.PyTreeRestore(
                    item=item, restore_args=restore_args, partial_restore=True))
        out.update(empty)
        got = _sums_now(out)
        for name, s in got.items():
            if hex_sums(s) != body["leaves"][name]["sums"][0]:
                raise CheckpointError(f"{where!r}: array {name!r} ({found.where[name]}): "
                                      "checksum mismatch: the stored data is not what was saved")
        return out

    def metadata(self, directory: epath.Path) -> dict:
        """The checked ``jaxops.json`` body (leaves, tables, states)."""
        return read_meta(os.fspath(directory))

    def finalize(self, directory: epath.Path) -> None:
        self._pytree.finalize(directory)

    def close(self) -> None:
        self._pytree.close()


def _run_sync(coro) -> None:
    try:  # Orbax's runner also works inside a running event loop (notebooks)
        from orbax.checkpoint._src.asyncio_utils import run_sync
    except ImportError:  # pragma: no cover - another Orbax layout
        import asyncio

        run_sync = asyncio.run
    run_sync(coro)


@ocp.args.register_with_handler(TrainStateHandler, for_save=True)
@dataclasses.dataclass
class Save(ocp.args.CheckpointArgs):
    """Saves ``item``, a train state (see :class:`TrainStateHandler`)."""

    item: Any


@ocp.args.register_with_handler(TrainStateHandler, for_restore=True)
@dataclasses.dataclass
class Restore(ocp.args.CheckpointArgs):
    """Restores into the structure of ``item``: arrays or ``jax.ShapeDtypeStruct`` (their
    shardings are kept); tables on the placement they should have (concrete tables from
    ``init_table`` when the shard count or size differs from the saved: their rows are
    what free slots keep), row optimizer states beside them."""

    item: Any = None


class Checkpointer(ocp.AsyncCheckpointer):
    """``ocp.StandardCheckpointer`` for train states holding tables: ``save(path, state)``
    (asynchronous: ``wait_until_finished()``), ``restore(path, target)``.

    A save takes its turn in the directory it writes into and touches only what it owns
    (:mod:`~jaxops.hashtable.checkpoint._guard`): saves from other threads and processes into that
    directory wait until this one is committed (``wait_until_finished``, the next ``save`` or
    ``close``); an existing ``path`` is refused, and replaced with ``force=True`` only if
    it is a checkpoint or an empty directory (written beside it, exchanged when committed);
    a failed save removes its temporary directory."""

    def __init__(self, *, multiprocessing_options: ocp.options.MultiprocessingOptions | None
                 = None, **kwargs):
        options = multiprocessing_options or ocp.options.MultiprocessingOptions()
        self._primary = options.primary_host
        self._processes = options.active_processes
        self._pending: tuple[str, str, DirectoryTurn | None] | None = None
        super().__init__(TrainStateHandler(multiprocessing_options=options),
                         multiprocessing_options=options, **kwargs)

    def save(self, directory: epath.PathLike, state: Any, *, force: bool = False,
             **kwargs) -> None:
        path = os.path.abspath(os.fspath(directory))
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            raise FileNotFoundError(2, f"save: argument 'path': expected a path in an "
                                    f"existing directory, got {path!r} (its directory does "
                                    "not exist)", path)
        self.wait_until_finished()  # the previous save committed and its turn given back
        primary = ocp.multihost.is_primary_host(self._primary)
        turn = DirectoryTurn(parent) if primary else None
        # force: written beside the old checkpoint, swapped in when committed
        staged = path + STAGING_SUFFIX if force and os.path.lexists(path) else path
        pending = (path, staged, turn)
        try:
            check_destination(path, force)
            if staged != path and primary:
                remove_temporary(staged)  # a killed save's (its own name, under its turn)
            if staged != path:
                self._sync("jaxops_checkpoint_staged")
            super().save(staged, args=Save(state), **kwargs)
        except BaseException as e:
            self._raise_failed(pending, e)
        self._pending = pending

    def wait_until_finished(self) -> None:
        pending, self._pending = self._pending, None
        try:
            super().wait_until_finished()
            if pending is not None and pending[1] != pending[0]:
                if pending[2] is not None:  # the primary process swaps, the others wait
                    swap_into_place(pending[1], pending[0])
                self._sync("jaxops_checkpoint_swapped")
        except BaseException as e:
            if pending is None:
                raise
            self._raise_failed(pending, e)
        if pending is not None and pending[2] is not None:
            pending[2].release()

    def _sync(self, name: str) -> None:
        if jax.process_count() > 1:
            ocp.multihost.sync_global_processes(name, processes=self._processes)

    def _raise_failed(self, pending: tuple, error: BaseException):
        """Cleans up after a save that failed, and raises (an ``OSError`` naming the
        checkpoint's path for a file-system failure)."""
        path, staged, turn = pending
        try:
            if turn is not None:
                remove_temporary(os.fspath(self.get_temporary_path(epath.Path(staged)).get()))
                if staged != path:
                    remove_temporary(staged)
        finally:
            if turn is not None:
                turn.release()
        named = naming_path(error, path)
        if named is error:
            raise error
        raise named from error

    def restore(self, directory: epath.PathLike, target: Any = None) -> Any:
        return super().restore(directory, args=Restore(target))


def _with_sharding(x: Any) -> Any:
    """A target leaf: a ``ShapeDtypeStruct`` without a sharding restores onto the first
    local device (Orbax alone would give a numpy array)."""
    if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(
            jax.local_devices()[0]))
    return x


def _empty(x: Any) -> Any:
    """An empty array like the target leaf ``x`` (Orbax stores no empty arrays)."""
    if isinstance(x, np.ndarray):
        return np.zeros(x.shape, x.dtype)
    return jax.device_put(np.zeros(x.shape, x.dtype), x.sharding)


def _device_group(x: jax.Array) -> tuple:
    return tuple(sorted(d.id for d in x.sharding.device_set))


def _dispatch_sums(found: Parts, flat: dict) -> dict:
    """Name → checksums (uint32 ``[2]`` or ``[shards, 2]``; device arrays still being
    computed): per shard for the arrays of a table on a mesh and of its states."""
    out, groups, done = {}, {}, set()
    for name, t in found.tables.items():
        if t.sharded:
            names = [n for n in t.fields() if not n.endswith(".unrouted")] + [
                n for s in found.states.values() if s.table == name for n in s.leaves]
            placement = t.table.placement
            out.update(zip(names, shard_sums([flat[n] for n in names], placement.mesh,
                                             placement.axis)))
            done.update(names)
    for name, x in flat.items():
        if name in done:
            continue
        if isinstance(x, jax.Array):
            groups.setdefault(_device_group(x), []).append(name)
        else:
            out[name] = host_sums(np.asarray(x))
    for names in groups.values():
        out.update(zip(names, array_sums([flat[n] for n in names])))
    return out


def _sums_now(restored: dict) -> dict:
    groups: dict[tuple, list[str]] = {}
    out = {}
    for name, x in restored.items():
        if isinstance(x, jax.Array):
            groups.setdefault(_device_group(x), []).append(name)
        else:
            out[name] = host_sums(np.asarray(x))
    for names in groups.values():
        out.update(zip(names, (np.asarray(s) for s in array_sums([restored[n] for n in names]))))
    return out


def _match(body: dict, found: Parts, where: str) -> None:
    """The target has the checkpoint's leaves, tables and states, each as saved."""
    _same_names(where, "tables", set(body["tables"]), set(found.tables),
                {n: t.where for n, t in found.tables.items()})
    _same_names(where, "optimizer states", set(body["states"]), set(found.states),
                {n: s.where for n, s in found.states.items()})
    saved_plain = {n for n, leaf in body["leaves"].items() if leaf["kind"] == "plain"}
    _same_names(where, "arrays", saved_plain, set(found.leaves), found.where)
    for name, s in found.states.items():
        if body["states"][name]["table"] != s.table:
            raise CheckpointError(f"{where!r}: the optimizer state {s.where} was saved with "
                                  f"table {body['states'][name]['table']!r}, the target pairs "
                                  f"it with {s.table!r}")
    for name, x in found.leaves.items():
        saved = body["leaves"][name]
        shape, dtype = [int(d) for d in np.shape(x)], dtype_name(x)
        if saved["dtype"] in PY_SCALARS and not shape:
            continue  # restored as the Python scalar it was, as Orbax does
        if (shape, dtype) != (saved["shape"], saved["dtype"]):
            raise CheckpointError(f"{where!r}: array {found.where[name]}: the checkpoint holds "
                                  f"{saved['shape']} {saved['dtype']}, the target "
                                  f"{shape} {dtype}")


def _same_names(where: str, what: str, saved: set, target: set, shown: dict) -> None:
    if saved == target:
        return
    missing, extra = sorted(saved - target)[:5], sorted(target - saved)[:5]
    raise CheckpointError(f"{where!r}: the target's {what} differ from the checkpoint's: "
                          f"saved but not in the target {missing}, in the target but not "
                          f"saved {[shown.get(n, n) for n in extra]}")
