"""golden CLI: a 16M-element NonZero case end to end against numpy + np.savez by hand.

Both sides run as fresh processes, in turn, so each pays its own start-up (Python, numpy,
and for ours JAX, the operators and the native kernels, the kernel's compilation): the
command a developer types, ``python -m jaxops golden NonZero --shape 4096,4096``, against a
script that draws the same kind of input, takes ``np.nonzero`` and saves both with
``np.savez``. ``import jaxops`` and ``import jax`` are timed alone too. Before timing, the
two files are checked to hold the same coordinates of the same input.

    python -m benchmarks --only golden_cli [--quick]
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.common import Result

#: The by-hand side: the golden spec's NonZero input (int32 in [-100, -1] and [1, 100], 30%
#: set), numpy's coordinates (int64, ONNX layout) and np.savez, nothing else.
BY_HAND = """
import sys
import numpy as np
shape = tuple(int(d) for d in sys.argv[2].split(","))
rng = np.random.default_rng(0)
x = rng.integers(-100, 100, shape, dtype=np.int32)
x[x >= 0] += 1
x = np.where(rng.random(shape, np.float32) < np.float32(0.3), x, np.int32(0))
y = np.stack(np.nonzero(x)).astype(np.int64)
np.savez(sys.argv[1], x=x, y=y)
"""


def _wall(argv: list[str], env: dict) -> tuple[float, float]:
    """Wall-clock and CPU seconds (user + system) of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _same_case(ours: str, theirs: str) -> None:
    with np.load(ours) as z, np.load(theirs) as h:
        if not (np.array_equal(z["input_x"], h["x"]) and np.array_equal(z["output_y"], h["y"])):
            raise AssertionError("golden_cli: the golden case and numpy's differ")


def run(quick: bool = False) -> list[Result]:
    """Medians of fresh-process runs, ours and by hand taken in turn."""
    shape = "1024,1024" if quick else "4096,4096"
    repeats = 2 if quick else 5
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    with tempfile.TemporaryDirectory() as d:
        ours_file, hand_file = os.path.join(d, "golden.npz"), os.path.join(d, "hand.npz")
        ours = [sys.executable, "-m", "jaxops", "golden", "NonZero", "--shape", shape,
                "--out", ours_file, "--force"]
        hand = [sys.executable, "-c", BY_HAND, hand_file, shape]
        _wall(ours, env), _wall(hand, env)
        _same_case(ours_file, hand_file)
        times = {"ours": [], "hand": [], "import jaxops": [], "import jax": []}
        for _ in range(repeats):
            times["ours"].append(_wall(ours, env))
            times["hand"].append(_wall(hand, env))
            times["import jaxops"].append(_wall([sys.executable, "-c", "import jaxops"], env))
            times["import jax"].append(_wall([sys.executable, "-c", "import jax"], env))
        size = os.path.getsize(ours_file), os.path.getsize(hand_file)
    med = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    best = {k: min(w for w, _ in v) for k, v in times.items()}
    ratios = sorted(o[0] / h[0] for o, h in zip(times["ours"], times["hand"]))
    n = "x".join(shape.split(","))
    return [
        Result(f"golden NonZero {n} end to end", med["ours"], "numpy + np.savez by hand",
               med["hand"], target=1.5, ours_best_s=best["ours"], peer_best_s=best["hand"],
               ratio_q1=ratios[len(ratios) // 4], ratio_q3=ratios[(3 * len(ratios)) // 4],
               note=f"CPU s: ours {cpu['ours']:.2f}, by hand {cpu['hand']:.2f}, import jax "
                    f"alone {cpu['import jax']:.2f}; files {size[0] >> 20} / {size[1] >> 20} MiB"),
        Result("python -c 'import jaxops'", med["import jaxops"], "python -c 'import jax'",
               med["import jax"], ours_best_s=best["import jaxops"],
               peer_best_s=best["import jax"], note="the library loads on first use"),
    ]


if __name__ == "__main__":
    from benchmarks.common import report
    report(run("--quick" in sys.argv), None)
