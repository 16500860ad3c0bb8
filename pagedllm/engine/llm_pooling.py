"""`LLM.encode / embed / classify / score`: the offline pooling API (vLLM's), as a mixin of
`LLM` (engine/llm.py), which provides `llm_engine`, `get_tokenizer`, `_normalize_prompts`
and `_run` (the engine loop shared with generation).

Every prompt becomes one pooling request (PoolingParams with the call's task); results are
vLLM's output classes (pagedllm/pooling/outputs.py). `score` pairs its texts as vLLM does:
one text_1 against each text_2, or text_1[i] against text_2[i]; a cross-encoder (a classifier
with one label) reads each pair joined by its tokenizer's pair template, an embedding model
compares the two texts' embeddings by cosine similarity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from pagedllm.lora.request import LoRARequest
from pagedllm.pooling.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from pagedllm.pooling_params import PoolingParams

Loras = LoRARequest | Sequence[LoRARequest | None] | None


class PoolingAPI:
    """The pooling methods of `LLM` (the engine must run a pooling model: --runner pooling)."""

    def encode(
        self,
        prompts,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request: Loras = None,
        pooling_task: str = "encode",
        truncate_prompt_tokens: int | None = None,
    ) -> list[PoolingRequestOutput]:
        """Pool each prompt (str, token ids or {"prompt_token_ids": ...}) with
        `pooling_params` (one, or one per prompt) as `pooling_task`; input order kept.
        `truncate_prompt_tokens` keeps each prompt's last k tokens (-1: max_model_len)."""
        prompts = self._normalize_prompts(prompts)
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            params = [pooling_params or PoolingParams()] * len(prompts)
        else:
            params = list(pooling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} pooling_params for {len(prompts)} prompts")
        if not all(isinstance(p, PoolingParams) for p in params):
            raise ValueError("pooling_params must be PoolingParams")
        k = truncate_prompt_tokens
        params = [
            dataclasses.replace(
                p,
                task=pooling_task,
                truncate_prompt_tokens=p.truncate_prompt_tokens if k is None else k,
            )
            for p in params
        ]
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras = [lora_request] * len(prompts)
        else:
            loras = list(lora_request)
            if len(loras) != len(prompts):
                raise ValueError(f"got {len(loras)} lora_requests for {len(prompts)} prompts")
        return self._run(prompts, params, use_tqdm, None, loras)

    def embed(
        self,
        prompts,
        pooling_params=None,
        *,
        use_tqdm: bool = True,
        lora_request: Loras = None,
        truncate_prompt_tokens: int | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (`.outputs.embedding`)."""
        return [
            EmbeddingRequestOutput.from_base(o)
            for o in self.encode(
                prompts,
                pooling_params,
                use_tqdm=use_tqdm,
                lora_request=lora_request,
                pooling_task="embed",
                truncate_prompt_tokens=truncate_prompt_tokens,
            )
        ]

    def classify(
        self,
        prompts,
        pooling_params=None,
        *,
        use_tqdm: bool = True,
        lora_request: Loras = None,
        truncate_prompt_tokens: int | None = None,
    ) -> list[ClassificationRequestOutput]:
        """Class probabilities per prompt (`.outputs.probs`) of a classification model."""
        return [
            ClassificationRequestOutput.from_base(o)
            for o in self.encode(
                prompts,
                pooling_params,
                use_tqdm=use_tqdm,
                lora_request=lora_request,
                pooling_task="classify",
                truncate_prompt_tokens=truncate_prompt_tokens,
            )
        ]

    def reward(
        self,
        prompts,
        pooling_params=None,
        *,
        use_tqdm: bool = True,
        lora_request: Loras = None,
        truncate_prompt_tokens: int | None = None,
    ) -> list[PoolingRequestOutput]:
        """A reward model's (--convert reward) per-token outputs: `.outputs.data` is
        [prompt tokens, hidden size] (a decoder) or [prompt tokens, num_labels] (a
        *ForSequenceClassification head)."""
        return self.encode(
            prompts,
            pooling_params,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            pooling_task="encode",
            truncate_prompt_tokens=truncate_prompt_tokens,
        )

    def score(
        self,
        text_1: str | Sequence[str],
        text_2: str | Sequence[str],
        *,
        use_tqdm: bool = True,
        lora_request: Loras = None,
        truncate_prompt_tokens: int | None = None,
    ) -> list[ScoringRequestOutput]:
        """One score per pair (see the module doc), in pair order; `truncate_prompt_tokens`
        bounds each pair's tokens (the tokenizer's pair truncation) or each embedded text."""
        pairs = score_pairs(text_1, text_2)
        setup = self.llm_engine.pooling
        if setup is not None and setup.task == "embed":
            return self._cosine_scores(pairs, use_tqdm, lora_request, truncate_prompt_tokens)
        tok = self.get_tokenizer()
        limit = self.llm_engine.config.max_model_len
        outs = self.encode(
            [pair_prompt(tok, a, b, truncate_prompt_tokens, limit) for a, b in pairs],
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            pooling_task="score",
        )
        return [ScoringRequestOutput.from_base(o) for o in outs]

    def _cosine_scores(
        self,
        pairs: list[tuple[str, str]],
        use_tqdm: bool,
        lora_request: Loras,
        truncate: int | None,
    ) -> list[ScoringRequestOutput]:
        """Cosine similarity of each pair's embeddings (vLLM's score for embedding models);
        each distinct text is embedded once."""
        texts = list(dict.fromkeys(t for pair in pairs for t in pair))
        outs = self.encode(
            texts,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            pooling_task="embed",
            truncate_prompt_tokens=truncate,
        )
        by_text = dict(zip(texts, outs, strict=True))
        results = []
        for a, b in pairs:
            ea, eb = by_text[a], by_text[b]
            cos = torch.nn.functional.cosine_similarity(ea.outputs.data, eb.outputs.data, dim=0)
            results.append(
                ScoringRequestOutput.from_base(
                    PoolingRequestOutput(
                        f"{ea.request_id}_{eb.request_id}",
                        PoolingOutput(cos.reshape(1)),
                        ea.prompt_token_ids + eb.prompt_token_ids,
                    )
                )
            )
        return results


def score_pairs(text_1: str | Sequence[str], text_2: str | Sequence[str]) -> list[tuple[str, str]]:
    """vLLM's pairing: 1 -> N, N -> N (element-wise); anything else is a ValueError."""
    t1 = [text_1] if isinstance(text_1, str) else list(text_1)
    t2 = [text_2] if isinstance(text_2, str) else list(text_2)
    if not t1 or not t2:
        raise ValueError("score needs at least one text_1 and one text_2")
    if not all(isinstance(t, str) for t in t1 + t2):
        raise ValueError("score texts must be strings")
    if len(t1) == 1:
        t1 = t1 * len(t2)
    if len(t1) != len(t2):
        raise ValueError(
            f"text_1 has {len(t1)} texts and text_2 {len(t2)}: give one text_1, "
            "or as many as text_2"
        )
    return list(zip(t1, t2, strict=True))


def pair_prompt(
    tokenizer, first: str, second: str, truncate: int | None = None, max_model_len: int = 0
) -> dict:
    """A cross-encoder's input: the pair joined by the tokenizer's pair template; with
    `truncate` (-1: max_model_len) cut to that many tokens by the tokenizer's pair
    truncation (longest first), as vLLM does."""
    if truncate is None:
        ids = tokenizer(first, text_pair=second)["input_ids"]
    else:
        limit = max_model_len if truncate == -1 else truncate
        ids = tokenizer(first, text_pair=second, truncation=True, max_length=limit)["input_ids"]
    return {"prompt_token_ids": list(ids)}
