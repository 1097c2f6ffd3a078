"""The public surface of jaxops, jaxops.hashtable and tracing, written out.

Adding or removing a public name is a conscious change: update the list here in the same
commit (and say so in the changelog / README), never to make this test pass by accident.
"""

import importlib

import pytest

PUBLIC = {
    "jaxops": [
        "DataType", "DynArray", "Format", "OpDef", "OpExecMode", "OpImplMode", "TensorDesc",
        "argwhere", "backends", "batched_nms", "capacity", "check_overflow", "efficient_nms",
        "flatnonzero", "get_op", "hashtable", "impl_mode", "list_ops", "masked_select", "nms",
        "non_max_suppression", "nonzero", "refresh", "register_op", "unique",
        "unique_consecutive", "use_backend",
    ],
    "jaxops.hashtable": [
        "AdamWState", "CheckpointError", "ExportChunk", "HashTable", "ImportInfo",
        "LOAD_POLICIES", "LoadDemand", "LookupInfo", "Maintenance", "MeshAxis", "ONE_DEVICE",
        "OneDevice",
        "Placement", "RouteInfo", "ShardedHashTable", "SlotPredicate", "SlotScores",
        "adam_w_init", "apply_adam_w", "cann", "checkpoint", "compact", "counter_below", "evict",
        "evict_if",
        "evict_lowest", "export", "export_chunks", "find", "gather", "host_keys", "import_",
        "init_sharded_table", "init_table", "load", "locate", "lookup", "lookup_or_insert",
        "maintain", "not_seen_for", "optim", "owner_shard", "resize", "save", "set_load_policy",
        "slot_bytes", "with_route", "words",
    ],
    "jaxops.dynamic": [
        "IDENTITIES", "RULES", "Tensor", "argmax", "concat", "elementwise", "gather", "matmul",
        "plan_shape", "reduce", "rules", "softmax", "top_k",
    ],
    "jaxops.onnx": ["CapacityPlan", "OPSETS", "Program", "SizeReport", "calibrate", "load",
                    "supported_ops"],
    "jaxops.onnx.nodes": ["NodeValues", "data_dependent", "node_values"],
    "jaxops.onnx.golden": ["read_inputs", "write_model_golden"],
    "jaxops.onnx.golden_check": ["NodeCheck", "check_model"],
    "jaxops.golden.models": ["INDEX", "KIND", "ModelReport", "compare_model", "is_model_folder",
                             "load_index"],
    "jaxops.hashtable.checkpoint": ["CHUNK_BYTES", "Checkpointer", "Restore", "Save",
                                    "TrainStateHandler", "load", "save"],
    "jaxops.hashtable.cann": [
        "EVICTED", "EXPORT", "FILTER", "VALID", "from_cann_bytes", "handle_counters",
        "home_slot", "murmur3_x86_32", "row_bytes", "to_cann_bytes",
    ],
    "jaxops.hashtable.optim": [
        "AdagradState", "AdamState", "FtrlState", "OptaxRowState", "RowOptimizer",
        "RowwiseAdagradState", "SgdState", "adagrad", "adam", "adamw", "from_optax", "ftrl",
        "make_row_optimizer", "rounding_count", "rowwise_adagrad", "sgd", "slot_owners",
        "sum_by_slot",
    ],
    "jaxops.hashtable.words": [
        "Counter64", "Words64", "add_to_words", "as_words", "join_words", "sum_counters",
        "to_host_int64",
    ],
    "tracing": [
        "CacheInfo", "LaunchResult", "OP_ATTR", "OP_EMPTY", "OP_INPUT", "OP_MEMSET", "OP_MODE",
        "OP_OPTION", "OP_OUTPUT", "OP_OUTSHAPE", "OP_WORKSPACE", "OpArg", "OpArgContext",
        "OpArgKind", "cache_clear", "cache_info", "host_refresh", "launch", "outshape",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_pinned(module):
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == PUBLIC[module]
    assert len(set(mod.__all__)) == len(mod.__all__), "a name listed twice"
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"
