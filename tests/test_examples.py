"""Every example runs (small sizes) and produces sane results."""

import importlib.util
import os

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_detection_pipeline():
    out = load("detection_pipeline").main(images=3)
    assert out["onnx_counts"] == out["trt_counts"]   # both routes keep the same detections here
    assert all(n >= 1 for n in out["onnx_counts"])


def test_hash_embedding_training():
    out = load("hash_embedding_training").main(chunks=2, bucket_size=8192)
    assert out["losses"][1] < out["losses"][0]
    assert out["grad_error"] == 0.0 and out["checkpoint_identical"]
    assert sum(out["exported"]) == out["live"]      # incremental exports cover every live key


def test_golden_data(tmp_path):
    out = load("golden_data").main(str(tmp_path))
    assert out["nonzero_matches_numpy"] and all(os.path.exists(p) for p in out["paths"])


def test_capacity_tuning(tmp_path):
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "cap.png")
    out = load("capacity_tuning").main(images=48, plot_path=path)
    assert 0 < out["capacity"] <= 80 and out["saving"] > 0
    assert os.path.getsize(path) > 1000
    assert np.isfinite(out["observed_overflow"])


def test_sharded_embedding():
    out = load("sharded_embedding").main(steps=20, batch=128)  # the suite's one device
    assert out["last_loss"] < out["first_loss"]
    assert out["same_after_reshard"] and out["live"] > 0
