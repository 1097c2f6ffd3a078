"""``EmbeddingCollection``: named id features on hash tables, pooled per bag, trained by slot.

Each :class:`TableConfig` is one hash table with its own ``embedding_dim``, row optimizer,
initializer and pooling, and the features it serves (TorchRec's ``EmbeddingBagConfig``).
Features of one table share its memory; unless ``share_ids=True`` their ids are salted with
a 64-bit value derived from the feature's name (XOR, so distinct ids of a feature stay
distinct keys), so id 5 of ``"user"`` and id 5 of ``"item"`` get different rows. With
``share_ids=True`` they get the same row (TorchRec's shared embedding). A table that serves
one feature stores its raw ids (so adding a feature to it later changes the first one's
keys). The id -1 is the padding key (CANN's unused key); padding is never inserted, and a
real id that salts to -1 (one in 2**64) is counted as padding in ``info.filtered``.

A training step is lookup_or_insert → pool → gradient w.r.t. the looked-up rows (O(batch))
→ row optimizer by slot; no table-sized gradient is ever formed
(:meth:`~EmbeddingCollection.lookup` reads without inserting, for evaluation):

>>> import numpy as np, jax, jax.numpy as jnp, jaxops.hashtable as ht
>>> from jaxops.embedding import Bags, EmbeddingCollection, TableConfig
>>> coll = EmbeddingCollection([
...     TableConfig("ids", 64, 4, features=("user", "item"), optimizer=ht.optim.adagrad(0.1)),
...     TableConfig("tags", 32, 2, features=("tags",), optimizer=ht.optim.sgd(0.1),
...                 pooling="mean", initializer=0.0)])
>>> state = coll.init(jax.random.key(0))
>>> batch = {"user": Bags.from_lengths(np.array([3, 4]), np.array([1, 1])),
...          "item": Bags.from_lengths(np.array([3, 9, 9]), np.array([2, 1])),
...          "tags": Bags.from_dense(np.array([[5, 6], [7, 0]]), mask=np.array([[1, 1], [1, 0]]))}
>>> @jax.jit
... def train_step(state, batch):
...     state, looked = coll.lookup_or_insert(state, batch)
...     def loss(rows):
...         pooled = coll.pool(looked, rows)
...         return sum(jnp.sum(p ** 2) for p in pooled.values())
...     grads = jax.grad(loss)(looked.rows)
...     return coll.apply_gradients(state, looked, grads)
>>> state = train_step(state, batch)
>>> {name: int(s.table.live) for name, s in state.items()}  # user 3 and item 3: two rows
{'ids': 4, 'tags': 3}

The tables fill inside the jitted steps, where they cannot grow: between steps,
:meth:`EmbeddingCollection.maintain` applies each table's load policy (``TableConfig``'s
``load_policy``: grow with the optimizer state, evict the lowest-scored ids, or raise), from
what the steps reported (each table's :class:`TableReport`):

>>> state, reports = coll.maintain(state)
>>> reports["ids"].action, reports["ids"].lost, int(state["ids"].report.steps)
('none', 0, 0)
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.embedding.bags import Bags
from jaxops.embedding.pooling import check_pooling, pool
from jaxops.hashtable import (HashTable, LookupInfo, Maintenance, Placement, ShardedHashTable,
                              gather, init_table, locate, lookup_or_insert, maintain,
                              set_load_policy, with_route)
from jaxops.hashtable.optim import RowOptimizer
from jaxops.hashtable.words import Words64

__all__ = ["EmbeddingCollection", "Lookup", "TableConfig", "TableReport", "TableState",
           "feature_salt", "salt_ids"]

_OP = "EmbeddingCollection"
_PAD = np.uint32(0xFFFFFFFF)  # both words of the padding key -1


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One hash table and the features it serves.

    Attributes:
        name: the table's name (a key of the collection's state).
        bucket_size: slots of the table.
        embedding_dim: floats per row.
        features: names of the features looked up in this table.
        optimizer: the row optimizer (``jaxops.hashtable.optim``).
        initializer: the rows new keys start with: None for uniform in ``[-0.05, 0.05]``
            (``init_table``'s random mode), a float for a constant, or a JAX initializer
            ``f(key, shape, dtype)`` (``jax.nn.initializers``).
        pooling: ``"sum"``, ``"mean"`` or ``"sqrtn"`` for every feature of the table.
        share_ids: features see one id space (same id, same row) instead of salted keys.
        placement: where the table lives: None (one device) or a
            :class:`~jaxops.hashtable.MeshAxis` (a table sharded by key over a mesh axis;
            the training step and the reads are the same).
        key_dtype: the ids' dtype: ``np.int64`` (64-bit ids; with x64 off pass them to a
            jitted step as ``ht.words.as_words(ids)`` or numpy, never as a JAX int32 array,
            which may hold narrowed ids and is refused) or ``np.int32`` / ``np.uint32`` (ids
            that are 32-bit: JAX int32 arrays welcome).
        route_capacity: on a mesh, the routing buffers' lanes per destination (see
            ``lookup_or_insert``); None: each device's batch slice, which nothing overflows.
        load_policy, max_load_factor: what :meth:`EmbeddingCollection.maintain` does when
            the table nears its limit (``"error"``, ``"grow"``, ``"evict"``,
            ``"evict_lfu"``, or a policy registered in ``LOAD_POLICIES``; see
            :func:`jaxops.hashtable.maintain`).
        dtype: the rows' dtype, ``jnp.float32`` or ``jnp.bfloat16`` / ``jnp.float16`` (half
            the rows' memory; lookups still give float32 rows, the optimizer rounds its
            updates stochastically and keeps float32 state: see ``init_table``).
    """

    name: str
    bucket_size: int
    embedding_dim: int
    features: tuple[str, ...]
    optimizer: RowOptimizer
    initializer: float | Callable[..., jax.Array] | None = None
    pooling: str = "sum"
    share_ids: bool = False
    placement: Placement | None = None
    load_policy: str = "error"
    max_load_factor: float = 0.9
    key_dtype: Any = np.int64
    route_capacity: int | None = None
    dtype: Any = jnp.float32


class TableReport(NamedTuple):
    """What a table's lookups reported since the last :meth:`EmbeddingCollection.maintain`
    (device scalars, accumulated inside the jitted steps).

    Attributes:
        steps: lookups that inserted.
        inserted: keys inserted, in all.
        max_inserted: the most keys one step inserted (the headroom ``maintain`` keeps).
        unplaced: ids that found no slot (lost to a full table).
        over_limit: some step left a shard past its load limit.
        unrouted: ids that did not fit a routing buffer (a table on a mesh).
        route_needed: the largest routing buffer a step needed (a table on a mesh).
    """

    steps: jax.Array
    inserted: jax.Array
    max_inserted: jax.Array
    unplaced: jax.Array
    over_limit: jax.Array
    unrouted: jax.Array
    route_needed: jax.Array

    @classmethod
    def zero(cls) -> "TableReport":
        count = lambda: jnp.zeros((), jnp.int32)  # noqa: E731  (own buffers: donatable)
        return cls(count(), count(), count(), count(), jnp.zeros((), bool), count(), count())

    def add(self, info: LookupInfo) -> "TableReport":
        """This report with one more lookup's ``info``."""
        return TableReport(self.steps + 1, self.inserted + info.inserted,
                           jnp.maximum(self.max_inserted, info.inserted),
                           self.unplaced + info.unplaced, self.over_limit | info.over_limit,
                           self.unrouted + info.route.lost,
                           jnp.maximum(self.route_needed, info.route.needed))


class TableState(NamedTuple):
    """A table, its optimizer state and its :class:`TableReport` (the collection's state
    maps table names to these)."""

    table: HashTable | ShardedHashTable
    opt_state: Any
    report: TableReport | None = None


class Lookup(NamedTuple):
    """What :meth:`EmbeddingCollection.lookup_or_insert` (or ``lookup``) read, per feature (and
    per table for ``info``).

    Attributes:
        rows: feature → float ``[N, dim]``, the row of each id (zeros for padding).
        slots: feature → int32 ``[N]``, the slot of each id (-1: padding, not placed).
        bags: feature → the :class:`Bags` looked up.
        info: table → ``LookupInfo`` of its ``lookup_or_insert`` (None for ``lookup``);
            ``unplaced`` counts ids lost to a full table, ``filtered`` the padding.
    """

    rows: dict[str, jax.Array]
    slots: dict[str, jax.Array]
    bags: dict[str, Bags]
    info: dict[str, LookupInfo | None]


def feature_salt(name: str) -> tuple[np.uint32, np.uint32]:
    """The 64-bit salt of a feature, as ``(lo, hi)`` words: the first 8 bytes of BLAKE2b of
    its name (stable across processes and feature order, so checkpoints stay valid).

    >>> [hex(w) for w in feature_salt("user")] == [hex(w) for w in feature_salt("user")]
    True
    """
    lo, hi = np.frombuffer(hashlib.blake2b(name.encode(), digest_size=8).digest(), "<u4")
    return np.uint32(lo), np.uint32(hi)


def salt_ids(feature: str, ids: Words64) -> Words64:
    """``ids`` XOR the feature's salt (:func:`feature_salt`): the keys under which a
    feature sharing a table stores its ids (the same rule for any other store of ids, e.g.
    a hashed dense baseline, so both see the same keys).

    >>> import numpy as np
    >>> w = Words64(np.zeros(1, np.uint32), np.zeros(1, np.uint32))
    >>> [int(x[0]) for x in salt_ids("user", w)] == [int(x) for x in feature_salt("user")]
    True
    """
    lo, hi = feature_salt(feature)
    return Words64(ids.lo ^ lo, ids.hi ^ hi)


def _initial_values(config: TableConfig, key: jax.Array) -> Any:
    init = config.initializer
    size, dim = config.bucket_size, config.embedding_dim
    where = dict(placement=config.placement, key_dtype=config.key_dtype, dtype=config.dtype)
    if config.placement is not None:  # a whole number of slots per shard
        size = -(-size // config.placement.num_shards) * config.placement.num_shards
    if init is None:
        return init_table(size, dim, key=key, **where)
    if callable(init):  # grown tables draw their new rows from it too
        return init_table(size, dim, initializer=init, key=key, **where)
    return init_table(size, dim, initializer_mode="constant", constant_value=float(init),
                      **where)


def _check_rows_dtype(config: TableConfig) -> None:
    try:
        name = jnp.dtype(config.dtype).name
    except TypeError:
        name = repr(config.dtype)
    if name not in ("float32", "bfloat16", "float16"):
        raise OpDTypeError(_OP, f"{config.name}.dtype", "jnp.float32, jnp.bfloat16 or "
                           "jnp.float16 (the rows' dtype)", name)


class EmbeddingCollection:
    """Named features on hash tables (see the module docstring for a training step).

    Args:
        tables: the :class:`TableConfig` of each table; every feature in exactly one.
    """

    def __init__(self, tables: Sequence[TableConfig]):
        self.tables = tuple(tables)
        self._table_of: dict[str, TableConfig] = {}
        names = set()
        for config in self.tables:
            if not isinstance(config, TableConfig) or config.name in names:
                raise OpArgumentError(_OP, "tables", "TableConfigs with distinct names",
                                      repr(getattr(config, "name", config)))
            names.add(config.name)
            check_pooling(_OP, config.pooling)
            _check_rows_dtype(config)
            if isinstance(config.features, str) or not config.features:
                raise OpArgumentError(_OP, f"{config.name}.features",
                                      "a non-empty tuple of feature names", repr(config.features))
            for feature in config.features:
                if feature in self._table_of:
                    raise OpArgumentError(_OP, "tables", "each feature in one table",
                                          f"{feature!r} in {self._table_of[feature].name!r} "
                                          f"and {config.name!r}")
                self._table_of[feature] = config

    def init(self, key: jax.Array) -> dict[str, TableState]:
        """Empty tables (rows from each initializer) and their optimizer states."""
        state = {}
        for i, config in enumerate(self.tables):
            table = _initial_values(config, jax.random.fold_in(key, i))
            table = set_load_policy(table, max_load_factor=config.max_load_factor,
                                    policy=config.load_policy)
            state[config.name] = TableState(table, config.optimizer.init(table),
                                            TableReport.zero())
        return state

    def _keys(self, config: TableConfig, feature: str, bags: Bags) -> Words64:
        ids = bags.ids
        if not config.share_ids and len(config.features) > 1:
            ids = salt_ids(feature, ids)
        return Words64(jnp.where(bags.valid, ids.lo, _PAD), jnp.where(bags.valid, ids.hi, _PAD))

    def _grouped(self, features: Mapping[str, Any]) -> dict[str, list[str]]:
        unknown = [f for f in features if f not in self._table_of]
        if unknown:
            raise OpArgumentError(_OP, "features", f"names among {list(self._table_of)}",
                                  repr(unknown))
        for name, bags in features.items():
            if not isinstance(bags, Bags):
                raise OpArgumentError(_OP, f"features[{name!r}]", "a jaxops.embedding.Bags",
                                      type(bags).__name__)
            key_dtype = np.dtype(self._table_of[name].key_dtype).name
            if bags.narrow and key_dtype in ("int64", "uint64"):
                raise OpArgumentError(
                    _OP, f"features[{name!r}]", f"{key_dtype} ids as words (ht.words.as_words"
                    "(ids)) or numpy with jax_enable_x64 off", "Bags of a JAX int32 array: "
                    "JAX may have narrowed 64-bit ids to it", "Make the Bags from "
                    "ht.words.as_words(ids) on the host, or give the table "
                    "TableConfig(key_dtype=np.int32) if the ids are 32-bit.")
        groups: dict[str, list[str]] = {}
        for config in self.tables:
            given = [f for f in config.features if f in features]
            if given:
                groups[config.name] = given
        return groups

    def lookup_or_insert(self, state: Mapping[str, TableState], features: Mapping[str, Bags]
                         ) -> tuple[dict[str, TableState], Lookup]:
        """Rows and slots of every id of ``features``, inserting absent ids (training; one
        probe per table).

        Args:
            state: from :meth:`init`.
            features: feature name → :class:`Bags` (any subset of the features).

        Returns:
            ``(state, lookup)``: the state with ids inserted and counted, and a
            :class:`Lookup` to pool and to apply gradients with.
        """
        state = dict(state)
        rows, slots, info = {}, {}, {}
        for table_name, group, config, words in self._table_keys(features):
            table, rows[table_name], info[table_name] = lookup_or_insert(
                state[table_name].table, words, filter_key_flag=True, filter_key=-1,
                route_capacity=config.route_capacity)
            slots[table_name] = info[table_name].slots
            report = state[table_name].report
            state[table_name] = state[table_name]._replace(
                table=table, report=None if report is None else report.add(info[table_name]))
        return state, self._per_feature(features, rows, slots, info)

    def lookup(self, state: Mapping[str, TableState], features: Mapping[str, Bags]) -> Lookup:
        """Rows and slots of every id of ``features``, reading only: an absent id gets a
        zero row and slot -1, and no table changes (evaluation, serving)."""
        rows, slots = {}, {}
        for table_name, group, config, words in self._table_keys(features):
            table, capacity = state[table_name].table, config.route_capacity
            at, _ = with_route(locate)(table, words, route_capacity=capacity)
            at = jnp.where((words.lo == _PAD) & (words.hi == _PAD), -1, at)
            rows[table_name], _ = with_route(gather)(table, at, route_capacity=capacity)
            slots[table_name] = at
        return self._per_feature(features, rows, slots, dict.fromkeys(rows))

    def _table_keys(self, features: Mapping[str, Bags]):
        """``(table name, its features, its config, their keys)`` per table looked up."""
        for table_name, group in self._grouped(features).items():
            config = next(c for c in self.tables if c.name == table_name)
            keys = [self._keys(config, f, features[f]) for f in group]
            yield table_name, group, config, Words64(jnp.concatenate([k.lo for k in keys]),
                                                     jnp.concatenate([k.hi for k in keys]))

    def _per_feature(self, features: Mapping[str, Bags], rows: dict, slots: dict,
                     info: dict) -> Lookup:
        """A :class:`Lookup` from each table's rows and slots (its features' in order)."""
        out_rows, out_slots, bags = {}, {}, {}
        for table_name, group in self._grouped(features).items():
            bounds = np.cumsum([features[f].ids.lo.shape[0] for f in group])[:-1]
            for f, r, s in zip(group, jnp.split(rows[table_name], bounds),
                               jnp.split(slots[table_name], bounds)):
                out_rows[f], out_slots[f], bags[f] = r, s, features[f]
        return Lookup(out_rows, out_slots, bags, info)

    def pool(self, lookup: Lookup, rows: Mapping[str, jax.Array] | None = None
             ) -> dict[str, jax.Array]:
        """feature → pooled ``[num_bags, dim]`` with its table's pooling; ``rows`` replaces
        ``lookup.rows`` (pass the rows you differentiate with respect to)."""
        rows = lookup.rows if rows is None else rows
        return {f: pool(rows[f], lookup.bags[f], self._table_of[f].pooling) for f in lookup.bags}

    def apply_gradients(self, state: Mapping[str, TableState], lookup: Lookup,
                        grads: Mapping[str, jax.Array], step: Any = None
                        ) -> dict[str, TableState]:
        """Each table's row optimizer on its features' row gradients, by slot (one update
        per table; duplicate ids across its features are summed).

        Args:
            state: the state after :meth:`lookup_or_insert`.
            lookup: what :meth:`lookup_or_insert` returned.
            grads: feature → float ``[N, dim]``, d loss / d ``lookup.rows[feature]``.
            step: the global step (schedules; Adam's global bias correction).
        """
        state = dict(state)
        for table_name, group in self._grouped(lookup.bags).items():
            config = next(c for c in self.tables if c.name == table_name)
            slots = jnp.concatenate([lookup.slots[f] for f in group])
            g = jnp.concatenate([grads[f] for f in group])
            table, opt_state = config.optimizer.update(state[table_name].table,
                                                       state[table_name].opt_state, slots, g,
                                                       step, route_capacity=config.route_capacity)
            state[table_name] = state[table_name]._replace(table=table, opt_state=opt_state)
        return state

    def maintain(self, state: Mapping[str, TableState], *, headroom: int | None = None
                 ) -> tuple[dict[str, TableState], dict[str, Maintenance]]:
        """Every table's load policy, between jitted steps (see
        :func:`jaxops.hashtable.maintain`): a table near its limit grows with its optimizer
        state (new slots from the table's initializer) or evicts its lowest-scored ids
        (their optimizer state reset), as its :class:`TableConfig` says; with ``"error"``
        a table past its limit, or one that lost ids, raises, naming it. A table on a mesh
        without a ``route_capacity`` of its config gets routing buffers of twice what the
        steps needed (each device sends each distinct id once: the buffers hold a fraction
        of the batch).

        Args:
            state: the state after some steps.
            headroom: new ids the next steps may add to each table; default: twice the
                most one step inserted since the last call.

        Returns:
            ``(state, reports)``: the state (reports reset) and each table's
            :class:`~jaxops.hashtable.Maintenance`, which also counts the ids lost.
        """
        state = dict(state)
        reports = jax.device_get({name: s.report for name, s in state.items()
                                  if s.report is not None})
        done = {}
        for config in self.tables:
            table_state = state[config.name]
            seen = reports.get(config.name)
            room = headroom if headroom is not None else \
                (2 * int(seen.max_inserted) if seen is not None else 0)
            table, (opt_state,), done[config.name] = maintain(
                table_state.table, [(table_state.opt_state, config.optimizer.init)],
                headroom=room, lost=int(seen.unplaced) if seen is not None else 0,
                route_needed=int(seen.route_needed) if seen is not None
                and config.route_capacity is None else 0, name=config.name)
            if seen is not None:
                done[config.name] = done[config.name]._replace(unrouted=int(seen.unrouted))
            state[config.name] = TableState(table, opt_state, TableReport.zero())
        return state, done
