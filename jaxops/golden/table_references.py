"""Independent references of the hash-table operators (see :mod:`jaxops.golden.references`).

Plain numpy and Python, written from CANN's ops-nn ``hash/`` kernels (arch35), never from
``jaxops.hashtable``: the bucket bytes, MurmurHash3 x86_32 of a key's 8 bytes (seed 0), the
linear probe from ``hash % bucket_size``, the flags, the counters and the AdamW update are
stated here again. A table is the bucket array a table handle points at, uint8
``[bucket_size, 24 + round_up_8(4 * embedding_dim)]``:

======  =============================================================================
bytes   what (little-endian)
======  =============================================================================
0-7     key int64 (-1 in an empty bucket, InitEmbeddingHashTable)
8-15    counter uint64
16-19   int32 state, 1 once a key is written (the spin-wait word of the insert CAS)
20      EVICTED 0x8 (EmbeddingHashTableEvict: ``int32@20 ^= 1 << 3``; LookupOrInsert reads
        and clears it there)
23      VALID 0x1 (the insert CAS writes ``int32@20 = 0x01000000``), FILTER 0x2, EXPORT 0x4
24-     the row, float32; zero padding to 8 bytes
======  =============================================================================

A bucket is empty when the int32 at byte 20 is 0 (the insert's CAS succeeds there). Batches
run one key after another in index order (the kernels run keys on parallel threads; see
the deviations in ``docs/golden.md``, which these references model where they are
deliberate: a new key takes the first tombstone of another key its probe met, a revived
key comes back with VALID alone, Import revives an evicted key, Export and ApplyAdamW skip
evicted keys, a key that finds no slot gets ``default_value``).

ApplyAdamW's float outputs come with a tolerance: the kernel's expressions in float32 where
a compiler may fuse ``a * b ± c`` (C's FP_CONTRACT; XLA does), so an element may differ by
a few roundings of the terms it adds (8 units of 2**-24 of their magnitudes, propagated);
a float16 output may be either float16 value that range rounds to. Everything else is
compared bit for bit.

>>> table = reference("InitEmbeddingHashTable")({}, {"bucket_size": 2, "embedding_dim": 1,
...     "initializer_mode": "constant", "constant_value": 0.5}).outputs["table"]
>>> table.shape, table[0, :8].view("<i8").tolist(), table[0, 24:28].view("<f4").tolist()
((2, 32), [-1], [0.5])
"""

from __future__ import annotations

import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.golden.references import Expected, reference, register_reference  # noqa: F401

__all__ = ["murmur3_key", "row_width"]

VALID, FILTER, EXPORT, EVICTED = 0x1, 0x2, 0x4, 0x8
_EVICTED_BYTE, _FLAG_BYTE, _VALUES = 20, 23, 24
_ULP32 = 2.0**-24
_FUSED = 8  # roundings a fused evaluation may differ by, in units of 2**-24 of the terms


def row_width(embedding_dim: int) -> int:
    """Bytes per bucket: ``24 + round_up_8(4 * embedding_dim)`` (the kernels' RoundUpTo8).

    >>> row_width(3), row_width(4), row_width(5)
    (40, 40, 48)
    """
    return _VALUES + -(-4 * int(embedding_dim) // 8) * 8


def murmur3_key(keys: np.ndarray) -> np.ndarray:
    """MurmurHash3 x86_32, seed 0, of each int64 key's 8 little-endian bytes (hicann/ops-nn
    ``common/inc/op_kernel/hashtable_common.h``: two 4-byte blocks, no tail), uint32.

    >>> hex(int(murmur3_key(np.array([0], np.int64))[0]))
    '0x63852afc'
    """
    words = np.ascontiguousarray(keys, "<i8").view("<u4").reshape(-1, 2).astype(np.uint32)
    h = np.zeros(words.shape[0], np.uint32)
    rotl = lambda x, r: (x << np.uint32(r)) | (x >> np.uint32(32 - r))  # noqa: E731
    for block in (words[:, 0], words[:, 1]):
        k = rotl(block * np.uint32(0xCC9E2D51), 15) * np.uint32(0x1B873593)
        h = rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)
    h ^= np.uint32(8)
    for shift, mult in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h = (h ^ (h >> np.uint32(shift))) * np.uint32(mult)
    return h ^ (h >> np.uint32(16))


class _Table:
    """One bucket array as columns; :meth:`bytes` writes them back."""

    def __init__(self, buf: np.ndarray, dim: int, op: str):
        buf = np.asarray(buf)
        if buf.dtype != np.uint8 or buf.ndim != 2 or buf.shape[1] != row_width(dim):
            raise OpArgumentError(f"golden check {op}", "table", f"uint8 buckets [bucket_size, "
                                  f"{row_width(dim)}] (embedding_dim {dim})",
                                  f"{buf.dtype} {list(buf.shape)}")
        self.buf, self.dim, self.size = buf.copy(), int(dim), buf.shape[0]
        cols = lambda a, b, dt: np.ascontiguousarray(buf[:, a:b]).view(dt).reshape(-1).copy()  # noqa: E731
        self.key, self.counter = cols(0, 8, "<i8"), cols(8, 16, "<u8")
        self.state = cols(16, 20, "<i4")
        self.flag20, self.flag23 = buf[:, _EVICTED_BYTE].copy(), buf[:, _FLAG_BYTE].copy()
        self.values = cols(_VALUES, _VALUES + 4 * dim, "<f4").reshape(self.size, dim)

    def bytes(self) -> np.ndarray:
        out, n = self.buf, self.size
        out[:, 0:8] = self.key.astype("<i8").view(np.uint8).reshape(n, 8)
        out[:, 8:16] = self.counter.astype("<u8").view(np.uint8).reshape(n, 8)
        out[:, 16:20] = self.state.astype("<i4").view(np.uint8).reshape(n, 4)
        out[:, _EVICTED_BYTE], out[:, _FLAG_BYTE] = self.flag20, self.flag23
        out[:, _VALUES:_VALUES + 4 * self.dim] = self.values.astype("<f4").view(
            np.uint8).reshape(n, 4 * self.dim)
        return out

    def empty(self, s: int) -> bool:
        return self.flag20[s] == 0 and self.flag23[s] == 0  # the int32 at byte 20 is 0

    def evicted(self, s: int) -> bool:
        return bool(self.flag20[s] & EVICTED)

    def homes(self, keys: np.ndarray) -> list[int]:
        return (murmur3_key(keys).astype(np.int64) % self.size).tolist()

    def probe(self, key: int, home: int) -> tuple[str, int]:
        """LookupOrInsert's and Import's walk: ``("hit", s)`` at the key (live or evicted),
        ``("new", s)`` at the first empty bucket — or at the first other key's tombstone met
        on the way (a deliberate deviation: CANN's CAS skips tombstones) — ``("full", -1)``
        after ``bucket_size`` buckets."""
        reuse = -1
        for d in range(self.size):
            s = (home + d) % self.size
            if self.empty(s):
                return "new", s if reuse < 0 else reuse
            if self.key[s] == key:
                return "hit", s
            if reuse < 0 and self.evicted(s):
                reuse = s
        return ("new", reuse) if reuse >= 0 else ("full", -1)

    def find_valid(self, key: int, home: int) -> int:
        """ApplyAdamW's walk: the bucket holding ``key``, or -1 at the first bucket without
        VALID (or after ``bucket_size`` buckets)."""
        for d in range(self.size):
            s = (home + d) % self.size
            if not self.flag23[s] & VALID:
                return -1
            if self.key[s] == key:
                return s
        return -1

    def take(self, s: int, key: int) -> None:
        """A new key in bucket ``s``: the insert CAS's VALID, the key, state 1, counter 0;
        the row stays (Init's or an eviction's)."""
        self.key[s], self.state[s], self.counter[s] = key, 1, 0
        self.flag20[s], self.flag23[s] = 0, VALID


def _keys(a) -> list[int]:
    return np.asarray(a, np.int64).reshape(-1).tolist()


@register_reference("InitEmbeddingHashTable", named=True)
def _init(inputs, attrs, mode):
    """Every bucket: key -1, counter 0, bytes 16-23 zero (the kernel's uint64 store at 16),
    the row from ``sampled_values`` (random) or ``constant_value``; padding zero."""
    size, dim = int(attrs["bucket_size"]), int(attrs["embedding_dim"])
    buf = np.zeros((size, row_width(dim)), np.uint8)
    buf[:, 0:8] = 0xFF  # key -1
    if attrs.get("initializer_mode", "random") == "random":
        rows = np.asarray(inputs["sampled_values"], np.float32).reshape(size, dim)
    else:
        rows = np.full((size, dim), attrs.get("constant_value", 0.0), np.float32)
    buf[:, _VALUES:_VALUES + 4 * dim] = rows.astype("<f4").view(np.uint8).reshape(size, 4 * dim)
    return Expected({"table": buf}, None)


@register_reference("EmbeddingHashTableLookupOrInsert", named=True)
def _lookup_or_insert(inputs, attrs, mode):
    """Each key in turn: ``filter_key`` (with ``filter_key_flag``) answers ``default_value``
    or becomes ``default_key``; the probe finds it (an evicted one is revived: EVICTED
    cleared, VALID alone) or inserts it; its counter +1, its row returned.
    ``filter_mode``/``filter_freq`` are read by the tiling and used by no kernel."""
    t = _Table(inputs["table"], attrs["embedding_dim"], "EmbeddingHashTableLookupOrInsert")
    keys = _keys(inputs["keys"])
    rows = np.full((len(keys), t.dim), attrs.get("default_value", 0.0), np.float32)
    for i, key in enumerate(keys):
        if attrs.get("filter_key_flag") and key == attrs.get("filter_key", -1):
            if not attrs.get("default_key_or_value"):
                continue
            key = int(attrs.get("default_key", 0))
        kind, s = t.probe(key, t.homes(np.array([key]))[0])
        if kind == "full":
            continue  # the kernel leaves the row unwritten; the case says default_value
        if kind == "new":
            t.take(s, key)
        elif t.evicted(s):
            t.flag20[s], t.flag23[s] = 0, VALID
        t.counter[s] += np.uint64(1)
        rows[i] = t.values[s]
    return Expected({"values": rows, "table": t.bytes()}, None)


def _tables(inputs: dict, op: str):
    """The numbered tables of a list operator (``table0``, ``table1``, ...) with their dims."""
    dims = _keys(inputs["embedding_dims"])
    sizes = _keys(inputs["bucket_sizes"])
    tables = []
    for i, (dim, size) in enumerate(zip(dims, sizes)):
        t = _Table(inputs[f"table{i}"], dim, op)
        if t.size != size:
            raise OpArgumentError(f"golden check {op}", f"table{i}", f"{size} buckets "
                                  f"(bucket_sizes[{i}])", f"{t.size}")
        tables.append(t)
    return tables


@register_reference("EmbeddingHashTableExport", named=True)
def _export(inputs, attrs, mode):
    """Per table, in bucket order, every VALID, not EVICTED bucket (``export_mode="new"``:
    not EXPORT either): key, counter, FILTER as 0/1, row; EXPORT set on the first export.
    ``filtered_export_flag`` is read by the tiling and unused by the kernel."""
    out: dict = {}
    tables = _tables(inputs, "EmbeddingHashTableExport")
    for i, t in enumerate(tables):
        pick = ((t.flag23 & VALID) != 0) & ((t.flag20 & EVICTED) == 0)
        if attrs.get("export_mode", "all") == "new":
            pick &= (t.flag23 & EXPORT) == 0
        out[f"keys{i}"], out[f"counters{i}"] = t.key[pick], t.counter[pick]
        out[f"filter_flags{i}"] = ((t.flag23[pick] & FILTER) != 0).astype(np.uint8)
        out[f"values{i}"] = t.values[pick]
        t.flag23[pick] |= EXPORT
    out.update({f"table{i}": t.bytes() for i, t in enumerate(tables)})
    return Expected(out, None)


@register_reference("EmbeddingHashTableImport", named=True)
def _import(inputs, attrs, mode):
    """Per table, each entry in turn: found or inserted as LookupOrInsert probes (an evicted
    key is revived), then the counter and row written and VALID | EXPORT or-ed into byte 23
    (the kernel's ``|= 0b101``; ``filter_flags`` is not read, FILTER stays)."""
    tables = _tables(inputs, "EmbeddingHashTableImport")
    for i, t in enumerate(tables):
        keys = _keys(inputs[f"keys{i}"])
        counters = np.asarray(inputs[f"counters{i}"], np.uint64).reshape(-1)
        values = np.asarray(inputs[f"values{i}"], np.float32).reshape(len(keys), t.dim)
        for j, (key, home) in enumerate(zip(keys, t.homes(np.array(keys, np.int64)))):
            kind, s = t.probe(key, home)
            if kind == "full":
                continue
            if kind == "new":
                t.take(s, key)
            t.flag20[s] = 0
            t.flag23[s] |= VALID | EXPORT
            t.counter[s], t.values[s] = counters[j], values[j]
    return Expected({f"table{i}": t.bytes() for i, t in enumerate(tables)}, None)


@register_reference("EmbeddingHashTableEvict", named=True)
def _evict(inputs, attrs, mode):
    """Each key found (the walk compares keys over the whole table) and not yet evicted:
    EVICTED set in byte 20, counter 0, row ``const_val`` or ``sampled_values[i]``."""
    t = _Table(inputs["table"], attrs["embedding_dim"], "EmbeddingHashTableEvict")
    keys = _keys(inputs["keys"])
    random = attrs.get("init_mode", "constant") == "random"
    for i, (key, home) in enumerate(zip(keys, t.homes(np.array(keys, np.int64)))):
        at = next(((home + d) % t.size for d in range(t.size)
                   if t.key[(home + d) % t.size] == key), None)
        if at is None or t.evicted(at):
            continue
        t.flag20[at] |= EVICTED
        t.counter[at] = 0
        t.values[at] = (np.asarray(inputs["sampled_values"], np.float32).reshape(-1, t.dim)[i]
                        if random else attrs.get("const_val", 0.0))
    return Expected({"table": t.bytes()}, None)


def _stored_tolerance(x: np.ndarray, tol: np.ndarray, dtype) -> np.ndarray:
    """The tolerance of float32 ``x`` (``tol``) once stored in ``dtype``: rounding is
    monotonic, so the stored value lies between those of ``x - tol`` and ``x + tol``."""
    if np.dtype(dtype) == np.float32:
        return tol
    x64 = np.asarray(x, np.float64)
    want = x64.astype(dtype).astype(np.float64)
    lo, hi = ((x64 + sign * tol).astype(dtype).astype(np.float64) for sign in (-1, 1))
    return np.maximum(want - lo, hi - want)


@register_reference("EmbeddingHashTableApplyAdamW", named=True)
def _apply_adam_w(inputs, attrs, mode):
    """For each key found live (the walk stops at a bucket without VALID; an evicted key is
    skipped, a deliberate deviation), in float32 whatever the dtype (the kernel widens every
    operand), term by term as the arch35 kernel writes it::

        w  = w * (1 + (-lr * wd))
        m' = m * b1 - (b1 + -1) * g;  v' = v * b2 - (b2 + -1) * g * g   (g negated: maximize)
        d  = sqrt(-max(max_grad_norm, v') / (b2p' + -1)) + eps  (amsgrad; else v')
        w  = w + (lr * m' / (b1p' + -1)) / d        with b1p' = beta1_power * b1, b2p' alike

    m', v', max_grad_norm and the beta powers are stored in the dtype T of ``m``; the row
    as ``float(T(w))``. Rows of other slots are the inputs' (the kernel updates in place).
    """
    f = np.float32
    dtype = np.asarray(inputs["m"]).dtype
    t = _Table(inputs["table"], attrs["embedding_dim"], "EmbeddingHashTableApplyAdamW")
    scalar = lambda name: f(np.asarray(inputs[name]).reshape(-1)[0])  # noqa: E731
    lr, wd, b1, b2, eps = (scalar(n) for n in ("lr", "weight_decay", "beta1", "beta2", "epsilon"))
    b1p, b2p = f(scalar("beta1_power") * b1), f(scalar("beta2_power") * b2)
    m, v, top = (np.asarray(inputs[n]).copy() for n in ("m", "v", "max_grad_norm"))
    grad = np.asarray(inputs["grad"]).astype(f).reshape(-1, t.dim)
    tol = {n: np.zeros((t.size, t.dim)) for n in ("m", "v", "max_grad_norm", "table")}
    keys = _keys(inputs["keys"])
    amsgrad = bool(attrs.get("amsgrad"))
    for i, (key, home) in enumerate(zip(keys, t.homes(np.array(keys, np.int64)))):
        s = t.find_valid(key, home)
        if key == -1 or s < 0 or t.evicted(s):  # -1: the kernel's unused key
            continue
        g = -grad[i] if attrs.get("maximize") else grad[i]
        w0 = t.values[s]
        w = w0 * (f(1) + (-lr * wd))
        m_in, v_in, top_in = (a[s].astype(f) for a in (m, v, top))
        m_new = m_in * b1 - (b1 + f(-1)) * g
        v_new = v_in * b2 - (b2 + f(-1)) * g * g
        top_new = np.fmax(top_in, v_new) if amsgrad else top_in
        denom = np.sqrt(-(top_new if amsgrad else v_new) / (b2p + f(-1))) + eps
        step = (lr * m_new / (b1p + f(-1))) / denom
        w = w + step
        # What fused a*b±c may change, propagated (float64): the terms each result adds.
        m_scale = np.abs(m_in * np.float64(b1)) + np.abs((np.float64(b1) - 1) * g)
        v_scale = np.abs(v_in * np.float64(b2)) + np.abs((np.float64(b2) - 1) * g * np.float64(g))
        gain = np.abs(np.float64(lr) / ((np.float64(b1p) - 1) * denom))
        w_scale = 2 * np.abs(w0) + 2 * np.abs(step) + gain * m_scale + np.abs(w)
        m[s], v[s] = m_new.astype(dtype), v_new.astype(dtype)
        top[s] = top_new.astype(dtype)
        t.values[s] = w.astype(dtype).astype(f)
        changed = [("m", m_scale, m_new), ("v", v_scale, v_new), ("table", w_scale, w)]
        for name, scale, value in changed + ([("max_grad_norm", v_scale, top_new)] if amsgrad else []):
            tol[name][s] = _stored_tolerance(value, _FUSED * _ULP32 * scale, dtype)
    powers = {"beta1_power": np.array([b1p], dtype), "beta2_power": np.array([b2p], dtype)}
    return Expected({"m": m, "v": v, **powers, "max_grad_norm": top, "table": t.bytes()}, None,
                    {"m": tol["m"], "v": tol["v"], "max_grad_norm": tol["max_grad_norm"],
                     "table": tol["table"]})
