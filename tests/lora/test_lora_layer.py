"""The batched delta of one target linear against a per-row reference loop."""

from __future__ import annotations

import numpy as np
import torch

from pagedllm.lora.adapter import SubDelta
from pagedllm.lora.layer import LinearLoRA, LoRAMapping, LoRAStepState


def test_mapping_groups_rows_by_slot() -> None:
    m = LoRAMapping.build(np.array([1, -1, 0, 1, 0]), torch.device("cpu"))
    assert m.single is None
    assert m.rows.tolist() == [2, 4, 0, 3]
    assert m.segments == ((0, 0, 2), (1, 2, 4))
    assert LoRAMapping.build(np.array([2, 2, 2]), torch.device("cpu")).single == 2
    assert LoRAMapping.build(np.array([-1, -1]), torch.device("cpu")) is None


def test_fused_delta_matches_per_row_loop() -> None:
    """A fused 3-way linear (q 8, k 4, v 4 outputs), 3 slots, slot 2 without this layer,
    rows of every slot and of the base model, ranks below the slot rank."""
    gen = torch.Generator().manual_seed(0)
    state = LoRAStepState()
    lin = LinearLoRA(state, 6, 16, 3, max_loras=3, max_rank=4, device=torch.device("cpu"),
                     dtype=torch.float64)
    subs = {0: [(0, 0, 8, 2), (2, 12, 4, 3)], 1: [(1, 8, 4, 4)]}  # sub, offset, size, rank
    deltas = {}
    for slot, items in subs.items():
        deltas[slot] = [SubDelta(j, 3, off, torch.randn(r, 6, generator=gen, dtype=torch.float64),
                                 torch.randn(size, r, generator=gen, dtype=torch.float64))
                        for j, off, size, r in items]
        lin.set(slot, deltas[slot])
    lin.set(2, [])
    row_slots = np.array([1, -1, 0, 2, 1, 0, 0])
    x = torch.randn(7, 6, generator=gen, dtype=torch.float64)
    base = torch.randn(7, 16, generator=gen, dtype=torch.float64)
    want = base.clone()
    for i, s in enumerate(row_slots):
        for d in deltas.get(int(s), []):
            want[i, d.offset:d.offset + d.b.shape[0]] += d.b @ (d.a @ x[i])
    for slots in (row_slots, np.zeros(7, np.int64)):
        state.mapping = LoRAMapping.build(slots, torch.device("cpu"))
        got = lin.add_delta(x, base.clone())
        if slots is not row_slots:
            want = base.clone()
            for i in range(7):
                for d in deltas[0]:
                    want[i, d.offset:d.offset + d.b.shape[0]] += d.b @ (d.a @ x[i])
        torch.testing.assert_close(got, want)
    state.mapping = None
    torch.testing.assert_close(lin.add_delta(x, base.clone()), base)


def test_wrapper_adds_the_delta_to_the_base_layer() -> None:
    """`install` puts a LoRALinear in place of the linear on its parent; its output is the
    base layer's plus the slots' delta, and the base layer is the same module, unchanged."""
    from torch import nn

    from pagedllm.lora.layer import LoRALinear, install
    from pagedllm.model.layers.linear import Linear

    gen = torch.Generator().manual_seed(1)
    model = nn.Module()
    model.block = nn.Module()
    base = model.block.proj = Linear(6, 5, bias=True)
    base.weight.data.normal_(generator=gen)
    base.bias.data.normal_(generator=gen)
    base.finalize()
    state = LoRAStepState()
    slots = LinearLoRA(state, 6, 5, 1, max_loras=2, max_rank=2, device=torch.device("cpu"),
                       dtype=torch.float32)
    slots.set(1, [SubDelta(0, 1, 0, torch.randn(2, 6, generator=gen),
                           torch.randn(5, 2, generator=gen))])
    wrapper = install(model, "block.proj", slots)
    assert model.block.proj is wrapper and isinstance(wrapper, LoRALinear)
    assert wrapper.base_layer is base and (wrapper.in_features, wrapper.out_features) == (6, 5)
    x = torch.randn(4, 6, generator=gen)
    torch.testing.assert_close(wrapper(x), base(x))  # no mapping: the base model
    state.mapping = LoRAMapping.build(np.array([1, -1, 1, 1]), torch.device("cpu"))
    torch.testing.assert_close(wrapper(x), slots.add_delta(x, base(x)))
    assert not torch.equal(wrapper(x)[0], base(x)[0]) and torch.equal(wrapper(x)[1], base(x)[1])
