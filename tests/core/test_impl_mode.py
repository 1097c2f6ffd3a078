"""OpImplMode / OpExecMode codes, string maps, index chars, kernel-JSON parsing, selection."""

import threading

import pytest

from jaxops.core.impl_mode import (OpExecMode, OpImplMode, current_impl_mode, impl_mode,
                                   impl_mode_from_str, impl_mode_to_str,
                                   parse_kernel_impl_modes, select_impl_mode, to_index,
                                   to_index_char)

M = OpImplMode

NAMES = {
    "default": (M.DEFAULT, 0x1, 0), "high_performance": (M.HIGH_PERFORMANCE, 0x2, 1),
    "high_precision": (M.HIGH_PRECISION, 0x4, 2), "super_performance": (M.SUPER_PERFORMANCE, 0x8, 3),
    "support_out_of_bound_index": (M.SUPPORT_OUT_OF_BOUND_INDEX, 0x10, 4),
    "enable_float32_execution": (M.ENABLE_FLOAT32_EXECUTION, 0x20, 5),
    "enable_hi_float32_execution": (M.ENABLE_HI_FLOAT32_EXECUTION, 0x40, 6),
    "keep_fp16": (M.KEEP_FP16, 0x80, 7),
}


def test_codes():
    assert int(M.RESERVED) == 0xFFFFFFFF
    assert (int(OpExecMode.DEFAULT), int(OpExecMode.HF32), int(OpExecMode.RESERVED)) == (0, 1, 0xFFFFFFFF)


@pytest.mark.parametrize("name", NAMES)
def test_strings_codes_and_index(name):
    mode, code, index = NAMES[name]
    assert int(mode) == code
    assert impl_mode_from_str(name) is mode
    assert impl_mode_to_str(mode) == name
    assert to_index(mode) == index and to_index_char(mode) == str(index)


def test_unknown_string_is_reserved_with_warning():
    with pytest.warns(UserWarning, match="'turbo'"):
        assert impl_mode_from_str("turbo") is M.RESERVED
    assert impl_mode_to_str(M.RESERVED) == "unknown"


def test_index_of_combination_is_lowest_bit():
    assert to_index(M.HIGH_PRECISION | M.KEEP_FP16) == 2
    assert to_index(M.RESERVED) == 0
    with pytest.raises(ValueError):
        to_index(0)


@pytest.mark.parametrize("path, mode", [
    ("/op/high_performance/nonzero.json", M.HIGH_PERFORMANCE),
    ("/op/high_precision/nonzero.json", M.HIGH_PRECISION),
    ("/op/support_out_of_bound_index/gather.json", M.SUPPORT_OUT_OF_BOUND_INDEX),
])
def test_parse_path_wins(path, mode):
    assert parse_kernel_impl_modes({"implMode": "keep_fp16"}, path) is mode


def test_parse_multi_mode_string():
    s = "high_performance,high_precision,enable_float_32_execution,enable_hi_float_32_execution"
    assert parse_kernel_impl_modes({"implMode": s}, "/op/plain.json") == (
        M.HIGH_PERFORMANCE | M.HIGH_PRECISION | M.ENABLE_FLOAT32_EXECUTION
        | M.ENABLE_HI_FLOAT32_EXECUTION)


@pytest.mark.parametrize("name", NAMES)
def test_parse_single_name(name):
    assert parse_kernel_impl_modes({"implMode": name}) is NAMES[name][0]


@pytest.mark.parametrize("desc", [{}, {"implMode": "fast_please"}, None,
                                  {"implMode": "high_precision,high_performance"}])
def test_parse_fallback_is_high_precision_with_warning(desc):
    with pytest.warns(UserWarning, match="high_precision"):
        assert parse_kernel_impl_modes(desc) is M.HIGH_PRECISION


@pytest.mark.parametrize("requested, supported, chosen", [
    (M.HIGH_PERFORMANCE, M.HIGH_PERFORMANCE | M.HIGH_PRECISION, M.HIGH_PERFORMANCE),
    (M.KEEP_FP16, M.HIGH_PERFORMANCE | M.HIGH_PRECISION, M.HIGH_PRECISION),
    (M.DEFAULT, M.HIGH_PERFORMANCE | M.HIGH_PRECISION, M.HIGH_PRECISION),
    (M.DEFAULT, M.DEFAULT | M.HIGH_PERFORMANCE, M.HIGH_PERFORMANCE),
    (M.DEFAULT, M.DEFAULT, M.HIGH_PERFORMANCE),
    (M.KEEP_FP16, M.KEEP_FP16, M.KEEP_FP16),
    (M.SUPER_PERFORMANCE, M.HIGH_PERFORMANCE, M.HIGH_PERFORMANCE),
    (M.RESERVED, M.HIGH_PRECISION, M.HIGH_PRECISION),
])
def test_select(requested, supported, chosen):
    assert select_impl_mode(requested, supported) is chosen


def test_context_is_thread_local_and_nests():
    assert current_impl_mode() is M.DEFAULT
    seen = []
    with impl_mode("high_performance"):
        t = threading.Thread(target=lambda: seen.append(current_impl_mode()))
        t.start(); t.join()
        with impl_mode(M.KEEP_FP16):
            assert current_impl_mode() is M.KEEP_FP16
        assert current_impl_mode() is M.HIGH_PERFORMANCE
    assert current_impl_mode() is M.DEFAULT
    assert seen == [M.DEFAULT]


def test_context_restores_after_error():
    with pytest.raises(RuntimeError):
        with impl_mode("keep_fp16"):
            raise RuntimeError
    assert current_impl_mode() is M.DEFAULT


def test_a_misspelt_mode_raises_everywhere_as_the_readme_says():
    """impl_mode(), OP_OPTION and a call's impl_mode= raise on a name no mode has (issue
    40: the first two warned and ran high_precision); CANN's own parser still warns."""
    import warnings

    import jax.numpy as jnp

    from jaxops.core.errors import OpArgumentError
    from jaxops.core.registry import get_op
    from tracing import OP_OPTION

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # raised, not warned
        with pytest.raises(OpArgumentError, match=r"impl_mode: argument 'mode': expected one of .*high_precision.*got 'fast'"):
            with impl_mode("fast"):
                pass
        with pytest.raises(OpArgumentError, match=r"OP_OPTION: .*Did you mean 'high_precision'"):
            OP_OPTION("high_precison")
        with pytest.raises(OpArgumentError, match=r"NonZero: argument 'impl_mode'"):
            get_op("NonZero")(jnp.ones(2), impl_mode="fast")
    assert current_impl_mode() is M.DEFAULT
