"""The names the engine accepts for its enumerated options, in one torch-free module.

`EngineConfig` validates against these and the CLI offers them as `choices`, so building the
parser (`pagedllm --help`) imports no torch and the two can never drift. A new weight format
adds its name to `QUANTIZATION_METHODS` and registers its `LinearMethod` in
`model/layers/quant/` (tests/entrypoints/test_cli_first_hour.py checks the HF formats
registered there are all choices here).
"""

from __future__ import annotations

# KV cache element types: name -> torch dtype attribute. "auto" (not listed) stores K/V in the
# model dtype (float16 under int8 activations: EngineConfig.resolve_kv_cache_dtype); "float16"
# (= "fp16") stores fp32 K / V rounded to float16, no scales (half the bytes, what llama.cpp
# keeps by default); "float32" (= "fp32") the exact rows; the 8-bit ones add a float16 scale
# per token per KV head (model/layers/kv_quant.py). "fp8" is vLLM's alias for fp8_e4m3.
KV_CACHE_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16",
                   "fp16": "float16", "int8": "int8",
                   "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
PREEMPTION_MODES = ("recompute", "swap")
SCHEDULING_POLICIES = ("fcfs", "priority")
# Weight formats (vLLM's names). None = auto: what the checkpoint holds (a GGUF file -> "gguf",
# an HF config.json with quantization_config -> its method, else "none"). "none" dequantizes
# every weight to `dtype` at load (the reference path); "int8" quantizes an fp32/bf16
# checkpoint to weight-only per-channel int8 at load.
QUANTIZATION_METHODS = ("none", "gguf", "awq", "gptq", "int8")
DISTRIBUTED_BACKENDS = (None, "mp", "ray")
# --max-request-body-bytes' default (entrypoints/body_limit.py enforces it).
DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 2**20
