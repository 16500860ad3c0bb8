"""PoolingParams and PoolerConfig validate at construction with precise ValueErrors."""

from __future__ import annotations

import pytest

from pagedllm import PoolingParams
from pagedllm.config.pooler import PoolerConfig


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dimensions": 0}, "dimensions must be an int >= 1"),
        ({"dimensions": True}, "dimensions must be an int >= 1"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens must be an int >= 1 or -1"),
        ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens must be an int >= 1 or -1"),
        ({"task": "rerank"}, "pooling task must be one of embed, classify, score, encode"),
        ({"normalize": 1}, "normalize must be true, false or null"),
        ({"activation": "yes"}, "activation must be true, false or null"),
    ],
)
def test_bad_pooling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PoolingParams(**kwargs)


def test_good_pooling_params_and_pooler_config():
    p = PoolingParams(dimensions=8, normalize=False, truncate_prompt_tokens=-1, task="embed")
    assert (p.dimensions, p.normalize, p.truncate_prompt_tokens) == (8, False, -1)
    assert PoolerConfig.parse('{"pooling_type": "cls"}') == PoolerConfig(pooling_type="CLS")
    assert PoolerConfig.parse(None) is None
    with pytest.raises(ValueError, match="normalize must be true or false"):
        PoolerConfig.parse({"normalize": "yes"})
    with pytest.raises(ValueError, match="must be a JSON object"):
        PoolerConfig.parse("[1]")
