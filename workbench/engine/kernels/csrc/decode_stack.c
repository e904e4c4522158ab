#include "wb.h"

/* A decode step through every layer of a Llama-family stack in one call, for batches of
 * decodes only (one new token per sequence) whose products all run on one of this file's
 * product functions: the same functions, in the same order, on the same values as the
 * decoder's loop calling them one by one (`engine/step/decoder.py`), so the same bits, without the
 * interpreter between them (about a tenth of a single stream's step on a small model).
 *
 * layers [num_layers][WB_STACK_PTRS]: per layer the input norm's weight, the fused Q/K/V
 * projection's weight and bias (or NULL), O's, the post-attention norm's weight, the fused
 * gate/up projection's, down's, the layer's K and V caches [S, Hkv, D], and the product
 * function (`wb_linear_fn`) of each of the four projections, on its weight's layout; eps
 * [num_layers][2] the two norms' epsilons. hidden [T, H] (not written) -> out [T, H]: the last
 * layer's output before the final norm. cos and signed_sin [T, D] as `wb_rope_write_kv` takes
 * them; slot_mapping [T] where each token's K/V goes; slots [T, Lmax] (slot_stride between
 * rows) and lengths [T] each sequence's context, as `wb_decode_attention`. Returns 0, or
 * what failed (-2: out of memory; else the code of the function that refused: nothing is
 * partly done that a second try would not redo the same). */
enum { WB_STACK_NORM1, WB_STACK_QKV, WB_STACK_QKV_BIAS, WB_STACK_O, WB_STACK_O_BIAS,
       WB_STACK_NORM2, WB_STACK_GATE_UP, WB_STACK_GATE_UP_BIAS, WB_STACK_DOWN,
       WB_STACK_DOWN_BIAS, WB_STACK_K_CACHE, WB_STACK_V_CACHE, WB_STACK_QKV_FN, WB_STACK_O_FN,
       WB_STACK_GATE_UP_FN, WB_STACK_DOWN_FN, WB_STACK_PTRS };

int wb_decode_stack(void *const *layers, const float *eps, int64_t num_layers,
                    const void *hidden, void *out, const void *cos, const void *signed_sin,
                    const int64_t *slot_mapping, const int64_t *slots, int64_t slot_stride,
                    const int64_t *lengths, int64_t Lmax, int64_t T, int64_t H, int64_t Hq,
                    int64_t Hkv, int64_t D, int64_t F, float scale, int bf16, int threads) {
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
        const wb_linear_fn qkv_proj = (wb_linear_fn)p[WB_STACK_QKV_FN],
                           o_proj = (wb_linear_fn)p[WB_STACK_O_FN],
                           gate_up_proj = (wb_linear_fn)p[WB_STACK_GATE_UP_FN],
                           down_proj = (wb_linear_fn)p[WB_STACK_DOWN_FN];
        code = wb_add_rms_norm(h, i ? delta : 0, p[WB_STACK_NORM1], sum, x, T, H, eps[2 * i],
                               bf16, threads);  /* the first layer: nothing to add */
        if (code) break;
        qkv_proj(x, p[WB_STACK_QKV], p[WB_STACK_QKV_BIAS], qkv, T, W, H, threads);
        code = wb_rope_write_kv(qkv, W, cos, signed_sin, slot_mapping, q, k_cache, v_cache, T,
                                Hq, Hkv, D, bf16, threads);
        if (code) break;
        code = wb_decode_attention(q, Hq * D, k_cache, v_cache, slots, slot_stride, lengths,
                                   attn, T, Hq, Hkv, D, Lmax, scale, bf16, threads);
        if (code) break;
        o_proj(attn, p[WB_STACK_O], p[WB_STACK_O_BIAS], o, T, H, Hq * D, threads);
        code = wb_add_rms_norm(h, o, p[WB_STACK_NORM2], sum, x, T, H, eps[2 * i + 1], bf16,
                               threads);
        h = sum;
        if (code) break;
        gate_up_proj(x, p[WB_STACK_GATE_UP], p[WB_STACK_GATE_UP_BIAS], gate_up, T, 2 * F, H,
                     threads);
        code = wb_silu_mul(gate_up, y, T, F, bf16, threads);
        if (code) break;
        down_proj(y, p[WB_STACK_DOWN], p[WB_STACK_DOWN_BIAS], delta, T, H, F, threads);
    }
    if (!code)  /* the last layer's MLP output added, rounded as torch's add */
        for (int64_t at = 0; at < T * H; at += 8)
            wb_store8(out, at, _mm256_add_ps(wb_load8(h, bf16, at), wb_load8(delta, bf16, at)),
                      bf16);
    free(scratch);
    return code;
}
