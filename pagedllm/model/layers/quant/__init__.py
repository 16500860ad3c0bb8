"""Quantized weights that stay quantized in memory (one `QuantizedWeight` subclass per format).

Loaders yield a `QuantizedWeight` in place of a dense tensor for a linear layer's weight;
`Linear.set_quantized` takes it and runs its `linear` instead of the dense kernel. The model
code does not change per format (see base.py for the contract).
"""

from pagedllm.model.layers.quant.base import (
    QuantizedWeight,
    StackedQuantizedWeight,
    concat_quantized,
)

__all__ = ["QuantizedWeight", "StackedQuantizedWeight", "concat_quantized"]
