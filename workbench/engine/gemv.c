/* Few-row float32 matrix products for decoding on x86-64 CPUs with AVX2 and FMA.
 *
 * y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]), row-major, for the few rows of a decode step
 * (one sequence, a beam search, a small batch). BLAS libraries tune their GEMM for many rows and
 * take slow paths for a handful on some CPUs; here the weight matrix is read from memory exactly
 * once per call. Up to six rows: dot products, four weight rows at a time, those four rows
 * staying in L1 while every row of x reads them, two x rows per pass (8 accumulators + 4 weight
 * + 2 input registers of the 16 AVX2 has); the first pass prefetches the next four rows (2-4
 * rows: ~20% faster on an AMX Xeon in fp32). Seven rows or more: broadcast tiles (below).
 * Each thread takes a contiguous range of weight rows (OpenMP, the runtime torch itself loaded).
 * Sums are accumulated in float32 in a fixed order: the same inputs give the same bits for any
 * thread count.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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

/* Products of seven rows or more (a batch decoding, a wide beam search): the dot products above
 * are held to about half of what the FMA units do by their horizontal sums and eight
 * accumulators. Here the input is transposed into columns of eight rows (xt[k][m], zero
 * padded) and each weight element is broadcast and multiplied into whole columns: a tile of R
 * weight rows x V columns keeps R * V sums in registers (6 x 2: 12 of the 16 registers, 2 + 6
 * loads a step for 12 multiply-adds, no horizontal sums). Each sum runs over k in order,
 * restarted every BC_SPAN steps and added to a running total (the error grows with
 * BC_SPAN + K / BC_SPAN, not with K): the same bits for any number of rows from BC_MIN_ROWS
 * on, any grouping of them and any thread count. The weight rows two tiles ahead are
 * prefetched into L2: sixteen rows need the weights about as fast as memory gives them, and
 * the hardware prefetchers do not follow six rows at once. On an AMX Xeon limited to AVX2, a
 * 16-row decode step's products: 49 ms as dot products, 36 ms this way (6 rows: a tie). */
#define BC_MIN_ROWS 7
#define BC_SPAN 64

static inline __attribute__((always_inline)) void
bc_tile(const float *w, int64_t K, const float *xt, int64_t ld, int R, int V, int prefetch,
        float *sums) {
    for (int i = 0; i < R * V * 8; ++i) sums[i] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += BC_SPAN) {
        const int64_t k1 = k0 + BC_SPAN < K ? k0 + BC_SPAN : K;
        __m256 acc[12][2];
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
        for (int64_t kk = k0; kk < k1; kk += 16) {  /* a cache line of each weight row */
            if (prefetch)
                for (int r = 0; r < R; ++r)
                    _mm_prefetch((const char *)(w + (2 * R + r) * K + kk), _MM_HINT_T1);
            const int64_t ke = kk + 16 < k1 ? kk + 16 : k1;
#pragma GCC unroll 4
            for (int64_t k = kk; k < ke; ++k) {
                __m256 xv[2];
                for (int v = 0; v < V; ++v) xv[v] = _mm256_loadu_ps(xt + k * ld + 8 * v);
                for (int r = 0; r < R; ++r) {
                    const __m256 b = _mm256_broadcast_ss(w + r * K + k);
                    for (int v = 0; v < V; ++v)
                        acc[r][v] = _mm256_fmadd_ps(b, xv[v], acc[r][v]);
                }
            }
        }
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < V; ++v) {
                float *s = sums + (r * V + v) * 8;
                _mm256_storeu_ps(s, _mm256_add_ps(_mm256_loadu_ps(s), acc[r][v]));
            }
    }
}

/* x [M, K] -> xt [K, ld] (ld: M rounded up to 8, the padding zero), 8 x 8 blocks in registers. */
static void transpose_rows(const float *x, int64_t M, int64_t K, float *xt, int64_t ld) {
    const int64_t K8 = K & ~(int64_t)7;
    for (int64_t m0 = 0; m0 < ld; m0 += 8) {
        const float *rows[8];
        for (int i = 0; i < 8; ++i) rows[i] = m0 + i < M ? x + (m0 + i) * K : 0;
        for (int64_t k = 0; k < K8; k += 8) {
            __m256 r[8], t[8];
            for (int i = 0; i < 8; ++i)
                r[i] = rows[i] ? _mm256_loadu_ps(rows[i] + k) : _mm256_setzero_ps();
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4)
                for (int j = 0; j < 2; ++j) {
                    r[i + j] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0x44);
                    r[i + j + 2] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0xEE);
                }
            /* r[0], r[2], r[1], r[3]: columns k..k+3 of rows 0-3 in lanes 0-3 and columns
             * k+4..k+7 in lanes 4-7; r[4..7] the same of rows 4-7 */
            static const int order[4] = {0, 2, 1, 3};
            for (int j = 0; j < 4; ++j) {
                const int c = order[j];
                _mm256_storeu_ps(xt + (k + j) * ld + m0, _mm256_permute2f128_ps(r[c], r[c + 4], 0x20));
                _mm256_storeu_ps(xt + (k + j + 4) * ld + m0, _mm256_permute2f128_ps(r[c], r[c + 4], 0x31));
            }
        }
        for (int64_t k = K8; k < K; ++k)
            for (int i = 0; i < 8; ++i) xt[k * ld + m0 + i] = rows[i] ? rows[i][k] : 0.0f;
    }
}

/* This thread's scratch of at least `bytes`, 64-byte aligned (grown as needed and kept for its
 * next call: where a product lays out its input rows); NULL if memory ran out. */
static void *wb_scratch(int64_t bytes) {
    static __thread void *buf = 0;
    static __thread int64_t size = 0;
    if (bytes > size) {
        free(buf);
        buf = aligned_alloc(64, (size_t)((bytes + 63) & ~(int64_t)63));
        size = buf ? bytes : 0;
    }
    return buf;
}

/* x transposed into this thread's scratch columns; NULL if memory ran out. */
static float *columns(const float *x, int64_t M, int64_t K, int64_t ld) {
    float *xt = wb_scratch(ld * K * 4);
    if (xt) transpose_rows(x, M, K, xt, ld);
    return xt;
}

static void linear_broadcast(const float *x, const float *w, const float *b, float *y,
                             int64_t M, int64_t N, int64_t K, int threads) {
    const int64_t ld = (M + 7) & ~(int64_t)7;
    float *cols = columns(x, M, K, ld);
    if (!cols) return;
    const int64_t blocks = (N + 5) / 6;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * 6, R = N - n0 < 6 ? N - n0 : 6;
        float sums[6 * 2 * 8];
        for (int64_t m0 = 0; m0 < ld; m0 += 16) {
            const int V = ld - m0 >= 16 ? 2 : 1, first = m0 == 0;
            if (R == 6 && V == 2) bc_tile(w + n0 * K, K, cols + m0, ld, 6, 2, first, sums);
            else if (R == 6) bc_tile(w + n0 * K, K, cols + m0, ld, 6, 1, first, sums);
            else if (V == 2)
                for (int64_t r = 0; r < R; ++r)
                    bc_tile(w + (n0 + r) * K, K, cols + m0, ld, 1, 2, 0, sums + r * 16);
            else
                for (int64_t r = 0; r < R; ++r)
                    bc_tile(w + (n0 + r) * K, K, cols + m0, ld, 1, 1, 0, sums + r * 8);
            for (int64_t r = 0; r < R; ++r) {
                const float bias = b ? b[n0 + r] : 0.0f;
                for (int64_t j = 0; j < 8 * V && m0 + j < M; ++j)
                    y[(m0 + j) * N + n0 + r] = sums[r * 8 * V + j] + bias;
            }
        }
    }
}

void wb_linear_f32(const float *x, const float *w, const float *b, float *y, int64_t M,
                   int64_t N, int64_t K, int threads) {
    if (M >= BC_MIN_ROWS) {
        linear_broadcast(x, w, b, y, M, N, K, threads);
        return;
    }
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

/* The broadcast tiles with AVX-512F, for 13 to 16 rows: one column of sixteen input rows a
 * vector, four weight rows a tile (fewer rows at once stream better than more: on an AMX
 * Xeon, 16 rows of a decode step's products 37 ms with the dot products below, 33 ms this
 * way, with 6 weight rows 33, with 12 rows 37; at 12 rows a tie, and from 17 rows a second,
 * mostly padded column loses to the dot products). Each sum runs over k as in the AVX2 tiles
 * (the same restarts): the same bits as those. */
#define BC512_MIN_ROWS 13
#define BC512_MAX_ROWS 16
#define BC512_R 4

__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
bc_tile16(const float *w, int64_t K, const float *xt, int64_t ld, const int R, int prefetch,
          float *sums) {
    for (int i = 0; i < R * 16; ++i) sums[i] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += BC_SPAN) {
        const int64_t k1 = k0 + BC_SPAN < K ? k0 + BC_SPAN : K;
        __m512 acc[BC512_R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t kk = k0; kk < k1; kk += 16) {
            if (prefetch)
                for (int r = 0; r < R; ++r)
                    _mm_prefetch((const char *)(w + (2 * R + r) * K + kk), _MM_HINT_T1);
            const int64_t ke = kk + 16 < k1 ? kk + 16 : k1;
#pragma GCC unroll 4
            for (int64_t k = kk; k < ke; ++k) {
                const __m512 xv = _mm512_loadu_ps(xt + k * ld);
                for (int r = 0; r < R; ++r)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r * K + k]), xv, acc[r]);
            }
        }
        for (int r = 0; r < R; ++r)
            _mm512_storeu_ps(sums + r * 16, _mm512_add_ps(_mm512_loadu_ps(sums + r * 16), acc[r]));
    }
}

__attribute__((target("avx512f")))
static void linear_broadcast_avx512(const float *x, const float *w, const float *b, float *y,
                                    int64_t M, int64_t N, int64_t K, int threads) {
    float *cols = columns(x, M, K, 16);  /* M <= 16: one column */
    if (!cols) return;
    const int64_t blocks = (N + BC512_R - 1) / BC512_R;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * BC512_R, R = N - n0 < BC512_R ? N - n0 : BC512_R;
        float sums[BC512_R * 16];
        if (R == BC512_R) bc_tile16(w + n0 * K, K, cols, 16, BC512_R, 1, sums);
        else
            for (int64_t r = 0; r < R; ++r)
                bc_tile16(w + (n0 + r) * K, K, cols, 16, 1, 0, sums + r * 16);
        for (int64_t r = 0; r < R; ++r) {
            const float bias = b ? b[n0 + r] : 0.0f;
            for (int64_t j = 0; j < M; ++j) y[j * N + n0 + r] = sums[r * 16 + j] + bias;
        }
    }
}

/* The same products on CPUs with AVX-512F, as dot products but for 13 to 16 rows:
 * sixteen floats a vector and 32 registers, so four input rows share each block of four weight
 * rows (16 sums in registers; the weights are read from L1 a quarter as often as with AVX2's
 * two rows). K's tail through masked loads. Fixed order: the same bits for any thread count
 * (not the AVX2 dot products' bits: other lanes). 13 to 16 rows: the broadcast tiles above. */
__attribute__((target("avx512f")))
void wb_linear_f32_avx512(const float *x, const float *w, const float *b, float *y, int64_t M,
                          int64_t N, int64_t K, int threads) {
    if (M >= BC512_MIN_ROWS && M <= BC512_MAX_ROWS) {
        linear_broadcast_avx512(x, w, b, y, M, N, K, threads);
        return;
    }
    const int64_t blocks = (N + 3) / 4, K16 = K & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (K & 15)) - 1);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * 4, R = N - n0 < 4 ? N - n0 : 4;
        const float *wr[4];
        for (int r = 0; r < 4; ++r) wr[r] = w + (n0 + (r < R ? r : 0)) * K;  /* extra: discarded */
        for (int64_t m = 0; m < M; m += 4) {
            const int64_t P = M - m < 4 ? M - m : 4;
            const float *xr[4];
            for (int p = 0; p < 4; ++p) xr[p] = x + (m + (p < P ? p : 0)) * K;
            __m512 a[4][4];
            for (int p = 0; p < 4; ++p)
                for (int r = 0; r < 4; ++r) a[p][r] = _mm512_setzero_ps();
            for (int64_t k = 0; k < K16; k += 16) {
                if (m == 0)
                    for (int r = 0; r < 4; ++r)
                        _mm_prefetch((const char *)(w + (n0 + 4 + r) * K + k), _MM_HINT_T0);
                __m512 wv[4];
                for (int r = 0; r < 4; ++r) wv[r] = _mm512_loadu_ps(wr[r] + k);
                for (int p = 0; p < 4; ++p) {
                    const __m512 xv = _mm512_loadu_ps(xr[p] + k);
                    for (int r = 0; r < 4; ++r) a[p][r] = _mm512_fmadd_ps(wv[r], xv, a[p][r]);
                }
            }
            if (tail) {
                __m512 wv[4];
                for (int r = 0; r < 4; ++r) wv[r] = _mm512_maskz_loadu_ps(tail, wr[r] + K16);
                for (int p = 0; p < 4; ++p) {
                    const __m512 xv = _mm512_maskz_loadu_ps(tail, xr[p] + K16);
                    for (int r = 0; r < 4; ++r) a[p][r] = _mm512_fmadd_ps(wv[r], xv, a[p][r]);
                }
            }
            for (int64_t p = 0; p < P; ++p)
                for (int64_t r = 0; r < R; ++r)
                    y[(m + p) * N + n0 + r] = _mm512_reduce_add_ps(a[p][r]) +
                                              (b ? b[n0 + r] : 0.0f);
        }
    }
}

/* bfloat16 <-> float32: round to nearest even, as torch does. */
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
#define WB_BF16_BC_MIN_ROWS 12  /* 12 to 16 rows (an even K): broadcast tiles */
#define WB_BF16_BC_R 4

/* 12 to 16 rows as broadcast tiles, as the float32 ones: x transposed into one column of
 * sixteen rows a vector, each row's lane holding a pair of its k (xt[k/2][16] pairs), each
 * pair of a weight row's k broadcast, VDPBF16PS adding both products into every row's sum at
 * once; four weight rows a tile, the tiles two ahead prefetched into L2. On an AMX Xeon with
 * oneDNN limited to AVX-512 BF16 (as on a CPU without AMX), a step's 16-row products 38.7 ms
 * as dot products, 34.7 with oneDNN, 26.2 this way. */
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void linear_bf16_broadcast(const uint16_t *x, const uint16_t *w, const uint16_t *b,
                                  uint16_t *y, int64_t M, int64_t N, int64_t K, int threads) {
    const int64_t KP = K / 2;
    uint32_t *xt = wb_scratch(KP * 16 * 4);
    if (!xt) return;
    for (int64_t kp = 0; kp < KP; ++kp)
        for (int64_t m = 0; m < 16; ++m)
            xt[kp * 16 + m] = m < M ? (uint32_t)x[m * K + 2 * kp]
                                      | (uint32_t)x[m * K + 2 * kp + 1] << 16 : 0;
    const uint32_t *cols = xt;
    const int64_t blocks = (N + WB_BF16_BC_R - 1) / WB_BF16_BC_R;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * WB_BF16_BC_R;
        const int64_t R = N - n0 < WB_BF16_BC_R ? N - n0 : WB_BF16_BC_R;
        const uint16_t *wb = w + n0 * K;
        __m512 acc[WB_BF16_BC_R];
        for (int r = 0; r < WB_BF16_BC_R; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t kp0 = 0; kp0 < KP; kp0 += 16) {  /* a cache line of each weight row */
            for (int64_t r = 0; r < R; ++r)
                _mm_prefetch((const char *)(wb + (2 * WB_BF16_BC_R + r) * K + 2 * kp0),
                             _MM_HINT_T1);
            const int64_t ke = kp0 + 16 < KP ? kp0 + 16 : KP;
            for (int64_t kp = kp0; kp < ke; ++kp) {
                const __m512bh xv = (__m512bh)_mm512_load_si512(cols + kp * 16);
                for (int64_t r = 0; r < R; ++r) {
                    uint32_t pair;
                    __builtin_memcpy(&pair, wb + r * K + 2 * kp, 4);
                    acc[r] = _mm512_dpbf16_ps(acc[r], xv,
                                              (__m512bh)_mm512_set1_epi32((int)pair));
                }
            }
        }
        for (int64_t r = 0; r < R; ++r) {
            float sums[16];
            _mm512_storeu_ps(sums, acc[r]);
            const float bias = b ? wb_bf16_to_f32(b[n0 + r]) : 0.0f;
            for (int64_t m = 0; m < M; ++m) y[m * N + n0 + r] = wb_round_bf16(sums[m] + bias);
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
void wb_linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                    int64_t M, int64_t N, int64_t K, int threads) {
    if (M >= WB_BF16_BC_MIN_ROWS && M <= 16 && K % 2 == 0) {
        linear_bf16_broadcast(x, w, b, y, M, N, K, threads);
        return;
    }
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

/* bfloat16 products on CPUs with AMX (the "amx" kernel): TDPBF16PS multiplies a tile of up to 16
 * input rows x 32 of K by a tile of 32 of K x 16 weight rows, accumulating float32 in a tile of
 * 16 x 16. The weights are repacked once (`wb_amx_pack`) into the tiles' layout, zero padded
 * to whole tiles: wp[N/16][K/32][16 pairs of k][16 rows][2]; each block of 2 x 16 weight rows
 * streams through once per call while every 16 input rows (copied into zero padded tiles)
 * multiply with it. float32 sums, one rounding to bf16 (nearest even) with the bias: the same
 * semantics as `wb_linear_bf16` (a sum's order inside a tile is the hardware's). The OS must
 * grant the process AMX's tile state first (`wb_amx_enable`). On an AMX Xeon, a decode step's
 * products for SmolLM2: 11.3 ms at one row (12.2 with AVX-512 BF16, 15.1 with oneDNN), 12.0
 * at sixteen (37.2, 15.8). GCC 11 / clang 12 and later; older compilers leave it out. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)

int wb_amx_enable(void) {  /* arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): 0 if granted */
    return (int)syscall(SYS_arch_prctl, 0x1023, 18);
}

static inline int64_t wb_round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* w [N, K] -> wp (wb_round_up(N, 16) * wb_round_up(K, 32) elements), the tiles' layout */
void wb_amx_pack(const uint16_t *w, uint16_t *wp, int64_t N, int64_t K) {
    const int64_t KC = wb_round_up(K, 32) / 32, NP = wb_round_up(N, 16);
    for (int64_t n = 0; n < NP; ++n)
        for (int64_t k = 0; k < KC * 32; ++k)
            wp[((n / 16 * KC + k / 32) * 16 + k % 32 / 2) * 32 + n % 16 * 2 + (k & 1)] =
                n < N && k < K ? w[n * K + k] : 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} wb_tile_config;

__attribute__((target("amx-tile,amx-bf16")))
void wb_linear_bf16_amx(const uint16_t *x, const uint16_t *wp, const uint16_t *b, uint16_t *y,
                        int64_t M, int64_t N, int64_t K, int threads) {
    const int64_t KC = wb_round_up(K, 32) / 32, MP = wb_round_up(M, 16);
    const int64_t NB = wb_round_up(N, 16) / 16, ld = KC * 32;
    uint16_t *xt = wb_scratch(MP * ld * 2);  /* x in whole tiles */
    if (!xt) return;
    for (int64_t m = 0; m < MP; ++m) {
        if (m < M) memcpy(xt + m * ld, x + m * K, (size_t)(K * 2));
        memset(xt + m * ld + (m < M ? K : 0), 0, (size_t)((ld - (m < M ? K : 0)) * 2));
    }
    const uint16_t *xp = xt;
#pragma omp parallel num_threads(threads)
    {
        wb_tile_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int t = 0; t < 5; ++t) {  /* A, B0, B1, C0, C1: 16 rows of 64 bytes each */
            cfg.rows[t] = 16;
            cfg.colsb[t] = 64;
        }
        _tile_loadconfig(&cfg);
        float c[2][16][16];
#pragma omp for schedule(static)
        for (int64_t nb = 0; nb < NB; nb += 2) {  /* two blocks of 16 weight rows at a time */
            const int two = nb + 1 < NB;
            const uint16_t *w0 = wp + nb * KC * 512, *w1 = w0 + KC * 512;
            for (int64_t m0 = 0; m0 < MP; m0 += 16) {
                _tile_zero(3);
                _tile_zero(4);
                for (int64_t kc = 0; kc < KC; ++kc) {
                    _tile_loadd(0, xp + m0 * ld + kc * 32, ld * 2);
                    _tile_loadd(1, w0 + kc * 512, 64);
                    _tile_dpbf16ps(3, 0, 1);
                    if (two) {
                        _tile_loadd(2, w1 + kc * 512, 64);
                        _tile_dpbf16ps(4, 0, 2);
                    }
                }
                _tile_stored(3, c[0], 64);
                if (two) _tile_stored(4, c[1], 64);
                for (int t = 0; t <= two; ++t)
                    for (int64_t i = 0; i < 16 && m0 + i < M; ++i)
                        for (int64_t j = 0; j < 16 && (nb + t) * 16 + j < N; ++j) {
                            const int64_t n = (nb + t) * 16 + j;
                            y[(m0 + i) * N + n] =
                                wb_round_bf16(c[t][i][j] + (b ? wb_bf16_to_f32(b[n]) : 0.0f));
                        }
            }
        }
        _tile_release();
    }
}
#endif

/* The small ops between the projections (decode attention, residual add + RMSNorm, rotary
 * embedding + KV write, SiLU gating), float32 or bfloat16 (`bf16`), eight floats at a time in
 * AVX2. Each computes in float32 and rounds to the dtype where torch's ops would; sizes must be
 * multiples of 8 (of 16 for a rotated head), else the function returns -1 and the caller runs
 * torch's ops instead. */

static inline __m256 wb_load8(const void *src, int bf16, int64_t i) {
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)src + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)src + i);
}

/* v rounded to bfloat16 (nearest even; NaN stays a quiet NaN), as the high halves of 8 words */
static inline __m256i wb_bf16_bits8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    return _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
}

/* v rounded to the dtype and back to float32 (what a torch op in that dtype leaves) */
static inline __m256 wb_round8(__m256 v, int bf16) {
    return bf16 ? _mm256_castsi256_ps(wb_bf16_bits8(v)) : v;
}

static inline void wb_store8(void *dst, int64_t i, __m256 v, int bf16) {
    if (bf16) {
        const __m256i hi = _mm256_srli_epi32(wb_bf16_bits8(v), 16);
        _mm_storeu_si128((__m128i *)((uint16_t *)dst + i),
                         _mm_packus_epi32(_mm256_castsi256_si128(hi),
                                          _mm256_extracti128_si256(hi, 1)));
    } else {
        _mm256_storeu_ps((float *)dst + i, v);
    }
}

/* e^x for x <= 88 (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n; within
 * 2 ulp), x clamped at -86 below: never a denormal result (each costs a slow microcode
 * assist), and e^-86 is nothing beside the terms that softmax or silu add it to. */
static inline __m256 wb_exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-86.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                  23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* A single row's work stays on the calling thread: a parallel region costs more than it does.
 * From about four rows on, both: a product just wrote half of their input from each core. */
static inline int wb_threads_for(int64_t elements, int threads) {
    return elements < 4096 ? 1 : threads;
}

/* Decode attention over a paged KV cache: one query token per sequence against its context,
 * read in place through its cache slots (no gathered copy).
 *
 * q [B, Hq, D] (q_stride elements between sequences); k_cache, v_cache [S, Hkv, D]; slots
 * [B, Lmax] (slot_stride elements between rows; row b's first lengths[b] are its context, in
 * order); out [B, Hq, D]. Query head h reads KV head h / (Hq / Hkv), as transformers'
 * repeat_kv. Scores, softmax (max subtracted) and the weighted sum of values in float32,
 * rounded once into out's dtype. One (sequence, KV head) pair is one thread's, its G query
 * heads together so that each key and value row is read (and converted) once for up to four
 * of them; two keys at a time (independent sums). Fixed order: the same bits for any thread
 * count. */
#define WB_ATTN_MAX_D 256
#define WB_ATTN_MAX_G 16
#define WB_ATTN_AHEAD 8

/* Scores of two keys k0, k1 against GN (<= 4) query heads qf (scaled, float32): out[g][j].
 * Inlined with constant GN and bf16, so the sums stay in registers. */
static inline __attribute__((always_inline)) void
wb_scores2(const void *k0, const void *k1, const float (*qf)[WB_ATTN_MAX_D], int64_t D,
           const int bf16, const int GN, float out[4][2]) {
    __m256 s[4][2];
    for (int g = 0; g < GN; ++g) s[g][0] = s[g][1] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        const __m256 a = wb_load8(k0, bf16, d), b = wb_load8(k1, bf16, d);
        for (int g = 0; g < GN; ++g) {
            const __m256 qv = _mm256_loadu_ps(qf[g] + d);
            s[g][0] = _mm256_fmadd_ps(qv, a, s[g][0]);
            s[g][1] = _mm256_fmadd_ps(qv, b, s[g][1]);
        }
    }
    for (int g = 0; g < GN; ++g) {
        out[g][0] = hsum(s[g][0]);
        out[g][1] = hsum(s[g][1]);
    }
}

/* The weighted sum of the L value rows (v: the first of head h's dims d0.. in slot 0's row)
 * for GN (<= 3) heads and NV (<= 4) vectors of 8 dims: 12 sums in registers at most, each
 * value row read and converted once for the GN heads. out = sum * inv[g]. */
static inline __attribute__((always_inline)) void
wb_values(const void *v, const int64_t *slots, int64_t L, int64_t row, const float *scores,
          const float *inv, void *out, int64_t out_at, int64_t D, const int bf16, const int GN,
          const int NV) {
    const int64_t esize = bf16 ? 2 : 4;
    __m256 a[3][4];
    for (int g = 0; g < GN; ++g)
        for (int j = 0; j < NV; ++j) a[g][j] = _mm256_setzero_ps();
    for (int64_t l = 0; l < L; ++l) {
        const void *vr = (const char *)v + slots[l] * row * esize;
        __m256 x[4];
        for (int j = 0; j < NV; ++j) x[j] = wb_load8(vr, bf16, 8 * j);
        for (int g = 0; g < GN; ++g) {
            const __m256 p = _mm256_set1_ps(scores[g * L + l]);
            for (int j = 0; j < NV; ++j) a[g][j] = _mm256_fmadd_ps(p, x[j], a[g][j]);
        }
    }
    for (int g = 0; g < GN; ++g)
        for (int j = 0; j < NV; ++j)
            wb_store8(out, out_at + g * D + 8 * j, _mm256_mul_ps(a[g][j], _mm256_set1_ps(inv[g])),
                      bf16);
}

/* What a score becomes before the softmax (`wb_paged_attention`): soft-capped (cap > 0:
 * tanh(s / cap) * cap, Gemma 2's), plus ALiBi's bias for its query head at key position pos
 * (slope * pos rounded to the dtype, then times alibi_scale rounded again where it is not 1:
 * `attention.Alibi.bias`). None of these: the score as it is. */
typedef struct {
    float softcap;        /* 0: none */
    const float *alibi;   /* [Hq] slopes, or NULL */
    float alibi_scale;
    int64_t first_pos;    /* the position of the first key read */
} wb_score_fix;

static inline float wb_round_to(float f, int bf16) {
    return bf16 ? wb_bf16_to_f32(wb_round_bf16(f)) : f;
}

static inline float wb_fix_score(float s, const wb_score_fix *fix, int64_t head, int64_t pos,
                                 int bf16) {
    if (fix->softcap > 0.0f) s = tanhf(s / fix->softcap) * fix->softcap;
    if (fix->alibi) {
        float bias = wb_round_to(fix->alibi[head] * (float)pos, bf16);
        if (fix->alibi_scale != 1.0f) bias = wb_round_to(bias * fix->alibi_scale, bf16);
        s += bias;
    }
    return s;
}

static void wb_attend_one(const void *q, const void *k_cache, const void *v_cache,
                          const int64_t *slots, int64_t L, void *out, int64_t Hkv, int64_t h,
                          int64_t G, int64_t D, float scale, int bf16, float *scores,
                          const wb_score_fix *fix) {
    const int64_t esize = bf16 ? 2 : 4, row = Hkv * D;
    float qf[WB_ATTN_MAX_G][WB_ATTN_MAX_D];
    float mx[WB_ATTN_MAX_G], sum[WB_ATTN_MAX_G];
    for (int64_t g = 0; g < G; ++g) {
        const void *qg = (const char *)q + (h * G + g) * D * esize;
        for (int64_t d = 0; d < D; d += 8) {
            _mm256_storeu_ps(qf[g] + d, _mm256_mul_ps(wb_load8(qg, bf16, d),
                                                      _mm256_set1_ps(scale)));
        }
        mx[g] = -__builtin_inff();
    }
    const int64_t bytes = D * esize;
    for (int64_t l = 0; l < WB_ATTN_AHEAD && l < L; ++l)
        for (int64_t c = 0; c < bytes; c += 64)
            _mm_prefetch((const char *)k_cache + (slots[l] * row + h * D) * esize + c,
                         _MM_HINT_T0);
    for (int64_t l = 0; l < L; l += 2) {  /* scores: two keys, up to four heads at a time */
        const void *k0 = (const char *)k_cache + (slots[l] * row + h * D) * esize;
        const void *k1 = l + 1 < L ? (const char *)k_cache + (slots[l + 1] * row + h * D) * esize
                                   : k0;
        /* the context is scattered over the cache's blocks, out of the prefetchers' sight: the
         * keys WB_ATTN_AHEAD ahead, and the values of these two (read after the softmax) */
        for (int64_t j = l; j < l + 2 && j < L; ++j)
            for (int64_t c = 0; c < bytes; c += 64) {
                if (j + WB_ATTN_AHEAD < L)
                    _mm_prefetch((const char *)k_cache + (slots[j + WB_ATTN_AHEAD] * row + h * D)
                                 * esize + c, _MM_HINT_T0);
                _mm_prefetch((const char *)v_cache + (slots[j] * row + h * D) * esize + c,
                             _MM_HINT_T0);
            }
        for (int64_t g0 = 0; g0 < G; g0 += 4) {
            const int64_t gn = G - g0 < 4 ? G - g0 : 4;
            const float (*qg)[WB_ATTN_MAX_D] = qf + g0;
            float sc[4][2];
            switch (gn + 4 * !!bf16) {
            case 1: wb_scores2(k0, k1, qg, D, 0, 1, sc); break;
            case 2: wb_scores2(k0, k1, qg, D, 0, 2, sc); break;
            case 3: wb_scores2(k0, k1, qg, D, 0, 3, sc); break;
            case 4: wb_scores2(k0, k1, qg, D, 0, 4, sc); break;
            case 5: wb_scores2(k0, k1, qg, D, 1, 1, sc); break;
            case 6: wb_scores2(k0, k1, qg, D, 1, 2, sc); break;
            case 7: wb_scores2(k0, k1, qg, D, 1, 3, sc); break;
            default: wb_scores2(k0, k1, qg, D, 1, 4, sc); break;
            }
            for (int64_t g = 0; g < gn; ++g)
                for (int j = 0; j < 2 && l + j < L; ++j) {
                    const float s = fix ? wb_fix_score(sc[g][j], fix, h * G + g0 + g,
                                                       fix->first_pos + l + j, bf16)
                                        : sc[g][j];
                    scores[(g0 + g) * L + l + j] = s;
                    if (s > mx[g0 + g]) mx[g0 + g] = s;
                }
        }
    }
    for (int64_t g = 0; g < G; ++g) {  /* softmax numerators and their sum */
        float *sg = scores + g * L;
        const __m256 m = _mm256_set1_ps(mx[g]);
        __m256 total = _mm256_setzero_ps();
        int64_t l = 0;
        for (; l + 8 <= L; l += 8) {
            const __m256 e = wb_exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + l), m));
            _mm256_storeu_ps(sg + l, e);
            total = _mm256_add_ps(total, e);
        }
        float t = hsum(total);
        if (l < L) {
            float tail[8] = {0}, e8[8];
            for (int64_t j = l; j < L; ++j) tail[j - l] = sg[j] - mx[g];
            _mm256_storeu_ps(e8, wb_exp8(_mm256_loadu_ps(tail)));
            for (int64_t j = l; j < L; ++j) {
                sg[j] = e8[j - l];
                t += e8[j - l];
            }
        }
        sum[g] = t;
    }
    float inv[WB_ATTN_MAX_G];
    for (int64_t g = 0; g < G; ++g) inv[g] = 1.0f / sum[g];
    for (int64_t g0 = 0; g0 < G; g0 += 3) {  /* the weighted sums of values */
        const int64_t gn = G - g0 < 3 ? G - g0 : 3;
        for (int64_t d0 = 0; d0 < D; d0 += 32) {
            const void *v = (const char *)v_cache + (h * D + d0) * esize;
            const float *sg = scores + g0 * L, *ig = inv + g0;
            const int64_t at = (h * G + g0) * D + d0;
            switch ((D - d0 >= 32 ? 4 : (D - d0) / 8) * 8 + gn * 2 + !!bf16) {
#define WB_VALUES(NV, GN, BF) \
            case NV * 8 + GN * 2 + BF: \
                wb_values(v, slots, L, row, sg, ig, out, at, D, BF, GN, NV); \
                break;
            WB_VALUES(4, 3, 0) WB_VALUES(4, 3, 1) WB_VALUES(4, 2, 0) WB_VALUES(4, 2, 1)
            WB_VALUES(4, 1, 0) WB_VALUES(4, 1, 1) WB_VALUES(3, 3, 0) WB_VALUES(3, 3, 1)
            WB_VALUES(3, 2, 0) WB_VALUES(3, 2, 1) WB_VALUES(3, 1, 0) WB_VALUES(3, 1, 1)
            WB_VALUES(2, 3, 0) WB_VALUES(2, 3, 1) WB_VALUES(2, 2, 0) WB_VALUES(2, 2, 1)
            WB_VALUES(2, 1, 0) WB_VALUES(2, 1, 1) WB_VALUES(1, 3, 0) WB_VALUES(1, 3, 1)
            WB_VALUES(1, 2, 0) WB_VALUES(1, 2, 1) WB_VALUES(1, 1, 0) WB_VALUES(1, 1, 1)
#undef WB_VALUES
            }
        }
    }
}

/* Rows b of q against their contexts: slots + offsets[b] (or + b * slot_stride without
 * offsets), the last `window` keys where window > 0, scores fixed as `fix` says (NULL: as they
 * are); the shared loop of `wb_decode_attention` and `wb_paged_attention`. */
static int wb_attend_rows(const void *q, int64_t q_stride, const void *k_cache,
                          const void *v_cache, const int64_t *slots, const int64_t *offsets,
                          int64_t slot_stride, const int64_t *lengths, int64_t window,
                          const wb_score_fix *fix, void *out, int64_t B, int64_t Hq,
                          int64_t Hkv, int64_t D, int64_t Lmax, float scale, int bf16,
                          int threads) {
    const int64_t G = Hkv > 0 ? Hq / Hkv : 0, esize = bf16 ? 2 : 4, items = B * Hkv;
    if (D % 8 || D > WB_ATTN_MAX_D || G < 1 || G > WB_ATTN_MAX_G || G * Hkv != Hq) return -1;
    for (int64_t b = 0; b < B; ++b)
        if (lengths[b] < 1 || lengths[b] > Lmax) return -1;
    if (threads > items) threads = (int)items;
    if (threads < 1) threads = 1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = (float *)__builtin_malloc(sizeof(float) * (size_t)(G * Lmax));
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items; ++item) {
            const int64_t b = item / Hkv, L = lengths[b];
            const int64_t first = window > 0 && L > window ? L - window : 0;
            wb_score_fix at;
            if (fix) {
                at = *fix;
                at.first_pos = first;
            }
            if (scores)
                wb_attend_one((const char *)q + b * q_stride * esize, k_cache, v_cache,
                              slots + (offsets ? offsets[b] : b * slot_stride) + first,
                              L - first, (char *)out + b * Hq * D * esize, Hkv, item % Hkv, G,
                              D, scale, bf16, scores, fix ? &at : 0);
            else {
#pragma omp atomic write
                failed = 1;
            }
        }
        __builtin_free(scores);
    }
    return failed ? -2 : 0;
}

int wb_decode_attention(const void *q, int64_t q_stride, const void *k_cache,
                        const void *v_cache, const int64_t *slots, int64_t slot_stride,
                        const int64_t *lengths, void *out, int64_t B, int64_t Hq, int64_t Hkv,
                        int64_t D, int64_t Lmax, float scale, int bf16, int threads) {
    return wb_attend_rows(q, q_stride, k_cache, v_cache, slots, 0, slot_stride, lengths, 0, 0,
                          out, B, Hq, Hkv, D, Lmax, scale, bf16, threads);
}

/* Attention for any query token of any sequence, the batch-invariant engine's (prefill chunks
 * and decodes alike): query row b (q [B, Hq, D], q_stride elements apart) at position
 * lengths[b] - 1 attends to its context's keys 0 .. lengths[b] - 1, whose cache slots are
 * slots[offsets[b] ..] (a sequence's rows share one run of slots), its last `window` of them
 * where window > 0, scores soft-capped and ALiBi-biased as `wb_fix_score` says. Each (row, KV
 * head) is `wb_attend_one`'s, in its fixed order over the keys it reads: a row's output depends
 * on its query and its context only, never on the other rows, the thread count, or whether the
 * row is a prefill's or a decode's (the same bits as `wb_decode_attention` without window,
 * cap or bias). Returns -1 for a shape it does not take (as `wb_decode_attention`), -2 when out
 * of memory. */
int wb_paged_attention(const void *q, int64_t q_stride, const void *k_cache,
                       const void *v_cache, const int64_t *slots, const int64_t *offsets,
                       const int64_t *lengths, int64_t window, float softcap,
                       const float *alibi, float alibi_scale, void *out, int64_t B, int64_t Hq,
                       int64_t Hkv, int64_t D, int64_t Lmax, float scale, int bf16,
                       int threads) {
    const wb_score_fix fix = {softcap, alibi, alibi_scale, 0};
    return wb_attend_rows(q, q_stride, k_cache, v_cache, slots, offsets, 0, lengths, window,
                          softcap > 0.0f || alibi ? &fix : 0, out, B, Hq, Hkv, D, Lmax, scale,
                          bf16, threads);
}

/* The residual add and RMSNorm of a pre-norm decoder layer in one pass: sum = hidden (+ delta),
 * rounded to the dtype as torch's add; normed = dtype(dtype(sum * 1 / sqrt(mean(sum^2) + eps))
 * * weight), the ops and roundings of transformers' Llama-family RMSNorm (statistics in
 * float32), the mean summed in a fixed order (torch's own order may differ in the last bit).
 * hidden, delta, sum, normed [M, H]; weight [H]; delta may be NULL (sum is then not written). */
int wb_add_rms_norm(const void *hidden, const void *delta, const void *weight, void *sum,
                    void *normed, int64_t M, int64_t H, float eps, int bf16, int threads) {
    if (H % 8) return -1;
#pragma omp parallel for num_threads(wb_threads_for(M * H, threads)) schedule(static)
    for (int64_t m = 0; m < M; ++m) {
        const int64_t at = m * H;
        const void *src = hidden;
        __m256 acc = _mm256_setzero_ps();
        if (delta) {
            for (int64_t h = 0; h < H; h += 8)
                wb_store8(sum, at + h, _mm256_add_ps(wb_load8(hidden, bf16, at + h),
                                                     wb_load8(delta, bf16, at + h)), bf16);
            src = sum;  /* the rounded sum, what torch's norm reads */
        }
        for (int64_t h = 0; h < H; h += 8) {
            const __m256 v = wb_load8(src, bf16, at + h);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / __builtin_sqrtf(hsum(acc) / (float)H + eps));
        for (int64_t h = 0; h < H; h += 8) {
            const __m256 n = wb_round8(_mm256_mul_ps(wb_load8(src, bf16, at + h), inv), bf16);
            wb_store8(normed, at + h, _mm256_mul_ps(n, wb_load8(weight, bf16, h)), bf16);
        }
    }
    return 0;
}

/* Rotary embedding of a step's queries and keys, and its keys and values written into the KV
 * cache, in one pass: qkv [T, (Hq + 2 Hkv) D] (ld elements between rows; queries, keys,
 * values), cos and signed_sin [T, D] (sin with its first half negated) -> q_out [T, Hq, D],
 * and rows slots[t] of k_cache and v_cache [S, Hkv, D]. Each element is x * cos +
 * rotate_half(x) * signed_sin with the roundings of torch's ops in that dtype (the products,
 * then their sum), so the result is bit for bit the decoder's `_rotate`. */
static inline void wb_rotate_head(const void *x, int64_t at, const void *cos, const void *sin,
                                  int64_t ct, int64_t D, int bf16, void *dst, int64_t dat) {
    const int64_t half = D / 2;
    for (int64_t j = 0; j < D; j += 8) {
        const __m256 a = wb_round8(_mm256_mul_ps(wb_load8(x, bf16, at + j),
                                                 wb_load8(cos, bf16, ct + j)), bf16);
        const __m256 r = wb_load8(x, bf16, at + (j < half ? j + half : j - half));
        const __m256 b = wb_round8(_mm256_mul_ps(r, wb_load8(sin, bf16, ct + j)), bf16);
        wb_store8(dst, dat + j, _mm256_add_ps(a, b), bf16);
    }
}

int wb_rope_write_kv(const void *qkv, int64_t ld, const void *cos, const void *sin,
                     const int64_t *slots, void *q_out, void *k_cache, void *v_cache, int64_t T,
                     int64_t Hq, int64_t Hkv, int64_t D, int bf16, int threads) {
    const int64_t esize = bf16 ? 2 : 4;
    if (D % 16) return -1;
#pragma omp parallel for num_threads(wb_threads_for(T * (Hq + 2 * Hkv) * D, threads)) \
    schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const int64_t row = t * ld, ct = t * D, slot = slots[t];
        for (int64_t h = 0; h < Hq; ++h)
            wb_rotate_head(qkv, row + h * D, cos, sin, ct, D, bf16, q_out, (t * Hq + h) * D);
        for (int64_t h = 0; h < Hkv; ++h)
            wb_rotate_head(qkv, row + (Hq + h) * D, cos, sin, ct, D, bf16, k_cache,
                           (slot * Hkv + h) * D);
        __builtin_memcpy((char *)v_cache + slot * Hkv * D * esize,
                         (const char *)qkv + (row + (Hq + Hkv) * D) * esize,
                         (size_t)(Hkv * D * esize));
    }
    return 0;
}

/* A gated MLP's activation: gate_up [M, 2F] (gate, then up, per row) -> out [M, F] =
 * silu(gate) * up; silu(g) = g / (1 + e^-g) in float32 (exp as `wb_exp8`: torch's own
 * differs in the last bit), rounded to the dtype, then the product rounded, as torch's two
 * ops. */
int wb_silu_mul(const void *gate_up, void *out, int64_t M, int64_t F, int bf16, int threads) {
    if (F % 8) return -1;
#pragma omp parallel for num_threads(wb_threads_for(M * F, threads)) schedule(static)
    for (int64_t m = 0; m < M; ++m) {
        const int64_t g0 = m * 2 * F, u0 = g0 + F;
        for (int64_t f = 0; f < F; f += 8) {
            const __m256 g = wb_load8(gate_up, bf16, g0 + f);
            /* e^-g, its exponent clamped to float's range (silu is g or 0 beyond it) */
            const __m256 e = wb_exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), g),
                                                   _mm256_set1_ps(86.0f)));
            const __m256 silu = wb_round8(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                                          bf16);
            wb_store8(out, m * F + f, _mm256_mul_ps(silu, wb_load8(gate_up, bf16, u0 + f)), bf16);
        }
    }
    return 0;
}

/* A decode step through every layer of a Llama-family stack in one call, for batches of
 * decodes only (one new token per sequence) whose products all run on one of this file's
 * product functions: the same functions, in the same order, on the same values as the
 * decoder's loop calling them one by one (`engine/decoder.py`), so the same bits, without the
 * interpreter between them (about a tenth of a single stream's step on a small model).
 *
 * layers [num_layers][WB_STACK_PTRS]: per layer the input norm's weight, the fused Q/K/V
 * projection's weight and bias (or NULL), O's, the post-attention norm's weight, the fused
 * gate/up projection's, down's, and the layer's K and V caches [S, Hkv, D]; eps
 * [num_layers][2] the two norms' epsilons. hidden [T, H] (not written) -> out [T, H]: the last
 * layer's output before the final norm. cos and signed_sin [T, D] as `wb_rope_write_kv` takes
 * them; slot_mapping [T] where each token's K/V goes; slots [T, Lmax] (slot_stride between
 * rows) and lengths [T] each sequence's context, as `wb_decode_attention`. linear: the product
 * function for this dtype. Returns 0, or what failed (-2: out of memory; else the code of the
 * function that refused: nothing is partly done that a second try would not redo the same). */
enum { WB_STACK_NORM1, WB_STACK_QKV, WB_STACK_QKV_BIAS, WB_STACK_O, WB_STACK_O_BIAS,
       WB_STACK_NORM2, WB_STACK_GATE_UP, WB_STACK_GATE_UP_BIAS, WB_STACK_DOWN,
       WB_STACK_DOWN_BIAS, WB_STACK_K_CACHE, WB_STACK_V_CACHE, WB_STACK_PTRS };

typedef void (*wb_linear_fn)(const void *x, const void *w, const void *b, void *y, int64_t M,
                             int64_t N, int64_t K, int threads);

int wb_decode_stack(void *const *layers, const float *eps, int64_t num_layers,
                    const void *hidden, void *out, const void *cos, const void *signed_sin,
                    const int64_t *slot_mapping, const int64_t *slots, int64_t slot_stride,
                    const int64_t *lengths, int64_t Lmax, int64_t T, int64_t H, int64_t Hq,
                    int64_t Hkv, int64_t D, int64_t F, float scale, int bf16, void *linear_ptr,
                    int threads) {
    const wb_linear_fn linear = (wb_linear_fn)linear_ptr;
    if (num_layers < 1) return -1;
    const int64_t esize = bf16 ? 2 : 4, W = (Hq + 2 * Hkv) * D;
    /* x: a norm's output; h: the running hidden (in place once the first add wrote it) */
    const int64_t sizes[] = {T * H, T * H, T * W, T * Hq * D, T * Hq * D, T * H, T * 2 * F,
                             T * F, T * H};
    enum { N_BUF = sizeof sizes / sizeof *sizes };
    int64_t total = 0;
    for (int i = 0; i < N_BUF; ++i) total += (sizes[i] + 31) & ~(int64_t)31;
    char *scratch = aligned_alloc(64, (size_t)(total * esize));
    if (!scratch) return -2;
    void *buf[N_BUF];
    for (int64_t i = 0, at = 0; i < N_BUF; at += (sizes[i] + 31) & ~(int64_t)31, ++i)
        buf[i] = scratch + at * esize;
    void *x = buf[0], *sum = buf[1], *qkv = buf[2], *q = buf[3], *attn = buf[4], *o = buf[5],
         *gate_up = buf[6], *y = buf[7], *delta = buf[8];
    const void *h = hidden;
    int code = 0;
    for (int64_t i = 0; i < num_layers && !code; ++i) {
        void *const *p = layers + i * WB_STACK_PTRS;
        void *k_cache = p[WB_STACK_K_CACHE], *v_cache = p[WB_STACK_V_CACHE];
        code = wb_add_rms_norm(h, i ? delta : 0, p[WB_STACK_NORM1], sum, x, T, H, eps[2 * i],
                               bf16, threads);  /* the first layer: nothing to add */
        if (code) break;
        linear(x, p[WB_STACK_QKV], p[WB_STACK_QKV_BIAS], qkv, T, W, H, threads);
        code = wb_rope_write_kv(qkv, W, cos, signed_sin, slot_mapping, q, k_cache, v_cache, T,
                                Hq, Hkv, D, bf16, threads);
        if (code) break;
        code = wb_decode_attention(q, Hq * D, k_cache, v_cache, slots, slot_stride, lengths,
                                   attn, T, Hq, Hkv, D, Lmax, scale, bf16, threads);
        if (code) break;
        linear(attn, p[WB_STACK_O], p[WB_STACK_O_BIAS], o, T, H, Hq * D, threads);
        code = wb_add_rms_norm(h, o, p[WB_STACK_NORM2], sum, x, T, H, eps[2 * i + 1], bf16,
                               threads);
        h = sum;
        if (code) break;
        linear(x, p[WB_STACK_GATE_UP], p[WB_STACK_GATE_UP_BIAS], gate_up, T, 2 * F, H, threads);
        code = wb_silu_mul(gate_up, y, T, F, bf16, threads);
        if (code) break;
        linear(y, p[WB_STACK_DOWN], p[WB_STACK_DOWN_BIAS], delta, T, H, F, threads);
    }
    if (!code)  /* the last layer's MLP output added, rounded as torch's add */
        for (int64_t at = 0; at < T * H; at += 8)
            wb_store8(out, at, _mm256_add_ps(wb_load8(h, bf16, at), wb_load8(delta, bf16, at)),
                      bf16);
    free(scratch);
    return code;
}
