"""The packed CPU linear kernel against torch, and its batch invariance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.linear import Linear

ops = cpu_ops.load()
needs_kernels = pytest.mark.skipif(ops is None, reason="C++ CPU kernels unavailable")


def _linear(w: torch.Tensor, b: torch.Tensor | None) -> Linear:
    layer = Linear(w.shape[1], w.shape[0], bias=b is not None)
    layer.weight.data.copy_(w)
    if b is not None:
        layer.bias.data.copy_(b)
    layer.finalize()
    return layer


@needs_kernels
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 17, 64, 130])
@pytest.mark.parametrize(("k", "n"), [(64, 96), (100, 37), (576, 960), (33, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_torch(m, k, n, bias):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(m, k, generator=g)
    layer = _linear(w, b)
    assert layer.method.format == "dense:packed" and layer.weight.numel() == 0
    ref = F.linear(x.double(), w.double(), b.double() if bias else None)
    out = layer(x)
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_kernels
def test_packed_linear_is_batch_invariant():
    """A row's output is bit-identical alone, in any batch size and at any position."""
    g = torch.Generator().manual_seed(0)
    layer = _linear(torch.randn(200, 576, generator=g), torch.randn(200, generator=g))
    x = torch.randn(70, 576, generator=g)
    full = layer(x)
    for lo, hi in [(0, 1), (3, 4), (5, 12), (8, 16), (20, 69), (69, 70)]:
        assert torch.equal(layer(x[lo:hi]), full[lo:hi])


@needs_kernels
def test_packed_linear_keeps_leading_dims_and_accepts_views():
    layer = _linear(torch.randn(48, 32), None)
    x = torch.randn(3, 4, 64)[..., ::2]  # non-contiguous view
    out = layer(x)
    assert out.shape == (3, 4, 48)
    torch.testing.assert_close(out, F.linear(x, _dense(layer)))


def _dense(layer: Linear) -> torch.Tensor:
    """Unpack [P, K, NB] panels back to the [N, K] weight."""
    return layer.method.unpacked()


def test_torch_fallback_without_kernels(monkeypatch):
    monkeypatch.setattr(cpu_ops, "load", lambda family="core": None)
    w, b, x = torch.randn(10, 8), torch.randn(10), torch.randn(4, 8)
    layer = _linear(w, b)
    assert layer.method.format == "dense:transposed"
    torch.testing.assert_close(layer(x), F.linear(x, w, b))


@needs_kernels
def test_kernels_release_the_gil():
    """Another Python thread (the server's event loop) runs while a kernel computes: its
    longest stall is far below one kernel call (holding the GIL, it would be at least one)."""
    import threading
    import time

    layer = _linear(torch.randn(16384, 576), None)
    x = torch.randn(512, 576)
    # One kernel thread: with the watching thread that makes two busy threads, so on a 2-core
    # machine neither waits for a core and a stall can only be the GIL (with a kernel thread
    # per core the watcher was sometimes descheduled for most of a call). OpenMP's thread count
    # is per calling thread, so the working thread sets it for itself too (left at the default
    # it ran two kernel threads beside the watcher, and CI once saw a 31 ms stall of a 46 ms call).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        layer(x)
        started, done = threading.Event(), threading.Event()
        calls: list[float] = []

        def work():
            torch.set_num_threads(1)
            started.set()
            for _ in range(3):
                t0 = time.perf_counter()
                layer(x)
                calls.append(time.perf_counter() - t0)
            done.set()

        t = threading.Thread(target=work)
        t.start()
        started.wait()
        longest, last = 0.0, time.perf_counter()
        while not done.is_set():
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        t.join()
    finally:
        torch.set_num_threads(threads)
    call_s = min(calls)
    assert longest < call_s / 2, f"stalled {longest * 1e3:.0f} ms; one call takes {call_s * 1e3:.0f} ms"
