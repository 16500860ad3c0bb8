// What a kernel translation unit needs of torch, and nothing more: at::Tensor, the
// factories the kernels call and at::parallel_for, under the names the kernels use
// (torch::Tensor, torch::empty, torch::kFloat32, ...).
//
// <torch/extension.h> brings the whole C++ frontend and pybind11 with it: ~23 s of parsing
// per translation unit on this 2-core machine, against ~3 s for these headers. A unit that
// registers its own ops (register_*(m)) adds <torch/csrc/utils/pybind.h> (pybind11 with
// torch's Tensor casters, ~6 s) instead of <torch/extension.h>.
#pragma once
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

// torch/types.h's dtype names, in a namespace of their own: a unit that also includes
// <torch/extension.h> finds torch's own constants first (qualified lookup stops at the
// names declared in `torch` itself), so the two never collide.
namespace pagedllm_torch_names {
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
}  // namespace pagedllm_torch_names

namespace torch {
using namespace at;  // NOLINT: as torch/types.h does
using namespace pagedllm_torch_names;  // NOLINT
}  // namespace torch
