"""`*ForSequenceClassification` checkpoints: a causal decoder whose LM head is replaced by a
`score` head (hidden -> num_labels, no bias), as transformers' LlamaForSequenceClassification.

vLLM builds these with `as_seq_cls_model(base)`; here too the class is made from the
family's causal-LM class, so every decoder variant loads the same way. The model never
samples: `compute_logits` is the score head, applied by the pooling runner to the pooled
hidden state (pagedllm/pooling/step_pooler.py) and by the GPU memory profile.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from pagedllm.model.layers.linear import Linear

SEQ_CLS_SUFFIX = "ForSequenceClassification"


@functools.cache
def as_seq_cls_model(base: type[nn.Module]) -> type[nn.Module]:
    """The sequence-classification model of the causal-LM class `base` (one class per base)."""

    class ForSequenceClassification(base):
        """`base`'s decoder + `score` (num_labels outputs); no lm_head."""

        def __init__(self, config) -> None:
            super().__init__(config)
            del self.lm_head
            self.tie_word_embeddings = False  # nothing to tie: the head is `score`
            self.score = Linear(config.hidden_size, config.num_labels)

        def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            """The classifier's raw outputs (logits over the labels)."""
            return self.score(hidden).float()

    ForSequenceClassification.__name__ = base.__name__.replace("ForCausalLM", SEQ_CLS_SUFFIX)
    ForSequenceClassification.__qualname__ = ForSequenceClassification.__name__
    return ForSequenceClassification
