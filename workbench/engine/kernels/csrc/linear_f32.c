/* Few-row float32 matrix products for decoding on x86-64 CPUs with AVX2 and FMA.
 *
 * y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]), row-major, for the few rows of a decode step
 * (one sequence, a beam search, a small batch). BLAS libraries tune their GEMM for many rows and
 * take slow paths for a handful on some CPUs; here the weight matrix is read from memory exactly
 * once per call. Every output is summed over k in order, one fused multiply-add a step,
 * restarted every BC_SPAN steps and added to a running total, however the lanes are laid: one
 * to six rows with eight weight rows in a vector's lanes (`invariant_transposed`, below), seven
 * or more with eight input rows in them (broadcast tiles). So a row's bits depend on its own
 * values only, for any row count and thread count: AVX2's products are the batch-invariant
 * engine's too (`wb_linear_f32_invariant`, the same bits). The AVX-512F functions further down
 * are dot products up to twelve rows (other bits) and their own invariant tiles.
 * Each thread takes a contiguous range of weight rows (OpenMP, the runtime torch itself loaded).
 */
#include "wb.h"

/* Products of seven rows or more (a batch decoding, a wide beam search): dot products are held
 * to about half of what the FMA units do by their horizontal sums and eight accumulators.
 * Here the input is transposed into columns of rows (xt[k][m], zero padded) and
 * each weight element is broadcast and multiplied into whole vectors of them: a tile of R
 * weight rows x V vectors keeps R * V sums in registers (AVX2, 6 x 2: 12 of the 16 registers,
 * 2 + 6 loads a step for 12 multiply-adds, no horizontal sums). Each sum runs over k in order,
 * restarted every BC_SPAN steps and added to a running total (the error grows with
 * BC_SPAN + K / BC_SPAN, not with K): the same bits for any number of rows, any grouping of
 * them, any thread count, and in AVX2's eight lanes or AVX-512F's
 * sixteen. The weight rows two tiles ahead are prefetched into L2: sixteen rows need the
 * weights about as fast as memory gives them, and the hardware prefetchers do not follow six
 * rows at once. On an AMX Xeon limited to AVX2, a 16-row decode step's products: 49 ms as dot
 * products, 36 ms this way (6 rows: a tie). */
#define BC_SPAN 64
#define AVX2  /* no attribute: the library's own flags, -mavx2 -mfma */
#define AVX512F __attribute__((target("avx512f")))
#define BC_INLINE static inline __attribute__((always_inline))
#define BC_PRAGMA(x) _Pragma(#x)

/* A weight broadcast from memory. AVX2's from its address: GCC then keeps a pointer a row,
 * ~5% faster at 512 rows on Zen 4 than the indexed loads it makes of _mm256_set1_ps(w[...]). */
static inline __m256 bc_broadcast256(const float *p) { return _mm256_broadcast_ss(p); }
AVX512F static inline __m512 bc_broadcast512(const float *p) { return _mm512_set1_ps(*p); }

/* Row i of a weight of K columns at w, float32 or (w16) bfloat16, as a byte address. */
#define BC_ROW(w, i, K, w16) ((const char *)(w) + (int64_t)(i) * (K) * ((w16) ? 2 : 4))

/* n bfloat16 weights at w widened into float32 at out (exact: the bf16 bits are a float32's
 * top half), sixteen at a time by unpacking them with zeros below: one 256-bit load, its
 * quadwords put in order 0 2 1 3 so that the in-lane unpacks give k 0-7 and 8-15 (six
 * instructions for sixteen weights, where GCC made fourteen of 128-bit unpacks; a 16-row
 * tile's span on L1-resident data 67 -> 76 GFLOP/s on an AVX2-only EPYC). */
static inline __attribute__((always_inline)) void bc_widen(const uint16_t *w, int64_t n,
                                                           float *out) {
    int64_t i = 0;
    const __m256i zero = _mm256_setzero_si256();
    for (; i + 16 <= n; i += 16) {
        const __m256i v = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)(w + i)),
                                                   0xD8);
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_unpacklo_epi16(zero, v));
        _mm256_storeu_si256((__m256i *)(out + i + 8), _mm256_unpackhi_epi16(zero, v));
    }
    for (; i + 8 <= n; i += 8) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(w + i));
        _mm_storeu_si128((__m128i *)(out + i), _mm_unpacklo_epi16(_mm_setzero_si128(), v));
        _mm_storeu_si128((__m128i *)(out + i + 4), _mm_unpackhi_epi16(_mm_setzero_si128(), v));
    }
    for (; i < n; ++i) out[i] = wb_bf16_to_f32(w[i]);
}

/* The tiles, one body for both vector widths (BITS: 256 or 512; BITS / 32 lanes a vector).
 * bc_tile_ISA: the sums of weight rows w[0..R) (R <= 6) with V vectors (V <= 4) of the columns
 * at xt (row k at xt + k * ld) into sums[(r * V + v) * lanes + lane]; only ever called with
 * constant R and V, so that its loops unroll and the sums stay in registers. bc_sums_ISA: R
 * weight rows (R <= RT) x V vectors (V <= VMAX, a constant: no tiles of more vectors are
 * compiled), a full tile of RT rows at once, prefetching when `first`, fewer a row at a time. */
#define BC_TILES(ISA, TARGET, BITS, UNROLL)                                                    \
    TARGET BC_INLINE void bc_tile_##ISA(const void *wv, int64_t K, const float *xt,            \
                                        int64_t ld, const int R, const int V, int prefetch,    \
                                        const int w16, float *sums) {                          \
        for (int i = 0; i < R * V * (BITS / 32); ++i) sums[i] = 0.0f;                          \
        float wt[6 * BC_SPAN]; /* bf16 weights: the span's rows widened */                     \
        for (int64_t k0 = 0; k0 < K; k0 += BC_SPAN) {                                          \
            const int64_t k1 = k0 + BC_SPAN < K ? k0 + BC_SPAN : K;                            \
            const float *w = (const float *)wv;                                                \
            int64_t wld = K, off = 0;                                                          \
            if (w16) {                                                                         \
                for (int r = 0; r < R; ++r)                                                    \
                    bc_widen((const uint16_t *)wv + r * K + k0, k1 - k0, wt + r * BC_SPAN);    \
                w = wt, wld = BC_SPAN, off = k0;                                               \
            }                                                                                  \
            __m##BITS acc[6][4];                                                               \
            for (int r = 0; r < R; ++r)                                                        \
                for (int v = 0; v < V; ++v) acc[r][v] = _mm##BITS##_setzero_ps();              \
            for (int64_t kk = k0; kk < k1; kk += 16) { /* a cache line of each weight row */   \
                if (prefetch)                                                                  \
                    for (int r = 0; r < R; ++r)                                                \
                        _mm_prefetch(BC_ROW(wv, 2 * R + r, K, w16) + kk * (w16 ? 2 : 4),       \
                                     _MM_HINT_T1);                                             \
                const int64_t ke = kk + 16 < k1 ? kk + 16 : k1;                                \
                BC_PRAGMA(GCC unroll UNROLL)                                                   \
                for (int64_t k = kk; k < ke; ++k) {                                            \
                    __m##BITS xv[4];                                                           \
                    for (int v = 0; v < V; ++v)                                                \
                        xv[v] = _mm##BITS##_loadu_ps(xt + k * ld + (BITS / 32) * v);           \
                    for (int r = 0; r < R; ++r) {                                              \
                        const __m##BITS bw = bc_broadcast##BITS(w + r * wld + k - off);        \
                        for (int v = 0; v < V; ++v)                                            \
                            acc[r][v] = _mm##BITS##_fmadd_ps(bw, xv[v], acc[r][v]);            \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            for (int r = 0; r < R; ++r)                                                        \
                for (int v = 0; v < V; ++v) {                                                  \
                    float *s = sums + (r * V + v) * (BITS / 32);                               \
                    _mm##BITS##_storeu_ps(s, _mm##BITS##_add_ps(_mm##BITS##_loadu_ps(s),       \
                                                                acc[r][v]));                   \
                }                                                                              \
        }                                                                                      \
    }                                                                                          \
    TARGET BC_INLINE void bc_rows_##ISA(const void *w, int64_t K, const float *xt,             \
                                        int64_t ld, const int RT, int64_t R, const int V,      \
                                        int first, const int w16, float *sums) {               \
        if (R == RT) bc_tile_##ISA(w, K, xt, ld, RT, V, first, w16, sums);                     \
        else                                                                                   \
            for (int64_t r = 0; r < R; ++r)                                                    \
                bc_tile_##ISA(BC_ROW(w, r, K, w16), K, xt, ld, 1, V, 0, w16,                   \
                              sums + r * V * (BITS / 32));                                     \
    }                                                                                          \
    TARGET BC_INLINE void bc_sums_##ISA(const void *w, int64_t K, const float *xt,             \
                                        int64_t ld, const int RT, const int VMAX, int64_t R,   \
                                        int V, int first, const int w16, float *sums) {        \
        if (VMAX >= 4 && V == 4) bc_rows_##ISA(w, K, xt, ld, RT, R, 4, first, w16, sums);      \
        else if (VMAX >= 3 && V == 3) bc_rows_##ISA(w, K, xt, ld, RT, R, 3, first, w16, sums); \
        else if (VMAX >= 2 && V == 2) bc_rows_##ISA(w, K, xt, ld, RT, R, 2, first, w16, sums); \
        else bc_rows_##ISA(w, K, xt, ld, RT, R, 1, first, w16, sums);                          \
    }

/* AVX-512F's tiles are up to 6 x 4 (24 sums in registers, 4 + 6 loads a step for 24
 * multiply-adds): unrolled half as much. */
BC_TILES(avx2, AVX2, 256, 4)
BC_TILES(avx512, AVX512F, 512, 2)

/* x [M, K] -> xt [K, ld] (ld: M rounded up to 8, the padding zero), 8 x 8 blocks in registers.
 * Never inlined nor specialized: with a constant ld, GCC loads the padding rows' zeros through
 * masked loads from NULL, which CPUs skip and qemu-user (make test-portable) faults on. */
__attribute__((noinline, noclone)) static void
transpose_rows(const float *x, int64_t M, int64_t K, float *xt, int64_t ld) {
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
void *wb_scratch(int64_t bytes) {
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

/* The products through the tiles, x in columns of ld (M rounded up to whole vectors): each
 * thread takes blocks of RT weight rows, and each block the columns VMAX vectors at a time.
 * MMAX: the most rows a caller passes (AVX-512F: sixteen, so the compiler knows there is one
 * pass: 3% faster at 16 rows on Zen 4 than a loop it cannot count). */
#define BC_LINEAR(ISA, TARGET, LANES, RT, VMAX, MMAX)                                          \
    TARGET static void linear_broadcast_##ISA(const float *x, const float *w, const float *b,  \
                                              float *y, int64_t M, int64_t N, int64_t K,       \
                                              int threads) {                                   \
        const int64_t ld = (M + LANES - 1) / LANES * LANES;                                    \
        float *cols = columns(x, M, K, ld);                                                    \
        if (!cols) return;                                                                     \
        const int64_t blocks = (N + RT - 1) / RT;                                              \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                      \
        for (int64_t blk = 0; blk < blocks; ++blk) {                                           \
            const int64_t n0 = blk * RT, R = N - n0 < RT ? N - n0 : RT;                        \
            float sums[RT * VMAX * LANES];                                                     \
            for (int64_t m0 = 0; m0 < ld && m0 < MMAX; m0 += VMAX * LANES) {                   \
                const int V = ld - m0 < VMAX * LANES ? (int)((ld - m0) / LANES) : VMAX;        \
                bc_sums_##ISA(w + n0 * K, K, cols + m0, ld, RT, VMAX, R, V, m0 == 0, 0, sums); \
                for (int64_t r = 0; r < R; ++r) {                                              \
                    const float bias = b ? b[n0 + r] : 0.0f;                                   \
                    for (int64_t j = 0; j < V * LANES && m0 + j < M; ++j)                      \
                        y[(m0 + j) * N + n0 + r] = sums[r * V * LANES + j] + bias;             \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

/* AVX2: tiles of 6 x 2; AVX-512F, for 13 to 16 rows: one vector of sixteen input rows, four
 * weight rows a tile (fewer rows at once stream better than more: on an AMX Xeon, 16 rows of
 * a decode step's products 37 ms with the dot products below, 33 ms this way, with 6 weight
 * rows 33, with 12 rows 37; at 12 rows a tie, and from 17 rows a second, mostly padded vector
 * loses to the dot products). */
#define BC512_MIN_ROWS 13
#define BC512_MAX_ROWS 16
BC_LINEAR(avx2, AVX2, 8, 6, 2, INT64_MAX)
BC_LINEAR(avx512, AVX512F, 16, 4, 1, BC512_MAX_ROWS)

static void invariant_transposed(const float *x, const void *w, const float *b, float *y,
                                 int64_t M, int64_t N, int64_t K, int threads);
#define TR_MAX_ROWS 6   /* rows that take `invariant_transposed` (below): from seven the
                         * broadcast tiles are as fast (and from five the dot products were
                         * slower on an AVX2-only EPYC) */

void wb_linear_f32(const float *x, const float *w, const float *b, float *y, int64_t M,
                   int64_t N, int64_t K, int threads) {
    if (M <= TR_MAX_ROWS) invariant_transposed(x, w, b, y, M, N, K, threads);
    else linear_broadcast_avx2(x, w, b, y, M, N, K, threads);
}

/* The same products on CPUs with AVX-512F, as dot products but for 13 to 16 rows:
 * sixteen floats a vector and 32 registers, so four input rows share each block of four weight
 * rows (16 sums in registers; the weights are read from L1 a quarter as often as with AVX2's
 * two rows). K's tail through masked loads. Fixed order: the same bits for any thread count
 * (not the AVX2 products' bits: other sums). 13 to 16 rows: the broadcast tiles above. */
AVX512F void wb_linear_f32_avx512(const float *x, const float *w, const float *b, float *y,
                                  int64_t M, int64_t N, int64_t K, int threads) {
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

/* Batch-invariant products (`wb_linear_f32_invariant`, the batch-invariant engine's): every
 * row, however many come, through the broadcast tiles above, fewer than eight rows padded with
 * zero rows; each row's sums are the tiles' (over k in order, restarted every BC_SPAN), so a
 * row's bits depend on its own values only: not on how many rows share the call (1 or 500),
 * where it sits among them, nor the thread count. One call for any M: the input is laid out
 * in panels of P rows ([K][P] each, zero padded: a tile reads consecutive memory), a chunk of
 * panels that fits L2 at a time, and each thread's block of weight rows is read once per chunk
 * (from L1/L2 across the chunk's panels) instead of once per few rows. The AVX-512F function
 * below computes the same bits (the same sums per lane, sixteen lanes a vector). */
#ifndef INV_CHUNK_BYTES
#define INV_CHUNK_BYTES (512 * 1024)  /* a chunk of input panels, kept in L2 */
#endif

/* x [M, K] -> panels of P rows, each [K][P] (rows past M zero); NULL if memory ran out. */
static float *panels(const float *x, int64_t M, int64_t K, int64_t P) {
    const int64_t count = (M + P - 1) / P;
    float *xp = wb_scratch(count * P * K * 4);
    if (!xp)
        return 0;
    for (int64_t p = 0; p < count; ++p) {
        const int64_t rows = M - p * P < P ? M - p * P : P;
        transpose_rows(x + p * P * K, rows, K, xp + p * P * K, P);
    }
    return xp;
}

/* Weight rows a thread takes at once (eight tiles of six): their outputs gathered per row and
 * written as one run (scattered 4-byte stores with the stride of a long output row thrash L1's
 * sets: 3072 outputs, twice as slow). */
#define INV_GROUP_ROWS 48

/* Panels per chunk: as many as INV_CHUNK_BYTES holds, at least one. */
static int64_t chunk_panels(int64_t K, int64_t P) {
    const int64_t n = INV_CHUNK_BYTES / (P * K * 4);
    return n > 0 ? n : 1;
}

/* The invariant products through the tiles, x in panels of P rows (P a constant: the stride
 * the tiles read x with, which GCC then folds into their addresses): a chunk of panels at a
 * time, each thread taking groups of INV_GROUP_ROWS weight rows, tiles of six, over the
 * chunk's panels, a panel's live rows rounded up to whole vectors. */
#define BC_INVARIANT(ISA, TARGET, LANES, P, NAME, W16)                                         \
    TARGET static void NAME(const float *x, const void *w, const float *b, float *y,           \
                            int64_t M, int64_t N, int64_t K, int threads) {                    \
        const int64_t count = (M + P - 1) / P, per = chunk_panels(K, P);                       \
        const float *xp = panels(x, M, K, P);                                                  \
        if (!xp) return;                                                                       \
        const int64_t groups = (N + INV_GROUP_ROWS - 1) / INV_GROUP_ROWS;                      \
        for (int64_t c0 = 0; c0 < count; c0 += per) {                                          \
            const int64_t c1 = c0 + per < count ? c0 + per : count;                            \
            _Pragma("omp parallel for num_threads(threads) schedule(static)")                  \
            for (int64_t g = 0; g < groups; ++g) {                                             \
                const int64_t g0 = g * INV_GROUP_ROWS;                                         \
                const int64_t width = N - g0 < INV_GROUP_ROWS ? N - g0 : INV_GROUP_ROWS;       \
                float sums[6 * P], rows[P * INV_GROUP_ROWS];                                   \
                for (int64_t p = c0; p < c1; ++p) {                                            \
                    const float *cols = xp + p * P * K;                                        \
                    const int64_t live = M - p * P < P ? M - p * P : P;                        \
                    const int V = (int)((live + LANES - 1) / LANES);                           \
                    for (int64_t n0 = g0; n0 < g0 + width; n0 += 6) {                          \
                        const int64_t R = g0 + width - n0 < 6 ? g0 + width - n0 : 6;           \
                        bc_sums_##ISA(BC_ROW(w, n0, K, W16), K, cols, P, 6, P / LANES, R, V,   \
                                      p == c0, W16, sums);                                     \
                        for (int64_t r = 0; r < R; ++r) {                                      \
                            const float bias = b ? b[n0 + r] : 0.0f;                           \
                            for (int64_t j = 0; j < live; ++j)                                 \
                                rows[j * INV_GROUP_ROWS + n0 - g0 + r] =                       \
                                    sums[r * V * LANES + j] + bias;                            \
                        }                                                                      \
                    }                                                                          \
                    for (int64_t j = 0; j < live; ++j)                                         \
                        memcpy(y + (p * P + j) * N + g0, rows + j * INV_GROUP_ROWS,            \
                               width * 4);                                                     \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

/* Panels of eight rows (one AVX2 vector) for up to eight rows (a decode step), else of
 * sixteen (two); AVX-512F's of 64 (four vectors). */
BC_INVARIANT(avx2, AVX2, 8, 8, invariant_avx2_8, 0)
BC_INVARIANT(avx2, AVX2, 8, 16, invariant_avx2_16, 0)
BC_INVARIANT(avx512, AVX512F, 16, 64, invariant_avx512_64, 0)
/* bfloat16 weights (`wb_linear_f32_w16`), AVX2's */
BC_INVARIANT(avx2, AVX2, 8, 8, invariant_w16_8, 1)
BC_INVARIANT(avx2, AVX2, 8, 16, invariant_w16_16, 1)

/* The same sums for one to six rows (a lone stream's decode step, a few streams'), the eight
 * lanes taking eight weight rows instead of eight input rows: a row padded to a panel of
 * eight leaves seven lanes of every multiply-add idle and loads each weight element on its
 * own, which held a lone invariant stream to 0.87x the plain one on an AVX2-only EPYC. Each
 * output is still summed over k in order, restarted every BC_SPAN, one fused multiply-add a
 * step, so the bits are the broadcast tiles' whichever way the lanes are laid. A block of
 * eight weight rows' eight k at a time becomes eight vectors of one k each (half-vector loads,
 * then eight unpacks and eight shuffles within the 128-bit lanes), each input element
 * broadcast; every step prefetches half the next block's rows (the hardware fetches the rest:
 * all eight, or blocks interleaved for more independent sums, were slower). The 30 layers and
 * LM head of SmolLM2 at one row, on that EPYC: 15-18 ms against the padded tiles' 20-21 and the
 * dot products' 18-21 (five rows 21 against 26), so `wb_linear_f32` runs them too. */
#define TR_GROUP 32     /* weight rows a thread takes at once */

/* c[j] = (w[i * K + j])_i: eight rows' eight floats at w, transposed */
static inline __attribute__((always_inline)) void tr_columns(const float *w, int64_t K,
                                                             __m256 c[8]) {
    __m256 a[8];
    for (int i = 0; i < 4; ++i) {
        a[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(w + i * K)),
                                    _mm_loadu_ps(w + (i + 4) * K), 1);
        a[i + 4] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(w + i * K + 4)),
                                        _mm_loadu_ps(w + (i + 4) * K + 4), 1);
    }
    for (int h = 0; h < 2; ++h) {
        const __m256 *p = a + 4 * h;
        const __m256 t0 = _mm256_unpacklo_ps(p[0], p[1]), t1 = _mm256_unpackhi_ps(p[0], p[1]);
        const __m256 t2 = _mm256_unpacklo_ps(p[2], p[3]), t3 = _mm256_unpackhi_ps(p[2], p[3]);
        c[4 * h] = _mm256_shuffle_ps(t0, t2, 0x44);
        c[4 * h + 1] = _mm256_shuffle_ps(t0, t2, 0xee);
        c[4 * h + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
        c[4 * h + 3] = _mm256_shuffle_ps(t1, t3, 0xee);
    }
}

/* tr_columns of bfloat16 rows, transposed as 16-bit words before they are widened: rows i and
 * i + 4 in one vector's halves, two rounds of unpacks gather each k's four rows in a half,
 * and unpacking those with zeros below widens them (the float32 each stands for): 16 shuffles
 * for the 64 weights, where widening first and transposing floats took 24. */
static inline __attribute__((always_inline)) void tr_columns_w16(const uint16_t *w, int64_t K,
                                                                 __m256 c[8]) {
    __m256i v[4];
    for (int i = 0; i < 4; ++i)
        v[i] = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w + i * K))),
            _mm_loadu_si128((const __m128i *)(w + (i + 4) * K)), 1);
    /* rows 0 and 1 (4 and 5) interleaved word by word, k 0-3 and 4-7; rows 2 and 3 (6, 7) */
    const __m256i t0 = _mm256_unpacklo_epi16(v[0], v[1]), t1 = _mm256_unpackhi_epi16(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi16(v[2], v[3]), t3 = _mm256_unpackhi_epi16(v[2], v[3]);
    /* u[j]: k = 2j and 2j + 1, each its four rows in a row (rows 4-7 in the upper half) */
    const __m256i u[4] = {_mm256_unpacklo_epi32(t0, t2), _mm256_unpackhi_epi32(t0, t2),
                          _mm256_unpacklo_epi32(t1, t3), _mm256_unpackhi_epi32(t1, t3)};
    const __m256i zero = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
        c[2 * j] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, u[j]));
        c[2 * j + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, u[j]));
    }
}

/* Weight element (n, k) of a float32 or (w16) bfloat16 weight, as float32. */
static inline __attribute__((always_inline)) float tr_at(const void *w, int64_t n, int64_t K,
                                                         int64_t k, const int w16) {
    return w16 ? wb_bf16_to_f32(((const uint16_t *)w)[n * K + k]) : ((const float *)w)[n * K + k];
}

/* The next block's float32 weights at k, ahead of their use: half its rows (the hardware
 * fetches the rest). Not for bfloat16 weights: half the bytes a step, which the hardware's
 * prefetchers keep up with, and the prefetches' own loads cost more than they save (one row
 * at a time 39 -> 33 ms on the 1B shape's layers without them, four rows 64 -> 52). */
static inline __attribute__((always_inline)) void tr_prefetch(const void *w, int64_t K,
                                                              int64_t k, const int w16) {
    if (!w16)
        for (int i = 0; i < 8; i += 2)
            _mm_prefetch(BC_ROW(w, 8 + i, K, 0) + k * 4, _MM_HINT_T0);
}

/* One block's sums over the span [k0, k1) for M rows (a span of BC_SPAN or K's last part),
 * into acc[m]. */
static inline __attribute__((always_inline)) void
tr_span(const float *x, const void *w, const int M, int64_t K, int64_t k0, int64_t k1,
        const int w16, __m256 *acc) {
    for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
    int64_t k = k0;
    for (; k + 8 <= k1; k += 8) {
        __m256 c[8];
        tr_prefetch(w, K, k, w16);
        if (w16) tr_columns_w16((const uint16_t *)w + k, K, c);
        else tr_columns((const float *)w + k, K, c);
        for (int j = 0; j < 8; ++j)
            for (int m = 0; m < M; ++m)
                acc[m] = _mm256_fmadd_ps(c[j], _mm256_broadcast_ss(x + m * K + k + j), acc[m]);
    }
    for (; k < k1; ++k) {  /* K's last few (BC_SPAN is a multiple of eight) */
        const __m256 c = _mm256_set_ps(tr_at(w, 7, K, k, w16), tr_at(w, 6, K, k, w16),
                                       tr_at(w, 5, K, k, w16), tr_at(w, 4, K, k, w16),
                                       tr_at(w, 3, K, k, w16), tr_at(w, 2, K, k, w16),
                                       tr_at(w, 1, K, k, w16), tr_at(w, 0, K, k, w16));
        for (int m = 0; m < M; ++m)
            acc[m] = _mm256_fmadd_ps(c, _mm256_broadcast_ss(x + m * K + k), acc[m]);
    }
}

/* M input rows (M <= TR_MAX_ROWS, a constant: the sums stay in registers) times the eight
 * weight rows at w (float32, or bfloat16 with w16): y[m * N + i], i < 8. A span's sums are
 * one chain of multiply-adds a row, so one row would wait on the multiply-add's latency: SP
 * spans run side by side (each its own sums, added to the total in order: the same bits),
 * the CPU overlapping SP chains. */
static inline __attribute__((always_inline)) void
tr_block(const float *x, const void *w, const float *b, float *y, const int M, const int SP,
         int64_t N, int64_t K, const int w16) {
    __m256 total[TR_MAX_ROWS], acc[4][TR_MAX_ROWS];
    for (int m = 0; m < M; ++m) total[m] = _mm256_setzero_ps();
    int64_t k0 = 0;
    if (SP > 1)
        for (; k0 + SP * BC_SPAN <= K; k0 += SP * BC_SPAN) {
            for (int m = 0; m < M; ++m)
                for (int s = 0; s < SP; ++s) acc[s][m] = _mm256_setzero_ps();
            for (int64_t k = 0; k < BC_SPAN; k += 8) {
                tr_prefetch(w, K, k0 + k, w16);
                for (int s = 0; s < SP; ++s) {
                    const int64_t ks = k0 + s * BC_SPAN + k;
                    __m256 c[8];
                    if (w16) tr_columns_w16((const uint16_t *)w + ks, K, c);
                    else tr_columns((const float *)w + ks, K, c);
                    for (int j = 0; j < 8; ++j)
                        for (int m = 0; m < M; ++m)
                            acc[s][m] = _mm256_fmadd_ps(
                                c[j], _mm256_broadcast_ss(x + m * K + ks + j), acc[s][m]);
                }
            }
            for (int s = 0; s < SP; ++s)
                for (int m = 0; m < M; ++m) total[m] = _mm256_add_ps(total[m], acc[s][m]);
        }
    for (; k0 < K; k0 += BC_SPAN) {
        tr_span(x, w, M, K, k0, k0 + BC_SPAN < K ? k0 + BC_SPAN : K, w16, acc[0]);
        for (int m = 0; m < M; ++m) total[m] = _mm256_add_ps(total[m], acc[0][m]);
    }
    const __m256 bias = b ? _mm256_loadu_ps(b) : _mm256_setzero_ps();
    for (int m = 0; m < M; ++m) _mm256_storeu_ps(y + m * N, _mm256_add_ps(total[m], bias));
}

/* One weight row (the last few of N), the same sums in scalars. */
static void tr_row(const float *x, const void *w, const float *b, float *y, int64_t M,
                   int64_t N, int64_t K, const int w16) {
    for (int64_t m = 0; m < M; ++m) {
        float total = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += BC_SPAN) {
            const int64_t k1 = k0 + BC_SPAN < K ? k0 + BC_SPAN : K;
            float acc = 0.0f;
            for (int64_t k = k0; k < k1; ++k) acc = fmaf(tr_at(w, 0, K, k, w16), x[m * K + k], acc);
            total += acc;
        }
        y[m * N] = total + (b ? b[0] : 0.0f);
    }
}

/* spans side by side for one row and for two (`tr_block`; four spans were slower for one) */
#define TR_SP1 2
#define TR_SP2 2
#define TR_PRODUCTS(NAME, W16)                                                                 \
    static void NAME(const float *x, const void *w, const float *b, float *y, int64_t M,       \
                     int64_t N, int64_t K, int threads) {                                      \
        const int64_t groups = (N + TR_GROUP - 1) / TR_GROUP;                                  \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                      \
        for (int64_t g = 0; g < groups; ++g) {                                                 \
            const int64_t g1 = (g + 1) * TR_GROUP < N ? (g + 1) * TR_GROUP : N;                \
            int64_t n = g * TR_GROUP;                                                          \
            for (; n + 8 <= g1; n += 8) {                                                      \
                const void *wn = BC_ROW(w, n, K, W16);                                         \
                const float *bn = b ? b + n : 0;                                               \
                switch (M) {                                                                   \
                case 1: tr_block(x, wn, bn, y + n, 1, TR_SP1, N, K, W16); break;               \
                case 2: tr_block(x, wn, bn, y + n, 2, TR_SP2, N, K, W16); break;               \
                case 3: tr_block(x, wn, bn, y + n, 3, 1, N, K, W16); break;                    \
                case 4: tr_block(x, wn, bn, y + n, 4, 1, N, K, W16); break;                    \
                case 5: tr_block(x, wn, bn, y + n, 5, 1, N, K, W16); break;                    \
                default: tr_block(x, wn, bn, y + n, 6, 1, N, K, W16); break;                   \
                }                                                                              \
            }                                                                                  \
            for (; n < g1; ++n)                                                                \
                tr_row(x, BC_ROW(w, n, K, W16), b ? b + n : 0, y + n, M, N, K, W16);           \
        }                                                                                      \
    }
TR_PRODUCTS(invariant_transposed, 0)
TR_PRODUCTS(transposed_w16, 1)

void wb_linear_f32_invariant(const float *x, const float *w, const float *b, float *y,
                             int64_t M, int64_t N, int64_t K, int threads) {
    if (M <= TR_MAX_ROWS) invariant_transposed(x, w, b, y, M, N, K, threads);
    else if (M <= 8) invariant_avx2_8(x, w, b, y, M, N, K, threads);
    else invariant_avx2_16(x, w, b, y, M, N, K, threads);
}

/* The same products on a bfloat16 weight [N, K] (float32 input, sums and output): each
 * weight widened exactly to the float32 it stands for as it is read (in registers for one to
 * six rows, a tile's span of 64 at a time into L1 for more), every sum as above, so the bits
 * are `wb_linear_f32_invariant`'s on the widened weight, for every row count: a float32 model
 * whose checkpoint is bfloat16 keeps its projections' weights at half the bytes, read at half
 * the bandwidth. One function for every row count, the default engine's and the
 * batch-invariant one's. */
void wb_linear_f32_w16(const float *x, const uint16_t *w, const float *b, float *y, int64_t M,
                       int64_t N, int64_t K, int threads) {
    if (M <= TR_MAX_ROWS) transposed_w16(x, w, b, y, M, N, K, threads);
    else if (M <= 8) invariant_w16_8(x, w, b, y, M, N, K, threads);
    else invariant_w16_16(x, w, b, y, M, N, K, threads);
}

/* Up to eight rows in AVX2's eight lanes: twice the multiply-adds a cycle of one 16-lane
 * vector. */
AVX512F void wb_linear_f32_invariant_avx512(const float *x, const float *w, const float *b,
                                            float *y, int64_t M, int64_t N, int64_t K,
                                            int threads) {
    if (M <= 8) invariant_avx2_8(x, w, b, y, M, N, K, threads);
    else invariant_avx512_64(x, w, b, y, M, N, K, threads);
}
