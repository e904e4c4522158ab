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
 * then sums each block's products exactly in int32 and scales the sums in fp32, block after
 * block, as llama.cpp does: acc = fma(float(sum), fp32(d_w * d_a), acc); Q4_1 adds m_w * s_a
 * (a second fma), Q4_K and Q5_K -d_a * dmin_w * sum(m_j * bsum_j) (int32, exact).
 * - Every type reads its weights interleaved by 16 rows (the "rows16" layout, below):
 *   a vector's int32 lanes are 16 (AVX2: 8) weight rows' sums of one block, built by vpdpbusd
 *   (AVX-512 VNNI) or maddubs (AVX2) against 4 activation codes broadcast: a block of 16
 *   weight rows costs 8 dot-product instructions and one scaling per input row of the tile,
 *   no horizontal sum. One chain of fmas per output, its order fixed: the same bits in any
 *   batch, tile, thread count, or path (group or tail).
 * - The K-quants too, their 256-blocks interleaved by 16 rows (planes of their packed scales,
 *   words of their codes): a lane's sub-block sums weighed by its integer scales in int32, then
 *   scaled once per block: acc = fma(float(sum), fp32(d_w * d_a), acc), Q4_K and Q5_K
 *   acc = fnma(float(sum_j m_j * bsum_j), fp32(dmin_w * d_a), acc).
 * - The rows after the last full group (GGML's layout in the weight) are interleaved into a
 *   group of their own per call, the missing rows zero: every row goes through one arithmetic.
 * Integer identities keep the bytes unsigned where vpdpbusd needs them: a Q4_0 code n - 8 as
 * n with -8 * sum(q) as the sum's start, a Q8_0 weight w as w + 128 with -128 * sum(q)
 * (VNNI; AVX2: |w| times q with w's sign); Q6_K's q - 32 through the sums of 16. So the result is the
 * exact sum over blocks of fp32(d_w d_a) * (exact integer sum) (+ the mins' terms) up to fp32
 * rounding of that sum, in an order that does not depend on the row count, the chunk a row
 * falls in, or the thread count: a row's bits are the same in any batch.
 *
 * Threads (OpenMP) take contiguous ranges of weight rows (of 16-row groups); the input rows are
 * quantized by the calling thread (in parallel from 8 rows on) into a buffer of its own,
 * before the products start.
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

/* A 32-block type's row as the products read it: its K codes (64-byte aligned), then per block
 * d_a, s_a (Q8_1; else 0) as floats and the int32 a dot product starts from: -offset * (sum of
 * the block's codes) (Q4_0: offset 8, Q8_0 on VNNI: 128, else 0). */
static inline int64_t wbq_stride32(int64_t K) { return (K + 12 * (K / 32) + 63) & ~(int64_t)63; }

__attribute__((target(WBQ_T2))) static void wbq_pack32(const float *x, int64_t K, int with_sum,
                                                        int offset, uint8_t *pk) {
    const int64_t G = K / 32;
    float *da = (float *)(pk + K), *sa = da + G;
    int32_t *init = (int32_t *)(sa + G);
    for (int64_t g = 0; g < G; ++g) {
        uint8_t blk[36];
        wbq_q8_0_row(x + 32 * g, blk, 32, with_sum);
        const int8_t *q = (const int8_t *)(blk + (with_sum ? 4 : 2));
        memcpy(pk + 32 * g, q, 32);
        da[g] = wbq_half(blk);
        sa[g] = with_sum ? wbq_half(blk + 2) : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; ++i) sum += q[i];
        init[g] = -offset * sum;
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

/* ---- the dot products ---- */

/* AVX2: u8 x s8 pairs in int16 (no saturation: |u| <= 128, |s| <= 127 here), then int32. */
WBQ_INLINE __m256i wbq_dot2(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                   _mm256_set1_epi16(1)));
}

/* what a 32-value type's dot products start from: -offset * sum(q) (Q4_0's codes n - 8 taken
 * as n, Q8_0's w as w + 128 on VNNI), and whether its activations carry s (Q8_1) */
#define WBQ_OFFSET_q4_0_avx2 8
#define WBQ_OFFSET_q4_1_avx2 0
#define WBQ_OFFSET_q8_0_avx2 0
#define WBQ_OFFSET_q4_0_avx512 8
#define WBQ_OFFSET_q4_1_avx512 0
#define WBQ_OFFSET_q8_0_avx512 128
#define WBQ_SUM_q4_0 0
#define WBQ_SUM_q4_1 1
#define WBQ_SUM_q8_0 0
#define WBQ_OFFSET_q4_k_avx2 0 /* the K-quants' partner, Q8_K, keeps its own sums */
#define WBQ_OFFSET_q5_k_avx2 0
#define WBQ_OFFSET_q6_k_avx2 0
#define WBQ_OFFSET_q4_k_avx512 0
#define WBQ_OFFSET_q5_k_avx512 0
#define WBQ_OFFSET_q6_k_avx512 0
#define WBQ_SUM_q4_k 0
#define WBQ_SUM_q5_k 0
#define WBQ_SUM_q6_k 0
#define WBQ_TARGET_avx2 WBQ_T2
#define WBQ_TARGET_avx512 WBQ_T5

/* ---- the 32-block types (Q4_0, Q4_1, Q8_0), their weight rows interleaved by 16 ----
 *
 * The layout ("rows16", written by `QuantizedWeight.interleaved`): each group of 16 weight rows
 * keeps its bytes where the rows had them, block after block; a block of the group holds the 16
 * rows' d (fp16) side by side, then (Q4_1) their m, then their codes in chunks of 64 bytes: chunk
 * j is bytes [4j, 4j + 4) of each row's codes, row after row (Q4: low nibbles are the block's
 * values 4j..4j+3, high nibbles 16+4j..; Q8_0: values 4j..4j+3). Rows past the last full group
 * stay as GGML has them. So one vector of int32 lanes holds 16 (AVX2: 8) rows' sums of one
 * block: vpdpbusd (or maddubs) against 4 activation codes broadcast, the lanes never summed
 * across; a lane's sum is then scaled as in the row-by-row tail:
 *   acc = fma(float(int32 sum), fp32(d_w * d_a), acc);  Q4_1: acc = fma(m_w, s_a, acc)
 * block after block, one chain per output: the same bits whatever the batch, the tile, the
 * thread or the path (group or tail) that computes it. */

#define WBQ_K_q4_0 0
#define WBQ_K_q4_1 1
#define WBQ_K_q8_0 2
#define WBQ_HDR(kind) ((kind) == WBQ_K_q4_1 ? 4 : 2)       /* scale bytes a row and block */
#define WBQ_BBK(kind) ((kind) == WBQ_K_q4_0 ? 18 : (kind) == WBQ_K_q4_1 ? 20 : 34)

static inline int32_t wbq_word(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* AVX-512 VNNI: input rows [0, P) of the pack against one group of 16 weight rows -> y[p][0, 16) */
WBQ_INLINE5 void wbq_group_avx512(const int kind, const uint8_t *wg, const uint8_t *pk,
                                  int64_t stride, int64_t K, const int P, const float *bias,
                                  float *y, int64_t N) {
    const int64_t G = K / 32, gb = 16 * WBQ_BBK(kind);
    const uint8_t *codes0 = wg + 16 * WBQ_HDR(kind);
    __m512 acc[8];
    for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8(-128);
    for (int64_t g = 0; g < G; ++g) {
        const uint8_t *blk = wg + g * gb, *codes = codes0 + g * gb;
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        __m512i isum[8];
        for (int p = 0; p < P; ++p) {
            const int32_t *init = (const int32_t *)(pk + p * stride + K + 8 * G);
            isum[p] = kind == WBQ_K_q4_1 ? _mm512_setzero_si512() : _mm512_set1_epi32(init[g]);
        }
        if (kind == WBQ_K_q8_0) {
            for (int j = 0; j < 8; ++j) {
                const __m512i w = _mm512_xor_si512(_mm512_loadu_si512(codes + 64 * j), flip);
                for (int p = 0; p < P; ++p)
                    isum[p] = _mm512_dpbusd_epi32(
                        isum[p], w, _mm512_set1_epi32(wbq_word(pk + p * stride + 32 * g + 4 * j)));
            }
        } else {
            for (int j = 0; j < 4; ++j) {
                const __m512i raw = _mm512_loadu_si512(codes + 64 * j);
                const __m512i lo = _mm512_and_si512(raw, low4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
                for (int p = 0; p < P; ++p) {
                    const uint8_t *q = pk + p * stride + 32 * g + 4 * j;
                    isum[p] = _mm512_dpbusd_epi32(isum[p], lo, _mm512_set1_epi32(wbq_word(q)));
                    isum[p] = _mm512_dpbusd_epi32(isum[p], hi,
                                                  _mm512_set1_epi32(wbq_word(q + 16)));
                }
            }
        }
        const __m512 mw = kind == WBQ_K_q4_1
            ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)))
            : _mm512_setzero_ps();
        for (int p = 0; p < P; ++p) {
            const float *da = (const float *)(pk + p * stride + K);
            acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[p]),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(da[g])), acc[p]);
            if (kind == WBQ_K_q4_1) acc[p] = _mm512_fmadd_ps(mw, _mm512_set1_ps(da[G + g]), acc[p]);
        }
    }
    const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(y + p * N, _mm512_add_ps(acc[p], b));
}

/* AVX2: the same for half h of a group (8 weight rows); Q4 codes' pair sums stay in int16 over a
 * block (8 maddubs of |pairs| <= 2 * 15 * 127: <= 30480), Q8_0's as |w| times q with w's sign */
WBQ_INLINE void wbq_group_avx2(const int kind, const uint8_t *wg, const uint8_t *pk,
                               int64_t stride, int64_t K, const int P, const float *bias,
                               float *y, int64_t N) {
    const int64_t G = K / 32, gb = 16 * WBQ_BBK(kind);
    const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; ++h) {
        const uint8_t *codes0 = wg + 16 * WBQ_HDR(kind) + 32 * h;
        __m256 acc[4];
        for (int p = 0; p < P; ++p) acc[p] = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
            const uint8_t *blk = wg + g * gb, *codes = codes0 + g * gb;
            __m256i isum[4];
            if (kind == WBQ_K_q8_0) {
                for (int p = 0; p < P; ++p) isum[p] = _mm256_setzero_si256();
                for (int j = 0; j < 8; ++j) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(codes + 64 * j));
                    const __m256i aw = _mm256_sign_epi8(w, w);
                    for (int p = 0; p < P; ++p) {
                        const __m256i q = _mm256_set1_epi32(
                            wbq_word(pk + p * stride + 32 * g + 4 * j));
                        isum[p] = _mm256_add_epi32(isum[p], _mm256_madd_epi16(
                            _mm256_maddubs_epi16(aw, _mm256_sign_epi8(q, w)), ones));
                    }
                }
            } else {
                __m256i t[4];
                for (int p = 0; p < P; ++p) t[p] = _mm256_setzero_si256();
                for (int j = 0; j < 4; ++j) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(codes + 64 * j));
                    const __m256i lo = _mm256_and_si256(raw, low4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                    for (int p = 0; p < P; ++p) {
                        const uint8_t *q = pk + p * stride + 32 * g + 4 * j;
                        t[p] = _mm256_add_epi16(t[p], _mm256_maddubs_epi16(
                            lo, _mm256_set1_epi32(wbq_word(q))));
                        t[p] = _mm256_add_epi16(t[p], _mm256_maddubs_epi16(
                            hi, _mm256_set1_epi32(wbq_word(q + 16))));
                    }
                }
                for (int p = 0; p < P; ++p) {
                    const int32_t *init = (const int32_t *)(pk + p * stride + K + 8 * G);
                    isum[p] = _mm256_add_epi32(_mm256_madd_epi16(t[p], ones),
                                               _mm256_set1_epi32(init[g]));
                }
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
            const __m256 mw = kind == WBQ_K_q4_1
                ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h)))
                : _mm256_setzero_ps();
            for (int p = 0; p < P; ++p) {
                const float *da = (const float *)(pk + p * stride + K);
                acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[p]),
                                         _mm256_mul_ps(dw, _mm256_set1_ps(da[g])), acc[p]);
                if (kind == WBQ_K_q4_1)
                    acc[p] = _mm256_fmadd_ps(mw, _mm256_set1_ps(da[G + g]), acc[p]);
            }
        }
        const __m256 b = bias ? _mm256_loadu_ps(bias + 8 * h) : _mm256_setzero_ps();
        for (int p = 0; p < P; ++p) _mm256_storeu_ps(y + p * N + 8 * h, _mm256_add_ps(acc[p], b));
    }
}

/* ---- the K-quants interleaved by 16 rows (FIELDS in models/gguf_blocks.py) ----
 * A 256-block of 16 rows: Q4_K / Q5_K: their d, their dmin (fp16 each), the 12 bytes of packed
 * 6-bit scales and mins as 12 planes (plane b: byte b of each row), (Q5_K: the 32 bytes of high
 * bits as 8 words a row), the 128 bytes of nibbles as 32 words a row; Q6_K: its 128 bytes of
 * low nibbles as 32 words, its 64 of high bits as 16 words, its 16 int8 scales as 16 planes, d.
 * Each lane (a weight row) sums a sub-block's codes times the activation codes exactly in int32,
 * weighs the sum by its integer scale (Q6_K: the codes' -32 through the activations' sums of
 * 16), adds up the block in int32; then per block acc = fma(float(sum), fp32(d_w * d_a), acc)
 * and (Q4_K, Q5_K) acc = fnma(float(sum_j m_j * bsum_j), fp32(dmin_w * d_a), acc). AVX-512
 * (vpdpbusd) takes a group's 16 rows at once, AVX2 (maddubs, below) its halves of 8 in turn. */
#define WBQ_KROWS_avx512 6
#define WBQ_KROWS_avx2 2
WBQ_INLINE5 __m512i wbk_load_avx512(const uint8_t *p) { return _mm512_loadu_si512(p); }
WBQ_INLINE5 __m512i wbk_bcast_avx512(const uint8_t *p) { return _mm512_set1_epi32(wbq_word(p)); }
WBQ_INLINE __m256i wbk_bcast_avx2(const uint8_t *p) { return _mm256_set1_epi32(wbq_word(p)); }
WBQ_INLINE5 __m512i wbk_dot_avx512(__m512i acc, __m512i u, __m512i s) {
    return _mm512_dpbusd_epi32(acc, u, s);
}
WBQ_INLINE5 __m512i wbk_bits_avx512(__m512i v, int shift, int mask) {  /* bytes: (v >> shift) & mask */
    return _mm512_and_si512(_mm512_srli_epi16(v, shift), _mm512_set1_epi8((char)mask));
}
WBQ_INLINE __m256i wbk_bits_avx2(__m256i v, int shift, int mask) {
    return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8((char)mask));
}
WBQ_INLINE5 __m512i wbk_or_avx512(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
WBQ_INLINE5 __m512i wbk_shl4_avx512(__m512i v) { return _mm512_slli_epi16(v, 4); }
WBQ_INLINE5 __m512i wbk_zero_avx512(void) { return _mm512_setzero_si512(); }
WBQ_INLINE5 __m512i wbk_add_avx512(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
WBQ_INLINE5 __m512i wbk_mul_avx512(__m512i a, __m512i b) { return _mm512_mullo_epi32(a, b); }
WBQ_INLINE5 __m512i wbk_set_avx512(int v) { return _mm512_set1_epi32(v); }
/* a plane of 16 bytes (AVX2: 8 of them, at p) as int32 lanes, unsigned or signed */
WBQ_INLINE5 __m512i wbk_u8_avx512(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
WBQ_INLINE __m256i wbk_u8_avx2(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
WBQ_INLINE5 __m512i wbk_i8_avx512(const uint8_t *p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}
WBQ_INLINE __m256i wbk_i8_avx2(const uint8_t *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
WBQ_INLINE5 __m512 wbk_half_avx512(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
WBQ_INLINE __m256 wbk_half_avx2(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
WBQ_INLINE5 __m512 wbk_fzero_avx512(void) { return _mm512_setzero_ps(); }
WBQ_INLINE5 __m512 wbk_scale_avx512(__m512 acc, __m512i sum, __m512 dw, float da) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(da)), acc);
}
WBQ_INLINE __m256 wbk_scale_avx2(__m256 acc, __m256i sum, __m256 dw, float da) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, _mm256_set1_ps(da)), acc);
}
WBQ_INLINE5 __m512 wbk_unscale_avx512(__m512 acc, __m512i sum, __m512 dm, float da) {
    return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dm, _mm512_set1_ps(da)), acc);
}
WBQ_INLINE __m256 wbk_unscale_avx2(__m256 acc, __m256i sum, __m256 dm, float da) {
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dm, _mm256_set1_ps(da)), acc);
}
WBQ_INLINE5 void wbk_store_avx512(float *y, __m512 v, const float *b) {
    _mm512_storeu_ps(y, b ? _mm512_add_ps(v, _mm512_loadu_ps(b)) : v);
}
WBQ_INLINE void wbk_store_avx2(float *y, __m256 v, const float *b) {
    _mm256_storeu_ps(y, b ? _mm256_add_ps(v, _mm256_loadu_ps(b)) : v);
}

/* Q4_K (hb 0) or Q5_K (hb 1): input rows [0, P) of the Q8_K pack against one group of 16 weight
 * rows -> y[p][0, 16) */
static inline __attribute__((always_inline, target(WBQ_TARGET_avx512))) void
wbk_group45_avx512(const int hb, const uint8_t *wg, const uint8_t *pk, int64_t stride,
              int64_t K, const int P, const float *bias, float *y, int64_t N) {
    const int64_t G = K / 256, gb = 16 * (hb ? 176 : 144);
    __m512 acc[WBQ_KROWS_avx512];
    for (int p = 0; p < P; ++p) acc[p] = wbk_fzero_avx512();
    for (int64_t g = 0; g < G; ++g) {
        const uint8_t *blk = wg + g * gb, *planes = blk + 64;
        const uint8_t *qh = blk + 256;
        const uint8_t *qs = blk + (hb ? 768 : 256);
        __m512i sum[WBQ_KROWS_avx512], mins[WBQ_KROWS_avx512];
        for (int p = 0; p < P; ++p) sum[p] = mins[p] = wbk_zero_avx512();
        for (int j = 0; j < 8; ++j) {
            const __m512i lo = wbk_u8_avx512(planes + 16 * (j < 4 ? j : j + 4));
            const __m512i hi = wbk_u8_avx512(planes + 16 * (j < 4 ? j + 4 : j - 4));
            __m512i sc, mn;
            if (j < 4) {
                sc = wbk_bits_avx512(lo, 0, 63);
                mn = wbk_bits_avx512(hi, 0, 63);
            } else {
                const __m512i top = wbk_u8_avx512(planes + 16 * j);
                sc = wbk_or_avx512(wbk_bits_avx512(lo, 0, 15),
                                  wbk_shl4_avx512(wbk_bits_avx512(hi, 6, 3)));
                mn = wbk_or_avx512(wbk_bits_avx512(lo, 4, 15),
                                  wbk_shl4_avx512(wbk_bits_avx512(top, 6, 3)));
            }
            __m512i part[WBQ_KROWS_avx512];
            for (int p = 0; p < P; ++p) part[p] = wbk_zero_avx512();
            for (int t = 0; t < 8; ++t) {
                __m512i c = wbk_bits_avx512(
                    wbk_load_avx512(qs + 64 * (8 * (j >> 1) + t)), 4 * (j & 1), 15);
                if (hb)
                    c = wbk_or_avx512(c, wbk_shl4_avx512(wbk_bits_avx512(
                                           wbk_load_avx512(qh + 64 * t), j, 1)));
                for (int p = 0; p < P; ++p)
                    part[p] = wbk_dot_avx512(part[p], c, wbk_bcast_avx512(
                        pk + p * stride + g * 292 + 4 + 32 * j + 4 * t));
            }
            for (int p = 0; p < P; ++p) {
                const int16_t *bs = (const int16_t *)(pk + p * stride + g * 292 + 260);
                sum[p] = wbk_add_avx512(sum[p], wbk_mul_avx512(part[p], sc));
                mins[p] = wbk_add_avx512(mins[p], wbk_mul_avx512(
                    mn, wbk_set_avx512(bs[2 * j] + bs[2 * j + 1])));
            }
        }
        const __m512 dw = wbk_half_avx512(blk);
        const __m512 dm = wbk_half_avx512(blk + 32);
        for (int p = 0; p < P; ++p) {
            float da;
            memcpy(&da, pk + p * stride + g * 292, 4);
            acc[p] = wbk_scale_avx512(acc[p], sum[p], dw, da);
            acc[p] = wbk_unscale_avx512(acc[p], mins[p], dm, da);
        }
    }
    for (int p = 0; p < P; ++p)
        wbk_store_avx512(y + p * N, acc[p], bias);
}

/* Q6_K: 16 sub-blocks of 16 values; sub-block s = 8n + 2 part + half: its codes are nibble
 * (part >> 1) of low words 16n + 8 (part & 1) + 4 half + t and bits 2 part of high words
 * 8n + 4 half + t (t < 4), its scale plane s, its activations' sum bsums[s] */
static inline __attribute__((always_inline, target(WBQ_TARGET_avx512))) void
wbk_group6_avx512(const int hb, const uint8_t *wg, const uint8_t *pk, int64_t stride,
             int64_t K, const int P, const float *bias, float *y, int64_t N) {
    (void)hb;
    const int64_t G = K / 256, gb = 16 * 210;
    __m512 acc[WBQ_KROWS_avx512];
    for (int p = 0; p < P; ++p) acc[p] = wbk_fzero_avx512();
    for (int64_t g = 0; g < G; ++g) {
        const uint8_t *blk = wg + g * gb, *ql = blk;
        const uint8_t *qh = blk + 2048, *planes = blk + 3072;
        __m512i sum[WBQ_KROWS_avx512];
        for (int p = 0; p < P; ++p) sum[p] = wbk_zero_avx512();
        for (int s = 0; s < 16; ++s) {
            const int n = s >> 3, part = (s >> 1) & 3, half = s & 1;
            const __m512i sc = wbk_i8_avx512(planes + 16 * s);
            __m512i sub[WBQ_KROWS_avx512];
            for (int p = 0; p < P; ++p) {
                const int16_t *bs = (const int16_t *)(pk + p * stride + g * 292 + 260);
                sub[p] = wbk_set_avx512(-32 * bs[s]);
            }
            for (int t = 0; t < 4; ++t) {
                const int lw = 16 * n + 8 * (part & 1) + 4 * half + t;
                const int hw = 8 * n + 4 * half + t;
                const __m512i c = wbk_or_avx512(
                    wbk_bits_avx512(wbk_load_avx512(ql + 64 * lw), 4 * (part >> 1), 15),
                    wbk_shl4_avx512(wbk_bits_avx512(wbk_load_avx512(qh + 64 * hw),
                                                  2 * part, 3)));
                for (int p = 0; p < P; ++p)
                    sub[p] = wbk_dot_avx512(sub[p], c, wbk_bcast_avx512(
                        pk + p * stride + g * 292 + 4 + 16 * s + 4 * t));
            }
            for (int p = 0; p < P; ++p)
                sum[p] = wbk_add_avx512(sum[p], wbk_mul_avx512(sub[p], sc));
        }
        const __m512 dw = wbk_half_avx512(blk + 3328);
        for (int p = 0; p < P; ++p) {
            float da;
            memcpy(&da, pk + p * stride + g * 292, 4);
            acc[p] = wbk_scale_avx512(acc[p], sum[p], dw, da);
        }
    }
    for (int p = 0; p < P; ++p)
        wbk_store_avx512(y + p * N, acc[p], bias);
}

/* AVX2 has no vpdpbusd: maddubs leaves pairs of products in int16, so a sub-block's codes are
 * summed in int16 first (as many maddubs as cannot overflow: Q4_K 8, Q5_K 4, Q6_K 2) and the
 * int16 sums weighed by the sub-block's scale in one madd (each lane's scale in both halves of
 * its int32): the same exact int32 sum as the VNNI functions', fewer instructions. */

/* (v, v) as the int16 halves of each int32 lane (v in [-32768, 32767]) */
WBQ_INLINE __m256i wbk2_dup(__m256i v) {
    return _mm256_blend_epi16(v, _mm256_slli_epi32(v, 16), 0xAA);
}

/* the int16 pair sums t weighed by the lanes' scales sc16, added to sum; t cleared */
WBQ_INLINE void wbk2_flush(__m256i *sum, __m256i *t, __m256i sc16) {
    *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(*t, sc16));
    *t = _mm256_setzero_si256();
}

/* Q4_K (hb 0) or Q5_K (hb 1) on AVX2: as wbk_group45_avx512, 8 weight rows (half h) at a time */
WBQ_INLINE void wbk_group45_avx2(const int hb, const uint8_t *wg, const uint8_t *pk,
                                 int64_t stride, int64_t K, const int P, const float *bias,
                                 float *y, int64_t N) {
    const int64_t G = K / 256, gb = 16 * (hb ? 176 : 144);
    const __m256i low4 = _mm256_set1_epi8(15), bit4 = _mm256_set1_epi8(16);
    for (int h = 0; h < 2; ++h) {
        __m256 acc[WBQ_KROWS_avx2];
        for (int p = 0; p < P; ++p) acc[p] = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
            const uint8_t *blk = wg + g * gb, *planes = blk + 64 + 8 * h;
            const uint8_t *qh = blk + 256 + 32 * h, *qs = blk + (hb ? 768 : 256) + 32 * h;
            __m256i sum[WBQ_KROWS_avx2], mins[WBQ_KROWS_avx2];
            for (int p = 0; p < P; ++p) sum[p] = mins[p] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int w = 0; w < 4; ++w) {  /* sub-blocks 2w (low nibbles) and 2w + 1 (high) */
                __m256i sc16[2], mn[2];
                for (int e = 0; e < 2; ++e) {
                    const int j = 2 * w + e;
                    const __m256i lo = wbk_u8_avx2(planes + 16 * (j < 4 ? j : j + 4));
                    const __m256i hi = wbk_u8_avx2(planes + 16 * (j < 4 ? j + 4 : j - 4));
                    __m256i sc;
                    if (j < 4) {
                        sc = wbk_bits_avx2(lo, 0, 63);
                        mn[e] = wbk_bits_avx2(hi, 0, 63);
                    } else {
                        const __m256i top = wbk_u8_avx2(planes + 16 * j);
                        sc = _mm256_or_si256(wbk_bits_avx2(lo, 0, 15),
                                             _mm256_slli_epi16(wbk_bits_avx2(hi, 6, 3), 4));
                        mn[e] = _mm256_or_si256(wbk_bits_avx2(lo, 4, 15),
                                                _mm256_slli_epi16(wbk_bits_avx2(top, 6, 3), 4));
                    }
                    sc16[e] = wbk2_dup(sc);
                }
                __m256i t[2][WBQ_KROWS_avx2];
                for (int p = 0; p < P; ++p) t[0][p] = t[1][p] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int u = 0; u < 8; ++u) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 64 * (8 * w + u)));
                    __m256i c[2] = {_mm256_and_si256(raw, low4),
                                    _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4)};
                    if (hb) {
                        const __m256i bits = _mm256_loadu_si256((const __m256i *)(qh + 64 * u));
                        for (int e = 0; e < 2; ++e)  /* bit j = 2w + e of each byte to bit 4 */
                            c[e] = _mm256_or_si256(c[e], _mm256_and_si256(
                                2 * w + e <= 4 ? _mm256_slli_epi16(bits, 4 - 2 * w - e)
                                               : _mm256_srli_epi16(bits, 2 * w + e - 4), bit4));
                    }
                    for (int e = 0; e < 2; ++e)
                        for (int p = 0; p < P; ++p)
                            t[e][p] = _mm256_add_epi16(t[e][p], _mm256_maddubs_epi16(c[e],
                                wbk_bcast_avx2(pk + p * stride + g * 292 + 4 + 32 * (2 * w + e) + 4 * u)));
                    if (u == 7 || (hb && u == 3))  /* |t| <= 8 (Q5_K: 4) * 2 * 15 (31) * 127 */
                        for (int e = 0; e < 2; ++e)
                            for (int p = 0; p < P; ++p) wbk2_flush(&sum[p], &t[e][p], sc16[e]);
                }
                for (int p = 0; p < P; ++p) {
                    const int16_t *bs = (const int16_t *)(pk + p * stride + g * 292 + 260) + 4 * w;
                    for (int e = 0; e < 2; ++e)
                        mins[p] = _mm256_add_epi32(mins[p], _mm256_mullo_epi32(
                            mn[e], _mm256_set1_epi32(bs[2 * e] + bs[2 * e + 1])));
                }
            }
            const __m256 dw = wbk_half_avx2(blk + 16 * h), dm = wbk_half_avx2(blk + 32 + 16 * h);
            for (int p = 0; p < P; ++p) {
                float da;
                memcpy(&da, pk + p * stride + g * 292, 4);
                acc[p] = wbk_scale_avx2(acc[p], sum[p], dw, da);
                acc[p] = wbk_unscale_avx2(acc[p], mins[p], dm, da);
            }
        }
        for (int p = 0; p < P; ++p) wbk_store_avx2(y + p * N + 8 * h, acc[p], bias ? bias + 8 * h : 0);
    }
}

/* Q6_K on AVX2: as wbk_group6_avx512, 8 weight rows (half h) at a time; the codes' -32 as
 * -32 * sum_s sc_s * bsums_s, two sub-blocks a madd */
WBQ_INLINE void wbk_group6_avx2(const int hb, const uint8_t *wg, const uint8_t *pk,
                                int64_t stride, int64_t K, const int P, const float *bias,
                                float *y, int64_t N) {
    (void)hb;
    const int64_t G = K / 256, gb = 16 * 210;
    const __m256i low4 = _mm256_set1_epi8(15), high2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
        __m256 acc[WBQ_KROWS_avx2];
        for (int p = 0; p < P; ++p) acc[p] = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
            const uint8_t *blk = wg + g * gb, *ql = blk + 32 * h;
            const uint8_t *qh = blk + 2048 + 32 * h, *planes = blk + 3072 + 8 * h;
            __m256i sum[WBQ_KROWS_avx2], offs[WBQ_KROWS_avx2];
            for (int p = 0; p < P; ++p) sum[p] = offs[p] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int s2 = 0; s2 < 8; ++s2) {  /* sub-blocks s = 2 s2 + half */
                const __m256i sc0 = wbk_i8_avx2(planes + 32 * s2);
                const __m256i sc1 = wbk_i8_avx2(planes + 32 * s2 + 16);
                const __m256i pair = _mm256_blend_epi16(sc0, _mm256_slli_epi32(sc1, 16), 0xAA);
                for (int p = 0; p < P; ++p) {  /* sc_s * bsums_s + sc_s+1 * bsums_s+1 */
                    const uint8_t *bs = pk + p * stride + g * 292 + 260 + 4 * s2;
                    offs[p] = _mm256_add_epi32(offs[p], _mm256_madd_epi16(pair, wbk_bcast_avx2(bs)));
                }
                const int n = s2 >> 2, part = s2 & 3;
#pragma GCC unroll 2
                for (int half = 0; half < 2; ++half) {
                    const int s = 2 * s2 + half;
                    const __m256i sc16 = wbk2_dup(half ? sc1 : sc0);
                    __m256i t[WBQ_KROWS_avx2];
                    for (int p = 0; p < P; ++p) t[p] = _mm256_setzero_si256();
#pragma GCC unroll 4
                    for (int u = 0; u < 4; ++u) {
                        const int lw = 16 * n + 8 * (part & 1) + 4 * half + u;
                        const int hw = 8 * n + 4 * half + u;
                        const __m256i lo = _mm256_loadu_si256((const __m256i *)(ql + 64 * lw));
                        const __m256i hi = _mm256_loadu_si256((const __m256i *)(qh + 64 * hw));
                        const __m256i l4 = part >> 1 ? _mm256_srli_epi16(lo, 4) : lo;
                        /* qh's bits 2 part, 2 part + 1 to bits 4, 5 */
                        const __m256i h2 = part == 0 ? _mm256_slli_epi16(hi, 4)
                                         : part == 1 ? _mm256_slli_epi16(hi, 2)
                                         : part == 2 ? hi : _mm256_srli_epi16(hi, 2);
                        const __m256i c = _mm256_or_si256(_mm256_and_si256(l4, low4),
                                                          _mm256_and_si256(h2, high2));
                        for (int p = 0; p < P; ++p)
                            t[p] = _mm256_add_epi16(t[p], _mm256_maddubs_epi16(c,
                                wbk_bcast_avx2(pk + p * stride + g * 292 + 4 + 16 * s + 4 * u)));
                        if (u & 1)  /* |t| <= 2 * 2 * 63 * 127 */
                            for (int p = 0; p < P; ++p) wbk2_flush(&sum[p], &t[p], sc16);
                    }
                }
            }
            const __m256 dw = wbk_half_avx2(blk + 3328 + 16 * h);
            for (int p = 0; p < P; ++p) {
                float da;
                memcpy(&da, pk + p * stride + g * 292, 4);
                sum[p] = _mm256_sub_epi32(sum[p], _mm256_slli_epi32(offs[p], 5));
                acc[p] = wbk_scale_avx2(acc[p], sum[p], dw, da);
            }
        }
        for (int p = 0; p < P; ++p) wbk_store_avx2(y + p * N + 8 * h, acc[p], bias ? bias + 8 * h : 0);
    }
}

/* ---- the products: y [M, N] = x [M, K] w^T (+ b), w in the rows16 layout ----
 * The rows are quantized to the partner type, then each thread takes a contiguous range of
 * groups of 16 weight rows and runs every input row through each, WBQ_ROWS at a time (the
 * group's blocks stay in L1 meanwhile). The rows after the last full group (GGML's layout)
 * are interleaved into a group of their own in a buffer of the thread's, the missing rows zero,
 * and go through the same function: one arithmetic for every row. */
#define WBQ_ROWS_q4_0_avx2 4
#define WBQ_ROWS_q4_1_avx2 4
#define WBQ_ROWS_q8_0_avx2 4
#define WBQ_ROWS_q4_0_avx512 8
#define WBQ_ROWS_q4_1_avx512 8
#define WBQ_ROWS_q8_0_avx512 8
#define WBQ_ROWS_q4_k_avx2 WBQ_KROWS_avx2
#define WBQ_ROWS_q5_k_avx2 WBQ_KROWS_avx2
#define WBQ_ROWS_q6_k_avx2 WBQ_KROWS_avx2
#define WBQ_ROWS_q4_k_avx512 WBQ_KROWS_avx512
#define WBQ_ROWS_q5_k_avx512 WBQ_KROWS_avx512
#define WBQ_ROWS_q6_k_avx512 WBQ_KROWS_avx512

/* a block's fields per type: (offset, bytes, unit), as FIELDS in models/gguf_blocks.py */
typedef struct { int at, size, unit; } wbq_field;
static const wbq_field WBQ_FIELDS[6][6] = {
    {{0, 2, 2}, {2, 16, 4}},                                    /* Q4_0 */
    {{0, 2, 2}, {2, 2, 2}, {4, 16, 4}},                         /* Q4_1 */
    {{0, 2, 2}, {2, 32, 4}},                                    /* Q8_0 */
    {{0, 2, 2}, {2, 2, 2}, {4, 12, 1}, {16, 128, 4}},           /* Q4_K */
    {{0, 2, 2}, {2, 2, 2}, {4, 12, 1}, {16, 32, 4}, {48, 128, 4}},  /* Q5_K */
    {{0, 128, 4}, {128, 64, 4}, {192, 16, 1}, {208, 2, 2}},     /* Q6_K */
};
#define WBQ_TYPE_q4_0 0
#define WBQ_TYPE_q4_1 1
#define WBQ_TYPE_q8_0 2
#define WBQ_TYPE_q4_k 3
#define WBQ_TYPE_q5_k 4
#define WBQ_TYPE_q6_k 5

static __thread uint8_t *wbq_tail_buffer;
static __thread int64_t wbq_tail_capacity;

/* rows w [0, nr) (nr < 16, GGML's layout, rb bytes each: G blocks of bb) as one interleaved
 * group, the other rows zero, in this thread's buffer (NULL: out of memory) */
static const uint8_t *wbq_tail_group(int type, const uint8_t *w, int64_t nr, int64_t rb,
                                     int64_t G, int bb) {
    if (16 * rb > wbq_tail_capacity) {
        free(wbq_tail_buffer);
        wbq_tail_buffer = aligned_alloc(64, (size_t)((16 * rb + 4095) & ~(int64_t)4095));
        wbq_tail_capacity = wbq_tail_buffer ? (16 * rb + 4095) & ~(int64_t)4095 : 0;
        if (!wbq_tail_buffer) return NULL;
    }
    memset(wbq_tail_buffer, 0, (size_t)(16 * rb));
    for (int64_t g = 0; g < G; ++g) {
        uint8_t *out = wbq_tail_buffer + g * 16 * bb;
        for (const wbq_field *f = WBQ_FIELDS[type]; f->size; out += 16 * f->size, ++f)
            for (int k = 0; k < f->size / f->unit; ++k)
                for (int64_t r = 0; r < nr; ++r)
                    memcpy(out + (16 * k + r) * f->unit, w + r * rb + g * bb + f->at + k * f->unit,
                           (size_t)f->unit);
    }
    return wbq_tail_buffer;
}

/* T: the type; BS, BB: its block's values and bytes; KQ: its partner is Q8_K; GROUP(FIRST, ...):
 * the function for a group of 16 weight rows and up to WBQ_ROWS input rows */
#define WBQ_LINEAR(T, ISA, BS, BB, KQ, GROUP, FIRST)                                           \
    __attribute__((target(WBQ_TARGET_##ISA))) void wb_q8_linear_##T##_##ISA(                  \
        const float *x, const void *w, const float *b, float *y, int64_t M, int64_t N,        \
        int64_t K, int threads) {                                                             \
        enum { R = WBQ_ROWS_##T##_##ISA };                                                     \
        const int64_t stride = (KQ) ? K / 256 * 292 : wbq_stride32(K), rb = K / (BS) * (BB);  \
        const uint8_t *pk = wbq_pack(x, M, K, KQ, WBQ_SUM_##T, WBQ_OFFSET_##T##_##ISA, stride,  \
                                     threads);                                                 \
        if (!pk) {                                                                             \
            wbq_nan(y, M * N);                                                                 \
            return;                                                                            \
        }                                                                                      \
        const int64_t groups = (N + 15) / 16;                                                  \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                     \
        for (int64_t u = 0; u < groups; ++u) {                                                \
            const int64_t nr = N - 16 * u < 16 ? N - 16 * u : 16;                              \
            const uint8_t *wg = (const uint8_t *)w + u * 16 * rb;                              \
            if (nr < 16) wg = wbq_tail_group(WBQ_TYPE_##T, wg, nr, rb, K / (BS), BB);          \
            for (int64_t m = 0; m < M; m += R) {                                              \
                const int P = M - m < R ? (int)(M - m) : R;                                    \
                const uint8_t *pm = pk + m * stride;                                           \
                float tail[R * 16];                                                            \
                /* the last group: into tail (16 wide), its nr columns then copied */         \
                float *ym = nr < 16 ? tail : y + m * N + 16 * u;                               \
                const int64_t ld = nr < 16 ? 16 : N;                                           \
                const float *bias = b && nr == 16 ? b + 16 * u : 0;                            \
                if (!wg) { /* out of memory for the last group */                             \
                    for (int p = 0; p < P * 16; ++p) tail[p] = NAN;                            \
                } else {                                                                       \
                    switch (P) { /* constant row counts: the sums stay in registers */        \
                    case 1: GROUP##_##ISA(FIRST, wg, pm, stride, K, 1, bias, ym, ld); break;   \
                    case 2: GROUP##_##ISA(FIRST, wg, pm, stride, K, R > 2 ? 2 : R, bias, ym, ld); \
                        break;                                                                 \
                    case 3: GROUP##_##ISA(FIRST, wg, pm, stride, K, R > 3 ? 3 : R, bias, ym, ld); \
                        break;                                                                 \
                    case 4: GROUP##_##ISA(FIRST, wg, pm, stride, K, R > 4 ? 4 : R, bias, ym, ld); \
                        break;                                                                 \
                    case 5: GROUP##_##ISA(FIRST, wg, pm, stride, K, R > 5 ? 5 : R, bias, ym, ld); \
                        break;                                                                 \
                    case 6: GROUP##_##ISA(FIRST, wg, pm, stride, K, R > 6 ? 6 : R, bias, ym, ld); \
                        break;                                                                 \
                    case 7: GROUP##_##ISA(FIRST, wg, pm, stride, K, R > 7 ? 7 : R, bias, ym, ld); \
                        break;                                                                 \
                    default: GROUP##_##ISA(FIRST, wg, pm, stride, K, R, bias, ym, ld); break;  \
                    }                                                                          \
                }                                                                              \
                if (nr < 16) /* the bias added as the group's function adds it */             \
                    for (int p = 0; p < P; ++p)                                                \
                        for (int64_t r = 0; r < nr; ++r)                                       \
                            y[(m + p) * N + 16 * u + r] = b ? tail[p * 16 + r] + b[16 * u + r] \
                                                            : tail[p * 16 + r];                \
            }                                                                                  \
        }                                                                                      \
    }

WBQ_LINEAR(q4_0, avx2, 32, 18, 0, wbq_group, WBQ_K_q4_0)
WBQ_LINEAR(q4_0, avx512, 32, 18, 0, wbq_group, WBQ_K_q4_0)
WBQ_LINEAR(q4_1, avx2, 32, 20, 0, wbq_group, WBQ_K_q4_1)
WBQ_LINEAR(q4_1, avx512, 32, 20, 0, wbq_group, WBQ_K_q4_1)
WBQ_LINEAR(q8_0, avx2, 32, 34, 0, wbq_group, WBQ_K_q8_0)
WBQ_LINEAR(q8_0, avx512, 32, 34, 0, wbq_group, WBQ_K_q8_0)
WBQ_LINEAR(q4_k, avx2, 256, 144, 1, wbk_group45, 0)
WBQ_LINEAR(q4_k, avx512, 256, 144, 1, wbk_group45, 0)
WBQ_LINEAR(q5_k, avx2, 256, 176, 1, wbk_group45, 1)
WBQ_LINEAR(q5_k, avx512, 256, 176, 1, wbk_group45, 1)
WBQ_LINEAR(q6_k, avx2, 256, 210, 1, wbk_group6, 0)
WBQ_LINEAR(q6_k, avx512, 256, 210, 1, wbk_group6, 0)
