"""`pagedllm finetune` end to end on the tiny Llama: flags reach the config, the adapter
directory holds the PEFT files, the log and the curve; a refused target is exit status 2
with its message."""

from __future__ import annotations

import json

from pagedllm.entrypoints.cli import main


def test_finetune_command(tiny_llama_dir, pattern_data, tmp_path, capsys) -> None:
    out = tmp_path / "adapter"
    rc = main(["finetune", str(tiny_llama_dir), "--data", str(pattern_data), "--eval",
               str(pattern_data), "--out", str(out), "--max-steps", "3", "--lora-r", "2",
               "--lora-alpha", "4", "--target-modules", "q_proj,v_proj", "--lr", "1e-3",
               "--gradient-checkpointing", "--no-progress"])
    assert rc == 0
    assert "adapter written to" in capsys.readouterr().out
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["target_modules"]) == (2, 4.0, ["q_proj", "v_proj"])
    for name in ("adapter_model.safetensors", "train_log.jsonl", "loss_curve.png"):
        assert (out / name).is_file(), name
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "eval_loss" in r] == [0, 3]


def test_finetune_command_refuses_bad_target(tiny_llama_dir, pattern_data, tmp_path,
                                             capsys) -> None:
    rc = main(["finetune", str(tiny_llama_dir), "--data", str(pattern_data), "--out",
               str(tmp_path / "a"), "--target-modules", "q,v", "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "target module 'q' matches no module of the model" in err and "q_proj" in err
    assert not (tmp_path / "a" / "adapter_config.json").exists()
