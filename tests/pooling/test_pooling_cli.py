"""`pagedllm serve` flags of pooling models (vLLM's names) reach the EngineConfig; a bad
--pooler-config / --runner / --convert is an argparse error that says what is wrong."""

from __future__ import annotations

import pytest

from pagedllm.config.pooler import PoolerConfig
from pagedllm.entrypoints.args import engine_config_from_args
from pagedllm.entrypoints.cli import build_parser


def parse(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_pooling_flags_reach_the_config():
    config = engine_config_from_args(
        parse(
            "--runner",
            "pooling",
            "--convert",
            "embed",
            "--pooler-config",
            '{"pooling_type": "mean", "normalize": false}',
        )
    )
    assert (config.runner, config.convert) == ("pooling", "embed")
    assert config.pooler_config == PoolerConfig(pooling_type="MEAN", normalize=False)
    default = engine_config_from_args(parse())
    assert (default.runner, default.convert, default.pooler_config) == ("auto", "auto", None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pooler-config", "{mean}"], "not valid JSON"),
        (["--pooler-config", '{"pooling_type": "MAX"}'], "LAST, MEAN, CLS, ALL"),
        (["--runner", "embed"], "invalid choice"),
        (["--convert", "rerank"], "invalid choice"),
    ],
)
def test_bad_pooling_flags_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert message in capsys.readouterr().err
