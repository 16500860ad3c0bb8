// Paged decode attention for CPU (fp32): one query token per sequence, keys/values read
// straight from the block pool through the block table (no gather copy). Parallel over
// sequence; each K/V row (all kv heads) is read once and serves the G = heads / kv_heads
// query heads of each KV head.
// softmax in fp32 with max subtraction. Layout: cache [num_blocks, block_size, kv_heads, d].
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline float dot(const float* a, const float* b, int64_t d) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float r = _mm_cvtss_f32(s);
  for (; i < d; ++i) r += a[i] * b[i];
  return r;
}
static inline void axpy(float* y, float a, const float* x, int64_t d) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < d; ++i) y[i] += a * x[i];
}
#else
static inline float dot(const float* a, const float* b, int64_t d) {
  float r = 0.f;
  for (int64_t i = 0; i < d; ++i) r += a[i] * b[i];
  return r;
}
static inline void axpy(float* y, float a, const float* x, int64_t d) {
  for (int64_t i = 0; i < d; ++i) y[i] += a * x[i];
}
#endif


void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, torch::Tensor block_tables,
                            torch::Tensor seq_lens, double scale, int64_t window) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && k_cache.dtype() == torch::kFloat32,
              "paged_decode_attention: fp32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              out.is_contiguous() && block_tables.is_contiguous() && seq_lens.is_contiguous());
  const int64_t D = q.size(0), H = q.size(1), d = q.size(2);
  const int64_t bs = k_cache.size(1), kvh = k_cache.size(2);
  const int64_t G = H / kvh, max_blocks = block_tables.size(1);
  (void)d;
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const float fscale = static_cast<float>(scale);
  // One job per sequence: each cached token's K (then V) row of all kv heads is read once,
  // contiguously, and serves all H query heads.
  at::parallel_for(0, D, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(H * d);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t L = lens[b];
      const int64_t start = window > 0 && L > window ? L - window : 0;
      const int64_t n = L - start;
      scores.resize(H * n);
      const float* qb = qp + b * H * d;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = start + t;
        const float* row = kp + (bt[b * max_blocks + pos / bs] * bs + pos % bs) * kvh * d;
        for (int64_t h = 0; h < H; ++h) {
          scores[h * n + t] = dot(qb + h * d, row + (h / G) * d, d) * fscale;
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        float* sh = scores.data() + h * n;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < n; ++t) m = sh[t] > m ? sh[t] : m;
        float sum = 0.f;
        for (int64_t t = 0; t < n; ++t) { sh[t] = std::exp(sh[t] - m); sum += sh[t]; }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < n; ++t) sh[t] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = start + t;
        const float* row = vp + (bt[b * max_blocks + pos / bs] * bs + pos % bs) * kvh * d;
        for (int64_t h = 0; h < H; ++h) {
          axpy(acc.data() + h * d, scores[h * n + t], row + (h / G) * d, d);
        }
      }
      std::copy(acc.begin(), acc.end(), op + b * H * d);
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "paged decode attention (CPU, fp32)");
}
