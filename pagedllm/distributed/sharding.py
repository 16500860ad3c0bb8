"""What each tensor-parallel rank holds of a Llama-family model, and the collectives that
complete its sharded layers (Megatron-style, as vLLM does it).

    column-parallel (no communication)    row-parallel (+ all-reduce)    vocab-parallel
    q/k/v: the rank's heads' rows          o_proj: the heads' columns      embed_tokens: rows
    gate/up: rows [r*I/N, (r+1)*I/N)       down_proj: the same columns     [r*Vp, (r+1)*Vp),
                                                                           lookup + all-reduce
                                                                           lm_head: same rows,
                                                                           all-gather logits

Query heads split evenly: rank r has heads [r*H/N, (r+1)*H/N); when N does not divide H
(SmolLM2-135M: 9 heads, 3 KV heads) the ranks take whole KV groups, as evenly as they go
(N=2: 3 and 6 heads), which needs kv_heads >= N. Its KV heads are those its
query heads read (head h reads KV head h // G, G = H / kv_heads), each repeated so that every
local KV head serves the same number of query heads (the attention kernels stack a fixed
group of G' queries per KV head)::

    H=8 kvh=4 N=2   rank 0 q 0-3 -> kv [0, 1]          (split: kv_heads % N == 0)
    H=4 kvh=1 N=2   rank 0 q 0-1 -> kv [0]             (replicated: kv_heads < N, like vLLM)
    H=6 kvh=3 N=2   rank 0 q 0-2 -> kv [0, 0, 1]       (neither: one KV copy per query head)

Qwen3's and Gemma 3's q/k norms act per head over head_dim, so every rank holds them whole;
OLMo 2's act over all heads: each rank holds its heads' norm weights and the ranks add their
sums of squares (models/olmo2.py). Phi-3's fused qkv_proj and Phi-3's / GLM-4's fused
gate_up_proj are cut as their parts would be (this rank's q, k, v rows; gate rows, up rows).
Gemma 3's sliding and full layers share one block table under TP (`KVGroupLayout.one_table`),
each layer applying its own window. A row-parallel bias is added once (rank 0 holds it, the
others zeros). The vocabulary is
padded to N * ceil(V / N) rows; the padded logits are cut off after the gather.

A MoE model's experts split by width or whole experts per rank (expert parallelism), as
distributed/expert_sharding.py describes; its MoE blocks end in one all-reduce. DeepSeek's
multi-head latent attention splits its heads and replicates the latent (one cached "KV head"
per rank), as distributed/mla_sharding.py describes.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby

import numpy as np
import torch

from pagedllm.distributed.expert_sharding import ExpertSplit
from pagedllm.distributed.mla_sharding import MLASplit
from pagedllm.distributed.parallel_state import TPGroup
from pagedllm.model.layers.quant import QuantizedWeight
from pagedllm.model.layers.quant.gguf_matrix import GGUFMatrix
from pagedllm.model.models.llama import model_dims

# Architectures whose layers this module knows how to split (tested against TP=1).
TP_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                    "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Gemma2ForCausalLM",
                    "Olmo2ForCausalLM", "GraniteForCausalLM", "SmolLM3ForCausalLM",
                    "Phi3ForCausalLM", "Glm4ForCausalLM", "MixtralForCausalLM",
                    "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM",
                    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
# q / k norms over all heads (one norm weight per q / k feature): the ranks' heads must be
# disjoint for their sums of squares to add up (models/olmo2.py).
FULL_WIDTH_QK_NORM = ("Olmo2ForCausalLM", "OlmoeForCausalLM")


@dataclass(frozen=True)
class TPLayout:
    """The split of one model over `world_size` ranks, seen from `rank`."""

    rank: int
    world_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    experts: ExpertSplit | None = None  # a MoE model's experts (distributed/expert_sharding)
    mla: MLASplit | None = None  # multi-head latent attention's heads (distributed/mla_sharding)

    def __post_init__(self) -> None:
        n = self.world_size
        if not 0 <= self.rank < n:
            raise ValueError(f"rank {self.rank} is outside the tensor-parallel group of {n}")
        if self.num_heads % n and self.num_kv_heads < n:
            raise ValueError(f"tensor_parallel_size {n} must divide the model's "
                             f"{self.num_heads} attention heads, or be at most its "
                             f"{self.num_kv_heads} KV heads")
        if self.intermediate_size % n:
            raise ValueError(f"tensor_parallel_size {n} must divide the model's "
                             f"intermediate_size {self.intermediate_size}")

    @classmethod
    def for_model(cls, hf_config, rank: int, world_size: int,
                  expert_parallel: bool | None = None) -> TPLayout:
        """The layout of `hf_config`'s model; a MoE model's experts are split by width
        (`expert_parallel` False) or whole experts per rank (True; None: when N divides
        them); ignored for a dense model."""
        arch = (getattr(hf_config, "architectures", None) or ["?"])[0]
        if arch not in TP_ARCHITECTURES:
            raise ValueError(f"tensor parallelism supports {', '.join(TP_ARCHITECTURES)}; "
                             f"the model is {arch}")
        heads, kv_heads, head_dim = model_dims(hf_config)
        mla = MLASplit.for_model(hf_config, rank, world_size)
        if mla is not None:
            kv_heads = 1  # one latent row per token, which every rank caches whole
        if arch in FULL_WIDTH_QK_NORM and (heads % world_size or kv_heads % world_size):
            raise ValueError(f"{arch} normalizes q and k over all heads: tensor_parallel_size "
                             f"{world_size} must divide its {heads} attention heads and its "
                             f"{kv_heads} KV heads")
        return cls(rank, world_size, heads, kv_heads, head_dim,
                   hf_config.intermediate_size, hf_config.vocab_size,
                   ExpertSplit.for_model(hf_config, rank, world_size, expert_parallel), mla)

    def for_rank(self, rank: int) -> TPLayout:
        return dataclasses.replace(self, rank=rank,
                                   experts=self.experts and self.experts.for_rank(rank),
                                   mla=self.mla and self.mla.for_rank(rank))

    # ------------------------------------------------------------- sizes
    @property
    def head_range(self) -> tuple[int, int]:
        """[first, end) of this rank's query heads."""
        h, n, r = self.num_heads, self.world_size, self.rank
        if h % n == 0:
            return r * h // n, (r + 1) * h // n
        kv, group = self.num_kv_heads, h // self.num_kv_heads
        return (r * kv // n) * group, ((r + 1) * kv // n) * group

    @property
    def local_heads(self) -> int:
        first, end = self.head_range
        return end - first

    @property
    def local_intermediate(self) -> int:
        return self.intermediate_size // self.world_size

    @property
    def vocab_shard(self) -> int:
        return -(-self.vocab_size // self.world_size)

    @property
    def local_kv_heads(self) -> list[int]:
        """Global KV head of each local KV head (repeated where replicated)."""
        group = self.num_heads // self.num_kv_heads
        reads = [h // group for h in range(*self.head_range)]
        runs = [(kv, len(list(hs))) for kv, hs in groupby(reads)]
        per_copy = math.gcd(*(n for _, n in runs))
        return [kv for kv, n in runs for _ in range(n // per_copy)]

    @property
    def max_local_kv_heads(self) -> int:
        """The most KV heads any rank holds (sizes the shared block count)."""
        return max(len(self.for_rank(r).local_kv_heads) for r in range(self.world_size))

    def model_config(self, hf_config):
        """A copy of the HF config with this rank's head / width / vocab counts."""
        cfg = copy.deepcopy(hf_config)
        cfg.num_attention_heads = self.local_heads
        cfg.num_key_value_heads = len(self.local_kv_heads)
        cfg.head_dim = self.head_dim
        cfg.intermediate_size = self.local_intermediate
        cfg.vocab_size = self.vocab_shard
        return cfg if self.experts is None else self.experts.model_config(cfg)

    # ----------------------------------------------------------- weights
    def shard_weights(self, weights: Iterable[tuple[str, torch.Tensor | QuantizedWeight |
                                                     GGUFMatrix]]
                      ) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
        """This rank's part of each HF-named weight (streamed; nothing else is kept). GGUF
        matrices arrive unbuilt (`GGUFMatrix`): this rank's rows or block columns are cut from
        the file's bytes, then built; other quantized formats are refused."""
        for name, w in weights:
            if self.experts is not None and self.experts.cut(name) == ("drop", None):
                continue  # another rank's expert
            if isinstance(w, GGUFMatrix):
                yield name, self._shard_matrix(name, w).build()
            elif isinstance(w, QuantizedWeight):
                raise ValueError(f"tensor parallelism supports unquantized (fp32/bf16/fp16) and "
                                 f"GGUF weights; {name} is {w!r}")
            else:
                yield name, self.shard(name, w)

    def _cut(self, name: str, num_rows: int) -> tuple[str, object]:
        """What this rank holds of weight `name` (HF layout, `num_rows` output rows):
        ("rows", index: -1 = a zero row), ("cols", (start, end)), ("bias0", None): a
        row-parallel bias (rank 0 adds it once), or ("whole", None); an expert weight as
        `ExpertSplit.cut` says (also "drop" and "take")."""
        if self.experts is not None and (cut := self.experts.cut(name)) is not None:
            return cut
        if self.mla is not None and (cut := self.mla.cut(name)) is not None:
            return cut
        hd, r = self.head_dim, self.rank
        first, end = self.head_range
        if ".q_proj." in name:
            return "rows", np.arange(first * hd, end * hd)
        if ".k_proj." in name or ".v_proj." in name:
            return "rows", self._kv_rows(0)
        if (".q_norm." in name or ".k_norm." in name) and num_rows != hd:  # over all heads
            return "rows", (np.arange(first * hd, end * hd) if ".q_norm." in name
                            else self._kv_rows(0))
        if ".qkv_proj." in name:  # stored fused (Phi-3): q rows, then k, then v
            q_size, kv_size = self.num_heads * hd, self.num_kv_heads * hd
            return "rows", np.concatenate([np.arange(first * hd, end * hd),
                                           self._kv_rows(q_size),
                                           self._kv_rows(q_size + kv_size)])
        n = self.local_intermediate
        if ".gate_proj." in name or ".up_proj." in name:
            return "rows", np.arange(r * n, (r + 1) * n)
        if ".gate_up_proj." in name:  # stored fused (Phi-3, GLM-4): gate rows, then up
            return "rows", np.concatenate([np.arange(r * n, (r + 1) * n),
                                           self.intermediate_size + np.arange(r * n, (r + 1) * n)])
        if ".o_proj." in name or ".down_proj." in name:
            if name.endswith(".bias"):  # added once, after the all-reduce sums the shards
                return "bias0", None
            return "cols", (first * hd, end * hd) if ".o_proj." in name else (r * n, (r + 1) * n)
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            v = self.vocab_shard  # the last shard of a vocabulary N does not divide: zero rows
            rows = np.arange(r * v, (r + 1) * v)
            return "rows", np.where(rows < num_rows, rows, -1)
        return "whole", None  # norms: replicated

    def _kv_rows(self, offset: int) -> np.ndarray:
        """Rows of this rank's KV heads in a [KVH * d] block starting at row `offset`."""
        hd = self.head_dim
        return np.concatenate([np.arange(offset + kv * hd, offset + (kv + 1) * hd)
                               for kv in self.local_kv_heads])

    def shard(self, name: str, t: torch.Tensor) -> torch.Tensor:
        kind, cut = self._cut(name, t.shape[0])
        if kind == "rows":
            index = torch.from_numpy(cut)
            part = t[index.clamp(min=0)]
            return part.masked_fill_((index < 0).view(-1, *[1] * (t.dim() - 1)), 0.0)
        if kind == "cols":
            return t[:, cut[0]:cut[1]]
        if kind == "bias0":
            return t if self.rank == 0 else torch.zeros_like(t)
        if kind == "take":
            dim, index = cut
            return t.index_select(dim, torch.from_numpy(index))
        return t

    def _shard_matrix(self, name: str, m: GGUFMatrix) -> GGUFMatrix:
        kind, cut = self._cut(name, m.shape[0])
        if kind == "rows":
            return m.rows(cut)
        if kind == "cols":
            return m.cols(*cut)
        if kind == "take":
            raise ValueError(f"stacked expert tensor {name!r} arrives quantized; tensor "
                             "parallelism cuts quantized experts one expert at a time")
        return m

    def collectives(self, group: TPGroup) -> TPCollectives:
        """This rank's collectives, which the layers take at construction
        (model/layers/parallel.tensor_parallel_layers)."""
        experts = None if self.experts is None else self.experts.expert_range
        return TPCollectives(group, self.rank, self.vocab_size, experts)


class TPCollectives:
    """`model.layers.parallel.TensorParallelOps` over one TP group: the all-reduce after a
    row-parallel layer, the all-gather of a vocab-parallel lm_head's logits and the lookup
    of a vocab-parallel embedding (rows [rank * rows, (rank + 1) * rows) on this rank), and
    the experts this rank holds ([first, end), or None: all)."""

    def __init__(self, group: TPGroup, rank: int, vocab_size: int,
                 experts: tuple[int, int] | None = None) -> None:
        self.group, self.rank, self.vocab_size = group, rank, vocab_size
        self.experts = experts

    def local_experts(self, num_experts: int) -> tuple[int, int]:
        if self.experts is None:
            return 0, num_experts
        if self.experts[1] > num_experts:
            raise ValueError(f"this rank's experts {self.experts} do not fit a layer of "
                             f"{num_experts} experts")
        return self.experts

    def all_reduce(self, out: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(out)

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        return self.group.all_gather_last(logits)[..., :self.vocab_size]

    def embed(self, lookup, ids: torch.Tensor, rows: int) -> torch.Tensor:
        local = ids - self.rank * rows
        inside = (local >= 0) & (local < rows)
        found = lookup(torch.where(inside, local, 0))
        found = found.masked_fill(~inside.unsqueeze(-1), 0.0)
        return self.group.all_reduce(found.contiguous())
