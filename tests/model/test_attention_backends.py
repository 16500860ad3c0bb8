"""The attention backend registry and its selection (model/layers/attention_backends/), and the
one metadata builder: which backend a rank gets for its device, dtypes and head size, the
errors for unknown or unsuitable names, and the metadata each builder makes of a step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.kernels import triton as triton_ops
from pagedllm.model.layers.attention_backends import (
    AUTO_ORDER,
    BACKENDS,
    BatchLayout,
    backend_class,
    select_backend,
)
from pagedllm.model.layers.attention_backends.cpu import CPUBackend
from pagedllm.model.layers.attention_backends.torch_ref import TorchBackend
from pagedllm.model.layers.attention_backends.training import TrainingBackend
from pagedllm.model.layers.attention_backends.triton import TritonBackend

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
F32, BF16 = torch.float32, torch.bfloat16


@pytest.fixture
def kernels():
    if cpu_ops.load() is None:
        pytest.skip("CPU kernels unavailable")


@pytest.fixture
def no_triton(monkeypatch):
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "torch")


def test_registry_names_every_backend_once():
    assert {name: cls.__name__ for name, cls in BACKENDS.items()} == {
        "triton": "TritonBackend", "cpu": "CPUBackend", "torch": "TorchBackend",
        "training": "TrainingBackend"}
    assert all(BACKENDS[n].name == n for n in BACKENDS)
    assert AUTO_ORDER[-1] == "torch" and "training" not in AUTO_ORDER


@pytest.mark.parametrize("kv_dtype", [F32, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=str)
def test_cpu_fp32_runs_the_cpp_kernels(kernels, no_triton, kv_dtype):
    backend = select_backend(CPU, F32, kv_dtype, 64)
    assert type(backend) is CPUBackend and backend.device == CPU
    assert not backend.cuda_graphs


@pytest.mark.parametrize(("dtype", "kv_dtype"), [(BF16, BF16), (BF16, torch.int8),
                                                 (F32, BF16), (torch.float16, torch.float16)])
def test_cpu_without_a_kernel_dtype_runs_torch(no_triton, dtype, kv_dtype):
    assert type(select_backend(CPU, dtype, kv_dtype, 64)) is TorchBackend


def test_cpu_without_kernels_runs_torch(no_triton, monkeypatch):
    monkeypatch.setattr(cpu_ops, "load", lambda family="core": None)
    assert type(select_backend(CPU, F32, F32, 64)) is TorchBackend


def test_cuda_never_builds_the_cpu_kernels(monkeypatch):
    def fail():
        raise AssertionError("CPU kernels loaded for a CUDA rank")

    monkeypatch.setattr(cpu_ops, "load", fail)
    assert not CPUBackend.supports(CUDA, F32, F32, 64)


def test_cuda_runs_triton_unless_turned_off(monkeypatch):
    if not triton_ops.available():
        pytest.skip("triton not installed")
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "auto")
    backend = select_backend(CUDA, BF16, torch.int8, 128)
    assert type(backend) is TritonBackend and backend.cuda_graphs
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "torch")
    assert type(select_backend(CUDA, BF16, torch.int8, 128)) is TorchBackend


def test_triton_on_cpu_only_in_its_interpreter(monkeypatch, kernels):
    if not triton_ops.available():
        pytest.skip("triton not installed")
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert type(select_backend(CPU, F32, F32, 64)) is TritonBackend
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert type(select_backend(CPU, F32, F32, 64)) is CPUBackend


@pytest.mark.parametrize("head_size", [8, 16, 64, 80, 128, 256])
def test_varlen_kernel_by_head_size(kernels, head_size):
    """Prefill rows take the varlen kernel when the head size is a multiple of its vector
    width (decided per head size: the draft model may have another); else torch."""
    backend = CPUBackend(CPU)
    ops = cpu_ops.load_with("varlen_attention")
    expected = ops is not None and head_size % ops.varlen_attention_head_multiple() == 0
    assert backend.varlen_kernel(head_size) == expected


def test_names_select_explicitly(no_triton):
    assert type(select_backend(CPU, F32, F32, 64, name="torch")) is TorchBackend
    assert type(select_backend("cpu", BF16, BF16, 64, name="training")) is TrainingBackend
    assert backend_class("triton") is TritonBackend


def test_unknown_name_is_a_value_error():
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash'; known: cpu, "
                                         r"torch, training, triton"):
        select_backend(CPU, F32, F32, 64, name="flash")


def test_unsuitable_name_is_a_value_error(no_triton):
    with pytest.raises(ValueError, match="attention backend 'cpu' does not run"):
        select_backend(CPU, BF16, BF16, 64, name="cpu")
    with pytest.raises(ValueError, match="attention backend 'triton' does not run"):
        select_backend(CPU, F32, F32, 64, name="triton")


def _layout(block_size=4, group_tables=(), group_windows=(), window=None):
    """decodes r0 (position 17), r1 (position 4) | r2: a chunk of 3 after 5 cached tokens."""
    q_lens = np.array([1, 1, 3])
    starts = np.array([17, 4, 5])
    cu = np.concatenate([[0], np.cumsum(q_lens)])
    req = np.repeat(np.arange(3), q_lens)
    positions = np.arange(cu[-1]) - cu[:-1][req] + starts[req]
    table = np.array([[10, 11, 12, 13, 14], [20, 21, 0, 0, 0], [30, 31, 0, 0, 0]])
    return BatchLayout(block_size, q_lens, starts + q_lens, cu, req, positions, table, 2,
                       list(group_tables), list(group_windows), window)


def test_builder_lays_out_decodes_and_prefill_chunks(no_triton):
    meta = TorchBackend(CPU).build_metadata(_layout(window=16))
    assert meta.backend.name == "torch" and meta.varlen is None and meta.groups is None
    assert meta.num_decodes == 2 and meta.sliding_window == 16
    # slot = table[pos // 4] * 4 + pos % 4
    assert meta.slot_mapping.tolist() == [14 * 4 + 1, 21 * 4 + 0, 31 * 4 + 1, 31 * 4 + 2,
                                          31 * 4 + 3]
    assert meta.decode_seq_lens.tolist() == [18, 5]
    assert meta.decode_block_tables.tolist() == [[10, 11, 12, 13, 14], [20, 21, 0, 0, 0]]
    assert meta.prefill_block_tables.tolist() == [[30, 31]]
    assert meta.prefill_query_start.tolist() == [0, 3]
    assert meta.prefill_seq_lens.tolist() == [8]


def test_builder_of_a_whole_batch_backend_adds_varlen(no_triton):
    meta = TritonBackend(CPU).build_metadata(_layout())
    vb = meta.varlen
    assert vb.query_start_loc.tolist() == [0, 1, 2, 5] and vb.query_start_loc.dtype == torch.int32
    assert vb.seq_lens.tolist() == [18, 5, 8] and vb.max_query_len == 3
    assert vb.block_tables.shape == (3, 5)


def test_builder_gives_each_kv_group_its_slots_and_window():
    g1 = np.array([[40, 41, 42, 43, 44], [50, 51, 0, 0, 0], [60, 61, 0, 0, 0]])
    meta = TritonBackend(CPU).build_metadata(_layout(group_tables=[g1], group_windows=[8]))
    group = meta.groups[1]
    assert meta.groups[0] is meta and group.backend is meta.backend
    assert group.sliding_window == 8
    assert group.slot_mapping.tolist() == [44 * 4 + 1, 51 * 4, 61 * 4 + 1, 61 * 4 + 2,
                                           61 * 4 + 3]
    assert group.prefill_block_tables.tolist() == [[60, 61]]
    assert group.varlen.block_tables.tolist() == g1.tolist()


def test_graph_metadata_reads_the_buffers_in_place():
    slots, lens = torch.full((4,), -1), torch.zeros(4, dtype=torch.long)
    tables, qs = torch.zeros(4, 8, dtype=torch.long), torch.arange(5, dtype=torch.int32)
    meta = TritonBackend(CPU).graph_metadata(slots, tables, lens, qs, None)
    assert meta.num_decodes == 4 and meta.prefill_block_tables is None
    assert meta.slot_mapping is slots and meta.varlen.seq_lens is lens
    assert meta.varlen.max_query_len == 1
    assert TorchBackend(CPU).graph_metadata(slots, tables, lens, qs, None).varlen is None


def test_training_builder():
    valid = torch.tensor([[True, True, False]])
    meta = TrainingBackend(CPU).build_metadata(valid, sliding_window=2)
    assert meta.backend.name == "training" and meta.for_window(1).backend is meta.backend
    assert not meta.backend.fused_decode_applies(torch.zeros(3, 4), meta, [])
