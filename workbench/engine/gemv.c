/* Few-row float32 matrix products for decoding on x86-64 CPUs with AVX2 and FMA.
 *
 * y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]), row-major, for the few rows of a decode step
 * (one sequence, a beam search, a small batch). BLAS libraries tune their GEMM for many rows and
 * take slow paths for a handful on some CPUs; here the weight matrix is read from memory exactly
 * once per call, four rows at a time, and those four rows stay in L1 while every row of x reads
 * them, two x rows per pass (8 accumulators + 4 weight + 2 input registers of the 16 AVX2 has);
 * the first pass prefetches the next four rows (2-4 rows: ~20% faster on an AMX Xeon in fp32).
 * Each thread takes a contiguous range of weight rows (OpenMP, the runtime torch itself loaded).
 * Sums are accumulated in float32 in a fixed order: the same inputs give the same bits for any
 * thread count.
 */
#include <immintrin.h>
#include <stdint.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The next block of four weight rows, fetched into L1 while this one is computed (on the
 * first pass over a block only: later passes read it from L1). */
static inline void prefetch_next(const float *w, int64_t K, int64_t k) {
    for (int r = 4; r < 8; ++r) _mm_prefetch((const char *)(w + r * K + k), _MM_HINT_T0);
}

/* Dot products of weight rows w[0..R) with input rows x0 (and x1 when two), R <= 4. */
static inline void tile(const float *w, int64_t R, const float *x0, const float *x1, int64_t K,
                        int first, float out0[4], float out1[4]) {
    const int64_t K8 = K & ~(int64_t)7;
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    if (R == 4 && x1) {
        for (int64_t k = 0; k < K8; k += 8) {
            if (first) prefetch_next(w, K, k);
            __m256 u = _mm256_loadu_ps(x0 + k), v = _mm256_loadu_ps(x1 + k);
            __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + K + k);
            __m256 w2 = _mm256_loadu_ps(w + 2 * K + k), w3 = _mm256_loadu_ps(w + 3 * K + k);
            a[0] = _mm256_fmadd_ps(w0, u, a[0]); c[0] = _mm256_fmadd_ps(w0, v, c[0]);
            a[1] = _mm256_fmadd_ps(w1, u, a[1]); c[1] = _mm256_fmadd_ps(w1, v, c[1]);
            a[2] = _mm256_fmadd_ps(w2, u, a[2]); c[2] = _mm256_fmadd_ps(w2, v, c[2]);
            a[3] = _mm256_fmadd_ps(w3, u, a[3]); c[3] = _mm256_fmadd_ps(w3, v, c[3]);
        }
    } else if (R == 4) {
        for (int64_t k = 0; k < K8; k += 8) {
            if (first) prefetch_next(w, K, k);
            __m256 u = _mm256_loadu_ps(x0 + k);
            a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), u, a[0]);
            a[1] = _mm256_fmadd_ps(_mm256_loadu_ps(w + K + k), u, a[1]);
            a[2] = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * K + k), u, a[2]);
            a[3] = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * K + k), u, a[3]);
        }
    } else {  /* the last, partial block of weight rows */
        for (int64_t r = 0; r < R; ++r)
            for (int64_t k = 0; k < K8; k += 8) {
                __m256 wr = _mm256_loadu_ps(w + r * K + k);
                a[r] = _mm256_fmadd_ps(wr, _mm256_loadu_ps(x0 + k), a[r]);
                if (x1) c[r] = _mm256_fmadd_ps(wr, _mm256_loadu_ps(x1 + k), c[r]);
            }
    }
    for (int64_t r = 0; r < R; ++r) {
        float s = hsum(a[r]), t = x1 ? hsum(c[r]) : 0.0f;
        for (int64_t k = K8; k < K; ++k) {
            s += w[r * K + k] * x0[k];
            if (x1) t += w[r * K + k] * x1[k];
        }
        out0[r] = s;
        out1[r] = t;
    }
}

void wb_linear_f32(const float *x, const float *w, const float *b, float *y, int64_t M,
                   int64_t N, int64_t K, int threads) {
    const int64_t blocks = (N + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * 4, R = N - n0 < 4 ? N - n0 : 4;
        const float *wb = w + n0 * K;
        for (int64_t m = 0; m < M; m += 2) {
            const float *x1 = m + 1 < M ? x + (m + 1) * K : 0;
            float s[4], t[4];
            tile(wb, R, x + m * K, x1, K, m == 0, s, t);
            for (int64_t r = 0; r < R; ++r) {
                float bias = b ? b[n0 + r] : 0.0f;
                y[m * N + n0 + r] = s[r] + bias;
                if (x1) y[(m + 1) * N + n0 + r] = t[r] + bias;
            }
        }
    }
}

/* bfloat16 few-row products on CPUs with AVX-512 BF16 (VDPBF16PS): y[m, n] = sum_k x[m, k] *
 * w[n, k] (+ b[n]), bf16 in, float32 accumulation, one rounding to bf16 (nearest even) at the
 * end, as oneDNN and MKL compute it. Weight rows are read eight at a time, each block of them
 * prefetched a block ahead, and every row of x reads the block while it is in L1: the weights
 * stream once per call at close to the memory's read bandwidth (MKL's bf16 GEMM read ~70% of
 * it for one row). A row's sum is one thread's, in a fixed order: the same bits for any thread
 * count. Compiled for AVX-512 BF16 only in this function (the library still loads on AVX2
 * CPUs); compilers older than GCC 10 / clang 9 leave it out and the kernel is unavailable. */
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define WB_BF16_ROWS 8

static inline uint16_t wb_round_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float wb_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
void wb_linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                    int64_t M, int64_t N, int64_t K, int threads) {
    const int64_t blocks = (N + WB_BF16_ROWS - 1) / WB_BF16_ROWS;
    const __mmask32 tail = (__mmask32)((1ull << (K & 31)) - 1);
    const int64_t K32 = K & ~(int64_t)31;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * WB_BF16_ROWS;
        const int64_t R = N - n0 < WB_BF16_ROWS ? N - n0 : WB_BF16_ROWS;
        const uint16_t *wb = w + n0 * K;
        for (int64_t m = 0; m < M; ++m) {
            const uint16_t *xm = x + m * K;
            __m512 a[WB_BF16_ROWS];
            for (int r = 0; r < WB_BF16_ROWS; ++r) a[r] = _mm512_setzero_ps();
            for (int64_t k = 0; k < K32; k += 32) {
                __m512bh xv = (__m512bh)_mm512_loadu_si512(xm + k);
                for (int64_t r = 0; r < R; ++r) {
                    if (m == 0) _mm_prefetch((const char *)(wb + (r + WB_BF16_ROWS) * K + k),
                                             _MM_HINT_T0);
                    a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)_mm512_loadu_si512(wb + r * K + k),
                                            xv);
                }
            }
            if (tail) {
                __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(tail, xm + K32);
                for (int64_t r = 0; r < R; ++r)
                    a[r] = _mm512_dpbf16_ps(
                        a[r], (__m512bh)_mm512_maskz_loadu_epi16(tail, wb + r * K + K32), xv);
            }
            for (int64_t r = 0; r < R; ++r) {
                float s = _mm512_reduce_add_ps(a[r]);
                if (b) s += wb_bf16_to_f32(b[n0 + r]);
                y[m * N + n0 + r] = wb_round_bf16(s);
            }
        }
    }
}
#endif
