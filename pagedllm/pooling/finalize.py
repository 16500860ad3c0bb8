"""A finished pooling request's pooled sum -> its output vector (vLLM's pooler heads):

MEAN            sum / number of prompt tokens (ALL: one row per token, each as below)
embed           [:dimensions] (Matryoshka) -> L2 normalize (per request, default on)
classify/score  sigmoid (one label) or softmax (several) (per request, default on)
reward          the rows as they are (activation only when asked)
"""

from __future__ import annotations

import torch

from pagedllm.core.request import Request
from pagedllm.errors import InvariantError
from pagedllm.pooling.setup import PoolingSetup


class UnpooledRequestError(InvariantError):
    """A pooling request was reported finished before its prompt was pooled (a bug)."""


def finalize(setup: PoolingSetup, request: Request) -> torch.Tensor:
    """The output vector of `request`, whose whole prompt has been pooled."""
    params = request.pooling_params
    data = request.pooled
    if data is None:
        raise UnpooledRequestError(f"{request} has no pooled data (its prompt was not pooled)")
    if setup.pooling_type == "MEAN":
        data = data / request.num_prompt_tokens
    if setup.task == "embed":
        if params.dimensions is not None:
            data = data[..., : params.dimensions]
        normalize = params.normalize if params.normalize is not None else setup.normalize
        return torch.nn.functional.normalize(data, dim=-1) if normalize else data
    activation = params.activation if params.activation is not None else setup.activation
    if not activation:
        return data
    return torch.sigmoid(data) if data.shape[-1] == 1 else torch.softmax(data, dim=-1)
