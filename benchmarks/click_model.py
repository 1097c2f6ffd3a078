"""The click-model experiment: hash embeddings vs a memory-matched dense table (step, compile).

Run ``python -m benchmarks [--quick] --only click_model``. It runs
``examples/click_model.py`` (full size: 1,500 steps of 1,024 impressions, Zipf ids over 1e6
values per feature, a 2^19-slot hash table; ``--quick``: its quick sizes) and reports the
hash model's training step and compile time against the dense baseline's. Unlike the other
modules, the two sides are not interleaved call by call: each time is the mean step of one
model's whole training loop (eval excluded), the two loops run one after the other on the
same batches. The notes give eval logloss and AUC of both, and their bytes of tables +
optimizer state (the dense table is sized to the hash table's bytes).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from benchmarks.common import Result

_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "click_model.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("click_model", _EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(quick: bool = False) -> list[Result]:
    out = _example().main(quick=quick, dense_fractions=(1.0,))
    hashed, dense = out["results"]
    mib = hashed["memory_bytes"] / 2**20
    quality = (f"eval logloss {hashed['logloss']:.4f} vs {dense['logloss']:.4f}, AUC "
               f"{hashed['auc']:.4f} vs {dense['auc']:.4f} (hidden truth: AUC "
               f"{out['oracle']['auc']:.4f}); tables + optimizer state {mib:.1f} vs "
               f"{dense['memory_bytes'] / 2**20:.1f} MiB")
    slots, rows = f"{hashed['rows']:,} slots", f"{dense['rows']:,} rows"
    return [
        Result(f"click model step, hash {slots}", 1 / hashed["steps_per_s"],
               f"dense {rows}", 1 / dense["steps_per_s"], note=quality),
        Result("click model compile, hash", hashed["compile_s"], "dense", dense["compile_s"],
               note="jit(step).lower().compile(), each model once"),
    ]
