"""Several decode steps in one C++ call (`num_scheduler_steps`, CPU, Llama family).

A one-stream decode step on SmolLM2 spends ~0.5-0.7 ms of ~4 ms outside the kernels that read
weights: scheduling, the batch's tensors, the embedding and RoPE lookups, the logits call,
sampling, detokenizing, stop checks (Python, whose data the 92 MB of weights streamed per step
have evicted from the caches). When the scheduler hands out k steps at once (a batch of
decodes only, every row greedy or sampled with temperature / top-k / top-p alone:
core/multi_step.py), this runs them in kernels/decode_layers_cpu.cpp's `decode_steps`: the
embedding rows, the C++ layer loop (model/fused_decode.py) with the final norm, the lm_head and
the argmax or the sampler's C++ draw, k times, feeding each step's tokens to the next; the
caller then hands all k tokens of a row to the scheduler at once. The same kernels in the same
order as k single steps, so the same tokens (tested). A random row's uniforms are drawn before
the call, k steps of them in the order single steps draw them (`AheadDraws`), and the
generators are then set back to where the steps the call ran leave them, so a seeded request
samples what it samples one step at a time.

Gemma 3 runs here too: its embedding rows times sqrt(hidden), its two RoPE tables and each
KV group's block tables (core/kv_groups.py: its sliding layers keep their own).

`DecodeSteps.build(model)` returns None when the model's decode does not fit: no C++ layer
loop or no final norm in it, RoPE that depends on the sequence length (dynamic NTK,
LongRoPE), an embedding table or lm_head without a C++ kernel, soft-capped logits, or a
decoder whose forward is not Llama's or Gemma 3's (Granite's multipliers, ...).
"""

from __future__ import annotations

import numpy as np
import torch

from pagedllm.model.fused_decode import FusedDecode
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.sampler import SamplingMetadata, step_uniforms
from pagedllm.model.layers.top_k_top_p import CANDIDATES
from pagedllm.model.models.gemma3 import Gemma3Model
from pagedllm.model.models.llama import LlamaForCausalLM, LlamaModel

# Decoders whose forward is embedding (times `embed_multiplier`), the layers, the final norm:
# what the C++ steps compute.
_FORWARDS = (LlamaModel.forward, Gemma3Model.forward)


class AheadDraws:
    """The uniforms u [steps, rows] of `steps` sampling steps, drawn now as one step at a
    time draws them (`step_uniforms`: `generator` for every row, then each seeded row's own);
    `keep(n)` leaves every generator where n such steps leave it."""

    def __init__(self, generator: torch.Generator | None, seeded: dict[int, torch.Generator],
                 rows: int, steps: int) -> None:
        self._draw = (generator, seeded, rows, "cpu")
        self._gens = [generator or torch.default_generator, *seeded.values()]
        self._states = [g.get_state() for g in self._gens]
        self.u = torch.stack([step_uniforms(*self._draw) for _ in range(steps)])

    def keep(self, n: int) -> None:
        if n == len(self.u):
            return
        for g, state in zip(self._gens, self._states, strict=True):
            g.set_state(state)
        for _ in range(n):
            step_uniforms(*self._draw)


class DecodeSteps:
    """The multi-step decode of one model (module docstring); built once, called per step."""

    def __init__(self, decoder, embed, embed_scale: float, lm_head, vocab_size: int) -> None:
        self.decoder, self.embed, self.lm_head = decoder, embed, lm_head
        self.embed_scale, self.vocab_size = embed_scale, vocab_size

    @classmethod
    def build(cls, model, vocab_size: int) -> DecodeSteps | None:
        """For a Llama-family or Gemma 3 causal LM whose decoder runs one of `_FORWARDS` and
        whose `compute_logits` is the lm_head alone; None where the module docstring says.
        `vocab_size`: the logits columns a token is chosen from."""
        if not isinstance(model, LlamaForCausalLM):
            return None
        decoder = model.model
        if (type(decoder).forward not in _FORWARDS or model.logit_softcap
                or type(model).compute_logits is not LlamaForCausalLM.compute_logits):
            return None
        fused = decoder.fused_decode()
        if (fused is None or not fused.applies_final_norm
                or (isinstance(decoder, LlamaModel) and decoder.rotary.is_dynamic)):
            return None
        embed = decoder.embed_tokens.fused_ref(fused.ops)
        lm_head = model.lm_head.fused_ref(fused.ops)
        if embed is None or lm_head is None:
            return None
        multiplier = decoder.embed_multiplier()
        scale = 1.0 if multiplier is None else float(multiplier)  # (rounded to its dtype)
        return cls(decoder, embed, scale, lm_head, vocab_size)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, max_pos: int,
                 kv_caches: list[LayerKVCache], meta: AttentionMetadata,
                 block_tables: list[torch.Tensor], block_size: int, steps: int,
                 stop_ids: list[list[int]], rows: SamplingMetadata | None = None,
                 draws: AheadDraws | None = None) -> torch.Tensor:
        """Tokens [B, n], n <= steps, of the decode rows `input_ids` (one per sequence, at
        `positions`), whose `block_tables` (one per KV group) cover positions + steps - 1;
        `stop_ids[b]`: the tokens that end row b (the call returns after the step that
        samples one). `rows` (the rows' sampling metadata) and `draws` when a row samples at
        random; None: all greedy. No tokens ([B, 0]) when the decoder's C++ loop has been
        turned off since, or the step's attention backend does not run it."""
        f: FusedDecode | None = self.decoder.fused_decode()  # (the decoder keeps it)
        if f is None or not meta.backend.fused_decode_applies(input_ids, meta, kv_caches):
            return torch.empty(len(input_ids), 0, dtype=torch.int64)
        ahead = positions.view(1, -1) + torch.arange(steps).view(-1, 1)
        tables = [t.view(steps, len(input_ids), -1) for t in
                  self.decoder.rope_tables(ahead.reshape(-1), max_pos + steps - 1)]
        offsets = np.zeros(len(stop_ids) + 1, np.int64)
        offsets[1:] = np.cumsum([len(s) for s in stop_ids])
        flat = torch.tensor([t for s in stop_ids for t in s], dtype=torch.int64)
        return f.ops.decode_steps(
            input_ids, f.layers, self.embed, self.embed_scale, self.lm_head, f.final_norm,
            self.vocab_size, f.num_heads, f.num_kv_heads, f.head_dim, f.scale, f.eps, tables,
            *f.cache_args(kv_caches), [t.contiguous() for t in block_tables],
            meta.decode_seq_lens, block_size, f.group_windows(f.kv_groups(meta)), flat,
            torch.from_numpy(offsets), steps,
            *((None,) * 4 if rows is None else (rows.temperature, rows.top_k, rows.top_p,
                                                draws.u)), CANDIDATES)
