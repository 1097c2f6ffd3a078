"""Overflow policies on the real operators: error, truncate, expand, host; check_overflow."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops.core.errors import CapacityOverflowError
from tests.helpers.cases.nms import ref_non_max_suppression
from tests.ops.nms.test_nms import _edge_images
from jaxops.capacity import policy as overflow


@pytest.fixture(autouse=True)
def fresh_warnings():
    overflow.reset_warnings()
    yield


def _nms(policy, size=5):
    boxes, scores, _ = _edge_images()
    return boxes, scores, jaxops.non_max_suppression(boxes, scores, 4, 0.5, size=size, overflow=policy)


def test_nms_truncate_is_default_keeps_top_scores_and_warns_once():
    boxes, scores, _ = _edge_images()

    def call():  # one call site
        return jaxops.non_max_suppression(boxes, scores, 4, 0.5, size=5)

    with pytest.warns(overflow.CapacityOverflowWarning, match=r"20 results lost \(60 elements"):
        out = call()
    kept = jaxops.refresh(out, allow_truncated=True)
    np.testing.assert_array_equal(kept, ref_non_max_suppression(boxes, scores, 4, 0.5, size=5))
    kept_scores = [scores[b, c, k] for b, c, k in kept]
    all_scores = sorted((scores[b, c, k] for b, c, k in ref_non_max_suppression(boxes, scores, 4, 0.5)),
                        reverse=True)
    assert sorted(kept_scores, reverse=True) == all_scores[:5]
    assert bool(out.overflowed()) and int(out.lost()) == 3 * 20
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            call()  # the same call site again: silent


def test_nms_error():
    with pytest.raises(CapacityOverflowError, match="25 results does not fit capacity 5"):
        _nms("error")


@pytest.mark.parametrize("policy", ["expand", "host"])
def test_nms_expand_and_host_are_complete(policy):
    boxes, scores, out = _nms(policy)
    assert out.max_shape == (32, 3) and not bool(out.overflowed())
    np.testing.assert_array_equal(jaxops.refresh(out), ref_non_max_suppression(boxes, scores, 4, 0.5))


def test_policy_inside_jit_returns_flag_and_check_overflow_raises():
    boxes, scores, _ = _edge_images()
    f = jax.jit(lambda b, s: jaxops.non_max_suppression(b, s, 4, 0.5, size=5, overflow="error"))
    out = f(boxes, scores)  # no rerun, no error inside jit: the flag travels
    assert bool(out.overflowed())
    with pytest.raises(CapacityOverflowError, match="capacity 5"):
        jaxops.check_overflow(out)
    with pytest.warns(overflow.CapacityOverflowWarning):
        assert jaxops.check_overflow(out, policy="warn") == 60


def test_no_overflow_no_rerun_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, _, out = _nms("error", size=25)
    assert not bool(out.overflowed()) and out.max_shape == (25, 3)


# -- the index operators: "expand" by default -----------------------------------------------

def test_index_ops_expand_by_default_and_are_complete():
    rng = np.random.default_rng(0)
    x = rng.random((6, 7)) < 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # expanding is not a truncation: no warning
        nz = jaxops.nonzero(x, size=2)
        ms = jaxops.masked_select(np.arange(42.0).reshape(6, 7), x, size=2)
        y, counts = jaxops.unique(rng.integers(0, 20, 40), size=2, return_counts=True)
        yc = jaxops.unique_consecutive(np.repeat(np.arange(9), 2), size=2)
    np.testing.assert_array_equal(jaxops.refresh(nz), np.stack(np.nonzero(x)))
    assert nz.max_shape == (2, overflow.next_capacity(int(x.sum()), x.size))
    assert not bool(nz.overflowed())
    np.testing.assert_array_equal(jaxops.refresh(ms), np.arange(42.0).reshape(6, 7)[x])
    assert int(counts.numel()) == int(y.numel()) and not bool(y.overflowed())
    np.testing.assert_array_equal(jaxops.refresh(yc), np.arange(9))


@pytest.mark.parametrize("call", [
    lambda p: jaxops.nonzero(np.ones(10), size=3, overflow=p),
    lambda p: jaxops.argwhere(np.ones((2, 5)), size=3, overflow=p),
    lambda p: jaxops.masked_select(np.arange(10), np.ones(10, bool), size=3, overflow=p),
    lambda p: jaxops.unique(np.arange(10), size=3, overflow=p),
    lambda p: jaxops.unique_consecutive(np.arange(10), size=3, overflow=p),
])
def test_index_ops_error_truncate_host(call):
    with pytest.raises(CapacityOverflowError, match="10 results does not fit capacity 3"):
        call("error")
    with pytest.warns(overflow.CapacityOverflowWarning, match=r"\(true size 10\)") as seen:
        cut = call("truncate")
    first = cut[0] if isinstance(cut, tuple) else cut
    assert bool(first.overflowed())
    # results in the unit of capacity and true size, elements as DynArray.lost(): 14 for argwhere
    assert f"7 results lost ({int(first.lost())} elements" in str(seen[0].message)
    host = call("host")
    first = host[0] if isinstance(host, tuple) else host
    assert not bool(first.overflowed()) and int(first.numel()) in (10, 20)  # 20: argwhere [10, 2]


def test_expand_compilations_are_bounded():
    """60 eager calls with 60 distinct true sizes in [1, max], in random order: at most
    ceil(log2 max) + 1 compilations (each power-of-two bucket once), for NonZero,
    MaskedSelect, Unique and UniqueConsecutive. (Every size once: repeated sizes, as the
    150 calls with about 80 distinct sizes this ran before, add calls but no case.)"""
    from tests.helpers.util import CompileCounter

    n = 100
    rng = np.random.default_rng(1)
    counts = rng.permutation(n)[:60] + 1
    assert len(set(counts.tolist())) > 50  # a compile per size would pass the bound
    xs = [np.arange(n) < k for k in counts]
    bound = int(np.ceil(np.log2(n))) + 1
    distinct = [np.arange(n) % k for k in counts]  # k distinct values, in runs once sorted
    for op, rank, inputs in ((lambda x: jaxops.nonzero(x, size=1), 2, xs),
                             (lambda x: jaxops.masked_select(x, x, size=1), 1, xs),
                             (lambda x: jaxops.unique(x, size=1), 1, distinct),
                             (lambda x: jaxops.unique_consecutive(np.sort(x), size=1), 1, distinct)):
        jaxops.DynArray(jnp.zeros((1,) * rank), jnp.ones(rank, jnp.int32)).numel()  # warm numel
        with CompileCounter() as compiles:
            for x, k in zip(inputs, counts):
                out = op(x)
                assert int((out[0] if isinstance(out, tuple) else out).numel()) == k
        assert 0 < compiles.count <= bound, compiles.count


def test_record_eagerly_and_inside_jit():
    from jaxops.capacity import stats as capacity

    capacity.clear_stats()
    x = np.zeros((4, 5))
    x[0, :3] = 1
    jaxops.nonzero(x, record=True)
    with pytest.warns(overflow.CapacityOverflowWarning, match="truncated to capacity 2"):
        jaxops.nonzero(x, size=2, overflow="truncate", record="nz-site")   # records the need: 3
    jax.jit(lambda x: jaxops.nonzero(x, transpose=True, record="nz-site"))(x * 0 + 1)
    boxes, scores, rows = _edge_images()
    jax.jit(lambda b, s: jaxops.non_max_suppression(b, s, 4, 0.5, size=5, record="nms"))(boxes, scores)
    jaxops.unique(np.arange(6).reshape(3, 2) % 2, axis=1, record="u")
    jax.effects_barrier()
    assert capacity.get_stats("NonZero[(4, 5)]").sizes.tolist() == [3]
    assert sorted(capacity.get_stats("nz-site").sizes.tolist()) == [3, 20]
    assert capacity.get_stats("nms").sizes.tolist() == [len(rows)]
    assert capacity.get_stats("nms").theoretical_max == 8 * 4
    assert capacity.get_stats("u").sizes.tolist() == [2]


def test_every_overflow_message_counts_what_dynarray_lost_counts():
    """One definition of "lost" (elements, DynArray.lost()) in the policy warning and error,
    check_overflow, refresh and launch, on a 2-D output whose results are pairs."""
    import tracing

    x = np.eye(6, dtype=np.int32)[:, :4]  # 4 non-zeros in a [6, 4] input: [2, 4] indices
    cut = jax.jit(lambda x: jaxops.nonzero(x, size=1))(x)  # inside jit: no policy, no warning
    lost = int(cut.lost())
    assert lost == 6 and int(cut.lost(axis=1)) == 3  # 3 pairs = 6 elements
    overflow.reset_warnings()
    with pytest.warns(overflow.CapacityOverflowWarning,
                      match=rf"\(true size 4\): 3 results lost \({lost} elements"):
        jaxops.nonzero(x, size=1, overflow="truncate")
    with pytest.raises(CapacityOverflowError,
                       match=rf"3 results would be lost \({lost} elements") as e:
        jaxops.nonzero(x, size=1, overflow="error")
    assert e.value.lost == lost and e.value.lost_results == 3
    assert (e.value.capacity, e.value.true_size) == (1, 4)
    with pytest.warns(overflow.CapacityOverflowWarning,
                      match=rf"3 results lost in all \({lost} elements"):
        assert jaxops.check_overflow(cut, policy="warn") == lost
    with pytest.warns(overflow.CapacityOverflowWarning, match=rf"{lost} elements lost"):
        jaxops.refresh(cut)
    with pytest.warns(overflow.CapacityOverflowWarning, match=rf"{lost} elements lost"):
        tracing.launch("NonZero", tracing.OP_INPUT(x), tracing.OP_ATTR(size=1),
                       tracing.OP_OUTSHAPE(np.zeros(9, np.int64), 0))
