"""TorchRec's ``FusedEmbeddingBagCollection`` DLRM step: the peer of ``benchmarks/dlrm.py``.

Not a jaxops dependency and no test extra: the comparison runs where ``torchrec`` imports,
in the same process as the jaxops steps (interleaved), with torch on one thread. On a CPU
machine, TorchRec's ``fbgemm-gpu`` dependency is the CUDA build; install the CPU build
beside it in a separate virtual environment that also has jax (``jax``, ``flax``, ``optax``
at jaxops' versions), for example::

    python -m venv /path/recenv
    /path/recenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    /path/recenv/bin/pip install --no-deps torchrec fbgemm-gpu-cpu   # matching torch
    /path/recenv/bin/pip install tensordict torchmetrics tqdm pyre-extensions iopath \\
        jax jaxlib flax optax orbax-checkpoint chex

and run ``JAXOPS_TORCHREC_PYTHON=/path/recenv/bin/python python -m benchmarks --only dlrm``
(the TorchRec rows then run in a child process of that interpreter, jaxops from this
checkout), or run the benchmark with that interpreter directly. Measured here with torch
2.13.0+cpu, fbgemm-gpu-cpu 1.8.0, torchrec 1.8.0.

The model is the jaxops model's: one table of ``slots`` rows for the 26 features, each id
salted with its feature (``salt_ids``) and hashed into the table (``murmur3 % slots``, the
dense baseline's rows), element-wise Adagrad on the rows (``EmbOptimType.EXACT_ADAGRAD``,
fused into the backward), the same two-matrix MLP with Adam. Every row starts at 0.01 and
the MLP at the jaxops model's initial weights, so the first step's loss is the jaxops
model's (the check before timing).
"""

from __future__ import annotations

import numpy as np

FEATURES, DENSE, DIM = 26, 13, 16


def available() -> bool:
    try:
        import torchrec  # noqa: F401
    except ImportError:
        return False
    return True


def hashed_rows(ids: np.ndarray, slots: int) -> np.ndarray:
    """The table row of each id ``[26, batch]``: its feature's salt, then murmur3 % slots
    (what the dense baseline indexes)."""
    import jax

    from jaxops.embedding import feature_salt
    from jaxops.hashtable.cann import murmur3_x86_32

    pairs = np.ascontiguousarray(ids).view(np.uint32).reshape(*ids.shape, 2)
    salts = np.array([feature_salt(f"c{i}") for i in range(FEATURES)], np.uint32)
    lo, hi = pairs[..., 0] ^ salts[:, :1], pairs[..., 1] ^ salts[:, 1:]
    return np.asarray(jax.device_get(murmur3_x86_32(lo, hi))).astype(np.int64) % slots


def torchrec_step(slots: int, batches: list, mlp: dict):
    """A ``compare`` callable: one TorchRec training step per call on ``batches`` in turn
    (``mlp``: the jaxops model's initial ``bottom`` / ``top`` weights)."""
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    torch.set_num_threads(1)
    names = [f"c{i}" for i in range(FEATURES)]
    ebc = FusedEmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="ids", embedding_dim=DIM, num_embeddings=slots,
                                   feature_names=names)],
        optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"lr": 0.05},
        device=torch.device("cpu"))
    with torch.no_grad():
        for p in ebc.parameters():
            p.fill_(0.01)
    bottom = torch.nn.Linear(DENSE, DIM, bias=False)
    top = torch.nn.Linear((FEATURES + 1) * DIM, 1, bias=False)
    with torch.no_grad():
        bottom.weight.copy_(torch.from_numpy(np.asarray(mlp["bottom"]).T.copy()))
        top.weight.copy_(torch.from_numpy(np.asarray(mlp["top"]).T.copy()))
    adam = torch.optim.Adam(list(bottom.parameters()) + list(top.parameters()), lr=1e-3)
    ready = []
    for dense, ids, labels in batches:
        rows = torch.from_numpy(hashed_rows(ids, slots).reshape(-1).copy())
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=names, values=rows, lengths=torch.ones(rows.shape[0], dtype=torch.int64))
        ready.append((torch.from_numpy(dense), kjt, torch.from_numpy(labels)))
    box = {"i": 0}

    def call():
        dense, kjt, labels = ready[box["i"] % len(ready)]
        box["i"] += 1
        pooled = ebc(kjt)
        x = torch.cat([bottom(dense)] + [pooled[n] for n in names], dim=1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(top(x)[:, 0], labels)
        adam.zero_grad()
        loss.backward()  # the row Adagrad runs inside (fused)
        adam.step()
        return np.float32(loss.detach().numpy())

    return call
