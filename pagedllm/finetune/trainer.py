"""`finetune(config)`: train a LoRA / QLoRA adapter on the serving model and write it.

    load base (frozen; NF4 with --qlora) -> resolve targets (refuse before training)
    -> attach LoRA (B = 0) -> load data -> [eval] -> steps: grad_accum micro-batches,
    loss = sum of target-token CE / targets in the step, clip, AdamW on A/B only
    -> [eval] -> write adapter, log, loss curve

A non-finite loss stops the run (`NonFiniteLossError`, naming the step); so does any base
parameter that got a gradient (`FrozenBaseError`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pagedllm.errors import EngineError, InvariantError
from pagedllm.finetune import model as tm
from pagedllm.finetune.adapter_io import write_adapter
from pagedllm.finetune.config import FinetuneConfig
from pagedllm.finetune.data import Batch, batches, load_jsonl
from pagedllm.finetune.lora_train import (
    adapter_config,
    attach_lora,
    lora_state_dict,
    resolve_targets,
)
from pagedllm.finetune.precision import Precision
from pagedllm.finetune.report import CURVE_FILE, TrainingLog
from pagedllm.loader import load_checkpoint

logger = logging.getLogger(__name__)


class NonFiniteLossError(EngineError):
    """The loss became inf / NaN (fp16 overflow, a too high lr, bad data)."""


class FrozenBaseError(InvariantError, RuntimeError):
    """A base-model parameter received a gradient (the freezing failed: a bug, not bad input)."""


@dataclass
class FinetuneResult:
    out: Path
    steps: int
    losses: list[float]
    eval_before: float | None
    eval_after: float | None
    tokens_per_s: float
    base_weight_bytes: int
    lora_parameters: int
    targets: list[str] = field(default_factory=list)


class Trainer:
    """One run: `Trainer(config)` loads and checks everything, `train()` runs it."""

    def __init__(self, config: FinetuneConfig, checkpoint=None) -> None:
        self.config = c = config
        torch.manual_seed(c.seed)
        self.device = torch.device(c.device)
        self.precision = Precision.for_run(c.dtype, self.device)
        self.ckpt = checkpoint or load_checkpoint(c.base, quantization="none")
        self.model = tm.load_base(self.ckpt, self.device, qlora=c.qlora)
        self.target_modules, matched = resolve_targets(self.model, c.target_modules)
        self.adapter_cfg = adapter_config(self.target_modules, c.lora_r, c.lora_alpha,
                                          c.use_rslora)
        self.base_params = list(self.model.parameters())
        self.lora = attach_lora(self.model, matched, self.adapter_cfg, c.lora_dropout, c.seed)
        self.params = [p for m in {id(m): m for m, _ in self.lora.values()}.values()
                       for p in m.parameters()]
        if c.gradient_checkpointing:
            tm.enable_gradient_checkpointing(self.model)
        tok = self.ckpt.tokenizer
        self.train_data = load_jsonl(c.data, tok, c.max_seq_len)
        self.eval_data = (load_jsonl(c.eval_data, tok, c.max_seq_len)
                          if c.eval_data is not None else None)
        per_epoch = math.ceil(len(self.train_data) / (c.batch_size * c.grad_accum))
        self.total_steps = c.max_steps or c.epochs * per_epoch
        self.base_weight_bytes = tm.weight_bytes(self.model) - sum(
            p.numel() * p.element_size() for p in self.params)
        logger.info("finetune: %d LoRA tensors on %d modules (%d parameters, r=%d, "
                    "scale %.4g), %d train examples, %d steps", 2 * len(self.lora),
                    len(self.lora), self.num_lora_parameters, c.lora_r,
                    self.adapter_cfg.scale(next(iter(self.lora))), len(self.train_data),
                    self.total_steps)

    @property
    def num_lora_parameters(self) -> int:
        return sum(p.numel() for p in self.params)

    def loss_sum(self, batch: Batch) -> torch.Tensor:
        d = self.device
        with self.precision.autocast():
            return tm.token_loss_sum(self.model, batch.ids.to(d), batch.valid.to(d),
                                     batch.targets.to(d)).float()

    @torch.no_grad()
    def evaluate(self) -> float | None:
        if self.eval_data is None:
            return None
        self.model.eval()
        total, n = 0.0, 0
        for b in batches(self.eval_data, self.config.batch_size, shuffle=False, seed=0,
                         epoch=0):
            total += float(self.loss_sum(b))
            n += b.num_targets
        return total / n

    def _lr(self, step: int) -> float:
        w = self.config.warmup_steps
        return self.config.lr * (min(1.0, step / w) if w else 1.0)

    def _micro_batches(self):
        epoch = 0
        while True:
            yield from batches(self.train_data, self.config.batch_size,
                               shuffle=self.config.shuffle, seed=self.config.seed, epoch=epoch)
            epoch += 1

    def train(self) -> FinetuneResult:
        c = self.config
        log = TrainingLog(c.out)
        opt = torch.optim.AdamW(self.params, lr=c.lr, weight_decay=c.weight_decay)
        scaler = self.precision.scaler
        eval_before = self.evaluate()
        if eval_before is not None:
            log.write(step=0, eval_loss=eval_before)
        stream = self._micro_batches()
        losses: list[float] = []
        tokens, t0 = 0, time.perf_counter()
        bar = _progress(self.total_steps, c.progress)
        for step in range(1, self.total_steps + 1):
            self.model.train()
            micro = [next(stream) for _ in range(c.grad_accum)]
            n_targets = sum(b.num_targets for b in micro)
            step_loss = 0.0
            for b in micro:
                loss = self.loss_sum(b) / n_targets
                if not torch.isfinite(loss):
                    raise NonFiniteLossError(
                        f"loss is {float(loss.detach())} at step {step} (of {self.total_steps}); "
                        "training stopped, no adapter written. With --dtype float16 this is "
                        "usually an overflow (use bfloat16 or float32); else lower --lr or "
                        "check the data")
                (scaler.scale(loss) if scaler else loss).backward()
                step_loss += float(loss.detach())
                tokens += b.num_tokens
            for g in opt.param_groups:
                g["lr"] = self._lr(step)
            if scaler:
                scaler.unscale_(opt)
            if c.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(self.params, c.max_grad_norm)
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(step_loss)
            elapsed = time.perf_counter() - t0
            log.write(step=step, loss=step_loss, lr=self._lr(step), tokens=tokens,
                      tokens_per_s=tokens / elapsed, elapsed_s=elapsed)
            if bar is not None:
                bar.set_postfix(loss=f"{step_loss:.4f}", tok_s=f"{tokens / elapsed:.0f}")
                bar.update()
            if c.eval_every and step % c.eval_every == 0 and step < self.total_steps:
                log.write(step=step, eval_loss=self.evaluate())
        if bar is not None:
            bar.close()
        tokens_per_s = tokens / (time.perf_counter() - t0)
        if any(p.grad is not None for p in self.base_params):
            raise FrozenBaseError("a base-model parameter received a gradient; the base must "
                                  "stay frozen")
        eval_after = self.evaluate()
        if eval_after is not None:
            log.write(step=self.total_steps, eval_loss=eval_after)
        self.model.eval()
        write_adapter(c.out, lora_state_dict(self.lora), r=c.lora_r, alpha=c.lora_alpha,
                      rslora=c.use_rslora, dropout=c.lora_dropout,
                      target_modules=self.target_modules,
                      base_model=str(self.ckpt.source) if c.base is None else c.base)
        log.plot(c.out / CURVE_FILE)
        logger.info("finetune: %d steps, loss %.4f -> %.4f, %.0f tokens/s; adapter in %s",
                    self.total_steps, losses[0], losses[-1], tokens_per_s, c.out)
        return FinetuneResult(c.out, self.total_steps, losses, eval_before, eval_after,
                              tokens_per_s, self.base_weight_bytes, self.num_lora_parameters,
                              self.target_modules)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="finetune", unit="step")


def finetune(config: FinetuneConfig) -> FinetuneResult:
    return Trainer(config).train()
