"""CUDA graphs for decode steps: one graph per batch-size bucket, replayed on padded inputs.

A decode step of a small batch is launch-bound on a GPU (~30 layers x ~8 kernels, each
launch a few microseconds of CPU time); replaying a captured graph issues them all at once.
A graph replays fixed shapes at fixed addresses, so the step's inputs are copied into
persistent buffers and the batch is padded up to the next captured size::

    buckets:          1  2  4  8  16  32  64  128  256  512   (those <= max_num_seqs, and the
                                                               first >= it)
    batch of 5 -> bucket 8:
      input_ids      [t0 t1 t2 t3 t4  0  0  0]
      positions      [p0 p1 p2 p3 p4  0  0  0]
      slot_mapping   [s0 s1 s2 s3 s4 -1 -1 -1]     -1: the KV write skips the row
      seq_lens       [l0 l1 l2 l3 l4  0  0  0]      0: attention reads no key, writes zeros
      block_tables   [5 rows of this step | rows left from earlier steps, never read]
      hidden[:5] of the graph's output buffer is the step's result

With several KV groups (Gemma 3's window layers keep block tables of their own) each group
has its own slot_mapping and block_tables buffers, and the captured metadata its `groups`.

The graphs wrap the rank's attention backend: only one whose forward never waits on the host
can be captured (`backend.cuda_graphs`: Triton), and the capture's metadata over the
persistent buffers is built by its builder (`graph_metadata`), like every step's.

Graphs are captured at start-up after two eager warm-up runs per bucket (Triton compiles
its kernels, cuBLAS sets up its workspaces), largest bucket first, all in one memory pool.
Only the model forward is captured: logits and sampling run eagerly on the real rows.
Prefill and mixed steps, batches above the largest bucket, LoRA and dynamic-NTK RoPE
(whose frequencies depend on the step) run eagerly. `--enforce-eager` turns graphs off.

`CudaGraphCapture` captures real graphs; tests on CPU pass `EagerReplay`, which "replays"
by re-running the captured function on the same persistent buffers, so the bucketing,
padding and buffer logic runs for real on a machine without GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from pagedllm.model.layers.attention import AttentionMetadata
from pagedllm.model.layers.attention_backends import PagedAttentionBackend

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def bucket_sizes(max_num_seqs: int, buckets: tuple[int, ...] = BUCKETS) -> list[int]:
    """The batch sizes to capture: every bucket below max_num_seqs and the first one that
    holds it (capped at the largest bucket)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = [b for b in buckets if b < max_num_seqs]
    sizes.append(next((b for b in buckets if b >= max_num_seqs), buckets[-1]))
    return sizes


def choose_bucket(n: int, sizes: list[int]) -> int | None:
    """Smallest captured size >= n (None: n is larger than every graph)."""
    return next((b for b in sizes if b >= n), None) if n > 0 else None


@dataclass
class CapturedGraph:
    replay: Callable[[], object]
    output: torch.Tensor


class CudaGraphCapture:
    """Captures torch.cuda.CUDAGraphs sharing one memory pool."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> CapturedGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return CapturedGraph(graph.replay, out)


class EagerReplay:
    """Stand-in for CudaGraphCapture off the GPU (tests): replay re-runs `fn` over the same
    persistent input buffers and copies its result into the captured output buffer."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> CapturedGraph:
        out = fn()
        return CapturedGraph(lambda: out.copy_(fn()), out)


class DecodeGraphs:
    """Persistent decode-step inputs and one captured forward per bucket.

    `model(input_ids, positions, max_pos, kv_caches, meta)` is the model's forward and
    `backend` the rank's attention backend (its device is the buffers'); `max_blocks` is the
    widest block table a sequence can have (max_model_len / block size) and `max_pos` the
    largest position (max_model_len - 1), so that the RoPE table is grown before capture and
    never reallocated by a replay. `sliding_window` is KV group 0's window and
    `group_windows` those of the further groups (Gemma 3's window layers keep block tables of
    their own): each group has its own slot and block-table buffers, copied at every replay.
    """

    def __init__(self, model: nn.Module, kv_caches: list, backend: PagedAttentionBackend, *,
                 sizes: list[int], max_blocks: int, max_pos: int, sliding_window: int | None,
                 group_windows: tuple[int | None, ...] = (), capture=None) -> None:
        self.model, self.kv_caches, self.backend = model, kv_caches, backend
        device = backend.device
        self.sizes = sorted(sizes)
        self.max_blocks, self.max_pos = max_blocks, max_pos
        self.sliding_window = sliding_window
        self.group_windows = tuple(group_windows)
        groups = 1 + len(self.group_windows)
        self.capturer = capture if capture is not None else CudaGraphCapture()
        n = self.sizes[-1]
        i64 = dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.slots = torch.full((groups, n), -1, **i64)  # [g]: KV group g's
        self.seq_lens = torch.zeros(n, **i64)
        self.block_tables = torch.zeros(groups, n, max_blocks, **i64)
        self.query_start = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, CapturedGraph] = {}
        self.replays = 0  # steps served by a graph (tests, --debug-steps)

    def _meta(self, b: int) -> AttentionMetadata:
        groups = [(self.slots[g, :b], self.block_tables[g, :b], window)
                  for g, window in enumerate(self.group_windows, 1)]
        return self.backend.graph_metadata(self.slots[0, :b], self.block_tables[0, :b],
                                           self.seq_lens[:b], self.query_start[:b + 1],
                                           self.sliding_window, groups)

    def capture(self, warmup: int = 2) -> None:
        """Warm up and capture every bucket, largest first (its pool serves the others)."""
        t0 = time.perf_counter()
        for b in sorted(self.sizes, reverse=True):
            meta = self._meta(b)
            ids, pos = self.input_ids[:b], self.positions[:b]

            def forward(ids=ids, pos=pos, meta=meta) -> torch.Tensor:
                return self.model(ids, pos, self.max_pos, self.kv_caches, meta)

            with torch.inference_mode():
                for _ in range(warmup):
                    forward()
                self.graphs[b] = self.capturer.capture(forward)
        logger.info("CUDA graphs: captured decode batch sizes %s in %.1f s", self.sizes,
                    time.perf_counter() - t0)

    def can_run(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> bool:
        """A decode-only step that fits a captured graph (and has its KV groups)."""
        n = input_ids.shape[0]
        return (meta.num_decodes == n and meta.prefill_block_tables is None
                and len(meta.groups or (meta,)) == 1 + len(self.group_windows)
                and choose_bucket(n, list(self.graphs)) is not None
                and meta.decode_block_tables.shape[1] <= self.max_blocks
                and meta.sliding_window == self.sliding_window)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """Copy the step into the buffers (padding the rest of the bucket), replay, and
        return the real rows of the output."""
        n = input_ids.shape[0]
        b = choose_bucket(n, sorted(self.graphs))
        width = meta.decode_block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.seq_lens[:n].copy_(meta.decode_seq_lens)
        for g, group in enumerate(meta.groups or (meta,)):
            self.slots[g, :n].copy_(group.slot_mapping)
            self.block_tables[g, :n, :width].copy_(group.decode_block_tables)
        if b > n:
            self.input_ids[n:b].zero_()
            self.positions[n:b].zero_()
            self.slots[:, n:b].fill_(-1)
            self.seq_lens[n:b].zero_()
        graph = self.graphs[b]
        graph.replay()
        self.replays += 1
        return graph.output[:n]


def unsupported_reason(model: nn.Module, backend: PagedAttentionBackend,
                       lora: bool) -> str | None:
    """Why decode steps of this engine cannot be captured (None: they can)."""
    from pagedllm.model.layers.rotary import RotaryEmbedding

    if not backend.cuda_graphs:
        return (f"the {backend.name} attention backend syncs with the host (the Triton kernels "
                "are off: triton not installed, or PAGEDLLM_ATTENTION_BACKEND=torch)")
    if lora:
        return "LoRA maps rows to adapters per step"
    if any(isinstance(m, RotaryEmbedding) and m.is_dynamic for m in model.modules()):
        return "dynamic NTK RoPE computes its frequencies from each step's lengths"
    return None


def for_engine(rank, cache, config, lora: bool) -> DecodeGraphs | None:
    """Capture the decode graphs of an engine's rank on CUDA (`rank`: its RankParts, whose
    model, attention backend and window they wrap; None, with the reason logged, when its
    model or options cannot run in a graph)."""
    device = config.torch_device
    reason = unsupported_reason(rank.model, rank.attention_backend, lora)
    if reason is not None:
        logger.info("CUDA graphs off: %s", reason)
        return None
    graphs = DecodeGraphs(rank.model, cache.layer_caches, rank.attention_backend,
                          sizes=bucket_sizes(config.max_num_seqs),
                          max_blocks=-(-config.max_model_len // config.block_size),
                          max_pos=config.max_model_len - 1,
                          sliding_window=rank.kv_spec.groups.groups[0].window,
                          group_windows=tuple(g.window for g in rank.kv_spec.groups.groups[1:]))
    before = torch.cuda.memory_reserved(device)
    try:
        graphs.capture()
    except RuntimeError as exc:  # an op of this model that cannot be captured
        logger.warning("CUDA graphs off: capture failed (%s); decode steps run eagerly", exc)
        return None
    logger.info("CUDA graphs: %.1f MiB of graph memory",
                (torch.cuda.memory_reserved(device) - before) / 2**20)
    return graphs
