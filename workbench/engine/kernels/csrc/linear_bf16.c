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
#endif
