"""Checkpoints under an adversary: thousands of corruptions restored in fresh processes,
and rounds of concurrent forced saves to one path.

- **Corruption fuzz.** A train state (a uint64-keyed table with an evict policy, its
  Adagrad state, an array, a step) is saved after 1 and 2 steps (``a``, ``b``), on one
  device (``single``) and over 4 devices (``sharded``). Copies of ``a`` get one file
  damaged each, for every part of the checkpoint:

  - ``header``: ``jaxops.json`` (the tables' static fields, layout and checksums);
  - ``manifest``: Orbax's and TensorStore's metadata (``_METADATA``, ``_sharding``,
    ``_CHECKPOINT_METADATA``, ``array_metadatas/*``, the OCDBT manifests,
    ``commit_success.txt``);
  - ``data``: the OCDBT data files (``d/*``, ``ocdbt.process_*/d/*``);

  by a bit flipped at a random place (in the header, half of them inside a named field:
  ``key_dtype``, ``max_load_factor``, ``load_policy``, ``embedding_dim``, ``shard_size``,
  ``num_shards``, the sums, ...), truncation, the same file taken from ``b`` (a
  cross-checkpoint copy), two files of the part exchanged (shard data), a file removed,
  and (header) a re-signed field holding a value that is never valid. A child process that
  never saw the files restores every copy: each must be refused (``CheckpointError``) or
  come back equal to ``a`` bit for bit, static fields included. ``wrong`` (restored,
  different) and ``other`` (another exception, or the child died) must be 0.
- **Concurrent saves.** Three processes hold three different states and, each round, all
  save to one path three times with ``force=True`` at once. After every round the path
  must restore (in a fresh process) to exactly one of the three states, no temporary may be
  left beside it, and the user's files in the same directory (``notes.txt``,
  ``g-drive-backup/notes.txt``) must be untouched.

The table's ``ms`` columns show counts / 1000 (``columns read counts``): ours is the bad
outcomes, the peer the cases; the target is 0. ``--quick``: 25 corruptions per kind and
part, 2 rounds per kind (500 and 20 in a full run).

Run ``python -m benchmarks --only checkpoint_adversary``.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.common import Result
from jaxops.hashtable.checkpoint._meta import write_meta

__all__ = ["concurrent_saves", "corruption_fuzz", "counterpart", "damaged_copies", "run"]

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_checkpoint_child.py")
KINDS = ("single", "sharded")
PARTS = ("header", "manifest", "data")
HEADER = "jaxops.json"
#: Fields of jaxops.json whose bytes the named-field flips aim at.
NAMED_FIELDS = ("key_dtype", "max_load_factor", "load_policy", "embedding_dim",
                "shard_size", "num_shards", "sharded", "initializer", "route_capacity",
                "sums", "shape", "dtype", "kind", "version", "format", "table", "slot")
#: Values that no field of a table may hold (re-signed header edits).
NEVER_VALID = ("bogus", "", -1, 0, 2**62, 1.5e300, None, [], {"x": 1}, True, "0.9", [-1])
_OK = {"refused", "equal"}


def _env(kind: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.path.dirname(HERE))
    env.pop("JAX_ENABLE_X64", None)
    if kind == "sharded":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            " --xla_force_host_platform_device_count=4").strip()
    return env


def _child(mode: str, kind: str, where: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, CHILD, mode, kind, where, *args], text=True,
                            env=_env(kind), stdout=subprocess.PIPE, **popen)


def _files(root: str, part: str) -> list[str]:
    every = sorted(os.path.relpath(os.path.join(d, f), root)
                   for d, _, fs in os.walk(root) for f in fs)
    return [r for r in every if _part(r) == part]


def _part(rel: str) -> str:
    if rel == HEADER:
        return "header"
    return "data" if rel.startswith("d/") or "/d/" in rel else "manifest"


def counterpart(other: str, rel: str, size: int) -> str | None:
    """The file of checkpoint ``other`` in ``rel``'s place: the same name, or (data files
    have random names) the one of the same directory closest in size."""
    if os.path.isfile(os.path.join(other, rel)):
        return os.path.join(other, rel)
    folder = os.path.join(other, os.path.dirname(rel))
    near = [os.path.join(folder, n) for n in os.listdir(folder)] if os.path.isdir(folder) else []
    return min(near, key=lambda p: abs(os.path.getsize(p) - size), default=None)


def _flip(data: bytes, rng: random.Random, lo: int = 0, hi: int | None = None) -> bytes:
    hi = len(data) if hi is None else hi
    at = rng.randrange(lo, hi)
    out = bytearray(data)
    out[at] ^= 1 << rng.randrange(8)
    return bytes(out)


def _named_span(data: bytes, rng: random.Random) -> tuple[int, int]:
    """The bytes of one named field of the header: its name and the value after it."""
    spans = []
    for name in NAMED_FIELDS:
        token = f'"{name}"'.encode()
        at = data.find(token)
        while at >= 0:
            end = min(len(data), at + len(token) + 24)
            spans.append((at + 1, end))
            at = data.find(token, at + 1)
    return rng.choice(spans)


def _valid(field: str, value) -> bool:
    """The never-valid values that one field does accept (``route_capacity`` caps the keys
    per destination buffer: None or any int >= 1, 2**62 included, is a valid cap)."""
    if field == "sharded":
        return isinstance(value, bool)
    if field == "route_capacity":
        return value is None or (type(value) is int and value >= 1)
    return False


def _resign(case: str, rng: random.Random) -> str:
    """Sets one table field of ``case``'s ``jaxops.json`` to a never-valid value and signs
    it again (with jaxops' own writer: what a forger, not a flipped bit, would write)."""
    body = json.loads(open(os.path.join(case, HEADER), "rb").read())["body"]
    table = rng.choice(sorted(body["tables"].values(), key=str))
    field = rng.choice(sorted(table))
    value = rng.choice([v for v in NEVER_VALID if v != table[field] and not _valid(field, v)])
    table[field] = value
    write_meta(case, body)
    return f"re-signed {field}={value!r}"


def _damage(case: str, other: str, part: str, rng: random.Random) -> str:
    """Damages one file of the part in the checkpoint copy ``case``; says how."""
    files = _files(case, part)
    rel = rng.choice(files)
    path = os.path.join(case, rel)
    data = open(path, "rb").read()
    how = rng.choice(("flip", "flip", "flip", "truncate", "copy", "exchange", "remove",
                      "named", "resign") if part == "header" else
                     ("flip", "flip", "flip", "truncate", "copy", "exchange", "remove"))
    if how == "exchange":
        peers = [f for f in files if f != rel and os.path.dirname(f) == os.path.dirname(rel)
                 and open(os.path.join(case, f), "rb").read() != data]
        if not peers:
            how = "copy"
        else:
            peer = os.path.join(case, rng.choice(peers))
            swapped = open(peer, "rb").read()
            open(peer, "wb").write(data)
            open(path, "wb").write(swapped)
            return f"exchange {rel} {os.path.relpath(peer, case)}"
    if how == "copy":
        source = counterpart(other, rel, len(data))
        replacement = open(source, "rb").read() if source else b""
        if replacement == data:
            how = "flip"  # the same bytes in both checkpoints: damage it another way
        else:
            open(path, "wb").write(replacement)
            return f"copy {rel} from b"
    if how == "remove":
        os.remove(path)
        return f"remove {rel}"
    if how == "truncate" and data:
        size = rng.randrange(len(data))
        open(path, "wb").write(data[:size])
        return f"truncate {rel} to {size}"
    if how == "named":
        lo, hi = _named_span(data, rng)
        open(path, "wb").write(_flip(data, rng, lo, hi))
        return f"flip in a named field of {rel}"
    if how == "resign":
        return _resign(case, rng)
    if not data:
        open(path, "wb").write(b"\0")
        return f"fill empty {rel}"
    open(path, "wb").write(_flip(data, rng))
    return f"flip {rel}"


def damaged_copies(where: str, count: int, seed: int) -> dict[str, tuple[str, str]]:
    """``count`` damaged copies of ``where/a`` per part under ``where/cases``:
    ``{case path: (part, how)}``."""
    rng = random.Random(seed)
    made = {}
    for part in PARTS:
        for i in range(count):
            case = os.path.join(where, "cases", f"{part}-{i:04d}")
            shutil.copytree(os.path.join(where, "a"), case)
            made[case] = (part, _damage(case, os.path.join(where, "b"), part, rng))
    return made


def _restore_all(kind: str, where: str, cases: list[str]) -> dict[str, dict]:
    """Restores every case in child processes (a new one after a child dies: the case it
    died on counts as ``other``)."""
    rows, left = {}, list(cases)
    while left:
        child = _child("restore", kind, where, stdin=subprocess.PIPE,
                       stderr=subprocess.DEVNULL)
        out, _ = child.communicate("\n".join(left) + "\n")
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                rows[row["case"]] = row
        left = [c for c in left if c not in rows]
        if left:
            rows[left[0]] = {"case": left[0], "outcome": "other",
                             "why": f"the restoring process died (rc {child.returncode})"}
            left = left[1:]
    return rows


def _make(kind: str, where: str) -> None:
    child = _child("make", kind, where, stderr=subprocess.PIPE)
    _, err = child.communicate()
    if child.returncode:
        raise RuntimeError(f"making the {kind} checkpoints failed:\n{err[-2000:]}")


def corruption_fuzz(kind: str, count: int, seed: int = 0,
                    where: str | None = None) -> dict[str, collections.Counter]:
    """``count`` corruptions of each part of a ``kind`` checkpoint, restored in a fresh
    process: ``{part: Counter(outcome)}``, plus ``"bad"``: the cases whose outcome was
    neither ``refused`` nor ``equal``, with how they were damaged."""
    own = where is None
    where = where or tempfile.mkdtemp(prefix=f"jaxops-adversary-{kind}-")
    try:
        _make(kind, where)
        made = damaged_copies(where, count, seed)
        rows = _restore_all(kind, where, sorted(made))
        found = {part: collections.Counter() for part in PARTS}
        bad = []
        for case, (part, how) in made.items():
            outcome = rows[case]["outcome"]
            found[part][outcome] += 1
            if outcome not in _OK:
                bad.append({"part": part, "how": how, **rows[case]})
        found["bad"] = bad
        return found
    finally:
        if own:
            shutil.rmtree(where, ignore_errors=True)


def _line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("a saving process ended early")
    return json.loads(line)


def concurrent_saves(kind: str, rounds: int, where: str | None = None) -> dict:
    """``rounds`` rounds of three processes saving different states to one path at once
    (three forced saves each): ``{"destroyed": n, "leftovers": n, "user_files_lost": n,
    "rounds": n}``; a round destroys the checkpoint unless the path then restores, in a
    fresh process, to exactly one of the three states."""
    own = where is None
    where = where or tempfile.mkdtemp(prefix=f"jaxops-concurrent-{kind}-")
    try:
        _make(kind, where)  # the restoring child's reference state
        run_dir = os.path.join(where, "run")
        os.makedirs(os.path.join(run_dir, "g-drive-backup"))
        users = {os.path.join(run_dir, "notes.txt"): b"mine\n",
                 os.path.join(run_dir, "g-drive-backup", "notes.txt"): b"backup\n"}
        for path, data in users.items():
            open(path, "wb").write(data)
        target = os.path.join(run_dir, "ckpt")
        savers = [_child("save", kind, where, str(n), target, stdin=subprocess.PIPE,
                         stderr=subprocess.DEVNULL) for n in (1, 2, 3)]
        try:
            digests = {_line(p)["digest"] for p in savers}
            snapshots, leftovers, lost = [], 0, 0
            for r in range(rounds):
                for p in savers:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                for p in savers:
                    _line(p)
                extra = set(os.listdir(run_dir)) - {"notes.txt", "g-drive-backup", "ckpt"}
                leftovers += bool(extra)
                lost += sum(open(p, "rb").read() != d if os.path.exists(p) else 1
                            for p, d in users.items())
                snapshot = os.path.join(where, "rounds", f"{r:03d}")
                if os.path.isdir(target):
                    shutil.copytree(target, snapshot)
                snapshots.append(snapshot)
        finally:
            for p in savers:
                p.stdin.close()
                p.wait()
        rows = _restore_all(kind, where, snapshots)
        destroyed = sum(rows[s]["outcome"] not in ("equal", "wrong") or
                        rows[s]["digest"] not in digests for s in snapshots)
        return {"destroyed": destroyed, "leftovers": leftovers, "user_files_lost": lost,
                "rounds": rounds}
    finally:
        if own:
            shutil.rmtree(where, ignore_errors=True)


def _count(name: str, bad: int, cases: int, note: str) -> Result:
    return Result(name, bad / 1000, "cases", cases / 1000, 0.0,
                  note=f"columns read counts; {note}")


def run(quick: bool) -> list[Result]:
    count = int(os.environ.get("JAXOPS_BENCH_CORRUPTIONS") or (25 if quick else 500))
    rounds = int(os.environ.get("JAXOPS_BENCH_ROUNDS") or (2 if quick else 20))
    results = []
    for kind in KINDS:
        start = time.perf_counter()
        found = corruption_fuzz(kind, count, seed=KINDS.index(kind))
        took = time.perf_counter() - start
        for part in PARTS:
            c = found[part]
            print(f"  {kind} {part}: {dict(c)}", flush=True)
            results.append(_count(f"corrupt {kind} {part}: wrong or other",
                                  c["wrong"] + c["other"], sum(c.values()),
                                  f"{c['refused']} refused, {c['equal']} harmless"))
        for row in found["bad"][:10]:
            print(f"    BAD {row}", flush=True)
        print(f"  {kind}: {3 * count} corruptions restored in {took:.0f} s", flush=True)
        done = concurrent_saves(kind, rounds)
        print(f"  {kind} concurrent saves: {done}", flush=True)
        results.append(_count(f"concurrent saves {kind}: destroyed", done["destroyed"],
                              rounds, "rounds of 3 processes x 3 forced saves"))
        results.append(_count(f"concurrent saves {kind}: user files lost or temporaries left",
                              done["user_files_lost"] + done["leftovers"], rounds, "rounds"))
    return results
