"""lm-evaluation-harness itself against `pagedllm serve`: a small local multiple-choice task
and a loglikelihood_rolling document (YAML + JSONL written here), run with lm-eval's
`local-completions` model (token-id prompts, echo + logprobs) and with its `hf` model on the
same tiny random weights: accuracies equal, every per-choice loglikelihood within 1e-3."""

from __future__ import annotations

import json
import random
from pathlib import Path

import lm_eval
import pytest
from server_harness import TINY_SERVER_ARGS, start_server

WORDS = [
    "red",
    "green",
    "blue",
    "cat",
    "dog",
    "bird",
    "tree",
    "river",
    "stone",
    "cloud",
    "light",
    "sound",
    "fast",
    "slow",
    "warm",
    "cold",
    "north",
    "south",
    "bread",
    "water",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(
        tmp_path_factory,
        tiny_model_path,
        [*TINY_SERVER_ARGS, "--served-model-name", "tiny", "--max-num-batched-tokens", "32"],
    )
    yield srv
    srv.stop()


def write_tasks(root: Path) -> None:
    """tiny_mc: 20 items of 4 choices; tiny_rolling: one document for perplexity."""
    rng = random.Random(0)
    items = []
    for i in range(20):
        choices = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in range(4)]
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        items.append(
            {
                "question": f"Q{i}: {question}. Answer:",
                "choices": choices,
                "label": rng.randrange(4),
            }
        )
    (root / "mc.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    doc = " ".join(rng.choice(WORDS) for _ in range(60))
    (root / "rolling.jsonl").write_text(json.dumps({"text": doc}) + "\n")
    (root / "tiny_mc.yaml").write_text(f"""task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {root / "mc.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
""")
    (root / "tiny_rolling.yaml").write_text(f"""task: tiny_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {root / "rolling.jsonl"}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
""")


def evaluate(model: str, model_args: dict, root: Path) -> dict:
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=["tiny_mc", "tiny_rolling"],
        task_manager=TaskManager(include_path=str(root)),
        log_samples=True,
        batch_size=8,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )


def loglikelihoods(results: dict, task: str) -> list[float]:
    """Per request: (loglikelihood, is_greedy) for a choice, a bare loglikelihood for a
    rolling document."""
    out = []
    for sample in results["samples"][task]:
        for resp in sample["resps"]:
            value = resp[0]
            out.append(float(value[0] if isinstance(value, list | tuple) else value))
    return out


def greedy_flags(results: dict) -> list[bool]:
    return [bool(r[0][1]) for s in results["samples"]["tiny_mc"] for r in s["resps"]]


@pytest.mark.slow  # ~30-60 s on a 2-core machine: a server, lm-eval and HF twice
def test_lm_eval_local_completions_equals_hf(server, tiny_llama_dir, tmp_path):
    write_tasks(tmp_path)
    served = evaluate(
        "local-completions",
        {
            "model": "tiny",
            "base_url": f"{server.base_url}/v1/completions",
            "tokenizer": str(tiny_llama_dir),
            "tokenizer_backend": "huggingface",
            "tokenized_requests": True,
            "num_concurrent": 1,
            "max_retries": 1,
            "max_length": 512,
        },
        tmp_path,
    )
    hf = evaluate(
        "hf",
        {"pretrained": str(tiny_llama_dir), "dtype": "float32", "device": "cpu", "max_length": 512},
        tmp_path,
    )
    for task in ("tiny_mc", "tiny_rolling"):
        a, b = loglikelihoods(served, task), loglikelihoods(hf, task)
        assert len(a) == len(b) == (80 if task == "tiny_mc" else 1)
        assert a == pytest.approx(b, abs=1e-3)
    assert greedy_flags(served) == greedy_flags(hf)
    assert served["results"]["tiny_mc"]["acc,none"] == hf["results"]["tiny_mc"]["acc,none"]
    served_ppl = served["results"]["tiny_rolling"]["word_perplexity,none"]
    assert served_ppl == pytest.approx(
        hf["results"]["tiny_rolling"]["word_perplexity,none"], rel=1e-3
    )
