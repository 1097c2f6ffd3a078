"""Row optimizers for hash tables: ``sgd``, ``adagrad``, ``rowwise_adagrad``, ``adam``,
``adamw`` and ``ftrl`` (see :class:`~jaxops.hashtable.optim.RowOptimizer` for the ``init`` /
``update`` contract).

Each touched row takes exactly the step the matching optax transform takes on that row
(``optax.sgd``, ``optax.adagrad``, ``optax.adam``, ``optax.adamw``; ``ftrl`` follows
TensorFlow's FTRL-Proximal, ``rowwise_adagrad`` FBGEMM's exact row-wise Adagrad, neither of
which optax has). Rows not in the batch do not move and their state does not decay (lazy
updates, as TorchRec's fused optimizers and TFRA).

**Adam's step count.** ``adam`` / ``adamw`` keep one step count per row (int32, 4 bytes a
row) and bias-correct each row with its own count, so a row updated ``k`` times is exactly
where ``optax.adam`` is after ``k`` steps on that row's gradients. Passing ``step=`` uses
the global count instead (``step + 1``, as optax's ``count``), which is TensorFlow's
LazyAdam: rows that were absent for a while are corrected as if they had been updated.

**A slot's state belongs to its key.** Each state with per-slot rows records the key they
belong to (``owner``, 12 bytes a slot: key words and the slot's epoch). When a new key
takes an evicted key's slot or an evicted key comes back (``lookup_or_insert`` or
``import_`` after ``evict``, ``evict_lowest``, ``evict_if``), or ``compact`` moves a key,
the slot's first update starts from the initial state (zero moments and count,
``initial_accumulator_value``) as for a never-touched row, never from the state of the key
(or of the key's earlier life) that was there (see :mod:`~jaxops.hashtable._walks.slot_owner`).

>>> import numpy as np, jax.numpy as jnp, jaxops.hashtable as ht
>>> t = ht.init_table(16, 2, initializer_mode="constant", constant_value=1.0)
>>> t, rows, info = ht.lookup_or_insert(t, np.array([7, 9, 7], np.int64))
>>> opt = ht.optim.adam(0.1)
>>> state = opt.init(t)
>>> t, state = opt.update(t, state, info.slots, jnp.ones((3, 2)))
>>> np.asarray(ht.find(t, np.array([7, 9], np.int64))[0], np.float64).round(4).tolist()
[[0.9, 0.9], [0.9, 0.9]]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxops.hashtable._table.buffers import filled
from jaxops.hashtable._table.table import HashTable
from jaxops.hashtable._table.words64 import Counter64
from jaxops.hashtable._walks.slot_owner import SlotOwner
from jaxops.hashtable.optim._rows import RowOptimizer, make_row_optimizer, resolve, slot_owners

__all__ = [
    "AdagradState", "AdamState", "FtrlState", "RowwiseAdagradState", "SgdState", "adagrad",
    "adam", "adamw", "ftrl", "rowwise_adagrad", "sgd",
]

Scalar = Any  # a float, a scalar array, or (learning rates) a schedule ``step -> float``


class SgdState(NamedTuple):
    """``skipped``: :class:`~jaxops.hashtable._table.words64.Counter64` (uint64), batch entries
    with slot -1 so far; ``int(state.skipped)`` reads it."""

    skipped: Counter64


class AdagradState(NamedTuple):
    """``sum_of_squares``: per-slot ``[bucket_size, dim]``; ``owner``: the key each slot's
    state belongs to (see :mod:`~jaxops.hashtable._walks.slot_owner`); ``skipped`` as
    :class:`SgdState`."""

    sum_of_squares: jax.Array
    owner: SlotOwner
    skipped: Counter64


class RowwiseAdagradState(NamedTuple):
    """``sum_of_squares``: one float per slot ``[bucket_size]`` (the mean over the row);
    ``owner``, ``skipped`` as :class:`AdagradState`."""

    sum_of_squares: jax.Array
    owner: SlotOwner
    skipped: Counter64


class AdamState(NamedTuple):
    """``mu``, ``nu``: per-slot moments; ``count``: int32 ``[bucket_size]`` updates per row;
    ``owner``, ``skipped`` as :class:`AdagradState`."""

    mu: jax.Array
    nu: jax.Array
    count: jax.Array
    owner: SlotOwner
    skipped: Counter64


class FtrlState(NamedTuple):
    """``accumulator`` (sum of squared gradients) and ``linear``, per slot ``[slots, dim]``;
    ``owner``, ``skipped`` as :class:`AdagradState`."""

    accumulator: jax.Array
    linear: jax.Array
    owner: SlotOwner
    skipped: Counter64


def _zero_count() -> Counter64:
    return Counter64.zero()


def _full(table: HashTable, value: float, row_shape: tuple[int, ...] | None = None) -> jax.Array:
    # One fresh buffer per call: donating a state whose leaves share a buffer fails.
    shape = table.values.shape if row_shape is None else (table.bucket_size, *row_shape)
    return filled(shape, table.values.dtype, value)


def _step(w: jax.Array, u: jax.Array, lr: Scalar) -> jax.Array:
    """optax's ``scale_by_learning_rate`` then ``apply_updates``: ``w + u * -lr``."""
    return w + (u * (-jnp.asarray(lr, w.dtype))).astype(w.dtype)


def sgd(learning_rate: Scalar) -> RowOptimizer:
    """Plain SGD on rows, ``w -= lr * g`` (``optax.sgd`` without momentum; for momentum
    wrap ``optax.sgd(lr, momentum)`` with :func:`~jaxops.hashtable.optim.from_optax`).

    >>> import numpy as np, jax.numpy as jnp, jaxops.hashtable as ht
    >>> t = ht.init_table(8, 1, initializer_mode="constant", constant_value=1.0)
    >>> t, _, info = ht.lookup_or_insert(t, np.array([5, 5, 6], np.int64))
    >>> opt = ht.optim.sgd(0.5)
    >>> t, s = opt.update(t, opt.init(t), info.slots, jnp.ones((3, 1)))
    >>> ht.find(t, np.array([5, 6], np.int64))[0][:, 0].tolist()
    [0.0, 0.5]
    """
    def rule(w, g, state, step):
        return _step(w, g, resolve(learning_rate, step, "hashtable.optim.sgd",
                                   "learning_rate")), state

    return make_row_optimizer("sgd", lambda t: SgdState(_zero_count()), rule)


def adagrad(learning_rate: Scalar, initial_accumulator_value: float = 0.1,
            eps: float = 1e-7) -> RowOptimizer:
    """Adagrad on rows, element-wise (``optax.adagrad``: ``s += g²``, ``w -= lr·g/√(s+eps)``).

    >>> import numpy as np, jax.numpy as jnp, jaxops.hashtable as ht
    >>> t = ht.init_table(8, 1, initializer_mode="constant", constant_value=1.0)
    >>> t, _, info = ht.lookup_or_insert(t, np.array([5], np.int64))
    >>> opt = ht.optim.adagrad(0.5, initial_accumulator_value=0.0, eps=0.0)
    >>> t, s = opt.update(t, opt.init(t), info.slots, jnp.full((1, 1), 2.0))
    >>> float(t.values[info.slots[0], 0]), float(s.sum_of_squares[info.slots[0], 0])
    (0.5, 4.0)
    """
    def init(table):
        return AdagradState(_full(table, initial_accumulator_value), slot_owners(table),
                            _zero_count())

    def rule(w, g, state, step):
        lr = resolve(learning_rate, step, "hashtable.optim.adagrad", "learning_rate")
        (acc,) = state
        acc = g * g + acc
        scale = jnp.where(acc > 0, jax.lax.rsqrt(acc + jnp.asarray(eps, acc.dtype)), 0.0)
        return _step(w, scale * g, lr), (acc,)

    return make_row_optimizer("adagrad", init, rule)


def rowwise_adagrad(learning_rate: Scalar, initial_accumulator_value: float = 0.0,
                    eps: float = 1e-8) -> RowOptimizer:
    """Row-wise Adagrad (FBGEMM / TorchRec ``EXACT_ROWWISE_ADAGRAD``): one accumulator per
    row, ``s += mean(g²)``, ``w -= lr·g/(√s + eps)``; state is 4 bytes a row instead of
    ``4·dim``.

    >>> import numpy as np, jax.numpy as jnp, jaxops.hashtable as ht
    >>> t = ht.init_table(8, 2, initializer_mode="constant", constant_value=1.0)
    >>> t, _, info = ht.lookup_or_insert(t, np.array([5], np.int64))
    >>> opt = ht.optim.rowwise_adagrad(1.0, eps=0.0)
    >>> t, s = opt.update(t, opt.init(t), info.slots, jnp.array([[3.0, 4.0]]))
    >>> s.sum_of_squares.shape, float(s.sum_of_squares[info.slots[0]])
    ((8,), 12.5)
    """
    def init(table):
        return RowwiseAdagradState(_full(table, initial_accumulator_value, ()),
                                   slot_owners(table), _zero_count())

    def rule(w, g, state, step):
        lr = resolve(learning_rate, step, "hashtable.optim.rowwise_adagrad", "learning_rate")
        (acc,) = state
        acc = acc + jnp.mean(g * g, axis=-1)
        scale = 1.0 / (jnp.sqrt(acc) + jnp.asarray(eps, acc.dtype))
        return _step(w, scale[:, None] * g, lr), (acc,)

    return make_row_optimizer("rowwise_adagrad", init, rule)


def _adam_init(table: HashTable) -> AdamState:
    return AdamState(_full(table, 0.0), _full(table, 0.0),
                     filled((table.bucket_size,), jnp.int32, 0), slot_owners(table),
                     _zero_count())


def _adam_rule(name: str, learning_rate, b1, b2, eps, eps_root, weight_decay):
    def rule(w, g, state, step):
        lr = resolve(learning_rate, step, f"hashtable.optim.{name}", "learning_rate")
        mu, nu, count = state
        mu = (1 - b1) * g + b1 * mu
        nu = (1 - b2) * (g * g) + b2 * nu
        count = count + 1
        # Bias correction: the row's own count, or the global one (see the module doc).
        n = count if step is None else jnp.broadcast_to(jnp.asarray(step) + 1, count.shape)
        mu_hat = mu / (1 - b1 ** n).astype(mu.dtype)[:, None]
        nu_hat = nu / (1 - b2 ** n).astype(nu.dtype)[:, None]
        u = mu_hat / (jnp.sqrt(nu_hat + eps_root) + eps)
        if weight_decay:
            u = u + weight_decay * w
        return _step(w, u, lr), (mu, nu, count)

    return rule


def adam(learning_rate: Scalar, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         eps_root: float = 0.0) -> RowOptimizer:
    """Lazy Adam on rows (``optax.adam`` row by row, per-row step counts; see the module
    docstring for ``step=``).

    >>> import numpy as np, jax.numpy as jnp, jaxops.hashtable as ht
    >>> t = ht.init_table(8, 1, initializer_mode="constant", constant_value=0.0)
    >>> t, _, info = ht.lookup_or_insert(t, np.array([5], np.int64))
    >>> opt = ht.optim.adam(0.1)
    >>> t, s = opt.update(t, opt.init(t), info.slots, jnp.full((1, 1), -3.0))
    >>> round(float(t.values[info.slots[0], 0]), 4), int(s.count[info.slots[0]])
    (0.1, 1)
    """
    return make_row_optimizer("adam", _adam_init,
                              _adam_rule("adam", learning_rate, b1, b2, eps, eps_root, 0.0))


def adamw(learning_rate: Scalar, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          eps_root: float = 0.0, weight_decay: float = 1e-4) -> RowOptimizer:
    """Lazy AdamW on rows (``optax.adamw`` row by row: decoupled weight decay on touched rows
    only; step counts as :func:`adam`). Unlike :func:`~jaxops.hashtable.apply_adam_w`, it
    takes slots (no re-probe) and keeps per-row counts.

    >>> import numpy as np, jax.numpy as jnp, jaxops.hashtable as ht
    >>> t = ht.init_table(8, 1, initializer_mode="constant", constant_value=1.0)
    >>> t, _, info = ht.lookup_or_insert(t, np.array([5], np.int64))
    >>> opt = ht.optim.adamw(0.1, weight_decay=0.5)
    >>> t, s = opt.update(t, opt.init(t), info.slots, jnp.zeros((1, 1)))
    >>> round(float(t.values[info.slots[0], 0]), 4)
    0.95
    """
    return make_row_optimizer("adamw", _adam_init, _adam_rule(
        "adamw", learning_rate, b1, b2, eps, eps_root, weight_decay))


def ftrl(learning_rate: Scalar, learning_rate_power: float = -0.5,
         initial_accumulator_value: float = 0.1, l1: float = 0.0, l2: float = 0.0,
         l2_shrinkage: float = 0.0, beta: float = 0.0) -> RowOptimizer:
    """FTRL-Proximal on rows, as TensorFlow's ``ApplyFtrlV2`` / Keras ``Ftrl`` define it.

    Per element: ``g' = g + 2·l2_shrinkage·w``; ``n' = n + g²``; ``z += g' - (n'^(-p) -
    n^(-p)) / lr · w``; ``w = (sign(z)·l1 - z) / (n'^(-p) / lr + 2·l2')`` where ``|z| > l1``,
    else 0, with ``p = learning_rate_power`` and ``l2' = l2 + beta / (2·lr)`` (Keras).

    >>> import numpy as np, jax.numpy as jnp, jaxops.hashtable as ht
    >>> t = ht.init_table(8, 1, initializer_mode="constant", constant_value=0.0)
    >>> t, _, info = ht.lookup_or_insert(t, np.array([5], np.int64))
    >>> opt = ht.optim.ftrl(1.0, initial_accumulator_value=0.0, l1=1.0)
    >>> t, s = opt.update(t, opt.init(t), info.slots, jnp.full((1, 1), 3.0))
    >>> round(float(t.values[info.slots[0], 0]), 4), float(s.linear[info.slots[0], 0])
    (-0.6667, 3.0)
    """
    op = "hashtable.optim.ftrl"
    power = -learning_rate_power

    def init(table):
        return FtrlState(_full(table, initial_accumulator_value), _full(table, 0.0),
                         slot_owners(table), _zero_count())

    def scaled(n):  # n ** -p, with TF's exact square root for the usual p = -0.5
        return jnp.sqrt(n) if power == 0.5 else n ** power

    def rule(w, g, state, step):
        lr = jnp.asarray(resolve(learning_rate, step, op, "learning_rate"), w.dtype)
        acc, linear = state
        shrunk = g + 2 * l2_shrinkage * w
        new_acc = acc + g * g
        linear = linear + shrunk - (scaled(new_acc) - scaled(acc)) / lr * w
        quadratic = scaled(new_acc) / lr + 2 * (l2 + beta / (2 * lr))
        w = jnp.where(jnp.abs(linear) > l1, (jnp.sign(linear) * l1 - linear) / quadratic, 0.0)
        return w.astype(g.dtype), (new_acc, linear)

    return make_row_optimizer("ftrl", init, rule)
