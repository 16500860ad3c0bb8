"""Weight formats of a linear layer: one `LinearMethod` class per format (base.py says the
contract). dense.py holds the float layouts; each quantized format is a `QuantizedWeight`
subclass in its own file (gguf, gguf_a8_panels, int8, int4 with awq and gptq).

Loaders yield a `QuantizedWeight` in place of a dense tensor for a linear layer's weight;
`Linear.set_quantized` makes it the layer's method. The model code does not change per format:
the method runs the kernel, reports its bytes and its form in the C++ decode loop.
"""

from pagedllm.model.layers.quant.base import (
    LinearMethod,
    QuantizedWeight,
    StackedQuantizedWeight,
    concat_quantized,
)

__all__ = ["LinearMethod", "QuantizedWeight", "StackedQuantizedWeight", "concat_quantized"]
