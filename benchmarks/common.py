"""Side-by-side timing helpers shared by every benchmark.

Each benchmark case times jaxops and its peer on the same inputs in one process, after a
warm-up, as the median of several repeats, and reports the ratio ``ours / peer`` (these
machines are noisy; ratios are what we compare). The table's ``spread`` column is the
interquartile range of the ratios of the interleaved pairs, its ``best`` column the ratio of
the fastest repeats, the steadier figure when other load inflates the medians; targets are
judged on the median ratio.

Nothing is timed unchecked: :func:`compare` runs each side once and hands both outputs to
the case's ``check`` before any warm-up, and a wrong answer raises instead of a row (a fast
wrong answer is no result). The checks below compare exactly (or within a tolerance) after
:func:`jaxops.refresh`, DynArray padding included; a case whose peer computes something else
(a speed baseline) checks ours against its own independent reference (numpy, onnxruntime,
optax), never a kernel against itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


HUGEPAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def hugepages_enabled() -> bool:
    return HUGEPAGES_TUNABLE in os.environ.get("GLIBC_TUNABLES", "")


def ensure_hugepages() -> None:
    """Re-executes this process with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` unless it is
    set already (the runner calls it only for ``--hugepages``).

    Why: numpy ``madvise``s its large arrays into transparent huge pages; XLA's CPU client
    allocates with plain ``malloc``, so every fresh output of tens of MB pays one page fault
    per 4 KB (a 64 MB int32 output: ~17 ms of faults for ~2 ms of writing, measured here).
    The tunable gives malloc's large chunks the same huge pages numpy already has, so both
    sides of a comparison run under the same memory conditions. The JSON records the setting.
    """
    if hugepages_enabled() or os.environ.get("JAXOPS_BENCH_REEXEC"):
        return
    env = dict(os.environ, JAXOPS_BENCH_REEXEC="1")
    env["GLIBC_TUNABLES"] = ":".join(t for t in (env.get("GLIBC_TUNABLES"), HUGEPAGES_TUNABLE) if t)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def _block(x: Any) -> Any:
    return jax.block_until_ready(x)


def time_call(fn: Callable[[], Any], repeats: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds (results are blocked on)."""
    for _ in range(warmup):
        _block(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _block(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclasses.dataclass
class Result:
    """One benchmark case: our time, the peer's, the ratio and the target (max ratio)."""

    name: str
    ours_s: float
    peer: str
    peer_s: float
    target: float | None = None
    note: str = ""
    ours_best_s: float | None = None  # fastest repeat of each side, when timed by compare()
    peer_best_s: float | None = None
    # page faults per timed call (median), when timed by compare(): a call whose output
    # lands on pages the process never touched faults each one in (here about 2.5 us per
    # 4 KB page), which can be most of its time; whether it does depends on what the
    # allocator freed before, so it can differ between runs of the same case
    ours_faults: int | None = None
    peer_faults: int | None = None
    # the spread: quartiles of the ratios of the interleaved pairs (ours_i / peer_i), when
    # timed by compare()
    ratio_q1: float | None = None
    ratio_q3: float | None = None

    @property
    def ratio(self) -> float:
        return self.ours_s / self.peer_s

    @property
    def best_ratio(self) -> float | None:
        """Fastest repeat over fastest repeat: interference on a shared machine only adds
        time, so this is the steadier figure when the medians jump; targets use the median."""
        if self.ours_best_s is None or self.peer_best_s is None:
            return None
        return self.ours_best_s / self.peer_best_s

    @property
    def meets_target(self) -> bool | None:
        return None if self.target is None else self.ratio <= self.target

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(ratio=self.ratio, best_ratio=self.best_ratio, meets_target=self.meets_target)
        return d


#: ``check(ours_out, peer_out)``: raises AssertionError when a result is wrong
Check = Callable[[Any, Any], None]


def _identity(x: Any) -> Any:
    return x


def _padding_is_fill(tree: Any, what: str) -> None:
    """Raises unless every DynArray in ``tree`` holds its ``fill_value`` beyond its actual
    shape (the documented padding, which refresh would slice away unseen)."""
    from jaxops import DynArray

    for leaf in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, DynArray)):
        if isinstance(leaf, DynArray):
            np.testing.assert_array_equal(
                np.asarray(leaf.data), np.asarray(leaf.valid_data()),
                err_msg=f"{what}: padding is not the fill value {leaf.fill_value!r}")


def assert_same(got: Any, want: Any, what: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Raises AssertionError (naming ``what``) unless ``got`` and ``want`` hold the same
    arrays leaf by leaf (pytrees of any container types) after :func:`jaxops.refresh`:
    equal shapes, and values equal exactly, or within ``rtol`` / ``atol`` (then a NaN is a
    mismatch). DynArrays must also hold their fill value in their padding."""
    from jaxops import refresh

    _padding_is_fill(got, what)
    _padding_is_fill(want, what)
    a, b = (jax.tree_util.tree_leaves(refresh(t)) for t in (got, want))
    if len(a) != len(b):
        raise AssertionError(f"{what}: {len(a)} output arrays, expected {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        x, y, msg = np.asarray(x), np.asarray(y), f"{what}, output {i}"
        if x.shape != y.shape:
            raise AssertionError(f"{msg}: shape {x.shape}, expected {y.shape}")
        if rtol or atol:
            np.testing.assert_allclose(x, y, rtol, atol, equal_nan=False, err_msg=msg)
        else:
            np.testing.assert_array_equal(x, y, err_msg=msg)


def agree(view: Callable[[Any], Any] = _identity, peer_view: Callable[[Any], Any] = _identity,
          rtol: float = 0.0, atol: float = 0.0) -> Check:
    """The check for a peer that computes the same thing: ``view(ours)`` equals
    ``peer_view(peer)`` (the views bring both to one layout, e.g. padding numpy's answer)."""
    def check(ours: Any, peer: Any) -> None:
        assert_same(view(ours), peer_view(peer), "ours vs the peer", rtol, atol)
    return check


#: ours and the peer give the same arrays, exactly
same_result = agree()


def close_result(rtol: float, atol: float = 0.0) -> Check:
    """ours and the peer give the same arrays within a tolerance (float reductions)."""
    return agree(rtol=rtol, atol=atol)


def against(reference: Any, peer_reference: Any = None, *,
            view: Callable[[Any], Any] = _identity, peer_view: Callable[[Any], Any] = _identity,
            rtol: float = 0.0, atol: float = 0.0) -> Check:
    """The check for a peer whose output is no reference for ours (a speed baseline such as
    ``jnp.take`` beside ``find``, or another computation): ``view(ours)`` against the case's
    own independent ``reference`` (numpy, a dict, onnxruntime); with ``peer_reference``,
    ``peer_view(peer)`` against it too."""
    def check(ours: Any, peer: Any) -> None:
        assert_same(view(ours), reference, "ours vs the reference", rtol, atol)
        if peer_reference is not None:
            assert_same(peer_view(peer), peer_reference, "the peer vs its reference", rtol,
                        atol)
    return check


def all_of(*checks: Check) -> Check:
    """Every one of ``checks``, in order."""
    def check(ours: Any, peer: Any) -> None:
        for c in checks:
            c(ours, peer)
    return check


def table_contents(table: Any) -> tuple[np.ndarray, np.ndarray]:
    """A hash table's live keys (int64, ascending) and their rows, read on the host from its
    slot arrays, with no probing: the reference hash-table cases are checked against. A
    ShardedHashTable's shards are read together."""
    import jaxops.hashtable as ht

    t = getattr(table, "shards", table)
    lo, hi, flags, values = (np.asarray(a) for a in jax.device_get(
        (t.key_lo, t.key_hi, t.flags, t.values)))
    keys = ((hi.reshape(-1).astype(np.uint64) << np.uint64(32))
            | lo.reshape(-1).astype(np.uint64)).view(np.int64)
    flags = flags.reshape(-1)
    live = ((flags & ht.cann.VALID) != 0) & ((flags & ht.cann.EVICTED) == 0)
    order = np.argsort(keys[live])
    return keys[live][order], values.reshape(keys.size, -1)[live][order]


def table_rows(table: Any, keys: np.ndarray, default: float = 0.0
               ) -> tuple[np.ndarray, np.ndarray]:
    """numpy ``find``: the rows of ``keys`` in ``table`` (``default`` where absent) and
    whether each is held, from :func:`table_contents`."""
    held, rows = table_contents(table)
    at = np.minimum(np.searchsorted(held, keys), max(held.size - 1, 0))
    found = held[at] == keys if held.size else np.zeros(np.shape(keys), bool)
    return np.where(found[:, None], rows[at], np.float32(default)), found


def assert_table(table: Any, keys: np.ndarray, what: str, rows: np.ndarray | None = None,
                 rtol: float = 0.0, atol: float = 0.0) -> None:
    """Raises unless ``table`` holds exactly the distinct ``keys`` and, when given, ``rows``
    (in ascending key order)."""
    held, held_rows = table_contents(table)
    assert_same(held, np.unique(keys), f"{what}: the keys held")
    if rows is not None:
        assert_same(held_rows, rows, f"{what}: the rows held", rtol, atol)


def holds_keys(keys: np.ndarray, peer_keys: np.ndarray | None = None,
               view: Callable[[Any], Any] = _identity) -> Check:
    """The check for inserts: ``view(ours)`` is a table holding exactly ``keys`` (nothing
    dropped, nothing extra); with ``peer_keys``, ``view(peer)`` holds exactly those."""
    def check(ours: Any, peer: Any) -> None:
        assert_table(view(ours), keys, "ours")
        if peer_keys is not None:
            assert_table(view(peer), peer_keys, "the peer")
    return check


def adam_first_step(rows: np.ndarray, index: np.ndarray, grads: np.ndarray, lr: float,
                    eps: float = 1e-8) -> np.ndarray:
    """numpy: ``rows`` after one bias-corrected Adam step from zero moments, the gradients of
    equal ``index`` summed first (``optax.adam``'s first step is ``lr * g / (|g| + eps)``);
    rows without a gradient stay."""
    g = np.zeros(rows.shape, np.float64)
    np.add.at(g, index, grads)
    return (rows - lr * g / (np.abs(g) + eps)).astype(np.float32)


def _checked(name: str, peer_name: str, check: Check, ours: Callable[[], Any],
             peer: Callable[[], Any], reset: Callable[[], Any]) -> None:
    """One call of each side, then ``check`` on both outputs: nothing is timed before the
    results are known right."""
    _block(reset())
    got = _block(ours())
    _block(reset())
    theirs = _block(peer())
    try:
        check(got, theirs)
    except AssertionError as e:
        raise AssertionError(f"{name} vs {peer_name}: wrong result, not timed: {e}") from e


def compare(name: str, ours: Callable[[], Any], peer_name: str, peer: Callable[[], Any],
            target: float | None = None, repeats: int = 7, note: str = "", warmup: int = 5,
            reset: Callable[[], Any] | None = None, *, check: Check) -> Result:
    """Checks, then times ``ours`` and ``peer`` interleaved (ours, peer, ours, …) and
    returns the Result.

    ``check(ours_out, peer_out)`` (required) gets one output of each side, from one call of
    each before anything else, and raises AssertionError when a result is wrong; the error
    names the case (see :func:`same_result`, :func:`against`).

    The ``warmup`` pairs run first, untimed: the first few calls after building large
    inputs run while the allocator is still growing its arenas (measured here: find and
    take 2-5x slower for about six calls), which is not the steady state either side has.
    ``reset``, when given, runs untimed before every call of either side: for steps that
    change their own input (an insert), so every timed call starts from the same state.
    """
    reset = reset or (lambda: None)
    _checked(name, peer_name, check, ours, peer, reset)
    for _ in range(warmup):
        _block(reset())
        _block(ours())
        _block(reset())
        _block(peer())
    times, faults = ([], []), ([], [])
    for _ in range(repeats):
        for side, fn in enumerate((ours, peer)):
            _block(reset())
            f0, t0 = _minor_faults(), time.perf_counter()
            _block(fn())
            times[side].append(time.perf_counter() - t0)
            faults[side].append(_minor_faults() - f0)
    (a, b), (fa, fb) = times, faults
    pairs = sorted(x / y for x, y in zip(a, b))
    q1, _, q3 = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else (pairs[0],) * 3
    return Result(name, statistics.median(a), peer_name, statistics.median(b), target, note,
                  min(a), min(b), int(statistics.median(fa)), int(statistics.median(fb)),
                  q1, q3)


def _minor_faults() -> int:
    """Page faults of this process so far that needed no disk (fresh or reused pages)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def format_table(results: list[Result]) -> str:
    """A plain-text table of results with ratios and target verdicts."""
    head = (f"{'case':46s} {'ours ms':>9s} {'peer':>22s} {'peer ms':>9s} {'ratio':>7s} "
            f"{'spread':>11s} {'best':>6s} {'target':>7s}")
    lines = [head, "-" * len(head)]
    for r in results:
        verdict = "" if r.target is None else (f"<={r.target:g} " + ("ok" if r.meets_target else "MISS"))
        best = "" if r.best_ratio is None else f"{r.best_ratio:.2f}"
        spread = "" if r.ratio_q1 is None else f"{r.ratio_q1:.2f}-{r.ratio_q3:.2f}"
        lines.append(f"{r.name:46s} {r.ours_s * 1e3:9.2f} {r.peer:>22s} {r.peer_s * 1e3:9.2f} "
                     f"{r.ratio:7.2f} {spread:>11s} {best:>6s} {verdict:>7s}")
    return "\n".join(lines)


def write_json(results: list[Result], path: str) -> None:
    meta = {"jax": jax.__version__, "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
            "glibc_hugepages": hugepages_enabled(), "cpus": os.cpu_count()}
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": [r.as_dict() for r in results]}, f, indent=2)


def report(results: list[Result], json_path: str | None) -> None:
    """Prints the ratio table (and each case's note), then writes the JSON when asked."""
    print(format_table(results))
    for r in results:
        if r.note:
            print(f"  {r.name} vs {r.peer}: {r.note}")
    faulting = [r for r in results if max(r.ours_faults or 0, r.peer_faults or 0) >= 1000]
    for r in faulting:
        print(f"  {r.name} vs {r.peer}: page faults per call {r.ours_faults} (ours), "
              f"{r.peer_faults} (peer)")
    if json_path:
        write_json(results, json_path)
        print(f"wrote {json_path}")


def plot_ratios(results: list[Result], path: str) -> str | None:
    """Bar chart of ratios with target markers; ``None`` (and a note) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: skipping the PNG chart; pip install 'jaxops[plot]')")
        return None
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(results) + 1.5))
    names = [r.name for r in results]
    colours = ["#55a868" if r.meets_target in (True, None) else "#c44e52" for r in results]
    ax.barh(names, [r.ratio for r in results], color=colours)
    for i, r in enumerate(results):
        if r.target is not None:
            ax.plot([r.target, r.target], [i - 0.4, i + 0.4], color="black", linewidth=2)
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_xlabel("time ratio jaxops / peer (lower is better; black tick = target)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_on_host_devices(module: str, quick: bool, devices: int = 8) -> dict:
    """Runs ``python -m benchmarks.<module> --child quick|full`` in a process with
    ``devices`` forced host devices (the flag must be set before jax is imported) and
    returns the JSON object its last output line prints."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--child",
                           "quick" if quick else "full"], env=env, cwd=root,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the {devices}-device child of {module} failed:\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
