"""Requests that cannot fit are refused before anything is allocated, naming the bytes.

Without the check, ``size=2**31 - 1``, a table of ``2**31 - 1`` slots or a golden case of
``100000 x 100000`` elements end in XLA's ``RESOURCE_EXHAUSTED``, numpy's
``ArrayMemoryError`` traceback or the OOM killer. The "genuine" tests ask for far more than
any machine has (hundreds of GB to TB); the others shrink the memory the check sees.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
import jaxops.hashtable as ht
from jaxops import cli
from jaxops.core import memory
from jaxops.errors import OpArgumentError, ResourceRequestError

BIG = 2**31 - 1


@pytest.fixture
def one_gib(monkeypatch):
    """The check sees 1 GiB available."""
    monkeypatch.setattr(memory, "available_bytes", lambda devices=None: 1 << 30)


def test_error_is_a_memory_error_and_an_argument_error():
    assert issubclass(ResourceRequestError, MemoryError)
    assert issubclass(ResourceRequestError, OpArgumentError)


def test_nonzero_size_beyond_any_memory_is_refused_eagerly_and_in_jit():
    x = jnp.zeros((1,) * 32, jnp.float32)  # 32 x (2**31 - 1) indices: 275 GB at least
    for run in (lambda x: jaxops.nonzero(x, size=BIG),
                jax.jit(lambda x: jaxops.nonzero(x, size=BIG), donate_argnums=0)):
        with pytest.raises(ResourceRequestError) as err:
            run(x)
        need = 32 * BIG * jaxops.nonzero(x, size=1).data.dtype.itemsize
        assert err.value.op == "NonZero" and err.value.arg == "size"
        assert f"needing {need} bytes" in str(err.value)
        assert f"[32, {BIG}]" in str(err.value)


@pytest.mark.parametrize("call", [
    lambda x: jaxops.unique(x, size=BIG),
    lambda x: jaxops.masked_select(x, x > 0, size=BIG),
    lambda x: jaxops.nonzero(x, size=BIG),
], ids=["Unique", "MaskedSelect", "NonZero"])
def test_every_size_is_checked(one_gib, call):
    x = jnp.arange(10, dtype=jnp.float32)
    with pytest.raises(ResourceRequestError, match="argument 'size'.*1073741824 bytes"):
        jax.jit(call)(x)
    with pytest.raises(ResourceRequestError):
        call(x)


def test_sizes_that_fit_run(one_gib):
    x = jnp.array([0.0, 2.0, 0.0, 3.0])
    r = jaxops.refresh(jaxops.nonzero(x, size=1 << 20))  # 4 MiB: below the check
    np.testing.assert_array_equal(r, np.array(np.nonzero(np.asarray(x))))


def test_table_beyond_any_memory_is_refused():
    with pytest.raises(ResourceRequestError) as err:
        ht.init_table(BIG, 1024, initializer_mode="constant")  # 8.8 TB
    need = BIG * ht.slot_bytes(1024)
    assert err.value.op == "InitEmbeddingHashTable" and err.value.arg == "bucket_size"
    assert f"needing {need} bytes" in str(err.value)


def test_table_checks_inside_jit_on_a_mesh_and_on_resize(one_gib):
    mesh = ht.MeshAxis(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)), "d")
    big = (1 << 30) // ht.slot_bytes(8) + 1
    with pytest.raises(ResourceRequestError, match="bucket_size"):
        jax.jit(lambda: ht.init_table(big, 8, initializer_mode="constant"))()
    with pytest.raises(ResourceRequestError, match="bucket_size"):
        ht.init_table(big, 8, initializer_mode="constant", placement=mesh)
    table = ht.init_table(64, 8, initializer_mode="constant")
    with pytest.raises(ResourceRequestError, match="bucket_size"):
        ht.resize(table, big)
    assert ht.resize(table, 128).values.shape == (128, 8)


def test_slot_bytes_is_what_a_table_holds():
    table = ht.init_table(64, 8, initializer_mode="constant")
    per_slot = [leaf.nbytes for leaf in jax.tree.leaves(table) if leaf.ndim and
                leaf.shape[0] == 64]
    assert sum(per_slot) == 64 * ht.slot_bytes(8)


@pytest.mark.parametrize("shape", ["2147483648", "100000,100000"])
def test_golden_shape_beyond_memory_is_one_line_and_exit_2(shape, tmp_path, capsys):
    code = cli.main(["golden", "NonZero", "--shape", shape, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "golden: argument 'shape'" in err and "bytes" in err
    assert list(tmp_path.iterdir()) == []

