// The MDL controller (Algorithm 1) for float32 on the CPU, as one XLA FFI kernel.
//
// Why it exists: the pure-JAX batched path (mdl_jax/controller/api.py) tops out near 1.2-1.4e7 decisions/s on the
// 2-core dev VM. XLA:CPU splits the per-record graph into ~30 fusions and library calls, each streaming
// (chunk, 16) intermediates through the cache, and zero-fills every output before the loop. Here one
// pass per block of L records (16 with AVX-512, 8 with AVX2) keeps everything in registers (records
// across the SIMD lanes) and writes
// each output exactly once, on every thread of XLA's intra-op pool.
//
// It computes exactly what mdl_jax/controller/decision.py:decide_one computes, for D = 16 and any numeric config
// and ablation switches; the Python side (mdl_jax/engines/native.py) packs the config into `params` with the
// same float32 arithmetic as weight_matrices(), and tests/test_native.py checks parity with the pure-JAX
// path. 2^x and tanh are polynomials (≈1 ulp; see exp2_v) so the loops vectorise without libmvec or
// -ffast-math; they differ from XLA's own approximations by a few ulp. With orthogonal subspaces the
// fusion uses the projectors' structure (fuse), which rounds differently from the dense W_k of
// decide_one: outputs agree to ~2e-7 of their scale (tests/test_native.py checks ≤ 2e-6).
//
// The same file holds the sweep's native pass (mdl_sweep_f32, below): configs × records with the per-config
// weighted reductions sweep() needs, sharing the fusion between configs that differ only in the read-out.
//
// Built on first use by mdl_jax/engines/native.py (g++ -O3 -march=native, per ISA variant), never at import.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <mutex>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <time.h>
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Records per block = float32 lanes of one vector register: 16 for AVX-512 (zmm), 8 for AVX2 (ymm).
// native.py passes -DMDL_LANES per ISA variant; without it, 8 where the widest vectors are 256-bit.
#ifndef MDL_LANES
#if defined(__AVX2__) && !defined(__AVX512F__)
#define MDL_LANES 8
#else
#define MDL_LANES 16
#endif
#endif
static_assert(MDL_LANES == 8 || MDL_LANES == 16, "MDL_LANES must be 8 or 16");

constexpr int D = 16;  // value-vector dimension (the kernel is only used when cfg.D == 16)
constexpr int L = MDL_LANES;
constexpr int kIB = 4;  // fusion outputs computed together (see fuse)

// Layout of the float32 `params` buffer; mdl_jax/engines/native.py:_pack writes the same order.
struct Params {
  float centres[D];
  float inv_two_sigma2;  // 1 / (2 σ²)
  float W[3][D][D];      // eq. (1): W_k = s_k Π_k + ε_c Σ_{j≠k} Π_j, [k][i][j]
  float bias[D];
  float gA_a, gA_b;      // g_A = a + b·mean(v_a)
  float g_a, g_b;        // C_final = C·(g_a + g_b α)
  float theta[3];
  float n_min, n_max;
  float Q[D][D];         // basis Q[j][i]: coordinate i of v is Σ_j Q[j][i] v[j]
  float coef[D];         // s_k - ε_c for the subspace k that basis vector i spans (see fuse)
  float eps_c;           // ε_c
  float d_wm, d_r;       // the subspace dims as floats (exact), for the sweep (decide has them as attrs)
};
constexpr int64_t kParams = sizeof(Params) / sizeof(float);
static_assert(sizeof(Params) == 1085 * sizeof(float), "Params must be packed floats");

// Ablation switches (bit flags; mdl_jax/engines/native.py:_flags).
constexpr int64_t kValueEncoding = 1, kRiskInversion = 2, kRiskModulation = 4, kAlphaGating = 8,
                  kQR = 16;

// L float32 lanes (one record each) as a GCC/Clang vector-extension type: explicit SIMD that lowers to
// one register of the ISA it is built for (native.py: one build per ISA, MDL_LANES = 16 for AVX-512,
// 8 for AVX2), without intrinsics except where noted. Why not 16 lanes everywhere: built for AVX2, a
// 64-byte type is split over two ymm registers, GCC lowered its selects and min/max lane by lane
// (scalar vcmpltss / vminss), register pressure doubled and spilled, and the one-output-at-a-time
// FMA chains left the core waiting: 875 cycles per record on a Zen 3, ~970 for that build on
// the dev VM's AVX-512 Xeon; 8 lanes and the changes marked below: ~270 there.
typedef float vf __attribute__((vector_size(4 * L), aligned(4 * L)));
typedef int32_t vi __attribute__((vector_size(4 * L), aligned(4 * L)));

inline vf splat(float x) { return vf{} + x; }
inline vf loadu(const float* p) { vf r; std::memcpy(&r, p, sizeof r); return r; }
inline void storeu(float* p, vf x) { std::memcpy(p, &x, sizeof x); }
inline void storeu(int32_t* p, vi x) { std::memcpy(p, &x, sizeof x); }
// min/max with the semantics of `a < b ? a : b` / `a > b ? a : b` (b when either is NaN or both are
// zeros), which are exactly x86's MINPS/MAXPS: one instruction, where GCC otherwise emits a compare
// and a blend (AVX2) for the select.
#if defined(__AVX512F__) && MDL_LANES == 16
inline vf vmin(vf a, vf b) { return (vf)_mm512_min_ps((__m512)a, (__m512)b); }
inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
#elif defined(__AVX__) && MDL_LANES == 8
inline vf vmin(vf a, vf b) { return (vf)_mm256_min_ps((__m256)a, (__m256)b); }
inline vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)a, (__m256)b); }
#else
inline vf vmin(vf a, vf b) { return a < b ? a : b; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
#endif

// The gate C·(g_a + g_b·α) with the product rounded on its own, as every other path computes it
// (decision.py: uncontracted): g++ -O3 contracts g_b·α + g_a into one FMA (one rounding), which put
// a C_final that lies exactly on θ on the other side of it than decide_one. The empty asm takes the
// product through memory, so the compiler cannot fuse it with the add.
inline vf gate_v(vf C, float g_a, float g_b, vf alpha) {
  vf p = g_b * alpha;
  __asm__ volatile("" : "+m"(p));
  return C * (g_a + p);
}

// 2^t for float32, t in [-126, 126] (callers clamp): t = n + f with n = round(t) and |f| ≤ 1/2 by the
// 1.5·2^23 trick, a degree-6 polynomial for 2^f (a relative fit, 3e-9 in exact arithmetic; ≈1 ulp in
// float32), scaled by 2^n through the exponent bits. Why 2^t and not Cephes' e^x (which this kernel
// used before): the callers fold log2(e) into a constant they multiply by anyway, and with the
// bias 127 inside the magic number the exponent bits are one shift of the rounded sum, so 11 vector
// operations instead of 17 (64 of them per record: the largest block of work after the fusion).
// Folding log2(e) moves t by an ulp of |t|, a relative error ≤ 2^-24·|t|·ln 2 of 2^t, i.e. an
// absolute error below 3e-8 for the Gaussians (2^t·|t| ≤ 0.54) and the tanh (see tanh_v).
inline vf exp2_v(vf t) {
  const float kMagic = 12583039.0f;  // 1.5·2^23 + 127: tm's low mantissa bits are round(t) + 127
  const vf tm = t + kMagic;
  const vf f = t - (tm - kMagic);    // exact: tm - kMagic is round(t)
  vf p = splat(1.5345812e-4f);
  p = p * f + 1.3399931e-3f;
  p = p * f + 9.6184891e-3f;
  p = p * f + 5.5503286e-2f;
  p = p * f + 2.4022646e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.0f;
  const vi e = (vi)tm << 23;         // (round(t) + 127) << 23: the bits of 2^round(t)
  return p * (vf)e;                  // a cast between same-size vector types reinterprets the bits
}

// tanh for float32 (Cephes tanhf): odd polynomial below |x| = 0.625 (no cancellation near 0),
// 1 - 2/(e^{2|x|} + 1) above, sign restored; both computed, then selected. e^{2|x|} = 2^{2|x|·log2 e},
// clamped to 2^126, where 1 - 2/(e + 1) is already 1. The polynomial is 5% of the kernel's time, and
// needed: without it tanh is accurate to an ulp of 1, not of tanh x, and α (a cosine, so blind to
// scale) moved by 3e-6 for configs whose v_meta is small (small gains, narrow σ).
inline vf tanh_v(vf x) {
  vf ax = x < 0.0f ? -x : x;
  vf z = x * x;
  vf small = ((((z * -5.70498872745e-3f + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
               1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  vf big = 1.0f - 2.0f / (exp2_v(vmin(ax * 2.88539008178f, splat(126.0f))) + 1.0f);
  big = x < 0.0f ? -big : big;
  return ax < 0.625f ? small : big;
}

inline vf sqrt_v(vf x) {
  vf r;
  for (int l = 0; l < L; ++l) r[l] = __builtin_sqrtf(x[l]);  // GCC emits one vsqrtps
  return r;
}

#if MDL_LANES == 8 && defined(__AVX__)
// out[l * D + i] = x[i][l] for 8 components i (8 × 8 transpose; row stride D floats).
inline void store_transposed8(const vf* x, float* out) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = (__m256)x[i];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int l = 0; l < 4; ++l) {
    _mm256_storeu_ps(out + l * D, _mm256_permute2f128_ps(r[l], r[l + 4], 0x20));
    _mm256_storeu_ps(out + (l + 4) * D, _mm256_permute2f128_ps(r[l], r[l + 4], 0x31));
  }
}

// out[3 l + k] = e[k][l] for 8 records: 24 contiguous floats, three stores.
inline void store_energies8(const vf* e, float* out) {
  const __m256 e0 = (__m256)e[0], e1 = (__m256)e[1], e2 = (__m256)e[2];
  // position p of the 24 comes from record p / 3 of e[p % 3]
  const __m256i idx[3] = {_mm256_setr_epi32(0, 0, 0, 1, 1, 1, 2, 2), _mm256_setr_epi32(2, 3, 3, 3, 4, 4, 4, 5),
                          _mm256_setr_epi32(5, 5, 6, 6, 6, 7, 7, 7)};
  const __m256 p0[3] = {_mm256_permutevar8x32_ps(e0, idx[0]), _mm256_permutevar8x32_ps(e1, idx[0]),
                        _mm256_permutevar8x32_ps(e2, idx[0])};
  const __m256 p1[3] = {_mm256_permutevar8x32_ps(e0, idx[1]), _mm256_permutevar8x32_ps(e1, idx[1]),
                        _mm256_permutevar8x32_ps(e2, idx[1])};
  const __m256 p2[3] = {_mm256_permutevar8x32_ps(e0, idx[2]), _mm256_permutevar8x32_ps(e1, idx[2]),
                        _mm256_permutevar8x32_ps(e2, idx[2])};
  // then each position from its own e[k]: blend masks of the positions with p % 3 == 1 and == 2
  _mm256_storeu_ps(out, _mm256_blend_ps(_mm256_blend_ps(p0[0], p0[1], 0x92), p0[2], 0x24));
  _mm256_storeu_ps(out + 8, _mm256_blend_ps(_mm256_blend_ps(p1[0], p1[1], 0x24), p1[2], 0x49));
  _mm256_storeu_ps(out + 16, _mm256_blend_ps(_mm256_blend_ps(p2[0], p2[1], 0x49), p2[2], 0x92));
}
#endif

struct Outputs {
  int32_t* action;
  float *C, *alpha, *C_final, *v_meta, *energies, *norm, *g_A;
};

// What a call derives from its Params once, before any record: the basis in every lane, and the
// Gaussians' constant. Why a splatted copy: AVX2 has no broadcast memory operand (AVX-512 has), so
// every Q[j][i]·v took a vbroadcastss and an FMA, 1,195 broadcasts of the 5,783 instructions a block
// of 8 records ran (callgrind); from a splatted copy each is one FMA with a memory operand.
// 8 KiB (AVX2) or 16 KiB (AVX-512), in L1 while the call's records stream past.
struct Prep {
  vf Q[D][D];  // Q[j][i] in every lane
  float k2;    // -log2(e) / (2σ²): the Gaussians are 2^(k2·d²)
  int d_wm, d_r;  // coordinates [0, d_wm): memory subspace (g_A scales it), [d_wm, d_wm + d_r): reliability
};

inline void prepare(const Params& P, Prep& q) {
  for (int j = 0; j < D; ++j)
    for (int i = 0; i < D; ++i) q.Q[j][i] = splat(P.Q[j][i]);
  q.k2 = -P.inv_two_sigma2 * 1.44269504088896341f;
  q.d_wm = static_cast<int>(P.d_wm);
  q.d_r = static_cast<int>(P.d_r);
}

// Stages 1-4 up to the read-out for L records in lanes (`s`: M, R, A; the risk is inverted here when
// the switch is on): v_meta, ‖v_meta‖² and ‖v_meta‖, α and g_A. Shared by decide and the sweep, so both
// compute the same bits.
struct Fused {
  vf vm[D];
  vf sq, n, alpha, gA;
};

__attribute__((always_inline)) inline void fuse(const Params& P, const Prep& q, int64_t flags, vf s[3],
                                                Fused& f) {
  if (flags & kRiskInversion) s[2] = 1.0f - s[2];

  // Stage 1, value encoding: v_k[j] = s_k + exp(-(s_k - c_j)² / 2σ²), as 2^(k2·d²) (see exp2_v). The
  // clamp at 2^-126 keeps the exponent bits finite (σ small, or an unvalidated s far outside [0, 1])
  // and turns a NaN or ±inf signal into a finite number (such lanes are Opt-Out, see decide_block).
  vf v[3][D];
  if (flags & kValueEncoding) {
    const vf k2 = splat(q.k2), lo = splat(-126.0f);
    for (int k = 0; k < 3; ++k) {
#pragma GCC unroll 16
      for (int j = 0; j < D; ++j) {
        const vf d = s[k] - P.centres[j];
        v[k][j] = s[k] + exp2_v(vmax((d * d) * k2, lo));
      }
    }
  } else {
    for (int k = 0; k < 3; ++k)
      for (int j = 0; j < D; ++j) v[k][j] = s[k];
  }
  // Risk gain from the (inverted) risk encoding.
  vf gA = splat(1.0f);
  if (flags & kRiskModulation) {
    vf acc = splat(0.0f);
    for (int j = 0; j < D; ++j) acc += v[2][j];
    gA = P.gA_a + P.gA_b * (acc / float(D));
  }
  // Stages 2-3, fusion: v_meta = tanh(g_A W_wm v_wm + W_r v_r + W_a v_a + b).
  vf* vm = f.vm;
  if (flags & kQR) {
    // With orthogonal subspaces Σ_k Π_k = I, so eq. (1) is W_k = ε_c I + (s_k - ε_c) Π_k, and with
    // Π_k = Σ_{i in k} q_i q_iᵀ (q_i: basis column i)
    //   u = ε_c (g_A v_wm + v_r + v_a) + Σ_i q_i y_i,  y_i = c_k (s_k - ε_c) (q_iᵀ v_k), k the subspace of i,
    // (c = g_A for the memory pathway, 1 for the others): 2·16² FMAs where the dense W_k took 3·16²,
    // the same map up to float32 rounding (the dense product rounds ΣΠ; parity with decide_one is
    // tested). kIB outputs at a time: independent FMA chains (4-cycle latency each) keep both FMA
    // units busy, and each operand is loaded once per kIB outputs.
    const int e1 = q.d_wm, e2 = q.d_wm + q.d_r;
    vf y[D];
    for (int i0 = 0; i0 < D; i0 += kIB) {
      vf t[kIB];
      const vf* src[kIB];
      for (int b = 0; b < kIB; ++b) {
        const int i = i0 + b;
        t[b] = splat(0.0f);
        src[b] = v[i < e1 ? 0 : i < e2 ? 1 : 2];
      }
#pragma GCC unroll 16
      for (int j = 0; j < D; ++j)
        for (int b = 0; b < kIB; ++b) t[b] += q.Q[j][i0 + b] * src[b][j];
      for (int b = 0; b < kIB; ++b) {
        const int i = i0 + b;
        y[i] = i < e1 ? (gA * P.coef[i]) * t[b] : P.coef[i] * t[b];
      }
    }
    for (int m0 = 0; m0 < D; m0 += kIB) {
      vf t[kIB];
      for (int b = 0; b < kIB; ++b) {
        const int m = m0 + b;
        t[b] = P.eps_c * (gA * v[0][m] + (v[1][m] + v[2][m])) + P.bias[m];
      }
#pragma GCC unroll 16
      for (int i = 0; i < D; ++i)
        for (int b = 0; b < kIB; ++b) t[b] += q.Q[m0 + b][i] * y[i];
      for (int b = 0; b < kIB; ++b) vm[m0 + b] = t[b];
    }
  } else {
    // Identity "subspaces" (ablation): the dense W_k (here (s_k + 2ε_c) I), one output column at a
    // time as before.
    for (int i0 = 0; i0 < D; i0 += kIB) {
      vf t0[kIB], t12[kIB];
      for (int b = 0; b < kIB; ++b) {
        t0[b] = splat(0.0f);
        t12[b] = splat(P.bias[i0 + b]);
      }
#pragma GCC unroll 16
      for (int j = 0; j < D; ++j) {
        const vf a = v[0][j], r = v[1][j], w = v[2][j];
        for (int b = 0; b < kIB; ++b) {
          t0[b] += P.W[0][i0 + b][j] * a;
          t12[b] += P.W[1][i0 + b][j] * r + P.W[2][i0 + b][j] * w;
        }
      }
      for (int b = 0; b < kIB; ++b) vm[i0 + b] = gA * t0[b] + t12[b];
    }
  }
  for (int i = 0; i < D; ++i) vm[i] = tanh_v(vm[i]);  // independent: they overlap
  // Stage 4, read-out (eq. 2): the norms and α.
  vf sq = splat(0.0f), sq_wm = splat(0.0f), dot = splat(0.0f);
  for (int i = 0; i < D; ++i) {
    sq += vm[i] * vm[i];
    sq_wm += v[0][i] * v[0][i];
    dot += v[0][i] * vm[i];
  }
  const vf zero = splat(0.0f), one = splat(1.0f);
  vf n = sq > 0.0f ? sqrt_v(sq) : zero;  // ‖v‖ = 0 exactly at v = 0 (as safe_norm)
  vf n_wm = sq_wm > 0.0f ? sqrt_v(sq_wm) : zero;
  vf denom = n * n_wm;
  vf alpha = denom > 0.0f ? dot / (denom > 0.0f ? denom : one) : zero;  // α = 0 where undefined
  f.alpha = vmax(vmin(alpha, one), -one);
  f.sq = sq;
  f.n = n;
  f.gA = gA;
}

// One block of up to L records starting at `base`: records across the lanes, so every arithmetic
// line below is one SIMD instruction for L records.
void decide_block(const Params& P, const Prep& q, int64_t flags, const float* Mp, const float* Rp,
                  const float* Ap, int64_t base, int cnt, const Outputs& o) {
  vf s[3];
  if (cnt == L) {
    s[0] = loadu(Mp + base);
    s[1] = loadu(Rp + base);
    s[2] = loadu(Ap + base);
  } else {
    // Tail block: pad with 0.5 (any valid value); only the first `cnt` lanes are stored.
    for (int k = 0; k < 3; ++k) s[k] = splat(0.5f);
    for (int l = 0; l < cnt; ++l) {
      s[0][l] = Mp[base + l];
      s[1][l] = Rp[base + l];
      s[2][l] = Ap[base + l];
    }
  }
  Fused f;
  fuse(P, q, flags, s, f);
  const vf* vm = f.vm;
  const vf sq = f.sq, gA = f.gA;
  vf n = f.n;
  const vf zero = splat(0.0f), one = splat(1.0f);
  // C (eq. 2), gate and action.
  vf C = vmax(vmin((n - P.n_min) / (P.n_max - P.n_min), one), zero);
  vf alpha = f.alpha;
  vf Cf = (flags & kAlphaGating) ? gate_v(C, P.g_a, P.g_b, alpha) : C;
  // Comparisons give -1 (true) / 0 per lane, so 3 + Σ (Cf ≥ θ_k) counts down from Opt-Out.
  vi act = 3 + (Cf >= P.theta[0]) + (Cf >= P.theta[1]) + (Cf >= P.theta[2]);
  // A NaN or ±inf signal is Opt-Out, as decide_one rules (decide(..., validate=False) documents the
  // promise), with the C, α, C_final and ‖v_meta‖ of 0 that the pure-JAX path reads off the NaN v_meta
  // such a signal gives. Here the clamps before exp2_v and tanh_v's select turn such values into finite
  // numbers first, so the lanes are caught at the input: s − s is NaN exactly for NaN and ±inf.
  const vi bad = ((s[0] - s[0]) != (s[0] - s[0])) | ((s[1] - s[1]) != (s[1] - s[1])) |
                 ((s[2] - s[2]) != (s[2] - s[2]));
  act = bad ? vi{} + 3 : act;
  C = bad ? zero : C;
  alpha = bad ? zero : alpha;
  Cf = bad ? zero : Cf;
  n = bad ? zero : n;

  // Lemma 1 attribution: energy of v_meta in each subspace = squared norm of its basis coordinates.
  vf e[3];
  if (flags & kQR) {
    // The 16 basis coordinates c_i = Σ_j Q[j][i] vm[j], kIB at a time (independent chains, as in
    // fuse), then each subspace's energy Σ c_i² in order of i.
    vf c[D];
    for (int i0 = 0; i0 < D; i0 += kIB) {
      vf t[kIB];
      for (int b = 0; b < kIB; ++b) t[b] = zero;
#pragma GCC unroll 16
      for (int j = 0; j < D; ++j)
        for (int b = 0; b < kIB; ++b) t[b] += q.Q[j][i0 + b] * vm[j];
      for (int b = 0; b < kIB; ++b) c[i0 + b] = t[b];
    }
    const int edges[4] = {0, q.d_wm, q.d_wm + q.d_r, D};
    for (int k = 0; k < 3; ++k) {
      e[k] = zero;
      for (int i = edges[k]; i < edges[k + 1]; ++i) e[k] += c[i] * c[i];
    }
  } else {
    e[0] = e[1] = e[2] = sq;
  }

  // Stores: each output written once, in the caller's record-major layout.
  if (cnt == L) {
    storeu(o.action + base, act);
    storeu(o.C + base, C);
    storeu(o.alpha + base, alpha);
    storeu(o.C_final + base, Cf);
    storeu(o.norm + base, n);
    storeu(o.g_A + base, gA);
  } else {
    for (int l = 0; l < cnt; ++l) {
      o.action[base + l] = act[l];
      o.C[base + l] = C[l];
      o.alpha[base + l] = alpha[l];
      o.C_final[base + l] = Cf[l];
      o.norm[base + l] = n[l];
      o.g_A[base + l] = gA[l];
    }
  }
  // v_meta and energies are (record, component): a transpose of the lane layout.
  float* vo = o.v_meta + base * D;
  float* eo = o.energies + base * 3;
#if MDL_LANES == 8 && defined(__AVX__)
  if (cnt == L) {
    // Explicit shuffles: GCC's own vectorisation of the loops below took ~30 shuffles per record
    // (one shuffle port on Intel), these take 6 for v_meta and 2 for the energies.
    store_transposed8(vm, vo);
    store_transposed8(vm + 8, vo + 8);
    store_energies8(e, eo);
    return;
  }
#endif
  for (int l = 0; l < cnt; ++l)
    for (int i = 0; i < D; ++i) vo[l * D + i] = vm[i][l];
  for (int l = 0; l < cnt; ++l)
    for (int k = 0; k < 3; ++k) eo[l * 3 + k] = e[k][l];
}

// Parallel work over items [0, n_items) on the calling thread and XLA's intra-op pool.
//
// The items are split into one contiguous part per participant (the caller and each helper task,
// numbered by arrival). A participant first takes items from the front of its own part, then steals
// from the back of the others' parts. Why contiguous parts and not one shared counter: the outputs
// are fresh pages that the kernel touches first, and with one counter every thread works inside the
// same 2 MiB of each output at once, so when they cross into the next transparent huge page they all
// fault on it together and each allocates and zeroes 2 MiB before one of them wins the page-table
// lock (Linux's __do_huge_pmd_anonymous_page): up to T times the zeroing and memory traffic. With
// parts, each thread faults only its own pages (a boundary page at most is shared). Stealing from
// the back keeps a late or busy helper from stalling the call, and the caller only ever waits for
// items that a running thread has already claimed (no deadlock if the pool is busy or runs tasks
// inline; tasks that start late find nothing left to do).
struct Work {
  struct alignas(64) Part {
    std::atomic<uint64_t> range{0};  // [lo, hi) of item indices, lo in the low 32 bits
  };
  static uint64_t pack(uint64_t lo, uint64_t hi) { return lo | (hi << 32); }

  int64_t n_items = 0, n_parts = 1;
  std::unique_ptr<Part[]> parts;
  std::atomic<int64_t> arrivals{0}, done{0};
  std::mutex mu;
  std::condition_variable cv;

  void init(int64_t n, int64_t p) {
    n_items = n;
    n_parts = std::max<int64_t>(1, std::min(p, n));
    parts.reset(new Part[n_parts]);
    for (int64_t i = 0; i < n_parts; ++i)
      parts[i].range.store(pack(uint64_t(n * i / n_parts), uint64_t(n * (i + 1) / n_parts)),
                           std::memory_order_relaxed);
  }

  // Claim one item of `p`, from its front (the owner) or its back (a thief).
  static bool claim(Part& p, bool front, int64_t* item) {
    uint64_t r = p.range.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t lo = r & 0xffffffffu, hi = r >> 32;
      if (lo >= hi) return false;
      const uint64_t next = front ? pack(lo + 1, hi) : pack(lo, hi - 1);
      if (p.range.compare_exchange_weak(r, next, std::memory_order_relaxed)) {
        *item = static_cast<int64_t>(front ? lo : hi - 1);
        return true;
      }
    }
  }

  void finished(int64_t k) {
    if (done.fetch_add(k, std::memory_order_acq_rel) + k == n_items) {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
  }

  // `item(i)` processes item i; `own(lo, hi)`, when given, is called once by a part's owner with the
  // part's item range before it starts on it.
  template <class Item, class Own>
  void run(const Item& item, const Own& own) {
    const int64_t me = arrivals.fetch_add(1, std::memory_order_relaxed);
    int64_t i;
    // `own` and `item` run only while this thread holds a claimed item, so the call cannot have
    // returned: what they reference on the caller's stack is alive.
    if (me < n_parts && claim(parts[me], true, &i)) {
      own(i, static_cast<int64_t>(parts[me].range.load(std::memory_order_relaxed) >> 32));
      do {
        item(i);
        finished(1);
      } while (claim(parts[me], true, &i));
    }
    for (int64_t j = 1; j <= n_parts; ++j) {
      Part& p = parts[(me + j) % n_parts];
      while (claim(p, false, &i)) {
        item(i);
        finished(1);
      }
    }
  }

  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done.load(std::memory_order_acquire) == n_items; });
  }
};

// The most threads a call uses (0: every thread of XLA's pool), set by native.py from the CPUs this
// process may really use: XLA sizes its pool from the affinity mask, which in a container can
// exceed the CPU quota, and more running threads than CPUs only adds switches and cache misses.
std::atomic<int64_t> g_max_threads{0};
std::atomic<int64_t> g_last_threads{0};  // threads the last parallel call used (for benchmarks)
std::atomic<int64_t> g_pool_threads{0};  // the size of XLA's pool at that call

int64_t participants(ffi::ThreadPool& pool, int64_t n_items) {
  int64_t t = std::max<int64_t>(1, pool.num_threads());
  g_pool_threads.store(t, std::memory_order_relaxed);
  const int64_t cap = g_max_threads.load(std::memory_order_relaxed);
  if (cap > 0) t = std::min(t, cap);
  t = std::max<int64_t>(1, std::min(t, n_items));
  g_last_threads.store(t, std::memory_order_relaxed);
  return t;
}

// Run `work` (already init'ed with `t` parts) on the caller and t - 1 pool tasks, then wait.
template <class Item, class Own>
void parallel(ffi::ThreadPool& pool, const std::shared_ptr<Work>& work, const Item& item, const Own& own) {
  // The tasks capture copies of the functors and the shared Work: a task that starts after the call
  // returned (it finds nothing to claim) must not touch the caller's stack.
  for (int64_t t = 1; t < work->n_parts; ++t)
    pool.Schedule([work, item, own] { work->run(item, own); });
  work->run(item, own);
  work->wait();
}

// Outputs are fresh allocations that the kernel writes in full; on Linux most of a large call's time
// would otherwise go to 4 KiB page faults and zeroing. Asking for transparent huge pages on the
// 2 MiB-aligned interior of each large output makes those faults 512× rarer. A hint only: it changes
// no data, and is ignored where THP is off.
void advise_huge(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  if (bytes < int64_t{8} << 20) return;
  uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#endif
}

// Fault in [p, p + bytes) for writing in one system call (Linux ≥ 5.14), page-aligned inward so a
// page shared with a neighbouring thread's range is left to the first writer. Where unsupported
// the call fails harmlessly and the first write faults as before. Changes no data.
void populate(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  constexpr uintptr_t kPage = 4096;
  uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(kPage - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
#endif
}

constexpr int64_t kChunk = 2048;  // records per claimed item: 2048 × 108 B stays in L2

ffi::Error DecideImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> M, ffi::Buffer<ffi::F32> R,
                      ffi::Buffer<ffi::F32> A, ffi::Buffer<ffi::F32> params,
                      ffi::ResultBuffer<ffi::S32> action, ffi::ResultBuffer<ffi::F32> C,
                      ffi::ResultBuffer<ffi::F32> alpha, ffi::ResultBuffer<ffi::F32> C_final,
                      ffi::ResultBuffer<ffi::F32> v_meta, ffi::ResultBuffer<ffi::F32> energies,
                      ffi::ResultBuffer<ffi::F32> norm, ffi::ResultBuffer<ffi::F32> g_A,
                      int64_t flags, int64_t d_wm, int64_t d_r) {
  auto count = [](const auto& b) { return static_cast<int64_t>(b.element_count()); };
  const int64_t n = count(M);
  if (count(R) != n || count(A) != n)
    return ffi::Error::InvalidArgument("mdl_decide_f32: M, R, A must have the same size");
  if (count(params) != kParams)
    return ffi::Error::InvalidArgument("mdl_decide_f32: params has the wrong size");
  if (count(*v_meta) != n * D || count(*energies) != n * 3)
    return ffi::Error::InvalidArgument("mdl_decide_f32: output shapes do not match D = 16");
  if (d_wm <= 0 || d_r <= 0 || d_wm + d_r >= D)
    return ffi::Error::InvalidArgument("mdl_decide_f32: bad subspace dims");

  const Params& P = *reinterpret_cast<const Params*>(params.typed_data());
  if (P.d_wm != float(d_wm) || P.d_r != float(d_r))
    return ffi::Error::InvalidArgument("mdl_decide_f32: params were packed for other subspace dims");
  Prep q;
  prepare(P, q);
  const Outputs o{action->typed_data(), C->typed_data(),        alpha->typed_data(),
                  C_final->typed_data(), v_meta->typed_data(), energies->typed_data(),
                  norm->typed_data(),    g_A->typed_data()};
  const float *Mp = M.typed_data(), *Rp = R.typed_data(), *Ap = A.typed_data();
  auto records = [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; b += L)
      decide_block(P, q, flags, Mp, Rp, Ap, b, hi - b < L ? static_cast<int>(hi - b) : L, o);
  };
  if (n <= kChunk) {
    // Small calls (one record up to one chunk) run inline: no shared state, no pool, no locks.
    records(0, n);
    return ffi::Error::Success();
  }
  // (pointer, bytes per record) of every output
  const std::pair<char*, int64_t> outs[] = {
      {reinterpret_cast<char*>(o.v_meta), D * 4}, {reinterpret_cast<char*>(o.energies), 12},
      {reinterpret_cast<char*>(o.action), 4},     {reinterpret_cast<char*>(o.C), 4},
      {reinterpret_cast<char*>(o.alpha), 4},      {reinterpret_cast<char*>(o.C_final), 4},
      {reinterpret_cast<char*>(o.norm), 4},       {reinterpret_cast<char*>(o.g_A), 4}};
  for (const auto& [p, b] : outs) advise_huge(p, n * b);

  // Each participant faults in its whole part of every output in one system call before writing it
  // (measured here, 2 threads, N = 10^7: 68 ns of CPU per record against 71-107 when the first writes
  // fault, the kernel's share 9.5 ns against 13-47 ns), and only its part (see Work).
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  if (n_chunks >= (int64_t{1} << 32))  // Work packs item indices in 32 bits
    return ffi::Error::InvalidArgument("mdl_decide_f32: too many records in one call");
  auto item = [&](int64_t c) { records(c * kChunk, std::min(n, (c + 1) * kChunk)); };
  auto own = [&](int64_t c_lo, int64_t c_hi) {
    const int64_t lo = c_lo * kChunk, hi = std::min(n, c_hi * kChunk);
    for (const auto& [p, b] : outs) populate(p + lo * b, (hi - lo) * b);
  };
  auto work = std::make_shared<Work>();
  work->init(n_chunks, participants(pool, n_chunks));
  parallel(pool, work, item, own);
  return ffi::Error::Success();
}


// ------------------------------------------------------------------------------------------ sweep
// One pass of sweep(): every config of a batch × every record, reduced per config and weight vector
// to raw weighted sums (mdl_jax/controller/sweep.py: the engine contract). What makes it fast:
//  - configs that differ only in the read-out numbers (n_min, n_max, g_a, g_b, θ) share the fusion:
//    the caller groups them (native.py), and ‖v_meta‖ and α are computed once per record and group;
//  - the per-config work after the fusion is a few SIMD lines per L records, plus the weighted sums
//    (masked adds in float64 lanes: integer weights are summed exactly, float weights in double);
//  - items (a block of configs of one group × a chunk of records) run on every thread, each writing
//    its own slice of a scratch array that is added up in a fixed order at the end, so the result
//    does not depend on the thread count or timing (bit-identical from run to run).

// Per-config read-out numbers, in the order native.py writes them.
struct Readout {
  float n_min, n_max, g_a, g_b, theta[3], pad;
};
static_assert(sizeof(Readout) == 8 * sizeof(float), "Readout must be 8 packed floats");

// Half a block's lanes in float64 / int64 (one register of the same width as vf).
typedef double vd __attribute__((vector_size(4 * L), aligned(4 * L)));   // L/2 float64 lanes
typedef int64_t vl __attribute__((vector_size(4 * L), aligned(4 * L)));  // L/2 int64 lanes (masks)

#if MDL_LANES == 16
#define MDL_LO 0, 1, 2, 3, 4, 5, 6, 7
#define MDL_HI 8, 9, 10, 11, 12, 13, 14, 15
#else
#define MDL_LO 0, 1, 2, 3
#define MDL_HI 4, 5, 6, 7
#endif
inline vd lo_d(vf x) { return __builtin_convertvector(__builtin_shufflevector(x, x, MDL_LO), vd); }
inline vd hi_d(vf x) { return __builtin_convertvector(__builtin_shufflevector(x, x, MDL_HI), vd); }
inline vd lo_d(vi x) { return __builtin_convertvector(__builtin_shufflevector(x, x, MDL_LO), vd); }
inline vd hi_d(vi x) { return __builtin_convertvector(__builtin_shufflevector(x, x, MDL_HI), vd); }
inline vl lo_m(vi m) { return __builtin_convertvector(__builtin_shufflevector(m, m, MDL_LO), vl); }
inline vl hi_m(vi m) { return __builtin_convertvector(__builtin_shufflevector(m, m, MDL_HI), vl); }
// Sums in a fixed order (lanes converted to float64 exactly): the result never depends on the
// compiler's reduction tree.
inline double hsum(vd x) {
  double t = 0.0;
  for (int l = 0; l < L / 2; ++l) t += x[l];
  return t;
}
inline double hsum(vf x) { return hsum(lo_d(x) + hi_d(x)); }
inline double hsum(vi x) { return hsum(lo_d(x) + hi_d(x)); }
inline vf select(vi m, vf x) { return (vf)(m & (vi)x); }  // x where m is -1, +0.0 where 0 (exact)

// How the weights are summed (native.py picks it per pass):
//  kIntegral: float32 weights that are integers with row totals < 2^24: float32 lane sums are exact;
//  kInt32: int32 weights: int32 lane sums (totals < 2^31 per row, so exact);
//  kDouble: any other float32 weights: float64 lane sums.
// Lane sums cover one sub-chunk of records and are then added in float64.
constexpr int64_t kIntegral = 0, kInt32 = 1, kDouble = 2;

constexpr int64_t kSweepSub = 2048;        // records whose ‖v_meta‖, α stay in L1/L2 while configs loop
constexpr int64_t kSweepChunk = 4096;      // records per item (before capping the scratch size)
constexpr int64_t kSweepCfgBlock = 32;     // configs of one group per item
constexpr int64_t kSweepScratch = 64 << 20;  // bytes of per-item partial sums at most
constexpr int kStats = 6;                  // per (config, weight vector): 4 counts, correct, Σ w·C_final

struct SweepArgs {
  const Params* groups;      // (G,) packed configs, one per fusion group
  const Readout* readout;    // (K,) configs sorted by group
  const int32_t* start;      // (G + 1,) first config of each group
  int64_t flags, n, W, mode;
  const float *M, *R, *A;
  const float* wf;           // (2, W, n) float32 weights, or
  const int32_t* wi;         // (2, W, n) int32 weights: [0] of records labelled adopt, [1] the others
};

// One item: configs [k_lo, k_hi) of group g over records [lo, hi), sums added to out[k - k_lo][w][stat].
void sweep_item(const SweepArgs& a, int64_t g, int64_t k_lo, int64_t k_hi, int64_t lo, int64_t hi,
                double* out) {
  const Params& P = a.groups[g];
  Prep q;  // per item: ~0.1 µs against the item's thousands of records
  prepare(P, q);
  const int64_t W = a.W;
  const bool gating = a.flags & kAlphaGating;
  constexpr int kB = kSweepSub / L;
  vf nb[kB], ab[kB], cfb[kB];
  vi actb[kB];
  for (int64_t sub = lo; sub < hi; sub += kSweepSub) {
    const int64_t sub_hi = std::min(hi, sub + kSweepSub);
    const int nblk = static_cast<int>((sub_hi - sub + L - 1) / L);
    const int full = static_cast<int>((sub_hi - sub) / L);  // blocks with all L lanes in range
    const int tail = static_cast<int>((sub_hi - sub) % L);
    for (int b = 0; b < nblk; ++b) {
      const int64_t base = sub + int64_t{b} * L;
      const int cnt = b < full ? L : tail;
      vf s[3];
      if (cnt == L) {
        s[0] = loadu(a.M + base);
        s[1] = loadu(a.R + base);
        s[2] = loadu(a.A + base);
      } else {
        for (int k = 0; k < 3; ++k) s[k] = splat(0.5f);  // padding lanes get weight 0 below
        for (int l = 0; l < cnt; ++l) {
          s[0][l] = a.M[base + l];
          s[1][l] = a.R[base + l];
          s[2][l] = a.A[base + l];
        }
      }
      Fused f;
      fuse(P, q, a.flags, s, f);
      nb[b] = f.n;
      ab[b] = f.alpha;
    }
    const vf zero = splat(0.0f), one = splat(1.0f);
    for (int64_t k = k_lo; k < k_hi; ++k) {
      const Readout& r = a.readout[k];
      for (int b = 0; b < nblk; ++b) {
        // The same arithmetic as decide_block's read-out, gate and action.
        const vf C = vmax(vmin((nb[b] - r.n_min) / (r.n_max - r.n_min), one), zero);
        const vf Cf = gating ? gate_v(C, r.g_a, r.g_b, ab[b]) : C;
        cfb[b] = Cf;
        actb[b] = 3 + (Cf >= r.theta[0]) + (Cf >= r.theta[1]) + (Cf >= r.theta[2]);
      }
      double* o = out + (k - k_lo) * W * kStats;
      for (int64_t w = 0; w < W; ++w) {
        // correct = Σ adopt-weight where Active + Σ other weight where not Active (adopt ⇔ Active)
        const int64_t row_a = w * a.n + sub, row_r = (W + w) * a.n + sub;
        auto weight_f = [&](int64_t row, int b) -> vf {
          if (b < full) return loadu(a.wf + row + int64_t{b} * L);
          vf x = zero;
          for (int l = 0; l < tail; ++l) x[l] = a.wf[row + int64_t{b} * L + l];
          return x;
        };
        auto weight_i = [&](int64_t row, int b) -> vi {
          vi x = vi{};
          if (b < full) std::memcpy(&x, a.wi + row + int64_t{b} * L, sizeof x);
          else for (int l = 0; l < tail; ++l) x[l] = a.wi[row + int64_t{b} * L + l];
          return x;
        };
        double t[kStats];
        if (a.mode == kIntegral) {
          vf s0 = zero, s1 = zero, s2 = zero, s3 = zero, sc = zero, scf = zero;
          for (int b = 0; b < nblk; ++b) {
            const vf xa = weight_f(row_a, b), xr = weight_f(row_r, b);
            const vf x = xa + xr;  // integers below 2^24: exact
            const vi act = actb[b];
            const vi m0 = act == 0;
            s0 += select(m0, x);
            s1 += select(act == 1, x);
            s2 += select(act == 2, x);
            s3 += select(act == 3, x);
            sc += select(m0, xa) + select(~m0, xr);
            scf += x * cfb[b];
          }
          t[0] = hsum(s0), t[1] = hsum(s1), t[2] = hsum(s2), t[3] = hsum(s3), t[4] = hsum(sc);
          t[5] = hsum(scf);
        } else if (a.mode == kInt32) {
          vi s0 = vi{}, s1 = vi{}, s2 = vi{}, s3 = vi{}, sc = vi{};
          vd cf_lo = vd{}, cf_hi = vd{};
          for (int b = 0; b < nblk; ++b) {
            const vi xa = weight_i(row_a, b), xr = weight_i(row_r, b);
            const vi x = xa + xr;  // at most a row total, < 2^31
            const vi act = actb[b];
            const vi m0 = act == 0;
            s0 += x & m0;
            s1 += x & (act == 1);
            s2 += x & (act == 2);
            s3 += x & (act == 3);
            sc += (xa & m0) + (xr & ~m0);
            cf_lo += lo_d(x) * lo_d(cfb[b]);
            cf_hi += hi_d(x) * hi_d(cfb[b]);
          }
          t[0] = hsum(s0), t[1] = hsum(s1), t[2] = hsum(s2), t[3] = hsum(s3), t[4] = hsum(sc);
          t[5] = hsum(cf_lo + cf_hi);
        } else {
          vd d[kStats][2] = {};
          for (int b = 0; b < nblk; ++b) {
            const vf xa = weight_f(row_a, b), xr = weight_f(row_r, b);
            const vd x_lo = lo_d(xa) + lo_d(xr), x_hi = hi_d(xa) + hi_d(xr);
            const vi act = actb[b];
            const vi m0 = act == 0;
            const vl m[4] = {lo_m(m0), lo_m(act == 1), lo_m(act == 2), lo_m(act == 3)};
            const vl h[4] = {hi_m(m0), hi_m(act == 1), hi_m(act == 2), hi_m(act == 3)};
            const vd z = vd{};
            for (int j = 0; j < 4; ++j) {
              d[j][0] += m[j] ? x_lo : z;
              d[j][1] += h[j] ? x_hi : z;
            }
            const vf c = select(m0, xa) + select(~m0, xr);  // one of the two is +0.0: exact
            d[4][0] += lo_d(c);
            d[4][1] += hi_d(c);
            d[5][0] += x_lo * lo_d(cfb[b]);
            d[5][1] += x_hi * hi_d(cfb[b]);
          }
          for (int j = 0; j < kStats; ++j) t[j] = hsum(d[j][0] + d[j][1]);
        }
        for (int j = 0; j < kStats; ++j) o[w * kStats + j] += t[j];
      }
    }
  }
}

ffi::Error SweepImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> M, ffi::Buffer<ffi::F32> R,
                     ffi::Buffer<ffi::F32> A, ffi::AnyBuffer weights,
                     ffi::Buffer<ffi::F32> groups, ffi::Buffer<ffi::F32> readout, ffi::Buffer<ffi::S32> start,
                     ffi::ResultBuffer<ffi::S32> out, int64_t flags, int64_t mode) {
  auto count = [](const auto& b) { return static_cast<int64_t>(b.element_count()); };
  const int64_t n = count(M);
  const int64_t G = count(start) - 1;
  const int64_t K = count(readout) / 8;
  if (count(R) != n || count(A) != n)
    return ffi::Error::InvalidArgument("mdl_sweep_f32: M, R, A must have the same size");
  if (n == 0 || G < 1 || count(groups) != G * kParams || count(readout) != K * 8)
    return ffi::Error::InvalidArgument("mdl_sweep_f32: bad groups / readout sizes");
  const auto dt = weights.element_type();
  if ((dt == ffi::DataType::S32) != (mode == kInt32) || (dt != ffi::DataType::F32 && dt != ffi::DataType::S32) ||
      mode < kIntegral || mode > kDouble)
    return ffi::Error::InvalidArgument("mdl_sweep_f32: weights must be int32 (mode 1) or float32 (modes 0, 2)");
  const int64_t W = static_cast<int64_t>(weights.element_count()) / (2 * n);
  if (W < 1 || 2 * W * n != static_cast<int64_t>(weights.element_count()) || count(*out) != K * W * kStats * 2)
    return ffi::Error::InvalidArgument("mdl_sweep_f32: weights / output shapes do not match");
  const int32_t* st = start.typed_data();
  if (st[0] != 0 || st[G] != K)
    return ffi::Error::InvalidArgument("mdl_sweep_f32: group starts must run from 0 to K");
  for (int64_t g = 0; g < G; ++g)
    if (st[g + 1] <= st[g]) return ffi::Error::InvalidArgument("mdl_sweep_f32: empty or unsorted group");

  SweepArgs a{reinterpret_cast<const Params*>(groups.typed_data()),
              reinterpret_cast<const Readout*>(readout.typed_data()),
              st, flags, n, W, mode, M.typed_data(), R.typed_data(), A.typed_data(),
              dt == ffi::DataType::F32 ? reinterpret_cast<const float*>(weights.untyped_data()) : nullptr,
              dt == ffi::DataType::S32 ? reinterpret_cast<const int32_t*>(weights.untyped_data()) : nullptr};

  for (int64_t g = 0; g < G; ++g) {
    const float dw = a.groups[g].d_wm, dr = a.groups[g].d_r;
    if (!(dw >= 1 && dr >= 1 && dw + dr <= D - 1 && dw == float(int(dw)) && dr == float(int(dr))))
      return ffi::Error::InvalidArgument("mdl_sweep_f32: bad subspace dims in a group's params");
  }

  // Tasks: blocks of at most kSweepCfgBlock configs inside each group (recomputing a group's fusion
  // per block costs about what a few configs' read-outs do, and lets one big group use every thread).
  std::vector<std::array<int64_t, 3>> tasks;  // (group, first config, end)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t k = st[g]; k < st[g + 1]; k += kSweepCfgBlock)
      tasks.push_back({g, k, std::min<int64_t>(st[g + 1], k + kSweepCfgBlock)});
  // Record chunks: kSweepChunk records each, fewer when the partial sums would outgrow kSweepScratch.
  const int64_t per_chunk = K * W * kStats * int64_t{sizeof(double)};
  int64_t n_rc = (n + kSweepChunk - 1) / kSweepChunk;
  n_rc = std::max<int64_t>(1, std::min(n_rc, kSweepScratch / std::max<int64_t>(per_chunk, 1)));
  int64_t rc_size = (n + n_rc - 1) / n_rc;
  rc_size = (rc_size + L - 1) / L * L;
  n_rc = (n + rc_size - 1) / rc_size;
  std::unique_ptr<double[]> scratch(new (std::nothrow) double[n_rc * K * W * kStats]());
  if (!scratch) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "mdl_sweep_f32: out of memory");

  const int64_t n_items = static_cast<int64_t>(tasks.size()) * n_rc;
  if (n_items >= (int64_t{1} << 32))  // Work packs item indices in 32 bits
    return ffi::Error::InvalidArgument("mdl_sweep_f32: too many configs × record chunks in one pass");
  auto item = [&](int64_t i) {
    const auto& t = tasks[i / n_rc];
    const int64_t rc = i % n_rc, lo = rc * rc_size, hi = std::min(n, lo + rc_size);
    sweep_item(a, t[0], t[1], t[2], lo, hi, scratch.get() + (rc * K + t[1]) * W * kStats);
  };
  auto work = std::make_shared<Work>();
  work->init(n_items, participants(pool, n_items));
  if (work->n_parts == 1) {
    for (int64_t i = 0; i < n_items; ++i) item(i);
  } else {
    parallel(pool, work, item, [](int64_t, int64_t) {});
  }
  // Chunks added in order: the same sums whatever ran where.
  double* o = reinterpret_cast<double*>(out->untyped_data());
  const int64_t m = K * W * kStats;
  for (int64_t j = 0; j < m; ++j) o[j] = scratch[j];
  for (int64_t rc = 1; rc < n_rc; ++rc)
    for (int64_t j = 0; j < m; ++j) o[j] += scratch[rc * m + j];
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MdlDecideF32, DecideImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // M
                                  .Arg<ffi::Buffer<ffi::F32>>()  // R
                                  .Arg<ffi::Buffer<ffi::F32>>()  // A
                                  .Arg<ffi::Buffer<ffi::F32>>()  // params
                                  .Ret<ffi::Buffer<ffi::S32>>()  // action
                                  .Ret<ffi::Buffer<ffi::F32>>()  // C
                                  .Ret<ffi::Buffer<ffi::F32>>()  // alpha
                                  .Ret<ffi::Buffer<ffi::F32>>()  // C_final
                                  .Ret<ffi::Buffer<ffi::F32>>()  // v_meta
                                  .Ret<ffi::Buffer<ffi::F32>>()  // energies
                                  .Ret<ffi::Buffer<ffi::F32>>()  // norm
                                  .Ret<ffi::Buffer<ffi::F32>>()  // g_A
                                  .Attr<int64_t>("flags")
                                  .Attr<int64_t>("d_wm")
                                  .Attr<int64_t>("d_r"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MdlSweepF32, SweepImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // M (n,)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // R
                                  .Arg<ffi::Buffer<ffi::F32>>()   // A
                                  .Arg<ffi::AnyBuffer>()          // weights (2, W, n): adopt / other records
                                  .Arg<ffi::Buffer<ffi::F32>>()   // groups (G, 1085): one packed config per group
                                  .Arg<ffi::Buffer<ffi::F32>>()   // readout (K, 8), configs sorted by group
                                  .Arg<ffi::Buffer<ffi::S32>>()   // start (G + 1,)
                                  .Ret<ffi::Buffer<ffi::S32>>()   // (K, W, 6) float64 sums, as (K, W, 12) int32
                                  .Attr<int64_t>("flags")
                                  .Attr<int64_t>("mode"));

// Plain C entry points for native.py (ctypes): the thread cap and what the last call used.
extern "C" {
void MdlSetMaxThreads(int64_t n) { g_max_threads.store(n < 0 ? 0 : n, std::memory_order_relaxed); }
int64_t MdlLastThreads() { return g_last_threads.load(std::memory_order_relaxed); }
int64_t MdlPoolThreads() { return g_pool_threads.load(std::memory_order_relaxed); }
int64_t MdlLanes() { return L; }

// A small call (n ≤ kChunk records) straight from NumPy buffers, inline on the calling thread: what
// DecideImpl does for such calls, block by block, without XLA's dispatch (about 30 of the 45 µs a
// one-query gate call spent in the controller). Same blocks, so the same bits. 0 on success, 1 for
// arguments DecideImpl would refuse.
int64_t MdlDecideSmallF32(const float* M, const float* R, const float* A, const float* params, int64_t n,
                          int64_t flags, int64_t d_wm, int64_t d_r, int32_t* action, float* C, float* alpha,
                          float* C_final, float* v_meta, float* energies, float* norm, float* g_A) {
  if (n < 0 || n > kChunk || d_wm <= 0 || d_r <= 0 || d_wm + d_r >= D) return 1;
  const Params& P = *reinterpret_cast<const Params*>(params);
  if (P.d_wm != float(d_wm) || P.d_r != float(d_r)) return 1;
  Prep q;
  prepare(P, q);
  const Outputs o{action, C, alpha, C_final, v_meta, energies, norm, g_A};
  for (int64_t b = 0; b < n; b += L)
    decide_block(P, q, flags, M, R, A, b, n - b < L ? static_cast<int>(n - b) : L, o);
  return 0;
}

static double thread_seconds() {
#if defined(__linux__)
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
#else
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
#endif
}

// The core's clock while busy, for the benchmark's cycles per record: `iters` × 64 dependent
// register-register integer adds (one cycle each on x86-64 cores; add-immediate chains are not used,
// since Golden Cove folds them at rename), timed by this thread's CPU clock (so time the thread was
// descheduled on a shared machine does not count). Elsewhere an estimate.
double MdlClockHz(int64_t iters) {
  uint64_t x = 0, one = 1;
  const double t0 = thread_seconds();
  for (int64_t i = 0; i < iters; ++i) {
#if defined(__x86_64__)
    __asm__ volatile(
        ".rept 64\n\t"
        "addq %1, %0\n\t"
        ".endr"
        : "+r"(x) : "r"(one));
#else
    for (int k = 0; k < 64; ++k) __asm__ volatile("" : "+r"(x) : "r"(x + 1));
#endif
  }
  const double s = thread_seconds() - t0;
  return s > 0 ? double(iters) * 64.0 / s : 0.0;
}
}
