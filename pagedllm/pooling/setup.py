"""Settle, once per engine, what a pooling model does (vLLM's `--runner` / `--convert` and
the converted model's default pooler): from the engine config and the checkpoint's config.

    checkpoint                      --runner auto     --convert auto   default pooler
    XForCausalLM                    generate          embed (pooling)  LAST + L2 normalize
    XForSequenceClassification      pooling           classify         LAST + sigmoid/softmax

`--pooler-config` overrides the pooling type (LAST / MEAN / CLS), `normalize` and
`activation`. MEAN and CLS need every position of the prompt (CLS: its first) to be computed,
so the engine plan turns prefix caching off for them (engine/plan.py), as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedllm.config import EngineConfig
from pagedllm.config.pooler import PoolerConfig
from pagedllm.errors import ModelLoadError
from pagedllm.model.models.seq_cls import SEQ_CLS_SUFFIX


class PoolingConfigError(ModelLoadError):
    """--runner / --convert ask for something this checkpoint cannot be served as."""


@dataclass(frozen=True)
class PoolingSetup:
    """What the engine's pooling model computes (see the module doc). `tasks`: the
    PoolingParams tasks it serves."""

    task: str  # "embed" | "classify" | "reward"
    pooling_type: str  # "LAST" | "MEAN" | "CLS"
    normalize: bool
    activation: bool
    hidden_size: int
    num_labels: int | None = None
    matryoshka_dimensions: tuple[int, ...] | None = None
    is_matryoshka: bool = False
    labels: tuple[str, ...] | None = None  # a classifier's id2label, in label order

    @property
    def tasks(self) -> tuple[str, ...]:
        if self.task == "embed":
            return ("embed", "encode", "score")
        if self.task == "reward" or self.pooling_type == "ALL":  # one vector per token
            return ("encode",)
        return ("classify", "encode") + (("score",) if self.num_labels == 1 else ())

    @property
    def caches_prefixes(self) -> bool:
        """A prefix-cache hit skips computing positions: only LAST pooling never needs them."""
        return self.pooling_type == "LAST"

    def describe(self) -> str:
        extra = (
            f"normalize={self.normalize}"
            if self.task == "embed"
            else f"num_labels={self.num_labels}, activation={self.activation}"
        )
        return f"{self.task} ({self.pooling_type} pooling, {extra})"


def resolve_pooling(config: EngineConfig, hf_config) -> PoolingSetup | None:
    """The engine's PoolingSetup, or None when it generates; PoolingConfigError (a
    ValueError) when the flags and the checkpoint do not fit together."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    seq_cls = any(a.endswith(SEQ_CLS_SUFFIX) for a in archs)
    runner = config.runner
    if runner == "auto":
        runner = "pooling" if seq_cls or config.convert not in ("auto", "none") else "generate"
    if runner == "generate":
        if seq_cls:
            raise PoolingConfigError(
                f"{archs[0]} has a classification head and no LM head: it cannot generate; "
                "serve it with --runner pooling (runner='pooling')"
            )
        return None
    if config.tensor_parallel_size > 1:
        raise PoolingConfigError(
            "pooling models run with tensor_parallel_size 1 (the score "
            "head and the pooler are not sharded)"
        )
    if config.speculative_config is not None:
        raise PoolingConfigError(
            "speculative decoding does not apply to a pooling model "
            "(it generates nothing); drop --speculative-config"
        )
    convert = config.convert
    if convert == "auto":
        convert = "classify" if seq_cls else "embed"
    if convert == "none":
        if not seq_cls:
            raise PoolingConfigError(
                f"{archs[0] if archs else 'this checkpoint'} is a decoder without a pooling "
                "head: --runner pooling needs --convert embed (or a "
                "*ForSequenceClassification checkpoint)"
            )
        convert = "classify"
    if convert == "classify" and not seq_cls:
        raise PoolingConfigError(
            f"--convert classify needs a *ForSequenceClassification checkpoint (its score "
            f"head); {archs[0] if archs else 'this checkpoint'} has none. Use --convert embed"
        )
    pc = config.pooler_config or PoolerConfig()
    reward = convert == "reward"  # vLLM's: every token's hidden state (or score), as is
    head = convert == "classify" or (reward and seq_cls)
    dims = getattr(hf_config, "matryoshka_dimensions", None)
    return PoolingSetup(
        task=convert,
        pooling_type=pc.pooling_type or ("ALL" if reward else "LAST"),
        normalize=pc.normalize if pc.normalize is not None else convert == "embed",
        activation=pc.activation if pc.activation is not None else not reward,
        hidden_size=hf_config.hidden_size,
        num_labels=getattr(hf_config, "num_labels", None) if head else None,
        matryoshka_dimensions=tuple(dims) if dims else None,
        is_matryoshka=bool(getattr(hf_config, "is_matryoshka", False) or dims),
        labels=_labels(hf_config) if convert == "classify" else None,
    )


def _labels(hf_config) -> tuple[str, ...] | None:
    """The classifier's label names by index (HF's id2label), None when it has none."""
    id2label = getattr(hf_config, "id2label", None) or {}
    n = getattr(hf_config, "num_labels", 0)
    names = [id2label.get(i, id2label.get(str(i))) for i in range(n)]
    return tuple(names) if n and all(isinstance(x, str) for x in names) else None


def check_pooling_params(setup: PoolingSetup | None, params) -> None:
    """ValueError when the engine cannot serve `params` (a PoolingParams) as asked."""
    if setup is None:
        raise ValueError(
            f"a pooling request (task {params.task!r}) needs a pooling model; "
            "this engine generates (--runner generate). Serve an embedding or "
            "classification model with --runner pooling"
        )
    if params.task not in setup.tasks:
        raise ValueError(
            f"task {params.task!r} is not served by this {setup.task} model "
            f"(its tasks: {', '.join(setup.tasks)})"
        )
    if setup.task == "embed" and params.activation is not None:
        raise ValueError("activation applies to classification models; this model embeds")
    if setup.task != "embed" and params.normalize is not None:
        raise ValueError(f"normalize applies to embeddings; this is a {setup.task} model")
    if params.dimensions is None:
        return
    if setup.task != "embed":
        raise ValueError("dimensions applies to embeddings only")
    if not setup.is_matryoshka:
        raise ValueError(
            "this model does not support Matryoshka representation: changing "
            "the output dimensions (dimensions) would give poor embeddings"
        )
    allowed = setup.matryoshka_dimensions
    if params.dimensions > setup.hidden_size or (allowed and params.dimensions not in allowed):
        raise ValueError(
            f"dimensions must be one of {list(allowed)}, got {params.dimensions}"
            if allowed
            else f"dimensions must be <= the hidden size {setup.hidden_size}, got "
            f"{params.dimensions}"
        )
