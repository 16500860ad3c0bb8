#!/usr/bin/env bash
# pagedllm against llama.cpp on a lent machine's host CPU (an AMX Xeon on the H200 machines of
# 2026-12), same run: issue 27's offline / one-stream / prefill numbers on the AMX class.
# The machine has no internet, so llama.cpp's source travels with the call (trimmed to what
# llama-bench and llama-batched-bench need: ~15 MB), with cmake and ninja wheels in case the
# image lacks them; the model is a random-weight SmolLM2-shaped Q4_1 GGUF written there (the
# real one is over the 64 MiB a call carries; speed does not depend on the values).
#
#   1. here (pip reaches PyPI):  bash scripts/gpu_check.sh prepare && bash scripts/amx_peers.sh prepare
#   2. device tool:  run(command="bash scripts/amx_peers.sh run", carry=[".gpu"], timeout_s=560)
#
# llama.cpp is patched before the build as DEVELOPERS.md says: GCC 12 drops the tile-config
# stores before `_tile_loadconfig` in ggml-cpu/amx/mmq.cpp (SIGILL / SIGSEGV in
# ggml_backend_amx_mul_mat); an empty asm with a memory clobber keeps them. Its AMX path runs
# with repacking on (its default), its AVX-512 path with repacking off: both are reported.
# $OUT gets machine.txt, build.log, llamacpp_vs.json and bench.log (the table). ~5 minutes on
# a 16-core host (the build ~2 of them).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}

if [ "$mode" = prepare ]; then
  set -e
  mkdir -p .gpu/build_whl
  work=$(mktemp -d)
  sdist=$(ls ~/.cache/pagedllm/peers/sdist/llama_cpp_python-*.tar.gz 2>/dev/null | tail -1 || true)
  if [ -z "$sdist" ]; then
    python3 -m pip download -q --no-binary :all: --no-deps -d "$work" llama-cpp-python
    sdist=$(ls "$work"/llama_cpp_python-*.tar.gz | tail -1)
  fi
  tar xzf "$sdist" -C "$work"
  src=$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)
  rm -rf "$src"/{models,docs,benches,tests,examples,conversion,tools/ui,tools/server/public*,media,gguf-py,.devops}
  mmq="$src/ggml/src/ggml-cpu/amx/mmq.cpp"
  grep -q '_tile_loadconfig(&tc);' "$mmq"
  sed -i 's|^\(\s*\)_tile_loadconfig(&tc);|\1asm volatile("" : : "r"(\&tc) : "memory");  // pagedllm: GCC 12 dropped the stores\n\1_tile_loadconfig(\&tc);|' "$mmq"
  grep -q 'asm volatile("" : : "r"(&tc) : "memory")' "$mmq"
  tar czf .gpu/llama.cpp.tgz -C "$(dirname "$src")" llama.cpp
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/build_whl cmake ninja
  rm -rf "$work"
  du -sh .gpu .gpu/llama.cpp.tgz .gpu/build_whl
  exit 0
fi

. scripts/device_env.sh amx_peers_out
export CUDA_VISIBLE_DEVICES= TORCH_EXTENSIONS_DIR=/tmp/pagedllm_ext MAX_JOBS=$(nproc)
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/buildtools .gpu/build_whl/*.whl
  export PATH=/tmp/buildtools/bin:$PATH PYTHONPATH=$PYTHONPATH:/tmp/buildtools
fi
{ cpu_summary; cmake --version | head -1; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
# pagedllm's kernels build in the background while llama.cpp builds
python3 -c "from pagedllm.kernels import cpu_ops; cpu_ops.load()" > "$OUT/build.log" 2>&1 &
rm -rf /tmp/llama.cpp && tar xzf .gpu/llama.cpp.tgz -C /tmp
opts=$(python3 -c "from pathlib import Path; from benchmarks.peers_lib.prepare import cmake_options
print(' '.join(cmake_options(Path('/tmp/llama.cpp'))))")
t0=$(date +%s)
{ cmake -S /tmp/llama.cpp -B /tmp/llama-build -G Ninja $opts -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF &&
  cmake --build /tmp/llama-build --target llama-bench llama-batched-bench -j "$(nproc)"
} >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "llama.cpp built in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.log"
wait
bins=$(dirname "$(find /tmp/llama-build -name llama-bench -type f | head -1)")
timeout 420 taskset -c 0,1 python3 benchmarks/llamacpp_vs.py --llama-bin "$bins" \
  --random-gguf .gpu/smollm2 --model /tmp/random_smollm2_q4_1.gguf --threads 2 --offline 64 \
  --rounds 2 --out "$OUT/llamacpp_vs.json" > "$OUT/bench.log" 2>&1
rc=$?
grep "^|" "$OUT/bench.log" || tail -30 "$OUT/bench.log"
exit $rc
