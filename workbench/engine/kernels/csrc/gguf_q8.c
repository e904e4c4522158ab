/* GGUF blocks times int8 activations: llama.cpp's CPU arithmetic (`gguf_activations="q8"`).
 *
 * Each weight type meets activations quantized to its partner type, as llama.cpp's CPU back end
 * does: Q4_0 and Q8_0 with Q8_0, Q4_1 with Q8_1, Q4_K, Q5_K and Q6_K with Q8_K.
 *
 * Quantizers (wb_quantize_q8_0, _q8_1, _q8_k: rows of float32 -> blocks in GGML's layout):
 * - Q8_0 / Q8_1 (32 values): amax = max |x|; d = amax / 127 (stored fp16, round to nearest
 *   even); q = round-to-nearest-even(x * (127 / amax)) (0 where amax is 0): llama.cpp's x86
 *   SIMD quantizer, bit for bit. Q8_1 also stores s = fp16(d * sum q), d the unrounded fp32 d.
 * - Q8_K (256 values): max = the first value of largest |x| (signed); iscale = -127 / max;
 *   q = min(127, round-to-nearest-even(iscale * x)); d = 1 / iscale in fp32; bsums: the sums of
 *   each 16 q (int16). An all-zero block: d = 0, q = 0, bsums = 0.
 *
 * Products (wb_q8_linear_<type>_<isa>, the wb_linear_fn signature: float32 rows in, float32 out):
 * each call quantizes its input rows (row by row: a row's blocks never depend on the others),
 * then for every output a block's products are summed exactly in int32 lanes (AVX-512 VNNI
 * vpdpbusd, or AVX2 maddubs + madd; K-quants weigh each sub-block's int16 pair sums by its
 * scale with vpdpwssd / madd), and acc = fma(d_w * d_a, float(lanes), acc) in 8 fp32 lanes,
 * block after block; Q4_1 adds m_w * s_a per block, Q4_K and Q5_K -d_a * dmin_w * sum(m_j *
 * bsum_j) (int32, exact). The 8 lanes and that scalar are summed in a fixed tree at the end.
 * Integer identities keep the bytes unsigned where vpdpbusd needs them: a Q4_0 code n - 8 as
 * n with -8 * sum(q) added to the lanes first, a Q8_0 weight w as w + 128 with -128 * sum(q)
 * (VNNI; AVX2: |w| times q with w's sign); Q6_K's q - 32 in int16 pairs. So the result is the
 * exact sum over blocks of fp32(d_w d_a) * (exact integer sum) (+ the mins' terms) up to fp32
 * rounding of that sum, in an order that does not depend on the row count, the chunk a row
 * falls in, or the thread count: a row's bits are the same in any batch.
 *
 * Work: one weight row at a time against chunks of up to 6 input rows (VNNI, 32 vector
 * registers) or 4 (AVX2), each weight block unpacked once per chunk; each sum in two chains of
 * fused multiply-adds (even and odd blocks, added at the end: one chain would wait on the
 * fma's latency every block); the next weight row prefetched at the pace of the blocks;
 * threads (OpenMP) take contiguous ranges of weight rows. (Several weight rows a chunk, their
 * streams interleaved, read the 30 MB LM head of SmolLM2 4-8x slower from memory on a 2-core
 * Zen 4 slice than one row at a time.) The input rows are quantized by the calling thread (in
 * parallel from 8 rows on) into a buffer of its own, before the products start.
 */
#include "wb.h"

#define WBQ_T2 "avx2,fma,f16c"
#define WBQ_T5 "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define WBQ_INLINE static inline __attribute__((always_inline, target(WBQ_T2)))
#define WBQ_INLINE5 static inline __attribute__((always_inline, target(WBQ_T5)))

WBQ_INLINE float wbq_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

WBQ_INLINE void wbq_put_half(uint8_t *p, float f) {
    const uint16_t h = (uint16_t)_cvtss_sh(f, 0);  /* round to nearest even */
    memcpy(p, &h, 2);
}

/* ---- the quantizers ---- */

/* One row of K floats -> K / 32 Q8_0 blocks (34 bytes) or Q8_1 blocks (36: d, s, q). */
__attribute__((target(WBQ_T2))) static void wbq_q8_0_row(const float *x, uint8_t *out,
                                                          int64_t K, int with_sum) {
    const int64_t bb = with_sum ? 36 : 34;
    for (int64_t g = 0; g < K / 32; ++g) {
        const float *v = x + 32 * g;
        uint8_t *blk = out + g * bb;
        int8_t *q = (int8_t *)(blk + (with_sum ? 4 : 2));
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) {
            const float a = fabsf(v[i]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; ++i) {
            int n = (int)nearbyintf(v[i] * id);  /* ties to even, as _mm256_round_ps */
            n = n > 127 ? 127 : n < -128 ? -128 : n;
            q[i] = (int8_t)n;
            sum += n;
        }
        wbq_put_half(blk, d);
        if (with_sum) wbq_put_half(blk + 2, d * (float)sum);
    }
}

/* One row of K floats -> K / 256 Q8_K blocks (292 bytes: fp32 d, 256 q, 16 int16 bsums). */
static void wbq_q8_k_row(const float *x, uint8_t *out, int64_t K) {
    for (int64_t g = 0; g < K / 256; ++g) {
        const float *v = x + 256 * g;
        uint8_t *blk = out + g * 292;
        int8_t *q = (int8_t *)(blk + 4);
        float max = 0.0f, amax = 0.0f;
        for (int i = 0; i < 256; ++i) {
            const float a = fabsf(v[i]);
            if (a > amax) {
                amax = a;
                max = v[i];
            }
        }
        int16_t bsums[16];
        if (amax == 0.0f) {
            const float zero = 0.0f;
            memcpy(blk, &zero, 4);
            memset(q, 0, 256);
            memset(blk + 260, 0, 32);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int i = 0; i < 256; ++i) {
            const int n = (int)nearbyintf(iscale * v[i]);
            q[i] = (int8_t)(n < 127 ? n : 127);
        }
        for (int j = 0; j < 16; ++j) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += q[16 * j + i];
            bsums[j] = (int16_t)s;
        }
        const float d = 1.0f / iscale;
        memcpy(blk, &d, 4);
        memcpy(blk + 260, bsums, 32);
    }
}

__attribute__((target(WBQ_T2))) void wb_quantize_q8_0(const float *x, void *out, int64_t M,
                                                       int64_t K) {
    for (int64_t m = 0; m < M; ++m) wbq_q8_0_row(x + m * K, (uint8_t *)out + m * (K / 32) * 34, K, 0);
}

__attribute__((target(WBQ_T2))) void wb_quantize_q8_1(const float *x, void *out, int64_t M,
                                                       int64_t K) {
    for (int64_t m = 0; m < M; ++m) wbq_q8_0_row(x + m * K, (uint8_t *)out + m * (K / 32) * 36, K, 1);
}

void wb_quantize_q8_k(const float *x, void *out, int64_t M, int64_t K) {
    for (int64_t m = 0; m < M; ++m) wbq_q8_k_row(x + m * K, (uint8_t *)out + m * (K / 256) * 292, K);
}

/* ---- the quantized input rows as the products read them ---- */

/* This thread's buffer of at least `bytes` (64-byte aligned, kept for its next call). */
static __thread uint8_t *wbq_buffer;
static __thread int64_t wbq_capacity;

static uint8_t *wbq_scratch(int64_t bytes) {
    if (bytes > wbq_capacity) {
        free(wbq_buffer);
        const int64_t size = (bytes + 4095) & ~(int64_t)4095;
        wbq_buffer = aligned_alloc(64, (size_t)size);
        wbq_capacity = wbq_buffer ? size : 0;
    }
    return wbq_buffer;
}

/* A 32-block type's row, repacked: K codes (32-byte aligned), d_a [G4] and s_a [G4] as floats
 * (G4: G rounded up to 8), then per block 8 int32 lanes of -offset * (sum of its 4 codes): what
 * the dot products start from (Q4_0: offset 8, Q8_0 on VNNI: 128), then the Q8_0 / Q8_1 blocks
 * themselves (the quantizer's output, 36 bytes a block). */
static inline int64_t wbq_g4(int64_t K) { return (K / 32 + 7) & ~(int64_t)7; }

static inline int64_t wbq_stride32(int64_t K) {
    return (K + 8 * wbq_g4(K) + 32 * (K / 32) + 36 * (K / 32) + 63) & ~(int64_t)63;
}

__attribute__((target(WBQ_T2))) static void wbq_pack32(const float *x, int64_t K, int with_sum,
                                                        int offset, uint8_t *pk) {
    const int64_t G = K / 32, G4 = wbq_g4(K), bb = with_sum ? 36 : 34;
    uint8_t *blocks = pk + K + 8 * G4 + 32 * G;
    wbq_q8_0_row(x, blocks, K, with_sum);
    float *da = (float *)(pk + K), *sa = da + G4;
    int32_t *init = (int32_t *)(sa + G4);
    for (int64_t g = 0; g < G; ++g) {
        const uint8_t *blk = blocks + g * bb;
        const int8_t *q = (const int8_t *)(blk + (with_sum ? 4 : 2));
        memcpy(pk + 32 * g, q, 32);
        da[g] = wbq_half(blk);
        sa[g] = with_sum ? wbq_half(blk + 2) : 0.0f;
        for (int l = 0; l < 8; ++l)
            init[8 * g + l] = -offset * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
    }
}

__attribute__((target(WBQ_T2))) static inline void wbq_pack_row(
    const float *x, int64_t m, int64_t K, int kq, int with_sum, int offset, uint8_t *pk,
    int64_t stride) {
    if (kq) wbq_q8_k_row(x + m * K, pk + m * stride, K);
    else wbq_pack32(x + m * K, K, with_sum, offset, pk + m * stride);
}

/* The M input rows quantized into this thread's scratch (rows in parallel when many), or NULL
 * (out of memory: the caller writes NaN). kq: 0 for the 32-block types, 1 for Q8_K. */
__attribute__((target(WBQ_T2))) static uint8_t *wbq_pack(const float *x, int64_t M, int64_t K,
                                                          int kq, int with_sum, int offset,
                                                          int64_t stride, int threads) {
    uint8_t *pk = wbq_scratch(M * stride);
    if (!pk) return NULL;
    if (M < 8 || threads < 2) {  /* a few rows: no parallel region */
        for (int64_t m = 0; m < M; ++m) wbq_pack_row(x, m, K, kq, with_sum, offset, pk, stride);
        return pk;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t m = 0; m < M; ++m) wbq_pack_row(x, m, K, kq, with_sum, offset, pk, stride);
    return pk;
}

static void wbq_nan(float *y, int64_t count) {
    for (int64_t i = 0; i < count; ++i) y[i] = NAN;
}

/* ---- the dot products of 32 bytes ---- */

/* AVX2: u8 x s8 pairs in int16 (no saturation: |u| <= 128, |s| <= 127 here), then int32. */
WBQ_INLINE __m256i wbq_dot2(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                   _mm256_set1_epi16(1)));
}

WBQ_INLINE5 __m256i wbq_dot5(__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(acc, u, s);
}

/* int16 pairs weighed by int16 scales into int32 lanes */
WBQ_INLINE __m256i wbq_dotw2(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

WBQ_INLINE5 __m256i wbq_dotw5(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpwssd_epi32(acc, a, b);
}

/* per type and ISA: the int32 lanes of one weight block's codes w (as unpacked) and q */
#define WBQ_DOT_q4_0_avx2(i, w, q) wbq_dot2(i, w, q)
#define WBQ_DOT_q4_1_avx2(i, w, q) wbq_dot2(i, w, q)
#define WBQ_DOT_q8_0_avx2(i, w, q) wbq_dot2(i, _mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w))
#define WBQ_DOT_q4_0_avx512(i, w, q) wbq_dot5(i, w, q)
#define WBQ_DOT_q4_1_avx512(i, w, q) wbq_dot5(i, w, q)
#define WBQ_DOT_q8_0_avx512(i, w, q) wbq_dot5(i, _mm256_xor_si256(w, _mm256_set1_epi8(-128)), q)
#define WBQ_OFFSET_q4_0_avx2 8
#define WBQ_OFFSET_q4_1_avx2 0
#define WBQ_OFFSET_q8_0_avx2 0
#define WBQ_OFFSET_q4_0_avx512 8
#define WBQ_OFFSET_q4_1_avx512 0
#define WBQ_OFFSET_q8_0_avx512 128
#define WBQ_SUM_q4_0 0
#define WBQ_SUM_q4_1 1
#define WBQ_SUM_q8_0 0
#define WBQ_TARGET_avx2 WBQ_T2
#define WBQ_TARGET_avx512 WBQ_T5
/* a chunk: up to WBQ_ROWS input rows times WBQ_WROWS weight rows, one fp32 sum each */
#define WBQ_ROWS_avx2 4
#define WBQ_ROWS_avx512 6
#define WBQ_WROWS_avx2 1
#define WBQ_WROWS_avx512 1
#define WBQ_DOTW_avx2 wbq_dotw2
#define WBQ_DOTW_avx512 wbq_dotw5

/* ---- the weight blocks' codes ---- */

/* 16 bytes of nibbles -> 32 codes (low nibbles are weights 0-15, high 16-31) */
WBQ_INLINE __m256i wbq_nibbles(const uint8_t *p) {
    const __m128i q = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
}

WBQ_INLINE __m256i wbq_w_q4_0(const uint8_t *blk, float *d, float *m) {
    *d = wbq_half(blk);
    *m = 0.0f;
    return wbq_nibbles(blk + 2);
}

WBQ_INLINE __m256i wbq_w_q4_1(const uint8_t *blk, float *d, float *m) {
    *d = wbq_half(blk);
    *m = wbq_half(blk + 2);
    return wbq_nibbles(blk + 4);
}

WBQ_INLINE __m256i wbq_w_q8_0(const uint8_t *blk, float *d, float *m) {
    *d = wbq_half(blk);
    *m = 0.0f;
    return _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(blk + 18)),
                            _mm_loadu_si128((const __m128i *)(blk + 2)));
}

#define WBQ_BB_q4_0 18
#define WBQ_BB_q4_1 20
#define WBQ_BB_q8_0 34

/* GGML's get_scale_min_k4 */
static inline void wbq_scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q5_K's sub-block j: 32 codes 0..31 */
WBQ_INLINE __m256i wbq_codes_q5_k(const uint8_t *blk, int j) {
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 48 + 32 * (j >> 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
    return _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (j & 1)), _mm256_set1_epi8(0x0F)),
        _mm256_slli_epi16(hi, 4));
}

/* Q6_K's group j of 32 (two sub-blocks of 16): codes 0..63 (the weights' q + 32) */
WBQ_INLINE __m256i wbq_codes_q6_k(const uint8_t *blk, int j) {
    const int h = j >> 2, i = j & 3;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (i & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (i >> 1)),
                                        _mm256_set1_epi8(0x0F));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}

/* ---- the products ---- */

/* the bytes [p, p + n) (n <= 192) fetched into L1 */
static inline void wbq_prefetch(const uint8_t *p, int64_t n) {
    for (int64_t at = 0; at < n; at += 64) _mm_prefetch((const char *)(p + at), _MM_HINT_T0);
}

/* Input rows [0, P) of the pack (stride bytes each) with weight rows w, w + rb, ... (WBQ_WROWS
 * of them): out[p][r]. */
#define WBQ_CHUNK32(T, ISA)                                                                    \
    static inline __attribute__((always_inline, target(WBQ_TARGET_##ISA))) void               \
    wbq_chunk_##T##_##ISA(const uint8_t *pk, int64_t stride, int64_t K, const int P,          \
                          const uint8_t *w, int64_t rb, const uint8_t *next,                   \
                          float out[][WBQ_WROWS_##ISA]) {                                     \
        enum { WR = WBQ_WROWS_##ISA };                                                         \
        const int64_t G = K / 32, G4 = wbq_g4(K);                                              \
        /* two chains a sum: even blocks and odd blocks, added at the end */                   \
        __m256 acc[WBQ_ROWS_##ISA][WR][2];                                                     \
        float mins[WBQ_ROWS_##ISA][WR][2];                                                     \
        for (int p = 0; p < P; ++p)                                                            \
            for (int r = 0; r < WR; ++r)                                                       \
                for (int h = 0; h < 2; ++h) {                                                  \
                    acc[p][r][h] = _mm256_setzero_ps();                                        \
                    mins[p][r][h] = 0.0f;                                                      \
                }                                                                              \
        for (int64_t g0 = 0; g0 < G; g0 += 2) {                                                \
            if (next) wbq_prefetch(next + g0 * WR * WBQ_BB_##T, 2 * WR * WBQ_BB_##T);          \
            for (int h = 0; h < 2; ++h) {                                                      \
                const int64_t g = g0 + h;                                                      \
                if (g >= G) break;                                                             \
                float dw[WR], mw[WR];                                                          \
                __m256i u[WR];                                                                 \
                for (int r = 0; r < WR; ++r)                                                   \
                    u[r] = wbq_w_##T(w + r * rb + g * WBQ_BB_##T, &dw[r], &mw[r]);             \
                for (int p = 0; p < P; ++p) {                                                  \
                    const uint8_t *row = pk + p * stride;                                      \
                    const float *da = (const float *)(row + K);                                \
                    const __m256i q = _mm256_load_si256((const __m256i *)(row + 32 * g));      \
                    const __m256i i0 = WBQ_OFFSET_##T##_##ISA                                  \
                        ? _mm256_load_si256((const __m256i *)(da + 2 * G4) + g)                \
                        : _mm256_setzero_si256();                                              \
                    const float a = da[g], sa = WBQ_SUM_##T ? da[G4 + g] : 0.0f;               \
                    for (int r = 0; r < WR; ++r) {                                             \
                        const __m256i i = WBQ_DOT_##T##_##ISA(i0, u[r], q);                    \
                        acc[p][r][h] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * a),             \
                                                       _mm256_cvtepi32_ps(i), acc[p][r][h]);  \
                        if (WBQ_SUM_##T) mins[p][r][h] += mw[r] * sa;                          \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int p = 0; p < P; ++p)                                                            \
            for (int r = 0; r < WR; ++r)                                                       \
                out[p][r] = hsum(_mm256_add_ps(acc[p][r][0], acc[p][r][1]))                    \
                    + (mins[p][r][0] + mins[p][r][1]);                                         \
    }

/* Q4_K and Q5_K: a 256-block's 8 sub-blocks of 32, scale sc_j and min m_j each */
#define WBQ_CHUNK_K45(T, ISA, BB, CODES)                                                       \
    static inline __attribute__((always_inline, target(WBQ_TARGET_##ISA))) void               \
    wbq_chunk_##T##_##ISA(const uint8_t *pk, int64_t stride, int64_t K, const int P,          \
                          const uint8_t *w, int64_t rb, const uint8_t *next,                   \
                          float out[][WBQ_WROWS_##ISA]) {                                     \
        enum { WR = WBQ_WROWS_##ISA };                                                         \
        const int64_t G = K / 256;                                                             \
        __m256 acc[WBQ_ROWS_##ISA][WR];                                                        \
        float mins[WBQ_ROWS_##ISA][WR];                                                        \
        for (int p = 0; p < P; ++p)                                                            \
            for (int r = 0; r < WR; ++r) {                                                     \
                acc[p][r] = _mm256_setzero_ps();                                               \
                mins[p][r] = 0.0f;                                                             \
            }                                                                                  \
        for (int64_t g = 0; g < G; ++g) {                                                      \
            float dw[WR], mw[WR];                                                              \
            int sc[WR][8], mn[WR][8];                                                          \
            for (int r = 0; r < WR; ++r) {                                                     \
                const uint8_t *blk = w + r * rb + g * (BB);                                    \
                dw[r] = wbq_half(blk);                                                         \
                mw[r] = wbq_half(blk + 2);                                                     \
                for (int j = 0; j < 8; ++j) wbq_scale_min(blk + 4, j, &sc[r][j], &mn[r][j]);   \
            }                                                                                  \
            __m256i isum[WBQ_ROWS_##ISA][WR];                                                  \
            for (int p = 0; p < P; ++p)                                                        \
                for (int r = 0; r < WR; ++r) isum[p][r] = _mm256_setzero_si256();              \
            for (int j = 0; j < 8; ++j) {                                                      \
                if (next) wbq_prefetch(next + (g * 8 + j) * WR * (BB) / 8, WR * (BB) / 8);     \
                __m256i u[WR], s[WR];                                                          \
                for (int r = 0; r < WR; ++r) {                                                 \
                    const uint8_t *blk = w + r * rb + g * (BB);                                \
                    u[r] = CODES;                                                              \
                    s[r] = _mm256_set1_epi16((short)sc[r][j]);                                 \
                }                                                                              \
                for (int p = 0; p < P; ++p) {                                                  \
                    const uint8_t *a = pk + p * stride + g * 292 + 4;                          \
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(a + 32 * j));       \
                    for (int r = 0; r < WR; ++r)                                               \
                        isum[p][r] = WBQ_DOTW_##ISA(isum[p][r], _mm256_maddubs_epi16(u[r], q), \
                                                    s[r]);                                     \
                }                                                                              \
            }                                                                                  \
            for (int p = 0; p < P; ++p) {                                                      \
                const uint8_t *a = pk + p * stride + g * 292;                                  \
                float da;                                                                      \
                int16_t bs[16];                                                                \
                memcpy(&da, a, 4);                                                             \
                memcpy(bs, a + 260, 32);                                                       \
                for (int r = 0; r < WR; ++r) {                                                 \
                    int m = 0;                                                                 \
                    for (int j = 0; j < 8; ++j) m += mn[r][j] * (bs[2 * j] + bs[2 * j + 1]);   \
                    acc[p][r] = _mm256_fmadd_ps(_mm256_set1_ps(da * dw[r]),                   \
                                                _mm256_cvtepi32_ps(isum[p][r]), acc[p][r]);   \
                    mins[p][r] = fmaf(-(da * mw[r]), (float)m, mins[p][r]);                    \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int p = 0; p < P; ++p)                                                            \
            for (int r = 0; r < WR; ++r) out[p][r] = hsum(acc[p][r]) + mins[p][r];            \
    }

#define WBQ_Q4_K_CODES                                                                         \
    _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(                                     \
                         (const __m256i *)(blk + 16 + 32 * (j >> 1))), 4 * (j & 1)),          \
                     _mm256_set1_epi8(15))

/* Q6_K: 8 groups of 32, an int8 scale per 16; (q - 32) q8 pairs in int16, then scaled */
#define WBQ_CHUNK_Q6_K(ISA)                                                                    \
    static inline __attribute__((always_inline, target(WBQ_TARGET_##ISA))) void               \
    wbq_chunk_q6_k_##ISA(const uint8_t *pk, int64_t stride, int64_t K, const int P,           \
                         const uint8_t *w, int64_t rb, const uint8_t *next,                    \
                         float out[][WBQ_WROWS_##ISA]) {                                      \
        enum { WR = WBQ_WROWS_##ISA };                                                         \
        const int64_t G = K / 256;                                                             \
        __m256 acc[WBQ_ROWS_##ISA][WR];                                                        \
        for (int p = 0; p < P; ++p)                                                            \
            for (int r = 0; r < WR; ++r) acc[p][r] = _mm256_setzero_ps();                      \
        const __m256i m32 = _mm256_set1_epi8(32);                                              \
        for (int64_t g = 0; g < G; ++g) {                                                      \
            __m256i isum[WBQ_ROWS_##ISA][WR];                                                  \
            for (int p = 0; p < P; ++p)                                                        \
                for (int r = 0; r < WR; ++r) isum[p][r] = _mm256_setzero_si256();              \
            for (int j = 0; j < 8; ++j) {                                                      \
                if (next) wbq_prefetch(next + (g * 8 + j) * WR * 210 / 8, WR * 210 / 8);       \
                __m256i u[WR], s[WR];                                                          \
                const int k = 8 * (j >> 2) + 2 * (j & 3);                                      \
                for (int r = 0; r < WR; ++r) {                                                 \
                    const uint8_t *blk = w + r * rb + g * 210;                                 \
                    const int8_t *sc = (const int8_t *)(blk + 192);                            \
                    u[r] = wbq_codes_q6_k(blk, j);                                             \
                    s[r] = _mm256_set_m128i(_mm_set1_epi16(sc[k + 1]), _mm_set1_epi16(sc[k])); \
                }                                                                              \
                for (int p = 0; p < P; ++p) {                                                  \
                    const uint8_t *a = pk + p * stride + g * 292 + 4;                          \
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(a + 32 * j));       \
                    const __m256i q32 = _mm256_maddubs_epi16(m32, q);                          \
                    for (int r = 0; r < WR; ++r)                                               \
                        isum[p][r] = WBQ_DOTW_##ISA(                                           \
                            isum[p][r], _mm256_sub_epi16(_mm256_maddubs_epi16(u[r], q), q32),  \
                            s[r]);                                                             \
                }                                                                              \
            }                                                                                  \
            for (int p = 0; p < P; ++p) {                                                      \
                float da;                                                                      \
                memcpy(&da, pk + p * stride + g * 292, 4);                                     \
                for (int r = 0; r < WR; ++r) {                                                 \
                    const float dw = wbq_half(w + r * rb + g * 210 + 208);                     \
                    acc[p][r] = _mm256_fmadd_ps(_mm256_set1_ps(da * dw),                      \
                                                _mm256_cvtepi32_ps(isum[p][r]), acc[p][r]);   \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int p = 0; p < P; ++p)                                                            \
            for (int r = 0; r < WR; ++r) out[p][r] = hsum(acc[p][r]);                          \
    }

/* y [M, N] = x [M, K] w^T (+ b): the rows quantized (kq: Q8_K, else Q8_0 / Q8_1), then chunks
 * of WBQ_ROWS input rows by WBQ_WROWS weight rows (the last weight rows' chunk repeats its last
 * row where N runs out), weight rows split among the threads. */
#define WBQ_LINEAR(T, ISA, BS, BB, KQ, SUM, OFFSET)                                            \
    __attribute__((target(WBQ_TARGET_##ISA))) void wb_q8_linear_##T##_##ISA(                  \
        const float *x, const void *w, const float *b, float *y, int64_t M, int64_t N,        \
        int64_t K, int threads) {                                                             \
        const int64_t stride = (KQ) ? K / 256 * 292 : wbq_stride32(K), rb = K / (BS) * (BB); \
        const uint8_t *pk = wbq_pack(x, M, K, KQ, SUM, OFFSET, stride, threads);              \
        if (!pk) {                                                                             \
            wbq_nan(y, M * N);                                                                 \
            return;                                                                            \
        }                                                                                      \
        enum { R = WBQ_ROWS_##ISA, WR = WBQ_WROWS_##ISA };                                     \
        const int64_t groups = (N + WR - 1) / WR;                                              \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                     \
        for (int64_t i = 0; i < groups; ++i) {                                                \
            const int64_t n0 = i * WR, nr = N - n0 < WR ? N - n0 : WR;                         \
            const uint8_t *wn = (const uint8_t *)w + n0 * rb;                                  \
            /* past N: the last row again (computed, not stored) */                            \
            const int64_t step = nr == WR ? rb : 0;                                            \
            /* the next chunk's weight rows, fetched into L1 at the pace of this one's blocks */ \
            const uint8_t *next = n0 + 2 * WR <= N ? wn + WR * rb : 0;                         \
            for (int64_t m = 0; m < M; m += R) {                                              \
                const int P = M - m < R ? (int)(M - m) : R;                                    \
                const uint8_t *pf = m == 0 ? next : 0;                                         \
                const uint8_t *pm = pk + m * stride;                                           \
                float s[R][WR];                                                                \
                if (nr < WR) {                                                                 \
                    for (int64_t r = 0; r < nr; ++r) { /* each row alone, WR times */          \
                        float t[R][WR];                                                        \
                        for (int p = 0; p < P; ++p) /* row by row: any P */                    \
                            wbq_chunk_##T##_##ISA(pm + p * stride, stride, K, 1, wn + r * rb, 0, \
                                                  0, t + p);                                   \
                        for (int p = 0; p < P; ++p) s[p][r] = t[p][0];                         \
                    }                                                                          \
                } else {                                                                       \
                    switch (P) { /* constant row counts: the sums stay in registers */        \
                    case 1: wbq_chunk_##T##_##ISA(pm, stride, K, 1, wn, step, pf, s); break;   \
                    case 2: wbq_chunk_##T##_##ISA(pm, stride, K, 2, wn, step, pf, s); break;   \
                    case 3: wbq_chunk_##T##_##ISA(pm, stride, K, 3, wn, step, pf, s); break;   \
                    case 4: wbq_chunk_##T##_##ISA(pm, stride, K, R > 4 ? 4 : R, wn, step, pf, s); \
                        break;                                                                 \
                    case 5: wbq_chunk_##T##_##ISA(pm, stride, K, R > 5 ? 5 : R, wn, step, pf, s); \
                        break;                                                                 \
                    default: wbq_chunk_##T##_##ISA(pm, stride, K, R, wn, step, pf, s); break;  \
                    }                                                                          \
                }                                                                              \
                for (int p = 0; p < P; ++p)                                                    \
                    for (int64_t r = 0; r < nr; ++r)                                           \
                        y[(m + p) * N + n0 + r] = s[p][r] + (b ? b[n0 + r] : 0.0f);           \
            }                                                                                  \
        }                                                                                      \
    }

#define WBQ_TYPE32(T, BB)                                                                      \
    WBQ_CHUNK32(T, avx2)                                                                       \
    WBQ_CHUNK32(T, avx512)                                                                     \
    WBQ_LINEAR(T, avx2, 32, BB, 0, WBQ_SUM_##T, WBQ_OFFSET_##T##_avx2)                         \
    WBQ_LINEAR(T, avx512, 32, BB, 0, WBQ_SUM_##T, WBQ_OFFSET_##T##_avx512)

WBQ_TYPE32(q4_0, 18)
WBQ_TYPE32(q4_1, 20)
WBQ_TYPE32(q8_0, 34)

WBQ_CHUNK_K45(q4_k, avx2, 144, WBQ_Q4_K_CODES)
WBQ_CHUNK_K45(q4_k, avx512, 144, WBQ_Q4_K_CODES)
WBQ_CHUNK_K45(q5_k, avx2, 176, wbq_codes_q5_k(blk, j))
WBQ_CHUNK_K45(q5_k, avx512, 176, wbq_codes_q5_k(blk, j))
WBQ_CHUNK_Q6_K(avx2)
WBQ_CHUNK_Q6_K(avx512)
WBQ_LINEAR(q4_k, avx2, 256, 144, 1, 0, 0)
WBQ_LINEAR(q4_k, avx512, 256, 144, 1, 0, 0)
WBQ_LINEAR(q5_k, avx2, 256, 176, 1, 0, 0)
WBQ_LINEAR(q5_k, avx512, 256, 176, 1, 0, 0)
WBQ_LINEAR(q6_k, avx2, 256, 210, 1, 0, 0)
WBQ_LINEAR(q6_k, avx512, 256, 210, 1, 0, 0)
