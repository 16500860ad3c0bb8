"""Fixtures of the quantized-weight tests."""

from __future__ import annotations

import pytest

from pagedllm.model.layers.quant import gguf_a8_panels


@pytest.fixture(scope="module")
def ops():
    """The compiled kernels with the int8-activation panels (a failed build fails the test)."""
    ops = gguf_a8_panels.kernels()
    if ops is None:
        pytest.fail("the int8-activation panel kernels did not build (cpu_ops.load() failed)")
    return ops
