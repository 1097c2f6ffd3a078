"""Size an NMS capacity from statistics instead of the theoretical maximum.

1. Run the detection post-processing over a synthetic workload at the theoretical maximum
   capacity and record every image's output size (``jaxops.capacity``).
2. Recommend a capacity by the 3σ rule, rounded up to a power of two.
3. Run a fresh workload at that capacity: report memory saved, valid-data density and the
   observed overflow rate (overflows are flagged by the DynArray, never silent).
4. Write the histogram with the μ+3σ line and the capacity (when matplotlib is installed).

    python examples/capacity_tuning.py [plot.png]
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxops
from jaxops.demo.detection import MAX_PER_CLASS, NUM_CLASSES, decode, make_anchors, synthetic_outputs
from jaxops import capacity

ANCHORS = jnp.asarray(make_anchors())


def detect(deltas, logits, size):
    """The jitted pipeline for a batch at capacity ``size`` (rows per image)."""
    @jax.jit
    def run(deltas, logits):
        def one(d, l):
            return jaxops.non_max_suppression(decode(ANCHORS, d)[None], jax.nn.sigmoid(l)[None],
                                              MAX_PER_CLASS, 0.45, 0.5, size=size)
        return jax.vmap(one)(deltas, logits)
    return run(jnp.asarray(deltas), jnp.asarray(logits))


def main(images: int = 96, plot_path: str | None = None) -> dict:
    theoretical_max = NUM_CLASSES * MAX_PER_CLASS           # 1 batch × C classes × per-class cap
    stats = capacity.CapacityStats("detection/nms", theoretical_max)

    deltas, logits, _ = synthetic_outputs(images, seed=10)
    capacity.record_tree(stats.name, detect(deltas, logits, None))
    stats = capacity.get_stats(stats.name, theoretical_max)
    cap = capacity.recommend(stats, policy="sigma", k=3.0, round_to="pow2")
    capacity.report(stats)

    deltas, logits, _ = synthetic_outputs(images, seed=11)  # a fresh workload
    held_out = detect(deltas, logits, cap)
    overflowed = np.asarray(held_out.overflowed())
    m = capacity.metrics(stats, cap)
    print(f"\nrecommended capacity {cap} rows/image (theoretical max {theoretical_max})")
    print(f"memory saving      {m.memory_saving:.1%}")
    print(f"valid data density {m.density:.1%} (recorded workload)")
    print(f"overflow rate      {m.overflow_rate:.2%} expected, {overflowed.mean():.2%} observed "
          f"on {images} fresh images ({int(np.asarray(held_out.lost(axis=0)).sum())} detections "
          "lost, each flagged by DynArray.overflowed())")
    tight_cap = max(cap // 4, 1)  # what a too-small capacity costs
    tight = detect(deltas, logits, tight_cap)
    print(f"capacity {tight_cap:<6} rows/image: {np.asarray(tight.overflowed()).mean():.2%} of "
          f"images overflowed, {int(np.asarray(tight.lost(axis=0)).sum())} detections lost "
          f"(expected {capacity.metrics(stats, tight_cap).overflow_rate:.2%})")
    if plot_path:
        try:
            print(f"wrote {capacity.plot(stats, plot_path, k=3.0, capacity=cap)}")
        except ImportError as e:
            print(f"(no plot: {e})")
    return {"capacity": cap, "saving": m.memory_saving, "density": m.density,
            "expected_overflow": m.overflow_rate, "observed_overflow": float(overflowed.mean())}


if __name__ == "__main__":
    main(plot_path=sys.argv[1] if len(sys.argv) > 1 else "capacity_tuning.png")
