"""The adversary's corruption fuzz of ``benchmarks/checkpoint_adversary.py`` in small form,
on a table over 4 devices (the one-device fuzz of every file is in
``test_fresh_process.py``; concurrent saves in ``test_guard.py``).

Every damaged copy (bit flips at random places and in named header fields, truncation,
files copied from another checkpoint, shard data exchanged, files removed, re-signed
never-valid header fields) is restored in a fresh process and must be refused or come back
bit for bit. The full run (500 a part and kind, 20 rounds of concurrent saves) is
``python -m benchmarks --only checkpoint_adversary``.
"""

from benchmarks.checkpoint_adversary import PARTS, corruption_fuzz


def test_sharded_corruptions_are_refused_or_harmless(tmp_path):
    found = corruption_fuzz("sharded", 8, seed=7, where=str(tmp_path))
    assert not found["bad"], found["bad"][:5]
    for part in PARTS:
        assert sum(found[part].values()) == 8
        assert found[part]["refused"] > 0, (part, found[part])  # the fuzz does damage
