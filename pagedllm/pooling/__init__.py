"""Pooling models (vLLM's `--runner pooling`): a prompt's hidden states -> one vector
(or one per token: ALL pooling, `--convert reward`).

    setup.py        PoolingSetup: the task (embed | classify | reward), pooling type,
                    normalization and activation settled once from --runner / --convert /
                    --pooler-config and the checkpoint's config
    step_pooler.py  the runner's hook: each step, the pooled part of every pooling request's
                    chunk (MEAN sums chunk by chunk; LAST / CLS pick their row; ALL: all rows)
    finalize.py     the request's pooled sum -> its output vector (mean, Matryoshka
                    truncation, L2 norm, sigmoid / softmax)
    outputs.py      vLLM's output classes (PoolingRequestOutput, EmbeddingRequestOutput,
                    ClassificationRequestOutput, ScoringRequestOutput)

Pooling requests go through the same scheduler and KV pool as generation: prefill only, no
sampling row; `Scheduler.update_from_output` adds each chunk's part to the request and
finishes it (blocks freed) when its prompt is computed.
"""
