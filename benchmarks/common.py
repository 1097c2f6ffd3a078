"""Side-by-side timing helpers shared by every benchmark.

Each benchmark case times jaxops and its peer on the same inputs in one process, after a
warm-up, as the median of several repeats, and reports the ratio ``ours / peer`` (these
machines are noisy; ratios are what we compare). The table's ``spread`` column is the
interquartile range of the ratios of the interleaved pairs, its ``best`` column the ratio of
the fastest repeats, the steadier figure when other load inflates the medians; targets are
judged on the median ratio.
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


def compare(name: str, ours: Callable[[], Any], peer_name: str, peer: Callable[[], Any],
            target: float | None = None, repeats: int = 7, note: str = "", warmup: int = 5,
            reset: Callable[[], Any] | None = None) -> Result:
    """Times ``ours`` and ``peer`` interleaved (ours, peer, ours, …) and returns the Result.

    The ``warmup`` pairs run first, untimed: the first few calls after building large
    inputs run while the allocator is still growing its arenas (measured here: find and
    take 2-5x slower for about six calls), which is not the steady state either side has.
    ``reset``, when given, runs untimed before every call of either side: for steps that
    change their own input (an insert), so every timed call starts from the same state.
    """
    reset = reset or (lambda: None)
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
