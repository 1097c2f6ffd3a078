"""Checkpoint hygiene and validation: stale temporaries, umask, path errors, the structure
check (probe reachability, duplicates) against a brute-force reference, and CheckpointError
for every bad file."""

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

import chex
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.errors import CheckpointError, JaxopsError
from jaxops.ops.hashtable import table_file as checkpoint
from jaxops.ops.hashtable.checkpoint_files import STALE_AFTER_S, remove_stale_temps
from jaxops.ops.hashtable.probe_check import ProbeCheck
from tests.hashtable_reference import key_hash, table_snapshot

_PREFIX = struct.Struct("<8sII")


def _table(size=16, n=9, seed=0):
    rng = np.random.default_rng(seed)
    t = ht.init_table(size, 3, sampled_values=rng.standard_normal((size, 3)).astype(np.float32))
    t = ht.set_load_policy(t, max_load_factor=1.0)  # the layouts fill tables up to 16 of 16
    keys = rng.choice(2**40, n, replace=False).astype(np.int64) - 2**39
    t, _, _ = ht.lookup_or_insert(t, keys)
    return ht.evict(t, keys[:1])


def _split(data: bytes):
    _, _, n = _PREFIX.unpack_from(data)
    end = _PREFIX.size + n
    return json.loads(data[_PREFIX.size:end]), bytearray(data[end:])


def _join(header: dict, payload: bytes, fix_sum: bool = True, version: int = 2) -> bytes:
    if fix_sum:
        header = {**header, "sha256": hashlib.sha256(payload).hexdigest()}
    raw = json.dumps(header, sort_keys=True).encode()
    return _PREFIX.pack(b"JXHTABLE", version, len(raw)) + raw + bytes(payload)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# -- temporaries, mode, paths -------------------------------------------------------------

def test_stale_temporaries_are_removed_by_save_and_load(tmp_path):
    path = tmp_path / "t.jxht"
    dead, old, live = (f".t.jxht.{_dead_pid()}.abc.tmp", ".t.jxht.x7q2.tmp",
                       f".t.jxht.{os.getpid()}.def.tmp")
    other = f".other.jxht.{_dead_pid()}.abc.tmp"  # another target's: not ours to remove
    for name in (dead, old, live, other):
        (tmp_path / name).write_bytes(b"partial")
    hour_ago = time.time() - STALE_AFTER_S - 60
    os.utime(tmp_path / old, (hour_ago, hour_ago))
    ht.save(_table(), path)
    assert sorted(os.listdir(tmp_path)) == sorted(["t.jxht", live, other])
    (tmp_path / dead).write_bytes(b"partial")
    ht.load(path)
    assert sorted(os.listdir(tmp_path)) == sorted(["t.jxht", live, other])


def test_killed_save_leaves_a_temporary_that_the_next_load_removes(tmp_path):
    path = tmp_path / "t.jxht"
    ht.save(_table(), path)
    script = textwrap.dedent(f"""
        import os, signal, jaxops.hashtable as ht
        from jaxops.ops.hashtable import table_file as checkpoint
        def die(rows):
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.cann_rows = die
        ht.save(ht.init_table(64, 3, initializer_mode="constant"), {str(path)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".tmp")]) == 1
    assert int(ht.load(path).live) == int(_table().live)  # the old file, intact
    assert os.listdir(tmp_path) == ["t.jxht"]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_file_mode_follows_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        ht.save(_table(), tmp_path / "t.jxht")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "t.jxht").st_mode & 0o777 == 0o666 & ~umask


def test_save_errors_name_the_users_path(tmp_path, monkeypatch):
    missing = tmp_path / "no" / "such" / "t.jxht"
    with pytest.raises(FileNotFoundError, match="'save': argument 'path'|save: argument 'path'") \
            as e:
        ht.save(_table(), missing)
    assert str(missing) in str(e.value) and ".tmp" not in str(e.value)
    assert e.value.filename == str(missing)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        ht.save(_table(), tmp_path)

    def refuse(**kwargs):
        raise PermissionError(13, "Permission denied", os.path.join(kwargs["dir"], ".t.x.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(PermissionError, match="cannot be written") as e:
        ht.save(_table(), tmp_path / "t.jxht")
    assert str(tmp_path / "t.jxht") in str(e.value) and ".tmp" not in str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_save_into_a_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(PermissionError, match="cannot be written"):
        ht.save(_table(), ro / "t.jxht")


def test_remove_stale_temps_of_a_missing_directory_is_a_no_op(tmp_path):
    assert remove_stale_temps(tmp_path / "none" / "t.jxht") == []


# -- validation ---------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
@pytest.mark.parametrize("fill", [9, 15, 16])  # 16 of 16: no empty slot, clusters wrap
def test_round_trip_across_chunk_boundaries(tmp_path, monkeypatch, chunk, fill):
    monkeypatch.setattr(checkpoint, "chunk_slots_for", lambda dim: chunk)
    t = _table(n=fill, seed=fill)
    ht.save(t, tmp_path / "t.jxht")
    chex.assert_trees_all_equal(table_snapshot(ht.load(tmp_path / "t.jxht")), table_snapshot(t))


def _scored_table():
    """A table with varied scores, a reused tombstone and a non-default load policy."""
    t = ht.set_load_policy(ht.init_table(16, 2, initializer_mode="constant"),
                           max_load_factor=0.75, policy="evict_lfu")
    for step, keys in ((3, [1, 2, 3, 4, 5]), (9, [2, 3]), (2**32 - 2, [4, 6, 7])):
        t, _, _ = ht.lookup_or_insert(t, np.array(keys, np.int64), step=step)
    t = ht.evict(t, np.array([3], np.int64))
    t, _, _ = ht.lookup_or_insert(t, np.arange(8, 40, dtype=np.int64)[:5])
    return t


def test_round_trip_keeps_scores_clock_and_load_policy(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "chunk_slots_for", lambda dim: 5)
    t = _scored_table()
    assert len(set(np.asarray(t.last_access).tolist())) >= 3
    ht.save(t, tmp_path / "t.jxht")
    back = ht.load(tmp_path / "t.jxht")
    chex.assert_trees_all_equal(table_snapshot(back), table_snapshot(t))
    assert (back.max_load_factor, back.load_policy) == (0.75, "evict_lfu")


def test_version_1_files_still_load(tmp_path):
    """A version-1 file (CANN buckets only; no clock, scores or load fields) loads with
    last_access and clock 0 and the default load limit."""
    path = tmp_path / "t.jxht"
    t = _scored_table()
    ht.save(t, path)
    header, rows, _ = _slots(path.read_bytes())
    for name in ("clock", "max_load_factor", "load_policy"):
        del header[name]
    header["payload_bytes"] = rows.size
    path.write_bytes(_join(header, rows.tobytes(), version=1))
    back = ht.load(path)
    want = {**table_snapshot(t), "clock": 0, "last_access": np.zeros(16, np.uint32)}
    chex.assert_trees_all_equal(table_snapshot(back), want)
    assert (back.max_load_factor, back.load_policy) == (0.9, "error")


def test_files_without_key_dtype_load_as_int64(tmp_path):
    """Files written before ``key_dtype`` existed load as int64 tables; a uint64 table's
    file keeps it."""
    path = tmp_path / "t.jxht"
    t = ht.init_table(8, 1, initializer_mode="constant", key_dtype=np.uint64)
    t, _, _ = ht.lookup_or_insert(t, np.array([2**63 + 1], np.uint64))
    ht.save(t, path)
    assert ht.load(path).key_dtype == "uint64"
    header, payload = _split(path.read_bytes())
    del header["key_dtype"]
    path.write_bytes(_join(header, payload))
    back = ht.load(path)
    assert back.key_dtype == "int64" and int(back.live) == 1
    assert ht.locate(back, [-2**63 + 1]).tolist() == ht.locate(t, [2**63 + 1]).tolist()


def _reference_fault(used, home, keys):
    """Brute force: walk from each used slot's home; any empty slot before it is a fault."""
    n = len(used)
    for s in np.flatnonzero(used):
        d = 0
        while (home[s] + d) % n != s:
            if not used[(home[s] + d) % n]:
                return "unreachable"
            d += 1
    live = keys[used]
    return "twice" if len(set(live.tolist())) < len(live) else None


def _random_layout(rng):
    """A linear-probing table built by insertion (valid), then maybe damaged: a slot
    emptied, a key copied or moved into an empty slot. Homes are a function of the key."""
    n = int(rng.integers(1, 24))
    home_of = rng.integers(0, n, int(rng.integers(1, 3 * n + 1)))
    used, keys = np.zeros(n, bool), np.zeros(n, np.int64)
    for k in rng.permutation(len(home_of))[:int(rng.integers(0, n + 1))]:
        s = next((int(home_of[k]) + d) % n for d in range(n) if not used[(home_of[k] + d) % n])
        used[s], keys[s] = True, k
    damage = rng.choice(["none", "empty", "copy", "move"])
    full, free = np.flatnonzero(used), np.flatnonzero(~used)
    if damage != "none" and full.size and (damage == "empty" or free.size):
        a = rng.choice(full)
        if damage != "empty":
            b = rng.choice(free)
            used[b], keys[b] = True, keys[a]
        if damage != "copy":
            used[a] = False
    home = np.where(used, home_of[keys], 0)
    return n, used, keys.astype(np.uint64) + np.uint64(2**33), home


@pytest.mark.parametrize("seed", range(150))
def test_probe_check_matches_brute_force(seed):
    n, used, keys, home = _random_layout(np.random.default_rng(seed))
    want = _reference_fault(used, home, keys)
    for chunk in (1, 2, 5, n):
        check = ProbeCheck(n)
        got = None
        try:
            for start in range(0, n, chunk):
                sl = slice(start, start + chunk)
                check.feed(start, (keys[sl] & np.uint64(0xFFFFFFFF)).astype(np.uint32),
                           (keys[sl] >> np.uint64(32)).astype(np.uint32),
                           used[sl].astype(np.uint8), home[sl])
            check.finish()
        except ValueError as e:
            got = "twice" if "twice" in str(e) else "unreachable"
        # Both faults may be present: the reference reports reachability first, as
        # ProbeCheck does within a chunk, but across chunks either may come first.
        assert (got is None) == (want is None), (chunk, got, want)


def _slots(data):
    """``(header, rows, tail)``: the CANN buckets as uint8 rows and the bytes after them."""
    header, payload = _split(data)
    width = ht.cann.row_bytes(header["embedding_dim"])
    end = header["bucket_size"] * width
    rows = np.frombuffer(bytes(payload[:end]), np.uint8).reshape(-1, width).copy()
    return header, rows, bytes(payload[end:])


def _home(row) -> int:
    key = struct.unpack_from("<q", row.tobytes())[0]
    return key_hash(key)


def test_load_rejects_a_key_moved_off_its_probe_path(tmp_path):
    path = tmp_path / "t.jxht"
    ht.save(_table(), path)
    header, rows, tail = _slots(path.read_bytes())
    n = len(rows)
    used = rows[:, 16] == 1
    # A key whose home is not its slot's predecessor run: move it to the empty slot just
    # before its home, which an empty-slot-terminated walk from home never reaches.
    s = int(np.flatnonzero(used)[0])
    home = _home(rows[s]) % n
    target = next((home - d) % n for d in range(1, n) if not used[(home - d) % n])
    rows[target], rows[s] = rows[s].copy(), rows[target].copy()
    path.write_bytes(_join(header, rows.tobytes() + tail))
    with pytest.raises(CheckpointError, match="unreachable"):
        ht.load(path)


def test_load_rejects_a_duplicated_key(tmp_path):
    path = tmp_path / "t.jxht"
    ht.save(_table(), path)
    header, rows, tail = _slots(path.read_bytes())
    used = rows[:, 16] == 1
    s = int(np.flatnonzero(used & ((rows[:, 23] & ht.cann.EVICTED) == 0))[0])
    after = next((s + d) % len(rows) for d in range(1, len(rows)) if not used[(s + d) % len(rows)])
    rows[after] = rows[s]  # the same key again, reachable, counts made consistent
    header = {**header, "live": header["live"] + 1,
              "not_exported": header["not_exported"] + 1}
    path.write_bytes(_join(header, rows.tobytes() + tail))
    with pytest.raises(CheckpointError, match="held twice"):
        ht.load(path)


@pytest.mark.parametrize("change", [
    {"bucket_size": "16"}, {"bucket_size": -1}, {"bucket_size": 2**40}, {"embedding_dim": 0},
    {"embedding_dim": 3.0}, {"live": True}, {"live": 1.5}, {"not_exported": None},
    {"dropped": 2**64}, {"dropped": -1}, {"payload_bytes": "x"}, {"sha256": 5},
    {"sha256": "z" * 64}, {"live": 2**62}, {"bucket_size": None}, {"clock": -1},
    {"clock": 2**32}, {"clock": None}, {"max_load_factor": 0}, {"max_load_factor": 1.5},
    {"max_load_factor": "0.9"}, {"max_load_factor": True}, {"load_policy": "nope"},
    {"load_policy": 3}, {"key_dtype": "int16"}, {"key_dtype": None},
])
def test_load_rejects_bad_header_fields(tmp_path, change):
    path = tmp_path / "t.jxht"
    ht.save(_table(), path)
    header, payload = _split(path.read_bytes())
    path.write_bytes(_join({**header, **change}, payload, fix_sum="sha256" not in change))
    with pytest.raises(CheckpointError, match="corrupt"):
        ht.load(path)


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"x"', b"1e999999", b"[" * 100000, b"{"])
def test_load_rejects_headers_that_are_not_objects(tmp_path, raw):
    path = tmp_path / "t.jxht"
    path.write_bytes(_PREFIX.pack(b"JXHTABLE", 1, len(raw)) + raw)
    with pytest.raises(CheckpointError, match="corrupt header"):
        ht.load(path)


def test_load_rejects_an_absurd_header_length(tmp_path):
    path = tmp_path / "t.jxht"
    path.write_bytes(_PREFIX.pack(b"JXHTABLE", 1, 2**32 - 1) + b"{}")
    with pytest.raises(CheckpointError, match="length"):
        ht.load(path)


def test_every_damaged_byte_gives_a_checkpoint_error_or_a_valid_table(tmp_path):
    """Flip bits in every byte of the prefix and header and in sampled payload bytes:
    loading either raises CheckpointError or yields a table (e.g. a changed 'dropped')."""
    path = tmp_path / "t.jxht"
    ht.save(_table(), path)
    data = path.read_bytes()
    _, _, n = _PREFIX.unpack_from(data)
    offsets = list(range(_PREFIX.size + n)) + list(range(_PREFIX.size + n, len(data), 37))
    for at in offsets:
        for bit in (0x01, 0x40):
            damaged = bytearray(data)
            damaged[at] ^= bit
            path.write_bytes(bytes(damaged))
            try:
                ht.load(path)
            except CheckpointError:
                pass
            except JaxopsError as e:  # noqa: PERF203
                pytest.fail(f"byte {at} ^ {bit:#x}: {type(e).__name__}: {e}")


@pytest.mark.parametrize("damage,match", [
    (lambda h, r: r.__setitem__((0, 16), 2), "state word"),
    (lambda h, r: h.__setitem__("live", h["live"] - 1), "counts in the header"),
    (lambda h, r: h.__setitem__("not_exported", h["not_exported"] + 1), "counts in the header"),
])
def test_load_rejects_bad_content_with_a_valid_checksum(tmp_path, damage, match):
    path = tmp_path / "t.jxht"
    ht.save(_table(), path)
    header, rows, tail = _slots(path.read_bytes())
    damage(header, rows)
    path.write_bytes(_join(header, rows.tobytes() + tail))
    with pytest.raises(CheckpointError, match=match):
        ht.load(path)
