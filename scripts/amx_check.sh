#!/usr/bin/env bash
# The AMX tiles of the GGUF panels on a real AMX CPU, in one device call: the lent H200
# machines' host is a Sapphire Rapids class Xeon (2026-12); this checks its CPU only. The
# int8 tiles are off by default (0.65-0.90x VNNI's speed there, docs/benchmarks.md); the
# prompt rows' bf16 tiles (kernels/prompt_tiles_cpu.cpp, mode prompt-amx) have not run on one
# yet and stay off by default until this measures them. It runs their tests on the hardware
# and measures them (after a kernel change, or on a newer AMX generation).
#
#   1. here:  bash scripts/gpu_check.sh prepare      (.gpu/: gguf wheel, SmolLM2's config +
#                                                      tokenizer; the GGUF is over 64 MiB)
#   2. device tool:  run(command="bash scripts/amx_check.sh", carry=[".gpu"], timeout_s=560)
#
# Leaves in $OUT: machine.txt (CPU flags, the tiles the kernels chose), tests.log (the tile
# tests on AMX, the panel / MoE / CPU-feature tests), bench.log and
# int8_tiles_2t.json / int8_tiles_16t.json (benchmarks/int8_tiles.py: the GEMMs with VNNI
# (off), torch's bf16 matmul (bf16) and the prompt rows' bf16 tiles (prompt-amx; TILE_MODES
# adds amx for the int8 tiles), and through LLM on a random-weight SmolLM2-shaped Q4_1 GGUF on
# 2 cores: prefill 512, one stream, offline 64 x 128/128, greedy sequences equal), cpu_modes.json
# (fp32 / bf16 weights through LLM for the same-run comparison), decode_attention.json (64 x
# 192 float16 tokens from memory, 2 threads). ~5 minutes on a 16-core host.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_env.sh amx_check_out
export CUDA_VISIBLE_DEVICES= TORCH_EXTENSIONS_DIR=/tmp/pagedllm_ext MAX_JOBS=$(nproc)
{
  cpu_summary
  uname -r
  timeout 300 python3 -c "
import logging, time; logging.basicConfig(level=logging.INFO)
t = time.perf_counter()
from pagedllm.kernels import cpu_ops, cpu_features
ops = cpu_ops.load()
print('kernels loaded in %.0f s; int8 dot products: %s; tiles: %s' % (
    time.perf_counter() - t, ops.int8_dot_isa(), ops.int8_tiles()))"
} > "$OUT/machine.txt" 2>&1
tail -2 "$OUT/machine.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 \
  tests/model/quant/test_a8_panel_tiles.py tests/model/quant/test_prompt_tiles.py \
  tests/model/quant/test_gguf_a8_panels.py \
  tests/kernels/test_cpu_features.py tests/model/test_moe_grouped.py \
  -k "not bad" > "$OUT/tests.log" 2>&1
tests_rc=$?
tail -4 "$OUT/tests.log"
timeout 240 taskset -c 0,1 python3 benchmarks/int8_tiles.py --threads 2 --reps 10 --modes "${TILE_MODES:-off,bf16,prompt-amx}" \
  --engine /tmp/random_smollm2_q4_1.gguf --random-gguf .gpu/smollm2 --offline 64 \
  --engine-reps 2 --out "$OUT/int8_tiles_2t.json" > "$OUT/bench.log" 2>&1
bench_rc=$?
timeout 60 python3 benchmarks/int8_tiles.py --threads "$(nproc)" --rows 16,64,512 --reps 10 --modes "${TILE_MODES:-off,prompt-amx}" \
  --out "$OUT/int8_tiles_16t.json" >> "$OUT/bench.log" 2>&1
grep -v -E "^20..-|INFO|Writing|deprecated" "$OUT/bench.log" | tail -30
# the batched decode attention from memory (rows asked for as they are read, session 27)
timeout 60 taskset -c 0,1 python3 benchmarks/decode_attention.py --batch 64 --context 192 \
  --block-sizes 16 --out "$OUT/decode_attention.json" 2>&1 | grep -E "^\| 16 \|"
rm -rf /tmp/smollm2_hf && cp -r .gpu/smollm2 /tmp/smollm2_hf  # + random bf16 weights
python3 -c "import torch, transformers
cfg = transformers.AutoConfig.from_pretrained('/tmp/smollm2_hf'); torch.manual_seed(0)
transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained('/tmp/smollm2_hf')"
timeout 150 taskset -c 0,1 python3 benchmarks/bf16_weights.py --model /tmp/smollm2_hf \
  --modes float32,bfloat16 --threads 2 --reps 2 --offline 64 \
  --out "$OUT/cpu_modes.json" 2>&1 | grep "^|" | tail -4
echo "tests rc=$tests_rc bench rc=$bench_rc"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
