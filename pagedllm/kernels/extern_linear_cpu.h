// A linear kernel of one extension family called from another: the "int" family
// (quant_int_cpu.cpp: int8, W8A8 and AWQ / GPTQ int4 weights) is a module of its own, built
// on first use, and the core module's decode loop (decode_layers_cpu.cpp) is not linked with
// it. The int module hands out the address of an ExternLinearFn (`extern_linear(name)`), the
// loop's LinearRef of kind kExtern calls it: the same kernel, the same result, without a
// Python call per layer. Both modules are built against the same torch headers, so the
// signature below is the one ABI they share.
#pragma once
#include "torch_lite_cpu.h"
#include <vector>

// y [M, N] = x [M, K] @ W^T for W given as the kernel's tensors `t`; `arg` is the kernel's
// one integer parameter (int4's group size; 0 where there is none). No bias: the caller adds it.
using ExternLinearFn = torch::Tensor (*)(const torch::Tensor& x, const std::vector<torch::Tensor>& t,
                                         int64_t N, int64_t arg);
