/* What the C kernels' files share: intrinsics, bfloat16 rounding, the small ops' 8-float loads
 * and stores, the scratch buffer, and the functions one file calls in another (the decode stack
 * calls the ops, the attention and a product function). */
#ifndef WB_H
#define WB_H
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

/* This thread's scratch of at least `bytes`, 64-byte aligned (grown as needed and kept for its
 * next call: where a product lays out its input rows); NULL if memory ran out. */
void *wb_scratch(int64_t bytes);

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

/* A product function: y [M, N] = x [M, K] w^T (+ b), in the kernel's own weight layout. */
typedef void (*wb_linear_fn)(const void *x, const void *w, const void *b, void *y, int64_t M,
                             int64_t N, int64_t K, int threads);

int wb_decode_attention(const void *q, int64_t q_stride, const void *k_cache,
                        const void *v_cache, const int64_t *slots, int64_t slot_stride,
                        const int64_t *lengths, void *out, int64_t B, int64_t Hq, int64_t Hkv,
                        int64_t D, int64_t Lmax, float scale, int bf16, int threads);
int wb_add_rms_norm(const void *hidden, const void *delta, const void *weight, void *sum,
                    void *normed, int64_t M, int64_t H, float eps, int bf16, int threads);
int wb_rope_write_kv(const void *qkv, int64_t ld, const void *cos, const void *sin,
                     const int64_t *slots, void *q_out, void *k_cache, void *v_cache, int64_t T,
                     int64_t Hq, int64_t Hkv, int64_t D, int bf16, int threads);
int wb_silu_mul(const void *gate_up, void *out, int64_t M, int64_t F, int bf16, int threads);

#endif
