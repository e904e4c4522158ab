#include "wb.h"

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
/* Batch-invariant bfloat16 products (`wb_linear_bf16_invariant`, the batch-invariant engine's):
 * every row, however many come, through broadcast tiles as the 12-16 row ones above (each
 * lane's sum over k's pairs in order from zero, VDPBF16PS, plus the bias, rounded once: the
 * same bits as those for an even K), in panels of 64 rows ([K/2][64] pairs each, zero padded),
 * a chunk of panels that fits L2 at a time, R = 6 weight rows x V <= 4 vectors of sixteen rows
 * a tile (24 sums in registers), 48 weight rows a thread at once (their outputs written as
 * one run per row). A row's bits depend on its own values only: not on how many
 * rows share the call, where it sits among them, nor the thread count. An odd K's last
 * element is a pair with a zero. */
#define INV_BF16_P 64
#define INV_BF16_CHUNK_BYTES (512 * 1024)
#define INV_BF16_GROUP_ROWS 48  /* weight rows a thread takes at once, as the float32 ones */

__attribute__((target("avx512f,avx512bw,avx512bf16"))) static inline
__attribute__((always_inline)) void
inv_bf16_tile(const uint16_t *w, int64_t K, const uint32_t *xt, const int R, const int V,
              int prefetch, float *sums) {
    const int64_t KH = K / 2, KP = (K + 1) / 2;
    __m512 acc[6][4];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t kp0 = 0; kp0 < KH; kp0 += 32) {  /* a cache line of each weight row */
        if (prefetch)
            for (int r = 0; r < R; ++r)
                _mm_prefetch((const char *)(w + (2 * R + r) * K + 2 * kp0), _MM_HINT_T1);
        const int64_t ke = kp0 + 32 < KH ? kp0 + 32 : KH;
#pragma GCC unroll 2
        for (int64_t kp = kp0; kp < ke; ++kp) {
            __m512bh xv[4];
            for (int v = 0; v < V; ++v)
                xv[v] = (__m512bh)_mm512_load_si512(xt + kp * INV_BF16_P + 16 * v);
            for (int r = 0; r < R; ++r) {
                uint32_t pair;
                __builtin_memcpy(&pair, w + r * K + 2 * kp, 4);
                const __m512bh bw = (__m512bh)_mm512_set1_epi32((int)pair);
                for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xv[v], bw);
            }
        }
    }
    if (KP > KH) {  /* an odd K: its last element, paired with a zero */
        __m512bh xv[4];
        for (int v = 0; v < V; ++v)
            xv[v] = (__m512bh)_mm512_load_si512(xt + KH * INV_BF16_P + 16 * v);
        for (int r = 0; r < R; ++r) {
            const __m512bh bw = (__m512bh)_mm512_set1_epi32((int)w[r * K + K - 1]);
            for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xv[v], bw);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) _mm512_storeu_ps(sums + (r * V + v) * 16, acc[r][v]);
}

/* Up to eight rows (a decode step): the same sums in eight lanes (256-bit VDPBF16PS, twice the
 * 512-bit one's count a cycle on CPUs that split 512-bit operations), x as one column of
 * pairs [K/2][8], six weight rows a tile. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
static void inv_bf16_rows8(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                           int64_t M, int64_t N, int64_t K, int threads) {
    const int64_t KH = K / 2, KP = (K + 1) / 2;
    uint32_t *xt = wb_scratch(KP * 8 * 4);
    if (!xt) return;
    for (int64_t kp = 0; kp < KP; ++kp)
        for (int64_t m = 0; m < 8; ++m) {
            uint32_t pair = 0;
            if (m < M && 2 * kp + 1 < K) __builtin_memcpy(&pair, x + m * K + 2 * kp, 4);
            else if (m < M) pair = x[m * K + K - 1];
            xt[kp * 8 + m] = pair;
        }
    const uint32_t *cols = xt;
    const int64_t blocks = (N + 5) / 6;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * 6, R = N - n0 < 6 ? N - n0 : 6;
        const uint16_t *wr = w + n0 * K;
        __m256 acc[6];
        for (int r = 0; r < 6; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t kp0 = 0; kp0 < KH; kp0 += 32) {  /* a cache line of each weight row */
            for (int64_t r = 0; r < R; ++r)
                _mm_prefetch((const char *)(wr + (12 + r) * K + 2 * kp0), _MM_HINT_T0);
            const int64_t ke = kp0 + 32 < KH ? kp0 + 32 : KH;
            if (R == 6) {
#pragma GCC unroll 2
                for (int64_t kp = kp0; kp < ke; ++kp) {
                    const __m256bh xv = (__m256bh)_mm256_load_si256((const __m256i *)(cols + kp * 8));
                    for (int r = 0; r < 6; ++r) {
                        uint32_t pair;
                        __builtin_memcpy(&pair, wr + r * K + 2 * kp, 4);
                        acc[r] = _mm256_dpbf16_ps(acc[r], xv,
                                                  (__m256bh)_mm256_set1_epi32((int)pair));
                    }
                }
            } else {
                for (int64_t kp = kp0; kp < ke; ++kp) {
                    const __m256bh xv = (__m256bh)_mm256_load_si256((const __m256i *)(cols + kp * 8));
                    for (int64_t r = 0; r < R; ++r) {
                        uint32_t pair;
                        __builtin_memcpy(&pair, wr + r * K + 2 * kp, 4);
                        acc[r] = _mm256_dpbf16_ps(acc[r], xv,
                                                  (__m256bh)_mm256_set1_epi32((int)pair));
                    }
                }
            }
        }
        if (KP > KH) {  /* an odd K: its last element, paired with a zero */
            const __m256bh xv = (__m256bh)_mm256_load_si256((const __m256i *)(cols + KH * 8));
            for (int64_t r = 0; r < R; ++r)
                acc[r] = _mm256_dpbf16_ps(acc[r], xv,
                                          (__m256bh)_mm256_set1_epi32((int)wr[r * K + K - 1]));
        }
        for (int64_t r = 0; r < R; ++r) {
            float sums[8];
            _mm256_storeu_ps(sums, acc[r]);
            const float bias = b ? wb_bf16_to_f32(b[n0 + r]) : 0.0f;
            for (int64_t m = 0; m < M; ++m) y[m * N + n0 + r] = wb_round_bf16(sums[m] + bias);
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
void wb_linear_bf16_invariant(const uint16_t *x, const uint16_t *w, const uint16_t *b,
                              uint16_t *y, int64_t M, int64_t N, int64_t K, int threads) {
    if (M <= 8) {
        inv_bf16_rows8(x, w, b, y, M, N, K, threads);
        return;
    }
    const int64_t P = INV_BF16_P, KP = (K + 1) / 2, count = (M + P - 1) / P;
    uint32_t *xp = wb_scratch(count * KP * P * 4);
    if (!xp) return;
    for (int64_t p = 0; p < count; ++p) {  /* the panels: row m's pair kp at [kp][m] */
        uint32_t *panel = xp + p * KP * P;
        for (int64_t i = 0; i < P; ++i) {
            const int64_t m = p * P + i;
            const uint16_t *row = x + m * K;
            if (m >= M) {
                for (int64_t kp = 0; kp < KP; ++kp) panel[kp * P + i] = 0;
                continue;
            }
            for (int64_t kp = 0; kp < K / 2; ++kp) {
                uint32_t pair;
                __builtin_memcpy(&pair, row + 2 * kp, 4);
                panel[kp * P + i] = pair;
            }
            if (K % 2) panel[(KP - 1) * P + i] = row[K - 1];
        }
    }
    int64_t per = INV_BF16_CHUNK_BYTES / (P * KP * 4);
    if (per < 1) per = 1;
    const int64_t groups = (N + INV_BF16_GROUP_ROWS - 1) / INV_BF16_GROUP_ROWS;
    for (int64_t c0 = 0; c0 < count; c0 += per) {
        const int64_t c1 = c0 + per < count ? c0 + per : count;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t g0 = g * INV_BF16_GROUP_ROWS;
            const int64_t width = N - g0 < INV_BF16_GROUP_ROWS ? N - g0 : INV_BF16_GROUP_ROWS;
            float sums[6 * 4 * 16];
            uint16_t rows[INV_BF16_P * INV_BF16_GROUP_ROWS];
            for (int64_t p = c0; p < c1; ++p) {
                const uint32_t *cols = xp + p * KP * P;
                const int64_t live = M - p * P < P ? M - p * P : P;  /* rows of this panel */
                const int V = (int)((live + 15) / 16), first = p == c0;
                for (int64_t n0 = g0; n0 < g0 + width; n0 += 6) {
                    const int64_t R = g0 + width - n0 < 6 ? g0 + width - n0 : 6;
                    const uint16_t *wr = w + n0 * K;
                    if (R == 6) {
                        switch (V) {
                        case 4: inv_bf16_tile(wr, K, cols, 6, 4, first, sums); break;
                        case 3: inv_bf16_tile(wr, K, cols, 6, 3, first, sums); break;
                        case 2: inv_bf16_tile(wr, K, cols, 6, 2, first, sums); break;
                        default: inv_bf16_tile(wr, K, cols, 6, 1, first, sums); break;
                        }
                    } else {
                        for (int64_t r = 0; r < R; ++r) {
                            float *s = sums + r * V * 16;
                            switch (V) {
                            case 4: inv_bf16_tile(wr + r * K, K, cols, 1, 4, 0, s); break;
                            case 3: inv_bf16_tile(wr + r * K, K, cols, 1, 3, 0, s); break;
                            case 2: inv_bf16_tile(wr + r * K, K, cols, 1, 2, 0, s); break;
                            default: inv_bf16_tile(wr + r * K, K, cols, 1, 1, 0, s); break;
                            }
                        }
                    }
                    for (int64_t r = 0; r < R; ++r) {
                        const float bias = b ? wb_bf16_to_f32(b[n0 + r]) : 0.0f;
                        for (int64_t j = 0; j < live; ++j)
                            rows[j * INV_BF16_GROUP_ROWS + n0 - g0 + r] =
                                wb_round_bf16(sums[r * V * 16 + j] + bias);
                    }
                }
                for (int64_t j = 0; j < live; ++j)
                    memcpy(y + (p * P + j) * N + g0, rows + j * INV_BF16_GROUP_ROWS, width * 2);
            }
        }
    }
}
#endif
