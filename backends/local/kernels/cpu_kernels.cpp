// spectune's CPU kernels for the bundled engine's decode step: attention of a few query rows over the KV cache, a
// per-row int8 linear (a Q8_0 lm_head requantized per row) and, on AVX-512, the int4 linears. Built at start-up for
// the machine's own ISA by backends/local/kernels/__init__.py (-march=native, or the ISA that ATEN_CPU_CAPABILITY
// names) and registered as torch ops spectune::decode_attention, spectune::int8_linear and spectune::int4_linear, so
// compiled graphs call them like ATen's own.
// Why they exist and what they measured: docs/engine.md ("spectune's CPU kernels").
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

// The register-blocked inner loops stay functions of their own: inlined into the callers' parallel_for lambdas, GCC 12
// kept their accumulators in memory, one store per FMA (half the speed or less).
#define SPECTUNE_BLOCK __attribute__((noinline))

// ---- a float vector of W lanes: AVX-512 (16), AVX2 + FMA (8), or scalar (1) --------------------------------------
#if defined(__AVX512F__)
constexpr int W = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float x) { return _mm512_set1_ps(x); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vload(const c10::BFloat16* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline vf vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
inline float vmaxall(vf v) { return _mm512_reduce_max_ps(v); }
inline vf vfloor(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline vf vpow2i(vf n) {  // 2^n for integral n in [-126, 127]
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_castsi512_ps(e);
}
inline vf vzero_below(vf r, vf x, float lo) {  // r where x >= lo, else 0 (also 0 where x is -inf or NaN)
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, vset1(lo), _CMP_GE_OQ), r);
}
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define SPECTUNE_HSUM16 1  // the key-block scoring below also needs byte masks
#endif
// The lane sums of 16 vectors as one vector: lane i = sum of v[i]'s lanes (a transpose-and-add tree: 15 adds and 30
// shuffles for 16 sums, where 16 separate reductions take about 64 instructions more).
inline vf vhsum16(const vf* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)  // a[i]: per 128-bit lane j, {v2i[4j]+v2i[4j+2], v2i+1[4j]+.., v2i[4j+1]+.., v2i+1[4j+1]+..}
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // b[i]: per 128-bit lane, partial sums of v[4i..4i+3] in lane order
    __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int i = 0; i < 2; ++i)  // c[i]: 128-bit lanes {b2i.0+b2i.1, b2i.2+b2i.3, b2i+1.0+.., b2i+1.2+..}
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88), _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int W = 8;
using vf = __m256;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset1(float x) { return _mm256_set1_ps(x); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf vload(const c10::BFloat16* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline vf vload_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline float vsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vmaxall(vf v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vf vfloor(vf x) { return _mm256_floor_ps(x); }
inline vf vpow2i(vf n) {
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(e);
}
inline vf vzero_below(vf r, vf x, float lo) { return _mm256_and_ps(r, _mm256_cmp_ps(x, vset1(lo), _CMP_GE_OQ)); }
#else
constexpr int W = 1;
using vf = float;
inline vf vzero() { return 0.f; }
inline vf vset1(float x) { return x; }
inline vf vload(const float* p) { return *p; }
inline void vstore(float* p, vf v) { *p = v; }
inline vf vload(const c10::BFloat16* p) { return static_cast<float>(*p); }
inline vf vload_i8(const int8_t* p) { return static_cast<float>(*p); }
inline vf vfma(vf a, vf b, vf c) { return std::fma(a, b, c); }
inline vf vsub(vf a, vf b) { return a - b; }
inline vf vmul(vf a, vf b) { return a * b; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline float vsum(vf v) { return v; }
inline float vmaxall(vf v) { return v; }
inline vf vfloor(vf x) { return std::floor(x); }
inline vf vpow2i(vf n) { return std::ldexp(1.f, static_cast<int>(n)); }
inline vf vzero_below(vf r, vf x, float lo) { return x >= lo ? r : 0.f; }
#endif

// e^x, lanewise: Cephes' expf (range reduction by ln 2 in two parts, a degree-5 polynomial), relative error about
// 2 ulp over [-87.3, 88.7]; 0 below -87.3 (and for -inf, the masked scores).
inline vf vexp(vf x) {
  const vf xc = vmax(x, vset1(-87.3f));
  vf fx = vfloor(vfma(xc, vset1(1.44269504088896341f), vset1(0.5f)));
  vf r = vsub(xc, vmul(fx, vset1(0.693359375f)));
  r = vsub(r, vmul(fx, vset1(-2.12194440e-4f)));
  vf p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  vf y = vfma(vmul(p, r), r, r);  // p r^2 + r
  y = vfma(y, vset1(1.f), vset1(1.f));
  return vzero_below(vmul(y, vpow2i(fx)), x, -87.3f);
}

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// ---- decode attention ----------------------------------------------------------------------------------------------
#if defined(SPECTUNE_HSUM16)
constexpr int KEY_BLOCK = 16;  // keys scored together (vhsum16)
#else
constexpr int KEY_BLOCK = W;
#endif

// out [R, HV * W] = p [R, T] . v [T, HV * W] * inv [R], RB rows at a time with their accumulators in registers (each
// value row is read once per RB rows). Masked positions (p exactly 0) are skipped, not multiplied: a cache row past
// a shorter sequence's end may hold anything.
template <typename T, int HV, int RB>
SPECTUNE_BLOCK void value_pass(const T* v, const float* p, int64_t Tp, int64_t T_len, int64_t R, const float* inv, T* out) {
  constexpr int64_t hd = HV * W;
  for (int64_t r0 = 0; r0 < R; r0 += RB) {
    const int64_t rb = R - r0 < RB ? R - r0 : RB;
    vf a[RB][HV];
    for (int j = 0; j < RB; ++j)
      for (int h = 0; h < HV; ++h) a[j][h] = vzero();
    for (int64_t t = 0; t < T_len; ++t) {
      vf vv[HV];
      for (int h = 0; h < HV; ++h) vv[h] = vload(v + t * hd + h * W);
      for (int j = 0; j < RB; ++j) {
        if (j >= rb) break;
        const float pj = p[(r0 + j) * Tp + t];
        if (pj == 0.f) continue;
        const vf pv = vset1(pj);
        for (int h = 0; h < HV; ++h) a[j][h] = vfma(pv, vv[h], a[j][h]);
      }
    }
    for (int j = 0; j < RB && j < rb; ++j) {
      float tmp[W];
      for (int h = 0; h < HV; ++h) {
        vstore(tmp, vmul(a[j][h], vset1(inv[r0 + j])));
        for (int i = 0; i < W; ++i) out[(r0 + j) * hd + h * W + i] = static_cast<T>(tmp[i]);
      }
    }
  }
}

// One (sequence, KV head): R query rows (the G query heads sharing the KV head, times the new tokens) against cache
// positions 0..T-1 where the mask allows: scores = q.k / sqrt(hd), softmax over the allowed positions, out = p.v.
// Every position's score, the softmax sums and the output are reduced in an order that depends only on the position
// (keys in fixed blocks of KEY_BLOCK, masked and padded positions contributing exact zeros), so a row's result does
// not depend on T, that is, on the longest sequence in its batch. k, v point at this head's [L, hd] cache rows.
template <typename T>
void attend_one(const T* q, const T* k, const T* v, const bool* mask, T* out, int64_t R, int64_t T_len, int64_t L,
                int64_t hd, float scale, std::vector<float>& qf, std::vector<float>& s, std::vector<float>& acc,
                std::vector<T>& kpad) {
  const int64_t Tp = (T_len + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;  // padded length, a multiple of W too
  const float neg_inf = -std::numeric_limits<float>::infinity();
  qf.resize(R * hd);
  s.assign(R * Tp, neg_inf);
  to_float(q, qf.data(), R * hd);
  for (int64_t t0 = 0; t0 < T_len; t0 += KEY_BLOCK) {  // scores [R, Tp], a block of keys at a time
    const int64_t n = T_len - t0 < KEY_BLOCK ? T_len - t0 : KEY_BLOCK;
    const T* kb = k + t0 * hd;
    if (t0 + KEY_BLOCK > L) {  // the last block runs past the cache: score a zero-padded copy instead
      kpad.assign(KEY_BLOCK * hd, static_cast<T>(0.f));
      std::memcpy(kpad.data(), kb, n * hd * sizeof(T));
      kb = kpad.data();
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = qf.data() + r * hd;
      const bool* mr = mask + r * T_len + t0;
      float* sr = s.data() + r * Tp + t0;
#if defined(SPECTUNE_HSUM16)
      vf part[16];
      for (int j = 0; j < 16; ++j) {
        vf a = vzero();
        for (int64_t i = 0; i < hd; i += W) a = vfma(vload(qr + i), vload(kb + j * hd + i), a);
        part[j] = a;
      }
      const __mmask16 in_range = n == 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
      const __mmask16 keep = _mm_mask_cmpneq_epi8_mask(
          in_range, _mm_maskz_loadu_epi8(in_range, reinterpret_cast<const void*>(mr)), _mm_setzero_si128());
      _mm512_storeu_ps(sr, _mm512_mask_mov_ps(vset1(neg_inf), keep, vmul(vhsum16(part), vset1(scale))));
#else
      for (int64_t j = 0; j < n; ++j) {
        if (!mr[j]) continue;
        vf a = vzero();
        for (int64_t i = 0; i < hd; i += W) a = vfma(vload(qr + i), vload(kb + j * hd + i), a);
        sr[j] = vsum(a) * scale;
      }
#endif
    }
  }
  std::vector<float> inv(R, 0.f);
  for (int64_t r = 0; r < R; ++r) {  // softmax per row, in place: s becomes p (unnormalised), inv[r] = 1 / sum p
    float* sr = s.data() + r * Tp;
    vf vm = vset1(neg_inf);
    for (int64_t t = 0; t < Tp; t += W) vm = vmax(vm, vload(sr + t));
    const float m = vmaxall(vm);
    if (m == neg_inf) {  // no visible position: p = 0 everywhere, so the row's output is 0
      std::fill(sr, sr + Tp, 0.f);
      continue;
    }
    vf vs = vzero();
    for (int64_t t = 0; t < Tp; t += W) {
      const vf p = vexp(vsub(vload(sr + t), vset1(m)));  // exp(-inf) = 0 exactly
      vstore(sr + t, p);
      vs = vfma(p, vset1(1.f), vs);
    }
    inv[r] = 1.f / vsum(vs);
  }
  if (hd == 4 * W) {
    value_pass<T, 4, 4>(v, s.data(), Tp, T_len, R, inv.data(), out);
  } else if (hd == 8 * W) {
    value_pass<T, 8, 2>(v, s.data(), Tp, T_len, R, inv.data(), out);
  } else {
    acc.assign(R * hd, 0.f);
    for (int64_t t = 0; t < T_len; ++t) {  // out [R, hd] = p [R, T] . v [T, hd]: each value row read once
      const T* vt = v + t * hd;
      for (int64_t i = 0; i < hd; i += W) {
        const vf vv = vload(vt + i);
        for (int64_t r = 0; r < R; ++r) {
          const float p = s[r * Tp + t];
          if (p == 0.f) continue;
          float* a = acc.data() + r * hd + i;
          vstore(a, vfma(vset1(p), vv, vload(a)));
        }
      }
    }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < hd; ++i) out[r * hd + i] = static_cast<T>(acc[r * hd + i] * inv[r]);
  }
}

template <typename T>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& vc, const at::Tensor& mask,
                           at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), R = q.size(2), hd = q.size(3);
  const int64_t L = kc.size(2), T_len = mask.size(3);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const T* qp = q.const_data_ptr<T>();
  const T* kp = kc.const_data_ptr<T>();
  const T* vp = vc.const_data_ptr<T>();
  const bool* mp = mask.const_data_ptr<bool>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf, s, acc;
    std::vector<T> kpad;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      attend_one<T>(qp + bh * R * hd, kp + (b * H + h) * L * hd, vp + (b * H + h) * L * hd, mp + b * R * T_len,
                    op + bh * R * hd, R, T_len, L, hd, scale, qf, s, acc, kpad);
    }
  });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& mask) {
  TORCH_CHECK(q.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4 && mask.dim() == 4,
              "decode_attention: q [B, Hkv, R, hd], caches [slots, Hkv, L, hd], mask [B, 1, R, T]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "decode_attention: caches must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "decode_attention: q and caches must share a dtype");
  TORCH_CHECK(mask.scalar_type() == at::kBool, "decode_attention: mask must be bool");
  const int64_t hd = q.size(3);
  TORCH_CHECK(hd % W == 0 && k_cache.size(3) == hd, "decode_attention: head_dim must be a multiple of ", W);
  TORCH_CHECK(q.size(1) == k_cache.size(1) && q.size(0) <= k_cache.size(0), "decode_attention: shape mismatch");
  TORCH_CHECK(mask.size(0) == q.size(0) && mask.size(2) == q.size(2) && mask.size(3) <= k_cache.size(2),
              "decode_attention: mask must be [B, 1, R, T] with T <= the cache length");
  const at::Tensor qc = q.contiguous();
  const at::Tensor mc = mask.expand({q.size(0), 1, q.size(2), mask.size(3)}).contiguous();
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.scalar_type() == at::kBFloat16) {
    decode_attention_impl<c10::BFloat16>(qc, k_cache, v_cache, mc, out);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "decode_attention: bfloat16 or float32 only");
    decode_attention_impl<float>(qc, k_cache, v_cache, mc, out);
  }
  return out;
}

// ---- per-row int8 linear -------------------------------------------------------------------------------------------
// y [M, N] = (x [M, K] . codes [N, K]^T) * scale [N], float32 accumulation; each code row is read once for up to 8
// input rows, so a decode step streams the weights once.
// One block: MB input rows x NB weight rows, accumulators in registers (NB independent FMA chains per input row).
template <typename T, int MB, int NB>
SPECTUNE_BLOCK void int8_block(const float* x, int64_t K, const int8_t* w, const T* scale, T* y, int64_t N) {
  vf acc[MB][NB];
  for (int j = 0; j < MB; ++j)
    for (int c = 0; c < NB; ++c) acc[j][c] = vzero();
  for (int64_t k = 0; k < K; k += W) {
    vf wv[NB];
    if (k % 64 < W)  // the next block's weights, one cache line per row ahead of their use
      for (int c = 0; c < NB; ++c) __builtin_prefetch(w + (NB + c) * K + k);
    for (int c = 0; c < NB; ++c) wv[c] = vload_i8(w + c * K + k);
    for (int j = 0; j < MB; ++j) {
      const vf xv = vload(x + j * K + k);
      for (int c = 0; c < NB; ++c) acc[j][c] = vfma(xv, wv[c], acc[j][c]);
    }
  }
  for (int j = 0; j < MB; ++j)
    for (int c = 0; c < NB; ++c) y[j * N + c] = static_cast<T>(vsum(acc[j][c]) * static_cast<float>(scale[c]));
}

template <typename T, int NB>
inline void int8_rows(const float* x, int64_t M, int64_t K, const int8_t* w, const T* scale, T* y, int64_t N) {
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) int8_block<T, 2, NB>(x + m * K, K, w, scale, y + m * N, N);
  if (m < M) int8_block<T, 1, NB>(x + m * K, K, w, scale, y + m * N, N);
}

#if defined(__AVX512BW__)
#define SPECTUNE_INT16_DOT 1
constexpr int64_t I16_MAX_K = 8192;  // |x| <= 16383, |w| <= 127: a lane's int32 sum stays under 2^31 up to here
constexpr float I16_RANGE = 16383.f;
// How far ahead in a weight stream the int8 and int4 linears prefetch, bytes: the hardware prefetcher alone left them
// waiting on memory (docs/engine.md, "spectune's CPU kernels": against PyTorch's kernels in one run of
// benchmarks/cpu_kernels.py, the int4 linear went from 1.64x to 2.69x at 1 row and from 1.96x to 2.22x at 8, the
// lm_head from 2.33x to 3.20x at 1 row; 8 to 24 KiB ahead did alike).
constexpr int64_t PREFETCH_BYTES = 16384;
inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }

// acc += the products of each 32-bit lane's two int16 pairs of a and b, summed (vpdpwssd with AVX512-VNNI).
inline __m512i dot_i16(__m512i acc, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

// The int16 variant: each input row quantized to int16 with one scale (max |x| / 16383: an error of at most 1/32766
// of the row's largest input, well under bf16's own 1/256), then exact int32 dot products, 32 products per
// instruction (vpmaddwd, or vpdpwssd with AVX512-VNNI), against 16 per FMA in float32.
template <typename T, int NB>
SPECTUNE_BLOCK void i16_row(const int16_t* x, float xs, int64_t K, const int8_t* w, const T* scale, T* y) {
  __m512i acc[NB];
  for (int c = 0; c < NB; ++c) acc[c] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 32) {
    if ((k & 63) == 0)  // one cache line per weight row, PREFETCH_BYTES ahead of its use
      for (int c = 0; c < NB; ++c) prefetch(w + c * K + k + PREFETCH_BYTES);
    const __m512i xv = _mm512_loadu_si512(reinterpret_cast<const void*>(x + k));
    for (int c = 0; c < NB; ++c) {
      const __m512i wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * K + k)));
      acc[c] = dot_i16(acc[c], xv, wv);
    }
  }
  for (int c = 0; c < NB; ++c)
    y[c] = static_cast<T>(static_cast<float>(_mm512_reduce_add_epi32(acc[c])) * xs * static_cast<float>(scale[c]));
}

// MB input rows against NB weight rows: each block of weights widened to int16 once in registers for all MB rows
// (the same exact integer sums as i16_row, so a row's output does not depend on the rows beside it).
template <typename T, int MB, int NB>
SPECTUNE_BLOCK void i16_block(const int16_t* x, const float* xs, int64_t K, const int8_t* w, const T* scale, T* y,
                              int64_t N) {
  __m512i acc[MB][NB];
  for (int j = 0; j < MB; ++j)
    for (int c = 0; c < NB; ++c) acc[j][c] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 32) {
    if ((k & 63) == 0)
      for (int c = 0; c < NB; ++c) prefetch(w + c * K + k + PREFETCH_BYTES);
    __m512i wv[NB];
    for (int c = 0; c < NB; ++c)
      wv[c] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * K + k)));
    for (int j = 0; j < MB; ++j) {
      const __m512i xv = _mm512_loadu_si512(reinterpret_cast<const void*>(x + j * K + k));
      for (int c = 0; c < NB; ++c) acc[j][c] = dot_i16(acc[j][c], xv, wv[c]);
    }
  }
  for (int j = 0; j < MB; ++j)
    for (int c = 0; c < NB; ++c)
      y[j * N + c] = static_cast<T>(static_cast<float>(_mm512_reduce_add_epi32(acc[j][c])) * xs[j] *
                                    static_cast<float>(scale[c]));
}

// M input rows against NB weight rows, 2 at a time (NB x 2 accumulators; the weights stay in L1 between passes).
template <typename T, int NB>
inline void i16_rows(const int16_t* x, const float* xs, int64_t M, int64_t K, const int8_t* w, const T* scale, T* y,
                     int64_t N) {
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) i16_block<T, 2, NB>(x + m * K, xs + m, K, w, scale, y + m * N, N);
  if (m < M) i16_row<T, NB>(x + m * K, xs[m], K, w, scale, y + m * N);
}
#endif

// y [M, N] = (x [M, K] . codes [N, K]^T) * scale [N], float32 accumulation. Blocks of NB weight rows x 2 input rows:
// a block's weights (NB x K bytes) stay in L1 while every input row passes, so a step streams the weights once.
template <typename T>
void int8_linear_impl(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, at::Tensor& y) {
  constexpr int NB = W == 16 ? 8 : 4;
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  std::vector<float> xf(M * K);
  to_float(x.const_data_ptr<T>(), xf.data(), M * K);
  const int8_t* w = codes.const_data_ptr<int8_t>();
  const T* sc = scale.const_data_ptr<T>();
  T* yp = y.data_ptr<T>();
#if defined(SPECTUNE_INT16_DOT)
  if (K % 32 == 0 && K <= I16_MAX_K) {
    constexpr int NB16 = 8;
    std::vector<int16_t> xq(M * K);
    std::vector<float> xs(M);
    for (int64_t m = 0; m < M; ++m) {  // per-row int16 quantization
      float amax = 0.f;
      for (int64_t k = 0; k < K; ++k) amax = std::fmax(amax, std::fabs(xf[m * K + k]));
      const float q = amax > 0.f ? I16_RANGE / amax : 0.f;
      xs[m] = amax > 0.f ? amax / I16_RANGE : 0.f;
      for (int64_t k = 0; k < K; ++k) xq[m * K + k] = static_cast<int16_t>(std::nearbyint(xf[m * K + k] * q));
    }
    at::parallel_for(0, (N + NB16 - 1) / NB16, 32, [&](int64_t begin, int64_t end) {
      for (int64_t nb = begin; nb < end; ++nb) {
        const int64_t n = nb * NB16;
        if (n + NB16 <= N) {
          i16_rows<T, NB16>(xq.data(), xs.data(), M, K, w + n * K, sc + n, yp + n, N);
        } else {
          for (int64_t c = n; c < N; ++c)
            i16_rows<T, 1>(xq.data(), xs.data(), M, K, w + c * K, sc + c, yp + c, N);
        }
      }
    });
    return;
  }
#endif
  at::parallel_for(0, (N + NB - 1) / NB, 32, [&](int64_t begin, int64_t end) {
    for (int64_t nb = begin; nb < end; ++nb) {
      const int64_t n = nb * NB;
      if (n + NB <= N) {
        int8_rows<T, NB>(xf.data(), M, K, w + n * K, sc + n, yp + n, N);
      } else {
        for (int64_t c = n; c < N; ++c) int8_rows<T, 1>(xf.data(), M, K, w + c * K, sc + c, yp + c, N);
      }
    }
  });
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale) {
  TORCH_CHECK(x.dim() == 2 && codes.dim() == 2 && scale.dim() == 1, "int8_linear: x [M, K], codes [N, K], scale [N]");
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.is_contiguous(), "int8_linear: codes must be contiguous int8");
  TORCH_CHECK(x.size(1) == codes.size(1) && scale.size(0) == codes.size(0), "int8_linear: shape mismatch");
  TORCH_CHECK(x.size(1) % W == 0, "int8_linear: in_features must be a multiple of ", W);
  TORCH_CHECK(scale.scalar_type() == x.scalar_type(), "int8_linear: scale must have x's dtype");
  const at::Tensor xc = x.contiguous(), sc = scale.contiguous();
  at::Tensor y = at::empty({x.size(0), codes.size(0)}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    int8_linear_impl<c10::BFloat16>(xc, codes, sc, y);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "int8_linear: bfloat16 or float32 only");
    int8_linear_impl<float>(xc, codes, sc, y);
  }
  return y;
}

// ---- int4 linear on int16 activations ------------------------------------------------------------------------------
// The native path's 4-bit weights, W[n, k] = s * code + m per group of 32 inputs (code 0..15), against inputs
// quantized per row and group of 32 to int16 (a = d * q, d = max |a| / 32767, round to nearest even: an error of at
// most 1/65534 of the group's largest input, under bf16's own rounding of the input), in the manner of llama.cpp's
// CPU backend, which multiplies Q4_1 weights by int8 (Q8_1) activations (ggml/src/ggml-cpu/arch/x86/quants.c,
// ggml_vec_dot_q4_1_q8_1):
//   y[n] = sum over groups g of  s[g, n] * d[g] * (sum_k code[k, n] q[k])  +  m[g, n] * d[g] * (sum_k q[k]),
// that is exactly W . (d q): the inner sums exact in int32 (vpdpwssd with AVX512-VNNI: 32 products an instruction,
// against one float FMA per weight and row when each weight is dequantized, as PyTorch's kernel does), the group
// terms accumulated in float32 from g = 0, so a row's result depends only on that row. int8 inputs (llama.cpp's) halve
// the instructions again but moved SmolLM2's logits by up to 18.9% of the largest one (docs/engine.md).
// Layout per block of 32 output columns and group of 32 inputs, 640 bytes (quant.pack_int4_blocks): 8 chunks of 64
// bytes; bytes 32h + 2n + b of chunk j (h, b in {0, 1}, n < 16) hold input 4j + 2h + b of column n (low nibble) and of
// column 16 + n (high nibble), so widened to int16 each 32-byte half gives one input pair per column in each 32-bit
// lane; then s of columns 0-31 and m of columns 0-31 as float16 (GGUF's d and m are float16, so Q4_0, Q4_1 and Q8_0
// weights are kept exactly).
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define SPECTUNE_INT4 1
constexpr int64_t Q4_BLOCK_BYTES = 640;
constexpr int Q4_ROWS = 8;  // input rows per pass over a column block: 16 int32 accumulators, the float ones in L1
constexpr float Q16_RANGE = 32767.f;

// x [K] -> q int16 [K], d [K/32] (scale), sum [K/32]: d x the sum of the group's q, as quantize_row_q8_1 sets Q8_1's
// s in the same llama.cpp file. The m term then sees the same quantized inputs as the code term, so y is exactly
// W . (d q); with the exact float sum instead, codes that carry an offset, like Q8_0's high halves 16 d (hi + 8) - 128 d,
// leave 128 x the inputs' rounding error.
inline void quantize_row_q16(const float* x, int64_t K, int16_t* q, float* d, float* sum) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t g = 0; g < K / 32; ++g) {
    const __m512 a0 = _mm512_loadu_ps(x + 32 * g), a1 = _mm512_loadu_ps(x + 32 * g + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(a0, abs_mask), _mm512_and_ps(a1, abs_mask)));
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? Q16_RANGE / amax : 0.f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, inv));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * g), _mm512_cvtsepi32_epi16(q0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * g + 16), _mm512_cvtsepi32_epi16(q1));
    d[g] = amax / Q16_RANGE;
    sum[g] = d[g] * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
  }
}

// BM input rows against one block of 32 columns: q [BM, K] int16, d and sum [BM, K/32]; c [BM, ldc] gets 32 outputs.
template <typename T, int BM>
SPECTUNE_BLOCK void int4_block(const int16_t* q, const float* d, const float* sum, int64_t K, const uint8_t* b, T* c,
                               int64_t ldc) {
  const int64_t G = K / 32;
  alignas(64) __m512 acc[BM][2];  // float accumulators: registers go to the int32 dot products
  for (int r = 0; r < BM; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(15);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* blk = b + g * Q4_BLOCK_BYTES;
    for (int p = 0; p < Q4_BLOCK_BYTES / 64; ++p)
      prefetch(blk + PREFETCH_BYTES + 64 * p);
    __m512i dot[BM][2];  // [row][columns 0-15, 16-31]
    for (int r = 0; r < BM; ++r) dot[r][0] = dot[r][1] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {  // chunk j: input pairs 2j (bytes 0-31) and 2j + 1 (bytes 32-63)
      const __m512i v = _mm512_loadu_si512(reinterpret_cast<const void*>(blk + 64 * j));
      const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      const __m512i l0 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(lo));
      const __m512i l1 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(lo, 1));
      const __m512i h0 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(hi));
      const __m512i h1 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(hi, 1));
      for (int r = 0; r < BM; ++r) {
        int32_t p0, p1;
        std::memcpy(&p0, q + r * K + 32 * g + 4 * j, 4);
        std::memcpy(&p1, q + r * K + 32 * g + 4 * j + 2, 4);
        const __m512i a0 = _mm512_set1_epi32(p0), a1 = _mm512_set1_epi32(p1);
        dot[r][0] = dot_i16(dot_i16(dot[r][0], l0, a0), l1, a1);
        dot[r][1] = dot_i16(dot_i16(dot[r][1], h0, a0), h1, a1);
      }
    }
    const __m256i* sm = reinterpret_cast<const __m256i*>(blk + 512);
    const __m512 s0 = _mm512_cvtph_ps(_mm256_loadu_si256(sm)), s1 = _mm512_cvtph_ps(_mm256_loadu_si256(sm + 1));
    const __m512 m0 = _mm512_cvtph_ps(_mm256_loadu_si256(sm + 2)), m1 = _mm512_cvtph_ps(_mm256_loadu_si256(sm + 3));
    for (int r = 0; r < BM; ++r) {
      const __m512 dr = _mm512_set1_ps(d[r * G + g]), sr = _mm512_set1_ps(sum[r * G + g]);
      acc[r][0] = _mm512_fmadd_ps(m0, sr, _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][0]), _mm512_mul_ps(s0, dr), acc[r][0]));
      acc[r][1] = _mm512_fmadd_ps(m1, sr, _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][1]), _mm512_mul_ps(s1, dr), acc[r][1]));
    }
  }
  for (int r = 0; r < BM; ++r) {
    alignas(64) float out[32];
    _mm512_store_ps(out, acc[r][0]);
    _mm512_store_ps(out + 16, acc[r][1]);
    for (int j = 0; j < 32; ++j) c[r * ldc + j] = static_cast<T>(out[j]);
  }
}

template <typename T>
void int4_linear_impl(const at::Tensor& x, const at::Tensor& blocks, at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1), G = K / 32;
  std::vector<float> xf(M * K), d(M * G), sum(M * G);
  std::vector<int16_t> q(M * K);
  to_float(x.const_data_ptr<T>(), xf.data(), M * K);
  for (int64_t m = 0; m < M; ++m)
    quantize_row_q16(xf.data() + m * K, K, q.data() + m * K, d.data() + m * G, sum.data() + m * G);
  const uint8_t* b = blocks.const_data_ptr<uint8_t>();
  T* yp = y.data_ptr<T>();
  at::parallel_for(0, N / 32, 4, [&](int64_t begin, int64_t end) {
    for (int64_t nb = begin; nb < end; ++nb) {
      const uint8_t* bb = b + nb * G * Q4_BLOCK_BYTES;
      for (int64_t m = 0; m < M; m += Q4_ROWS) {
        const int16_t* qm = q.data() + m * K;
        const float *dm = d.data() + m * G, *sm = sum.data() + m * G;
        T* c = yp + m * N + nb * 32;
        switch (M - m < Q4_ROWS ? M - m : Q4_ROWS) {
          case 1: int4_block<T, 1>(qm, dm, sm, K, bb, c, N); break;
          case 2: int4_block<T, 2>(qm, dm, sm, K, bb, c, N); break;
          case 3: int4_block<T, 3>(qm, dm, sm, K, bb, c, N); break;
          case 4: int4_block<T, 4>(qm, dm, sm, K, bb, c, N); break;
          case 5: int4_block<T, 5>(qm, dm, sm, K, bb, c, N); break;
          case 6: int4_block<T, 6>(qm, dm, sm, K, bb, c, N); break;
          case 7: int4_block<T, 7>(qm, dm, sm, K, bb, c, N); break;
          default: int4_block<T, 8>(qm, dm, sm, K, bb, c, N); break;
        }
      }
    }
  });
}
#endif

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& blocks) {
#if defined(SPECTUNE_INT4)
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 3, "int4_linear: x [M, K], blocks [N/32, K/32, 640]");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.size(2) == Q4_BLOCK_BYTES,
              "int4_linear: blocks must be contiguous uint8 [N/32, K/32, 640]");
  const int64_t K = x.size(1);
  TORCH_CHECK(K % 32 == 0 && blocks.size(1) == K / 32, "int4_linear: shape mismatch");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({x.size(0), blocks.size(0) * 32}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    int4_linear_impl<c10::BFloat16>(xc, blocks, y);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "int4_linear: bfloat16 or float32 only");
    int4_linear_impl<float>(xc, blocks, y);
  }
  return y;
#else
  TORCH_CHECK(false, "int4_linear: built without AVX-512 BW (use PyTorch's int4 kernel here)");
  return x;
#endif
}

bool has_int4_linear() {
#if defined(SPECTUNE_INT4)
  return true;
#else
  return false;
#endif
}

int64_t vector_width() { return W; }

}  // namespace

TORCH_LIBRARY(spectune, m) {
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor mask) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor codes, Tensor scale) -> Tensor");
  m.def("int4_linear(Tensor x, Tensor blocks) -> Tensor");
  m.def("has_int4_linear() -> bool", &has_int4_linear);
  m.def("vector_width() -> int", &vector_width);
}

TORCH_LIBRARY_IMPL(spectune, CPU, m) {
  m.impl("decode_attention", &decode_attention);
  m.impl("int8_linear", &int8_linear);
  m.impl("int4_linear", &int4_linear);
}
