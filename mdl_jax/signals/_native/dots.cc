// The float64 dot products of the gate's small-store path (mdl_jax/signals/dots_native.py): for each
// row of a step, the cosines of its S memories with its query and the S(S-1)/2 cosines among them,
// read straight from the matrix of unique texts' embeddings by index (no gathered or float64 copies).
//
// Every dot product has one summation order whatever the CPU or the compiler's vector width: eight
// float64 partial sums, term k into sum k mod 8 in order of k, then ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)).
// A float32 product is exact in float64, and the file is built with -ffp-contract=off (no fused
// multiply-add, which rounds once where a multiply then an add round twice), so the AVX-512, AVX2 and
// baseline clones below return the same bits: a row's signals do not depend on which clone ran, nor on
// which other rows share its call (each row reads only its own vectors).

#include <cstdint>

namespace {

__attribute__((always_inline)) inline double dot(const float* x, const float* y, int64_t d) {
  double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  int64_t k = 0;
  for (; k + 8 <= d; k += 8)
    for (int l = 0; l < 8; ++l) s[l] += static_cast<double>(x[k + l]) * static_cast<double>(y[k + l]);
  for (int l = 0; k < d; ++k, ++l) s[l] += static_cast<double>(x[k]) * static_cast<double>(y[k]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

// U: (n_u, d) float32, row-major. idx: (m, S) rows of U. Q: (m, d) float32, one query per row.
// cos: (m, S) float64 out. upper: (m, S(S-1)/2) float64 out, pairs i < j in row-major order.
// Returns 0, or -1 when an index is outside [0, n_u) (nothing is read past U).
extern "C" __attribute__((target_clones("avx512f", "avx2", "default")))
int64_t MdlSmallDots(const float* U, int64_t n_u, int64_t d, const int64_t* idx, const float* Q, int64_t m,
                     int64_t S, double* cos, double* upper) {
  for (int64_t t = 0; t < m * S; ++t)
    if (idx[t] < 0 || idx[t] >= n_u) return -1;
  const int64_t P = S * (S - 1) / 2;
  for (int64_t r = 0; r < m; ++r) {
    const int64_t* ix = idx + r * S;
    const float* q = Q + r * d;
    for (int64_t i = 0; i < S; ++i) cos[r * S + i] = dot(U + ix[i] * d, q, d);
    int64_t p = 0;
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = i + 1; j < S; ++j) upper[r * P + p++] = dot(U + ix[i] * d, U + ix[j] * d, d);
  }
  return 0;
}
