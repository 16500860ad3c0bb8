"""LoRA as a wrapper layer: `LoRALinear` in place of each target linear, the batched delta
of its adapter slots, and the per-step row -> slot mapping.

    parent.qkv_proj = LoRALinear(base_layer=Linear, lora=LinearLoRA)     (installed once)
    LoRALinear(x) = lora.add_delta(x, base_layer(x))

`install` puts the wrapper in place of the linear on its parent module (the serving
`LoRAManager` for every target at its construction; finetune for the trained targets), so
`Linear` knows nothing of LoRA and the parameter names of the base gain a `.base_layer` (as
in PEFT and vLLM).

Every target linear holds `max_loras` preallocated slots, rank-padded and stacked:

    a: [max_loras, num_subs * R, in]    rows [j*R, j*R + r) of slot s: sub-projection j's A
    b: [max_loras, num_subs * R, out]   B^T of sub j (times the scale) in columns of its rows

so a fused qkv / gate_up gets its q/k/v (gate/up) deltas from one pair of matmuls per slot
(b is block-diagonal over the subs). A step's rows are grouped by slot once (`LoRAMapping`):

    rows of the batch (slot)   r0(1) r1(-) r2(0) r3(1) r4(0)      - = base model, no delta
    order (sorted by slot)     r2 r4 | r0 r3
    segments                   (slot 0, 0, 2), (slot 1, 2, 4)

and each target linear computes, per active slot, (x[seg] @ a_s^T) @ b_s on its segment,
then adds all segments back with one index_add: a loop over <= max_loras slots, vectorized
over rows. A batch on one adapter only takes two matmuls and no gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class LoRAMapping:
    """Which slot each row of the step's flattened batch uses."""

    single: int | None                    # every row uses this slot (no gather needed)
    rows: torch.Tensor | None             # LoRA rows of the batch, sorted by slot
    segments: tuple[tuple[int, int, int], ...]  # (slot, start, end) into `rows`

    @classmethod
    def build(cls, row_slots: np.ndarray, device: torch.device) -> LoRAMapping | None:
        """`row_slots[i]`: slot of row i, -1 for the base model. None when no row has one."""
        if row_slots.size == 0 or (row_slots < 0).all():
            return None
        first = int(row_slots[0])
        if first >= 0 and (row_slots == first).all():
            return cls(first, None, ())
        lora_rows = np.flatnonzero(row_slots >= 0)
        order = lora_rows[np.argsort(row_slots[lora_rows], kind="stable")]
        slots = row_slots[order]
        cuts = np.flatnonzero(np.diff(slots)) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [len(order)]])
        segs = tuple((int(slots[a]), int(a), int(b)) for a, b in zip(starts, ends, strict=True))
        return cls(None, torch.from_numpy(order).to(device), segs)


class LoRAStepState:
    """The mapping of the step being run, shared by the manager (which sets it for the
    duration of one forward pass) and every target linear (which reads it)."""

    def __init__(self) -> None:
        self.mapping: LoRAMapping | None = None


class LinearLoRA:
    """Stacked adapter slots of one target linear; `add_delta` is what its `LoRALinear`
    adds to the base output."""

    def __init__(self, state: LoRAStepState, in_features: int, out_features: int,
                 num_subs: int, max_loras: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.state = state
        self.in_features, self.out_features = in_features, out_features
        self.max_rank = max_rank
        width = num_subs * max_rank
        self.a = torch.zeros(max_loras, width, in_features, device=device, dtype=dtype)
        self.b = torch.zeros(max_loras, width, out_features, device=device, dtype=dtype)
        self.filled = [False] * max_loras  # slot holds a delta for this linear
        # Per-slot views made once: the hot loop then runs only matmuls.
        self.a_t = [self.a[s].t() for s in range(max_loras)]
        self.b_s = [self.b[s] for s in range(max_loras)]

    def clear(self, slot: int) -> None:
        if self.filled[slot]:
            self.a[slot].zero_()
            self.b[slot].zero_()
            self.filled[slot] = False

    def set(self, slot: int, deltas) -> None:
        """Write an adapter's `SubDelta`s for this linear into `slot` (cleared first)."""
        self.clear(slot)
        for d in deltas:
            r0, r = d.sub * self.max_rank, d.a.shape[0]
            self.a[slot, r0:r0 + r].copy_(d.a)
            self.b[slot, r0:r0 + r, d.offset:d.offset + d.b.shape[0]].copy_(d.b.t())
        self.filled[slot] = bool(deltas)

    def add_delta(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out += scale * (x @ A^T) @ B^T for every row whose request has an adapter here."""
        m = self.state.mapping
        if m is None:
            return out
        x2 = x.reshape(-1, self.in_features)
        o2 = out.view(-1, self.out_features)
        if m.single is not None:
            s = m.single
            if self.filled[s]:
                o2.addmm_(x2 @ self.a_t[s], self.b_s[s])
            return out
        segs = [seg for seg in m.segments if self.filled[seg[0]]]
        if not segs:
            return out
        xs = x2.index_select(0, m.rows)
        full = len(segs) == len(m.segments)
        d = (torch.empty if full else torch.zeros)(xs.shape[0], self.out_features,
                                                   dtype=out.dtype, device=out.device)
        for s, lo, hi in segs:
            torch.mm(xs[lo:hi] @ self.a_t[s], self.b_s[s], out=d[lo:hi])
        o2.index_add_(0, m.rows, d)
        return out


class LoRALinear(nn.Module):
    """A target linear with adapter deltas: `lora.add_delta(x, base_layer(x))`.

    `lora` is any object with `add_delta(x, out) -> out + delta`: the serving slots
    (`LinearLoRA`) or a trainable adapter (finetune's `TrainableLoRA`, an nn.Module whose
    parameters then belong to the model). The delta lands after `base_layer`'s tensor-parallel
    collective; tensor parallelism with LoRA is refused (distributed/executor.py). The C++
    decode loop has no delta, so `fused_ref` is None and the Python layers run.
    """

    def __init__(self, base_layer: nn.Module, lora) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.lora = lora
        self.in_features = base_layer.in_features
        self.out_features = base_layer.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # base_layer.forward, not base_layer(x): one nn.Module call per target linear, as
        # before the wrapper (~1 us x ~120 linears a step); no hooks are set on base layers
        return self.lora.add_delta(x, self.base_layer.forward(x))

    def fused_ref(self, ops) -> None:
        return None


def install(model: nn.Module, name: str, lora) -> LoRALinear:
    """Wrap the linear `name` of `model` in a `LoRALinear` in place (on its parent)."""
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    wrapper = LoRALinear(getattr(parent, leaf), lora)
    setattr(parent, leaf, wrapper)
    return wrapper
