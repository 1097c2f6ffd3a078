"""Tests of tracing/: the CANN launch protocol, OP_OUTSHAPE refresh, host refresh inside jit."""
