"""jaxops.capacity statistics and recommendations; jaxops.capacity overflow policies (generic part)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops import DynArray
from jaxops.core.errors import CapacityOverflowError, OpArgumentError
from jaxops.capacity import policy as overflow, stats as capacity
from jaxops.capacity import CapacityStats, metrics, recommend


@pytest.fixture(autouse=True)
def clean():
    capacity.clear_stats()
    overflow.reset_warnings()
    yield


def _stats(sizes, tmax=None):
    s = CapacityStats("site", tmax)
    s.record(sizes)
    return s


def test_statistics_match_numpy():
    rng = np.random.default_rng(0)
    sizes = rng.poisson(40, 500)
    s = _stats(sizes)
    assert s.count == 500 and s.max == sizes.max() and s.min == sizes.min()
    assert s.mean == pytest.approx(sizes.mean()) and s.std == pytest.approx(sizes.std())
    np.testing.assert_allclose(s.quantile([0.5, 0.99]), np.quantile(sizes, [0.5, 0.99]))
    counts, edges = s.histogram(10)
    c2, e2 = np.histogram(sizes, 10)
    np.testing.assert_array_equal(counts, c2)
    np.testing.assert_allclose(edges, e2)


def test_record_rejects_negative_and_empty_stats_raise():
    with pytest.raises(ValueError, match=">= 0"):
        CapacityStats("x").record([-1])
    with pytest.raises(ValueError, match="nothing recorded"):
        CapacityStats("x").mean


def test_sigma_rule_by_hand():
    s = _stats([10] * 9 + [20])  # mu = 11, sigma = 3
    assert recommend(s, policy="sigma", k=3.0, round_to=None) == 20
    assert recommend(s, policy="sigma", k=1.0, round_to=None) == 14
    assert recommend(s, policy="sigma", k=3.0, round_to="pow2") == 32


@pytest.mark.parametrize("round_to, want", [("pow2", 32), (8, 24), (128, 128), (None, 21)])
def test_rounding(round_to, want):
    s = _stats([21, 21, 21])  # mu = 21, sigma = 0
    assert recommend(s, round_to=round_to) == want


def test_pow2_rounding_exact_power_stays():
    assert recommend(_stats([16, 16]), round_to="pow2") == 16
    assert recommend(_stats([17]), round_to="pow2") == 32
    assert recommend(_stats([0, 0]), round_to="pow2") == 1


def test_quantile_policy_and_cap_at_theoretical_max():
    sizes = np.arange(1, 1001)
    s = _stats(sizes, tmax=600)
    assert recommend(s, policy="quantile", q=0.5, round_to=None) == int(np.ceil(np.quantile(sizes, 0.5)))
    assert recommend(s, policy="quantile", q=0.999, round_to="pow2") == 600  # 1024 capped
    assert recommend(s, policy="sigma", k=10, theoretical_max=300) == 300


def test_recommend_argument_errors():
    s = _stats([1, 2])
    with pytest.raises(ValueError, match="policy"):
        recommend(s, policy="mean")
    with pytest.raises(ValueError, match="round_to"):
        recommend(s, round_to="pow3")
    with pytest.raises(ValueError, match="'q'"):
        recommend(s, policy="quantile", q=1.5)


def test_metrics():
    s = _stats([10, 20, 30, 40], tmax=100)
    m = metrics(s, 25)
    assert m.memory_saving == pytest.approx(0.75)
    assert m.density == pytest.approx(np.mean([10, 20, 25, 25]) / 25)
    assert m.overflow_rate == pytest.approx(0.5)
    assert metrics(_stats([1]), 4).memory_saving is None
    with pytest.raises(ValueError):
        metrics(s, 0)


def test_report_lists_every_site(capsys):
    capacity.get_stats("a", 64).record([3, 4, 5])
    capacity.get_stats("b").record([100])
    capacity.get_stats("empty")
    text = capacity.report()
    assert "a" in text and "b" in text and "nothing recorded" in text
    assert capsys.readouterr().out.strip() == text.strip()


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = capacity.plot(_stats(np.random.default_rng(1).poisson(30, 200), 500), str(tmp_path / "h.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    with pytest.raises(ImportError, match=r"jaxops\[plot\]"):
        capacity.plot(_stats([1, 2]), "/tmp/never.png")


def test_record_tree_uses_true_size_and_batches():
    d = DynArray(jnp.zeros((4, 3)), [4, 3], true_shape=[9, 3])
    b = jax.vmap(lambda n: DynArray(jnp.zeros(5), [n]))(jnp.array([1, 2, 3]))
    capacity.record_tree("t", {"d": d, "b": b})
    np.testing.assert_array_equal(np.sort(capacity.get_stats("t").sizes), [1, 2, 3, 9])


def test_record_in_jit():
    @jax.jit
    def f(x):
        d = DynArray(x, [jnp.sum(x > 0)])
        capacity.record_in_jit("jit-site", d, theoretical_max=4)
        return x
    for x in ([1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]):
        f(jnp.array(x))
    jax.effects_barrier()
    s = capacity.get_stats("jit-site")
    assert sorted(s.sizes.tolist()) == [0, 1, 3] and s.theoretical_max == 4


def test_site_key():
    assert capacity.site_key("NonZero", [(4, 5)]) == "NonZero[(4, 5)]"


# -- overflow policies on a toy runner ----------------------------------------------------

def _toy(values, calls):
    """A runner like an op wrapper's: keeps the positive values at capacity `size`."""
    def run(size, backend):
        calls.append((size, backend))
        pos = np.flatnonzero(np.asarray(values) > 0)
        cap = len(values) if size is None else size
        data = np.full(cap, -1)
        data[:min(cap, pos.size)] = pos[:cap]
        return DynArray(jnp.asarray(data), [min(cap, pos.size)], true_shape=[pos.size], fill_value=-1)
    return run


def test_policy_error():
    run = _toy([1, 1, 1, 0, 1], [])
    with pytest.raises(CapacityOverflowError, match="4 results does not fit capacity 2") as e:
        overflow.run_with_policy(run, op="Toy", size=2, theoretical_max=5, policy="error")
    assert (e.value.op, e.value.capacity, e.value.true_size) == ("Toy", 2, 4)


def test_policy_truncate_warns_once_per_site_and_keeps_flag():
    run = _toy([1, 1, 1, 0, 1], [])
    with pytest.warns(overflow.CapacityOverflowWarning, match=r"2 results lost \(2 elements"):
        out = overflow.run_with_policy(run, op="Toy", size=2, theoretical_max=5, policy="truncate")
    assert bool(out.overflowed()) and int(out.lost()) == 2
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            overflow.run_with_policy(run, op="Toy", size=2, theoretical_max=5, policy="truncate")
    assert len([x for x in w if issubclass(x.category, overflow.CapacityOverflowWarning)]) == 1


@pytest.mark.parametrize("policy, backend", [("expand", None), ("host", "host")])
def test_policy_expand_and_host_rerun_at_bucket(policy, backend):
    calls = []
    run = _toy([1] * 5 + [0] * 15, calls)
    out = overflow.run_with_policy(run, op="Toy", size=2, theoretical_max=20, policy=policy)
    assert calls == [(2, None), (8, backend)]
    assert not bool(out.overflowed()) and int(out.numel()) == 5


def test_no_rerun_without_overflow_and_unknown_policy():
    calls = []
    run = _toy([1, 0, 0], calls)
    overflow.run_with_policy(run, op="Toy", size=2, theoretical_max=3, policy="error")
    assert calls == [(2, None)]
    with pytest.raises(OpArgumentError, match="Toy: argument 'overflow'"):
        overflow.run_with_policy(run, op="Toy", size=2, theoretical_max=3, policy="grow")


def test_next_capacity_buckets_bound_compilations():
    """Any true size in [1, max] lands in one of ceil(log2(max)) + 1 buckets."""
    tmax = 1000
    buckets = {overflow.next_capacity(n, tmax) for n in range(1, tmax + 1)}
    assert len(buckets) == int(np.ceil(np.log2(tmax))) + 1
    assert all(overflow.next_capacity(n, tmax) >= n for n in range(1, tmax + 1))


def test_check_overflow_after_jit():
    f = jax.jit(lambda x: DynArray(x[:2], [2], true_shape=[jnp.sum(x > 0)]))
    fine = f(jnp.array([1, 1, 0, 0]))
    bad = f(jnp.array([1, 1, 1, 1]))
    assert overflow.check_overflow({"a": fine}) == 0
    with pytest.raises(CapacityOverflowError, match="capacity 2"):
        overflow.check_overflow([fine, bad])
    with pytest.warns(overflow.CapacityOverflowWarning):
        assert overflow.check_overflow(bad, policy="warn") == 2
    batched = jax.vmap(f)(jnp.array([[1, 0, 0, 0], [1, 1, 1, 0]]))
    with pytest.raises(CapacityOverflowError):
        overflow.check_overflow(batched)
    with pytest.raises(CapacityOverflowError, match="^NonZero: "):
        overflow.check_overflow(bad, op="NonZero")


def test_lost_counts_elements_or_results_along_an_axis():
    x = np.array([[1, 0, 1], [1, 1, 0]])  # 4 non-zeros
    d = jax.jit(lambda x: jaxops.nonzero(x, size=1))(x)  # [2, 1] of a true [2, 4]
    assert (int(d.lost()), int(d.lost(axis=1)), int(d.lost(axis=-1))) == (6, 3, 3)
    with pytest.raises(ValueError, match="DynArray.lost: argument 'axis'"):
        d.lost(axis=2)
