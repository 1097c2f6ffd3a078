"""What a checkpoint of a train state holds: every leaf by name, the tables, and the row
optimizer states that belong to each table.

A train state is any pytree (dicts, NamedTuples, Flax NNX states, Equinox modules) whose
leaves are arrays or scalars. :func:`parts` walks it and finds:

- **tables** (:class:`HashTable`, :class:`ShardedHashTable`): stored as their slot fields
  (``key_lo`` ... ``last_access``, ``[slots]`` on one device, ``[shards, slots]`` on a
  mesh), their per-shard counts and (on a mesh) ``unrouted``, under the table's name, the
  same names on every placement; their static fields go to the checkpoint's metadata;
- **row optimizer states**: NamedTuples whose last field is ``skipped``, or ``skipped`` then
  ``rounding`` (every optimizer of ``jaxops.hashtable.optim``, ``adam_w_init``'s state).
  Each belongs to the table of the same layout nearest to it in the tree: the longest
  common path prefix, then the longest common suffix of the rest
  (``state["ids"].opt_state`` goes with ``state["ids"].table``; ``opt["a"]`` with
  ``tables["a"]``); a tie is an error that names both tables. Its leaves
  with a slot axis are *slot* leaves (moved with their keys when a restore re-owns them),
  the others are *shard* leaves (one value per shard);
- every other leaf is *plain* (Orbax restores it onto the target's sharding).

A leaf's name is its path, each key written with ``[A-Za-z0-9_-]`` (other characters as
``~xx`` hex) and joined with ``.``: the same state gives the same names in every process
and on every placement.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> found = parts({"emb": {"table": t, "opt": ht.optim.adagrad(0.1).init(t)}, "step": 3})
>>> sorted(found.tables), found.states["emb.opt"].table, found.kinds["step"]
(['emb.table'], 'emb.table', 'plain')
>>> found.kinds["emb.opt.sum_of_squares"], found.kinds["emb.opt.skipped.lo"]
('slot', 'shard')
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxops.core.errors import CheckpointError
from jaxops.hashtable._placement.on_mesh import ShardedHashTable
from jaxops.hashtable._table.table import HashTable

__all__ = ["SHARD_FIELDS", "SLOT_FIELDS", "Parts", "StatePart", "TablePart", "initializer_from_json",
           "initializer_json", "is_row_state", "leaf_name", "parts"]

#: A table's fields with a slot axis, and its per-shard counts (``dropped`` as two words).
SLOT_FIELDS = ("key_lo", "key_hi", "counter_lo", "counter_hi", "flags", "values", "last_access",
               "epoch")
SHARD_FIELDS = ("live", "not_exported", "dropped.lo", "dropped.hi", "clock")
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def is_row_state(x: Any) -> bool:
    """A row optimizer's state: a NamedTuple whose last field is ``skipped`` (or
    ``skipped`` then ``rounding``, the count a state of half rows keeps)."""
    fields = tuple(getattr(x, "_fields", ())) if isinstance(x, tuple) else ()
    return fields[-1:] == ("skipped",) or fields[-2:] == ("skipped", "rounding")


def _is_table(x: Any) -> bool:
    return isinstance(x, (HashTable, ShardedHashTable))


def _component(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            text = str(getattr(key, attr))
            break
    else:
        text = str(key)
    return "".join(c if c in _SAFE else "".join(f"~{b:02x}" for b in c.encode())
                   for c in text) or "~"


def leaf_name(path: tuple) -> str:
    """The name of the leaf at ``path`` (a jax key path; see the module docstring).

    >>> leaf_name((jax.tree_util.DictKey("a.b"), jax.tree_util.SequenceKey(0)))
    'a~2eb.0'
    """
    return ".".join(_component(k) for k in path) or "~root"


@dataclasses.dataclass
class TablePart:
    """A table in a train state (``table`` may be abstract: ``jax.ShapeDtypeStruct`` leaves)."""

    name: str
    where: str  # the key path as jax prints it, for messages
    table: Any

    @property
    def sharded(self) -> bool:
        return isinstance(self.table, ShardedHashTable)

    @property
    def storage(self) -> HashTable:
        return self.table.shards if self.sharded else self.table

    @property
    def num_shards(self) -> int:
        return self.table.num_shards if self.sharded else 1

    @property
    def shard_size(self) -> int:
        return self.storage.bucket_size

    def fields(self) -> dict[str, Any]:
        """Name → array of what a checkpoint stores of the table."""
        s = self.storage
        out = {f"{self.name}.{f}": getattr(s, f) for f in SLOT_FIELDS + ("live", "not_exported",
                                                                        "clock")}
        out[f"{self.name}.dropped.lo"], out[f"{self.name}.dropped.hi"] = s.dropped
        if self.sharded:
            out[f"{self.name}.unrouted"] = self.table.unrouted
        return out

    def statics(self) -> dict[str, Any]:
        """The layout and static fields, as JSON (see :func:`initializer_json`)."""
        s = self.storage
        return {"sharded": self.sharded, "num_shards": self.num_shards,
                "shard_size": self.shard_size, "embedding_dim": s.embedding_dim,
                "max_load_factor": s.max_load_factor, "load_policy": s.load_policy,
                "key_dtype": s.key_dtype, "initializer": initializer_json(s.initializer),
                "route_capacity": self.table.route_capacity if self.sharded else None}


def _callable_name(f: Any) -> str:
    return f"{getattr(f, '__module__', None)}.{getattr(f, '__qualname__', type(f).__name__)}"


def initializer_json(initializer: tuple) -> list:
    """A table's static ``initializer`` as JSON: a callable one by its qualified name (code
    is not saved: a restore takes the function of the target's table, which must have the
    same name).

    >>> initializer_json(("uniform", -0.05, 0.05, (0, 42)))
    ['uniform', -0.05, 0.05, [0, 42]]
    """
    kind, *rest = initializer
    if kind == "callable":
        return [kind, _callable_name(rest[0]), None if rest[1] is None else list(rest[1])]
    if kind == "uniform":
        return [kind, rest[0], rest[1], None if rest[2] is None else list(rest[2])]
    return [kind, *rest]


def initializer_from_json(saved: list, target: tuple, where: str) -> tuple:
    """The static ``initializer`` of :func:`initializer_json` back (a callable's function
    from ``target``, the target table's initializer)."""
    kind = saved[0]
    if kind == "callable":
        if target[0] != "callable" or _callable_name(target[1]) != saved[1]:
            raise CheckpointError(f"{where}: the table was saved with the initializer "
                                  f"function {saved[1]} (functions are not saved); the target's "
                                  f"table has {initializer_json(target)[:2]}: make it with the "
                                  "same initializer")
        return (kind, target[1], None if saved[2] is None else tuple(saved[2]))
    if kind == "uniform":
        return (kind, saved[1], saved[2], None if saved[3] is None else tuple(saved[3]))
    return tuple(saved)


@dataclasses.dataclass
class StatePart:
    """A row optimizer state and the name of its table."""

    name: str
    where: str
    state: Any
    table: str
    leaves: dict[str, Any]  # name → leaf
    slot: list[str]  # names of the leaves with a slot axis


@dataclasses.dataclass
class Parts:
    """A train state taken apart: see :func:`parts`."""

    treedef: Any  # of the state with tables and row states as leaves
    nodes: list[tuple[str, str]]  # (kind, name) per treedef leaf: "table", "state", "leaf"
    leaves: dict[str, Any]  # plain leaves by name
    tables: dict[str, TablePart]
    states: dict[str, StatePart]
    kinds: dict[str, str]  # every stored name → "plain", "table", "slot", "shard"
    where: dict[str, str]  # every plain leaf's key path as jax prints it
    loose: dict[str, tuple[Any, list[str]]]  # row states with no table: (treedef, leaf names)

    def unflatten(self, leaves: dict[str, Any], tables: dict[str, Any],
                  states: dict[str, Any]) -> Any:
        """The state's structure holding restored plain leaves, tables and states."""
        out = []
        for kind, name in self.nodes:
            if kind == "table":
                out.append(tables[name])
            elif kind == "state":
                out.append(states[name])
            elif kind == "loose":
                tree, names = self.loose[name]
                out.append(tree.unflatten([leaves[n] for n in names]))
            else:
                out.append(leaves[name])
        return self.treedef.unflatten(out)

    def flat(self) -> dict[str, Any]:
        """Name → array: everything a checkpoint stores (what Orbax writes)."""
        out = dict(self.leaves)
        for t in self.tables.values():
            out.update(t.fields())
        for s in self.states.values():
            out.update(s.leaves)
        return out


def parts(tree: Any, op: str = "save") -> Parts:
    """Takes a train state apart (see the module docstring).

    Raises:
        CheckpointError: two leaves with one name, or a row optimizer state that two
            tables claim equally.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: _is_table(x) or is_row_state(x))
    nodes, leaves, tables, found_states, where = [], {}, {}, [], {}
    for path, x in flat:
        name = leaf_name(path)
        if _is_table(x):
            tables[name] = TablePart(name, jax.tree_util.keystr(path), x)
            nodes.append(("table", name))
        elif is_row_state(x):
            found_states.append((path, name, x))
            nodes.append(("state", name))
        else:
            leaves[name] = x
            where[name] = jax.tree_util.keystr(path)
            nodes.append(("leaf", name))
    states, loose = {}, {}
    for path, name, x in found_states:
        inner_flat, inner_tree = jax.tree_util.tree_flatten_with_path(x)
        inner = {f"{name}.{leaf_name(p)}": v for p, v in inner_flat}
        table_name = _table_of_state(op, path, name, inner, tables)
        if table_name is None:  # no table of its layout: its leaves are ordinary arrays
            leaves.update(inner)
            where.update({f"{name}.{leaf_name(p)}": jax.tree_util.keystr(path + p)
                          for p, _ in inner_flat})
            loose[name] = (inner_tree, list(inner))
            nodes[nodes.index(("state", name))] = ("loose", name)
            continue
        table = tables[table_name]
        slot = [n for n, v in inner.items() if _has_slot_axis(v, table)]
        states[name] = StatePart(name, jax.tree_util.keystr(path), x, table_name, inner, slot)
    kinds = {n: "plain" for n in leaves}
    for t in tables.values():
        kinds.update({n: "table" for n in t.fields()})
    for s in states.values():
        kinds.update({n: "slot" if n in s.slot else "shard" for n in s.leaves})
    if len(kinds) != len(leaves) + sum(len(t.fields()) for t in tables.values()) + sum(
            len(s.leaves) for s in states.values()):
        raise CheckpointError(f"{op}: two leaves of the state have the same name once their "
                              "keys are written as names (keys differing only in characters "
                              "outside [A-Za-z0-9_-]); rename one")
    return Parts(treedef, nodes, leaves, tables, states, kinds, where, loose)


def _has_slot_axis(leaf: Any, table: TablePart) -> bool:
    shape = tuple(np.shape(leaf))
    lead = (table.num_shards,) if table.sharded else ()
    return shape[:len(lead) + 1] == lead + (table.shard_size,) and len(shape) > len(lead)


def _fits(inner: dict, table: TablePart) -> bool:
    """Whether every leaf of a state is laid out like ``table``'s (on a mesh: the leading
    shard axis)."""
    return not table.sharded or all(np.shape(v)[:1] == (table.num_shards,)
                                    for v in inner.values())


def _table_of_state(op: str, path: tuple, name: str, inner: dict, tables: dict) -> str | None:
    """The table a state belongs to: of its layout (its rows have the table's slot axis;
    a state without rows, one scalar per shard), the nearest (see the module docstring)."""
    fits = [t for t in tables.values() if _fits(inner, t)]
    slot_fits = [t for t in fits if any(_has_slot_axis(v, t) for v in inner.values())]
    candidates = slot_fits or ([t for t in fits if not any(
        np.ndim(v) > (1 if t.sharded else 0) for v in inner.values())])
    if not candidates:
        return None
    mine = [_component(k) for k in path]

    def score(t: TablePart) -> tuple[int, int]:
        theirs = t.name.split(".")
        p = 0
        while p < min(len(mine), len(theirs)) and mine[p] == theirs[p]:
            p += 1
        a, b = mine[p:], theirs[p:]
        s = 0
        while s < min(len(a), len(b)) and a[-1 - s] == b[-1 - s]:
            s += 1
        return p, s

    best = max(score(t) for t in candidates)
    winners = [t for t in candidates if score(t) == best]
    if len(winners) > 1:
        raise CheckpointError(
            f"{op}: the row optimizer state at {jax.tree_util.keystr(path)} could belong to "
            f"{winners[0].where} or {winners[1].where} (same layout, equally near). Put "
            "each optimizer state beside its table (e.g. in a jaxops.embedding.TableState) "
            "or under the same key as its table.")
    return winners[0].name
