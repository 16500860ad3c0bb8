"""Each refused configuration gives its message before training: targets that match
nothing or match norm layers / the embedding, an lr that looks like an alpha, bf16 without
bf16 hardware, fp16 only with a loss scaler; lm_head targets warn; a non-finite loss stops
training naming the step; bad data lines name file:line."""

from __future__ import annotations

import logging

import pytest
import torch
from finetune_data import write_jsonl
from safetensors.torch import load_file, save_file

from pagedllm.finetune import FinetuneConfig, NonFiniteLossError, Trainer, precision
from pagedllm.finetune.lora_train import TargetError


@pytest.mark.parametrize("targets, message", [
    ("qproj", r"target module 'qproj' matches no module of the model; the model's linear "
              r"layers are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"),
    ("q_proj,input_layernorm", r"'model.layers.0.input_layernorm' is a norm layer \(RMSNorm\)"),
    ("norm", r"'model.norm' is a norm layer"),
    ("embed_tokens", r"'model.embed_tokens' is the embedding"),
    ("self_attn", r"match 'model.layers.0.self_attn', a LlamaAttention module, not a linear"),
])
def test_bad_targets_refused_before_training(ft_config, targets, message) -> None:
    with pytest.raises(TargetError, match=message):
        Trainer(ft_config(target_modules=targets))


def test_lm_head_target_warns(ft_config, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        trainer = Trainer(ft_config(target_modules="q_proj,lm_head"))
    assert "lm_head" in trainer.lora
    assert "refuses lm_head adapters" in caplog.text


@pytest.mark.parametrize("kw, message", [
    (dict(lr=16.0), "it looks like a lora_alpha"),
    (dict(lora_r=0), "lora_r must be >= 1"),
    (dict(lora_dropout=1.0), r"lora_dropout must be in \[0, 1\)"),
    (dict(target_modules="all-linear,q_proj"), "all-linear cannot be combined"),
    (dict(dtype="int8"), "dtype must be one of float32, bfloat16, float16"),
    (dict(grad_accum=0), "grad_accum must be >= 1"),
])
def test_config_refusals(kw, message, tmp_path) -> None:
    with pytest.raises(ValueError, match=message):
        FinetuneConfig(base=None, data=tmp_path / "d.jsonl", out=tmp_path, **kw)


def test_bf16_only_with_hardware(monkeypatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "has_bf16", lambda d: False)
    with pytest.raises(ValueError, match="dtype bfloat16: this cpu has no bf16 support"):
        precision.Precision.for_run("bfloat16", cpu)
    monkeypatch.setattr(precision, "has_bf16", lambda d: True)
    p = precision.Precision.for_run("bfloat16", cpu)
    assert p.dtype == torch.bfloat16 and p.scaler is None


def test_fp16_only_with_loss_scaler(monkeypatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "has_fp16", lambda d: False)
    with pytest.raises(ValueError, match="dtype float16: this cpu has no fp16 compute"):
        precision.Precision.for_run("float16", cpu)
    monkeypatch.setattr(precision, "has_fp16", lambda d: True)
    p = precision.Precision.for_run("float16", cpu)
    assert p.dtype == torch.float16 and isinstance(p.scaler, torch.amp.GradScaler)
    assert precision.Precision.for_run("float32", cpu).dtype is None


def test_fp16_trains_with_loss_scaler(ft_config, monkeypatch) -> None:
    """fp16 autocast (emulated where the CPU lacks it) steps through the GradScaler."""
    monkeypatch.setattr(precision, "has_fp16", lambda d: True)
    trainer = Trainer(ft_config(dtype="float16", max_steps=5))
    result = trainer.train()
    assert result.losses[-1] < result.losses[0]
    assert trainer.precision.scaler.get_scale() > 1  # the scaler ran (and did not collapse)


@pytest.mark.skipif(not precision.has_bf16(torch.device("cpu")), reason="no bf16 on this CPU")
def test_bf16_autocast_trains(ft_config) -> None:
    result = Trainer(ft_config(dtype="bfloat16", max_steps=10)).train()
    assert result.losses[-1] < result.losses[0]


def test_non_finite_loss_names_the_step(ft_config, tiny_llama_dir, tiny_tokenizer,
                                        tmp_path) -> None:
    """A base whose embedding row of one token is inf: the 3rd example holds that token,
    so with batch size 1 and no shuffling step 3 is the first non-finite loss."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_llama_dir, base)
    w = load_file(str(base / "model.safetensors"))
    bad = tiny_tokenizer("~")["input_ids"][-1]
    w["model.embed_tokens.weight"][bad] = float("inf")
    save_file(w, str(base / "model.safetensors"), metadata={"format": "pt"})
    rows = [{"text": "count 1 2 3"}, {"text": "count 4 5"}, {"text": "count ~ 6"},
            {"text": "count 7"}]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "adapter"
    trainer = Trainer(ft_config(base=str(base), data=data, eval_data=None, out=out,
                                batch_size=1, shuffle=False))
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 3 \(of 30\)"):
        trainer.train()
    assert not (out / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "a"}', r"d.jsonl:2: 'prompt' and 'completion' must both be strings"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "d.jsonl:2: 'messages' has no "
                                                           "assistant turn"),
    ('{"input": "x"}', r"d.jsonl:2: a line needs 'messages', 'prompt'\+'completion' or "
                       r"'text'; got keys \['input'\]"),
    ("not json", "d.jsonl:2: not valid JSON"),
])
def test_bad_data_lines(ft_config, tmp_path, line, message) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        Trainer(ft_config(data=path, eval_data=None))
